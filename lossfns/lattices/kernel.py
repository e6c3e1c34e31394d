"""The one restartable scan over a chain (`scan`), `log Z` by it with a custom
derivative (`log_partition`), the parallel algorithm's exact log-space product
(`log_matmul`), and the per-backend `Tuning` that picks variants.

Nothing here asks which potential form it runs: each form (`lattices.forms`)
supplies its step (`lift`) and its closed-form derivative (`log_tangent`); the
helpers below are what those steps and derivatives share (the batch-wide
recovery decision, chain spans, the backward pass's conditionals). For
`semirings.Log` the forms' steps are exact to rounding in float32 and float64.
Design notes (the scheme, the threshold, the derivatives): docs/internals.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import semirings
from ..semirings import finite_max, logsumexp, pairwise_sum

# ---------------------------------------------------------------------------
# Backend tuning
# ---------------------------------------------------------------------------


class Tuning(NamedTuple):
    """Kernel variants by problem size; every variant computes the same values.

    `B` below is the batch that the enclosing `chain` call maps over
    (`batch_size`).

    fused_matmul_max_size: `[B, L] x [L, L]` products with at most this many
      multiplications run as one fused multiply and sum (on CPU a dot call
      costs more than that work: 1 x 10,000 x 9, 10 ms against 19 ms).
    fused_products_max_labels: per-position `[B, L] x [B, L, L]` products
      below this many labels are fused (1 x 10,000 x 9: 5 ms against 20 ms).
    edge_sums_in_scan_max_size: expected transition counts `[B, L, L]`
      accumulate in the backward scan while that block is this small
      (CoNLL-2002 NER, 9 x 9 x 214: 5 ms faster); larger ones are one
      product after the scan.
    keep_factors_max_bytes: per-position exponentiated blocks are kept as a
      second `[B, T, L, L]` tensor up to this size; above it, allocating
      that tensor costs more than exponentiating each block again (CPU page
      faults: about 40 ms for 142 MB at 8 x 40 x 333 x 333).
    label_multiple, label_multiple_min_labels: factored chains with at least
      `label_multiple_min_labels` labels get forbidden extra labels up to a
      multiple of `label_multiple` (`FactoredPotentials.padded`): mapped over
      a batch, the scan's `[B, L]` vectors then fill whole vector lanes
      (XLA:CPU, 256 x 25 x 45 loss plus gradient: 4.2 ms at 45 labels, 3.3
      ms at 48); padding 9 labels to 16 costs more than it saves.
    parallel_min_steps, parallel_max_labels: the default algorithm (`chain`'s
      `algorithm="auto"`) is the parallel one (a tree of matrix products,
      `O(log T)` depth) for chains of at least this many positions and at
      most this many labels, else the sequential scan.
    """

    fused_matmul_max_size: int
    fused_products_max_labels: int
    edge_sums_in_scan_max_size: int
    keep_factors_max_bytes: int
    parallel_min_steps: int
    parallel_max_labels: int
    label_multiple: int
    label_multiple_min_labels: int

    def padded_labels(self, num_labels: int) -> int:
        if num_labels < self.label_multiple_min_labels:
            return num_labels
        return -(-num_labels // self.label_multiple) * self.label_multiple

    def prefers_parallel(self, num_steps: int, num_labels: int) -> bool:
        return num_steps >= self.parallel_min_steps and num_labels <= self.parallel_max_labels


TUNING = {
    # Measured on the 2-core CPU machine (benchmarks/results/README.md). The
    # parallel algorithm was 4-9x slower than the scan on CPU:
    # never the default there.
    "cpu": Tuning(
        fused_matmul_max_size=2**12,
        fused_products_max_labels=16,
        edge_sums_in_scan_max_size=2**15,
        keep_factors_max_bytes=2**24,
        parallel_min_steps=2**62,
        parallel_max_labels=0,
        label_multiple=8,
        label_multiple_min_labels=32,
    ),
    # Accelerators, from first principles (no GPU was lent to measure): dots
    # everywhere, edge sums as one product, factors kept. A sequential step
    # costs a few microseconds of launches and synchronisation whatever its
    # size, so T steps cost about T of them; the parallel algorithm costs
    # ceil(log2 T) levels of batched [L, L] x [L, L] products (B T L^3 work,
    # spread over thousands of lanes, and B T L^2 memory with the exact dot
    # product `log_matmul`). From 64 positions the scan's latency dominates;
    # up to 128 labels a level's products stay well within one device.
    "default": Tuning(
        fused_matmul_max_size=0,
        fused_products_max_labels=0,
        edge_sums_in_scan_max_size=0,
        keep_factors_max_bytes=2**62,
        parallel_min_steps=64,
        parallel_max_labels=128,
        label_multiple=1,
        label_multiple_min_labels=0,
    ),
}
"""Per-backend thresholds that pick the algorithm and the intermediates kept; the tests force every
branch on CPU by replacing the entry."""


def tuning() -> Tuning:
    """The tuning of the backend that the computation is traced for."""
    return TUNING.get(jax.default_backend(), TUNING["default"])


_BATCH_SIZE = contextvars.ContextVar("lossfns_chain_batch_size", default=1)


@contextlib.contextmanager
def batch_size(size: int):
    """Trace the steps inside for a batch of `size` chains (`chain` maps its
    flattened batch with one `vmap` inside this). Only tuning reads it: an
    unbatched step cannot see the size of the batch it is mapped over, and
    under a user's `vmap` around a public function it sees the inner batch
    only, which may pick a slower variant, never a different value."""
    token = _BATCH_SIZE.set(int(size))
    try:
        yield
    finally:
        _BATCH_SIZE.reset(token)


def traced_batch_size() -> int:
    """The size of the batch being traced (`batch_size`; 1 outside it), for tuning only."""
    return _BATCH_SIZE.get()


@jax.custom_batching.custom_vmap
def any_in_batch(flag):
    """`flag` (a bool scalar) for one chain; under `jax.vmap`, whether it holds
    for any chain of the batch, unbatched, at every level of nested maps.

    A `lax.cond` on it stays a branch when mapped (a batched predicate turns
    it into a `select` that runs both branches). Only for decisions whose
    both branches compute the same value, up to rounding: here, a step
    redone exactly where it may have lost precision.
    """
    return flag


@any_in_batch.def_vmap
def _any_in_batch_vmap(axis_size, in_batched, flag):
    # Calling itself again lets an enclosing vmap reduce its own axis too.
    return any_in_batch(jnp.any(flag, 0) if in_batched[0] else flag), False


def recovery_threshold(dtype, num_labels: int) -> float:
    """`tau`: a column sum at least this large lost nothing significant to underflow."""
    info = jnp.finfo(dtype)
    return 16.0 * num_labels * float(info.tiny) / float(info.eps)


def safe_log(x):
    """`log x`, `-inf` at 0 (NaN stays NaN), with derivatives that stay finite at 0."""
    positive = x > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), jnp.where(jnp.isnan(x), jnp.nan, -jnp.inf))


def normalized(x):
    """`x [L]` divided by its sum (left as is where that sum is 0)."""
    total = jnp.sum(x)
    return x / jnp.where(total > 0, total, 1.0)


def at_position(x, t):
    """`x[t]` along the leading axis, read in place (also when `x` is batched
    under `vmap`: a `[B, T, ...]` tensor is never moved to time-major)."""
    return jax.lax.dynamic_index_in_dim(x, t, 0, keepdims=False)


def _following(x, fill):
    """`x[t + 1]` at `t` along the leading axis, `fill` at the end."""
    return jnp.concatenate([x[1:], jnp.full((1,) + x.shape[1:], fill, x.dtype)])


# ---------------------------------------------------------------------------
# The scan
# ---------------------------------------------------------------------------


def row_starts(starts, length):
    """Chain starts of one row `[T]`: the given ones and position 0, inside the length."""
    positions = jnp.arange(starts.shape[0])
    return (starts | (positions == 0)) & (positions < length)


class Forward(NamedTuple):
    """What `scan(..., keep_values=True)` saw, for a derivative or a sampler.

    values: `[T, ...]` each position's carried (normalised) semiring value,
    unchanged past the length; aux: `[T, ...]` the step's auxiliary outputs
    (`()` for most steps; the exact log steps: their log column sums `[T, L]`
    and whether each step was recovered, `[T]`); inputs: the arrays the
    step read (`lift`'s first output); scales: `[T]` each step's log scale
    (a chain's log forward scores at `t` are `values[t]` plus the sum of its
    own scales from its start to `t`; 0 past the length).
    """

    values: Any  # pytrees, of the step's own structure
    aux: Any
    inputs: Any
    scales: Any


def scan(semiring, potentials, length, starts=None, keep_values: bool = False):
    """The one restartable scan, left to right, O(T L^2) (one row, `T >= 1`).

    Without `starts`: the semiring's output for one chain (`unconvert` of its
    sum over label sequences). With `starts [T]` (chains start there and at
    position 0): the sum over the row's chains of their outputs, for
    semirings whose output adds up that way (log Z, best scores). With
    `keep_values`, also the `Forward` pass (values, auxiliary outputs and
    inputs of every step).

    The form's step (`potentials.lift(semiring)`) is called at every
    position as `step(value, inputs, t, live)`: it reads position `t` of
    `inputs` itself (in place), and `live` tells it whether its result is
    used (inside the length, not a chain start), so that an exactness check
    can ignore the steps whose result is discarded.
    """
    T = potentials.num_steps
    dtype = potentials.dtype
    positions = jnp.arange(T)
    valid = positions < length
    restarts = starts is not None
    starts = row_starts(starts if restarts else jnp.zeros((T,), bool), length)
    potentials = potentials.masked(valid)
    first, first_scale = semiring.convert_scaled(potentials.first_scores(), (-1,))
    inputs, step = potentials.lift(semiring)

    def first_at(t):  # read in place (the logical time axis of a semiring value is -2)
        value = jax.tree_util.tree_map(lambda x: jax.lax.dynamic_index_in_dim(x, t, x.ndim - 2, False), first)
        return value, at_position(first_scale, t)

    # A single chain starts at position 0 only: no per-position first scores.
    first_0 = first_at(0)

    def chain_total(value):
        return semiring.unconvert(semiring.sum(value, -1), jnp.zeros((), dtype))

    def body(value, xs):
        t, start_t, valid_t, live_t = xs
        new, scale, aux = step(value, inputs, t, live_t)
        first_t, first_scale_t = first_at(t) if restarts else first_0
        new = semiring.select(start_t, first_t, new)
        new, norm = semiring.normalize(new, -1)
        own = jnp.where(valid_t, jnp.where(start_t, first_scale_t, scale) + norm, 0.0)
        total = own
        if restarts:  # a chain ends where the next one starts: add its output
            total = total + jnp.where(start_t & (t > 0), chain_total(value), 0.0)
        value = semiring.select(valid_t, new, value)
        return value, ((total, value, aux, own) if keep_values else total)

    # Position 0 always starts a chain; the step computed there and discarded
    # still sees a normalised value (a step may assume one).
    init, _ = semiring.normalize(first_0[0], -1)
    value, outputs = jax.lax.scan(body, init, (positions, starts, valid, valid & ~starts))
    totals, values, aux, scales = outputs if keep_values else (outputs, None, None, None)
    log_scale = pairwise_sum(totals)  # pyright: ignore[reportArgumentType]  # scan's outputs: an untyped pytree
    if restarts:
        out = log_scale + jnp.where(length > 0, chain_total(value), 0.0)
    else:
        out = finish(semiring, value, log_scale, length)
    return (out, Forward(values, aux, inputs, scales)) if keep_values else out


def finish(semiring, value, log_scale, length):
    """Sum the final forward value; the empty path (length 0) scores one."""
    out = semiring.unconvert(semiring.sum(value, -1), log_scale)
    dtype = log_scale.dtype
    empty = semiring.unconvert(semiring.one((), dtype), jnp.zeros((), dtype))
    return jnp.where(length == 0, empty, out)


def checked_log_sums(sums, exact, live):
    """The logs of a step's column sums, checked for underflow.

    Args:
      sums: `[L]`, the step's column sums in real space.
      exact: `() -> [L]`, the same logs computed in log space.
      live: `[]` bool, whether the step's result is used.

    Returns:
      log_sums: `[L]`, `log sums`, or `exact()` where any chain of the batch
        has a live column sum below `tau` (`recovery_threshold`).
      recovered: `[]` bool, whether `exact()` was taken.
    """
    tau = recovery_threshold(sums.dtype, sums.shape[-1])
    recover = any_in_batch(live & jnp.any(sums < tau))
    return jax.lax.cond(recover, exact, lambda: safe_log(sums)), recover


# ---------------------------------------------------------------------------
# log Z with the closed-form derivative
# ---------------------------------------------------------------------------


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _log_partition(batch, potentials, length, starts):
    with batch_size(batch):
        return scan(semirings.Log, potentials, length, starts)


@_log_partition.defjvp
def _log_partition_jvp(batch, primals, tangents):
    # JAX traces this rule lazily, outside the caller's `batch_size`: it
    # travels as an argument.
    potentials, length, starts = primals
    with batch_size(batch):
        log_z, forward = scan(semirings.Log, potentials, length, starts, keep_values=True)
        return log_z, potentials.log_tangent(length, starts, forward, tangents[0])


def log_partition(potentials, length, starts=None):
    """`log Z` of one chain (the sum over its chains with `starts [T]`) by
    `scan`, with the form's closed-form derivative (`log_tangent(length,
    starts, forward, tangent) -> []`, the JVP, linear in `tangent`, a form of
    the same structure as `potentials`); `T >= 1`."""
    return _log_partition(traced_batch_size(), potentials, length, starts)


class ChainSpans(NamedTuple):
    """Where one row's chains start, continue and end, `[T]` each."""

    starts: jax.Array
    valid: jax.Array
    ends: jax.Array
    continues: jax.Array  # position t + 1 continues t's chain


def chain_spans(length, starts, T) -> ChainSpans:
    """The `ChainSpans` of one row of `T` positions: its first `length` are
    valid, and chains start at `starts [T]` (None: none) and at position 0."""
    valid = jnp.arange(T) < length
    starts = row_starts(jnp.zeros((T,), bool) if starts is None else starts, length)
    next_starts, next_valid = _following(starts, True), _following(valid, False)
    return ChainSpans(starts, valid, valid & (next_starts | ~next_valid), next_valid & ~next_starts)


def exact_conditional(log_alpha, shifted_scores, log_sums):
    """`P(y_{t-1} = i | y_t = j) = exp(la(i) + A(i, j) - c(j) - log s(j))` in log
    space, `[L, L]`; 0 where `s(j) = 0`."""
    finite = jnp.isfinite(log_sums)
    exponent = log_alpha[:, None] + shifted_scores - jnp.where(finite, log_sums, 0.0)[None]
    return jnp.where(finite[None], jnp.exp(exponent), 0.0)


def next_step(log_sums, recovered, continues, t):
    """What the backward pass at `t` needs of step `t + 1` (read in place):
    its log column sums, whether it was recovered, and `1 / s_{t+1}` where it
    continues a chain through an ordinary step (finite there: `s >= tau`),
    else 0, `[L]`."""
    last = log_sums.shape[0] - 1
    after = jnp.minimum(t + 1, last)
    log_sums_next = at_position(log_sums, after)
    # (not and-ed with `continues`: a batched predicate would turn the conds
    # on it into selects)
    recovered_next = at_position(recovered, after) & (t < last)
    ordinary = continues & ~recovered_next
    inverse = jnp.where(ordinary, jnp.exp(-jnp.where(jnp.isfinite(log_sums_next), log_sums_next, 0.0)), 0.0)
    return log_sums_next, recovered_next, inverse


def contract(tangent, weights):
    """`sum(tangent * weights)` over two `[L, L]` arrays as a dot product: mapped
    over a batch with a shared tangent, reverse mode then sums the batch's
    weights with one product rather than a reduction over a broadcast."""
    return jnp.tensordot(tangent, weights, 2)


def masked_tangent(weights, tangent):
    """A tangent where its weight (a marginal) is zero may be infinite (a -inf
    score's): 0 * inf must not leak in. A NaN weight (NaN scores inside the
    chain) is kept, so the derivative is NaN as the value is."""
    return jnp.where((weights > 0) | jnp.isnan(weights), tangent, 0.0)


# ---------------------------------------------------------------------------
# The exact log-semiring matrix product (the parallel algorithm's)
# ---------------------------------------------------------------------------


def log_matmul(left, right):
    """`log(exp(left) @ exp(right))`, `[..., L, M] x [..., M, N] -> [..., L, N]`,
    exact, as one real-space dot product.

    Rows of `left` and columns of `right` are shifted by their maxima `a`,
    `b`, so every term of `S = exp(left - a) @ exp(right - b)` is at most 1
    and the result is `log S + a + b`. An entry whose terms are all
    `-inf` is `-inf` exactly (`S = 0` where no finite path joins the row and
    the column: a second, boolean product says which); where any other entry
    of the batch has `S < tau` (a term may have underflowed, as in the scan)
    the whole product is redone in log space, `L M N` exponentials, under one
    `lax.cond` for the batch (`any_in_batch`).
    """
    row_shift = finite_max(left, -1)
    column_shift = finite_max(right, -2)
    shifted_left = left - row_shift[..., :, None]
    shifted_right = right - column_shift[..., None, :]
    sums = jnp.exp(shifted_left) @ jnp.exp(shifted_right)
    finite = lambda x: (x > -jnp.inf).astype(sums.dtype)
    joined = (finite(left) @ finite(right)) > 0
    tau = recovery_threshold(sums.dtype, left.shape[-1])
    recover = any_in_batch(jnp.any(joined & (sums < tau)))
    log_sums = jax.lax.cond(
        recover,
        lambda: logsumexp(shifted_left[..., :, :, None] + shifted_right[..., None, :, :], -2),
        lambda: safe_log(sums),
    )
    return log_sums + row_shift[..., :, None] + column_shift[..., None, :]
