"""Sparse forward-backward for chains with L1-sparse label-pair weights
(Lavergne, Cappe & Yvon 2010, section 4.1).

A chain whose edge scores are `psi_t(i, j) = unary[t, j] + pair_t(i, j)`,
where the label-pair weights `pair_t` (bigram features that also test the
observation at `t`) are mostly zero, has transition factors

    exp(psi_t(i, j)) = exp(unary[t, j]) * (1 + M_t(i, j)),
    M_t(i, j) = exp(pair_t(i, j)) - 1,

and `M_t` is zero wherever the pair weight is. The forward recursion splits
into a dense rank-one part (every previous label reaches every label: the sum
of the forward vector) and a sparse part over the non-zeros of `M_t`:

    alpha_t(j) = exp(unary[t, j]) * (sum_i alpha_{t-1}(i)
                                     + sum_{i: M_t(i, j) != 0} alpha_{t-1}(i) M_t(i, j)),

which costs `O(L + K)` per position instead of `O(L^2)` for `K` non-zero
pairs; autodiff of the recursion (the backward pass) costs the same. The
forward vector is carried in log space and shifted at every step, as in
`lossfns.lattices.kernel`.

Representation: the non-zero label pairs share one support for the whole
batch, `pair_previous [K]` and `pair_next [K]` (the union of the pairs any
label-pair feature may fire on; with L1 training, the pairs whose weights are
non-zero), and `pair_weights [..., T, K]` holds their per-position log-space
weights (0 where a pair's weight is zero at that position). The same
conventions as `chain` hold: at `t = 0` the previous label is the start state
(label index 0 in the pair support), `lengths` mask positions at or past each
length, and `to_dense` gives the `[..., T, L, L]` potentials that
`chain.log_partition` accepts, which is what the tests compare with.

Accuracy: exact to rounding for every input the dense chain is exact for.
A pair weight `w < 0` enters as `1 + M` with `M = exp(w) - 1` close to -1,
so the contribution of label `j` is a difference; each step checks its
column sums against the magnitudes of their terms (and against underflow)
and redoes a step that lost precision in log space over the dense `[L, L]`
scores (`_forward_instance`), so strongly negative and forbidden (`-inf`)
pair weights cost time, not accuracy. Large positive scores are safe:
every step is shifted by its largest score before `exp`.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import semirings
from . import kernel
from ..validation import as_float_array, as_lengths, check_finite_or_neg_inf, concrete


class SparsePotentials(NamedTuple):
    """Unary scores plus sparse per-position label-pair weights.

    unary: `[..., T, L]`; pair_weights: `[..., T, K]` (log space, 0 = no
    effect, -inf = forbidden pair); pair_previous, pair_next: `[K]` int label
    indices of each non-zero pair; start: `[L]`, `[..., L]` or `None` (zeros).
    """

    unary: jax.Array
    pair_weights: jax.Array
    pair_previous: jax.Array
    pair_next: jax.Array
    start: Optional[jax.Array] = None


def _label_indices(name: str, indices, size: int, num_labels: int) -> jax.Array:
    """Pair support indices `[K]` of ints in `[0, num_labels)`."""
    indices = jnp.asarray(indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"{name} must be an integer array of shape [{size}] (K, from pair_weights), "
                        f"got dtype {indices.dtype}")
    if indices.shape != (size,):
        raise ValueError(f"{name} must have shape [{size}] (K, from pair_weights [..., T, K]), got shape {indices.shape}")
    value = concrete(indices)
    if value is not None and value.size and (value.min() < 0 or value.max() >= num_labels):
        raise ValueError(f"{name} must lie in [0, {num_labels}) (L labels, from unary), "
                         f"got {int(value[(value < 0) | (value >= num_labels)][0])}")
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
        raise ValueError(f"pair_weights must have shape {batch_shape + (T,)} + [K] (batch and T from unary "
                         f"{unary.shape}), got shape {pair_weights.shape}")
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
        raise ValueError(f"start batch shape {start.shape[:-1]} does not broadcast to the batch shape "
                         f"{batch_shape} of unary") from None
    for name, array in (("unary", unary), ("pair_weights", pair_weights), ("start", start)):
        check_finite_or_neg_inf(name, array)
    dtype = jnp.result_type(unary, pair_weights, start)
    start = jnp.broadcast_to(start.astype(dtype), batch_shape + (L,))
    potentials = SparsePotentials(unary.astype(dtype), pair_weights.astype(dtype), previous, following, start)
    return potentials, as_lengths(lengths, batch_shape, T), batch_shape, T, L


def _forward_instance(potentials: SparsePotentials, length):
    """`log Z` of one chain: `unary [T, L]`, `pair_weights [T, K]`, `start [L]`.

    The forward scores are carried in log space, as in `kernel`; each step
    is the sparse real-space product above on their exponentials, checked:
    a column sum below `kernel.recovery_threshold` (underflow) or below
    a fixed fraction of the sum of its terms' magnitudes (a difference that
    lost its digits, from strongly negative or forbidden pairs) sends the
    step to log space over the dense `[L, L]` pair scores, under `lax.cond`.
    """
    unary, pair_weights, previous, following, start = potentials
    T, L = unary.shape
    if T == 0:
        return jnp.zeros((), unary.dtype)
    valid = jnp.arange(T) < length
    # Padding becomes the log-space one before any arithmetic (no 0 * NaN).
    unary = jnp.where(valid[:, None], unary, 0.0)
    pair_weights = jnp.where(valid[:, None], pair_weights, 0.0)

    first = start + unary[0] + jax.ops.segment_sum(jnp.where(previous == 0, pair_weights[0], 0.0), following, L)
    first_shift = semirings.finite_max(first, -1)

    # Shifts keep exp() in range (NUMERICS.md 5): exp(pair - c) = exp(-c) (1 + M)
    # with c >= 0 the largest pair weight of the step, so nothing overflows.
    if pair_weights.shape[-1]:
        pair_shift = jnp.maximum(semirings.finite_max(pair_weights[1:], -1), 0.0)
    else:
        pair_shift = jnp.zeros((T - 1,), unary.dtype)
    pair_factors = jnp.exp(pair_weights[1:] - pair_shift[:, None])
    dense_factors = jnp.exp(-pair_shift)
    tau = kernel.recovery_threshold(unary.dtype, L)
    # Below this fraction of the sum of its terms' magnitudes, a column sum has
    # lost more than about 1e-5 of relative precision (a few roundings of eps).
    cancellation = min(1.0, 4 * float(jnp.finfo(unary.dtype).eps) / 1e-5)

    def step(log_alpha, inputs):
        unary_t, weights_t, pair_t, dense_t, shift_t, valid_t = inputs
        alpha = jnp.exp(log_alpha)
        dense = dense_t * jnp.sum(alpha)
        gathered = alpha[previous]
        sums = dense + jax.ops.segment_sum(gathered * (pair_t - dense_t), following, L)
        magnitudes = dense + jax.ops.segment_sum(gathered * (pair_t + dense_t), following, L)
        recover = valid_t & jnp.any(sums < jnp.maximum(tau, cancellation * magnitudes))

        def exact():
            pairs = jnp.zeros((L, L), unary.dtype).at[previous, following].add(weights_t)
            return semirings.logsumexp(log_alpha[:, None] + pairs, 0) - shift_t

        log_sums = jax.lax.cond(recover, exact, lambda: kernel._safe_log(jnp.maximum(sums, 0.0)))
        new = log_sums + shift_t + unary_t
        shift = semirings.finite_max(new, -1)
        return jnp.where(valid_t, new - shift, log_alpha), jnp.where(valid_t, shift, 0.0)

    inputs = (unary[1:], pair_weights[1:], pair_factors, dense_factors, pair_shift, valid[1:])
    log_alpha, log_norms = jax.lax.scan(step, first - first_shift, inputs)
    log_z = first_shift + semirings.pairwise_sum(log_norms) + kernel._safe_log(jnp.sum(jnp.exp(log_alpha)))
    return jnp.where(length == 0, 0.0, log_z)


def _map_batch(potentials: SparsePotentials, lengths, batch_shape):
    size = math.prod(batch_shape)
    flat = lambda x, core: x.reshape((size,) + x.shape[x.ndim - core:])
    flat_potentials = SparsePotentials(flat(potentials.unary, 2), flat(potentials.pair_weights, 2),
                                       potentials.pair_previous, potentials.pair_next, flat(potentials.start, 1))
    axes = SparsePotentials(0, 0, None, None, 0)
    out = jax.vmap(_forward_instance, in_axes=(axes, 0))(flat_potentials, lengths.reshape(size))
    return out.reshape(batch_shape)


def log_partition(potentials: SparsePotentials, lengths=None) -> jax.Array:
    """`log Z` per chain, `[...]`, in `O(T (L + K))` per chain.

    Args:
      potentials: `SparsePotentials` with `unary [..., T, L]` and
        `pair_weights [..., T, K]` on the shared support `pair_previous [K]`,
        `pair_next [K]`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
    """
    potentials, lengths, batch_shape, _, _ = _prepare(potentials, lengths)
    return _map_batch(potentials, lengths, batch_shape)


def marginals(potentials: SparsePotentials, lengths=None) -> SparsePotentials:
    """Derivatives of `log_partition`, per example, as a `SparsePotentials`:

    `unary [..., T, L]`: `P(y_t = j)`; `pair_weights [..., T, K]`:
    `P(y_{t-1} = pair_previous[k], y_t = pair_next[k])` (at `t = 0` only the
    pairs from label 0, the start state); `start [..., L]`: `P(y_0 = j)`. All
    are zero past each length. The support fields are returned unchanged.
    """
    potentials, lengths, batch_shape, _, _ = _prepare(potentials, lengths)
    differentiable = (potentials.unary, potentials.pair_weights, potentials.start)

    def total(fields):
        unary, pair_weights, start = fields
        return jnp.sum(_map_batch(potentials._replace(unary=unary, pair_weights=pair_weights, start=start),
                                  lengths, batch_shape))

    unary, pair_weights, start = jax.grad(total)(differentiable)
    return potentials._replace(unary=unary, pair_weights=pair_weights, start=start)


def to_dense(potentials: SparsePotentials) -> jax.Array:
    """The per-position potentials `[..., T, L, L]` of `chain` equal to a sparse
    form: `unary[t, j] + pair_t(i, j)`, plus `start[j]` in row 0 at `t = 0`.

    Materialises `T L^2` scores: for tests and for the dense baseline.
    """
    potentials, _, batch_shape, T, L = _prepare(potentials, None)
    unary, pair_weights, previous, following, start = potentials
    pairs = jnp.zeros(batch_shape + (T, L, L), unary.dtype).at[..., previous, following].add(pair_weights)
    dense = pairs + unary[..., :, None, :]
    if T == 0:
        return dense
    return dense.at[..., 0, 0, :].add(start)


def random_support(key, num_labels: int, density: float) -> tuple[np.ndarray, np.ndarray]:
    """A random pair support `(pair_previous [K], pair_next [K])` with
    `K = round(density * L^2)` distinct pairs, sorted by `pair_next`."""
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must lie in [0, 1], got {density}")
    K = int(round(density * num_labels * num_labels))
    flat = np.sort(np.asarray(jax.random.choice(key, num_labels * num_labels, (K,), replace=False)))
    previous, following = np.divmod(flat, num_labels)
    order = np.argsort(following, kind="stable")
    return previous[order].astype(np.int32), following[order].astype(np.int32)
