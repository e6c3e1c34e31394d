"""Scaled forward-backward with closed-form derivatives: the fast CPU path of
the real semiring.

`chain.forward`, `chain.log_partition`, `chain.row_forward` and
`chain.row_log_partition` use `row_log_partition` for `semirings.Real`
(sequential algorithm) when the potentials are `FactoredPotentials` whose
`transitions [L, L]` and `start [L]` are shared by the batch: the classic
CRF. `chain.forward` and `chain.log_partition` use
`log_partition_per_position` for per-position potentials `[..., T, L, L]`
(same recursions, one exponentiated block per step; 2-2.5x faster than
autodiff of the generic scan at 8 x 40 x 333 and 256 x 25 x 45). Everything
else goes through the generic semiring scan of `chain`, which is also the
oracle the tests compare this module with.

Two things make it faster than reverse-mode autodiff of the generic scan
(CoNLL-2002 NER as 214 rows x 1,240 positions x 9 labels: about 35 ms
against 90 ms for log Z plus its gradient, two cores):

* Batch last. The scan carries `[L, B]` rather than the `[B, L]` that
  `vmap` of one chain gives, so every step's vector operations run along
  the batch instead of along 9 labels.
* Derivatives in closed form (MATH.md, forward-backward): with normalised
  forward vectors `alpha_t` and per-step normalisers `c_t`, the backward
  vectors are `beta_t = 1` at a chain's last position and
  `beta_t = M (u_{t+1} * beta_{t+1}) / c_{t+1}` before it (`M` the
  exponentiated transitions, `u_t` the exponentiated unary scores). Node
  marginals are `alpha_t * beta_t`; edge marginals summed over positions
  are `M * sum_t alpha_{t-1} (u_t * beta_t / c_t)^T`, summed inside the
  backward scan for small label sets and as one matrix product after it for
  large ones. Reverse mode through the generic scan instead
  adds a transition-gradient outer product and the normaliser's derivative
  at every step of a second, larger scan.

The derivative is a custom JVP, not a VJP: the tangent is linear in the
tangents of the scores, with the marginals as coefficients, so reverse mode,
forward mode and every higher order work; the marginals come from
differentiable scans, and second derivatives are their autodiff.

A chain whose every path is forbidden has `log Z = -inf` and zero marginals
(no NaN), as in the generic scan, with no special case: its forward vector
is 0 from the position where the last path dies, and before that position
the backward vector is 0 wherever the forward vector is not, since both
recursions multiply the same exponentiated scores.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from ..semirings import finite_max, pairwise_sum


# Up to this many products a step, `[L, L] x [L, B]` runs as one fused multiply
# and sum: a dot call costs more than the work (1 x 10,000 x 9: 10 ms against
# 19 ms for log Z and gradients); beyond it the dot is as fast or faster.
_FUSED_MATMUL_MAX_SIZE = 2 ** 12


def _matmul(matrix, vectors):
    """`[L, L] x [L, B] -> [L, B]`."""
    if matrix.size * vectors.shape[-1] <= _FUSED_MATMUL_MAX_SIZE:
        return jnp.sum(matrix[:, :, None] * vectors[None], 1)
    return matrix @ vectors


def _forward(unary, transitions, start, starts, lengths):
    """The scaled forward pass over rows of back-to-back chains, batch last.

    unary: `[B, T, L]`; transitions: `[L, L]`; start: `[L]`; starts: `[B, T]`
    bool (position 0 always starts a chain); lengths: `[B]`.
    Returns `(log_z [B], alphas [T, L, B], norms [T, B], factors [T, L, B],
    transition_factors [L, L], starts [T, B], valid [T, B])`: the log Z of
    each row (the sum over its chains), the normalised forward vectors, their
    normalisers `c_t`, the exponentiated shifted unary scores, the
    exponentiated shifted transitions, and the chain starts and valid
    positions inside the lengths.
    """
    T = unary.shape[1]
    positions = jnp.arange(T)[:, None]
    valid = positions < lengths
    starts = (starts.T | (positions == 0)) & valid
    unary = jnp.where(valid[:, None], jnp.transpose(unary, (1, 2, 0)), 0.0)
    transition_shift = finite_max(transitions, (-2, -1))
    transition_factors = jnp.exp(transitions - transition_shift)
    unary_shift = finite_max(unary, 1)
    factors = jnp.exp(unary - unary_shift[:, None])
    # Shifted on their own (not as exp(start) * factors): the product of two
    # separately shifted factors can underflow where their maxima differ.
    first = start[:, None] + unary
    first_shift = finite_max(first, 1)
    first_factors = jnp.exp(first - first_shift[:, None])
    transposed = transition_factors.T

    def step(alpha, inputs):
        first_t, first_shift_t, factors_t, shift_t, start_t, valid_t, later_t = inputs
        new = jnp.where(start_t, first_t, _matmul(transposed, alpha) * factors_t)
        total = jnp.sum(new, 0)
        norm = jnp.where(total > 0, total, 1.0)
        log_norm = jnp.where(start_t, first_shift_t, shift_t + transition_shift) + jnp.log(norm)
        # A chain ends where the next one starts; with no allowed path its log Z is -inf.
        ended = jnp.where(start_t & later_t & (jnp.sum(alpha, 0) <= 0), -jnp.inf, 0.0)
        alpha = jnp.where(valid_t, new / norm, alpha)
        return alpha, (jnp.where(valid_t, log_norm, 0.0) + ended, alpha, norm)

    inputs = (first_factors, first_shift, factors, unary_shift, starts, valid, positions[:, 0] > 0)
    alpha, (log_norms, alphas, norms) = jax.lax.scan(step, first_factors[0], inputs)
    last_dead = (lengths > 0) & (jnp.sum(alpha, 0) <= 0)
    log_z = pairwise_sum(log_norms) + jnp.where(last_dead, -jnp.inf, 0.0)
    return log_z, alphas, norms, factors, transition_factors, starts, valid


# Per-row edge sums `[L, L, B]` accumulate inside the backward scan while
# that block stays cache-sized (CoNLL-2002: 9 x 9 x 214 floats, 5 ms faster
# than the product below); larger ones cost more memory traffic per step than
# one matrix product after the scan (333 labels, B = 8: 10 ms against 3 ms).
_EDGE_SUMS_IN_SCAN = 2 ** 15


def _edge_sums_in_scan(num_labels: int, batch: int) -> bool:
    return num_labels * num_labels * batch <= _EDGE_SUMS_IN_SCAN


def _marginals(alphas, norms, factors, transition_factors, starts, valid):
    """The backward pass: per row, the node marginals `[B, T, L]`, the start
    marginals `[L, B]` (the node marginals at chain starts), and what gives
    the edge marginals, `xi_{t+1}(i, j) = alphas[t, i] M[i, j] following[t, j]`
    with `following[t] = u_{t+1} * beta_{t+1} / c_{t+1}` (zero where position
    `t + 1` starts a chain or lies past the length): `following [T, L, B]`,
    or `sum_t alphas[t, i] following[t, j]`, `[L, L, B]`, when that block is
    small (`_edge_sums_in_scan`)."""
    T, L, B = factors.shape
    next_starts = jnp.concatenate([starts[1:], jnp.ones((1, B), bool)])
    next_valid = jnp.concatenate([valid[1:], jnp.zeros((1, B), bool)])
    ends = valid & (next_starts | ~next_valid)
    inner = valid & ~starts
    in_scan = _edge_sums_in_scan(L, B)

    def step(carry, inputs):
        following, edge_sums = carry
        end_t, inner_t, valid_t, factors_t, norm_t, alpha_t = inputs
        beta = jnp.where(end_t, 1.0, _matmul(transition_factors, following))
        # sum_j alpha_t(j) beta_t(j) is 1 in exact arithmetic; dividing by it
        # stops rounding from compounding over T steps (1e-5 off at T = 10,000
        # in float32 otherwise). It is 0 where the chain has no allowed path.
        total = jnp.sum(alpha_t * beta, 0)
        beta = beta / jnp.where(total > 0, total, 1.0)
        current = jnp.where(inner_t, factors_t * beta / norm_t, 0.0)
        nodes_t = jnp.where(valid_t, alpha_t * beta, 0.0)
        if in_scan:
            return (current, edge_sums + alpha_t[:, None, :] * following[None, :, :]), nodes_t
        return (current, edge_sums), (nodes_t, following)

    init = (jnp.zeros((L, B), factors.dtype), jnp.zeros((L, L, B) if in_scan else (), factors.dtype))
    (_, edge_sums), outputs = jax.lax.scan(step, init, (ends, inner, valid, factors, norms, alphas), reverse=True)
    nodes, edges = (outputs, edge_sums) if in_scan else outputs
    start_marginals = jnp.sum(jnp.where(starts[:, None], nodes, 0.0), 0)
    return jnp.transpose(nodes, (2, 0, 1)), start_marginals, edges


def _edge_tangent(alphas, edges, transition_factors, transitions_tangent):
    """Per row `[B]`, `sum_{t, i, j} xi_t(i, j) dA(i, j)` for a tangent `dA
    [L, L]` of the transitions, from `_marginals`'s edge sums `[L, L, B]`, or
    from `following [T, L, B]` as `(M * dA)^T` applied to every forward
    vector at once, which reverse mode turns into one `[L, T B] x [T B, L]`
    matrix product."""
    allowed = transition_factors > 0  # a forbidden transition's tangent may be infinite
    weighted = transition_factors * jnp.where(allowed, transitions_tangent, 0.0)
    T, L, B = alphas.shape
    if _edge_sums_in_scan(L, B):
        return jnp.sum(weighted[:, :, None] * edges, (0, 1))
    flat = lambda x: jnp.transpose(x, (1, 0, 2)).reshape(L, T * B)
    return jnp.sum(((weighted.T @ flat(alphas)) * flat(edges)).reshape(L, T, B), (0, 1))


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
    return _forward(unary, transitions, start, starts, lengths)[0]


@row_log_partition.defjvp
def _row_log_partition_jvp(primals, tangents):
    unary, transitions, start, starts, lengths = primals
    unary_tangent, transitions_tangent, start_tangent = tangents[:3]
    if unary.shape[1] == 0:
        zeros = jnp.zeros(unary.shape[:1], unary.dtype)
        return zeros, zeros
    log_z, alphas, norms, factors, transition_factors, starts, valid = _forward(
        unary, transitions, start, starts, lengths)
    nodes, firsts, edges = _marginals(alphas, norms, factors, transition_factors, starts, valid)
    # Tangents where a marginal is zero (e.g. at -inf scores) may be infinite; 0 * inf must not leak in.
    masked = lambda weights, tangent: jnp.where(weights > 0, tangent, 0.0)
    tangent = (jnp.sum(nodes * masked(nodes, unary_tangent), (1, 2))
               + _edge_tangent(alphas, edges, transition_factors, transitions_tangent)
               + jnp.sum(firsts * masked(firsts, start_tangent[:, None]), 0))
    return log_z, tangent


# ---------------------------------------------------------------------------
# Per-position potentials `[B, T, L, L]`
# ---------------------------------------------------------------------------


# Exponentiated potentials are kept as a second `[B, T, L, L]` tensor only up
# to this size; above it, allocating that tensor (page faults on fresh
# memory: about 40 ms for 142 MB at 8 x 40 x 333 x 333) costs more than
# exponentiating each block again in the backward pass and for the marginals.
_KEEP_FACTORS_BYTES = 2 ** 24


class _Factors(NamedTuple):
    """Position `t`'s edge scores exponentiated, `block(t) [B, L, L]`, each
    block shifted by its largest finite score (`shifts [B, T]`; scores past
    the length read as 0); `scores [B, T, L, L]` the masked potentials and
    `kept` their exponentials when small enough to keep."""

    scores: jax.Array
    shifts: jax.Array
    kept: Optional[jax.Array]

    def block(self, t):
        if self.kept is not None:
            return jax.lax.dynamic_index_in_dim(self.kept, t, 1, keepdims=False)
        scores = jax.lax.dynamic_index_in_dim(self.scores, t, 1, keepdims=False)
        return jnp.exp(scores - self.shifts[:, t, None, None])

    def all(self):
        return self.kept if self.kept is not None else jnp.exp(self.scores - self.shifts[:, :, None, None])


# Below this many labels a step's products run as one fused multiply and sum:
# XLA's batched dot costs more per call than the work (1 x 10,000 x 9: 5 ms
# against 20 ms), while at 45 labels the dot is faster (4 ms against 7 ms).
_FUSED_PRODUCTS_MAX_LABELS = 16


def _batched_vecmat(vectors, matrices):
    """`[B, L] x [B, L, L] -> [B, L]`."""
    if vectors.shape[-1] <= _FUSED_PRODUCTS_MAX_LABELS:
        return jnp.sum(vectors[:, :, None] * matrices, 1)
    return jnp.einsum("bi,bij->bj", vectors, matrices)


def _batched_matvec(matrices, vectors):
    """`[B, L, L] x [B, L] -> [B, L]`."""
    if vectors.shape[-1] <= _FUSED_PRODUCTS_MAX_LABELS:
        return jnp.sum(matrices * vectors[:, None, :], 2)
    return jnp.einsum("bij,bj->bi", matrices, vectors)


def _factors_per_position(potentials, valid) -> _Factors:
    scores = jnp.where(valid[:, :, None, None], potentials, 0.0)
    shifts = finite_max(scores, (-2, -1))
    factors = _Factors(scores, shifts, None)
    return factors._replace(kept=factors.all()) if potentials.nbytes <= _KEEP_FACTORS_BYTES else factors


def _forward_per_position(potentials, lengths):
    """The scaled forward pass over per-position potentials `[B, T, L, L]`
    (time is read in place, one `[B, L, L]` block per step: moving it to the
    front would copy the whole tensor). Returns `(log_z [B], alphas [T, B, L],
    norms [T, B], factors, valid [B, T])`, as `_forward` without chain
    starts; position 0 reads row 0 of the potentials on its own shift."""
    B, T, L, _ = potentials.shape
    valid = jnp.arange(T)[None, :] < lengths[:, None]
    factors = _factors_per_position(potentials, valid)
    first = jnp.where(valid[:, :1], potentials[:, 0, 0], 0.0)
    first_shift = finite_max(first, -1)
    alpha = jnp.exp(first - first_shift[:, None])
    total = jnp.sum(alpha, -1)
    norm = jnp.where(total > 0, total, 1.0)

    def step(alpha, t):
        new = _batched_vecmat(alpha, factors.block(t))
        total = jnp.sum(new, -1)
        norm = jnp.where(total > 0, total, 1.0)
        alpha = jnp.where(valid[:, t, None], new / norm[:, None], alpha)
        return alpha, (alpha, norm)

    alpha = alpha / norm[:, None]
    last, (alphas, norms) = jax.lax.scan(step, alpha, jnp.arange(1, T))
    alphas = jnp.concatenate([alpha[None], alphas])
    norms = jnp.concatenate([norm[None], norms])
    shifts = jnp.concatenate([first_shift[None], factors.shifts[:, 1:].T])
    log_z = pairwise_sum(jnp.where(valid.T, shifts + jnp.log(norms), 0.0))
    dead = (lengths > 0) & (jnp.sum(last, -1) <= 0)
    return jnp.where(dead, -jnp.inf, log_z), alphas, norms, factors, valid


def _edge_marginals_per_position(alphas, norms, factors: _Factors, valid):
    """The backward pass: edge marginals `[B, T, L, L]`, `xi_t(i, j) =
    alpha_{t-1}(i) F_t(i, j) beta_t(j) / c_t` (`F_t` the shifted
    exponentiated block), and at `t = 0` the node marginals in row 0; zero
    past the length and in the unread rows of position 0. The scan carries
    only `beta`; the products are one vectorised pass after it."""
    B, T, L, _ = factors.scores.shape

    def step(beta, t):
        valid_t = valid[:, t, None]
        following = jnp.where(valid_t, beta / norms[t][:, None], 0.0)
        # Past the length, position t - 1 may be a chain's last: beta = 1 there.
        back = jnp.where(valid_t, _batched_matvec(factors.block(t), following), 1.0)
        # As in `_marginals`: sum_i alpha(i) beta(i) is 1 in exact arithmetic.
        total = jnp.sum(alphas[t - 1] * back, -1)
        return back / jnp.where(total > 0, total, 1.0)[:, None], following

    beta, following = jax.lax.scan(step, jnp.ones((B, L), alphas.dtype), jnp.arange(1, T), reverse=True)
    to_batch = lambda x: jnp.transpose(x, (1, 0, 2))
    edges = to_batch(alphas[:-1])[:, :, :, None] * factors.all()[:, 1:] * to_batch(following)[:, :, None, :]
    first = jnp.where(valid[:, :1], alphas[0] * beta, 0.0)
    heads = jnp.zeros((B, 1, L, L), alphas.dtype).at[:, 0, 0].set(first)
    return jnp.concatenate([heads, edges], 1)


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
    return _forward_per_position(potentials, lengths)[0]


@log_partition_per_position.defjvp
def _log_partition_per_position_jvp(primals, tangents):
    potentials, lengths = primals
    if potentials.shape[1] == 0:
        zeros = jnp.zeros(potentials.shape[:1], potentials.dtype)
        return zeros, zeros
    log_z, alphas, norms, factors, valid = _forward_per_position(potentials, lengths)
    marginals = _edge_marginals_per_position(alphas, norms, factors, valid)
    # A tangent where the marginal is zero (e.g. at a -inf score) may be infinite.
    tangent = jnp.where(marginals > 0, tangents[0], 0.0)
    return log_z, jnp.sum(marginals * tangent, (1, 2, 3))
