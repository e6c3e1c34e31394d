"""`CRF`: a linear-chain CRF head for neural taggers, as an `equinox.Module`.

An encoder gives emission scores `[..., T, L]`; the head adds learned transition
scores. The parameters and their meaning are pytorch-crf's (`transitions`,
`start_transitions`, `end_transitions`; `log_likelihood` is its `forward(...,
reduction="none")`), and every method is a thin map onto `lattices.chain`. Masks
must be prefixes (else a `ValueError`, or NaN under `jit`), or give `lengths`;
`CRF.from_labels(labels, scheme)` forbids invalid moves with masks never trained.
Any leading batch shape works, under `jit`, `filter_jit`, `vmap` and gradients.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import compilation_cache, losses
from ..lattices import chain, constraints
from ..lattices.chain import FactoredPotentials
from ..lattices.constraints import AllowedTransitions
from ..validation import (
    as_float_array,
    as_integer_array,
    as_labels,
    as_lengths,
    check_finite_or_neg_inf,
    check_int,
    concrete,
    on_device,
    traced,
)


def _as_allowed(allowed, num_tags: int) -> AllowedTransitions | None:
    """`allowed` as `AllowedTransitions` of bool JAX arrays (`None` stays `None`);
    a bare `[L, L]` mask allows every tag at the start and the end."""
    if allowed is None:
        return None
    if not isinstance(allowed, AllowedTransitions):
        allowed = AllowedTransitions(allowed, np.ones(num_tags, bool), np.ones(num_tags, bool))
    out = []
    for name, mask, shape in zip(
        ("allowed.transitions", "allowed.start", "allowed.end"),
        allowed,
        ((num_tags, num_tags), (num_tags,), (num_tags,)),
    ):
        mask = jnp.asarray(mask)
        if mask.dtype != jnp.bool_:
            raise TypeError(f"{name} must be a bool array of shape {shape}, got dtype {mask.dtype}")
        if mask.shape != shape:
            raise ValueError(f"{name} must have shape {shape} ({num_tags} tags), got shape {mask.shape}")
        out.append(mask)
    return AllowedTransitions(*out)


def possible_tags(tags, num_tags: int) -> jax.Array:
    """Partial labels from tags with holes, for `CRF.partial_log_likelihood`.

    Args:
      tags: `[..., T]` ints in `[-1, L)`, -1 where a position is unlabelled.
      num_tags: `L`.

    Returns:
      `[..., T, L]` bool, the tags each position may take (all of them at
        -1, the given one elsewhere).
    """
    num_tags = check_int("num_tags", num_tags)
    tags = as_integer_array("tags", tags, "an integer array [..., T] with values in [-1, num_tags)")
    value = concrete(tags)
    if value is not None and value.size and (value.min() < -1 or value.max() >= num_tags):
        bad = value[(value < -1) | (value >= num_tags)].flat[0]
        raise ValueError(f"tags must lie in [-1, {num_tags}) (-1: unlabelled), got {int(bad)}")
    return (tags[..., None] < 0) | (tags[..., None] == jnp.arange(num_tags))


#: `CRF.log_likelihood`'s reductions, pytorch-crf's and `"none"`.
REDUCTIONS = ("none", "sum", "mean", "token_mean")


class CRF(eqx.Module):
    """A linear-chain CRF head (pytorch-crf's parameters and meaning).

    Fields (float unless said):
      transitions: `[L, L]`, `transitions[i, j]` scores tag `j` after tag `i`;
      start_transitions: `[L]`; end_transitions: `[L]`;
      allowed: `AllowedTransitions(transitions [L, L], start [L], end [L])`
        bool (not trained), or None (every move allowed).

    Methods take `emissions [..., T, L]` (any leading batch shape) and
    either a prefix `mask [..., T]` bool (True on each sequence's first
    positions) or `lengths [...]` (default: every position).
    """

    transitions: jax.Array
    start_transitions: jax.Array
    end_transitions: jax.Array
    allowed: AllowedTransitions | None

    def __init__(self, num_tags: int, *, key, allowed=None, dtype=jnp.float32):
        """Parameters drawn uniformly from `[-0.1, 0.1]` (pytorch-crf's initialisation).

        Args:
          num_tags: `L`.
          key: a `jax.random` key.
          allowed: None, an `[L, L]` bool mask of allowed transitions
            (`allowed[i, j]`: `j` may follow `i`) or
            `lattices.constraints.AllowedTransitions` (with start and end).
          dtype: the parameters' float dtype.
        """
        num_tags = check_int("num_tags", num_tags)
        compilation_cache.enable()  # a new process re-uses the programs of earlier ones
        parameters = _call(_initial_parameters, key, num_tags=num_tags, dtype=jnp.dtype(dtype).name)
        self.start_transitions, self.end_transitions, self.transitions = parameters
        self.allowed = _as_allowed(allowed, num_tags)

    @classmethod
    def from_labels(cls, labels: Sequence[str], scheme: str = "IOB2", *, key, dtype=jnp.float32) -> CRF:
        """A CRF over `labels` that forbids the moves invalid in `scheme`.

        Args:
          labels: the tag names (tag `i` is `labels[i]`).
          scheme: "IOB2", "IOBES" or "BILOU" (see
            `lattices.constraints.allowed_transitions`).
          key: a `jax.random` key.
          dtype: the parameters' float dtype.

        Returns:
          a `CRF` of `len(labels)` tags.
        """
        allowed = constraints.allowed_transitions(labels, scheme)
        return cls(len(labels), key=key, allowed=allowed, dtype=dtype)

    @classmethod
    def from_parameters(cls, transitions, start_transitions, end_transitions, *, allowed=None) -> CRF:
        """A CRF with the given parameters (e.g. a trained pytorch-crf's, as arrays).

        Args:
          transitions: `[L, L]`, finite (forbid moves with `allowed`, not -inf).
          start_transitions: `[L]`, finite.
          end_transitions: `[L]`, finite.
          allowed: as in the constructor.

        Returns:
          a `CRF` of `L` tags, in the parameters' common dtype.
        """
        transitions = as_float_array("transitions", transitions, 2, "[L, L]")
        L = transitions.shape[-1]
        if transitions.shape != (L, L):
            raise ValueError(f"transitions must have shape [L, L], got shape {transitions.shape}")
        arrays = [transitions]
        for name, array in (("start_transitions", start_transitions), ("end_transitions", end_transitions)):
            array = as_float_array(name, array, 1, f"[{L}]")
            if array.shape != (L,):
                raise ValueError(
                    f"{name} must have shape [{L}] (L = {L} tags, from transitions), got shape {array.shape}"
                )
            arrays.append(array)
        for name, array in zip(("transitions", "start_transitions", "end_transitions"), arrays):
            value = concrete(array)
            if value is not None and not np.isfinite(value).all():
                raise ValueError(
                    f"{name} must be finite (forbid moves with allowed=, not -inf), "
                    f"got {value[~np.isfinite(value)].flat[0]}"
                )
        dtype = jnp.result_type(*arrays)
        crf = cls(L, key=jax.random.key(0), allowed=allowed, dtype=dtype)
        return eqx.tree_at(
            lambda c: (c.transitions, c.start_transitions, c.end_transitions),
            crf,
            tuple(array.astype(dtype) for array in arrays),
        )

    @property
    def num_tags(self) -> int:
        return self.transitions.shape[-1]

    # -- inputs ----------------------------------------------------------------

    def _scores(self):
        """`(transitions, start, end)` with the forbidden moves at -inf."""
        if self.allowed is None:
            return self.transitions, self.start_transitions, self.end_transitions
        return tuple(
            jnp.where(mask, score, -jnp.inf)
            for mask, score in zip(self.allowed, (self.transitions, self.start_transitions, self.end_transitions))
        )

    def _emissions(self, emissions):
        emissions = as_float_array("emissions", emissions, 2, "[..., T, L]")
        if emissions.shape[-1] != self.num_tags:
            raise ValueError(
                f"emissions must have shape [..., T, {self.num_tags}] ({self.num_tags} tags of this "
                f"CRF), got shape {emissions.shape}"
            )
        return emissions

    def _lengths(self, emissions, mask, lengths):
        """`(lengths [...], prefix [...] bool or None)`: `prefix` is False for
        a sequence whose traced mask is not a prefix mask (its results become
        NaN / -1); None when every mask is known to be a prefix."""
        batch_shape, T = emissions.shape[:-2], emissions.shape[-2]
        if mask is None:
            return as_lengths(lengths, batch_shape, T), None
        if lengths is not None:
            raise ValueError("give mask or lengths, not both")
        mask = on_device(mask)
        if mask.dtype != jnp.bool_:
            raise TypeError(
                f"mask must be a bool array of shape {batch_shape + (T,)} ([..., T], True on each "
                f"sequence's first positions), got dtype {mask.dtype} (use mask.astype(bool))"
            )
        if mask.shape != batch_shape + (T,):
            raise ValueError(
                f"mask must have shape {batch_shape + (T,)} (the [..., T] of emissions), got shape {mask.shape}"
            )
        known_mask = concrete(mask)
        if known_mask is None:
            lengths = jnp.sum(mask, -1, dtype=jnp.int32)
            return lengths, jnp.all(mask == (jnp.arange(T) < lengths[..., None]), -1)
        # A known mask is read on the host: no program is compiled for its shape.
        known_lengths = known_mask.sum(-1, dtype=np.int32)
        known = np.all(known_mask == (np.arange(T) < known_lengths[..., None]), -1)
        if not known.all():
            row = tuple(int(i) for i in np.argwhere(~known)[0])
            holes = known_mask[row]
            t = int(np.argmax(holes[1:] & ~holes[:-1])) + 1
            raise ValueError(
                f"mask must be a prefix mask (True on a sequence's first positions, then False), got a "
                f"True after a False at index {row + (t,)}: a chain cannot skip positions; put padding "
                "at the end, or leave positions unlabelled with partial_log_likelihood"
            )
        return on_device(known_lengths), None

    def _potentials(self, emissions, lengths) -> FactoredPotentials:
        """The chain: `end_transitions` join the unary scores at each last position."""
        transitions, start, end = self._scores()
        T = emissions.shape[-2]
        last = jnp.arange(T) == (lengths - 1)[..., None]
        return FactoredPotentials(emissions + jnp.where(last[..., None], end, 0.0), transitions, start)

    def _prepare(self, emissions, mask, lengths):
        """Checked `(emissions, lengths, prefix)` (`prefix` as in `_lengths`)."""
        emissions = self._emissions(emissions)
        lengths, prefix = self._lengths(emissions, mask, lengths)
        _check_inside("emissions", emissions, lengths)
        return emissions, lengths, prefix

    # -- distribution over tag sequences --------------------------------------
    # Each method checks its arguments here and computes in one compiled
    # function below (inlined when called under the caller's own `jit`).

    def log_partition(self, emissions, mask=None, *, lengths=None) -> jax.Array:
        """`log Z`, the log of the summed exponentiated scores of every tag sequence.

        Args:
          emissions: `[..., T, L]` scores from the encoder.
          mask: `[..., T]` bool prefix mask (True on each sequence's first
            positions), or None; give `mask` or `lengths`, not both.
          lengths: `[...]` ints in `[0, T]` (default: every position).

        Returns:
          `[...]`, per sequence.
        """
        return _call(_log_partition, self, *self._prepare(emissions, mask, lengths))

    def log_likelihood(self, emissions, tags, mask=None, *, lengths=None, reduction: str = "none") -> jax.Array:
        """`log P(tags | emissions)` (pytorch-crf's `forward`).

        A gold sequence through a forbidden move gives -inf with a finite gradient.

        Args:
          emissions: `[..., T, L]` scores from the encoder.
          tags: `[..., T]` ints in `[0, L)` inside each sequence (anything, e.g.
            -1, past it).
          mask: `[..., T]` bool prefix mask (True on each sequence's first
            positions), or None; give `mask` or `lengths`, not both.
          lengths: `[...]` ints in `[0, T]` (default: every position).
          reduction: "none" (the default; train on `-jnp.mean` or `-jnp.sum` of
            it), or pytorch-crf's "sum", "mean" (over sequences) and
            "token_mean" (the sum divided by the number of tokens inside
            the lengths).

        Returns:
          `[...]` per sequence with `reduction="none"`, else `[]`.
        """
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS} (pytorch-crf's), got {reduction!r}")
        emissions, lengths, prefix = self._prepare(emissions, mask, lengths)
        tags = as_labels(tags, emissions.shape[:-1], self.num_tags, lengths, name="tags")
        per_sequence = _call(_log_likelihood, self, emissions, lengths, prefix, tags)
        if reduction == "none":
            return per_sequence
        if reduction == "sum":
            return jnp.sum(per_sequence)
        if reduction == "mean":
            return jnp.mean(per_sequence)
        return jnp.sum(per_sequence) / jnp.sum(lengths).astype(per_sequence.dtype)

    def decode(self, emissions, mask=None, *, lengths=None):
        """The best tag sequence (Viterbi; ties go to the lowest tag index).

        Args:
          emissions: `[..., T, L]` scores from the encoder.
          mask: `[..., T]` bool prefix mask (True on each sequence's first
            positions), or None; give `mask` or `lengths`, not both.
          lengths: `[...]` ints in `[0, T]` (default: every position).

        Returns:
          scores: `[...]`; -inf when no sequence is allowed.
          tags: `[..., T]` int32, -1 past each sequence (and everywhere when no
            sequence is allowed).
        """
        return _call(_decode, self, *self._prepare(emissions, mask, lengths))

    def kbest(self, emissions, k: int, mask=None, *, lengths=None):
        """The `k` best tag sequences, best first.

        Args:
          emissions: `[..., T, L]` scores from the encoder.
          k: the number of sequences.
          mask: `[..., T]` bool prefix mask (True on each sequence's first
            positions), or None; give `mask` or `lengths`, not both.
          lengths: `[...]` ints in `[0, T]` (default: every position).

        Returns:
          scores: `[..., k]`; -inf where fewer than `k` exist.
          tags: `[..., k, T]` int32, -1 past each sequence and where fewer than
            `k` exist.
        """
        k = check_int("k", k)
        return _call(_kbest, self, *self._prepare(emissions, mask, lengths), k=k)

    def marginals(self, emissions, mask=None, *, lengths=None) -> jax.Array:
        """`P(y_t = j | emissions)`: the derivative of `log Z` with respect to the emissions.

        Args:
          emissions: `[..., T, L]` scores from the encoder.
          mask: `[..., T]` bool prefix mask (True on each sequence's first
            positions), or None; give `mask` or `lengths`, not both.
          lengths: `[...]` ints in `[0, T]` (default: every position).

        Returns:
          `[..., T, L]`, 0 past each sequence.
        """
        return _call(_marginals, self, *self._prepare(emissions, mask, lengths))

    def sample(self, emissions, mask=None, *, key, lengths=None) -> jax.Array:
        """One exact sample from `P(tags | emissions)` per sequence.

        Args:
          emissions: `[..., T, L]` scores from the encoder.
          mask: `[..., T]` bool prefix mask (True on each sequence's first
            positions), or None; give `mask` or `lengths`, not both.
          key: a `jax.random` key.
          lengths: `[...]` ints in `[0, T]` (default: every position).

        Returns:
          `[..., T]` int32, -1 past each sequence (and everywhere when none is
            allowed).
        """
        return _sample(self, *self._prepare(emissions, mask, lengths), key)

    def entropy(self, emissions, mask=None, *, lengths=None) -> jax.Array:
        """Entropy of `P(tags | emissions)` in nats.

        Args:
          emissions: `[..., T, L]` scores from the encoder.
          mask: `[..., T]` bool prefix mask (True on each sequence's first
            positions), or None; give `mask` or `lengths`, not both.
          lengths: `[...]` ints in `[0, T]` (default: every position).

        Returns:
          `[...]`, per sequence.
        """
        return _call(_entropy, self, *self._prepare(emissions, mask, lengths))

    # -- training options -------------------------------------------------------

    def partial_log_likelihood(self, emissions, possible, mask=None, *, lengths=None) -> jax.Array:
        """Log-likelihood of partial labels: `log sum_{y in Y} P(y | emissions)`
        over the set `Y` of tag sequences with `possible[..., t, y_t]` at every
        position (`log Z` with the other tags' scores at -inf, minus `log Z`).

        With one possible tag everywhere this is `log_likelihood`; with all, 0.

        Args:
          emissions: `[..., T, L]` scores from the encoder.
          possible: `[..., T, L]` bool, the tags position `t` may take (all
            True: unlabelled; one True: labelled, as in `log_likelihood`); see
            `possible_tags` to build it from tags with -1 holes. Every position
            inside a sequence must allow some tag.
          mask: `[..., T]` bool prefix mask (True on each sequence's first
            positions), or None; give `mask` or `lengths`, not both.
          lengths: `[...]` ints in `[0, T]` (default: every position).

        Returns:
          `[...]`, per sequence.
        """
        emissions, lengths, prefix = self._prepare(emissions, mask, lengths)
        possible = on_device(possible)
        if possible.dtype != jnp.bool_ or possible.shape != emissions.shape:
            raise ValueError(
                f"possible must be a bool array of shape {emissions.shape} ([..., T, L], like "
                f"emissions), got dtype {possible.dtype} and shape {possible.shape}"
            )
        known_possible, known_lengths = concrete(possible), concrete(lengths)
        if known_possible is not None and known_lengths is not None:  # checked on the host
            empty = (np.arange(emissions.shape[-2]) < known_lengths[..., None]) & ~known_possible.any(-1)
        else:
            empty = None
        if empty is not None and empty.any():
            raise ValueError(
                f"possible must allow at least one tag at every position inside a sequence, got none "
                f"at index {tuple(int(i) for i in np.argwhere(empty)[0])}"
            )
        return _call(_partial_log_likelihood, self, emissions, lengths, prefix, possible)

    def softmax_margin_loss(self, emissions, tags, mask=None, *, lengths=None, cost=1.0) -> jax.Array:
        """Softmax-margin (Gimpel & Smith 2010), a differentiable bound on the
        cost-augmented hinge that trains toward fewer costly errors.

        `log sum_y exp(s(y) + cost(y, tags)) - s(tags) >= -log_likelihood`.

        Args:
          emissions: `[..., T, L]` scores from the encoder.
          tags: `[..., T]` gold ints in `[0, L)` inside each sequence.
          mask: `[..., T]` bool prefix mask (True on each sequence's first
            positions), or None; give `mask` or `lengths`, not both.
          lengths: `[...]` ints in `[0, T]` (default: every position).
          cost: the cost of predicting tag `j` at a position whose gold tag is
            `i`: a number `c`, the Hamming cost `c [j != i]`; `[L]`, a
            class-weighted Hamming cost `cost[i] [j != i]` (e.g. larger for
            entity tags than for O, to favour recall); or `[L, L]`, any
            `cost[i, j] >= 0` with a zero diagonal. With cost 0 this is
            `-log_likelihood`.

        Returns:
          `[...]`, per sequence.
        """
        emissions, lengths, prefix = self._prepare(emissions, mask, lengths)
        tags = as_labels(tags, emissions.shape[:-1], self.num_tags, lengths, name="tags")
        matrix = _cost_matrix(cost, self.num_tags, emissions.dtype)
        return _call(_softmax_margin_loss, self, emissions, lengths, prefix, tags, matrix)


def _call(function, *arguments, **static):
    """`function(*arguments, **static)`: inlined under a caller's trace; on
    known arrays, the executable of these shapes, kept across processes
    (`compilation_cache.compiled`): a shape seen before, even by another
    process, is neither traced nor compiled again."""
    if traced(arguments):
        return function(*arguments, **static)
    program = functools.partial(function, **static) if static else function
    executable, _ = compilation_cache.compiled((function, tuple(sorted(static.items()))), arguments, program)
    return executable(*arguments)


@functools.partial(jax.jit, static_argnames=("num_tags", "dtype"))
def _initial_parameters(key, num_tags: int, dtype: str) -> tuple:
    """`(start [L], end [L], transitions [L, L])` drawn from `U[-0.1, 0.1]`."""
    start_key, end_key, transitions_key = jax.random.split(key, 3)
    uniform = lambda k, shape: jax.random.uniform(k, shape, dtype, -0.1, 0.1)
    return (
        uniform(start_key, (num_tags,)),
        uniform(end_key, (num_tags,)),
        uniform(transitions_key, (num_tags, num_tags)),
    )


# ---------------------------------------------------------------------------
# The computations, one compiled function each: `(crf, emissions [..., T, L],
# lengths [...], prefix [...] bool or None, *rest)`.
# ---------------------------------------------------------------------------


@jax.jit
def _log_partition(crf: CRF, emissions, lengths, prefix):
    return _invalid(chain.log_partition(crf._potentials(emissions, lengths), lengths), prefix)


@jax.jit
def _log_likelihood(crf: CRF, emissions, lengths, prefix, tags):
    return _invalid(-losses.sequence_log_loss(crf._potentials(emissions, lengths), tags, lengths), prefix)


@jax.jit
def _decode(crf: CRF, emissions, lengths, prefix):
    scores, tags = chain.viterbi(crf._potentials(emissions, lengths), lengths)
    return _invalid(scores, prefix), _invalid_tags(tags, prefix)


@functools.partial(jax.jit, static_argnames="k")
def _kbest(crf: CRF, emissions, lengths, prefix, k: int):
    scores, tags = chain.kbest(crf._potentials(emissions, lengths), lengths, k=k)
    prefix = None if prefix is None else prefix[..., None]
    return _invalid(scores, prefix), _invalid_tags(tags, prefix)


@jax.jit
def _marginals(crf: CRF, emissions, lengths, prefix):
    total = lambda e: jnp.sum(chain.log_partition(crf._potentials(e, lengths), lengths))
    return _invalid(jax.grad(total)(emissions), None if prefix is None else prefix[..., None, None])


@jax.jit
def _sample(crf: CRF, emissions, lengths, prefix, key):
    return _invalid_tags(chain.sample(key, crf._potentials(emissions, lengths), lengths), prefix)


@jax.jit
def _entropy(crf: CRF, emissions, lengths, prefix):
    return _invalid(chain.entropy(crf._potentials(emissions, lengths), lengths), prefix)


@jax.jit
def _partial_log_likelihood(crf: CRF, emissions, lengths, prefix, possible):
    potentials = crf._potentials(emissions, lengths)
    restricted = potentials._replace(unary=jnp.where(possible, potentials.unary, -jnp.inf))
    log_z = chain.log_partition(potentials, lengths)
    # No allowed sequence at all: -inf, not -inf - (-inf) (NaN scores stay NaN).
    value = chain.log_partition(restricted, lengths) - jnp.where(jnp.isneginf(log_z), 0.0, log_z)
    return _invalid(value, prefix)


@jax.jit
def _softmax_margin_loss(crf: CRF, emissions, lengths, prefix, tags, cost):
    potentials = crf._potentials(emissions, lengths)
    inside = jnp.arange(tags.shape[-1]) < lengths[..., None]
    augmented = cost[jnp.where(inside, tags, 0)] * inside[..., None]
    potentials = potentials._replace(unary=potentials.unary + augmented)
    # The gold sequence costs nothing, so its augmented score is its score.
    return _invalid(losses.sequence_log_loss(potentials, tags, lengths), prefix)


def _cost_matrix(cost, num_tags: int, dtype) -> jax.Array:
    """`cost` (a number, `[L]` or `[L, L]`) as the matrix `[L, L]`, checked when known."""
    cost = jnp.asarray(cost)
    if not jnp.issubdtype(cost.dtype, jnp.floating):  # integer costs are fine numbers
        cost = cost.astype(dtype)
    cost = as_float_array("cost", cost, 0, "(a number, [L] or [L, L])")
    off_diagonal = 1.0 - jnp.eye(num_tags, dtype=dtype)
    if cost.ndim == 0:
        matrix = cost * off_diagonal
    elif cost.shape == (num_tags,):
        matrix = cost[:, None] * off_diagonal
    elif cost.shape == (num_tags, num_tags):
        matrix = cost
    else:
        raise ValueError(f"cost must be a number, [{num_tags}] or [{num_tags}, {num_tags}], got shape {cost.shape}")
    value = concrete(matrix)
    if value is not None:
        if not np.isfinite(value).all() or (value < 0).any():
            raise ValueError("cost must be finite and >= 0")
        if np.diagonal(value).any():
            raise ValueError("cost must have a zero diagonal (a correct tag costs nothing)")
    return matrix.astype(dtype)


def _check_inside(name, scores, lengths) -> None:
    """NaN or +inf scores are refused inside the sequences (padding may hold anything)."""
    values, known = concrete(scores), concrete(lengths)
    if values is None or known is None:
        return
    inside = np.arange(values.shape[-2]) < known[..., None]
    check_finite_or_neg_inf(name, np.where(inside[..., None], values, 0.0))


def _invalid(value, prefix):
    """NaN for the sequences whose (traced) mask is not a prefix mask."""
    return value if prefix is None else jnp.where(prefix, value, jnp.nan)


def _invalid_tags(tags, prefix):
    """-1 for the sequences whose (traced) mask is not a prefix mask."""
    return tags if prefix is None else jnp.where(prefix[..., None], tags, -1)
