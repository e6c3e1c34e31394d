"""Linear-chain algorithms, each written once and specialised by a semiring
and a potential form: the public chain functions.

Every function takes potentials in the three forms of `lattices.forms`
(per-position `[..., T, L, L]`, `FactoredPotentials`, `SparsePotentials`),
`lengths [...]` masking positions at or past each length (a length-0 sequence has
one empty path of score 0), and any leading batch shape (written for one chain,
mapped with `jax.vmap`). The kernel is chosen by semiring (`_KERNELS`), form (its
own step and derivative) and backend (`kernel.Tuning`), never by a name.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import semirings
from ..semirings import Semiring
from ..validation import as_labels, as_lengths, check_key, labels_in_range, nan_unless
from . import decode, kernel, tree_product
from .forms import PotentialForm, is_form
from .forms.dense import DensePotentials
from .forms.factored import FactoredPotentials, materialize  # noqa: F401  (public as chain.materialize)
from .forms.sparse import SparsePotentials  # noqa: F401  (public as chain.SparsePotentials)

ALGORITHMS = ("auto", "sequential", "parallel")
"""The values of `algorithm=`: `auto` picks by semiring, form and backend (`kernel.TUNING`)."""


# ---------------------------------------------------------------------------
# Validation and batching
# ---------------------------------------------------------------------------


def as_form(potentials) -> PotentialForm:
    """A chain function's potentials as a form of `lattices.forms`.

    Args:
      potentials: a form, or per-position scores `[..., T, L, L]`.

    Returns:
      the form as given, or `DensePotentials(potentials)`.
    """
    return potentials if is_form(potentials) else DensePotentials(potentials)


def prepare_inputs(potentials, lengths):
    """Validate a chain function's arguments (the checks every chain function
    runs, `prefix`'s too).

    Args:
      potentials: `[..., T, L, L]` (it becomes `DensePotentials`),
        `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, or None (every chain `T` long).

    Returns:
      `(form, lengths, batch_shape, T, L)`: the potentials as a checked form
        of `lattices.forms`, `lengths [...]` int32, the batch shape `[...]` as
        a tuple, and the numbers of positions and labels.
    """
    form = as_form(potentials).checked()
    batch_shape, T = tuple(form.batch_shape), form.num_steps
    lengths = as_lengths(lengths, batch_shape, T)
    form.check_inside(lengths)
    return form, lengths, batch_shape, T, form.num_labels


@functools.cache
def _instance(fn, *static):
    """One stable callable per static configuration, so `map_batch`'s jit
    cache is hit on every later call with the same shapes."""
    return functools.partial(fn, *static) if static else fn


@functools.partial(jax.jit, static_argnums=0)
def map_batch(fn, potentials, lengths, *batched):
    """Apply the unbatched `fn(potentials, length, *batched)` over the batch
    shape of `lengths`, compiled once per (fn, shapes).

    The batch is flattened into one axis and mapped with a single `vmap`
    (traced under `kernel.batch_size`, which only tuning reads); a factored
    transition matrix without batch dimensions stays shared (not
    broadcast), which is what makes the factored path fast.

    Args:
      fn: the function of one chain (static: hashable, one program per `fn`).
      potentials: a form (`prepare_inputs`) with the batch shape `[...]`.
      lengths: `[...]` ints, one per chain.
      *batched: pytrees whose leaves lead with the batch shape (e.g.
        `labels [..., T]`), mapped along with the chains.

    Returns:
      `fn`'s output per chain, every leaf with the batch shape `[...]` in front.
    """
    batch_shape = lengths.shape
    size = math.prod(batch_shape)
    flat, axes = potentials.batched(batch_shape)
    extra = [jax.tree_util.tree_map(lambda x: x.reshape((size,) + x.shape[len(batch_shape) :]), b) for b in batched]
    with kernel.batch_size(size):
        out = jax.vmap(fn, in_axes=(axes, 0) + (0,) * len(extra))(flat, lengths.reshape(size), *extra)
    return jax.tree_util.tree_map(lambda x: x.reshape(batch_shape + x.shape[1:]), out)


def _computes_log_z(semiring) -> bool:
    """`Log` and `Real` (not its subclasses, e.g. `Counting`) compute log Z."""
    return type(semiring) in (semirings.LogSemiring, semirings.RealSemiring)


def _log_semiring(semiring: Semiring) -> Semiring:
    """`Real` computes what `Log` computes (log Z), through the same exact algorithms."""
    return semirings.Log if _computes_log_z(semiring) else semiring


def _exact_log_scan(semiring, potentials, length, starts):
    """`log Z` by the form's exact log step, with its closed-form derivative,
    on the form padded to the backend's label multiple (`kernel.Tuning`)."""
    potentials = potentials.padded(kernel.tuning().padded_labels(potentials.num_labels))
    return kernel.log_partition(potentials, length, starts)


class _Kernel(NamedTuple):
    """What runs for a semiring: `scan(semiring, potentials, length, starts)`
    for the sequential algorithm, and `matmul`, the parallel algorithm's
    product (None: the semiring's)."""

    scan: Callable
    matmul: Callable | None = None


# By semiring type; the form supplies its step and derivative (`lift`,
# `log_tangent`) and the backend's `kernel.Tuning` which algorithm `"auto"`
# is: the one place where algorithms are chosen. Other semirings: the plain
# scan (autodiff) and their own product.
_KERNELS = {semirings.LogSemiring: _Kernel(_exact_log_scan, kernel.log_matmul)}
_PLAIN = _Kernel(kernel.scan)


def _check_algorithm(algorithm):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def resolve_algorithm(T: int, L: int, *, algorithm: str = "auto") -> str:
    """The scan a chain of `T` positions and `L` labels runs.

    Args:
      T: the number of positions.
      L: the number of labels.
      algorithm: one of `ALGORITHMS` (checked); "auto" is resolved to the
        backend's choice (`kernel.Tuning.prefers_parallel`).

    Returns:
      "sequential" or "parallel".
    """
    _check_algorithm(algorithm)
    if algorithm != "auto":
        return algorithm
    return "parallel" if kernel.tuning().prefers_parallel(T, L) else "sequential"


def _forward_instance(semiring, algorithm, potentials, length, starts=None):
    """The semiring's output for one chain (the sum over a row's chains with `starts`)."""
    if potentials.num_steps == 0:
        dtype = potentials.dtype
        return semiring.unconvert(semiring.one((), dtype), jnp.zeros((), dtype))
    chosen = _KERNELS.get(type(semiring), _PLAIN)
    if algorithm == "parallel":
        return tree_product.forward(semiring, potentials, length, chosen.matmul)
    return chosen.scan(semiring, potentials, length, starts)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def forward(semiring: Semiring, potentials, lengths=None, *, algorithm: str = "auto"):
    """Semiring sum over all label sequences of each chain.

    Args:
      semiring: e.g. `semirings.Log` (-> log Z), `Max` (-> best score),
        `Real` (-> log Z, the same computation as `Log`), `Entropy`
        (-> entropy), `KMax(k)` (-> `[..., k]` best scores), `Counting`
        (-> number of allowed paths).
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential" (scan, O(T L^2)), "parallel" (tree of matrix
        products, O(T L^3) work, O(log T) depth) or "auto" (the backend's
        choice: sequential on CPU; see `kernel.Tuning`).

    Returns:
      `[...]` (`[..., k]` for k-max), the semiring's output per chain.
    """
    if not isinstance(semiring, Semiring):
        raise TypeError(f"semiring must be a lossfns.semirings.Semiring (e.g. semirings.Log), got {semiring!r}")
    _check_algorithm(algorithm)
    potentials, lengths, _, T, L = prepare_inputs(potentials, lengths)
    algorithm = resolve_algorithm(T, L, algorithm=algorithm)
    return map_batch(_instance(_forward_instance, _log_semiring(semiring), algorithm), potentials, lengths)


def log_partition(potentials, lengths=None, *, algorithm: str = "auto"):
    """`log Z` per chain, exact to rounding for every finite or `-inf` score.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `forward`.

    Returns:
      `[...]`, the `log Z` of each chain.
    """
    return forward(semirings.Log, potentials, lengths, algorithm=algorithm)


# ---------------------------------------------------------------------------
# Rows of back-to-back chains
# ---------------------------------------------------------------------------


def as_starts(starts, shape: tuple) -> jax.Array:
    """`starts` checked as the chain starts of rows of potentials.

    Args:
      starts: `[..., T]` bool, True at each chain's first position.
      shape: the shape `starts` must have, the potentials' `[..., T]`.

    Returns:
      `starts` as a bool array of `shape`; anything else raises a `ValueError`
        naming it.
    """
    starts = jnp.asarray(starts)
    if starts.dtype != jnp.bool_ or starts.shape != tuple(shape):
        raise ValueError(
            f"starts must be a bool array of shape {tuple(shape)} ([..., T], matching the "
            f"potentials), got dtype {starts.dtype} and shape {starts.shape}"
        )
    return starts


def row_forward(semiring: Semiring, potentials, starts, lengths=None):
    """Rows of back-to-back chains: per row, the sum over its chains of the
    semiring's output (log Z for `Log`/`Real`, the best score for `Max`).

    A corpus packed this way has no padding inside a row and needs one
    compiled shape, where length buckets pad every sentence and compile one
    scan per bucket.

    Args:
      semiring: `semirings.Log`, `Real` or `Max`.
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`
        over each row's positions; at a chain's first position only the start scores apply
        (row 0 of the edge potentials, or `start + unary`).
      starts: `[..., T]` bool, True at each chain's first position (position
        0 always starts one).
      lengths: `[...]` positions used in each row (default `T`).

    Returns:
      `[...]` per row, the sum of its chains' values.
    """
    if not (_computes_log_z(semiring) or type(semiring) is semirings.MaxSemiring):
        raise ValueError(f"semiring must be semirings.Log, Real or Max for row_forward, got {semiring!r}")
    potentials, lengths, batch_shape, T, _ = prepare_inputs(potentials, lengths)
    starts = as_starts(starts, batch_shape + (T,))
    return map_batch(_instance(_forward_instance, _log_semiring(semiring), "sequential"), potentials, lengths, starts)


def row_log_partition(potentials, starts, lengths=None):
    """Per row, the sum of `log Z` over its chains (`row_forward`).

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`
        over each row's positions, as in `row_forward`.
      starts: `[..., T]` bool, True at each chain's first position.
      lengths: `[...]` positions used in each row (default `T`).

    Returns:
      `[...]`, per row the sum of its chains' `log Z`.
    """
    return row_forward(semirings.Log, potentials, starts, lengths)


def row_score(potentials, labels, starts, lengths=None):
    """Per row, the sum of the scores of its chains' label sequences.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`
        over each row's positions, as in `row_forward`.
      labels: `[..., T]` ints in `[0, L)` inside each length (anything past it).
      starts: `[..., T]` bool, True at each chain's first position (as in `row_forward`).
      lengths: `[...]` positions used in each row (default `T`).

    Returns:
      `[...]`, per row the sum of its chains' scores.
    """
    potentials, lengths, batch_shape, T, L = prepare_inputs(potentials, lengths)
    labels = as_labels(labels, batch_shape + (T,), L, lengths)
    starts = as_starts(starts, batch_shape + (T,))
    return map_batch(_row_score_instance, potentials, lengths, labels, starts)


def _marginals_instance(semiring, algorithm, potentials, length):
    """One chain's log Z and its derivative with respect to the potentials
    (a form of the same type). Taken inside the batch's map, a factored
    form's shared transitions stay shared in the forward pass (one product
    per step for the whole batch) while their derivative is this chain's
    own expected counts."""
    instance_log_z = lambda p: _forward_instance(semiring, algorithm, p, length)
    return jax.value_and_grad(instance_log_z, allow_int=True)(potentials)


def log_partition_and_marginals(potentials, lengths=None, *, algorithm: str = "auto"):
    """`log Z` and its derivative with respect to the potentials from one
    forward-backward (for callers that need both, e.g. sequence boosting's
    weights and feature masses).

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `forward`.

    Returns:
      log_partition: `[...]`, `log Z` per chain.
      marginals: the derivative, as `marginals` gives it (a form of the
        potentials' type).
    """
    form, lengths, _, T, L = prepare_inputs(potentials, lengths)
    algorithm = resolve_algorithm(T, L, algorithm=algorithm)
    log_z, per_chain = map_batch(_instance(_marginals_instance, semirings.Log, algorithm), form, lengths)
    return log_z, form.from_gradient(per_chain)


def marginals(potentials, lengths=None, *, algorithm: str = "auto"):
    """Derivative of `log_partition` with respect to the potentials.

    Differentiable again (second derivatives work).

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `forward`.

    Returns:
      For `[..., T, L, L]` input: edge marginals `[..., T, L, L]`,
        `P(y_{t-1} = i, y_t = j)` (row 0 at t = 0; zero past each length). For
        `FactoredPotentials`: the same structure, per example: unary marginals
        `[..., T, L]`, expected transition counts `[..., L, L]` and start
        marginals `[..., L]`. For `SparsePotentials`: likewise, with
        `pair_weights [..., T, K]` the marginals of the support's pairs (at a
        chain's first position, the pairs from label 0) and the support as
        given.
    """
    return log_partition_and_marginals(potentials, lengths, algorithm=algorithm)[1]


def node_marginals(potentials, lengths=None, *, algorithm: str = "auto"):
    """Node marginals `P(y_t = j)`.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `forward`.

    Returns:
      `[..., T, L]`; rows past each length are 0.
    """
    # The derivative of the summed log Z: shared transitions keep one (summed)
    # derivative rather than one per chain.
    form, lengths, _, _, _ = prepare_inputs(potentials, lengths)
    total = lambda p: jnp.sum(log_partition(p, lengths, algorithm=algorithm))
    return form.label_marginals(jax.grad(total, allow_int=True)(form))


def entropy(potentials, lengths=None, *, algorithm: str = "auto"):
    """Entropy of the distribution over label sequences (entropy semiring).

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `forward`.

    Returns:
      `[...]`, the entropy of each chain's distribution.
    """
    return forward(semirings.Entropy, potentials, lengths, algorithm=algorithm)


def score(potentials, labels, lengths=None):
    """Score of given label sequences.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` ints in `[0, L)`; positions at or past each length
        are ignored (their labels may be -1).
      lengths: `[...]` ints in `[0, T]`, default `T`.

    Returns:
      `[...]`, the score of each chain's label sequence.
    """
    potentials, lengths, batch_shape, T, L = prepare_inputs(potentials, lengths)
    labels = as_labels(labels, batch_shape + (T,), L, lengths)
    return map_batch(_score_instance, potentials, lengths, labels)


def _score_instance(potentials, length, labels):
    return _row_score_instance(potentials, length, labels, jnp.zeros(labels.shape, bool))


def _row_score_instance(potentials, length, labels, starts):
    T = labels.shape[0]
    if T == 0:
        return jnp.zeros((), potentials.dtype)
    valid = jnp.arange(T) < length
    in_range = labels_in_range(labels, potentials.num_labels, valid)
    starts = kernel.row_starts(starts, length)
    labels = jnp.where(valid & in_range, labels, 0)
    previous = jnp.where(starts, 0, jnp.concatenate([jnp.zeros((1,), labels.dtype), labels[:-1]]))
    total = jnp.sum(jnp.where(valid, potentials.score_terms(labels, previous, starts), 0.0))
    # Under jit a label outside [0, L) would be read as another, and a NaN
    # score's derivative would be a finite one-hot: NaN in both instead.
    return nan_unless(jnp.all(in_range) & ~jnp.isnan(total), total)


def _viterbi_instance(potentials, length):
    scores, labels = decode.best_paths(1, potentials, length)
    return scores[0], labels[0]


def viterbi(potentials, lengths=None):
    """Best label sequence per chain by back-pointers (deterministic on ties:
    the lowest label index wins).

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.

    Returns:
      score: `[...]`, the best sequence's score (-inf when no sequence has a
        finite score).
      labels: `[..., T]` int32, -1 at and past each length, and everywhere
        when no sequence has a finite score.
    """
    potentials, lengths, _, _, _ = prepare_inputs(potentials, lengths)
    return map_batch(_viterbi_instance, potentials, lengths)


def kbest(potentials, lengths=None, k: int = 1):
    """The k best label sequences per chain, by the same back-pointer decoder
    as `viterbi` with the k best partial scores per label.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      k: the number of sequences, a positive int.

    Returns:
      scores: `[..., k]`, best first; -inf for missing sequences (when fewer
        than k exist).
      labels: `[..., k, T]` int32, -1 past each length and for missing
        sequences.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    potentials, lengths, _, _, _ = prepare_inputs(potentials, lengths)
    k = int(k)
    return map_batch(_instance(decode.best_paths, k), potentials, lengths)


def _sample_instance(potentials, length, key):
    T = potentials.num_steps
    if T == 0:
        return jnp.zeros((0,), jnp.int32)
    _, forward_pass = kernel.scan(semirings.Log, potentials, length, keep_values=True)
    alphas = forward_pass.values  # [T, L], normalised
    masked = potentials.masked(jnp.arange(T) < length)
    # Slice t of `following` holds position t + 1's inputs (the last is unread).
    following = jax.tree_util.tree_map(lambda x: jnp.concatenate([x[1:], x[:1]]), masked.time_inputs())
    keys = jax.random.split(key, T)

    def back(next_label, inputs):
        t, alpha_t, following_t, key_t = inputs
        column = masked.block(following_t)[:, jnp.maximum(next_label, 0)]
        logits = jnp.where(t == length - 1, alpha_t, alpha_t + column)
        label = jax.random.categorical(key_t, logits).astype(jnp.int32)
        label = jnp.where(t < length, label, -1)
        return label, label

    _, labels = jax.lax.scan(back, jnp.int32(-1), (jnp.arange(T), alphas, following, keys), reverse=True)
    # No allowed path (log Z = -inf): no sample, as Viterbi gives no path.
    reachable = jnp.any(alphas[jnp.maximum(length - 1, 0)] > -jnp.inf)
    return jnp.where(reachable, labels, -1)


def sample(key, potentials, lengths=None):
    """One exact sample from `P(y | x)` per chain (forward filtering, backward
    sampling).

    Args:
      key: a `jax.random` key.
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.

    Returns:
      `labels [..., T]` int32, -1 past each length, and -1 everywhere for a
        chain with no allowed sequence (as `viterbi`).
    """
    check_key("key", key)
    potentials, lengths, batch_shape, _, _ = prepare_inputs(potentials, lengths)
    keys = jax.random.split(key, math.prod(batch_shape)).reshape(batch_shape + key.shape)
    return map_batch(_sample_instance, potentials, lengths, keys)
