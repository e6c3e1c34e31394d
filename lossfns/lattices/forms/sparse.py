"""The sparse form (Lavergne, Cappe & Yvon 2010, section 4.1): `psi_t(i, j) =
A(i, j) + unary[t, j] + pair_t(i, j)` with `pair_t` mostly zero, held as
`pair_weights [..., T, K]` over one support `[K]` or one per position. Its exact
log step is one product with `exp(A)` shared by every position plus a sparse part
over the listed pairs, `O(K)` per position, redone in log space where a column sum
loses precision (`log_steps`); `[T, L, L]` is never built. Its derivative is the
closed-form backward pass of `log_tangent`. Design notes: docs/internals.md.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ... import semirings
from ...validation import as_float_array, check_finite_or_neg_inf, concrete
from .. import kernel
from . import check_scores_inside, dense, flatten_batch, reversed_in_time
from .factored import FactoredPotentials, forbidden_ends


class SparsePotentials(NamedTuple):
    """Unary scores, a shared transition matrix and sparse per-position
    label-pair weights (see the module docstring).

    unary: `[..., T, L]`; pair_weights: `[..., T, K]` (log space, 0 = no
    effect, -inf = forbidden pair); pair_previous, pair_next: `[K]` (one
    support) or `[..., T, K]` (a support per position) int label indices of
    each non-zero pair; start: `[L]`, `[..., L]` or `None`
    (zeros); transitions: `[L, L]` shared by the batch, or `None` (zeros).
    """

    unary: jax.Array
    pair_weights: jax.Array
    pair_previous: jax.Array
    pair_next: jax.Array
    start: jax.Array | None = None
    transitions: jax.Array | None = None

    # Sizes and dtype come from `unary [..., T, L]`, as for the factored form.
    num_steps = FactoredPotentials.num_steps
    num_labels = FactoredPotentials.num_labels
    dtype = FactoredPotentials.dtype
    batch_shape = FactoredPotentials.batch_shape

    def checked(self):
        unary = as_float_array("unary", self.unary, 2, "[..., T, L]")
        batch_shape, (T, L) = tuple(unary.shape[:-2]), unary.shape[-2:]
        if L < 1:
            raise ValueError("unary must have at least one label (L >= 1)")
        pair_weights = as_float_array("pair_weights", self.pair_weights, 2, "[..., T, K]")
        if pair_weights.shape[:-1] != unary.shape[:-1]:
            raise ValueError(
                f"pair_weights must have shape {batch_shape + (T,)} + [K] (batch and T from unary "
                f"{unary.shape}), got shape {pair_weights.shape}"
            )
        previous = _label_indices("pair_previous", self.pair_previous, pair_weights.shape, L)
        following = _label_indices("pair_next", self.pair_next, pair_weights.shape, L)
        if previous.shape != following.shape:
            raise ValueError(
                f"pair_previous and pair_next must have the same shape, got {previous.shape} and {following.shape}"
            )
        _check_distinct_pairs(previous, following, pair_weights, L)
        start = jnp.zeros((L,), unary.dtype) if self.start is None else self.start
        start = as_float_array("start", start, 1, "[L] or [..., L]")
        if start.shape[-1] != L:
            raise ValueError(f"start must have shape [..., {L}], got shape {start.shape}")
        try:
            jnp.broadcast_shapes(start.shape[:-1], batch_shape)
        except ValueError:
            raise ValueError(
                f"start batch shape {start.shape[:-1]} does not broadcast to the batch shape {batch_shape} of unary"
            ) from None
        transitions = self.transitions
        if transitions is not None:
            transitions = as_float_array("transitions", transitions, 2, "[L, L] or [..., L, L]")
            if transitions.shape[-2:] != (L, L):
                raise ValueError(
                    f"transitions must have shape [..., {L}, {L}] (L = {L} labels, from unary), "
                    f"got shape {transitions.shape}"
                )
            try:
                jnp.broadcast_shapes(transitions.shape[:-2], batch_shape)
            except ValueError:
                raise ValueError(
                    f"transitions batch shape {transitions.shape[:-2]} does not broadcast to the batch "
                    f"shape {batch_shape} of unary"
                ) from None
        for name, array in (("pair_weights", pair_weights), ("start", start), ("transitions", transitions)):
            if array is not None:
                check_finite_or_neg_inf(name, array)
        dtype = jnp.result_type(*(x for x in (unary, pair_weights, start, transitions) if x is not None))
        start = jnp.broadcast_to(start.astype(dtype), batch_shape + (L,))
        return SparsePotentials(
            unary.astype(dtype),
            pair_weights.astype(dtype),
            previous,
            following,
            start,
            None if transitions is None else transitions.astype(dtype),
        )

    def check_inside(self, lengths) -> None:
        check_scores_inside("unary", self.unary, lengths)

    def masked(self, valid):
        return self._replace(
            unary=jnp.where(valid[:, None], self.unary, 0.0),
            pair_weights=jnp.where(valid[:, None], self.pair_weights, 0.0),
        )

    @property
    def per_position(self) -> bool:
        """Whether each position has its own support (`[..., T, K]` indices)."""
        return jnp.ndim(self.pair_previous) > 1

    def _pairs(self, weights, previous=None, following=None):
        """The pair scores `[..., L, L]` of per-pair weights `[..., K]` on the
        support `previous, following` (`[K]` or `[..., K]`; default this form's)."""
        L = self.num_labels
        previous = self.pair_previous if previous is None else previous
        following = self.pair_next if following is None else following
        return _scatter_last(weights, previous * L + following, L * L).reshape(weights.shape[:-1] + (L, L))

    def first_scores(self):
        from_start = jnp.where(self.pair_previous == 0, self.pair_weights, 0.0)
        return self.start[..., None, :] + self.unary + _scatter_last(from_start, self.pair_next, self.num_labels)

    def time_inputs(self):
        if self.per_position:
            return self.unary, self.pair_weights, self.pair_previous, self.pair_next
        return self.unary, self.pair_weights

    def _support_at(self, inputs_t):
        """`(unary_t [L], weights_t [K], previous_t [K], following_t [K])` of one step's inputs."""
        if self.per_position:
            return inputs_t
        unary_t, weights_t = inputs_t
        return unary_t, weights_t, self.pair_previous, self.pair_next

    def _transitions(self):
        """The shared transition scores (zeros when there are none)."""
        if self.transitions is None:
            return jnp.zeros((self.num_labels, self.num_labels), self.dtype)
        return self.transitions

    def block(self, inputs_t):
        unary_t, weights_t, previous_t, following_t = self._support_at(inputs_t)
        return self._transitions() + unary_t[None, :] + self._pairs(weights_t, previous_t, following_t)

    def column(self, inputs_t, label):
        unary_t, weights_t, previous_t, following_t = self._support_at(inputs_t)
        pairs = (
            jnp.zeros((self.num_labels,), weights_t.dtype)
            .at[previous_t]
            .add(jnp.where(following_t == label, weights_t, 0.0))
        )
        return self._transitions()[:, label] + unary_t[label] + pairs

    def edge_scores(self):
        return self._transitions()[..., None, :, :] + self.unary[..., :, None, :] + self._pairs(self.pair_weights)

    def lift(self, semiring):
        if type(semiring) is semirings.LogSemiring:
            return log_steps(self)
        return dense.semiring_steps(semiring, self.edge_scores())

    def log_tangent(self, length, starts, forward, tangent):
        return log_tangent(self, length, starts, forward, tangent)

    def padded(self, num_labels: int):
        """Itself: the sparse step's work is in its listed pairs, not its labels."""
        return self

    def dense_scores(self):
        """`[..., T, L, L]` of a checked form: the edge scores, and in row 0 at
        `t = 0` the first scores `start[j] + unary[0, j] + pair_0(0, j)`."""
        edges = self.edge_scores()
        if self.num_steps == 0:
            return edges
        return edges.at[..., 0, 0, :].set(self.first_scores()[..., 0, :])

    def score_terms(self, labels, previous, starts):
        positions = jnp.arange(labels.shape[0])
        # [K] or [T, K] against [T, 1]: [T, K] either way
        matches = (self.pair_previous == previous[:, None]) & (self.pair_next == labels[:, None])
        pairs = jnp.sum(jnp.where(matches, self.pair_weights, 0.0), -1)
        edge = jnp.where(starts, self.start[labels], self._transitions()[previous, labels])
        return self.unary[positions, labels] + edge + pairs

    def batched(self, batch_shape):
        flat = lambda x, core: flatten_batch(x, batch_shape, core)
        transitions = self.transitions
        shared = transitions is None or transitions.ndim == 2
        if transitions is not None and not shared:
            transitions = flat(jnp.broadcast_to(transitions, batch_shape + transitions.shape[-2:]), 2)
        previous, following, support_axis = self.pair_previous, self.pair_next, None
        if self.per_position:
            previous, following, support_axis = flat(previous, 2), flat(following, 2), 0
        return (
            SparsePotentials(
                flat(self.unary, 2), flat(self.pair_weights, 2), previous, following, flat(self.start, 1), transitions
            ),
            SparsePotentials._make((0, 0, support_axis, support_axis, 0, None if shared else 0)),
        )  # in_axes: its leaves are axes

    def from_gradient(self, gradient):
        """The marginals, per chain, with the support as given (not repeated per chain)."""
        return gradient._replace(pair_previous=self.pair_previous, pair_next=self.pair_next)

    def label_marginals(self, gradient):
        return gradient.unary

    def with_label_scores(self, extra):
        unary = jnp.asarray(self.unary)
        return self._replace(unary=unary + extra.astype(unary.dtype))

    def forbidding(self, transitions, start, end, lengths):
        # the forbidden moves join as a shared transition matrix
        dtype = self.unary.dtype
        shared = jnp.zeros((), dtype) if self.transitions is None else self.transitions
        start_scores = jnp.zeros((), dtype) if self.start is None else self.start  # None: zeros
        return self._replace(
            unary=forbidden_ends(self.unary, end, lengths),
            transitions=jnp.where(transitions, shared, -jnp.inf),
            start=jnp.where(start, start_scores, -jnp.inf),
        )

    def reversed(self, lengths):
        batch_ndim = lengths.ndim
        transitions = self.transitions
        previous, following = self.pair_previous, self.pair_next
        if self.per_position:  # each edge's support travels with its weights
            previous, following = (reversed_in_time(x, lengths, batch_ndim, 1) for x in (previous, following))
        reversed_chain = SparsePotentials(
            reversed_in_time(self.unary, lengths, batch_ndim, 0),
            reversed_in_time(self.pair_weights, lengths, batch_ndim, 1),
            following,
            previous,
            None,
            None if transitions is None else jnp.swapaxes(transitions, -1, -2),
        )
        return reversed_chain, self.unary

    def named_scores(self):
        fields = ("unary", "pair_weights", "start", "transitions")
        return tuple((name, getattr(self, name)) for name in fields if getattr(self, name) is not None)


class LogSteps(NamedTuple):
    """`lift(Log)` inputs of the sparse form (one chain).

    unary: `[T, L]` (masked) plus the column shifts `c` of the transitions;
    pair_weights: `[T, K]`; factors: `[T, K]`, `exp(w - s)`; shift: `[T]`,
    `s`, each step's largest pair weight (at least 0); previous, following:
    `[K]` or `[T, K]`, the support; pair_dense: `exp(A - c)` at the support,
    `[K]` or `[T, K]`; shifted: `[L, L]`, `A - c`; dense_factors: `exp(A - c)`.
    """

    unary: jax.Array
    pair_weights: jax.Array
    factors: jax.Array
    shift: jax.Array
    previous: jax.Array
    following: jax.Array
    pair_dense: jax.Array
    shifted: jax.Array
    dense_factors: jax.Array

    def support_at(self, t):
        """`(previous [K], following [K], pair_dense [K])` of step `t`."""
        fields = (self.previous, self.following, self.pair_dense)
        if self.previous.ndim == 1:
            return fields
        return tuple(kernel.at_position(x, t) for x in fields)

    def scores_at(self, t):
        """`[L, L]`: step `t`'s log edge scores less `c` and `s`, those the
        column sums `log_sums` of the step add up (`kernel.exact_conditional`)."""
        previous, following, _ = self.support_at(t)
        L = self.shifted.shape[-1]
        pairs = _scatter_last(kernel.at_position(self.pair_weights, t), previous * L + following, L * L)
        return self.shifted + pairs.reshape(L, L) - kernel.at_position(self.shift, t)


def log_steps(potentials: SparsePotentials):
    """`(inputs, step)` of the log semiring: the checked sparse product above
    on log-space forward scores (see the module docstring). The step's
    auxiliary output is `(log column sums [L], recovered)`, what
    `log_tangent` reads."""
    unary, pair_weights, previous, following = (
        potentials.unary,
        potentials.pair_weights,
        potentials.pair_previous,
        potentials.pair_next,
    )
    T, L = unary.shape
    rank_one = potentials.transitions is None  # Lavergne's case: the dense part is sum(alpha)
    transitions = potentials._transitions()
    column_shift = semirings.finite_max(transitions, 0)  # c [L]
    shifted = transitions - column_shift
    dense_factors = jnp.exp(shifted)  # exp(A - c), columns peak at 1
    # Shifts keep exp() in range: exp(w - s) = exp(-s) (1 + M)
    # with s >= 0 the largest pair weight of the step, so nothing overflows.
    if pair_weights.shape[-1]:
        pair_shift = jnp.maximum(semirings.finite_max(pair_weights, -1), 0.0)
    else:
        pair_shift = jnp.zeros((T,), unary.dtype)
    inputs = LogSteps(
        unary + column_shift,
        pair_weights,
        jnp.exp(pair_weights - pair_shift[:, None]),
        pair_shift,
        previous,
        following,
        dense_factors[previous, following],
        shifted,
        dense_factors,
    )
    tau = kernel.recovery_threshold(unary.dtype, L)
    # Below this fraction of the sum of its terms' magnitudes, a column sum has
    # lost more than about 1e-5 of relative precision (a few roundings of eps).
    cancellation = min(1.0, 4 * float(jnp.finfo(unary.dtype).eps) / 1e-5)

    def step(log_alpha, inputs, t, live):
        factors_t, shift_t = kernel.at_position(inputs.factors, t), kernel.at_position(inputs.shift, t)
        previous_t, following_t, pair_dense_t = inputs.support_at(t)
        alpha = jnp.exp(log_alpha)
        dense_t = jnp.exp(-shift_t)
        dense = dense_t * (jnp.sum(alpha) if rank_one else alpha @ inputs.dense_factors)
        gathered = alpha[previous_t] if rank_one else alpha[previous_t] * pair_dense_t
        terms = jnp.stack([gathered * (factors_t - dense_t), gathered * (factors_t + dense_t)])
        sums, magnitudes = dense + _sum_by_label(terms, following_t, L)
        # One decision for the whole batch (`kernel.any_in_batch`).
        recover = kernel.any_in_batch(live & jnp.any(sums < jnp.maximum(tau, cancellation * magnitudes)))

        def exact():
            return semirings.logsumexp(log_alpha[:, None] + inputs.scores_at(t), 0)

        log_sums = jax.lax.cond(recover, exact, lambda: kernel.safe_log(jnp.maximum(sums, 0.0)))
        return (
            log_sums + shift_t + kernel.at_position(inputs.unary, t),
            jnp.zeros((), unary.dtype),
            (log_sums, recover),
        )

    return inputs, step


def log_tangent(potentials: SparsePotentials, length, starts, forward: kernel.Forward, tangent):
    """The closed-form JVP of `log Z` of one row of sparse chains.

    Node marginals by the backward pass of `factored.log_tangent` with the
    sparse product transposed, then, vectorised over the positions, each
    listed pair's marginal `alpha_{t-1}(i) exp(A(i, j) - c(j)) exp(w - s_t)
    beta_t(j) / s_t(j)` (its derivative), and the transitions' expected
    counts as the dense outer products plus the pairs' corrections (a
    gather of the tangent, never a scatter). Recovered steps (rare) are
    recomputed in log space.

    Args:
      potentials: `SparsePotentials` of one chain (`unary [T, L]`).
      length: `[]` int, the positions used.
      starts: `[T]` bool, the chain starts of a row (`chain.row_forward`), or None.
      forward: the scan's `kernel.Forward`, with `log_steps`.
      tangent: `SparsePotentials` of the structure of `potentials`, the direction.

    Returns:
      `[]`, the derivative of `log Z` in the direction `tangent`.
    """
    T, L = potentials.unary.shape
    rank_one = potentials.transitions is None
    chains = kernel.chain_spans(length, starts, T)
    log_alphas = forward.values
    log_sums, recovered = forward.aux
    steps: LogSteps = forward.inputs
    alphas = jnp.exp(log_alphas)
    dense_after = jnp.exp(-steps.shift)  # exp(-s_t) [T]

    def step(following, inputs):
        t, alpha_t, log_alpha_t, end_t, valid_t, continues_t = inputs
        log_sums_next, recovered_next, inverse_sums = kernel.next_step(log_sums, recovered, continues_t, t)
        ratio = following * inverse_sums
        after = jnp.minimum(t + 1, T - 1)

        def exact():
            conditional = kernel.exact_conditional(log_alpha_t, steps.scores_at(after), log_sums_next)
            return jnp.sum(conditional * jnp.where(continues_t, following, 0.0)[None], 1)

        def ordinary():
            # sum_j G(i, j) ratio(j), G the step's factors (the product of the step, transposed)
            previous, next_labels, pair_dense = steps.support_at(after)
            dense = kernel.at_position(dense_after, after)
            spread = jnp.sum(ratio) if rank_one else steps.dense_factors @ ratio
            factors = kernel.at_position(steps.factors, after) - dense
            sparse = (1.0 if rank_one else pair_dense) * factors * ratio[next_labels]
            return alpha_t * (dense * spread + _sum_by_label(sparse, previous, L))

        backward = jax.lax.cond(recovered_next, exact, ordinary)
        nodes_t = jnp.where(valid_t, kernel.normalized(jnp.where(end_t, alpha_t, backward)), 0.0)
        return nodes_t, (nodes_t, ratio)

    inputs = (jnp.arange(T), alphas, log_alphas, chains.ends, chains.valid, chains.continues)
    _, (nodes, ratios) = jax.lax.scan(step, jnp.zeros((L,), alphas.dtype), inputs, reverse=True)

    # Each listed pair's marginal at t >= 1 (ratios[t - 1] is position t's;
    # 0 where t starts a chain, lies past the length or was recovered).
    previous = jnp.broadcast_to(steps.previous, steps.pair_weights.shape)
    following = jnp.broadcast_to(steps.following, steps.pair_weights.shape)
    pair_dense = 1.0 if rank_one else jnp.broadcast_to(steps.pair_dense, steps.pair_weights.shape)[1:]
    from_alpha = jnp.take_along_axis(alphas[:-1], previous[1:], 1)  # [T - 1, K]
    to_ratio = jnp.take_along_axis(ratios[:-1], following[1:], 1)
    pairs = from_alpha * pair_dense * steps.factors[1:] * to_ratio
    # Recovered steps: the same marginals in log space.
    taken = recovered[1:] & chains.valid[1:] & ~chains.starts[1:]
    # (conditions on `recovered` alone, unbatched: a batched one would run both branches)
    any_recovered = jnp.any(recovered[1:])
    pairs = jax.lax.cond(
        any_recovered,
        lambda: jnp.where(taken[:, None], _exact_pair_marginals(forward, nodes, previous, following), pairs),
        lambda: pairs,
    )
    # At a chain's start the pairs from label 0 are part of its first scores.
    heads = jnp.where(chains.starts[:, None] & (previous == 0), jnp.take_along_axis(nodes, following, 1), 0.0)
    pairs = jnp.concatenate([heads[:1], pairs + heads[1:]])
    firsts = jnp.where(chains.starts[:, None], nodes, 0.0)
    out = (
        jnp.sum(nodes * kernel.masked_tangent(nodes, tangent.unary))
        + jnp.sum(pairs * kernel.masked_tangent(pairs, tangent.pair_weights))
        + jnp.sum(firsts.sum(0) * kernel.masked_tangent(firsts.sum(0), tangent.start))
    )
    if rank_one:
        return out
    # Transitions: the dense part of every ordinary step, alpha_{t-1} (x)
    # exp(-s_t) ratio_t * exp(A - c), as one [L, T] x [T, L] product; each
    # listed pair's part beyond it, (exp(w - s) - exp(-s)) of the same; the
    # recovered steps' exact counts.
    allowed = steps.shifted > -jnp.inf  # a forbidden transition's tangent may be infinite
    transitions_tangent = jnp.where(allowed, tangent.transitions, 0.0)
    outer = alphas[:-1].T @ (dense_after[1:, None] * ratios[:-1])
    corrections = from_alpha * pair_dense * (steps.factors[1:] - dense_after[1:, None]) * to_ratio
    exact_edges = jax.lax.cond(
        any_recovered, lambda: _exact_edges(forward, chains, nodes, taken), lambda: jnp.zeros((L, L), alphas.dtype)
    )
    return (
        out
        + kernel.contract(steps.dense_factors * transitions_tangent, outer)
        + jnp.sum(corrections * transitions_tangent[previous[1:], following[1:]])
        + kernel.contract(transitions_tangent, exact_edges)
    )


def _exact_pair_marginals(forward: kernel.Forward, nodes, previous, following):
    """Every listed pair's marginal at `t >= 1` in log space, `[T - 1, K]`:
    `exp(la_{t-1}(i) + A(i, j) - c(j) + w - s_t - log s_t(j)) nodes_t(j)`."""
    steps: LogSteps = forward.inputs
    log_sums = jnp.take_along_axis(forward.aux[0][1:], following[1:], 1)  # at each pair's next label
    finite = jnp.isfinite(log_sums)
    exponent = (
        jnp.take_along_axis(forward.values[:-1], previous[1:], 1)
        + steps.shifted[previous[1:], following[1:]]
        + steps.pair_weights[1:]
        - steps.shift[1:, None]
        - jnp.where(finite, log_sums, 0.0)
    )
    return jnp.where(finite, jnp.exp(exponent), 0.0) * jnp.take_along_axis(nodes[1:], following[1:], 1)


def _exact_edges(forward: kernel.Forward, chains, nodes, taken):
    """Expected transition counts `[L, L]` of the recovered steps `taken
    [T - 1]` (of positions 1..T-1), in log space."""
    steps: LogSteps = forward.inputs
    log_sums = forward.aux[0]

    def step(edges, inputs):
        t, log_alpha_previous, log_sums_t, nodes_t, taken_t = inputs
        conditional = kernel.exact_conditional(log_alpha_previous, steps.scores_at(t), log_sums_t)
        return edges + conditional * jnp.where(taken_t, nodes_t, 0.0)[None], None

    L = nodes.shape[-1]
    T = nodes.shape[0]
    xs = (jnp.arange(1, T), forward.values[:-1], log_sums[1:], nodes[1:], taken)
    edges, _ = jax.lax.scan(step, jnp.zeros((L, L), nodes.dtype), xs)
    return edges


def _sum_by_label(values, labels, num_labels: int):
    """`out[..., j] = sum of values[..., k] over labels[k] == j`, `[..., L]`, for
    `values [..., K]` and `labels [K]`: a product with the one-hot `[K, L]`
    when `K <= L` (XLA:CPU's scatter costs several times more per element),
    else a segment sum."""
    if labels.shape[-1] <= num_labels:
        one_hot = (labels[:, None] == jnp.arange(num_labels)).astype(values.dtype)
        return values @ one_hot
    return (
        jax.ops.segment_sum(jnp.moveaxis(values, -1, 0), labels, num_labels).T
        if values.ndim > 1
        else (jax.ops.segment_sum(values, labels, num_labels))
    )


def _scatter_last(values, indices, size: int):
    """`out[..., i] = sum of values[..., k] over indices[..., k] == i`, `[..., size]`,
    for `values [..., K]` and `indices [K]` or `[..., K]` (a per-row support)."""
    out = jnp.zeros(values.shape[:-1] + (size,), values.dtype)
    if jnp.ndim(indices) == 1:
        return out.at[..., indices].add(values)
    rows = jnp.indices(values.shape[:-1], sparse=True)
    return out.at[(*(r[..., None] for r in rows), indices)].add(values)


def _label_indices(name: str, indices, weights_shape: tuple, num_labels: int) -> jax.Array:
    """Pair support indices `[K]` or `[..., T, K]` (the shape of
    `pair_weights`) of ints in `[0, num_labels)`."""
    indices = jnp.asarray(indices)
    K = weights_shape[-1]
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(
            f"{name} must be an integer array of shape [{K}] or {list(weights_shape)} (from pair_weights), "
            f"got dtype {indices.dtype}"
        )
    if indices.shape not in ((K,), tuple(weights_shape)):
        raise ValueError(
            f"{name} must have shape [{K}] (one support) or {list(weights_shape)} (a support per position, "
            f"the shape of pair_weights [..., T, K]), got shape {indices.shape}"
        )
    value = concrete(indices)
    if value is not None and value.size and (value.min() < 0 or value.max() >= num_labels):
        raise ValueError(
            f"{name} must lie in [0, {num_labels}) (L labels, from unary), "
            f"got {int(value[(value < 0) | (value >= num_labels)][0])}"
        )
    return indices.astype(jnp.int32)


def _check_distinct_pairs(previous, following, pair_weights, num_labels: int) -> None:
    """A label pair listed twice at one position must have weight 0 in all but
    one listing (see the module docstring); checked when the inputs are concrete."""
    previous, following, weights = (concrete(x) for x in (previous, following, pair_weights))
    if previous is None or following is None or weights is None or weights.size == 0:
        return
    keys = np.broadcast_to(previous.astype(np.int64) * num_labels + following, weights.shape)
    # Zero weights (padding) get distinct negative keys: they never collide.
    keys = np.where(weights != 0, keys, -1 - np.arange(weights.shape[-1]))
    ordered = np.sort(keys, axis=-1)
    repeated = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)
    if repeated.any():
        key = int(ordered[..., 1:][repeated][0])
        raise ValueError(
            f"pair_previous, pair_next list the label pair {divmod(key, num_labels)} twice at one position "
            "with non-zero pair_weights; list each pair once (other listings may only have weight 0)"
        )
