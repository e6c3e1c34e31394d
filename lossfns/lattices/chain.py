"""Linear-chain algorithms, each written once and specialised by a semiring
and a potential form.

Potentials come in two forms (`lattices.forms`), accepted by every function
here:

* per-position edge potentials `[..., T, L, L]`: `potentials[..., t, i, j]`
  scores label `j` at position `t` after label `i` at `t - 1`; at `t = 0`
  the previous label is the start state and only row `i = 0` is read;
* `FactoredPotentials(unary [..., T, L], transitions [L, L] or [..., L, L],
  start [L] or [..., L] or None)`: the classic CRF, `psi_t(i, j) =
  transitions[i, j] + unary[t, j]` and `psi_0(0, j) = start[j] + unary[0, j]`.
  `[T, L, L]` is never materialised (except by the parallel algorithm,
  whose per-step matrices are its nature).

`lengths [...]` (ints in `[0, T]`, default `T`) masks positions at or past
each length; a length-0 sequence has one empty path of score 0. Any number
of leading batch dimensions is supported: the algorithms are written for one
unbatched instance and mapped with `jax.vmap`.

One restartable scan (`_scan`) serves `forward`, rows of back-to-back chains
and sampling; one back-pointer decoder (`_decode_instance`) serves `viterbi`
and `kbest`; marginals are derivatives of `log_partition` (differentiable
again); samples use forward filtering, backward sampling. Each asks the form
only the questions of `lattices.forms`.

Which algorithm computes `log Z` is chosen by the semiring and the form, in
the table `_KERNELS`: `semirings.Log` (and `semirings.Real`, the same
computation) with the sequential algorithm runs `kernel`, exact and fast,
with closed-form derivatives, on factored potentials whose transitions and
start the batch shares and on per-position potentials; every other
combination runs the generic scan (the real semiring's unchecked
probability-space recursion is never used for chains: it silently
underflows).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import semirings
from ..semirings import Semiring
from ..validation import as_float_array, as_labels, as_lengths, check_finite_or_neg_inf, concrete
from . import kernel
from . import sparse_chain
from .forms import BATCH_AXIS, DensePotentials, FactoredPotentials, _time_major
from .forms import materialize  # noqa: F401  (public as chain.materialize)
from .sparse_chain import SparsePotentials

ALGORITHMS = ("sequential", "parallel")


# ---------------------------------------------------------------------------
# Validation and batching
# ---------------------------------------------------------------------------


def _prepare(potentials, lengths):
    """Validate; return `(form, lengths, batch_shape, T, L)` (`lattices.forms`)."""
    if isinstance(potentials, SparsePotentials):
        form, lengths, batch_shape, T, L = sparse_chain._prepare(potentials, lengths)
        _check_scores_inside(form, lengths)
        return form, lengths, tuple(batch_shape), T, L
    if isinstance(potentials, FactoredPotentials):
        unary = as_float_array("unary", potentials.unary, 2, "[..., T, L]")
        batch_shape, (T, L) = unary.shape[:-2], unary.shape[-2:]
        transitions = as_float_array("transitions", potentials.transitions, 2, "[L, L] or [..., L, L]")
        if transitions.shape[-2:] != (L, L):
            raise ValueError(f"transitions must have shape [..., {L}, {L}] (L = {L} labels, from unary), "
                             f"got shape {transitions.shape}")
        start = potentials.start
        if start is None:
            start = jnp.zeros((L,), unary.dtype)
        start = as_float_array("start", start, 1, "[L] or [..., L]")
        if start.shape[-1] != L:
            raise ValueError(f"start must have shape [..., {L}], got shape {start.shape}")
        for name, array, core in (("transitions", transitions, 2), ("start", start, 1)):
            try:
                jnp.broadcast_shapes(array.shape[:-core], batch_shape)
            except ValueError:
                raise ValueError(f"{name} batch shape {array.shape[:-core]} does not broadcast to the "
                                 f"batch shape {batch_shape} of unary") from None
            check_finite_or_neg_inf(name, array)
        dtype = jnp.result_type(unary, transitions, start)
        potentials = FactoredPotentials(unary.astype(dtype), transitions.astype(dtype), start.astype(dtype))
    else:
        if isinstance(potentials, DensePotentials):
            potentials = potentials.scores
        potentials = as_float_array("potentials", potentials, 3, "[..., T, L, L]")
        batch_shape, (T, L, L2) = potentials.shape[:-3], potentials.shape[-3:]
        if L != L2:
            raise ValueError(f"potentials must have shape [..., T, L, L] (square in the last two axes), "
                             f"got shape {potentials.shape}")
        potentials = DensePotentials(potentials)
    if L < 1:
        raise ValueError("potentials must have at least one label (L >= 1)")
    lengths = as_lengths(lengths, batch_shape, T)
    _check_scores_inside(potentials, lengths)
    return potentials, lengths, tuple(batch_shape), T, L


def _check_scores_inside(potentials, lengths) -> None:
    """NaN or +inf scores are refused at positions inside the lengths; padding
    past them is never read, so it may hold anything."""
    name, scores = (("potentials", potentials.scores) if isinstance(potentials, DensePotentials)
                    else ("unary", potentials.unary))
    values, lengths = concrete(scores), concrete(lengths)
    if values is None or lengths is None:
        return
    core = 3 if isinstance(potentials, DensePotentials) else 2
    inside = np.arange(values.shape[-core])[None] < lengths.reshape(-1, 1)
    inside = inside.reshape(lengths.shape + (values.shape[-core],) + (1,) * (core - 1))
    check_finite_or_neg_inf(name, np.where(inside, values, 0.0))


@functools.lru_cache(maxsize=None)
def _instance(fn, *static):
    """One stable callable per static configuration, so `_map_batch`'s jit
    cache is hit on every later call with the same shapes."""
    return functools.partial(fn, *static) if static else fn


@functools.partial(jax.jit, static_argnums=0)
def _map_batch(fn, potentials, lengths, *batched):
    """Apply the unbatched `fn(potentials, length, *batched)` over the batch
    shape of `lengths`, compiled once per (fn, shapes).

    The batch is flattened into one axis and mapped with a single `vmap`; a
    factored transition matrix without batch dimensions stays shared (not
    broadcast), which is what makes the factored path fast.
    """
    batch_shape = lengths.shape
    size = math.prod(batch_shape)
    flat, axes = potentials.batched(batch_shape)
    extra = [jax.tree_util.tree_map(lambda x: x.reshape((size,) + x.shape[len(batch_shape):]), b) for b in batched]
    out = jax.vmap(fn, in_axes=(axes, 0) + (0,) * len(extra), axis_name=BATCH_AXIS)(flat, lengths.reshape(size), *extra)
    return jax.tree_util.tree_map(lambda x: x.reshape(batch_shape + x.shape[1:]), out)


def _computes_log_z(semiring) -> bool:
    """`Log` and `Real` (not its subclasses, e.g. `Counting`) compute log Z."""
    return type(semiring) in (semirings.LogSemiring, semirings.RealSemiring)


def _log_semiring(semiring: Semiring) -> Semiring:
    """`Real` computes what `Log` computes (log Z), through the same exact algorithms."""
    return semirings.Log if _computes_log_z(semiring) else semiring


@jax.jit
def _kernel_rows(potentials: FactoredPotentials, lengths, starts):
    """`kernel.row_log_partition` over the batch shape of `lengths`."""
    batch_shape, (T, L) = lengths.shape, potentials.unary.shape[-2:]
    size = math.prod(batch_shape)
    out = kernel.row_log_partition(
        potentials.unary.reshape(size, T, L), potentials.transitions, potentials.start,
        starts.reshape(size, T), lengths.reshape(size))
    return out.reshape(batch_shape)


@jax.jit
def _kernel_per_position(potentials: DensePotentials, lengths, starts):
    """`kernel.log_partition_per_position` over the batch shape of `lengths`
    (single chains: `starts`, there for a uniform signature, must be all False)."""
    batch_shape = lengths.shape
    size = math.prod(batch_shape)
    scores = potentials.scores
    out = kernel.log_partition_per_position(scores.reshape((size,) + scores.shape[-3:]), lengths.reshape(size))
    return out.reshape(batch_shape)


# The exact fast kernels, by (semiring, form); everything else runs the generic scan.
_KERNELS = {(semirings.LogSemiring, FactoredPotentials): _kernel_rows,
            (semirings.LogSemiring, DensePotentials): _kernel_per_position}


def _exact_kernel(semiring: Semiring, potentials, algorithm: str):
    """The kernel for this semiring and form (`_KERNELS`), or None for the
    generic scan: the sequential algorithm only, and a factored form only
    when the batch shares its transitions and start."""
    if algorithm != "sequential" or not getattr(potentials, "shares_transitions", True):
        return None
    return _KERNELS.get((type(semiring), type(potentials)))


def _check_algorithm(algorithm):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


# ---------------------------------------------------------------------------
# Unbatched building blocks
# ---------------------------------------------------------------------------


def _flat_normalize(semiring, value, ndim):
    """`semiring.normalize` over the last `ndim` logical axes at once."""
    if ndim == 1:
        return semiring.normalize(value, -1)
    shape_of = lambda x: x.shape[x.ndim - ndim:]
    core = jax.tree_util.tree_leaves(value)[0]
    core_shape = shape_of(core)
    flat = jax.tree_util.tree_map(lambda x: x.reshape(x.shape[: x.ndim - ndim] + (-1,)), value)
    flat, scale = semiring.normalize(flat, -1)
    return jax.tree_util.tree_map(lambda x: x.reshape(x.shape[:-1] + core_shape), flat), scale


def _row_starts(starts, length):
    """Chain starts of one row `[T]`: the given ones and position 0, inside the length."""
    positions = jnp.arange(starts.shape[0])
    return (starts | (positions == 0)) & (positions < length)


def _scan(semiring: Semiring, potentials, length, starts=None, keep_values: bool = False):
    """The one restartable scan, left to right, O(T L^2) (one row, `T >= 1`).

    Without `starts`: the semiring's output for one chain (`unconvert` of its
    sum over label sequences). With `starts [T]` (chains start there and at
    position 0): the sum over the row's chains of their outputs, for
    semirings whose output adds up that way (log Z, best scores). With
    `keep_values`, also the normalised forward values `[T, ...]` (each
    position's carried value, unchanged past the length).
    """
    T = potentials.num_steps
    dtype = potentials.dtype
    positions = jnp.arange(T)
    valid = positions < length
    restarts = starts is not None
    starts = _row_starts(starts if restarts else jnp.zeros((T,), bool), length)
    potentials = potentials.masked(valid)
    first, first_scale = semiring.convert_scaled(potentials.first_scores(), (-1,))
    first = _time_major(first, -2)
    inputs, step = potentials.lift(semiring)

    def chain_total(value):
        return semiring.unconvert(semiring.sum(value, -1), jnp.zeros((), dtype))

    def body(value, xs):
        first_t, first_scale_t, start_t, valid_t, later_t, inputs_t = xs
        new, scale = step(value, inputs_t)
        new = semiring.select(start_t, first_t, new)
        new, norm = semiring.normalize(new, -1)
        total = jnp.where(valid_t, jnp.where(start_t, first_scale_t, scale) + norm, 0.0)
        if restarts:  # a chain ends where the next one starts: add its output
            total = total + jnp.where(start_t & later_t, chain_total(value), 0.0)
        value = semiring.select(valid_t, new, value)
        return value, ((total, value) if keep_values else total)

    # Position 0 always starts a chain; the step computed there and discarded
    # still sees a normalised value (a step may assume one).
    init, _ = semiring.normalize(jax.tree_util.tree_map(lambda x: x[0], first), -1)
    value, outputs = jax.lax.scan(body, init, (first, first_scale, starts, valid, positions > 0, inputs))
    totals, values = outputs if keep_values else (outputs, None)
    log_scale = semirings.pairwise_sum(totals)
    if restarts:
        out = log_scale + jnp.where(length > 0, chain_total(value), 0.0)
    else:
        out = _finish(semiring, value, log_scale, length)
    return (out, values) if keep_values else out


def _forward_parallel(semiring: Semiring, potentials, length):
    """Forward sum of one chain as a balanced tree of matrix products:
    O(L^3 T) work, O(log T) depth. Padded steps are identity matrices, so the
    product over all T steps equals the product up to the length."""
    T = potentials.num_steps
    valid = jnp.arange(T) < length
    potentials = potentials.masked(valid)
    alpha, first_scale = semiring.convert_scaled(potentials.first_scores()[0], (-1,))
    alpha, first_norm = semiring.normalize(alpha, -1)
    scores = potentials.edge_scores()[1:]
    L = scores.shape[-1]
    matrices, scales = semiring.convert_scaled(scores, (-2, -1))
    identity = semiring.select(jnp.eye(L, dtype=bool), semiring.one((L, L), scores.dtype),
                               semiring.zero((L, L), scores.dtype))
    step_valid = valid[1:]
    matrices = semiring.select(step_valid[:, None, None], matrices, semiring.expand_dims(identity, -3))
    scales = jnp.where(step_valid, scales, 0.0)
    matrices = _time_major(matrices, -3)
    identity_block = lambda n: jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), identity)
    while scales.shape[0] > 1:
        if scales.shape[0] % 2:
            matrices = jax.tree_util.tree_map(lambda m, e: jnp.concatenate([m, e]), matrices, identity_block(1))
            scales = jnp.concatenate([scales, jnp.zeros((1,), scales.dtype)])
        left = jax.tree_util.tree_map(lambda m: jnp.moveaxis(m[0::2], 0, -3), matrices)
        right = jax.tree_util.tree_map(lambda m: jnp.moveaxis(m[1::2], 0, -3), matrices)
        product, norm = _flat_normalize(semiring, semiring.matmul(left, right), 2)
        matrices = _time_major(product, -3)
        scales = scales[0::2] + scales[1::2] + norm
    if scales.shape[0] == 1:
        total = jax.tree_util.tree_map(lambda m: m[0], matrices)
        alpha = semiring.vecmat(alpha, total)
        log_scale = first_scale + first_norm + scales[0]
    else:
        log_scale = first_scale + first_norm
    return _finish(semiring, alpha, log_scale, length)


def _finish(semiring, alpha, log_scale, length):
    """Sum the final forward vector; the empty path (length 0) scores one."""
    out = semiring.unconvert(semiring.sum(alpha, -1), log_scale)
    dtype = log_scale.dtype
    empty = semiring.unconvert(semiring.one((), dtype), jnp.zeros((), dtype))
    return jnp.where(length == 0, empty, out)


def _forward_instance(semiring, algorithm, potentials, length):
    if potentials.num_steps == 0:
        dtype = potentials.dtype
        return semiring.unconvert(semiring.one((), dtype), jnp.zeros((), dtype))
    if algorithm == "parallel":
        return _forward_parallel(semiring, potentials, length)
    return _scan(semiring, potentials, length)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def forward(semiring: Semiring, potentials, lengths=None, *, algorithm: str = "sequential"):
    """Semiring sum over all label sequences of each chain.

    Args:
      semiring: e.g. `semirings.Log` (-> log Z), `Max` (-> best score),
        `Real` (-> log Z, fast), `Entropy` (-> entropy), `KMax(k)`
        (-> `[..., k]` best scores), `Counting` (-> number of allowed paths).
      potentials: `[..., T, L, L]` or `FactoredPotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential" (scan, O(T L^2)) or "parallel" (tree of matrix
        products, O(T L^3) work, O(log T) depth).
    Returns:
      `[...]` (`[..., k]` for k-max), the semiring's output per chain.
    """
    _check_algorithm(algorithm)
    if not isinstance(semiring, Semiring):
        raise TypeError(f"semiring must be a lossfns.semirings.Semiring (e.g. semirings.Log), got {semiring!r}")
    potentials, lengths, batch_shape, T, _ = _prepare(potentials, lengths)
    semiring = _log_semiring(semiring)
    fast = _exact_kernel(semiring, potentials, algorithm)
    if fast is not None:
        return fast(potentials, lengths, jnp.zeros(batch_shape + (T,), bool))
    return _map_batch(_instance(_forward_instance, semiring, algorithm), potentials, lengths)


def log_partition(potentials, lengths=None, *, semiring: Semiring = semirings.Log, algorithm: str = "sequential"):
    """`log Z` per chain, `[...]`. `semiring` is `Log` (exact with -inf) or `Real` (fast on CPU)."""
    if not _computes_log_z(semiring):
        raise ValueError(f"semiring must be Log or Real for log_partition, got {semiring!r}")
    return forward(semiring, potentials, lengths, algorithm=algorithm)


# ---------------------------------------------------------------------------
# Rows of back-to-back chains
# ---------------------------------------------------------------------------


def _as_starts(starts, shape: tuple) -> jax.Array:
    starts = jnp.asarray(starts)
    if starts.dtype != jnp.bool_ or starts.shape != tuple(shape):
        raise ValueError(f"starts must be a bool array of shape {tuple(shape)} ([..., T], matching the "
                         f"potentials), got dtype {starts.dtype} and shape {starts.shape}")
    return starts


def _row_forward_instance(semiring, potentials, length, starts):
    """Sum over the chains of one row of each chain's semiring output."""
    if potentials.num_steps == 0:
        return jnp.zeros((), potentials.dtype)
    return _scan(semiring, potentials, length, starts)


def row_forward(semiring: Semiring, potentials, starts, lengths=None):
    """Rows of back-to-back chains: per row, the sum over its chains of the
    semiring's output (log Z for `Log`/`Real`, the best score for `Max`).

    A corpus packed this way has no padding inside a row and needs one
    compiled shape, where length buckets pad every sentence and compile one
    scan per bucket.

    Args:
      semiring: `semirings.Log`, `Real` or `Max`.
      potentials: `[..., T, L, L]` or `FactoredPotentials` over each row's
        positions; at a chain's first position only the start scores apply
        (row 0 of the edge potentials, or `start + unary`).
      starts: `[..., T]` bool, True at each chain's first position (position
        0 always starts one).
      lengths: `[...]` positions used in each row (default `T`).
    Returns:
      `[...]` per row, the sum of its chains' values.
    """
    if not (_computes_log_z(semiring) or type(semiring) is semirings.MaxSemiring):
        raise ValueError(f"semiring must be semirings.Log, Real or Max for row_forward, got {semiring!r}")
    potentials, lengths, batch_shape, T, _ = _prepare(potentials, lengths)
    starts = _as_starts(starts, batch_shape + (T,))
    semiring = _log_semiring(semiring)
    if _exact_kernel(semiring, potentials, "sequential") is _kernel_rows:
        return _kernel_rows(potentials, lengths, starts)
    return _map_batch(_instance(_row_forward_instance, semiring), potentials, lengths, starts)


def row_log_partition(potentials, starts, lengths=None, *, semiring: Semiring = semirings.Log):
    """Per row `[...]`, the sum of `log Z` over its chains (`row_forward`);
    `semiring` is `Log` (exact with -inf) or `Real` (fast on CPU)."""
    if not _computes_log_z(semiring):
        raise ValueError(f"semiring must be Log or Real for row_log_partition, got {semiring!r}")
    return row_forward(semiring, potentials, starts, lengths)


def row_score(potentials, labels, starts, lengths=None):
    """Per row `[...]`, the sum of the scores of the label sequences
    `labels [..., T]` of its chains (`starts` as in `row_forward`)."""
    potentials, lengths, batch_shape, T, L = _prepare(potentials, lengths)
    labels = as_labels(labels, batch_shape + (T,), L, lengths)
    starts = _as_starts(starts, batch_shape + (T,))
    return _map_batch(_row_score_instance, potentials, lengths, labels, starts)


def marginals(potentials, lengths=None, *, semiring: Semiring = semirings.Log, algorithm: str = "sequential"):
    """Derivative of `log_partition` with respect to the potentials.

    For `[..., T, L, L]` input: edge marginals `[..., T, L, L]`,
    `P(y_{t-1} = i, y_t = j)` (row 0 at t = 0; zero past each length). For
    `FactoredPotentials`: the same structure, per example: unary marginals
    `[..., T, L]`, expected transition counts `[..., L, L]` and start
    marginals `[..., L]`. For `SparsePotentials`: likewise, with
    `pair_weights [..., T, K]` the marginals of the support's pairs (at a
    chain's first position, the pairs from label 0) and the support as
    given. Differentiable again (second derivatives work).
    """
    form, lengths, batch_shape, _, _ = _prepare(potentials, lengths)
    form = form.unshared(batch_shape)
    total = lambda p: jnp.sum(log_partition(p, lengths, semiring=semiring, algorithm=algorithm))
    return form.from_gradient(jax.grad(total, allow_int=True)(form.as_argument()))


def node_marginals(potentials, lengths=None, *, semiring: Semiring = semirings.Log, algorithm: str = "sequential"):
    """`P(y_t = j)`, `[..., T, L]`; rows past each length are 0."""
    edge = marginals(potentials, lengths, semiring=semiring, algorithm=algorithm)
    if isinstance(edge, tuple):  # a factored or sparse form: its unary derivatives
        return edge.unary
    return jnp.sum(edge, axis=-2)


def entropy(potentials, lengths=None, *, algorithm: str = "sequential"):
    """Entropy of the distribution over label sequences, `[...]` (entropy semiring)."""
    return forward(semirings.Entropy, potentials, lengths, algorithm=algorithm)


def score(potentials, labels, lengths=None):
    """Score of given label sequences `labels [..., T]`, `[...]`.

    Positions at or past each length are ignored (their labels may be -1).
    """
    potentials, lengths, batch_shape, T, L = _prepare(potentials, lengths)
    labels = as_labels(labels, batch_shape + (T,), L, lengths)
    return _map_batch(_score_instance, potentials, lengths, labels)


def _score_instance(potentials, length, labels):
    return _row_score_instance(potentials, length, labels, jnp.zeros(labels.shape, bool))


def _row_score_instance(potentials, length, labels, starts):
    T = labels.shape[0]
    if T == 0:
        return jnp.zeros((), potentials.dtype)
    valid = jnp.arange(T) < length
    starts = _row_starts(starts, length)
    labels = jnp.where(valid, labels, 0)
    previous = jnp.where(starts, 0, jnp.concatenate([jnp.zeros((1,), labels.dtype), labels[:-1]]))
    return jnp.sum(jnp.where(valid, potentials.score_terms(labels, previous, starts), 0.0))


def _decode_instance(k: int, potentials, length):
    """The one back-pointer decoder: the `k` best label sequences of one chain,
    keeping the `k` best partial scores per label at every position.

    Returns `(scores [k], labels [k, T])`, best first; ties go to the lowest
    (label, rank) index, so the best sequence of `k = 1` is Viterbi's lowest
    label on ties. Labels are -1 at and past the length, and for sequences
    that do not exist (fewer than `k` with a finite score: score -inf).
    """
    T, L, dtype = potentials.num_steps, potentials.num_labels, potentials.dtype
    if T == 0:
        return jnp.zeros((k,), dtype).at[1:].set(-jnp.inf), jnp.zeros((k, 0), jnp.int32)
    valid = jnp.arange(T) < length
    potentials = potentials.masked(valid)
    first = jnp.full((L, k), -jnp.inf, dtype).at[:, 0].set(potentials.first_scores()[0])
    keep = jnp.arange(L * k, dtype=jnp.int32).reshape(L, k)

    def top(scores):
        """The k best of each row `[L, M] -> [L, k]` and their columns."""
        if k == 1:  # argmax: the lowest index on ties, as top_k, at a fraction of its cost
            return jnp.max(scores, -1, keepdims=True), jnp.argmax(scores, -1)[:, None].astype(jnp.int32)
        best, index = jax.lax.top_k(scores, k)
        return best, index.astype(jnp.int32)

    def step(alpha, inputs):
        inputs_t, valid_t = inputs
        scores_t = potentials.block(inputs_t)
        # candidates[j, i * k + r] = alpha[i, r] + scores_t[i, j]
        candidates = (alpha[:, None, :] + scores_t[:, :, None]).transpose(1, 0, 2).reshape(L, L * k)
        best, pointers = top(candidates)
        return jnp.where(valid_t, best, alpha), jnp.where(valid_t, pointers, keep)

    inputs = jax.tree_util.tree_map(lambda x: x[1:], potentials.time_inputs())
    alpha, pointers = jax.lax.scan(step, first, (inputs, valid[1:]))
    scores, final = jax.lax.top_k(alpha.reshape(-1), k)

    def back(flat, pointers_t):
        return pointers_t[flat // k, flat % k], flat // k

    first_flat, tail = jax.lax.scan(back, final.astype(jnp.int32), pointers, reverse=True)
    labels = jnp.concatenate([(first_flat // k)[None], tail]).T  # [k, T]
    present = valid[None, :] & (scores > -jnp.inf)[:, None]
    empty = jnp.zeros((k,), dtype).at[1:].set(-jnp.inf)  # length 0: one empty sequence of score 0
    return jnp.where(length == 0, empty, scores), jnp.where(present, labels, -1)


def _viterbi_instance(potentials, length):
    scores, labels = _decode_instance(1, potentials, length)
    return scores[0], labels[0]


def viterbi(potentials, lengths=None):
    """Best label sequence per chain by back-pointers (deterministic on ties:
    the lowest label index wins).

    Returns `(score [...], labels [..., T] int32)`; labels are -1 at and past
    each length, and everywhere when no sequence has a finite score (then
    the score is -inf).
    """
    potentials, lengths, _, _, _ = _prepare(potentials, lengths)
    return _map_batch(_viterbi_instance, potentials, lengths)


def kbest(potentials, lengths=None, k: int = 1):
    """The k best label sequences per chain, by the same back-pointer decoder
    as `viterbi` with the k best partial scores per label.

    Returns `(scores [..., k], labels [..., k, T])`, best first; when fewer
    than k sequences exist the missing scores are -inf and their labels -1.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    potentials, lengths, _, _, _ = _prepare(potentials, lengths)
    k = int(k)
    return _map_batch(_instance(_decode_instance, k), potentials, lengths)


def _sample_instance(potentials, length, key):
    T = potentials.num_steps
    if T == 0:
        return jnp.zeros((0,), jnp.int32)
    _, alphas = _scan(semirings.Log, potentials, length, keep_values=True)  # [T, L], normalised
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
    sampling), `labels [..., T]` int32 with -1 past each length, and -1
    everywhere for a chain with no allowed sequence (as `viterbi`)."""
    potentials, lengths, batch_shape, _, _ = _prepare(potentials, lengths)
    keys = jax.random.split(key, math.prod(batch_shape)).reshape(batch_shape + key.shape)
    return _map_batch(_sample_instance, potentials, lengths, keys)
