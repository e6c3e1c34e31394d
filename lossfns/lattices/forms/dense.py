"""The dense form: per-position edge scores `[..., T, L, L]` (at a chain's first
position only row 0, its start scores, is read). Its exact log step is a
real-space product with each block's exponentials shifted per column, redone in
log space where a column sum underflows (`log_steps`); its derivative is the
closed-form backward pass of `DensePotentials.log_tangent`. `semiring_steps` is
any semiring's step over such blocks. Design notes: docs/internals.md.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ... import semirings
from ...semirings import finite_max, logsumexp
from ...validation import as_float_array
from .. import kernel
from . import check_scores_inside, flatten_batch, reversed_in_time


def semiring_steps(semiring, scores):
    """`(inputs, step)` of `kernel.scan` for any semiring over per-position
    edge scores: the blocks converted once, one semiring vector-matrix
    product a step.

    Args:
      semiring: a `semirings.Semiring`.
      scores: `[T, L, L]`, one chain's (masked) edge scores.

    Returns:
      `(inputs, step)`, as `PotentialForm.lift`.
    """
    matrices, scales = semiring.convert_scaled(scores, (-2, -1))
    time_axis = lambda x: x.ndim - 3  # leading axes of a semiring value (k-max) come first

    def step(value, inputs, t, live):
        matrices, scales = inputs
        matrix_t = jax.tree_util.tree_map(lambda x: jax.lax.dynamic_index_in_dim(x, t, time_axis(x), False), matrices)
        return semiring.vecmat(value, matrix_t), kernel.at_position(scales, t), ()

    return (matrices, scales), step


class DensePotentials(NamedTuple):
    """Per-position edge scores `[..., T, L, L]` (see the module docstring)."""

    scores: jax.Array

    @property
    def num_steps(self) -> int:
        return self.scores.shape[-3]

    @property
    def num_labels(self) -> int:
        return self.scores.shape[-1]

    @property
    def dtype(self):
        return self.scores.dtype

    @property
    def batch_shape(self) -> tuple:
        return self.scores.shape[:-3]

    def checked(self):
        scores = as_float_array("potentials", self.scores, 3, "[..., T, L, L]")
        L, L2 = scores.shape[-2:]
        if L != L2:
            raise ValueError(
                f"potentials must have shape [..., T, L, L] (square in the last two axes), got shape {scores.shape}"
            )
        if L < 1:
            raise ValueError("potentials must have at least one label (L >= 1)")
        return DensePotentials(scores)

    def check_inside(self, lengths) -> None:
        check_scores_inside("potentials", self.scores, lengths)

    def masked(self, valid):
        return DensePotentials(jnp.where(valid[:, None, None], self.scores, 0.0))

    def first_scores(self):
        return self.scores[:, 0, :]

    def time_inputs(self):
        return self.scores

    def block(self, inputs_t):
        return inputs_t

    def column(self, inputs_t, label):
        return inputs_t[:, label]

    def lift(self, semiring):
        if type(semiring) is semirings.LogSemiring:
            return log_steps(self.scores)
        return semiring_steps(semiring, self.scores)

    def log_tangent(self, length, starts, forward, tangent):
        return log_tangent(self, length, starts, forward, tangent)

    def padded(self, num_labels: int):
        """Itself: a per-position block gains nothing from extra labels."""
        return self

    def edge_scores(self):
        return self.scores

    def dense_scores(self):
        return self.scores

    def score_terms(self, labels, previous, starts):
        return self.scores[jnp.arange(labels.shape[0]), previous, labels]

    def batched(self, batch_shape):
        flat = DensePotentials(flatten_batch(self.scores, batch_shape, 3))
        return flat, DensePotentials._make((0,))  # in_axes: its leaf is an axis

    def from_gradient(self, gradient):
        """The edge marginals: the bare array."""
        return gradient.scores

    def label_marginals(self, gradient):
        return jnp.sum(gradient.scores, axis=-2)

    def with_label_scores(self, extra):
        scores = jnp.asarray(self.scores)
        return DensePotentials(scores + extra.astype(scores.dtype)[..., :, None, :])

    def forbidding(self, transitions, start, end, lengths):
        first = jnp.where(start, self.scores[..., :1, :, :], -jnp.inf)
        rest = jnp.where(transitions, self.scores[..., 1:, :, :], -jnp.inf)
        edges = jnp.concatenate([first, rest], axis=-3)
        last = jnp.arange(edges.shape[-3]) == jnp.asarray(lengths)[..., None] - 1  # [..., T]
        return DensePotentials(jnp.where(last[..., None, None] & ~end, -jnp.inf, edges))

    def reversed(self, lengths):
        edges = jnp.swapaxes(reversed_in_time(self.scores, lengths, lengths.ndim, 1), -1, -2)
        return DensePotentials(edges), jnp.zeros(self.scores.shape[:-1], self.scores.dtype)

    def named_scores(self):
        return (("potentials", self.scores),)


# ---------------------------------------------------------------------------
# The exact log step and its derivative
# ---------------------------------------------------------------------------


def _block_vecmat(vector, block):
    """`[L] x [L, L] -> [L]` with a per-chain block (mapped: `[B, L] x [B, L, L]`)."""
    if vector.shape[-1] <= kernel.tuning().fused_products_max_labels:
        return jnp.sum(vector[:, None] * block, 0)
    return vector @ block


def _block_matvec(block, vector):
    if vector.shape[-1] <= kernel.tuning().fused_products_max_labels:
        return jnp.sum(block * vector[None, :], 1)
    return block @ vector


class LogSteps(NamedTuple):
    """`lift(Log)` inputs: scores `[T, L, L]` (masked), shifts `[T, L]` each
    block's column maxima, and `kept`, every block's exponentials
    `exp(scores - shifts)`, when small enough to keep
    (`Tuning.keep_factors_max_bytes`), else None (exponentiated per block)."""

    scores: jax.Array
    shifts: jax.Array
    kept: jax.Array | None

    def shifted(self, t):
        return kernel.at_position(self.scores, t) - kernel.at_position(self.shifts, t)[None, :]

    def block(self, t):
        return kernel.at_position(self.kept, t) if self.kept is not None else jnp.exp(self.shifted(t))

    def all(self):
        return self.kept if self.kept is not None else jnp.exp(self.scores - self.shifts[:, None, :])


def log_steps(scores):
    """The exact log step: `(inputs, step)` of `lift(Log)` (`scores [T, L, L]`, masked)."""
    inputs = LogSteps(scores, finite_max(scores, -2), None)
    if scores.nbytes * kernel.traced_batch_size() <= kernel.tuning().keep_factors_max_bytes:
        inputs = inputs._replace(kept=inputs.all())

    def step(log_alpha, inputs, t, live):
        sums = _block_vecmat(jnp.exp(log_alpha), inputs.block(t))
        log_sums, recovered = kernel.checked_log_sums(
            sums, lambda: logsumexp(log_alpha[:, None] + inputs.shifted(t), 0), live
        )
        return log_sums + kernel.at_position(inputs.shifts, t), jnp.zeros((), scores.dtype), (log_sums, recovered)

    return inputs, step


def log_tangent(potentials, length, starts, forward: kernel.Forward, tangent):
    """The closed-form JVP of `log Z` of one row of chains with per-position
    potentials: `sum_t sum_{i, j} xi_t(i, j) dpsi_t(i, j)` with the edge
    marginals `xi_t(i, j) = P(y_{t-1} = i, y_t = j)` (at a chain's first
    position, row 0 holds its node marginals).

    potentials, tangent: `DensePotentials` (`[T, L, L]`); forward: the
    scan's with `log_steps`. The backward scan carries the node marginals;
    the edge marginals are one vectorised pass after it (the recovered
    steps' in log space, when there are any).
    """
    scores = tangent.scores
    T, L, _ = scores.shape
    chains = kernel.chain_spans(length, starts, T)
    log_alphas = forward.values
    log_sums, recovered = forward.aux
    blocks = forward.inputs
    alphas = jnp.exp(log_alphas)

    def step(following, inputs):
        t, alpha_t, log_alpha_t, valid_t, continues_t = inputs
        log_sums_next, recovered_next, inverse_sums = kernel.next_step(log_sums, recovered, continues_t, t)
        ratio = following * inverse_sums
        after = jnp.minimum(t + 1, T - 1)

        def exact():
            conditional = kernel.exact_conditional(log_alpha_t, blocks.shifted(after), log_sums_next)
            return jnp.sum(conditional * jnp.where(continues_t, following, 0.0)[None], 1)

        backward = jax.lax.cond(recovered_next, exact, lambda: alpha_t * _block_matvec(blocks.block(after), ratio))
        nodes_t = jnp.where(valid_t, kernel.normalized(jnp.where(continues_t, backward, alpha_t)), 0.0)
        return nodes_t, (nodes_t, ratio)

    inputs = (jnp.arange(T), alphas, log_alphas, chains.valid, chains.continues)
    _, (nodes, ratios) = jax.lax.scan(step, jnp.zeros((L,), alphas.dtype), inputs, reverse=True)
    # edges[t] = xi_{t+1}: from t's forward vector through block t + 1 to t + 1's ratio
    edges = alphas[:-1, :, None] * blocks.all()[1:] * ratios[:-1, None, :]
    edges = jax.lax.cond(jnp.any(recovered), lambda: _exact_edges(forward, chains, nodes, edges), lambda: edges)
    marginals = jnp.concatenate([jnp.zeros((1, L, L), edges.dtype), edges])
    heads = jnp.zeros((T, L, L), edges.dtype).at[:, 0].set(jnp.where(chains.starts[:, None], nodes, 0.0))
    marginals = jnp.where(chains.starts[:, None, None], heads, marginals)
    return jnp.sum(marginals * kernel.masked_tangent(marginals, scores))


def _exact_edges(forward: kernel.Forward, chains: kernel.ChainSpans, nodes, edges):
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
