"""The exact fast chain kernel: `log Z` and its closed-form derivatives.

`chain.log_partition` (and `forward`, `row_forward`, `marginals`, the
sequence losses) run this kernel for `semirings.Log` and `semirings.Real`
with the sequential algorithm, on factored potentials whose transitions
and start the batch shares (`row_log_partition`, the classic CRF, batch
last) and on per-position potentials `[B, T, L, L]`
(`log_partition_per_position`). It is exact for every input the log
semiring is exact for, and as fast as probability-space products.

The scheme (MATH.md, forward algorithm). The forward scores are carried in
log space, `la_t [L]`, shifted so that their maximum is 0; every step is a
real-space matrix product on exponentials, shifted per *column* of the
transition scores:

    s_t(j) = sum_i exp(la_{t-1}(i)) exp(A(i, j) - c(j)),   c(j) = max_i A(i, j)
    la_t(j) = log s_t(j) + c(j) + unary_t(j)     (then shifted by its max)

Each term of `s_t(j)` is at most 1 and the largest term of the true sum is
representable unless label `j`'s best predecessor lags the leading label
by far more than any CRF scores do in practice. A term lost to underflow
is smaller than the smallest normal float `tiny`, so if every column sum
is at least `tau = 16 L tiny / eps` (about `e^-63` in float32, `e^-664` in
float64) the step is exact to rounding. A step with a smaller column sum
anywhere in the batch (or an exactly zero one, which may be a forbidden
column or total underflow) is *recovered*: redone in log space, `L^2`
exponentials, under `lax.cond`, so that ordinary steps never pay for it.
A prefix hundreds of nats behind that wins later, scale-100 scores and
`-inf` transitions therefore give the log-semiring's values, to rounding,
in float32 and float64. Per-position scores are shifted per column of each
position's block the same way.

Derivatives are closed-form (a custom JVP: forward and reverse mode, any
order, the second derivatives being autodiff of the marginals' scans).
Node marginals run backwards as smoothed probabilities,

    m_{t-1}(i) = sum_j m_t(j) P(y_{t-1} = i | y_t = j)
               = exp(la_{t-1}(i)) sum_j exp(A(i, j) - c(j)) m_t(j) / s_t(j),

starting from `m(j) = exp(la(j)) / sum exp(la)` at a chain's last position
and renormalised to sum 1 at every position (rounding would otherwise
compound over T = 10,000 steps); edge marginals are the summands. Recovered
steps use the conditional `exp(la_{t-1}(i) + A(i, j) - c(j) - log s_t(j))`
in log space. Marginals below `tiny / tau` (about `e^-24`) relative to 1
may be flushed to 0; everything else is exact to rounding.

Cost against the old unchecked probability-space recursion: one `exp` and
one `log` of `[L, B]` per step (the carry is in log space), one comparison
and one scalar `cond` per step; against the log semiring: one matrix
product per step instead of `L^2` exponentials.

Where a product runs as XLA's dot and where as a fused multiply-and-sum,
and which intermediate tensors are kept, are backend tuning: `Tuning`
below, one value per backend, read at trace time.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from ..semirings import finite_max, logsumexp, pairwise_sum


# ---------------------------------------------------------------------------
# Backend tuning
# ---------------------------------------------------------------------------


class Tuning(NamedTuple):
    """Kernel variants by problem size; every variant computes the same values.

    fused_matmul_max_size: `[L, L] x [L, B]` products with at most this many
      multiplications run as one fused multiply and sum (on CPU a dot call
      costs more than that work: 1 x 10,000 x 9, 10 ms against 19 ms).
    fused_products_max_labels: per-position `[B, L] x [B, L, L]` products
      below this many labels are fused (1 x 10,000 x 9: 5 ms against 20 ms).
    edge_sums_in_scan_max_size: per-row edge sums `[L, L, B]` accumulate in
      the backward scan while that block is this small (CoNLL-2002 NER,
      9 x 9 x 214: 5 ms faster); larger ones are one product after the scan.
    keep_factors_max_bytes: per-position exponentiated blocks are kept as a
      second `[B, T, L, L]` tensor up to this size; above it, allocating
      that tensor costs more than exponentiating each block again (CPU page
      faults: about 40 ms for 142 MB at 8 x 40 x 333 x 333).
    """

    fused_matmul_max_size: int
    fused_products_max_labels: int
    edge_sums_in_scan_max_size: int
    keep_factors_max_bytes: int


#: Per backend; the tests force every branch on CPU by replacing the entry.
TUNING = {
    "cpu": Tuning(fused_matmul_max_size=2 ** 12, fused_products_max_labels=16,
                  edge_sums_in_scan_max_size=2 ** 15, keep_factors_max_bytes=2 ** 24),
    # Accelerators: dots everywhere, edge sums as one product, factors kept.
    "default": Tuning(fused_matmul_max_size=0, fused_products_max_labels=0,
                      edge_sums_in_scan_max_size=0, keep_factors_max_bytes=2 ** 62),
}


def tuning() -> Tuning:
    """The tuning of the backend that the computation is traced for."""
    return TUNING.get(jax.default_backend(), TUNING["default"])


def recovery_threshold(dtype, num_labels: int) -> float:
    """`tau`: a column sum at least this large lost nothing significant to underflow."""
    info = jnp.finfo(dtype)
    return 16.0 * num_labels * float(info.tiny) / float(info.eps)


def _safe_log(x):
    """`log x`, `-inf` at 0 (NaN stays NaN), with derivatives that stay finite at 0."""
    positive = x > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), jnp.where(jnp.isnan(x), jnp.nan, -jnp.inf))


def _safe_divide(x, y):
    """`x / y`, 0 where `y` is 0 (and no NaN in derivatives there)."""
    positive = y > 0
    return jnp.where(positive, x / jnp.where(positive, y, 1.0), 0.0)


def _normalized(x, axis):
    """`x` divided by its sum over `axis` (left as is where that sum is 0)."""
    total = jnp.sum(x, axis, keepdims=True)
    return x / jnp.where(total > 0, total, 1.0)


# ---------------------------------------------------------------------------
# Factored potentials, rows of back-to-back chains, batch last
# ---------------------------------------------------------------------------


def _matmul(matrix, vectors):
    """`[L, L] x [L, B] -> [L, B]`."""
    if matrix.size * vectors.shape[-1] <= tuning().fused_matmul_max_size:
        return jnp.sum(matrix[:, :, None] * vectors[None], 1)
    return matrix @ vectors


class _Rows(NamedTuple):
    """The forward pass over rows, batch last (`T` positions, `B` rows).

    log_z: `[B]`; log_alphas: `[T, L, B]` max-shifted log forward scores;
    shifts: `[T, B]` each step's shift (a chain's log forward scores at `t`
    are `log_alphas[t]` plus the sum of its shifts up to `t`);
    alphas: their exponentials; log_sums: `[T, L, B]` the exact logs of each
    step's column sums `s_t` (unread at chain starts); recovered: `[T]`
    steps redone in log space; shifted_transitions: `[L, L]`, `A - c`;
    factors: `exp(A - c)`; starts, valid, ends: `[T, B]` chain starts,
    positions inside the lengths and chains' last positions.
    """

    log_z: jax.Array
    log_alphas: jax.Array
    shifts: jax.Array
    alphas: jax.Array
    log_sums: jax.Array
    recovered: jax.Array
    shifted_transitions: jax.Array
    factors: jax.Array
    starts: jax.Array
    valid: jax.Array
    ends: jax.Array


def _rows_forward(unary, transitions, start, starts, lengths) -> _Rows:
    B, T, L = unary.shape
    positions = jnp.arange(T)[:, None]
    valid = positions < lengths
    starts = (starts.T | (positions == 0)) & valid
    next_starts = jnp.concatenate([starts[1:], jnp.ones((1, B), bool)])
    next_valid = jnp.concatenate([valid[1:], jnp.zeros((1, B), bool)])
    ends = valid & (next_starts | ~next_valid)
    inner = valid & ~starts
    unary = jnp.where(valid[:, None], jnp.transpose(unary, (1, 2, 0)), 0.0)  # [T, L, B]
    column_shift = finite_max(transitions, 0)  # c [L]
    shifted_transitions = transitions - column_shift
    factors = jnp.exp(shifted_transitions)
    continued = unary + column_shift[:, None]
    first = unary + start[:, None]
    tau = recovery_threshold(unary.dtype, L)
    transposed = factors.T

    def step(log_alpha, inputs):
        continued_t, first_t, start_t, inner_t, valid_t = inputs
        sums = _matmul(transposed, jnp.exp(log_alpha))
        recover = jnp.any((sums < tau) & inner_t)
        log_sums = jax.lax.cond(
            recover, lambda: logsumexp(log_alpha[:, None, :] + shifted_transitions[:, :, None], 0),
            lambda: _safe_log(sums))
        new = jnp.where(start_t, first_t, log_sums + continued_t)
        shift = finite_max(new, 0)
        log_alpha = jnp.where(valid_t, new - shift, log_alpha)
        return log_alpha, (log_alpha, log_sums, recover, jnp.where(valid_t, shift, 0.0))

    init = jnp.zeros((L, B), unary.dtype)  # position 0 starts a chain (or the row is empty)
    _, (log_alphas, log_sums, recovered, shifts) = jax.lax.scan(
        step, init, (continued, first, starts, inner, valid))
    alphas = jnp.exp(log_alphas)
    # Each chain adds the log of its last forward sum (0 at least, or -inf without an allowed path).
    totals = jnp.where(ends, _safe_log(jnp.sum(alphas, 1)), 0.0)
    log_z = pairwise_sum(shifts) + pairwise_sum(totals)
    return _Rows(log_z, log_alphas, shifts, alphas, log_sums, recovered, shifted_transitions, factors, starts, valid,
                 ends)


def _edge_sums_in_scan(num_labels: int, batch: int) -> bool:
    return num_labels * num_labels * batch <= tuning().edge_sums_in_scan_max_size


class _RowMarginals(NamedTuple):
    """nodes: `[B, T, L]`; firsts: `[L, B]` node marginals summed over chain
    starts; ratios: `[T, L, B]`, `m_{t+1}(j) / s_{t+1}(j)` where position
    `t + 1` continues a chain through an ordinary step (else 0), or
    `edge_sums`: per row `sum_t alpha_t(i) ratios_t(j)`, `[L, L, B]`, when
    that block is small (`_edge_sums_in_scan`); exact_edges: `[L, L, B]`
    per-row expected transition counts of the recovered steps."""

    nodes: jax.Array
    firsts: jax.Array
    ratios: Optional[jax.Array]
    edge_sums: Optional[jax.Array]
    exact_edges: jax.Array


def _following(x, fill):
    """`x[t + 1]` at `t` along the leading axis, `fill` at the end."""
    return jnp.concatenate([x[1:], jnp.full((1,) + x.shape[1:], fill, x.dtype)])


def _exact_conditional(log_alpha, shifted_scores, log_sums):
    """`P(y_{t-1} = i | y_t = j) = exp(la(i) + A(i, j) - c(j) - log s(j))` in log
    space, `[L, L, ...]` from `log_alpha [L, ...]`, `shifted_scores [L, L, ...]`
    and `log_sums [L, ...]`; 0 where `s(j) = 0`."""
    finite = jnp.isfinite(log_sums)
    exponent = log_alpha[:, None] + shifted_scores - jnp.where(finite, log_sums, 0.0)[None]
    return jnp.where(finite[None], jnp.exp(exponent), 0.0)


def _rows_marginals(rows: _Rows) -> _RowMarginals:
    """The backward pass (smoothed node marginals, see the module docstring)."""
    T, L, B = rows.alphas.shape
    inner_next = _following(rows.valid & ~rows.starts, False)
    log_sums_next = _following(rows.log_sums, 0.0)
    recovered_next = _following(rows.recovered, False)
    # m_{t+1}(j) / s_{t+1}(j) needs 1 / s, finite on ordinary steps (s >= tau).
    inverse_sums_next = jnp.where(inner_next[:, None] & ~recovered_next[:, None, None],
                                  jnp.exp(-jnp.where(jnp.isfinite(log_sums_next), log_sums_next, 0.0)), 0.0)
    in_scan = _edge_sums_in_scan(L, B)

    def step(carry, inputs):
        following, edge_sums = carry  # the marginals at t + 1
        alpha_t, log_alpha_t, end_t, valid_t, continues, log_sums_next, recovered_next, inverse_sums_next = inputs
        ratio = following * inverse_sums_next

        def exact():
            conditional = _exact_conditional(log_alpha_t, rows.shifted_transitions[:, :, None], log_sums_next)
            return jnp.sum(conditional * jnp.where(continues, following, 0.0)[None], 1)

        backward = jax.lax.cond(recovered_next, exact, lambda: alpha_t * _matmul(rows.factors, ratio))
        nodes_t = jnp.where(valid_t, _normalized(jnp.where(end_t, alpha_t, backward), 0), 0.0)
        if in_scan:
            return (nodes_t, edge_sums + alpha_t[:, None, :] * ratio[None]), nodes_t
        return (nodes_t, edge_sums), (nodes_t, ratio)

    dtype = rows.alphas.dtype
    init = (jnp.zeros((L, B), dtype), jnp.zeros((L, L, B) if in_scan else (), dtype))
    inputs = (rows.alphas, rows.log_alphas, rows.ends, rows.valid, inner_next, log_sums_next, recovered_next,
              inverse_sums_next)
    (_, edge_sums), outputs = jax.lax.scan(step, init, inputs, reverse=True)
    nodes, ratios = (outputs, None) if in_scan else outputs
    exact_edges = jax.lax.cond(jnp.any(rows.recovered), lambda: _rows_exact_edges(rows, nodes),
                               lambda: jnp.zeros((L, L, B), dtype))
    firsts = jnp.sum(jnp.where(rows.starts[:, None], nodes, 0.0), 0)
    return _RowMarginals(jnp.transpose(nodes, (2, 0, 1)), firsts, ratios, edge_sums if in_scan else None,
                         exact_edges)


def _rows_exact_edges(rows: _Rows, nodes):
    """Per-row expected transition counts `[L, L, B]` of the recovered steps,
    in log space (run only when a step was recovered)."""
    T, L, B = rows.alphas.shape
    taken = rows.recovered[1:, None] & rows.valid[1:] & ~rows.starts[1:]  # [T - 1, B]

    def step(edges, inputs):
        log_alpha_previous, log_sums_t, nodes_t, taken_t = inputs
        conditional = _exact_conditional(log_alpha_previous, rows.shifted_transitions[:, :, None], log_sums_t)
        return edges + conditional * jnp.where(taken_t, nodes_t, 0.0)[None], None

    edges, _ = jax.lax.scan(step, jnp.zeros((L, L, B), rows.alphas.dtype),
                            (rows.log_alphas[:-1], rows.log_sums[1:], nodes[1:], taken))
    return edges


def _edge_tangent(rows: _Rows, marginals: _RowMarginals, transitions_tangent):
    """Per row `[B]`, `sum_{t, i, j} xi_t(i, j) dA(i, j)` for a tangent `dA
    [L, L]` of the transitions: ordinary steps from the edge sums or, for
    large blocks, as `(exp(A - c) * dA)^T` applied to every forward vector
    at once (reverse mode turns it into one `[L, T B] x [T B, L]` product);
    recovered steps from their exact counts."""
    allowed = rows.shifted_transitions > -jnp.inf  # a forbidden transition's tangent may be infinite
    tangent = jnp.where(allowed, transitions_tangent, 0.0)
    exact = jnp.sum(tangent[:, :, None] * marginals.exact_edges, (0, 1))
    weighted = rows.factors * tangent
    if marginals.edge_sums is not None:
        return exact + jnp.sum(weighted[:, :, None] * marginals.edge_sums, (0, 1))
    T, L, B = rows.alphas.shape
    flat = lambda x: jnp.transpose(x, (1, 0, 2)).reshape(L, T * B)
    fast = jnp.sum(((weighted.T @ flat(rows.alphas)) * flat(marginals.ratios)).reshape(L, T, B), (0, 1))
    return exact + fast


@jax.custom_jvp
def row_log_partition(unary, transitions, start, starts, lengths):
    """Per row `[B]`, the sum of `log Z` over its back-to-back chains.

    unary: `[B, T, L]` float; transitions: `[L, L]`; start: `[L]`; starts:
    `[B, T]` bool, True at each chain's first position (position 0 always
    starts one); lengths: `[B]` ints in `[0, T]`. Inputs are assumed valid
    (`chain` checks them). Differentiable in `unary`, `transitions` and
    `start` to any order, in forward and reverse mode.
    """
    if unary.shape[1] == 0:
        return jnp.zeros(unary.shape[:1], unary.dtype)
    return _rows_forward(unary, transitions, start, starts, lengths).log_z


@row_log_partition.defjvp
def _row_log_partition_jvp(primals, tangents):
    unary, transitions, start, starts, lengths = primals
    unary_tangent, transitions_tangent, start_tangent = tangents[:3]
    if unary.shape[1] == 0:
        zeros = jnp.zeros(unary.shape[:1], unary.dtype)
        return zeros, zeros
    rows = _rows_forward(unary, transitions, start, starts, lengths)
    marginals = _rows_marginals(rows)
    # Tangents where a marginal is zero (e.g. at -inf scores) may be infinite; 0 * inf must not leak in.
    masked = lambda weights, tangent: jnp.where(weights > 0, tangent, 0.0)
    tangent = (jnp.sum(marginals.nodes * masked(marginals.nodes, unary_tangent), (1, 2))
               + _edge_tangent(rows, marginals, transitions_tangent)
               + jnp.sum(marginals.firsts * masked(marginals.firsts, start_tangent[:, None]), 0))
    return rows.log_z, tangent


# ---------------------------------------------------------------------------
# Per-position potentials `[B, T, L, L]`
# ---------------------------------------------------------------------------


class _Blocks(NamedTuple):
    """Position `t`'s scores shifted per column, `shifted(t) [B, L, L]`
    (`scores - shifts[:, t]`, scores past the length read as 0), and their
    exponentials `block(t)`; `kept` holds all exponentials when small enough
    to keep (`Tuning.keep_factors_max_bytes`)."""

    scores: jax.Array
    shifts: jax.Array
    kept: Optional[jax.Array]

    def shifted(self, t):
        scores = jax.lax.dynamic_index_in_dim(self.scores, t, 1, keepdims=False)
        return scores - jax.lax.dynamic_index_in_dim(self.shifts, t, 1, keepdims=False)[:, None, :]

    def block(self, t):
        if self.kept is not None:
            return jax.lax.dynamic_index_in_dim(self.kept, t, 1, keepdims=False)
        return jnp.exp(self.shifted(t))

    def all(self):
        return self.kept if self.kept is not None else jnp.exp(self.scores - self.shifts[:, :, None, :])


def _blocks(potentials, valid) -> _Blocks:
    scores = jnp.where(valid[:, :, None, None], potentials, 0.0)
    blocks = _Blocks(scores, finite_max(scores, -2), None)
    return blocks._replace(kept=blocks.all()) if potentials.nbytes <= tuning().keep_factors_max_bytes else blocks


def _batched_vecmat(vectors, matrices):
    """`[B, L] x [B, L, L] -> [B, L]`."""
    if vectors.shape[-1] <= tuning().fused_products_max_labels:
        return jnp.sum(vectors[:, :, None] * matrices, 1)
    return jnp.einsum("bi,bij->bj", vectors, matrices)


def _batched_matvec(matrices, vectors):
    """`[B, L, L] x [B, L] -> [B, L]`."""
    if vectors.shape[-1] <= tuning().fused_products_max_labels:
        return jnp.sum(matrices * vectors[:, None, :], 2)
    return jnp.einsum("bij,bj->bi", matrices, vectors)


class _Chains(NamedTuple):
    """The forward pass over per-position potentials (time first inside).

    log_z: `[B]`; log_alphas, alphas: `[T, B, L]`; shifts: `[T, B]` (as in
    `_Rows`); log_sums: `[T, B, L]` (row 0 unread); recovered: `[T]`;
    blocks; valid: `[B, T]`.
    """

    log_z: jax.Array
    log_alphas: jax.Array
    shifts: jax.Array
    alphas: jax.Array
    log_sums: jax.Array
    recovered: jax.Array
    blocks: _Blocks
    valid: jax.Array


def _chains_forward(potentials, lengths) -> _Chains:
    """Time is read in place, one `[B, L, L]` block per step: moving it to the
    front would copy the whole tensor."""
    B, T, L, _ = potentials.shape
    valid = jnp.arange(T)[None, :] < lengths[:, None]
    blocks = _blocks(potentials, valid)
    first = jnp.where(valid[:, :1], potentials[:, 0, 0], 0.0)
    first_shift = finite_max(first, -1)
    tau = recovery_threshold(potentials.dtype, L)

    def step(log_alpha, t):
        valid_t = valid[:, t]
        sums = _batched_vecmat(jnp.exp(log_alpha), blocks.block(t))
        recover = jnp.any((sums < tau) & valid_t[:, None])
        log_sums = jax.lax.cond(recover, lambda: logsumexp(log_alpha[:, :, None] + blocks.shifted(t), 1),
                                lambda: _safe_log(sums))
        new = log_sums + blocks.shifts[:, t]
        shift = finite_max(new, -1)
        log_alpha = jnp.where(valid_t[:, None], new - shift[:, None], log_alpha)
        return log_alpha, (log_alpha, log_sums, recover, jnp.where(valid_t, shift, 0.0))

    log_alpha = first - first_shift[:, None]
    last, (log_alphas, log_sums, recovered, shifts) = jax.lax.scan(step, log_alpha, jnp.arange(1, T))
    log_alphas = jnp.concatenate([log_alpha[None], log_alphas])
    log_sums = jnp.concatenate([jnp.zeros((1, B, L), potentials.dtype), log_sums])
    recovered = jnp.concatenate([jnp.zeros((1,), bool), recovered])
    shifts = jnp.concatenate([first_shift[None], shifts])
    alphas = jnp.exp(log_alphas)
    total = jnp.where(lengths > 0, _safe_log(jnp.sum(jnp.exp(last), -1)), 0.0)
    log_z = pairwise_sum(shifts) + total
    return _Chains(log_z, log_alphas, shifts, alphas, log_sums, recovered, blocks, valid)


def _chains_edge_marginals(chains: _Chains):
    """The backward pass: edge marginals `[B, T, L, L]`, `xi_t(i, j) =
    P(y_{t-1} = i, y_t = j)`, and at `t = 0` the node marginals in row 0;
    zero past the length and in the unread rows of position 0. The scan
    carries the node marginals; the products are one vectorised pass after
    it (the recovered steps' in log space, when there are any)."""
    T, B, L = chains.alphas.shape
    valid = chains.valid.T  # [T, B]
    continues = _following(valid, False)
    recovered_next = _following(chains.recovered, False)
    log_sums_next = _following(chains.log_sums, 0.0)
    inverse_sums_next = jnp.where(continues[:, :, None] & ~recovered_next[:, None, None],
                                  jnp.exp(-jnp.where(jnp.isfinite(log_sums_next), log_sums_next, 0.0)), 0.0)

    def step(following, inputs):
        t, alpha_t, log_alpha_t, valid_t, continues_t, recovered_t, log_sums_t, inverse_sums_t = inputs
        ratio = following * inverse_sums_t
        after = jnp.minimum(t + 1, T - 1)

        def exact():
            conditional = _exact_conditional(jnp.moveaxis(log_alpha_t, 0, -1),
                                             jnp.moveaxis(chains.blocks.shifted(after), 0, -1),
                                             jnp.moveaxis(log_sums_t, 0, -1))
            return jnp.sum(conditional * jnp.where(continues_t, following.T, 0.0)[None], 1).T

        backward = jax.lax.cond(recovered_t, exact,
                                lambda: alpha_t * _batched_matvec(chains.blocks.block(after), ratio))
        nodes_t = jnp.where(continues_t[:, None], backward, alpha_t)
        nodes_t = jnp.where(valid_t[:, None], _normalized(nodes_t, -1), 0.0)
        return nodes_t, (nodes_t, ratio)

    inputs = (jnp.arange(T), chains.alphas, chains.log_alphas, valid, continues, recovered_next, log_sums_next,
              inverse_sums_next)
    _, (nodes, ratios) = jax.lax.scan(step, jnp.zeros((B, L), chains.alphas.dtype), inputs, reverse=True)
    to_batch = lambda x: jnp.transpose(x, (1, 0, 2))
    edges = to_batch(chains.alphas[:-1])[:, :, :, None] * chains.blocks.all()[:, 1:] * to_batch(ratios[:-1])[:, :, None, :]
    edges = jax.lax.cond(jnp.any(chains.recovered), lambda: _chains_exact_edges(chains, nodes, edges),
                         lambda: edges)
    heads = jnp.zeros((B, 1, L, L), chains.alphas.dtype).at[:, 0, 0].set(nodes[0])
    return jnp.concatenate([heads, edges], 1)


def _chains_exact_edges(chains: _Chains, nodes, edges):
    """`edges [B, T - 1, L, L]` with the recovered steps' entries recomputed in
    log space (run only when a step was recovered)."""
    shifted = chains.blocks.scores[:, 1:] - chains.blocks.shifts[:, 1:, None, :]  # [B, T - 1, L, L]
    to_batch = lambda x: jnp.transpose(x, (1, 0, 2))
    finite = jnp.isfinite(chains.log_sums[1:])
    log_sums = jnp.where(finite, chains.log_sums[1:], 0.0)
    exponent = to_batch(chains.log_alphas[:-1])[:, :, :, None] + shifted - to_batch(log_sums)[:, :, None, :]
    exact = jnp.where(to_batch(finite)[:, :, None, :], jnp.exp(exponent), 0.0)
    exact = exact * jnp.where(chains.valid[:, 1:, None], to_batch(nodes[1:]), 0.0)[:, :, None, :]
    return jnp.where(chains.recovered[None, 1:, None, None], exact, edges)


@jax.custom_jvp
def log_partition_per_position(potentials, lengths):
    """Per chain `[B]`, `log Z` of per-position potentials.

    potentials: `[B, T, L, L]` float (`chain`'s convention: at `t = 0` only
    row 0, the start scores, is read); lengths: `[B]` ints in `[0, T]`.
    Inputs are assumed valid (`chain` checks them). Differentiable in
    `potentials` to any order, in forward and reverse mode; the gradient is
    the edge marginals.
    """
    if potentials.shape[1] == 0:
        return jnp.zeros(potentials.shape[:1], potentials.dtype)
    return _chains_forward(potentials, lengths).log_z


@log_partition_per_position.defjvp
def _log_partition_per_position_jvp(primals, tangents):
    potentials, lengths = primals
    if potentials.shape[1] == 0:
        zeros = jnp.zeros(potentials.shape[:1], potentials.dtype)
        return zeros, zeros
    chains = _chains_forward(potentials, lengths)
    marginals = _chains_edge_marginals(chains)
    # A tangent where the marginal is zero (e.g. at a -inf score) may be infinite.
    tangent = jnp.where(marginals > 0, tangents[0], 0.0)
    return chains.log_z, jnp.sum(marginals * tangent, (1, 2, 3))
