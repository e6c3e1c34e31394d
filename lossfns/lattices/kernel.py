"""The one restartable scan over a chain, the exact fast log-semiring steps of the
dense and factored forms, and `log Z` with their closed-form derivative.

`scan` is the only forward recursion over a chain in lossfns. For `semirings.Log`
each step is a real-space matrix product on exponentials shifted per column, and a
step whose column sums fall below a threshold is redone in log space (under
`lax.cond`, decided once per batch), so `log Z` is exact to rounding in float32
and float64. `log_partition` has a custom JVP with the closed-form derivative
(the marginals passes), any order; `Tuning` holds the per-backend choices.
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


def _batch() -> int:
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


# ---------------------------------------------------------------------------
# The exact log steps
# ---------------------------------------------------------------------------


def _vecmat(vector, matrix):
    """`[L] x [L, L] -> [L]` (mapped over the batch: `[B, L] x [L, L]`)."""
    if matrix.size * _batch() <= tuning().fused_matmul_max_size:
        return jnp.sum(vector[:, None] * matrix, 0)
    return matrix.T @ vector  # mapped: [L, L] x [L, B], the faster layout of XLA:CPU's dots


def _block_vecmat(vector, block):
    """`[L] x [L, L] -> [L]` with a per-chain block (mapped: `[B, L] x [B, L, L]`)."""
    if vector.shape[-1] <= tuning().fused_products_max_labels:
        return jnp.sum(vector[:, None] * block, 0)
    return vector @ block


def _block_matvec(block, vector):
    if vector.shape[-1] <= tuning().fused_products_max_labels:
        return jnp.sum(block * vector[None, :], 1)
    return block @ vector


def _checked_step(log_alpha, sums, exact, live):
    """`(log_sums, recovered)`: the logs of the column sums `sums`, or, where any
    chain of the batch has a live column sum below `tau`, `exact()` (the same
    logs computed in log space)."""
    tau = recovery_threshold(sums.dtype, sums.shape[-1])
    recover = any_in_batch(live & jnp.any(sums < tau))
    return jax.lax.cond(recover, exact, lambda: safe_log(sums)), recover


class FactoredSteps(NamedTuple):
    """`lift(Log)` inputs of the factored form: continued `[T, L]`, each
    position's unary scores plus the column shifts `c` of the transitions;
    shifted: `[L, L]`, `A - c`; factors: `exp(A - c)`, each column peaking at 1."""

    continued: jax.Array
    shifted: jax.Array
    factors: jax.Array


def factored_log_steps(unary, transitions):
    """The exact log step of the factored form: `(inputs, step)` of its `lift(Log)`
    (`unary [T, L]`, masked; `transitions [L, L]`, exponentiated once here)."""
    column_shift = finite_max(transitions, 0)  # c [L]
    shifted = transitions - column_shift
    inputs = FactoredSteps(unary + column_shift, shifted, jnp.exp(shifted))

    def step(log_alpha, inputs, t, live):
        sums = _vecmat(jnp.exp(log_alpha), inputs.factors)
        log_sums, recovered = _checked_step(
            log_alpha, sums, lambda: logsumexp(log_alpha[:, None] + inputs.shifted, 0), live
        )
        return log_sums + at_position(inputs.continued, t), jnp.zeros((), unary.dtype), (log_sums, recovered)

    return inputs, step


class DenseSteps(NamedTuple):
    """`lift(Log)` inputs of the dense form: scores `[T, L, L]` (masked),
    shifts `[T, L]` each block's column maxima, and `kept`, every block's
    exponentials `exp(scores - shifts)`, when small enough to keep
    (`Tuning.keep_factors_max_bytes`), else None (exponentiated per block)."""

    scores: jax.Array
    shifts: jax.Array
    kept: jax.Array | None

    def shifted(self, t):
        return at_position(self.scores, t) - at_position(self.shifts, t)[None, :]

    def block(self, t):
        return at_position(self.kept, t) if self.kept is not None else jnp.exp(self.shifted(t))

    def all(self):
        return self.kept if self.kept is not None else jnp.exp(self.scores - self.shifts[:, None, :])


def dense_log_steps(scores):
    """The exact log step of the dense form: `(inputs, step)` of its `lift(Log)`
    (`scores [T, L, L]`, masked)."""
    inputs = DenseSteps(scores, finite_max(scores, -2), None)
    if scores.nbytes * _batch() <= tuning().keep_factors_max_bytes:
        inputs = inputs._replace(kept=inputs.all())

    def step(log_alpha, inputs, t, live):
        sums = _block_vecmat(jnp.exp(log_alpha), inputs.block(t))
        log_sums, recovered = _checked_step(
            log_alpha, sums, lambda: logsumexp(log_alpha[:, None] + inputs.shifted(t), 0), live
        )
        return log_sums + at_position(inputs.shifts, t), jnp.zeros((), scores.dtype), (log_sums, recovered)

    return inputs, step


# ---------------------------------------------------------------------------
# log Z with the closed-form derivative
# ---------------------------------------------------------------------------


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _log_partition(tangent_rule, batch, potentials, length, starts):
    with batch_size(batch):
        return scan(semirings.Log, potentials, length, starts)


@_log_partition.defjvp
def _log_partition_jvp(tangent_rule, batch, primals, tangents):
    # JAX traces this rule lazily, outside the caller's `batch_size`: it
    # travels as an argument.
    potentials, length, starts = primals
    with batch_size(batch):
        log_z, forward = scan(semirings.Log, potentials, length, starts, keep_values=True)
        return log_z, tangent_rule(potentials, length, starts, forward, tangents[0])


def log_partition(tangent_rule, potentials, length, starts=None):
    """`log Z` of one chain (the sum over its chains with `starts [T]`) by
    `scan`, with the derivative `tangent_rule(potentials, length, starts,
    forward, tangent) -> []` (the JVP, linear in `tangent`, a form of the
    same structure as `potentials`); `T >= 1`."""
    return _log_partition(tangent_rule, _batch(), potentials, length, starts)


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


def factored_tangent(potentials, length, starts, forward: Forward, tangent):
    """The closed-form JVP of `log Z` of one row of factored chains (the
    backward pass of smoothed node marginals, see the module docstring).

    potentials, tangent: `FactoredPotentials` (`unary [T, L]`, `transitions
    [L, L]`, `start [L]`); forward: the scan's with `factored_log_steps`.
    """
    T, L = potentials.unary.shape
    chains = chain_spans(length, starts, T)
    log_alphas = forward.values
    log_sums, recovered = forward.aux
    steps = forward.inputs
    alphas = jnp.exp(log_alphas)
    in_scan = L * L * _batch() <= tuning().edge_sums_in_scan_max_size
    # exp(A - c) ratio as ratio^T exp(A - c)^T: mapped over a batch, the product
    # then reduces over a leading axis, vectorised along the labels
    transposed_factors = steps.factors.T

    def step(carry, inputs):
        following, edge_sums = carry  # the marginals at t + 1
        t, alpha_t, log_alpha_t, end_t, valid_t, continues_t = inputs
        log_sums_next, recovered_next, inverse_sums = next_step(log_sums, recovered, continues_t, t)
        ratio = following * inverse_sums

        def exact():
            conditional = exact_conditional(log_alpha_t, steps.shifted, log_sums_next)
            return jnp.sum(conditional * jnp.where(continues_t, following, 0.0)[None], 1)

        backward = jax.lax.cond(recovered_next, exact, lambda: alpha_t * _vecmat(ratio, transposed_factors))
        nodes_t = jnp.where(valid_t, normalized(jnp.where(end_t, alpha_t, backward)), 0.0)
        if in_scan:
            return (nodes_t, edge_sums + alpha_t[:, None] * ratio[None, :]), nodes_t
        return (nodes_t, edge_sums), (nodes_t, ratio)

    init = (jnp.zeros((L,), alphas.dtype), jnp.zeros((L, L) if in_scan else (), alphas.dtype))
    inputs = (jnp.arange(T), alphas, log_alphas, chains.ends, chains.valid, chains.continues)
    (_, edge_sums), outputs = jax.lax.scan(step, init, inputs, reverse=True)
    nodes, ratios = (outputs, None) if in_scan else outputs

    # Transitions: ordinary steps from the edge sums or, for large blocks, as
    # `(exp(A - c) * dA)` applied to every forward vector at once (reverse mode
    # turns it into one `[L, T B] x [T B, L]` product); recovered steps from
    # their exact counts.
    allowed = steps.shifted > -jnp.inf  # a forbidden transition's tangent may be infinite
    transitions_tangent = jnp.where(allowed, tangent.transitions, 0.0)
    weighted = steps.factors * transitions_tangent
    if in_scan:
        edges = contract(weighted, edge_sums)
    else:
        edges = jnp.sum((alphas @ weighted) * ratios)
    exact_edges = jax.lax.cond(
        jnp.any(recovered),
        lambda: _factored_exact_edges(forward, chains, nodes),
        lambda: jnp.zeros((L, L), alphas.dtype),
    )
    firsts = jnp.sum(jnp.where(chains.starts[:, None], nodes, 0.0), 0)  # pyright: ignore[reportArgumentType]  # a scan output
    return (
        jnp.sum(nodes * masked_tangent(nodes, tangent.unary))  # pyright: ignore[reportArgumentType]  # a scan output
        + edges
        + contract(transitions_tangent, exact_edges)
        + jnp.sum(firsts * masked_tangent(firsts, tangent.start))
    )


def _factored_exact_edges(forward: Forward, chains: ChainSpans, nodes):
    """Expected transition counts `[L, L]` of the recovered steps, in log
    space (run only when a step was recovered)."""
    log_sums, recovered = forward.aux
    taken = recovered[1:] & chains.valid[1:] & ~chains.starts[1:]

    def step(edges, inputs):
        log_alpha_previous, log_sums_t, nodes_t, taken_t = inputs
        conditional = exact_conditional(log_alpha_previous, forward.inputs.shifted, log_sums_t)
        return edges + conditional * jnp.where(taken_t, nodes_t, 0.0)[None], None

    L = nodes.shape[-1]
    edges, _ = jax.lax.scan(step, jnp.zeros((L, L), nodes.dtype), (forward.values[:-1], log_sums[1:], nodes[1:], taken))
    return edges


def dense_tangent(potentials, length, starts, forward: Forward, tangent):
    """The closed-form JVP of `log Z` of one row of chains with per-position
    potentials: `sum_t sum_{i, j} xi_t(i, j) dpsi_t(i, j)` with the edge
    marginals `xi_t(i, j) = P(y_{t-1} = i, y_t = j)` (at a chain's first
    position, row 0 holds its node marginals).

    potentials, tangent: `DensePotentials` (`[T, L, L]`); forward: the
    scan's with `dense_log_steps`. The backward scan carries the node
    marginals; the edge marginals are one vectorised pass after it (the
    recovered steps' in log space, when there are any).
    """
    scores = tangent.scores
    T, L, _ = scores.shape
    chains = chain_spans(length, starts, T)
    log_alphas = forward.values
    log_sums, recovered = forward.aux
    blocks = forward.inputs
    alphas = jnp.exp(log_alphas)

    def step(following, inputs):
        t, alpha_t, log_alpha_t, valid_t, continues_t = inputs
        log_sums_next, recovered_next, inverse_sums = next_step(log_sums, recovered, continues_t, t)
        ratio = following * inverse_sums
        after = jnp.minimum(t + 1, T - 1)

        def exact():
            conditional = exact_conditional(log_alpha_t, blocks.shifted(after), log_sums_next)
            return jnp.sum(conditional * jnp.where(continues_t, following, 0.0)[None], 1)

        backward = jax.lax.cond(recovered_next, exact, lambda: alpha_t * _block_matvec(blocks.block(after), ratio))
        nodes_t = jnp.where(valid_t, normalized(jnp.where(continues_t, backward, alpha_t)), 0.0)
        return nodes_t, (nodes_t, ratio)

    inputs = (jnp.arange(T), alphas, log_alphas, chains.valid, chains.continues)
    _, (nodes, ratios) = jax.lax.scan(step, jnp.zeros((L,), alphas.dtype), inputs, reverse=True)
    # edges[t] = xi_{t+1}: from t's forward vector through block t + 1 to t + 1's ratio
    edges = alphas[:-1, :, None] * blocks.all()[1:] * ratios[:-1, None, :]
    edges = jax.lax.cond(jnp.any(recovered), lambda: _dense_exact_edges(forward, chains, nodes, edges), lambda: edges)
    marginals = jnp.concatenate([jnp.zeros((1, L, L), edges.dtype), edges])
    heads = jnp.zeros((T, L, L), edges.dtype).at[:, 0].set(jnp.where(chains.starts[:, None], nodes, 0.0))
    marginals = jnp.where(chains.starts[:, None, None], heads, marginals)
    return jnp.sum(marginals * masked_tangent(marginals, scores))


def _dense_exact_edges(forward: Forward, chains: ChainSpans, nodes, edges):
    """`edges [T - 1, L, L]` with the recovered steps' entries recomputed in
    log space (run only when a step was recovered)."""
    log_sums, recovered = forward.aux
    blocks = forward.inputs
    shifted = blocks.scores[1:] - blocks.shifts[1:, None, :]
    finite = jnp.isfinite(log_sums[1:])
    exponent = forward.values[:-1, :, None] + shifted - jnp.where(finite, log_sums[1:], 0.0)[:, None, :]
    exact = jnp.where(finite[:, None, :], jnp.exp(exponent), 0.0)
    taken = chains.valid[1:] & ~chains.starts[1:]
    exact = exact * jnp.where(taken[:, None], nodes[1:], 0.0)[:, None, :]
    return jnp.where(recovered[1:, None, None], exact, edges)


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
