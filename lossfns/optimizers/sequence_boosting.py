"""Sequence boosting (Altun, Hofmann & Johnson 2002; MATH.md section 3).

Boosting of a linear-chain model with the sequential exponential loss
`sum_i 1 / P(y_i | x_i) - 1`: each round picks one feature `k` and a step
`delta` by minimising a convex upper bound of the round objective

    Z_k(delta) = sum_i D(i) sum_{y != y_i} pi_i(y) exp(delta u_ik(y)),

the factor by which the exponential loss shrinks. The bound uses the ranges
`[u_ik_min, u_ik_max]` of `u_ik(y) = S_k(x_i, y) - S_k(x_i, y_i)` and
`r_ik = sum_y pi_i(y) (u_ik_max - u_ik(y)) / (u_ik_max - u_ik_min)`, which is
linear in the expectation `E_pi[u_ik]`: one forward-backward per sequence
scores every feature. `step="line_search"` minimises the per-sequence
bound (vectorised Newton over features); `step="closed_form"` uses the
looser global-range bound and its closed-form step.

The model is any `potentials_fn(theta, inputs_i)` linear in `theta [K]`.
The ranges are taken over all label sequences (including `y_i`, where
`u = 0`), found by Viterbi on each feature's own potentials: a superset of
the range over `y != y_i`, so the bound stays valid (slightly looser). This
costs `K` Viterbi runs per sequence once, at setup.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from .. import losses
from ..lattices import chain
from .minimize import check_callable, check_int, init_loop, relative_change_below, run_loop
from .perceptron import SequenceData, check_sequence_data
from .scalar_newton import newton_minimize

STEPS = ("line_search", "closed_form")


class BoostingStatistics(NamedTuple):
    """Per-sequence constants: gold: `[N, K]` `S(x_i, y_i)`; lowest, highest:
    `[N, K]` the range of `u_ik` over label sequences (`<= 0`, `>= 0`)."""

    gold: jax.Array
    lowest: jax.Array
    highest: jax.Array


class BoostingState(NamedTuple):
    """theta: `[K]`; bound: `[]` the chosen bound of the last round (`Z_k <=
    bound`); feature: `[]` int32 the last feature chosen (-1 before any)."""

    theta: jax.Array
    bound: jax.Array
    feature: jax.Array


def _instance(data: SequenceData, index):
    return jax.tree_util.tree_map(lambda x: x[index], data.inputs), data.labels[index], data.lengths[index]


def boosting_statistics(potentials_fn: Callable, data: SequenceData, num_features: int, dtype) -> BoostingStatistics:
    """`S(x_i, y_i)` and the range of `u_ik` for every sequence and feature."""
    check_int("num_features", num_features)
    basis = jnp.eye(num_features, dtype=dtype)

    def one(inputs, labels, length):
        gold = jax.grad(lambda theta: chain.score(potentials_fn(theta, inputs), labels, length))(
            jnp.zeros((num_features,), dtype))
        best = lambda theta: chain.viterbi(potentials_fn(theta, inputs), length)[0]
        highest = jax.vmap(best)(basis)
        lowest = -jax.vmap(best)(-basis)
        return gold, lowest - gold, highest - gold

    gold, lowest, highest = jax.vmap(one)(data.inputs, data.labels, data.lengths)
    return BoostingStatistics(gold, lowest, highest)


def _log_losses(potentials_fn, theta, data):
    """`-log P(y_i | x_i)` `[N]` and its gradient `E_P[S(x_i, .)] - S(x_i, y_i)`
    `[N, K]`: one forward-backward per sequence."""
    def one(inputs, labels, length):
        return jax.value_and_grad(lambda t: losses.sequence_log_loss(potentials_fn(t, inputs), labels, length))(theta)

    return jax.vmap(one)(data.inputs, data.labels, data.lengths)


def sequence_exp_loss(potentials_fn: Callable, theta, data: SequenceData) -> jax.Array:
    """`sum_i 1 / P(y_i | x_i) - 1` (`lossfns.losses.sequence_exp_loss`), `[]`."""
    per_sequence = jax.vmap(lambda x, y, n: losses.sequence_exp_loss(potentials_fn(theta, x), y, n))
    return jnp.sum(per_sequence(data.inputs, data.labels, data.lengths))


def round_bounds(log_losses, excess, statistics: BoostingStatistics, step: str):
    """`(delta [K], bound [K])`: each feature's step and the bound on `Z_k(delta)`.

    log_losses: `[N]` `-log P(y_i | x_i)`; excess: `[N, K]` `E_P[S] - S(y_i)`.
    """
    weights = jnp.expm1(log_losses)  # 1 / P_i - 1
    total = jnp.sum(weights)
    distribution = weights / total  # D(i)
    # D(i) E_pi[u_ik] = (E_P[S_k] - S_k(y_i)) / P_i / total: no division by 1 - P_i.
    weighted_mean = excess * (jnp.exp(log_losses) / total)[:, None]
    if step == "line_search":
        lowest, highest = statistics.lowest, statistics.highest
    else:
        lowest = jnp.min(statistics.lowest, axis=0, keepdims=True)
        highest = jnp.max(statistics.highest, axis=0, keepdims=True)
    spread = highest - lowest
    safe_spread = jnp.where(spread > 0, spread, 1.0)
    # D(i) r_ik; a feature constant over label sequences has u = 0: all its mass on e^0.
    low_mass = jnp.where(spread > 0, (distribution[:, None] * highest - weighted_mean) / safe_spread,
                         distribution[:, None])
    high_mass = distribution[:, None] - low_mass
    if step == "closed_form":
        r = jnp.sum(low_mass, axis=0)
        low, high = lowest[0], highest[0]
        usable = (low < 0) & (high > 0) & (r > 0) & (r < 1)
        delta = jnp.where(usable, jnp.log(jnp.where(usable, -r * low / ((1 - r) * high), 1.0))
                          / jnp.where(usable, high - low, 1.0), 0.0)
        return delta, r * jnp.exp(delta * low) + (1 - r) * jnp.exp(delta * high)

    def bound(delta):
        return jnp.sum(low_mass * jnp.exp(delta * lowest) + high_mass * jnp.exp(delta * highest), axis=0)

    def derivatives(delta):
        low_terms, high_terms = low_mass * jnp.exp(delta * lowest), high_mass * jnp.exp(delta * highest)
        return (jnp.sum(low_terms * lowest + high_terms * highest, axis=0),
                jnp.sum(low_terms * lowest ** 2 + high_terms * highest ** 2, axis=0))

    delta = newton_minimize(derivatives, excess.shape[-1:], excess.dtype)
    return delta, bound(delta)


def _check_step(step) -> None:
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")


def sequence_boosting_step_fn(potentials_fn: Callable, data: SequenceData, statistics: BoostingStatistics,
                              step: str = "line_search") -> Callable:
    """The `step_fn` of one boosting round; objective: the exp-loss after it."""
    _check_step(step)

    def step_fn(state: BoostingState, index):
        log_losses, excess = _log_losses(potentials_fn, state.theta, data)
        delta, bound = round_bounds(log_losses, excess, statistics, step)
        feature = jnp.argmin(bound).astype(jnp.int32)
        theta = state.theta.at[feature].add(delta[feature])
        return BoostingState(theta, bound[feature], feature), sequence_exp_loss(potentials_fn, theta, data)

    return step_fn


def sequence_boosting(potentials_fn: Callable, data: SequenceData, num_features: int, *, num_rounds: int,
                      step: str = "line_search", tol: float = 0.0, dtype=jnp.float64):
    """Boost from `theta = 0` for up to `num_rounds` rounds. Jit-able.

    potentials_fn: `(theta [K], inputs_i) -> potentials` of one sequence, linear in theta.
    Returns `(theta [K], loop)`; `loop.trace` is the exp-loss after each round
    and `jnp.sum(theta != 0)` the number of features used.
    """
    check_callable("potentials_fn", potentials_fn)
    check_sequence_data(data)
    check_int("num_features", num_features)
    check_int("num_rounds", num_rounds)
    _check_step(step)
    relative_change_below(tol)
    statistics = boosting_statistics(potentials_fn, data, num_features, dtype)
    state = BoostingState(jnp.zeros((num_features,), dtype), jnp.ones((), dtype), -jnp.ones((), jnp.int32))
    loop = run_loop(sequence_boosting_step_fn(potentials_fn, data, statistics, step),
                    init_loop(state, num_rounds, dtype), num_rounds, relative_change_below(tol))
    return loop.inner.theta, loop
