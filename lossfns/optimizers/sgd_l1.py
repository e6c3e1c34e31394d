"""SGD with Tsuruoka et al.'s (2009) cumulative L1 penalty.

After each stochastic gradient step, each weight is clipped towards 0 by the
penalty it could have received so far (`u`) less what it got (`q_k`), never across
0, so weights that the noisy gradient keeps pushing around zero end exactly at zero.
`sgd_l1` is an optax `GradientTransformationExtraArgs` (rates may be optax
schedules), O(K) per step; `lazy_sgd_l1` touches only the rows a step's examples
use (the same trajectory when `l2 = 0`), and `flush` brings every weight up to
date. `lossfns.training.calibrate_learning_rate` picks a safe initial rate.
Design notes: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from ..validation import check_float_params, check_int, check_scalar
from .owlqn import check_penalties, penalised_vector


class SgdL1State(NamedTuple):
    """count: `[]` int32 steps; total_penalty: `[]` u; applied_penalty: `[n]`
    q (flattened params), signed: the sum of the clipping changes."""

    count: jax.Array
    total_penalty: jax.Array
    applied_penalty: jax.Array


def cumulative_l1_clip(weights, total_penalty, applied_penalty, penalised):
    """Tsuruoka's clipping of `weights [n]` after a gradient step.

    Returns `(weights, applied_penalty)`: positive weights become
    `max(0, w - (u + q))`, negative ones `min(0, w + (u - q))`, and `q`
    accumulates the change; coordinates with `penalised == 0` are untouched.
    """
    clipped = jnp.where(
        weights > 0,
        jnp.maximum(0.0, weights - (total_penalty + applied_penalty)),
        jnp.where(weights < 0, jnp.minimum(0.0, weights + (total_penalty - applied_penalty)), weights),
    )
    clipped = jnp.where(penalised > 0, clipped, weights)
    return clipped, applied_penalty + (clipped - weights)


def _checked_schedule(learning_rate, l1: float, l2: float) -> Callable:
    """The penalties checked and the learning rate as an optax schedule."""
    check_penalties(l1, l2)
    if not callable(learning_rate):
        check_scalar("learning_rate", learning_rate, 0, low_open=True)
    return learning_rate if callable(learning_rate) else optax.constant_schedule(learning_rate)


def sgd_l1(learning_rate, l1: float, l2: float = 0.0, *, mask=None) -> optax.GradientTransformationExtraArgs:
    """SGD on `f + l1 ||theta||_1 + l2/2 ||theta||^2` with the cumulative L1 penalty.

    Args:
      learning_rate: a float or an optax schedule `step -> rate`.
      l1, l2: penalty weights, on the same scale as the gradients passed to
        `update` (for a summed corpus loss, minibatch gradients scaled by
        `N / batch_size`, as `minimize_stochastic` does).
      mask: which coordinates are penalised (True), as in `owlqn`; `None`: all.
    """
    schedule = _checked_schedule(learning_rate, l1, l2)

    def init(params):
        check_float_params(params)
        flat, _ = ravel_pytree(params)
        return SgdL1State(jnp.zeros((), jnp.int32), jnp.zeros((), flat.dtype), jnp.zeros_like(flat))

    def update(grads, state, params=None, **extra_args):
        del extra_args
        if params is None:
            raise ValueError("sgd_l1.update needs params")
        theta, unravel = ravel_pytree(params)
        gradient, _ = ravel_pytree(grads)
        penalised = penalised_vector(params, mask)
        rate = jnp.asarray(schedule(state.count), theta.dtype)
        stepped = theta - rate * (gradient + l2 * penalised * theta)
        total_penalty = state.total_penalty + rate * l1
        clipped, applied = cumulative_l1_clip(stepped, total_penalty, state.applied_penalty, penalised)
        return unravel(clipped - theta), SgdL1State(state.count + 1, total_penalty, applied)

    return optax.GradientTransformationExtraArgs(init, update)  # pyright: ignore[reportArgumentType]  # optax's update protocol


class LazySgdL1State(NamedTuple):
    """count: `[]` int32 steps; total_penalty: `[]` u; applied_penalty: q,
    a pytree shaped like the params (signed sum of each weight's clipping
    changes, up to date only for rows touched since the last `flush`)."""

    count: jax.Array
    total_penalty: jax.Array
    applied_penalty: object


class LazySgdL1(NamedTuple):
    """`lazy_sgd_l1`'s functions (an optax-shaped state machine whose
    updates are sparse, so it returns new params rather than dense updates).

    init: `params -> LazySgdL1State` (over the floating-point leaves of
      `params`; a model's bool masks get no state);
    catch_up: `(state, params, rows, masks=None) -> (params, state)`, the
      rows `rows` (a pytree shaped like `params`, each leaf `[R]` int row
      indices of the leaf's first axis, distinct; out-of-range indices are
      padding) clipped up to the current penalty total: the weights the
      step's gradient must be taken at;
    update: `(row_grads, state, params, rows, masks=None) -> (params,
      state)`, one step on caught-up rows with `row_grads` (each leaf `[R,
      ...]`, the gradient rows at the caught-up weights);
    flush: `(state, params, masks=None) -> (params, state)`, every weight
      caught up (the exact weights of the algorithm).
    masks: None, or a pytree shaped like `params` whose leaves are bool
    arrays of the leaf's whole shape (True: the weight exists) or None (all
    exist): a weight outside its mask is set to 0 and left there, never
    penalised (its `q` does not move).
    """

    init: Callable
    catch_up: Callable
    update: Callable
    flush: Callable


def lazy_sgd_l1(learning_rate, l1: float, l2: float = 0.0) -> LazySgdL1:
    """SGD on `f + l1 ||theta||_1 + l2/2 ||theta||^2` with the cumulative L1
    penalty applied lazily to the rows each step touches (module docstring).

    Args:
      learning_rate: a float or an optax schedule `step -> rate`.
      l1, l2: penalty weights, on the scale of the gradients (as `sgd_l1`);
        every weight is penalised.
    """
    schedule = _checked_schedule(learning_rate, l1, l2)

    def init(params):
        params = eqx.filter(params, eqx.is_inexact_array)
        check_float_params(params)
        dtype = jnp.result_type(*jax.tree_util.tree_leaves(params))
        return LazySgdL1State(
            jnp.zeros((), jnp.int32), jnp.zeros((), dtype), jax.tree_util.tree_map(jnp.zeros_like, params)
        )

    def catch_up(state, params, rows, masks=None):
        clip = lambda w, q, exists: _masked_clip(w, state.total_penalty, q, exists)
        params, applied = _rows_map(params, state.applied_penalty, rows, None, clip, masks)
        return params, state._replace(applied_penalty=applied)

    def update(row_grads, state, params, rows, masks=None):
        rate = jnp.asarray(schedule(state.count), state.total_penalty.dtype)
        total_penalty = state.total_penalty + rate * l1

        def step(weights, applied, exists, gradient):
            stepped = weights - rate.astype(weights.dtype) * (gradient.astype(weights.dtype) + l2 * weights)
            return _masked_clip(stepped, total_penalty, applied, exists)

        params, applied = _rows_map(params, state.applied_penalty, rows, row_grads, step, masks)
        return params, LazySgdL1State(state.count + 1, total_penalty, applied)

    def flush(state, params, masks=None):
        structure = jax.tree_util.tree_structure(params)
        masks = [None] * structure.num_leaves if masks is None else structure.flatten_up_to(masks)
        pairs = [
            _masked_clip(w, state.total_penalty, q, exists)
            for w, q, exists in zip(
                structure.flatten_up_to(params), structure.flatten_up_to(state.applied_penalty), masks
            )
        ]
        params, applied = (structure.unflatten([pair[i] for pair in pairs]) for i in (0, 1))
        return params, state._replace(applied_penalty=applied)

    return LazySgdL1(init, catch_up, update, flush)


def take_rows(params, rows):
    """The rows `rows` (pytree of `[R]` indices shaped like `params`) of every
    leaf of `params`, `[R, ...]`; zeros for out-of-range (padding) indices."""
    return jax.tree_util.tree_map(_take, params, rows)


def _take(table, index):
    if table.shape[0] == 0:  # e.g. no pair features: XLA cannot gather from an empty table
        return jnp.zeros(index.shape + table.shape[1:], table.dtype)
    return table.at[index].get(mode="fill", fill_value=0)


def _put(table, index, rows):
    return table if table.shape[0] == 0 else table.at[index].set(rows, mode="drop")


def _masked_clip(weights, total_penalty, applied_penalty, exists):
    """`cumulative_l1_clip` on the weights that exist (`exists`: bool of
    their shape, or None: all); the others become 0 and keep their `q`."""
    if exists is None:
        return cumulative_l1_clip(weights, total_penalty, applied_penalty, 1.0)
    clipped, applied = cumulative_l1_clip(weights, total_penalty, applied_penalty, exists)
    return jnp.where(exists, clipped, 0.0), applied


def _rows_map(params, applied, rows, extra, step, masks=None):
    """`step(weights [R, ...], q [R, ...], exists [R, ...] bool or None,
    [extra leaf]) -> (weights, q)` applied to the rows `rows` of every leaf
    of `params`, `applied` and `masks` (None: every weight exists), scattered
    back (padding rows dropped). Returns `(params, applied)`."""

    def leaf(table, applied, index, mask, *extra):
        exists = None if mask is None else _take(mask, index)
        weights, row_applied = step(_take(table, index), _take(applied, index), exists, *extra)
        return _put(table, index, weights), _put(applied, index, row_applied)

    structure = jax.tree_util.tree_structure(params)
    masks = [None] * structure.num_leaves if masks is None else structure.flatten_up_to(masks)
    parts = [structure.flatten_up_to(params), structure.flatten_up_to(applied), structure.flatten_up_to(rows), masks]
    if extra is not None:
        parts.append(structure.flatten_up_to(extra))
    leaves = [leaf(*args) for args in zip(*parts)]
    return structure.unflatten([w for w, _ in leaves]), structure.unflatten([q for _, q in leaves])


def decaying_schedule(initial_rate, steps_per_epoch: int, decay_per_epoch: float = 0.85):
    """Tsuruoka et al.'s exponential decay `eta_0 * decay ** (step / steps_per_epoch)`."""
    check_scalar("initial_rate", initial_rate, 0, low_open=True)
    check_int("steps_per_epoch", steps_per_epoch)
    check_scalar("decay_per_epoch", decay_per_epoch, 0, 1, low_open=True)
    return optax.exponential_decay(initial_rate, transition_steps=steps_per_epoch, decay_rate=decay_per_epoch)
