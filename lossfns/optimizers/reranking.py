"""Linear reranking with exponential loss and L1 (Gao, Suzuki & Yu 2006;
MATH.md section 5): boosting with shrinkage (Collins & Koo), forward
stagewise linear regression (FSLR) and BLasso.

Data: `features [N, C, K]` of `C` candidates per example (`f_0`, column 0,
is the baseline model's log-probability; its weight is fitted once at
initialisation and is not penalised or updated afterwards), `reference [N]`
the index of the oracle-best candidate, `valid [N, C]` which candidates
exist. With `d = f(reference) - f(candidate)` `[N, C, K]`, the margins are
`M = d . lambda` and `ExpLoss = sum exp(-M)` over valid candidates.

All candidate single-feature updates are scored at once from the cached
margins: the loss of moving `lambda_k` by `delta` is
`sum_ic exp(-M_ic) exp(-delta d_ick)`, a `[K]` vector from one pass over
`d`, never a re-scoring of the candidates.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

import jax
import jax.numpy as jnp

from ..validation import as_float_array, concrete
from .minimize import check_int, check_scalar, init_loop, relative_change_below, run_loop
from .scalar_newton import newton_minimize


class RerankingData(NamedTuple):
    """differences: `[N, C, K]` `f(reference) - f(candidate)`, zero for invalid candidates;
    valid: `[N, C]` float mask."""

    differences: jax.Array
    valid: jax.Array


class RerankingState(NamedTuple):
    """weights: `[K]` lambda; margins: `[N, C]` cached `d . lambda`;
    alpha: `[]` BLasso's current regularisation (`inf` until set)."""

    weights: jax.Array
    margins: jax.Array
    alpha: jax.Array


def reranking_data(features, reference, valid=None) -> RerankingData:
    """`RerankingData` from candidate features `[N, C, K]`, `reference [N]`, `valid [N, C]`."""
    features = as_float_array("features", features, 3, "[N, C, K]")
    reference = jnp.asarray(reference)
    if reference.shape != features.shape[:1] or not jnp.issubdtype(reference.dtype, jnp.integer):
        raise ValueError(f"reference must be an int array of shape [N] = {features.shape[:1]}, "
                         f"got {reference.dtype} {reference.shape}")
    valid = jnp.ones(features.shape[:2], features.dtype) if valid is None else jnp.asarray(valid, features.dtype)
    if valid.shape != features.shape[:2]:
        raise ValueError(f"valid must have shape [N, C] = {features.shape[:2]}, got {valid.shape}")
    _check_finite("features", features)
    _check_references(reference, valid, features.shape[1])
    best = jnp.take_along_axis(features, reference[:, None, None], axis=1)
    return RerankingData((best - features) * valid[..., None], valid)


def _check_finite(name: str, x) -> None:
    """Reject NaN and +-inf when the values are concrete (a candidate's features must be finite)."""
    value = concrete(x)
    if value is not None and not np.isfinite(value).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])
        raise ValueError(f"{name} must be finite, got {value[where]} at index {where}")


def _check_references(reference, valid, num_candidates: int) -> None:
    """Each reference must index an existing (valid) candidate, when concrete."""
    reference, valid = concrete(reference), concrete(valid)
    if reference is None:
        return
    outside = (reference < 0) | (reference >= num_candidates)
    if outside.any():
        row = int(np.argmax(outside))
        raise ValueError(f"reference must lie in [0, {num_candidates}) (the candidate axis C), "
                         f"got {int(reference[row])} at index {row}")
    if valid is not None:
        absent = valid[np.arange(reference.shape[0]), reference] == 0
        if absent.any():
            row = int(np.argmax(absent))
            raise ValueError(f"reference must be a valid candidate, got {int(reference[row])} at index {row}, "
                             "which valid marks as absent")


def _check_data(data) -> None:
    if not isinstance(data, RerankingData):
        raise TypeError(f"data must be a RerankingData (from reranking_data(features, reference, valid)), "
                        f"got {type(data).__name__}")


def exp_loss(data: RerankingData, margins) -> jax.Array:
    """`sum_ic valid exp(-M_ic)`, `[]`."""
    return jnp.sum(data.valid * jnp.exp(-margins))


def lasso_loss(data: RerankingData, weights, alpha) -> jax.Array:
    """`ExpLoss + alpha ||lambda_{1:}||_1` (the baseline weight is not penalised)."""
    _check_data(data)
    size = data.differences.shape[-1:]
    if jnp.shape(weights) != size:
        raise ValueError(f"weights must have shape [K] = {size} (the features of data), got {jnp.shape(weights)}")
    check_scalar("alpha", alpha, 0)
    return exp_loss(data, data.differences @ weights) + alpha * jnp.sum(jnp.abs(weights[1:]))


def update_losses(data: RerankingData, margins, steps) -> jax.Array:
    """ExpLoss after moving each `lambda_k` by `steps [K]` alone, `[K]` (from cached margins)."""
    cached = data.valid * jnp.exp(-margins)
    return jnp.einsum("ic,ick->k", cached, jnp.exp(-steps * data.differences))


def optimal_steps(data: RerankingData, margins, max_step: float = 10.0) -> jax.Array:
    """`argmin_delta ExpLoss(lambda_k + delta)` for every feature, `[K]`."""
    cached = data.valid * jnp.exp(-margins)

    def derivatives(delta):
        weighted = cached[..., None] * jnp.exp(-delta * data.differences)
        return (-jnp.einsum("ick,ick->k", weighted, data.differences),
                jnp.einsum("ick,ick->k", weighted, data.differences ** 2))

    return newton_minimize(derivatives, data.differences.shape[-1:], margins.dtype,
                           max_step=max_step)


def _move(data, state: RerankingState, feature, step, alpha=None) -> RerankingState:
    weights = state.weights.at[feature].add(step)
    margins = state.margins + step * data.differences[:, :, feature]
    return RerankingState(weights, margins, state.alpha if alpha is None else alpha)


def reranking_init(data: RerankingData) -> RerankingState:
    """All weights 0 except `lambda_0`, set to minimise ExpLoss."""
    _check_data(data)
    size = data.differences.shape[-1]
    zero = RerankingState(jnp.zeros((size,), data.differences.dtype), jnp.zeros(data.valid.shape, data.differences.dtype),
                          jnp.asarray(jnp.inf, data.differences.dtype))
    return _move(data, zero, 0, optimal_steps(data, zero.margins)[0])


def _penalised(size):
    """`[K]` mask of the features updates may touch (all but the baseline)."""
    return jnp.arange(size) > 0


def _best_update(data, state):
    """`(feature, optimal step)` of the single-feature update with the lowest ExpLoss."""
    steps = optimal_steps(data, state.margins)
    losses = jnp.where(_penalised(steps.shape[0]), update_losses(data, state.margins, steps), jnp.inf)
    feature = jnp.argmin(losses)
    return feature, steps[feature]


def boosting_with_shrinkage_step_fn(data: RerankingData, shrinkage: float) -> Callable:
    """Collins & Koo's boosting with shrinkage: `lambda_k += shrinkage * delta_k*`."""
    _check_data(data)
    check_scalar("shrinkage", shrinkage, 0, 1, low_open=True)
    def step_fn(state, step):
        feature, delta = _best_update(data, state)
        state = _move(data, state, feature, shrinkage * delta)
        return state, exp_loss(data, state.margins)

    return step_fn


def fslr_step_fn(data: RerankingData, epsilon: float) -> Callable:
    """Forward stagewise linear regression: `lambda_k += epsilon * sign(delta_k*)`."""
    _check_data(data)
    check_scalar("epsilon", epsilon, 0, low_open=True)
    def step_fn(state, step):
        feature, delta = _best_update(data, state)
        state = _move(data, state, feature, epsilon * jnp.sign(delta))
        return state, exp_loss(data, state.margins)

    return step_fn


def _forward_step(data, state, epsilon):
    """BLasso's forward step: the best `(k, +-epsilon)` (or the optimal step if smaller)."""
    size = state.weights.shape[0]
    signed = jnp.stack([jnp.full((size,), epsilon), jnp.full((size,), -epsilon)])
    losses = jax.vmap(lambda s: update_losses(data, state.margins, s))(signed)
    losses = jnp.where(_penalised(size)[None], losses, jnp.inf)
    direction, feature = jnp.unravel_index(jnp.argmin(losses), losses.shape)
    step = signed[direction, feature]
    optimal = optimal_steps(data, state.margins)[feature]
    step = jnp.where((jnp.sign(optimal) == jnp.sign(step)) & (jnp.abs(optimal) < epsilon), optimal, step)
    return _move(data, state, feature, step)


def blasso_step_fn(data: RerankingData, epsilon: float, *, backward: bool = True,
                   tolerance: float = 1e-12) -> Callable:
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


def run_reranker(step_fn: Callable, data: RerankingData, *, num_steps: int, tol: float = 0.0):
    """Run a reranking `step_fn` from `reranking_init` for up to `num_steps`
    steps (stopping when ExpLoss changes by less than `tol`, relatively);
    returns the final `LoopState` (`.inner` is the `RerankingState`). Jit-able."""
    _check_data(data)
    check_int("num_steps", num_steps)
    loop = init_loop(reranking_init(data), num_steps, data.differences.dtype)
    return run_loop(step_fn, loop, num_steps, relative_change_below(tol))
