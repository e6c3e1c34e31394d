"""Forward algorithms over acyclic lattices (`dag.build`), each written once
and specialised by a semiring: the level scan (`forward`, `log_partition`,
`arc_marginals` as its derivative), its packed variant over a
`PackedLattices`, and the Viterbi decoders.

Arc scores `[..., A]` (log space) are passed separately from the lattice so that
they can be differentiated; every public function maps leading batch dimensions
of the scores (and of the lattice) itself. The packed functions take only the
semirings that map score sums to products (`PACKABLE_SEMIRINGS`).
Design notes: docs/internals.md.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ... import semirings
from ...semirings import Semiring
from ...validation import as_float_array, check_finite_or_neg_inf, concrete
from .build import Lattice, PackedLattices

# Semirings whose `convert` turns a score shift into a semiring product
# (convert(s + c) = convert(s) * convert(c)): each state's scale can be folded
# into the scores of its out-arcs, so lattices of one pack never share a scale.
PACKABLE_SEMIRINGS = (semirings.RealSemiring, semirings.LogSemiring, semirings.MaxSemiring, semirings.KMaxSemiring)
"""The semiring classes the packed (many small lattices, one scan) algorithms take."""


def _computes_log_z(semiring) -> bool:
    """`Log` and `Real` (not its subclasses, e.g. `Counting`) compute log Z."""
    return type(semiring) in (semirings.LogSemiring, semirings.RealSemiring)


# ---------------------------------------------------------------------------
# Validation and batching
# ---------------------------------------------------------------------------


def _prepare(lattice, arc_scores):
    """Validate the arguments of the public functions."""
    if not isinstance(lattice, Lattice):
        raise TypeError(f"lattice must be a dag.Lattice, got {type(lattice).__name__}")
    A = lattice.src.shape[-1]
    arc_scores = as_float_array("arc_scores", arc_scores, 1, f"[..., A] with A = {A} (the lattice's arcs)")
    if arc_scores.shape[-1] != A:
        raise ValueError(f"arc_scores must have shape [..., {A}] (one score per lattice arc), got {arc_scores.shape}")
    lattice_batch, batch_shape = lattice.src.shape[:-1], arc_scores.shape[:-1]
    if lattice_batch not in ((), batch_shape):
        raise ValueError(
            f"arc_scores batch shape {batch_shape} must equal the lattice batch shape {lattice_batch} "
            "(or the lattice must be unbatched)"
        )
    # Padding arcs' scores are ignored (as under jit, where nothing is checked).
    check_finite_or_neg_inf("arc_scores", _valid_scores(lattice.arc_valid, arc_scores))
    return lattice, arc_scores


def _valid_scores(arc_valid, arc_scores):
    """The scores of valid arcs, 0 for padding arcs (concrete values only:
    what the eager check sees); traced scores are returned as they are."""
    valid, scores = concrete(arc_valid), concrete(arc_scores)
    if valid is None or scores is None:
        return arc_scores
    return np.where(np.broadcast_to(valid, scores.shape), scores, 0)


def _invalid_score_poison(arc_valid, arc_scores):
    """`[]` 0, or NaN when a valid arc's score is NaN or +inf: added to the
    result so that such input, which only the eager check can refuse, gives
    NaN values *and* NaN derivatives under jit (a NaN log Z with zero
    marginals would pass as a lattice without paths). Exactly 0, with zero
    derivatives, otherwise."""
    bad = arc_valid & (jnp.isnan(arc_scores) | (arc_scores == jnp.inf))
    factor = jnp.where(jnp.any(bad), jnp.nan, 0.0).astype(arc_scores.dtype)
    return jnp.sum(jnp.where(arc_valid & (arc_scores != -jnp.inf), arc_scores, 0.0) * factor)


def _map_batch(fn, lattice, arc_scores, batch_shape):
    """Apply the unbatched `fn(lattice, arc_scores)` over `batch_shape` with
    one `vmap`; an unbatched lattice is shared, not broadcast."""
    if not batch_shape:
        return fn(lattice, arc_scores)
    size = math.prod(batch_shape)
    shared = lattice.src.ndim == 1
    if not shared:
        lattice = jax.tree_util.tree_map(lambda x: x.reshape((size,) + x.shape[len(batch_shape) :]), lattice)
    scores = arc_scores.reshape((size,) + arc_scores.shape[len(batch_shape) :])
    out = jax.vmap(fn, in_axes=(None if shared else 0, 0))(lattice, scores)
    return jax.tree_util.tree_map(lambda x: x.reshape(batch_shape + x.shape[1:]), out)


# ---------------------------------------------------------------------------
# Unbatched algorithms
# ---------------------------------------------------------------------------


def _gather(value, index):
    """Entries of a semiring value at logical indices `index` (any shape)."""
    return jax.tree_util.tree_map(lambda x: x[..., index], value)


def _write_row(value, row_start, update):
    """Write `update [W]` into slots `row_start ..` of every leaf's last axis."""
    return jax.tree_util.tree_map(
        lambda x, u: jax.lax.dynamic_update_slice_in_dim(x, u, row_start, x.ndim - 1), value, update
    )


def _arc_source_slots(lattice):
    """Slot of each arc's source `[A + 1]`; the sentinel arc reads the zero slot."""
    N, W, _ = lattice.level_arcs.shape
    return jnp.concatenate([lattice.state_slot[lattice.src], jnp.full((1,), (N + 1) * W, jnp.int32)])


def _forward_instance(semiring: Semiring, lattice: Lattice, arc_scores):
    A = lattice.num_arcs
    N, W, _ = lattice.level_arcs.shape
    size, dtype = (N + 1) * W + 1, arc_scores.dtype
    # Padding scores become 0 before any arithmetic (no -inf/NaN can leak into
    # gradients); arc A is the sentinel arc.
    scores = jnp.concatenate([jnp.where(lattice.arc_valid, arc_scores, 0.0), jnp.zeros((1,), dtype)])
    sources = _arc_source_slots(lattice)
    values = semiring.select(jnp.arange(size) == 0, semiring.one((size,), dtype), semiring.zero((size,), dtype))
    # potential[slot]: the log scale divided out of values[slot]. A semiring
    # whose conversion shifts scores (the real semiring) keeps one scale per
    # state, folded into the arc scores that leave it: a uniform renormalisation
    # would let states that are no longer read dominate the scale and later
    # values underflow. The other semirings (log-space values, counts) ignore
    # shifts in `convert`, so they are renormalised uniformly and keep
    # potential = 0.
    per_state_scale = type(semiring).convert_scaled is not Semiring.convert_scaled
    potential = jnp.zeros((size,), dtype)

    def step(carry, level):
        values, potential = carry
        row, arcs = level
        arc_sources = sources[arcs]
        shifted = jnp.where(arcs < A, scores[arcs] + potential[arc_sources], -jnp.inf)
        # One shift per state (its largest in-arc): the state's largest term
        # is exactly 1, so no state's mass can underflow (a level-wide shift
        # loses states far behind the level's best that win later).
        weights, shift = semiring.convert_scaled(shifted, (-1,))
        new = semiring.sum(semiring.times(_gather(values, arc_sources), weights), -1)
        if per_state_scale:
            new, norm = semiring.normalize(semiring.expand_dims(new, -1), -1)
            new = jax.tree_util.tree_map(lambda x: x[..., 0], new)
            potential = jax.lax.dynamic_update_slice_in_dim(potential, shift + norm, row * W, 0)
            return (_write_row(values, row * W, new), potential), jnp.zeros((), dtype)
        values, norm = semiring.normalize(_write_row(values, row * W, new), -1)
        return (values, potential), norm

    levels = (jnp.arange(1, N + 1), lattice.level_arcs)
    (values, potential), norms = jax.lax.scan(step, (values, potential), levels)
    exits, exit_shift = semiring.convert_scaled(
        jnp.where(lattice.final, potential[lattice.state_slot], -jnp.inf), (-1,)
    )
    total = semiring.sum(semiring.times(_gather(values, lattice.state_slot), exits), -1)
    poison = _invalid_score_poison(lattice.arc_valid, arc_scores)
    return semiring.unconvert(total, jnp.sum(norms) + exit_shift + poison)


def _best_incoming(best, sources, scores, arcs):
    """The Viterbi step of one block of states: `(best score [W], best arc
    [W])` over their incoming arcs `arcs [W, D]` (the sentinel arc, id
    `len(scores) - 1`, scores -inf), from the best scores of the source
    slots; the arc is -1 where no arc reaches the state. Ties: the lowest
    slot wins."""
    candidates = best[sources[arcs]] + scores[arcs]
    value = jnp.max(candidates, axis=-1)
    slot = jnp.argmax(candidates, axis=-1)
    return value, jnp.where(value > -jnp.inf, jnp.take_along_axis(arcs, slot[:, None], axis=-1)[:, 0], -1)


def _viterbi_instance(lattice: Lattice, arc_scores):
    N, W, _ = lattice.level_arcs.shape
    size, dtype = (N + 1) * W + 1, arc_scores.dtype
    scores = jnp.concatenate([jnp.where(lattice.arc_valid, arc_scores, -jnp.inf), jnp.full((1,), -jnp.inf, dtype)])
    sources = _arc_source_slots(lattice)
    best = jnp.where(jnp.arange(size) == 0, 0.0, -jnp.inf).astype(dtype)
    best_arc = jnp.full((size,), -1, jnp.int32)

    def step(carry, level):
        best, best_arc = carry
        row, arcs = level
        value, chosen = _best_incoming(best, sources, scores, arcs)
        best = jax.lax.dynamic_update_slice_in_dim(best, value, row * W, 0)
        return (best, jax.lax.dynamic_update_slice_in_dim(best_arc, chosen, row * W, 0)), None

    (best, best_arc), _ = jax.lax.scan(step, (best, best_arc), (jnp.arange(1, N + 1), lattice.level_arcs))
    final_scores = jnp.where(lattice.final, best[lattice.state_slot], -jnp.inf)
    last = jnp.argmax(final_scores)
    score = final_scores[last]

    def back(state, _):
        arc = jnp.where(state > 0, best_arc[lattice.state_slot[state]], -1)
        return jnp.where(arc >= 0, lattice.src[jnp.maximum(arc, 0)], state), arc

    if N == 0:  # no arcs: the best path, if any, is empty
        return score, jnp.zeros((0,), jnp.int32), jnp.zeros((0,), jnp.int32)
    _, reversed_arcs = jax.lax.scan(back, jnp.where(score > -jnp.inf, last, 0), None, length=N)
    count = jnp.sum(reversed_arcs >= 0)
    position = jnp.arange(N)
    arcs = jnp.where(position < count, reversed_arcs[jnp.clip(count - 1 - position, 0, N - 1)], -1)
    symbols = jnp.where(arcs >= 0, lattice.symbol[jnp.maximum(arcs, 0)], -1)
    return score, arcs.astype(jnp.int32), symbols.astype(jnp.int32)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def forward(semiring: Semiring, lattice: Lattice, arc_scores):
    """Semiring sum over all accepting paths of each lattice.

    Args:
      semiring: any of `lossfns.semirings` (`Log` -> log Z, `Max` -> best
        path score, `Real` -> log Z, `Entropy` -> path entropy, `KMax(k)` ->
        `[..., k]` best scores, `Counting` -> number of finite-score paths).
      lattice: a `Lattice`, unbatched or with the batch shape of the scores.
      arc_scores: `[..., A]` log-space scores; `-inf` forbids an arc; padding
        arcs' scores are ignored.

    Returns:
      `[...]` (`[..., k]` for k-max). A lattice without an accepting path
        gives the semiring zero (`-inf` log Z) with zero gradients.
    """
    lattice, arc_scores = _prepare(lattice, arc_scores)
    return _forward_batch(semiring, lattice, arc_scores)


# Compiled once per semiring and shape, so eager callers do not retrace the scan.
@functools.partial(jax.jit, static_argnums=0)
def _forward_batch(semiring, lattice, arc_scores):
    return _map_batch(functools.partial(_forward_instance, semiring), lattice, arc_scores, arc_scores.shape[:-1])


@jax.jit
def _viterbi_batch(lattice, arc_scores):
    return _map_batch(_viterbi_instance, lattice, arc_scores, arc_scores.shape[:-1])


def log_partition(lattice: Lattice, arc_scores, *, semiring: Semiring = semirings.Log):
    """`log` of the sum over accepting paths of `exp(path score)`.

    Args:
      lattice: a `Lattice`, unbatched or with the batch shape of the scores.
      arc_scores: `[..., A]` log-space scores; `-inf` forbids an arc; padding
        arcs' scores are ignored.
      semiring: `semirings.Log` or `Real` (both exact: every state is shifted
        by its own best in-arc).

    Returns:
      `[...]`, `log Z` per lattice.
    """
    if not _computes_log_z(semiring):
        raise ValueError(f"semiring must be Log or Real for log_partition, got {semiring!r}")
    return forward(semiring, lattice, arc_scores)


def arc_marginals(lattice: Lattice, arc_scores, *, semiring: Semiring = semirings.Log):
    """Posterior probability of each arc (the derivative of `log_partition`).

    Args:
      lattice: a `Lattice`, unbatched or with the batch shape of the scores.
      arc_scores: `[..., A]` log-space scores; `-inf` forbids an arc; padding
        arcs' scores are ignored.
      semiring: `semirings.Log` or `Real`, as in `log_partition`.

    Returns:
      `[..., A]`; 0 for padding, forbidden and unreachable arcs.
    """
    total = lambda scores: jnp.sum(log_partition(lattice, scores, semiring=semiring))
    return jax.grad(total)(arc_scores)


def viterbi(lattice: Lattice, arc_scores):
    """Best accepting path by back-pointers (ties: lowest arc slot wins).

    Args:
      lattice: a `Lattice`, unbatched or with the batch shape of the scores.
      arc_scores: `[..., A]` log-space scores; `-inf` forbids an arc; padding
        arcs' scores are ignored.

    Returns:
      score: `[...]`; -inf without an accepting path.
      arcs: `[..., N]` int32, the path's arc ids from the start, padded with
        -1 (N is the number of levels, the longest possible path); all -1
        without an accepting path.
      symbols: `[..., N]` int32, the path's symbols, padded likewise.
    """
    lattice, arc_scores = _prepare(lattice, arc_scores)
    return _viterbi_batch(lattice, arc_scores)


def _concat_blocks(parts):
    """Concatenate per-block semiring values along the last axis."""
    return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs, axis=-1), *parts)


def _packed_forward(semiring: Semiring, packed: PackedLattices, arc_scores):
    """`_forward_instance` over a pack: every start slot holds one, each
    state keeps its own log scale (folded into the scores of its out-arcs,
    exact for `PACKABLE_SEMIRINGS`), and each lattice sums its own finals."""
    A, N, W = packed.num_arcs, packed.num_levels, packed.width
    B = packed.final_slots.shape[0]
    size, dtype = (N + 1) * W + 1, arc_scores.dtype
    scores = jnp.concatenate([jnp.where(packed.arc_valid, arc_scores, 0.0), jnp.zeros((1,), dtype)])
    sources = jnp.concatenate([packed.state_slot[packed.src], jnp.full((1,), (N + 1) * W, jnp.int32)])
    values = semiring.select(jnp.arange(size) < B, semiring.one((size,), dtype), semiring.zero((size,), dtype))
    potential = jnp.zeros((size,), dtype)

    def step(carry, level):
        values, potential = carry
        row, blocks = level
        news, shifts = [], []
        for arcs in blocks:  # [W_k, D_k] each
            arc_sources = sources[arcs]
            shifted = jnp.where(arcs < A, scores[arcs] + potential[arc_sources], -jnp.inf)
            weights, shift = semiring.convert_scaled(shifted, (-1,))  # one shift per state
            news.append(semiring.sum(semiring.times(_gather(values, arc_sources), weights), -1))
            shifts.append(shift)
        new, norm = semiring.normalize(semiring.expand_dims(_concat_blocks(news), -1), -1)
        new = jax.tree_util.tree_map(lambda x: x[..., 0], new)
        potential = jax.lax.dynamic_update_slice_in_dim(potential, jnp.concatenate(shifts) + norm, row * W, 0)
        return (_write_row(values, row * W, new), potential), None

    levels = (jnp.arange(1, N + 1), tuple(packed.level_arcs))
    (values, potential), _ = jax.lax.scan(step, (values, potential), levels)
    final_slots = packed.final_slots
    real_final = final_slots < (N + 1) * W
    exits, exit_shift = semiring.convert_scaled(jnp.where(real_final, potential[final_slots], -jnp.inf), (-1,))
    total = semiring.sum(semiring.times(_gather(values, final_slots), exits), -1)
    return semiring.unconvert(total, exit_shift + _invalid_score_poison(packed.arc_valid, arc_scores))


def _packed_viterbi(packed: PackedLattices, arc_scores):
    N, W = packed.num_levels, packed.width
    B = packed.final_slots.shape[0]
    size, dtype = (N + 1) * W + 1, arc_scores.dtype
    scores = jnp.concatenate([jnp.where(packed.arc_valid, arc_scores, -jnp.inf), jnp.full((1,), -jnp.inf, dtype)])
    sources = jnp.concatenate([packed.state_slot[packed.src], jnp.full((1,), (N + 1) * W, jnp.int32)])
    best = jnp.where(jnp.arange(size) < B, 0.0, -jnp.inf).astype(dtype)
    best_arc = jnp.full((size,), -1, jnp.int32)

    def step(carry, level):
        best, best_arc = carry
        row, blocks = level
        values, chosen = [], []
        for arcs in blocks:
            value, chosen_arcs = _best_incoming(best, sources, scores, arcs)
            values.append(value)
            chosen.append(chosen_arcs)
        best = jax.lax.dynamic_update_slice_in_dim(best, jnp.concatenate(values), row * W, 0)
        return (best, jax.lax.dynamic_update_slice_in_dim(best_arc, jnp.concatenate(chosen), row * W, 0)), None

    levels = (jnp.arange(1, N + 1), tuple(packed.level_arcs))
    (best, best_arc), _ = jax.lax.scan(step, (best, best_arc), levels)
    final_scores = jnp.where(packed.final_slots < (N + 1) * W, best[packed.final_slots], -jnp.inf)  # [B, F]
    last = jnp.take_along_axis(packed.final_slots, jnp.argmax(final_scores, -1)[:, None], -1)[:, 0]
    score = jnp.max(final_scores, -1)
    if N == 0:
        return score, jnp.zeros((B, 0), jnp.int32), jnp.zeros((B, 0), jnp.int32)
    best_arc = jnp.concatenate([best_arc[:-1], jnp.full((1,), -1, jnp.int32)])  # the sentinel slot has none

    def back(slot, _):
        arc = best_arc[slot]
        return jnp.where(arc >= 0, sources[jnp.maximum(arc, 0)], slot), arc

    start = jnp.where(score > -jnp.inf, last, (N + 1) * W)
    _, reversed_arcs = jax.lax.scan(back, start, None, length=N)  # [N, B]
    reversed_arcs = reversed_arcs.T
    count = jnp.sum(reversed_arcs >= 0, axis=-1, keepdims=True)
    position = jnp.arange(N)
    index = jnp.clip(count - 1 - position, 0, N - 1)
    arcs = jnp.where(position < count, jnp.take_along_axis(reversed_arcs, index, -1), -1)
    symbols = jnp.where(arcs >= 0, packed.symbol[jnp.maximum(arcs, 0)], -1)
    return score, arcs.astype(jnp.int32), symbols.astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=0)
def _packed_forward_jit(semiring, packed, arc_scores):
    return _packed_forward(semiring, packed, arc_scores)


def packed_forward(semiring: Semiring, packed: PackedLattices, arc_scores):
    """`forward` of each lattice of a pack.

    Args:
      semiring: one of `PACKABLE_SEMIRINGS` (the others need one shared scale
        per lattice: use `stack`).
      packed: a `PackedLattices` of `B` lattices (`pack`).
      arc_scores: `[A]` log-space scores in the pack's arc order.

    Returns:
      `[B]` (`[B, k]` for k-max).
    """
    if not isinstance(packed, PackedLattices):
        raise TypeError(f"packed must be a dag.PackedLattices, got {type(packed).__name__}")
    if type(semiring) not in PACKABLE_SEMIRINGS:
        names = ", ".join(kind.__name__ for kind in PACKABLE_SEMIRINGS)
        raise ValueError(
            f"packed lattices support the semirings {names}, got {semiring!r}; use dag.stack for the others"
        )
    A = packed.num_arcs
    arc_scores = as_float_array("arc_scores", arc_scores, 1, f"[A] with A = {A} (the pack's arcs)")
    if arc_scores.shape != (A,):
        raise ValueError(f"arc_scores must have shape [{A}] (one score per packed arc), got {arc_scores.shape}")
    check_finite_or_neg_inf("arc_scores", _valid_scores(packed.arc_valid, arc_scores))
    return _packed_forward_jit(semiring, packed, arc_scores)


def packed_log_partition(packed: PackedLattices, arc_scores, *, semiring: Semiring = semirings.Log):
    """`log_partition` of each lattice of a pack.

    Args:
      packed: a `PackedLattices` of `B` lattices (`pack`).
      arc_scores: `[A]` log-space scores in the pack's arc order.
      semiring: `semirings.Log` (the default, as `log_partition`'s) or
        `Real`, both exact.

    Returns:
      `[B]`, `log Z` per lattice.
    """
    if not _computes_log_z(semiring):
        raise ValueError(f"semiring must be Log or Real for log_partition, got {semiring!r}")
    return packed_forward(semiring, packed, arc_scores)


@jax.jit
def _packed_viterbi_jit(packed, arc_scores):
    return _packed_viterbi(packed, arc_scores)


def packed_viterbi(packed: PackedLattices, arc_scores):
    """`viterbi` of each lattice of a pack (ties: lowest slot wins).

    Args:
      packed: a `PackedLattices` of `B` lattices (`pack`).
      arc_scores: `[A]` log-space scores in the pack's arc order.

    Returns:
      score: `[B]`; -inf without an accepting path.
      arcs: `[B, N]` int32, pack arc ids, padded with -1 (N the pack's levels).
      symbols: `[B, N]` int32, padded with -1.
    """
    if not isinstance(packed, PackedLattices):
        raise TypeError(f"packed must be a dag.PackedLattices, got {type(packed).__name__}")
    arc_scores = as_float_array("arc_scores", arc_scores, 1, "[A]")
    if arc_scores.shape != (packed.num_arcs,):
        raise ValueError(f"arc_scores must have shape [{packed.num_arcs}], got {arc_scores.shape}")
    return _packed_viterbi_jit(packed, arc_scores)
