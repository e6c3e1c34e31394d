"""Linear reranking with exponential loss and L1 (Gao, Suzuki & Yu 2006): boosting
with shrinkage (Collins & Koo), forward stagewise linear regression (FSLR) and BLasso.

Data: `features [N, C, K]` of `C` candidates per example (column 0 the baseline's
log-probability, its weight fitted once and never penalised), `reference [N]` the
oracle-best candidate and `mask [N, C]` the candidates that exist. Every
single-feature update is scored at once from the cached margins, never by
re-scoring the candidates; `RerankingData` holds the feature differences densely,
`SparseRerankingData` only their non-zeros, and each method is written once.
Design notes: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..optimizers.scalar_newton import newton_minimize
from ..validation import as_float_array, as_int_array, check_int, check_scalar, concrete


class RerankingData(NamedTuple):
    """differences: `[N, C, K]` `f(reference) - f(candidate)`, zero for missing candidates;
    mask: `[N, C]` float, 1 where a candidate exists."""

    differences: jax.Array
    mask: jax.Array


class SparseRerankingData(NamedTuple):
    """`RerankingData` without the zeros of `differences`: `N` examples, `C`
    candidates, `K` features (0 = the baseline `f_0`), `E` non-zero
    differences `d_ick` of features `1..K-1`, grouped into `S` slots of equal
    (feature, value). From `sparse_reranking_data`.

    baseline: `[N, C]` `d_0`, zero for missing candidates; mask: `[N, C]` float, 1 where a
    candidate exists;
    entry_example, entry_candidate, entry_feature: `[E]` int32; entry_value: `[E]` `d_ick`;
    entry_slot: `[E]` int32, the slot of the entry's (feature, value);
    slot_feature: `[S]` int32, sorted; slot_value: `[S]` the slot's `d`;
    feature_entries: `[K]` int32 non-zero differences per feature (its shape gives `K`).
    """

    baseline: jax.Array
    mask: jax.Array
    entry_example: jax.Array
    entry_candidate: jax.Array
    entry_feature: jax.Array
    entry_value: jax.Array
    entry_slot: jax.Array
    slot_feature: jax.Array
    slot_value: jax.Array
    feature_entries: jax.Array


AnyRerankingData = RerankingData | SparseRerankingData


class RerankingState(NamedTuple):
    """weights: `[K]` lambda; margins: `[N, C]` cached `d . lambda`;
    alpha: `[]` BLasso's current regularisation (`inf` until set)."""

    weights: jax.Array
    margins: jax.Array
    alpha: jax.Array


def reranking_data(features, reference, mask=None) -> RerankingData:
    """`RerankingData` from candidate features `[N, C, K]`, `reference [N]` and
    `mask [N, C]` (1 where a candidate exists; default all)."""
    features = as_float_array("features", features, 3, "[N, C, K]")
    raw = concrete(reference)
    # An int64 reference beyond int32 is refused, not wrapped (jax_enable_x64 off).
    reference = (
        as_int_array("reference", reference, raw)
        if raw is not None and raw.dtype.kind in "iu"
        else jnp.asarray(reference)
    )
    if reference.shape != features.shape[:1] or not jnp.issubdtype(reference.dtype, jnp.integer):
        raise ValueError(
            f"reference must be an int array of shape [N] = {features.shape[:1]}, "
            f"got {reference.dtype} {reference.shape}"
        )
    mask = jnp.ones(features.shape[:2], features.dtype) if mask is None else jnp.asarray(mask, features.dtype)
    if mask.shape != features.shape[:2]:
        raise ValueError(f"mask must have shape [N, C] = {features.shape[:2]}, got {mask.shape}")
    _check_finite("features", features)
    _check_references(reference, mask, features.shape[1])
    best = jnp.take_along_axis(features, reference[:, None, None], axis=1)
    return RerankingData((best - features) * mask[..., None], mask)


def sparse_reranking_data(
    baseline, entries, mask=None, *, num_features: int | None = None, dtype=None
) -> SparseRerankingData:
    """`SparseRerankingData` from the differences `d = f(reference) - f(candidate)`.

    baseline: `[N, C]` `d_0` (read as 0 where `mask` is 0);
    entries: `(example [E], candidate [E], feature [E], value [E])`, the
      non-zero `d_ick` of features `k >= 1` (at most one entry per
      (example, candidate, feature); those of missing candidates and zero
      values are dropped);
    mask: `[N, C]`, 1 where a candidate exists (default all);
    num_features: `K` (default the largest feature + 1);
    dtype: float dtype of the values (default baseline's).
    Groups the entries on the host (numpy), so call it outside `jit`.
    """
    baseline = as_float_array("baseline", baseline, 2, "[N, C]")
    if baseline.ndim != 2:
        raise ValueError(f"baseline must have shape [N, C], got shape {baseline.shape}")
    dtype = baseline.dtype if dtype is None else dtype
    shape = baseline.shape
    mask = np.ones(shape) if mask is None else np.asarray(mask, np.float64)
    if mask.shape != shape:
        raise ValueError(f"mask must have shape [N, C] = {shape} (like baseline), got {mask.shape}")
    if not isinstance(entries, (tuple, list)) or len(entries) != 4:
        got = f" of length {len(entries)}" if isinstance(entries, (tuple, list)) else ""
        raise ValueError(
            "entries must be a tuple of 4 arrays (example [E], candidate [E], feature [E], value [E]), "
            f"got {type(entries).__name__}{got}"
        )
    example, candidate, feature, value = (np.asarray(a) for a in entries)
    for name, array in (("example", example), ("candidate", candidate), ("feature", feature), ("value", value)):
        if array.ndim != 1 or array.shape != example.shape:
            raise ValueError(
                f"entries' {name} must have shape [E] = {example.shape[:1]} (like entries' example), "
                f"got shape {array.shape}"
            )
        if name != "value" and array.size and not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"entries' {name} must be an int array of shape [E], got dtype {array.dtype}")
        if name == "value" and not np.issubdtype(array.dtype, np.number):
            raise ValueError(f"entries' value must be a numeric array of shape [E], got dtype {array.dtype}")
    example, candidate, feature = (a.astype(np.int64) for a in (example, candidate, feature))
    size = check_int("num_features", int(feature.max(initial=0)) + 1 if num_features is None else num_features)
    for name, array, high in (
        ("example", example, shape[0]),
        ("candidate", candidate, shape[1]),
        ("feature", feature, size),
    ):
        low = 1 if name == "feature" else 0
        outside = (array < low) | (array >= high)
        if outside.any():
            at = int(np.argmax(outside))
            raise ValueError(f"entries' {name} must lie in [{low}, {high}), got {int(array[at])} at index {at}")
    _check_finite("entries' value", value)
    baseline = np.where(mask > 0, np.asarray(baseline), 0.0)  # host arrays: not under jit
    _check_finite("baseline", baseline)
    keys = np.stack([example, candidate, feature])
    if np.unique(keys, axis=1).shape[1] != keys.shape[1]:
        raise ValueError("entries must hold at most one value per (example, candidate, feature), got duplicates")
    keep = (mask[example, candidate] > 0) & (value != 0)
    example, candidate, feature = example[keep], candidate[keep], feature[keep]
    value = np.asarray(jnp.asarray(value[keep], dtype))  # slots group the values as stored
    # Slots: the distinct (feature, value) pairs, sorted by feature (then value).
    pairs = np.rec.fromarrays([feature, value])
    unique, slot = np.unique(pairs, return_inverse=True)
    counts = np.bincount(feature, minlength=size)
    counts[0] = np.count_nonzero(baseline)
    return SparseRerankingData(
        jnp.asarray(baseline, dtype),
        jnp.asarray(mask, dtype),
        jnp.asarray(example, jnp.int32),
        jnp.asarray(candidate, jnp.int32),
        jnp.asarray(feature, jnp.int32),
        jnp.asarray(value, dtype),
        jnp.asarray(slot, jnp.int32),
        jnp.asarray(unique["f0"], jnp.int32),
        jnp.asarray(unique["f1"], dtype),
        jnp.asarray(counts, jnp.int32),
    )


def _check_finite(name: str, x) -> None:
    """Reject NaN and +-inf when the values are concrete (a candidate's features must be finite)."""
    value = concrete(x)
    if value is not None and not np.isfinite(value).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])
        raise ValueError(f"{name} must be finite, got {value[where]} at index {where}")


def _check_references(reference, mask, num_candidates: int) -> None:
    """Each reference must index an existing candidate (mask 1), when concrete."""
    reference, mask = concrete(reference), concrete(mask)
    if reference is None:
        return
    outside = (reference < 0) | (reference >= num_candidates)
    if outside.any():
        row = int(np.argmax(outside))
        raise ValueError(
            f"reference must lie in [0, {num_candidates}) (the candidate axis C), "
            f"got {int(reference[row])} at index {row}"
        )
    if mask is not None:
        absent = mask[np.arange(reference.shape[0]), reference] == 0
        if absent.any():
            row = int(np.argmax(absent))
            raise ValueError(
                f"reference must be an existing candidate, got {int(reference[row])} at index {row}, "
                "which mask marks as absent"
            )


def _check_data(data) -> None:
    if not isinstance(data, (RerankingData, SparseRerankingData)):
        raise TypeError(
            "data must be a RerankingData (from reranking_data(features, reference, mask)) or a "
            "SparseRerankingData (from sparse_reranking_data(baseline, entries, mask)), "
            f"got {type(data).__name__}"
        )


# ---------------------------------------------------------------------------
# The primitives of each layout
# ---------------------------------------------------------------------------


def num_features(data: AnyRerankingData) -> int:
    """`K`, the number of features (static)."""
    if isinstance(data, SparseRerankingData):
        return data.feature_entries.shape[0]
    return data.differences.shape[-1]


def _baseline(data: AnyRerankingData) -> jax.Array:
    """`[N, C]` `d_0`, the differences of the baseline feature."""
    return data.baseline if isinstance(data, SparseRerankingData) else data.differences[:, :, 0]


def _column(data: AnyRerankingData, feature) -> jax.Array:
    """`[N, C]` `d_k` of one (possibly traced) feature `k`."""
    if not isinstance(data, SparseRerankingData):
        return data.differences[:, :, feature]
    scattered = (
        jnp.zeros(data.mask.shape, data.mask.dtype)
        .at[data.entry_example, data.entry_candidate]
        .add(jnp.where(data.entry_feature == feature, data.entry_value, 0.0))
    )
    return jnp.where(feature == 0, data.baseline, scattered)


def _margins(data: AnyRerankingData, weights) -> jax.Array:
    """`[N, C]` margins `M = d . lambda` of weights `[K]`."""
    if not isinstance(data, SparseRerankingData):
        return data.differences @ weights
    return (
        (weights[0] * data.baseline)
        .at[data.entry_example, data.entry_candidate]
        .add(weights[data.entry_feature] * data.entry_value)
    )


def _weighted(data: AnyRerankingData, margins):
    """What the `[K]` move losses need from the margins: `mask exp(-M)`
    `[N, C]`, and for sparse data also its sum over each slot's entries `[S]`."""
    cached = data.mask * jnp.exp(-margins)
    if not isinstance(data, SparseRerankingData):
        return cached
    mass = jax.ops.segment_sum(
        cached[data.entry_example, data.entry_candidate], data.entry_slot, num_segments=data.slot_feature.shape[0]
    )
    return cached, mass


def _per_feature(data: SparseRerankingData, terms) -> jax.Array:
    """`[K]` sums of per-slot `terms [S]` (feature 0 has no slots: 0)."""
    return jax.ops.segment_sum(terms, data.slot_feature, num_segments=num_features(data), indices_are_sorted=True)


def _move_losses(data: AnyRerankingData, weighted, steps) -> jax.Array:
    """`[K]` ExpLoss after moving each `lambda_k` by `steps [K]` alone."""
    if not isinstance(data, SparseRerankingData):
        return jnp.einsum("ic,ick->k", weighted, jnp.exp(-steps * data.differences))
    cached, mass = weighted
    # Only the entries of feature k change: sum(cached) + sum_slots mass (exp(-step d) - 1).
    moved = mass * jnp.expm1(-steps[data.slot_feature] * data.slot_value)
    losses = jnp.sum(cached) + _per_feature(data, moved)
    return losses.at[0].set(jnp.sum(cached * jnp.exp(-steps[0] * data.baseline)))


def _move_derivatives(data: AnyRerankingData, weighted, delta):
    """First and second derivatives `[K]` of `_move_losses` at steps `delta [K]`.
    For sparse data entry 0 (the baseline) is 0: its `[N, C]` pass would
    cost more than the slots of all other features (see `_baseline_step`)."""
    if not isinstance(data, SparseRerankingData):
        scaled = weighted[..., None] * jnp.exp(-delta * data.differences)
        return (
            -jnp.einsum("ick,ick->k", scaled, data.differences),
            jnp.einsum("ick,ick->k", scaled, data.differences**2),
        )
    _, mass = weighted
    scaled = mass * jnp.exp(-delta[data.slot_feature] * data.slot_value)
    return -_per_feature(data, scaled * data.slot_value), _per_feature(data, scaled * data.slot_value**2)


def _optimal_moves(data: AnyRerankingData, weighted, max_step: float = 10.0) -> jax.Array:
    """`[K]` optimal steps by Newton on `_move_derivatives` (entry 0 as there)."""
    return newton_minimize(
        lambda delta: _move_derivatives(data, weighted, delta),
        (num_features(data),),
        data.mask.dtype,
        max_step=max_step,
    )


def _baseline_step(data: AnyRerankingData, cached, max_step: float = 10.0) -> jax.Array:
    """`argmin_delta sum_ic cached_ic exp(-delta d_ic0)`, `[]`, for `cached = mask exp(-M)` `[N, C]`."""
    baseline = _baseline(data)

    def derivatives(delta):
        weighted = cached * jnp.exp(-delta[0] * baseline)
        return -jnp.sum(weighted * baseline)[None], jnp.sum(weighted * baseline**2)[None]

    return newton_minimize(derivatives, (1,), data.mask.dtype, max_step=max_step)[0]


def _move(data: AnyRerankingData, state: RerankingState, feature, step, alpha=None) -> RerankingState:
    """`state` with `lambda_feature` moved by `step` (and its cached margins)."""
    weights = state.weights.at[feature].add(step)
    margins = state.margins + step * _column(data, feature)
    return RerankingState(weights, margins, state.alpha if alpha is None else alpha)


# ---------------------------------------------------------------------------
# Losses and single-feature updates (either layout)
# ---------------------------------------------------------------------------


def exp_loss(data: AnyRerankingData, margins) -> jax.Array:
    """`sum_ic mask exp(-M_ic)` of margins `[N, C]`, `[]`."""
    return jnp.sum(data.mask * jnp.exp(-margins))


def update_losses(data: AnyRerankingData, margins, steps) -> jax.Array:
    """ExpLoss after moving each `lambda_k` by `steps [K]` alone, `[K]` (from cached margins `[N, C]`)."""
    return _move_losses(data, _weighted(data, margins), steps)


def optimal_steps(data: AnyRerankingData, margins, max_step: float = 10.0) -> jax.Array:
    """`argmin_delta ExpLoss(lambda_k + delta)` for every feature, `[K]` (from margins `[N, C]`)."""
    weighted = _weighted(data, margins)
    steps = _optimal_moves(data, weighted, max_step)
    if isinstance(data, SparseRerankingData):
        steps = steps.at[0].set(_baseline_step(data, weighted[0], max_step))
    return steps


def reranking_init(data: AnyRerankingData) -> RerankingState:
    """All weights `[K]` 0 except `lambda_0`, set to minimise ExpLoss."""
    _check_data(data)
    dtype = data.mask.dtype
    lambda_0 = _baseline_step(data, data.mask)  # mask exp(-M) at M = 0
    weights = jnp.zeros((num_features(data),), dtype).at[0].set(lambda_0)
    return RerankingState(weights, lambda_0 * _baseline(data), jnp.asarray(jnp.inf, dtype))


# ---------------------------------------------------------------------------
# The methods (either layout)
# ---------------------------------------------------------------------------


def _penalised(size):
    """`[K]` mask of the features updates may touch (all but the baseline)."""
    return jnp.arange(size) > 0


def _best_update(data, state):
    """`(feature, optimal step)` of the single-feature update with the lowest ExpLoss."""
    weighted = _weighted(data, state.margins)
    steps = _optimal_moves(data, weighted)
    losses = jnp.where(_penalised(steps.shape[0]), _move_losses(data, weighted, steps), jnp.inf)
    feature = jnp.argmin(losses)
    return feature, steps[feature]


def boosting_with_shrinkage_step_fn(data: AnyRerankingData, shrinkage: float) -> Callable:
    """Collins & Koo's boosting with shrinkage: `lambda_k += shrinkage * delta_k*`."""
    _check_data(data)
    check_scalar("shrinkage", shrinkage, 0, 1, low_open=True)

    def step_fn(state, step):
        feature, delta = _best_update(data, state)
        state = _move(data, state, feature, shrinkage * delta)
        return state, exp_loss(data, state.margins)

    return step_fn


def fslr_step_fn(data: AnyRerankingData, epsilon: float, *, cap: bool = False) -> Callable:
    """Forward stagewise linear regression: `lambda_k += epsilon * sign(delta_k*)`.

    `cap`: take the optimal step `delta_k*` when it is shorter than epsilon,
    as Gao et al. implement FSLR ("both changes (also used in our
    implementations of boosting and FSLR) were crucial"); without it a step
    longer than twice the optimal one raises ExpLoss.
    """
    _check_data(data)
    check_scalar("epsilon", epsilon, 0, low_open=True)

    def step_fn(state, step):
        feature, delta = _best_update(data, state)
        move = epsilon * jnp.sign(delta)
        if cap:
            move = jnp.where(jnp.abs(delta) < epsilon, delta, move)
        state = _move(data, state, feature, move)
        return state, exp_loss(data, state.margins)

    return step_fn


def _forward_step(data, state, epsilon):
    """BLasso's forward step: the best `(k, +-epsilon)` (or the optimal step if smaller)."""
    size = state.weights.shape[0]
    weighted = _weighted(data, state.margins)
    signed = jnp.stack([jnp.full((size,), epsilon), jnp.full((size,), -epsilon)])
    losses = jax.vmap(lambda s: _move_losses(data, weighted, s))(signed)
    losses = jnp.where(_penalised(size)[None], losses, jnp.inf)
    direction, feature = jnp.unravel_index(jnp.argmin(losses), losses.shape)
    step = signed[direction, feature]
    optimal = _optimal_moves(data, weighted)[feature]
    step = jnp.where((jnp.sign(optimal) == jnp.sign(step)) & (jnp.abs(optimal) < epsilon), optimal, step)
    return _move(data, state, feature, step)


def blasso_step_fn(
    data: AnyRerankingData, epsilon: float, *, backward: bool = True, tolerance: float = 1e-12
) -> Callable:
    """BLasso (Zhao & Yu; Gao et al. section 3.3).

    The first step is a forward step that sets `alpha = (ExpLoss before -
    ExpLoss after) / epsilon`. Each later step tries the backward step (the
    non-zero `lambda_k` whose move of `epsilon` towards 0 gives the lowest
    ExpLoss) and takes it if it lowers `LassoLoss(., alpha)` by more than
    `tolerance`; otherwise it takes a forward step and lowers `alpha` to
    `(ExpLoss before - ExpLoss after) / epsilon` if that is smaller.
    `backward=False` gives forward-only BLasso (F-Boosting in Gao et al.).
    When no forward step lowers ExpLoss (alpha would reach 0) the state stays
    put, so the path ends at a fixed point.
    The objective recorded is ExpLoss; `state.alpha` is the current alpha.
    `tolerance` is absolute: with large ExpLoss sums, scale it by the
    initial ExpLoss so that rounding never counts as a decrease.
    """
    _check_data(data)
    check_scalar("epsilon", epsilon, 0, low_open=True)
    check_scalar("tolerance", tolerance, 0)

    def forward(state):
        before = exp_loss(data, state.margins)
        moved = _forward_step(data, state, epsilon)
        decrease = (before - exp_loss(data, moved.margins)) / epsilon
        moved = moved._replace(alpha=jnp.minimum(state.alpha, decrease))
        # At the end of the path no forward step lowers ExpLoss: stay (a fixed point).
        return jax.tree_util.tree_map(lambda new, old: jnp.where(decrease > 0, new, old), moved, state)

    def try_backward(state):
        weights = state.weights
        toward_zero = -jnp.sign(weights) * jnp.minimum(epsilon, jnp.abs(weights))
        losses = update_losses(data, state.margins, toward_zero)
        losses = jnp.where(_penalised(weights.shape[0]) & (weights != 0), losses, jnp.inf)
        feature = jnp.argmin(losses)
        moved = _move(data, state, feature, toward_zero[feature])
        penalty = lambda w: state.alpha * jnp.sum(jnp.abs(w[1:]))
        gain = (exp_loss(data, state.margins) + penalty(weights)) - (losses[feature] + penalty(moved.weights))
        take = jnp.isfinite(losses[feature]) & (gain > tolerance)
        return jax.lax.cond(take, lambda: moved, lambda: forward(state))

    def step_fn(state, step):
        if backward:
            state = jax.lax.cond(jnp.isinf(state.alpha), forward, try_backward, state)
        else:
            state = forward(state)
        return state, exp_loss(data, state.margins)

    return step_fn
