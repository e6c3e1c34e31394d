"""Sparse forward-backward for chains with L1-sparse label-pair weights
(Lavergne, Cappe & Yvon 2010, section 4.1), as a potential form of `chain`.

A chain whose edge scores are `psi_t(i, j) = A(i, j) + unary[t, j] +
pair_t(i, j)`, where `A` is a transition matrix shared by all positions and
the label-pair weights `pair_t` (bigram features that also test the
observation at `t`) are mostly zero, has transition factors

    exp(psi_t(i, j)) = exp(unary[t, j]) * exp(A(i, j)) * (1 + M_t(i, j)),
    M_t(i, j) = exp(pair_t(i, j)) - 1,

and `M_t` is zero wherever the pair weight is. The forward recursion splits
into a dense part shared by every position (one product with `exp(A)`; a
rank-one sum of the forward vector when `A = 0`, Lavergne's case) and a
sparse part over the non-zeros of `M_t`:

    alpha_t(j) = exp(unary[t, j]) * (sum_i alpha_{t-1}(i) exp(A(i, j))
                                     + sum_{i: M_t(i, j) != 0} alpha_{t-1}(i) exp(A(i, j)) M_t(i, j)),

which costs `O(K)` per position on top of the shared product instead of
building and exponentiating `[T, L, L]` scores; autodiff of the recursion
(the backward pass) costs the same.

`SparsePotentials` is a form of `lattices.forms`: every `chain` function
takes it (`chain.log_partition`, `marginals`, `row_log_partition`,
`viterbi`, `kbest`, `sample`, `score`, the losses). For `log Z` (the log
semiring) its step is the sparse product above; for the other semirings it
builds one `[L, L]` block per step.

Representation: the non-zero label pairs share one support for the whole
batch, `pair_previous [K]` and `pair_next [K]` (the union of the pairs any
label-pair feature may fire on; with L1 training, the pairs whose weights are
non-zero), and `pair_weights [..., T, K]` holds their per-position log-space
weights (0 where a pair's weight is zero at that position). The same
conventions as `chain` hold: at a chain's first position the previous label
is the start state (label index 0 in the pair support; `A` does not apply
there), `lengths` mask positions at or past each length, and `to_dense`
gives the `[..., T, L, L]` potentials that `chain` accepts, which is what
the tests compare with.

Accuracy: exact to rounding for every input the dense chain is exact for.
The forward scores are carried in log space, as in `kernel`; a pair weight
`w < 0` enters as `1 + M` with `M = exp(w) - 1` close to -1, so the
contribution of label `j` is a difference: each step checks its column sums
against the magnitudes of their terms (and against underflow) and redoes a
step that lost precision in log space over the dense `[L, L]` scores, so
strongly negative and forbidden (`-inf`) pair weights cost time, not
accuracy.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import semirings
from ..validation import as_float_array, as_lengths, check_finite_or_neg_inf, concrete
from . import forms, kernel


class SparsePotentials(NamedTuple):
    """Unary scores, a shared transition matrix and sparse per-position
    label-pair weights (see the module docstring).

    unary: `[..., T, L]`; pair_weights: `[..., T, K]` (log space, 0 = no
    effect, -inf = forbidden pair); pair_previous, pair_next: `[K]` int label
    indices of each non-zero pair; start: `[L]`, `[..., L]` or `None`
    (zeros); transitions: `[L, L]` shared by the batch, or `None` (zeros).
    """

    unary: jax.Array
    pair_weights: jax.Array
    pair_previous: jax.Array
    pair_next: jax.Array
    start: jax.Array | None = None
    transitions: jax.Array | None = None

    # -- the form protocol of `lattices.forms` (unbatched) ------------------
    # Sizes and dtype come from `unary [..., T, L]`, as for the factored form.
    num_steps = forms.FactoredPotentials.num_steps
    num_labels = forms.FactoredPotentials.num_labels
    dtype = forms.FactoredPotentials.dtype

    def masked(self, valid):
        return self._replace(
            unary=jnp.where(valid[:, None], self.unary, 0.0),
            pair_weights=jnp.where(valid[:, None], self.pair_weights, 0.0),
        )

    def _pairs(self, weights):
        """The pair scores `[..., L, L]` of per-pair weights `[..., K]`."""
        L = self.num_labels
        return (
            jnp.zeros(weights.shape[:-1] + (L, L), weights.dtype)
            .at[..., self.pair_previous, self.pair_next]
            .add(weights)
        )

    def first_scores(self):
        from_start = jnp.where(self.pair_previous == 0, self.pair_weights, 0.0)
        pairs = jnp.zeros(self.unary.shape, self.dtype).at[..., self.pair_next].add(from_start)
        return self.start[..., None, :] + self.unary + pairs

    def time_inputs(self):
        return self.unary, self.pair_weights

    def _transitions(self):
        """The shared transition scores (zeros when there are none)."""
        if self.transitions is None:
            return jnp.zeros((self.num_labels, self.num_labels), self.dtype)
        return self.transitions

    def block(self, inputs_t):
        unary_t, weights_t = inputs_t
        return self._transitions() + unary_t[None, :] + self._pairs(weights_t)

    def column(self, inputs_t, label):
        unary_t, weights_t = inputs_t
        pairs = (
            jnp.zeros((self.num_labels,), weights_t.dtype)
            .at[self.pair_previous]
            .add(jnp.where(self.pair_next == label, weights_t, 0.0))
        )
        return self._transitions()[:, label] + unary_t[label] + pairs

    def edge_scores(self):
        return self._transitions()[..., None, :, :] + self.unary[..., :, None, :] + self._pairs(self.pair_weights)

    def lift(self, semiring):
        if type(semiring) is semirings.LogSemiring:
            return _sparse_log_step(self)
        return forms.generic_lift(semiring, self.edge_scores())

    def score_terms(self, labels, previous, starts):
        positions = jnp.arange(labels.shape[0])
        matches = (self.pair_previous[None, :] == previous[:, None]) & (self.pair_next[None, :] == labels[:, None])
        pairs = jnp.sum(jnp.where(matches, self.pair_weights, 0.0), -1)
        edge = jnp.where(starts, self.start[labels], self._transitions()[previous, labels])
        return self.unary[positions, labels] + edge + pairs

    def batched(self, batch_shape):
        flat = lambda x, core: x.reshape((math.prod(batch_shape),) + x.shape[x.ndim - core :])
        transitions = self.transitions
        shared = transitions is None or transitions.ndim == 2
        if transitions is not None and not shared:
            transitions = flat(jnp.broadcast_to(transitions, batch_shape + transitions.shape[-2:]), 2)
        return (
            SparsePotentials(
                flat(self.unary, 2),
                flat(self.pair_weights, 2),
                self.pair_previous,
                self.pair_next,
                flat(self.start, 1),
                transitions,
            ),
            SparsePotentials._make((0, 0, None, None, 0, None if shared else 0)),
        )  # in_axes: its leaves are axes

    def unshared(self, batch_shape):
        """Per-example transitions, so that their derivatives are per-example
        expected counts (the start is per example already)."""
        if self.transitions is None:
            return self
        L = self.num_labels
        return self._replace(transitions=jnp.broadcast_to(self.transitions, tuple(batch_shape) + (L, L)))

    def as_argument(self):
        return self

    def from_gradient(self, gradient):
        """Marginals from a gradient taken with `allow_int`: the support as given."""
        return gradient._replace(pair_previous=self.pair_previous, pair_next=self.pair_next)


def _sparse_log_step(potentials: SparsePotentials):
    """`(inputs, step)` of the log semiring: the checked sparse product above
    on log-space forward scores (see the module docstring)."""
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
    pair_dense = dense_factors[previous, following]  # [K]
    # Shifts keep exp() in range (NUMERICS.md 5): exp(w - s) = exp(-s) (1 + M)
    # with s >= 0 the largest pair weight of the step, so nothing overflows.
    if pair_weights.shape[-1]:
        pair_shift = jnp.maximum(semirings.finite_max(pair_weights, -1), 0.0)
    else:
        pair_shift = jnp.zeros((T,), unary.dtype)
    pair_factors = jnp.exp(pair_weights - pair_shift[:, None])
    tau = kernel.recovery_threshold(unary.dtype, L)
    # Below this fraction of the sum of its terms' magnitudes, a column sum has
    # lost more than about 1e-5 of relative precision (a few roundings of eps).
    cancellation = min(1.0, 4 * float(jnp.finfo(unary.dtype).eps) / 1e-5)

    def step(log_alpha, inputs, t, live):
        unary_t, weights_t, factors_t, shift_t = (kernel.at_position(x, t) for x in inputs)
        alpha = jnp.exp(log_alpha)
        dense_t = jnp.exp(-shift_t)
        dense = dense_t * (jnp.sum(alpha) if rank_one else alpha @ dense_factors)
        gathered = alpha[previous] if rank_one else alpha[previous] * pair_dense
        sums = dense + jax.ops.segment_sum(gathered * (factors_t - dense_t), following, L)
        magnitudes = dense + jax.ops.segment_sum(gathered * (factors_t + dense_t), following, L)
        # One decision for the whole batch (`kernel.any_in_batch`).
        recover = kernel.any_in_batch(live & jnp.any(sums < jnp.maximum(tau, cancellation * magnitudes)))

        def exact():
            scores = shifted + potentials._pairs(weights_t)
            return semirings.logsumexp(log_alpha[:, None] + scores, 0) - shift_t

        log_sums = jax.lax.cond(recover, exact, lambda: kernel.safe_log(jnp.maximum(sums, 0.0)))
        return log_sums + shift_t + column_shift + unary_t, jnp.zeros((), unary.dtype), ()

    return (unary, pair_weights, pair_factors, pair_shift), step


def _label_indices(name: str, indices, size: int, num_labels: int) -> jax.Array:
    """Pair support indices `[K]` of ints in `[0, num_labels)`."""
    indices = jnp.asarray(indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(
            f"{name} must be an integer array of shape [{size}] (K, from pair_weights), got dtype {indices.dtype}"
        )
    if indices.shape != (size,):
        raise ValueError(
            f"{name} must have shape [{size}] (K, from pair_weights [..., T, K]), got shape {indices.shape}"
        )
    value = concrete(indices)
    if value is not None and value.size and (value.min() < 0 or value.max() >= num_labels):
        raise ValueError(
            f"{name} must lie in [0, {num_labels}) (L labels, from unary), "
            f"got {int(value[(value < 0) | (value >= num_labels)][0])}"
        )
    return indices.astype(jnp.int32)


def _prepare(potentials: SparsePotentials, lengths):
    """Validate; return `(potentials, lengths, batch_shape, T, L)`."""
    if not isinstance(potentials, SparsePotentials):
        raise TypeError(f"potentials must be a SparsePotentials, got {type(potentials).__name__}")
    unary = as_float_array("unary", potentials.unary, 2, "[..., T, L]")
    batch_shape, (T, L) = tuple(unary.shape[:-2]), unary.shape[-2:]
    if L < 1:
        raise ValueError("unary must have at least one label (L >= 1)")
    pair_weights = as_float_array("pair_weights", potentials.pair_weights, 2, "[..., T, K]")
    if pair_weights.shape[:-1] != unary.shape[:-1]:
        raise ValueError(
            f"pair_weights must have shape {batch_shape + (T,)} + [K] (batch and T from unary "
            f"{unary.shape}), got shape {pair_weights.shape}"
        )
    K = pair_weights.shape[-1]
    previous = _label_indices("pair_previous", potentials.pair_previous, K, L)
    following = _label_indices("pair_next", potentials.pair_next, K, L)
    start = jnp.zeros((L,), unary.dtype) if potentials.start is None else potentials.start
    start = as_float_array("start", start, 1, "[L] or [..., L]")
    if start.shape[-1] != L:
        raise ValueError(f"start must have shape [..., {L}], got shape {start.shape}")
    try:
        jnp.broadcast_shapes(start.shape[:-1], batch_shape)
    except ValueError:
        raise ValueError(
            f"start batch shape {start.shape[:-1]} does not broadcast to the batch shape {batch_shape} of unary"
        ) from None
    transitions = potentials.transitions
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
    potentials = SparsePotentials(
        unary.astype(dtype),
        pair_weights.astype(dtype),
        previous,
        following,
        start,
        None if transitions is None else transitions.astype(dtype),
    )
    return potentials, as_lengths(lengths, batch_shape, T), batch_shape, T, L


def to_dense(potentials: SparsePotentials) -> jax.Array:
    """The per-position potentials `[..., T, L, L]` of `chain` equal to a sparse
    form: `transitions[i, j] + unary[t, j] + pair_t(i, j)`, and in row 0 at
    `t = 0` the first scores `start[j] + unary[0, j] + pair_0(0, j)`.

    Materialises `T L^2` scores: for tests and for the dense baseline.
    """
    potentials, _, _, T, _ = _prepare(potentials, None)
    dense = potentials.edge_scores()
    if T == 0:
        return dense
    return dense.at[..., 0, 0, :].set(potentials.first_scores()[..., 0, :])


def random_support(key, num_labels: int, density: float) -> tuple[np.ndarray, np.ndarray]:
    """A random pair support `(pair_previous [K], pair_next [K])` with
    `K = round(density * L^2)` distinct pairs, sorted by `pair_next`."""
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must lie in [0, 1], got {density}")
    K = int(round(density * num_labels * num_labels))  # noqa: RUF046  (numpy 1 rounds a numpy scalar to a float)
    flat = np.sort(np.asarray(jax.random.choice(key, num_labels * num_labels, (K,), replace=False)))
    previous, following = np.divmod(flat, num_labels)
    order = np.argsort(following, kind="stable")
    return previous[order].astype(np.int32), following[order].astype(np.int32)
