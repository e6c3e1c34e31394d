"""Sequence boosting (Altun, Hofmann & Johnson 2002).

Boosting of a linear-chain model with the sequential exponential loss
`sum_i 1 / P(y_i | x_i) - 1`: each round picks one weak learner (feature) and a
step by minimising a convex upper bound of the factor by which the loss shrinks
(one forward-backward per sequence scores every weak learner). The round is
written once over two layouts of the statistics: `BoostingData` (dense, any linear
`potentials_fn`) and `ChainBoostingData` (`chain_boosting`: a linear chain's
indicator features). `boost` runs it through the driver (`optimizers.drive`).
Design notes: docs/internals.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import losses
from ..lattices import chain
from ..optimizers.driver import Evaluation, drive
from ..optimizers.minimize import Result, Status, init_loop, loop_result, relative_change_below, run_loop
from ..optimizers.scalar_newton import newton_minimize
from ..validation import check_callable, check_int, check_scalar
from .chain_boosting import (
    ChainBoostingData,
    ChainStatistics,
    chain_group_weak_learner,
    chain_slot_groups,
    chain_statistics,
    chain_weak_learner_row,
    chain_weak_learners,
    log_exp_loss,
    log_weights,
    update_chain_statistics,
)
from .perceptron import SequenceData, check_sequence_data

STEPS = ("line_search", "closed_form")
#: Largest |step| of a round (a weak learner whose bound keeps falling, e.g.
#: one that separates the data, gets this).
MAX_STEP = 10.0


class BoostingData(NamedTuple):
    """The dense layout (from `boosting_data`): sequences: `SequenceData`;
    lowest, highest: `[N, K]` the range of `u_ik` over all label sequences
    (`<= 0`, `>= 0`)."""

    sequences: SequenceData
    lowest: jax.Array
    highest: jax.Array


class DenseStatistics(NamedTuple):
    """log_losses: `[N]` `-log P(y_i | x_i)`; excess: `[N, K]` `E_P[S] - S(x_i, y_i)`."""

    log_losses: jax.Array
    excess: jax.Array


class BoostingHistory(NamedTuple):
    """Per round (`[R]`, R the round cap): feature: int32 the weak learner
    chosen (-1: not run); step: its delta; bound: its bound on `Z_k(delta)`."""

    feature: jax.Array
    step: jax.Array
    bound: jax.Array


class BoostingState(NamedTuple):
    """theta: `[K]`; statistics: the layout's statistics at theta
    (`DenseStatistics` or `chain_boosting.ChainStatistics`); log_exp_loss:
    `[]` log of the exp-loss at theta; recent: `[window]` the log exp-loss
    after the last `window` rounds (a ring, +inf before); converged: `[]`
    bool, the stop rule fired; history: `BoostingHistory`."""

    theta: jax.Array
    statistics: DenseStatistics | ChainStatistics
    log_exp_loss: jax.Array
    recent: jax.Array
    converged: jax.Array
    history: BoostingHistory


AnyBoostingData = BoostingData | ChainBoostingData


def _check_data(data) -> None:
    if not isinstance(data, (BoostingData, ChainBoostingData)):
        raise TypeError(
            "data must be a BoostingData (from boosting_data(potentials_fn, data, num_features)) "
            "or a ChainBoostingData (from chain_boosting_data(ids, labels, lengths, ...)), "
            f"got {type(data).__name__}"
        )


def _check_step(step) -> None:
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")


def _check_potentials_fn(data, potentials_fn) -> None:
    if isinstance(data, BoostingData):
        check_callable("potentials_fn", potentials_fn)
    elif potentials_fn is not None:
        raise ValueError("potentials_fn must be None for ChainBoostingData (its model is the linear chain's)")


def num_weak_learners(data: AnyBoostingData) -> int:
    """`K`, the number of weak learners (static)."""
    if isinstance(data, ChainBoostingData):
        return data.num_weak_learners
    return data.lowest.shape[-1]


# ---------------------------------------------------------------------------
# The dense layout
# ---------------------------------------------------------------------------


def boosting_data(potentials_fn: Callable, data: SequenceData, num_features: int, dtype=None) -> BoostingData:
    """The dense layout: each sequence's range of `u_ik` for every feature,
    by Viterbi on the feature's own potentials (`K` runs per sequence).

    potentials_fn: `(theta [K], inputs_i) -> potentials` of one sequence, linear in theta;
    data: the `SequenceData`, as in `sequence_boosting`; dtype: of the ranges
    (default JAX's float: float32, float64 in 64-bit mode).
    """
    check_callable("potentials_fn", potentials_fn)
    check_sequence_data(data)
    check_int("num_features", num_features)
    dtype = jnp.result_type(float) if dtype is None else dtype
    basis = jnp.eye(num_features, dtype=dtype)

    def one(inputs, labels, length):
        gold = jax.grad(lambda theta: chain.score(potentials_fn(theta, inputs), labels, length))(
            jnp.zeros((num_features,), dtype)
        )
        best = lambda theta: chain.viterbi(potentials_fn(theta, inputs), length)[0]
        return -jax.vmap(best)(-basis) - gold, jax.vmap(best)(basis) - gold

    lowest, highest = jax.vmap(one)(data.inputs, data.labels, data.lengths)
    return BoostingData(data, lowest, highest)


def _dense_statistics(potentials_fn, data: BoostingData, theta) -> DenseStatistics:
    """`-log P(y_i | x_i)` `[N]` and its gradient `[N, K]`: one forward-backward per sequence."""

    def one(inputs, labels, length):
        return jax.value_and_grad(lambda t: losses.sequence_log_loss(potentials_fn(t, inputs), labels, length))(theta)

    sequences = data.sequences
    return DenseStatistics(*jax.vmap(one)(sequences.inputs, sequences.labels, sequences.lengths))


def _dense_slot_groups(data: BoostingData, statistics: DenseStatistics, log_total):
    """One group `[K, 2N]`: each sequence's mass at its `u_min` and at its `u_max`."""
    log_losses, excess = statistics
    log_total = _finite_or_inf(log_total)
    distribution = jnp.exp(log_weights(log_losses) - log_total)  # D(i)
    inverse = jnp.exp(log_losses - log_total)  # (1 / P_i) / W: D(i) E_pi[u] = inverse (E_P[S] - S(y_i))
    spread = data.highest - data.lowest
    safe = jnp.where(spread > 0, spread, 1.0)
    low = jnp.where(spread > 0, (distribution[:, None] * data.highest - inverse[:, None] * excess) / safe, 0.0)
    high = jnp.where(spread > 0, distribution[:, None] - low, 0.0)
    return [(jnp.concatenate([low, high]).T, jnp.concatenate([data.lowest, data.highest]).T)]


# ---------------------------------------------------------------------------
# The layouts behind one interface
# ---------------------------------------------------------------------------


def _statistics(data, potentials_fn, theta):
    if isinstance(data, ChainBoostingData):
        return chain_statistics(data, theta)
    return _dense_statistics(potentials_fn, data, theta)


def _updated_statistics(data, potentials_fn, statistics, theta, new_theta, feature, refresh_every):
    if isinstance(data, ChainBoostingData):
        return update_chain_statistics(data, statistics, theta, new_theta, feature, refresh_every)
    return _dense_statistics(potentials_fn, data, new_theta)


def _slot_groups(data, statistics, log_total):
    """`[(masses [G, W], values [W] or [G, W], two_point)]`, masses
    normalised (`D(i)` summing to 1); `two_point`: the values are -1, 0, 1."""
    if isinstance(data, ChainBoostingData):
        # Drift between full passes can leave a hair below 0; a mass is never negative.
        scale = jnp.exp(statistics.log_scale - _finite_or_inf(log_total))
        return [
            (jnp.maximum(masses, 0.0) * scale, values, masses.shape[1] == 3)
            for masses, values in chain_slot_groups(data, statistics.masses)
        ]
    return [group + (False,) for group in _dense_slot_groups(data, statistics, log_total)]


def _weak_learner_row(data, statistics, log_total, feature):
    """`(masses [W], values [W])`: the slot row of one (traced) weak learner."""
    if isinstance(data, ChainBoostingData):
        masses, values = chain_weak_learner_row(data, statistics.masses, feature)
        return jnp.maximum(masses, 0.0) * jnp.exp(statistics.log_scale - _finite_or_inf(log_total)), values
    ((masses, values),) = _dense_slot_groups(data, statistics, log_total)
    return masses[feature], values[feature]


def _finite_or_inf(log_total):
    """`log W`, or +inf (every mass 0: no round moves) when every sequence
    is already certain (`W = 0`)."""
    return jnp.where(jnp.isfinite(log_total), log_total, jnp.inf)


def _weak_learners(data, per_group) -> jax.Array:
    if isinstance(data, ChainBoostingData):
        return chain_weak_learners(data, per_group)
    return per_group[0]


def _group_weak_learner(data, group: int, row) -> jax.Array:
    """The weak learner `[]` int32 of a (traced) row of slot group `group`."""
    if isinstance(data, ChainBoostingData):
        return chain_group_weak_learner(data, group, row)
    return row


def _ranges(data):
    """`(lowest [K], highest [K])`: each weak learner's range over all sequences."""
    if isinstance(data, ChainBoostingData):
        return data.lowest, data.highest
    return jnp.min(data.lowest, axis=0), jnp.max(data.highest, axis=0)


# ---------------------------------------------------------------------------
# The round
# ---------------------------------------------------------------------------


def _two_point_gains(below, above):
    """`bound - 1` `[G]` at the minimiser of `1 + below (e^-delta - 1) + above
    (e^delta - 1)`: `-(below - above)^2 / (sqrt(below) + sqrt(above))^2` at
    `delta = log(below / above) / 2` (no cancellation for tiny gains), or at
    the clipped step when that lies beyond `MAX_STEP`."""
    ratio = math.exp(2 * MAX_STEP)
    inside = (below <= ratio * above) & (above <= ratio * below)
    root = jnp.sqrt(below) + jnp.sqrt(above)
    free = -((below - above) ** 2) / jnp.where(root > 0, root, 1.0) ** 2
    clipped = jnp.where(below > above, MAX_STEP, -MAX_STEP)
    return jnp.where(inside, free, below * jnp.expm1(-clipped) + above * jnp.expm1(clipped))


def _newton_steps(masses, values):
    """`delta [G]`: the minimiser of each row's bound `1 + sum_w masses
    (e^(delta values) - 1)`, clipped to `MAX_STEP`: Newton steps from the
    minimiser of the two-point bound with the same masses and mean values
    on each side of 0 (exact for two-point rows, close for the others)."""

    def derivatives(delta):
        terms = masses * _exp(delta[:, None] * values)
        return jnp.sum(terms * values, axis=-1), jnp.sum(terms * values * values, axis=-1)

    below = jnp.sum(jnp.where(values < 0, masses, 0.0), axis=-1)
    above = jnp.sum(jnp.where(values > 0, masses, 0.0), axis=-1)
    reach_below = jnp.sum(jnp.where(values < 0, -masses * values, 0.0), axis=-1)  # below * mean |v|
    reach_above = jnp.sum(jnp.where(values > 0, masses * values, 0.0), axis=-1)
    spread = reach_below / jnp.where(below > 0, below, 1.0) + reach_above / jnp.where(above > 0, above, 1.0)
    start = jnp.where(
        (below > 0) & (above > 0),
        jnp.log(jnp.where(below > 0, reach_below, 1.0) / jnp.where(above > 0, reach_above, 1.0))
        / jnp.where(spread > 0, spread, 1.0),
        jnp.where(below > 0, MAX_STEP, jnp.where(above > 0, -MAX_STEP, 0.0)),
    )
    # Converged once a step moves by sqrt(eps): the next would be at rounding level.
    return newton_minimize(
        derivatives,
        masses.shape[:1],
        masses.dtype,
        max_step=MAX_STEP,
        tol=math.sqrt(float(jnp.finfo(masses.dtype).eps)),
        start=start,
    )


def _exp(x):
    """`e^x`, capped where it would overflow: that happens only far from any
    minimiser of a bound (where the bound exceeds 1 by far)."""
    return jnp.exp(jnp.minimum(x, 0.5 * math.log(jnp.finfo(x.dtype).max)))


def _gains(masses, values, two_point: bool, delta=None):
    """`bound - 1` `[G]` of each row at its minimiser (or at `delta [G]`)."""
    if two_point and delta is None:
        return _two_point_gains(masses[:, 0], masses[:, 2])
    if delta is None:
        delta = _newton_steps(masses, values)
    return jnp.sum(masses * (_exp(delta[:, None] * values) - 1.0), axis=-1)


def _closed_form_steps(first, lowest, highest):
    """`(delta [K], gain [K])` of the global-range bound `r e^(delta u_min) +
    (1 - r) e^(delta u_max)`, `r = (u_max - first) / (u_max - u_min)` with
    `first = sum_i D(i) E_pi[u_ik]`; 0 where the range is one-sided."""
    spread = highest - lowest
    r = (highest - first) / jnp.where(spread > 0, spread, 1.0)
    usable = (lowest < 0) & (highest > 0) & (r > 0) & (r < 1)
    ratio = jnp.where(usable, -r * lowest / ((1 - r) * highest), 1.0)
    delta = jnp.where(usable, jnp.log(ratio) / jnp.where(usable, spread, 1.0), 0.0)
    return delta, jnp.where(usable, r * jnp.expm1(delta * lowest) + (1 - r) * jnp.expm1(delta * highest), 0.0)


def _argmin(values) -> jax.Array:
    """`jnp.argmin` of a long vector `[K]` (the first minimum), `[]` int32:
    minima of rows of 1024 first (XLA's CPU argmin is a slow two-value reduction)."""
    width = 1024
    padded = jnp.pad(values, (0, -values.shape[0] % width), constant_values=jnp.inf).reshape(-1, width)
    row = jnp.argmin(jnp.min(padded, axis=1))
    return (row * width + jnp.argmin(padded[row])).astype(jnp.int32)


def _choose(data, statistics, log_total, step: str):
    """`(feature [] int32, delta [], gain [])`: the weak learner with the
    lowest bound, its step and `bound - 1`. Every weak learner's gain comes
    from its own slot row; only the chosen one's step is solved for."""
    groups = _slot_groups(data, statistics, log_total)
    if step == "closed_form":
        first = _weak_learners(data, [jnp.sum(masses * values, axis=-1) for masses, values, _ in groups])
        delta, gain = _closed_form_steps(first, *_ranges(data))
        feature = _argmin(gain)
        return feature, delta[feature], gain[feature]
    # Each group's best row, then the best of those (ties: the lowest weak learner, as one argmin would).
    best = []
    for index, group in enumerate(groups):
        if group[0].shape[0] == 0:  # e.g. no feature occurs at most twice in a sequence
            continue
        gains = _gains(*group)
        row = _argmin(gains)
        best.append((gains[row], _group_weak_learner(data, index, row)))
    gain, feature = best[0]
    for candidate_gain, candidate in best[1:]:
        better = (candidate_gain < gain) | ((candidate_gain == gain) & (candidate < feature))
        gain, feature = jnp.where(better, candidate_gain, gain), jnp.where(better, candidate, feature)
    masses, values = _weak_learner_row(data, statistics, log_total, feature)
    return feature, _newton_steps(masses[None], values)[0], gain


def round_bounds(data: AnyBoostingData, statistics, log_total, step: str = "line_search"):
    """`(delta [K], bound [K])`: every weak learner's step and its bound on
    `Z_k(delta)`, from the layout's statistics at the current weights and
    `log_total [] = log sum_i (1 / P_i - 1)` (what a round chooses from)."""
    _check_step(step)
    groups = _slot_groups(data, statistics, log_total)
    if step == "closed_form":
        first = _weak_learners(data, [jnp.sum(masses * values, axis=-1) for masses, values, _ in groups])
        delta, gain = _closed_form_steps(first, *_ranges(data))
        return delta, 1.0 + gain
    steps = [_newton_steps(masses, values) for masses, values, _ in groups]
    gains = [
        _gains(masses, values, two_point, None if two_point else delta)
        for (masses, values, two_point), delta in zip(groups, steps)
    ]
    return _weak_learners(data, steps), 1.0 + _weak_learners(data, gains)


def _round(data, potentials_fn, state: BoostingState, index, step: str, tol: float, refresh_every: int):
    """One round: choose `k`, move `theta_k`, update the statistics and the stop rule."""
    feature, delta, gain = _choose(data, state.statistics, state.log_exp_loss, step)
    theta = state.theta.at[feature].add(delta)
    statistics = _updated_statistics(data, potentials_fn, state.statistics, state.theta, theta, feature, refresh_every)
    log_total = log_exp_loss(statistics.log_losses)
    window = state.recent.shape[0]
    slot = index % window
    # The exp-loss fell by at most tol (relatively) over the last `window` rounds.
    flat = state.recent[slot] - log_total <= jnp.log1p(tol)
    converged = ((tol > 0) & flat) | (gain >= 0)
    history = BoostingHistory(
        state.history.feature.at[index].set(feature),
        state.history.step.at[index].set(delta),
        state.history.bound.at[index].set(1.0 + gain),
    )
    return BoostingState(theta, statistics, log_total, state.recent.at[slot].set(log_total), converged, history)


def boosting_init(
    data: AnyBoostingData,
    potentials_fn: Callable | None = None,
    *,
    max_steps: int,
    window: int = 100,
    theta=None,
    dtype=None,
) -> BoostingState:
    """The state before the first round, from `theta` (default zeros `[K]`).

    max_steps: the round cap (the history's length); window: rounds of the
    stop rule; dtype: of theta (default the layout's: its ranges' dtype).
    """
    _check_data(data)
    _check_potentials_fn(data, potentials_fn)
    max_steps = check_int("max_steps", max_steps)
    window = check_int("window", window)
    K = num_weak_learners(data)
    dtype = data.lowest.dtype if dtype is None else dtype
    theta = jnp.zeros((K,), dtype) if theta is None else jnp.asarray(theta, dtype)
    if theta.shape != (K,):
        raise ValueError(f"theta must have shape [K] = {(K,)} (the weak learners of data), got {theta.shape}")
    statistics = _statistics(data, potentials_fn, theta)
    history = BoostingHistory(
        jnp.full((max_steps,), -1, jnp.int32), jnp.zeros((max_steps,), dtype), jnp.full((max_steps,), jnp.nan, dtype)
    )
    return BoostingState(
        theta,
        statistics,
        log_exp_loss(statistics.log_losses),
        jnp.full((window,), jnp.inf, dtype),
        jnp.zeros((), bool),
        history,
    )


def sequence_boosting_step_fn(
    data: AnyBoostingData,
    potentials_fn: Callable | None = None,
    *,
    step: str = "line_search",
    tol: float = 0.0,
    refresh_every: int = 100,
) -> Callable:
    """The `step_fn` of one boosting round for `minimize.run_loop`; the
    objective recorded is the log exp-loss after the round. Stop the loop
    with `halt_fn=boosting_converged` (it never stops when `tol = 0`, except
    when no weak learner lowers the bound).

    potentials_fn: the dense layout's model (None for `ChainBoostingData`);
    tol: relative fall of the exp-loss over the state's `window` rounds
    below which the run has converged; refresh_every: rounds between full
    passes of `ChainBoostingData` statistics (1: every round).
    """
    _check_data(data)
    _check_potentials_fn(data, potentials_fn)
    _check_step(step)
    check_scalar("tol", tol, 0)
    refresh_every = check_int("refresh_every", refresh_every)

    def step_fn(state: BoostingState, index):
        state = _round(data, potentials_fn, state, index, step, tol, refresh_every)
        return state, state.log_exp_loss

    return step_fn


def boosting_converged(state: BoostingState, value) -> jax.Array:
    """`run_loop`'s `halt_fn` for boosting: the round's stop rule fired."""
    return state.converged


def sequence_exp_loss(potentials_fn: Callable, theta, data: SequenceData) -> jax.Array:
    """`sum_i 1 / P(y_i | x_i) - 1` (`lossfns.losses.sequence_exp_loss`), `[]`."""
    per_sequence = jax.vmap(lambda x, y, n: losses.sequence_exp_loss(potentials_fn(theta, x), y, n))
    return jnp.sum(per_sequence(data.inputs, data.labels, data.lengths))


def sequence_boosting(
    potentials_fn: Callable,
    data: SequenceData,
    num_features: int,
    *,
    max_steps: int,
    step: str = "line_search",
    tol: float = 0.0,
    window: int = 10,
    dtype=None,
) -> Result:
    """Boost any linear model from `theta = 0` for up to `max_steps` rounds
    (dense layout; jit-able).

    potentials_fn: `(theta [K], inputs_i) -> potentials` of one sequence, linear in theta;
    dtype: of theta (default JAX's float: float32, float64 in 64-bit mode).
    Returns a `Result`: `params` theta `[K]` (`jnp.sum(theta != 0)` features
    used), `state` the `BoostingState` (`state.history`: the chosen
    features, steps and bounds), `trace` the log exp-loss after each round.
    """
    check_callable("potentials_fn", potentials_fn)
    check_sequence_data(data)
    check_int("num_features", num_features)
    check_int("max_steps", max_steps)
    _check_step(step)
    dense = boosting_data(potentials_fn, data, num_features, dtype)
    state = boosting_init(dense, potentials_fn, max_steps=max_steps, window=window)
    loop = run_loop(
        sequence_boosting_step_fn(dense, potentials_fn, step=step, tol=tol),
        init_loop(state, max_steps, state.theta.dtype),
        max_steps,
        relative_change_below(0.0),
        boosting_converged,
    )
    return loop_result(loop, loop.inner.theta)


# ---------------------------------------------------------------------------
# Through the driver
# ---------------------------------------------------------------------------


class BoostingSteps(NamedTuple):
    """`drive`'s `make_step` for boosting: `data -> sequence_boosting_step_fn(data, ...)`.
    A value, so runs with equal settings share a compiled chunk."""

    potentials_fn: Callable | None
    step: str
    tol: float
    refresh_every: int

    def __call__(self, data):
        return sequence_boosting_step_fn(
            data, self.potentials_fn, step=self.step, tol=self.tol, refresh_every=self.refresh_every
        )


class _Theta(NamedTuple):
    """`Evaluation`'s score and keep for boosting: `evaluate(theta, round)`, `theta`."""

    evaluate: Callable

    def __call__(self, state: BoostingState, index: int) -> float:
        return self.evaluate(state.theta, index)


def _theta(state: BoostingState):
    return state.theta


def boost(
    data: AnyBoostingData,
    potentials_fn: Callable | None = None,
    *,
    max_steps: int,
    step: str = "line_search",
    tol: float = 1e-4,
    window: int = 100,
    refresh_every: int = 100,
    chunk_rounds: int = 100,
    evaluate: Callable | None = None,
    eval_every: int = 100,
    patience: int | None = None,
    min_improvement: float = 0.0,
    until: int | None = None,
    checkpoint_dir=None,
    progress: bool = False,
) -> Result:
    """Run sequence boosting from `theta = 0` until a stop rule fires,
    through the driver (`optimizers.drive`), in jitted chunks of rounds.

    Stops when the exp-loss fell by at most a relative `tol` over the last
    `window` rounds, when no weak learner lowers the bound, when
    `evaluate(theta, round) -> score` (higher is better, called every
    `eval_every` rounds and at the end) has not improved by more than
    `min_improvement` for `patience` evaluations in a row (a development
    plateau; None: never), or after `max_steps` rounds (a safety cap).
    `until` pauses after that many rounds in total. With `checkpoint_dir`,
    the state is written atomically after every chunk (one writer per
    directory) and a run started again with the same data and settings
    resumes from it, bit-identically.

    Returns a `Result`: `params` `[K]` the weights of the best evaluation
    (the final ones without `evaluate`); `state` the `BoostingState`
    (`state.theta` the final weights, `state.history` feature, step and bound
    per round); `trace` the log exp-loss per round; `status` `CONVERGED`
    for a stop rule, `ITERATION_LIMIT` for the cap or a pause
    (`boosting_stopped_by` says which); `records["evaluations"]` `[E, 2]`
    numpy (round, score) with `evaluate`; `compile_seconds` the statistics
    at the start and compiling the rounds; `run_seconds` the rounds, over
    all resumed runs (evaluations excluded).
    """
    _check_data(data)
    _check_potentials_fn(data, potentials_fn)
    _check_step(step)
    max_steps = check_int("max_steps", max_steps)
    chunk_rounds = check_int("chunk_rounds", chunk_rounds)
    eval_every = check_int("eval_every", eval_every)
    check_scalar("tol", tol, 0)
    check_scalar("min_improvement", min_improvement, 0)
    refresh_every = check_int("refresh_every", refresh_every)
    if patience is not None:
        check_int("patience", patience)
    if evaluate is not None:
        check_callable("evaluate", evaluate)
    start = time.perf_counter()
    state = boosting_init(data, potentials_fn, max_steps=max_steps, window=window)
    jax.block_until_ready(state)
    setup_seconds = time.perf_counter() - start
    make_step = BoostingSteps(potentials_fn, step, float(tol), refresh_every)
    evaluation = None
    if evaluate is not None:
        evaluation = Evaluation(_Theta(evaluate), eval_every, patience, float(min_improvement), _theta)
    run = drive(
        make_step,
        init_loop(state, max_steps, state.theta.dtype),
        data,
        stop=relative_change_below(0.0),
        halt=boosting_converged,
        until=until,
        chunk_steps=chunk_rounds,
        checkpoint_dir=checkpoint_dir,
        settings=["boost", make_step, window, eval_every, patience, float(min_improvement)],
        progress=progress,
        evaluation=evaluation,
        description="boost",
    )
    records = run.records or {}
    return run._replace(
        params=jnp.asarray(records["best"]) if evaluation is not None else run.params.theta,
        state=run.params,
        compile_seconds=setup_seconds + run.compile_seconds,
        records={"evaluations": records["evaluations"]} if evaluation is not None else None,
    )


def boosting_stopped_by(result: Result) -> str:
    """Why a `boost` run stopped: "exp-loss converged", "no weak learner
    lowers the bound", "development plateau", "round cap", "non-finite
    exp-loss" or "paused" (`until` reached; run again to continue)."""
    state, steps = result.state, int(result.num_steps)
    if not bool(jnp.isfinite(state.log_exp_loss)):
        return "non-finite exp-loss"
    if bool(state.converged):
        gain = float(state.history.bound[steps - 1]) - 1.0 if steps else 0.0
        return "no weak learner lowers the bound" if gain >= 0 else "exp-loss converged"
    if int(result.status) == Status.CONVERGED:
        return "development plateau"
    return "round cap" if steps >= result.trace.shape[0] else "paused"
