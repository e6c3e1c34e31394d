"""The factored form, the classic CRF: `unary [..., T, L]`, `transitions [L, L]`
(or per chain) and `start [L]`, with edge scores `transitions[i, j] + unary[t, j]`
never built as `[T, L, L]`. Its exact log step is one real-space product with
`exp(A - c)` shared by every position, redone in log space where a column sum
underflows (`log_steps`); its derivative is the closed-form backward pass of
`FactoredPotentials.log_tangent`. Design notes: docs/internals.md.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ... import semirings
from ...semirings import finite_max, logsumexp
from ...validation import as_float_array, check_finite_or_neg_inf
from .. import kernel
from . import check_scores_inside, flatten_batch, reversed_in_time


class FactoredPotentials(NamedTuple):
    """Unary scores plus a shared transition matrix (see the module docstring).

    unary: `[..., T, L]`; transitions: `[L, L]` or `[..., L, L]`;
    start: `[L]`, `[..., L]` or `None` (zeros).
    """

    unary: jax.Array
    transitions: jax.Array
    start: jax.Array | None = None

    @property
    def num_steps(self) -> int:
        return self.unary.shape[-2]

    @property
    def num_labels(self) -> int:
        return self.unary.shape[-1]

    @property
    def dtype(self):
        return self.unary.dtype

    @property
    def batch_shape(self) -> tuple:
        return self.unary.shape[:-2]

    def checked(self):
        unary = as_float_array("unary", self.unary, 2, "[..., T, L]")
        batch_shape, L = unary.shape[:-2], unary.shape[-1]
        transitions = as_float_array("transitions", self.transitions, 2, "[L, L] or [..., L, L]")
        if transitions.shape[-2:] != (L, L):
            raise ValueError(
                f"transitions must have shape [..., {L}, {L}] (L = {L} labels, from unary), "
                f"got shape {transitions.shape}"
            )
        start = jnp.zeros((L,), unary.dtype) if self.start is None else self.start
        start = as_float_array("start", start, 1, "[L] or [..., L]")
        if start.shape[-1] != L:
            raise ValueError(f"start must have shape [..., {L}], got shape {start.shape}")
        for name, array, core in (("transitions", transitions, 2), ("start", start, 1)):
            try:
                jnp.broadcast_shapes(array.shape[:-core], batch_shape)
            except ValueError:
                raise ValueError(
                    f"{name} batch shape {array.shape[:-core]} does not broadcast to the "
                    f"batch shape {batch_shape} of unary"
                ) from None
            check_finite_or_neg_inf(name, array)
        if L < 1:
            raise ValueError("potentials must have at least one label (L >= 1)")
        dtype = jnp.result_type(unary, transitions, start)
        return FactoredPotentials(unary.astype(dtype), transitions.astype(dtype), start.astype(dtype))

    def check_inside(self, lengths) -> None:
        check_scores_inside("unary", self.unary, lengths)

    def masked(self, valid):
        return self._replace(unary=jnp.where(valid[:, None], self.unary, 0.0))

    def first_scores(self):
        return self.start + self.unary

    def time_inputs(self):
        return self.unary

    def block(self, inputs_t):
        return self.transitions + inputs_t[None, :]

    def column(self, inputs_t, label):
        return self.transitions[:, label] + inputs_t[label]

    def lift(self, semiring):
        if type(semiring) is semirings.LogSemiring:
            return log_steps(self.unary, self.transitions)
        transitions, transition_scale = semiring.convert_scaled(self.transitions, (-2, -1))
        unary, unary_scale = semiring.convert_scaled(self.unary, (-1,))

        def step(value, inputs, t, live):
            transitions, unary, unary_scale = inputs
            unary_t = jax.tree_util.tree_map(lambda x: jax.lax.dynamic_index_in_dim(x, t, x.ndim - 2, False), unary)
            return (
                semiring.times(semiring.vecmat(value, transitions), unary_t),
                kernel.at_position(unary_scale, t) + transition_scale,
                (),
            )

        return (transitions, unary, unary_scale), step

    def log_tangent(self, length, starts, forward, tangent):
        return log_tangent(self, length, starts, forward, tangent)

    def padded(self, num_labels: int):
        """The same chains over `num_labels >= L` labels, the extra ones
        forbidden (`-inf` unary and start scores): the same `log Z`, and zero
        derivatives for the extra labels (`kernel.Tuning.label_multiple`)."""
        extra = num_labels - self.num_labels
        if extra == 0:
            return self
        pad = lambda x, value: jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)], constant_values=value)
        transitions = jnp.pad(self.transitions, [(0, 0)] * (self.transitions.ndim - 2) + [(0, extra), (0, extra)])
        return FactoredPotentials(pad(self.unary, -jnp.inf), transitions, pad(self.start, -jnp.inf))

    def edge_scores(self):
        return self.transitions[..., None, :, :] + self.unary[..., :, None, :]

    def dense_scores(self):
        return materialize(self)

    def score_terms(self, labels, previous, starts):
        edge = jnp.where(starts, self.start[labels], self.transitions[previous, labels])
        return self.unary[jnp.arange(labels.shape[0]), labels] + edge

    def batched(self, batch_shape):
        transitions, start = self.transitions, self.start
        assert start is not None  # filled with zeros on entry
        transitions_axis = None if transitions.ndim == 2 else 0
        start_axis = None if start.ndim == 1 else 0
        if transitions_axis == 0:
            transitions = flatten_batch(
                jnp.broadcast_to(transitions, batch_shape + transitions.shape[-2:]), batch_shape, 2
            )
        if start_axis == 0:
            start = flatten_batch(jnp.broadcast_to(start, batch_shape + start.shape[-1:]), batch_shape, 1)
        flat = FactoredPotentials(flatten_batch(self.unary, batch_shape, 2), transitions, start)
        return flat, FactoredPotentials._make((0, transitions_axis, start_axis))  # in_axes: its leaves are axes

    def from_gradient(self, gradient):
        """Unary marginals, expected transition counts and start marginals, per chain."""
        return gradient

    def label_marginals(self, gradient):
        return gradient.unary

    def with_label_scores(self, extra):
        unary = jnp.asarray(self.unary)
        return self._replace(unary=unary + extra.astype(unary.dtype))

    def forbidding(self, transitions, start, end, lengths):
        start_scores = jnp.zeros((), self.unary.dtype) if self.start is None else self.start  # None: zeros
        return self._replace(
            unary=forbidden_ends(self.unary, end, lengths),
            transitions=jnp.where(transitions, self.transitions, -jnp.inf),
            start=jnp.where(start, start_scores, -jnp.inf),
        )

    def reversed(self, lengths):
        unary = self.unary
        reversed_unary = reversed_in_time(unary, lengths, lengths.ndim, 0)
        return FactoredPotentials(reversed_unary, jnp.swapaxes(self.transitions, -1, -2)), unary

    def named_scores(self):
        return tuple((name, scores) for name, scores in zip(self._fields, self) if scores is not None)


def materialize(potentials: FactoredPotentials) -> jax.Array:
    """Per-position potentials equal to a factored form.

    Args:
      potentials: a `FactoredPotentials` (`start` may be None: zeros).

    Returns:
      `[..., T, L, L]`: `transitions[i, j] + unary[t, j]`; row 0 at t = 0
        holds the start scores `start + unary[0]` (other rows there are unread).
    """
    unary, transitions = jnp.asarray(potentials.unary), jnp.asarray(potentials.transitions)
    start = potentials.start
    L = unary.shape[-1]
    start = jnp.zeros((L,), unary.dtype) if start is None else start
    edges = transitions[..., None, :, :] + unary[..., :, None, :]
    if unary.shape[-2] == 0:
        return edges
    first_row = jnp.broadcast_to(start[..., None, :] + unary[..., :1, :], edges.shape[:-3] + (1, L))
    return edges.at[..., :1, 0, :].set(first_row)


def forbidden_ends(unary, end, lengths):
    """`unary [..., T, L]` with the labels outside `end [L]` (bool) at `-inf`
    at each chain's last position `lengths - 1` (`lengths [...]`)."""
    last = jnp.arange(unary.shape[-2]) == jnp.asarray(lengths)[..., None] - 1
    return jnp.where(last[..., None] & ~end, -jnp.inf, unary)


# ---------------------------------------------------------------------------
# The exact log step and its derivative
# ---------------------------------------------------------------------------


def _vecmat(vector, matrix):
    """`[L] x [L, L] -> [L]` (mapped over the batch: `[B, L] x [L, L]`)."""
    if matrix.size * kernel.traced_batch_size() <= kernel.tuning().fused_matmul_max_size:
        return jnp.sum(vector[:, None] * matrix, 0)
    return matrix.T @ vector  # mapped: [L, L] x [L, B], the faster layout of XLA:CPU's dots


class LogSteps(NamedTuple):
    """`lift(Log)` inputs: continued `[T, L]`, each position's unary scores
    plus the column shifts `c` of the transitions; shifted: `[L, L]`, `A - c`;
    factors: `exp(A - c)`, each column peaking at 1."""

    continued: jax.Array
    shifted: jax.Array
    factors: jax.Array


def log_steps(unary, transitions):
    """The exact log step: `(inputs, step)` of `lift(Log)` (`unary [T, L]`,
    masked; `transitions [L, L]`, exponentiated once here)."""
    column_shift = finite_max(transitions, 0)  # c [L]
    shifted = transitions - column_shift
    inputs = LogSteps(unary + column_shift, shifted, jnp.exp(shifted))

    def step(log_alpha, inputs, t, live):
        sums = _vecmat(jnp.exp(log_alpha), inputs.factors)
        log_sums, recovered = kernel.checked_log_sums(
            sums, lambda: logsumexp(log_alpha[:, None] + inputs.shifted, 0), live
        )
        return log_sums + kernel.at_position(inputs.continued, t), jnp.zeros((), unary.dtype), (log_sums, recovered)

    return inputs, step


def log_tangent(potentials, length, starts, forward: kernel.Forward, tangent):
    """The closed-form JVP of `log Z` of one row of factored chains (the
    backward pass of smoothed node marginals, see the module docstring).

    potentials, tangent: `FactoredPotentials` (`unary [T, L]`, `transitions
    [L, L]`, `start [L]`); forward: the scan's with `log_steps`.
    """
    T, L = potentials.unary.shape
    chains = kernel.chain_spans(length, starts, T)
    log_alphas = forward.values
    log_sums, recovered = forward.aux
    steps = forward.inputs
    alphas = jnp.exp(log_alphas)
    in_scan = L * L * kernel.traced_batch_size() <= kernel.tuning().edge_sums_in_scan_max_size
    # exp(A - c) ratio as ratio^T exp(A - c)^T: mapped over a batch, the product
    # then reduces over a leading axis, vectorised along the labels
    transposed_factors = steps.factors.T

    def step(carry, inputs):
        following, edge_sums = carry  # the marginals at t + 1
        t, alpha_t, log_alpha_t, end_t, valid_t, continues_t = inputs
        log_sums_next, recovered_next, inverse_sums = kernel.next_step(log_sums, recovered, continues_t, t)
        ratio = following * inverse_sums

        def exact():
            conditional = kernel.exact_conditional(log_alpha_t, steps.shifted, log_sums_next)
            return jnp.sum(conditional * jnp.where(continues_t, following, 0.0)[None], 1)

        backward = jax.lax.cond(recovered_next, exact, lambda: alpha_t * _vecmat(ratio, transposed_factors))
        nodes_t = jnp.where(valid_t, kernel.normalized(jnp.where(end_t, alpha_t, backward)), 0.0)
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
        edges = kernel.contract(weighted, edge_sums)
    else:
        edges = jnp.sum((alphas @ weighted) * ratios)
    exact_edges = jax.lax.cond(
        jnp.any(recovered), lambda: _exact_edges(forward, chains, nodes), lambda: jnp.zeros((L, L), alphas.dtype)
    )
    firsts = jnp.sum(jnp.where(chains.starts[:, None], nodes, 0.0), 0)  # pyright: ignore[reportArgumentType]  # a scan output
    return (
        jnp.sum(nodes * kernel.masked_tangent(nodes, tangent.unary))  # pyright: ignore[reportArgumentType]  # a scan output
        + edges
        + kernel.contract(transitions_tangent, exact_edges)
        + jnp.sum(firsts * kernel.masked_tangent(firsts, tangent.start))
    )


def _exact_edges(forward: kernel.Forward, chains: kernel.ChainSpans, nodes):
    """Expected transition counts `[L, L]` of the recovered steps, in log
    space (run only when a step was recovered)."""
    log_sums, recovered = forward.aux
    taken = recovered[1:] & chains.valid[1:] & ~chains.starts[1:]

    def step(edges, inputs):
        log_alpha_previous, log_sums_t, nodes_t, taken_t = inputs
        conditional = kernel.exact_conditional(log_alpha_previous, forward.inputs.shifted, log_sums_t)
        return edges + conditional * jnp.where(taken_t, nodes_t, 0.0)[None], None

    L = nodes.shape[-1]
    edges, _ = jax.lax.scan(step, jnp.zeros((L, L), nodes.dtype), (forward.values[:-1], log_sums[1:], nodes[1:], taken))
    return edges
