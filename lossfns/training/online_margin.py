"""CRFsuite's passive-aggressive (`pa`) and AROW (`arow`) trainers, beside the perceptron.

For each training sequence in turn: Viterbi-decode `yhat`; when it differs
from the gold `y` in `d > 0` positions, move the parameters along
`delta = S(x, y) - S(x, yhat)` by a step set by the cost `s(x, yhat) - s(x, y)
+ sqrt(d)` (pa; `+ 1` unless error-sensitive) or `+ d` (arow). As in `perceptron`, the model is any
`potentials_fn(params, inputs)` linear in `params`, so `delta` is minus the
gradient of the perceptron loss (autodiff). One loop step is one epoch; its
objective is CRFsuite's summed cost of the epoch, read by `MeanLossBelow`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..lattices import chain
from ..optimizers.minimize import (
    LoopState,
    Result,
    float_dtype,
    halt_on_failure,
    init_loop,
    loop_result,
    num_examples,
    run_loop,
)
from ..validation import check_callable
from .perceptron import SequenceData, check_sequence_data

_tree_map = jax.tree_util.tree_map


class PassiveAggressiveState(NamedTuple):
    """params: current parameters `w`; weighted_updates: `sum_t t * update_t`
    over the examples seen, `t` counting from 1 (CRFsuite's `ws`); count:
    `[]` int32, 1 + examples seen (CRFsuite's `u`); key: PRNG key shuffling
    each epoch, or None for corpus order."""

    params: object
    weighted_updates: object
    count: jax.Array
    key: jax.Array | None


class ArowState(NamedTuple):
    """params: the mean of the weights; variance: the diagonal covariance,
    a pytree like `params`; key: PRNG key shuffling each epoch, or None for
    corpus order."""

    params: object
    variance: object
    key: jax.Array | None


class MeanLossBelow(NamedTuple):
    """CRFsuite's stop rule of pa and arow on the trace of summed costs per
    epoch: the last epoch's mean cost `trace[k - 1] / num_examples` is below
    `epsilon` (`<`, pa's test: `epsilon = 0` never stops) or, with
    `inclusive`, at most `epsilon` (`<=`, arow's test: `epsilon = 0` stops
    after an epoch without mistakes)."""

    epsilon: float
    num_examples: int
    inclusive: bool = False

    def __call__(self, trace, step):
        mean = trace[step - 1] / self.num_examples
        return mean <= self.epsilon if self.inclusive else mean < self.epsilon


def check_positive(name: str, value) -> float:
    """`value` as a float, else a ValueError naming `name` unless it is finite and > 0."""
    value = float(value)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def pa_init(params, key=None) -> PassiveAggressiveState:
    """The passive-aggressive state before the first epoch: `params`, no
    updates, count 1; `key` (optional) shuffles every epoch."""
    return PassiveAggressiveState(params, _tree_map(jnp.zeros_like, params), jnp.ones((), jnp.int32), key)


def pa_params(state: PassiveAggressiveState, *, averaging: bool = True):
    """The trained parameters: with `averaging`, CRFsuite's average
    `w - weighted_updates / count`, the mean of the parameters before the
    first example and after every example seen; else the current ones."""
    if not averaging:
        return state.params
    count = state.count.astype(float_dtype(state.params))
    return _tree_map(lambda w, ws: w - ws / count, state.params, state.weighted_updates)


def arow_init(params, variance: float = 1.0, key=None) -> ArowState:
    """The AROW state before the first epoch: mean `params`, every weight's
    variance `variance` (> 0); `key` (optional) shuffles every epoch."""
    variance = check_positive("variance", variance)
    return ArowState(params, _tree_map(lambda w: jnp.full_like(w, variance), params), key)


def arow_params(state: ArowState):
    """The trained parameters: the mean (CRFsuite's AROW does not average)."""
    return state.params


def margin_terms(potentials_fn: Callable, params, inputs, labels, length):
    """`(excess [], wrong [] int32, gradient)` for one sequence (`labels [T]`,
    `length []`): `excess = s(x, yhat) - s(x, y) >= 0` for the Viterbi path
    `yhat`, `wrong` the positions inside `length` where `yhat` differs from
    `labels`, and `gradient = S(x, yhat) - S(x, y)` (a pytree like `params`).
    """

    def excess(p):
        potentials = potentials_fn(p, inputs)
        _, decoded = chain.viterbi(potentials, length)
        # Scored at the decoded labels so the derivative is one path's features, not a max's.
        path = chain.score(potentials, jnp.maximum(decoded, 0), length)
        return path - chain.score(potentials, labels, length), decoded

    (value, decoded), gradient = jax.value_and_grad(excess, has_aux=True)(params)
    inside = jnp.arange(jnp.shape(labels)[-1]) < length
    return value, jnp.sum(inside & (decoded != labels), dtype=jnp.int32), gradient


def _total(tree) -> jax.Array:
    """The sum of every element of every leaf of `tree`."""
    return jnp.asarray(sum((jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(tree)), 0.0))


def epoch_order(key, step, total: int) -> jax.Array:
    """`[total]` int: the examples' order in epoch `step`, shuffled by `key`
    (corpus order when None). It depends only on the step, so a resumed run
    replays the same epochs."""
    return jnp.arange(total) if key is None else jax.random.permutation(jax.random.fold_in(key, step), total)


def _epoch_fn(data: SequenceData, update: Callable) -> Callable:
    """One epoch of `update(state, inputs, labels, length) -> (state, cost)`
    over `data`, in the order of `state.key` (corpus order without one);
    objective: the summed cost."""
    total = num_examples(data)

    def step_fn(state, step):
        order = epoch_order(state.key, step, total)

        def example(index, carry):
            state, loss = carry
            row = order[index]
            inputs = _tree_map(lambda x: x[row], data.inputs)
            state, cost = update(state, inputs, data.labels[row], data.lengths[row])
            return state, loss + cost.astype(loss.dtype)  # the potentials may be wider than the params

        return jax.lax.fori_loop(0, total, example, (state, jnp.zeros((), float_dtype(state.params))))

    return step_fn


def pa_epoch_fn(
    potentials_fn: Callable, data: SequenceData, *, pa_type: int = 1, c: float = 1.0, error_sensitive: bool = True
) -> Callable:
    """The `step_fn` of one passive-aggressive epoch over `data` (CRFsuite's
    `crfsuite_train_passive_aggressive`); objective: the summed cost.

    potentials_fn: `(params, inputs_i) -> potentials` of one sequence
      (`[T, L, L]` or `FactoredPotentials`), linear in `params`.
    For a sequence decoded with `d > 0` wrong labels, cost `= excess +
    sqrt(d)` (`error_sensitive`) or `excess + 1`, and with `n = ||delta||^2`
    the step `tau` is `cost / n` (`pa_type` 0), `min(c, cost / n)` (1) or
    `cost / (n + 1 / (2 c))` (2); `params += tau * delta`.
    """
    check_callable("potentials_fn", potentials_fn)
    check_sequence_data(data)
    if pa_type not in (0, 1, 2) or isinstance(pa_type, bool):
        raise ValueError(f"pa_type must be 0, 1 or 2, got {pa_type!r}")
    c = check_positive("c", c)

    def update(state: PassiveAggressiveState, inputs, labels, length):
        excess, wrong, gradient = margin_terms(potentials_fn, state.params, inputs, labels, length)
        cost = excess + (jnp.sqrt(wrong.astype(excess.dtype)) if error_sensitive else 1.0)
        norm = _total(_tree_map(jnp.square, gradient))
        # A zero feature difference cannot move the weights; this avoids cost / 0 (NaN weights in CRFsuite).
        safe = jnp.where(norm > 0, norm, 1.0)
        if pa_type == 0:
            tau = cost / safe
        elif pa_type == 1:
            tau = jnp.minimum(c, cost / safe)
        else:
            tau = cost / (norm + 0.5 / c)
        tau = jnp.where((wrong > 0) & (norm > 0), tau, 0.0)
        # Steps along delta = -gradient; the averaging sum weighs this one by its index (CRFsuite's u).
        step = tau * state.count.astype(tau.dtype)
        params = _tree_map(lambda w, g: w - (tau * g).astype(w.dtype), state.params, gradient)
        weighted = _tree_map(lambda ws, g: ws - (step * g).astype(ws.dtype), state.weighted_updates, gradient)
        state = PassiveAggressiveState(params, weighted, state.count + 1, state.key)
        return state, jnp.where(wrong > 0, cost, 0.0)

    return _epoch_fn(data, update)


def arow_epoch_fn(potentials_fn: Callable, data: SequenceData, *, gamma: float = 1.0) -> Callable:
    """The `step_fn` of one AROW epoch over `data` (CRFsuite's
    `crfsuite_train_arow`); objective: the summed cost.

    potentials_fn: as in `pa_epoch_fn`. For a sequence decoded with `d > 0`
    wrong labels, cost `= excess + d`, `alpha = cost / (gamma + sum_k
    variance_k delta_k^2)`; `mean += alpha * variance * delta`, then
    `variance = 1 / (1 / variance + delta^2 / gamma)` elementwise.
    """
    check_callable("potentials_fn", potentials_fn)
    check_sequence_data(data)
    gamma = check_positive("gamma", gamma)

    def update(state: ArowState, inputs, labels, length):
        excess, wrong, gradient = margin_terms(potentials_fn, state.params, inputs, labels, length)
        cost = excess + wrong.astype(excess.dtype)
        squares = _tree_map(jnp.square, gradient)
        spread = _total(_tree_map(jnp.multiply, squares, state.variance))
        alpha = jnp.where(wrong > 0, cost / (gamma + spread), 0.0)
        # Steps along delta = -gradient.
        params = _tree_map(lambda w, v, g: w - (alpha * v * g).astype(w.dtype), state.params, state.variance, gradient)
        # 1 / (1/v + s/gamma), written so that a weight off the difference (s = 0) keeps v exactly.
        variance = _tree_map(lambda v, s: jnp.where(wrong > 0, v / (1.0 + v * s / gamma), v), state.variance, squares)
        return ArowState(params, variance, state.key), jnp.where(wrong > 0, cost, 0.0)

    return _epoch_fn(data, update)


def passive_aggressive(
    potentials_fn: Callable,
    params,
    data: SequenceData,
    *,
    pa_type: int = 1,
    c: float = 1.0,
    error_sensitive: bool = True,
    averaging: bool = True,
    max_steps: int = 100,
    epsilon: float = 0.0,
    key=None,
) -> Result:
    """Train by passive-aggressive for up to `max_steps` epochs, stopping
    when an epoch's mean cost is below `epsilon` (CRFsuite's defaults). Jit-able.

    Returns a `Result`: `params` the averaged (or last) parameters, `state`
    the `PassiveAggressiveState`, `trace` `[max_steps]` the summed cost per epoch.
    """
    loop: LoopState = init_loop(pa_init(params, key), max_steps, float_dtype(params))
    step_fn = pa_epoch_fn(potentials_fn, data, pa_type=pa_type, c=c, error_sensitive=error_sensitive)
    loop = run_loop(step_fn, loop, max_steps, MeanLossBelow(epsilon, num_examples(data)), halt_on_failure)
    return loop_result(loop, pa_params(loop.inner, averaging=averaging))


def arow(
    potentials_fn: Callable,
    params,
    data: SequenceData,
    *,
    variance: float = 1.0,
    gamma: float = 1.0,
    max_steps: int = 100,
    epsilon: float = 0.0,
    key=None,
) -> Result:
    """Train by AROW for up to `max_steps` epochs, stopping when an
    epoch's mean cost is at most `epsilon` (CRFsuite's defaults). Jit-able.

    Returns a `Result`: `params` the mean parameters, `state` the
    `ArowState`, `trace` `[max_steps]` the summed cost per epoch.
    """
    loop: LoopState = init_loop(arow_init(params, variance, key), max_steps, float_dtype(params))
    step_fn = arow_epoch_fn(potentials_fn, data, gamma=gamma)
    stop = MeanLossBelow(epsilon, num_examples(data), inclusive=True)
    loop = run_loop(step_fn, loop, max_steps, stop, halt_on_failure)
    return loop_result(loop, arow_params(loop.inner))
