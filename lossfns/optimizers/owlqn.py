"""OWL-QN (Andrew & Gao 2007): L-BFGS for `f(theta) + l1 ||theta||_1 + l2/2 ||theta||^2`.

The smooth part `f` is the user's function; the elastic net is handled here: the
orthant-wise pseudo-gradient replaces the gradient where the L1 term is not
differentiable, the L-BFGS memory holds differences of the smooth gradients only,
the direction is zeroed where its sign disagrees with `-pg`, and the line search
projects each trial point onto the current orthant. It is an optax
`GradientTransformationExtraArgs` called as `optax.lbfgs` is (`update(grads, state,
params, value=, grad=, value_fn=)`); with `value=None`, `update` evaluates `f`.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from .. import losses
from ..validation import as_mask, check_float_params, check_int, check_scalar
from .minimize import LINE_SEARCH_FAILED, NON_FINITE_OBJECTIVE


class OwlqnState(NamedTuple):
    """count: `[]` int32 updates done; params_diffs, grad_diffs: `[memory_size,
    n]` L-BFGS pairs (newest last, zeros when unused); value: `[]` f at the
    current params (`inf` before the first update); grad: `f`'s gradient
    there (the params' pytree structure); status: `[]` int32, 0 when the last
    update moved (or none was made), `minimize.NON_FINITE_OBJECTIVE` when the
    objective at its start was NaN or +-inf (no trial evaluated, params
    unchanged), `minimize.LINE_SEARCH_FAILED` when no trial was accepted;
    trials: `[]` int32, the trial points the last line search evaluated;
    step_size: `[]` the step it accepted along its direction (0 when none
    was), CRFsuite's (liblbfgs') "Line search trials" and "Line search step"."""

    count: jax.Array
    params_diffs: jax.Array
    grad_diffs: jax.Array
    value: jax.Array
    grad: optax.Params
    status: jax.Array
    trials: jax.Array
    step_size: jax.Array

    # `update(None, state, params, value_fn=f)` evaluates f itself (see `owlqn`).
    evaluates_objective = True


class _Search(NamedTuple):
    """One line search from `theta`: f's value, flat gradient and smooth
    gradient (f plus L2) there, the full objective, the pseudo-gradient,
    the projected direction, the orthant and the first step size."""

    value: jax.Array
    f_grad: jax.Array
    smooth_grad: jax.Array
    start_objective: jax.Array
    pg: jax.Array
    direction: jax.Array
    orthant: jax.Array
    step: jax.Array


def penalised_vector(params, mask) -> jax.Array:
    """`[n]` float vector over the flattened params: 1 where the penalty applies.

    mask: as in `lossfns.losses.elastic_net` (and `optax.masked`): `None`
    (all penalised), a pytree of bools with the params' structure or a
    prefix of it, or a callable `params -> such a pytree`; True = penalised.
    """
    flat, _ = ravel_pytree(params)
    if mask is None:
        return jnp.ones_like(flat)
    mask = as_mask(mask, params)
    spread = jax.tree_util.tree_map(
        lambda keep, subtree: jax.tree_util.tree_map(
            lambda x: jnp.broadcast_to(jnp.asarray(keep, flat.dtype), jnp.shape(x)), subtree
        ),
        mask,
        params,
    )
    return ravel_pytree(spread)[0]


def elastic_net_penalty(l1: float, l2: float = 0.0, mask=None):
    """`params -> l1 ||theta||_1 + l2/2 ||theta||^2` (`lossfns.losses.elastic_net`),
    the non-smooth part that `minimize(..., penalty=)` adds to its trace."""
    return lambda params: losses.elastic_net(params, l1, l2, mask=mask)


def pseudo_gradient(theta, smooth_grad, l1, weight):
    """Orthant-wise pseudo-gradient `[n]` of `f + l1 ||weight * theta||_1`.

    At `theta_k != 0` it is the gradient; at 0 it is the one-sided derivative
    that points downhill (`g + l1` if negative, `g - l1` if positive), or 0
    when 0 is optimal along that coordinate.
    """
    l1 = l1 * weight
    right, left = smooth_grad + l1, smooth_grad - l1
    at_zero = jnp.where(right < 0, right, jnp.where(left > 0, left, 0.0))
    return jnp.where(theta > 0, right, jnp.where(theta < 0, left, at_zero))


def _two_loop(direction, params_diffs, grad_diffs):
    """`H direction` by the L-BFGS two-loop recursion (newest pair last)."""
    curvature = jnp.sum(params_diffs * grad_diffs, axis=1)
    rho = jnp.where(curvature > 0, 1.0 / jnp.where(curvature > 0, curvature, 1.0), 0.0)

    def backward(q, pair):
        s, y, r = pair
        a = r * jnp.dot(s, q)
        return q - a * y, a

    q, alphas = jax.lax.scan(backward, direction, (params_diffs, grad_diffs, rho), reverse=True)
    newest_yy = jnp.dot(grad_diffs[-1], grad_diffs[-1])
    gamma = jnp.where(curvature[-1] > 0, curvature[-1] / jnp.where(newest_yy > 0, newest_yy, 1.0), 1.0)

    def forward(r, pair):
        s, y, rh, a = pair
        b = rh * jnp.dot(y, r)
        return r + s * (a - b), None

    r, _ = jax.lax.scan(forward, gamma * q, (params_diffs, grad_diffs, rho, alphas))
    return r


def push_pair(params_diffs, grad_diffs, s, y):
    """Append `(s, y)` as the newest pair if its curvature `s . y` is positive."""
    keep = jnp.dot(s, y) > jnp.finfo(s.dtype).eps * jnp.dot(y, y)
    new_s = jnp.concatenate([params_diffs[1:], s[None]])
    new_y = jnp.concatenate([grad_diffs[1:], y[None]])
    return jnp.where(keep, new_s, params_diffs), jnp.where(keep, new_y, grad_diffs)


def check_penalties(l1, l2) -> None:
    """Reject negative penalty weights when they are concrete (they may be traced)."""
    check_scalar("l1", l1, 0)
    check_scalar("l2", l2, 0)


@functools.partial(jax.jit, static_argnums=1)  # one program, where its steps outside `jit` would run one each
def _initial_state(params, memory_size: int) -> OwlqnState:
    """OWL-QN's state before its first step: empty memory `[memory_size, n]`."""
    flat, _ = ravel_pytree(params)
    memory = jnp.zeros((memory_size,) + flat.shape, flat.dtype)
    return OwlqnState(
        jnp.zeros((), jnp.int32),
        memory,
        memory,
        jnp.asarray(jnp.inf, flat.dtype),
        jax.tree_util.tree_map(jnp.zeros_like, params),
        jnp.zeros((), jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.zeros((), flat.dtype),
    )


def owlqn(
    l1: float,
    l2: float = 0.0,
    *,
    memory_size: int = 5,
    mask=None,
    max_linesearch_steps: int = 30,
    decrease_factor: float = 1e-4,
    shrink: float = 0.5,
) -> optax.GradientTransformationExtraArgs:
    """OWL-QN for `f(theta) + l1 ||theta||_1 + l2/2 ||theta||^2`.

    Args:
      l1, l2: penalty weights (>= 0); `l1 = 0` is L-BFGS with an Armijo search.
      memory_size: number of L-BFGS pairs (5 in Lavergne et al.).
      mask: which coordinates are penalised (True), as in
        `lossfns.losses.elastic_net`; e.g. `{"weights": True, "bias": False}`
        leaves intercepts free of both penalties. `None`: all penalised.
      max_linesearch_steps, decrease_factor, shrink: backtracking search:
        accept the first trial with `F(x) <= F(theta) + decrease_factor *
        pg . (x - theta)`, else multiply the step by `shrink`. When all fail
        the parameters are left unchanged (a converged or stalled run).

    `update(grads, state, params, *, value, grad, value_fn)`: `grads` (and
    `grad`, `value`) are `f`'s at `params`; `value_fn` is `f`. The returned
    updates move `params` to the accepted point. With `value=None` (and
    `grads=None`) it evaluates `f` itself: at `params` it re-uses the stored
    value and gradient of the last accepted point, and on the first call
    the line search's loop evaluates `params` before its first trial. Every
    evaluation then happens at one place in the compiled update, which
    halves its compile time against `optax.value_and_grad_from_state`
    (whose `cond` holds a second copy of `f`).
    """
    check_penalties(l1, l2)
    check_int("memory_size", memory_size)
    check_int("max_linesearch_steps", max_linesearch_steps)
    check_scalar("decrease_factor", decrease_factor, 0, 1, low_open=True, high_open=True)
    check_scalar("shrink", shrink, 0, 1, low_open=True, high_open=True)

    def init(params):
        check_float_params(params)
        return _initial_state(params, memory_size)

    def update(grads, state, params=None, *, value=None, grad=None, value_fn=None, **extra_args):
        del grad  # `grads` is the same gradient of f
        if params is None or value_fn is None:
            raise ValueError(
                "owlqn.update needs params and value_fn= (and value= with grads, "
                "or value=None to let it evaluate f itself, as optax.lbfgs does)"
            )
        theta, unravel = ravel_pytree(params)
        weight = penalised_vector(params, mask)

        def total(x, f_value):
            return f_value + l1 * jnp.sum(weight * jnp.abs(x)) + 0.5 * l2 * jnp.sum(weight * x**2)

        def setup(f_value, f_grad):
            """The search from `theta`, given f's value and flat gradient there."""
            smooth_grad = f_grad + l2 * weight * theta
            pg = pseudo_gradient(theta, smooth_grad, l1, weight)
            direction = -_two_loop(pg, state.params_diffs, state.grad_diffs)
            direction = jnp.where(direction * pg < 0, direction, 0.0)
            orthant = jnp.where(theta != 0, jnp.sign(theta), -jnp.sign(pg))
            first_step = jnp.minimum(1.0, 1.0 / jnp.maximum(jnp.linalg.norm(pg), jnp.finfo(theta.dtype).tiny))
            step = jnp.where(jnp.any(state.params_diffs != 0), 1.0, first_step).astype(theta.dtype)
            return _Search(
                jnp.asarray(f_value, theta.dtype),
                f_grad,
                smooth_grad,
                total(theta, f_value),
                pg,
                direction,
                orthant,
                step,
            )

        def trial_point(search, step_size):
            x = theta + step_size * search.direction
            return jnp.where((weight == 0) | (jnp.sign(x) == search.orthant), x, 0.0)

        if value is None:
            # Self-evaluating: f at `theta` is the stored value of the last
            # accepted point, or (first call) evaluated by the search loop's
            # first pass, so the compiled update holds one copy of f.
            value, grads, known = state.value, state.grad, jnp.isfinite(state.value)
        else:
            known = jnp.ones((), bool)
        search = setup(value, ravel_pytree(grads)[0])
        step = jnp.where(known, search.step, 0.0)

        def cond(carry):
            search, count, _, _, _, _, accept, known = carry
            # A non-finite objective at theta: no trial can be compared with it.
            return (count < max_linesearch_steps) & ~accept & (~known | jnp.isfinite(search.start_objective))

        def body(carry):
            search, count, step_size, x, _, _, _, known = carry
            f_value, f_grad = jax.value_and_grad(value_fn)(unravel(x), **extra_args)
            f_grad = ravel_pytree(f_grad)[0]
            # Unknown: `x` was `theta` itself; set up the search from it.
            search = jax.lax.cond(known, lambda: search, lambda: setup(f_value, f_grad))
            accept = known & (
                total(x, f_value) <= search.start_objective + decrease_factor * jnp.dot(search.pg, x - theta)
            )
            next_step = jnp.where(known, step_size * shrink, search.step)
            step_size = jnp.where(accept, step_size, next_step)
            x = jnp.where(accept, x, trial_point(search, next_step))
            return search, count + known.astype(jnp.int32), step_size, x, f_value, f_grad, accept, jnp.ones((), bool)

        initial = (
            search,
            jnp.zeros((), jnp.int32),
            step,
            jnp.where(known, trial_point(search, step), theta),
            search.value,
            search.f_grad,
            jnp.zeros((), bool),
            known,
        )
        search, trials, step_size, x, f_value, f_grad, accept, _ = jax.lax.while_loop(cond, body, initial)
        x = jnp.where(accept, x, theta)
        f_value = jnp.where(accept, f_value, search.value)
        f_grad = jnp.where(accept, f_grad, search.f_grad)
        params_diffs, grad_diffs = push_pair(
            state.params_diffs, state.grad_diffs, x - theta, f_grad + l2 * weight * x - search.smooth_grad
        )
        status = jnp.where(
            ~jnp.isfinite(search.start_objective),
            jnp.int32(NON_FINITE_OBJECTIVE),
            jnp.where(accept, jnp.int32(0), jnp.int32(LINE_SEARCH_FAILED)),
        )
        new_state = OwlqnState(
            state.count + 1,
            params_diffs,
            grad_diffs,
            f_value,
            ravel_pytree(grads)[1](f_grad),
            status,
            trials,
            jnp.where(accept, step_size, 0.0).astype(theta.dtype),
        )
        return unravel(x - theta), new_state

    return optax.GradientTransformationExtraArgs(init, update)  # pyright: ignore[reportArgumentType]  # optax's update protocol
