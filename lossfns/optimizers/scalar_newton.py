"""Vectorised minimisation of many convex one-dimensional functions at once
(one per candidate feature), as the boosting-style optimizers need for their
step sizes: damped Newton steps from 0 (or a given start), each clipped to `[-1, 1]`, the
result clipped to `[-max_step, max_step]` (a function that keeps decreasing
towards infinity, e.g. a feature that separates the data, gets the bound).
With `tol`, the iteration stops early once no coordinate moves by more than
`tol` (relative to `max(1, |delta|)`): Newton converges in a few steps, and
the fixed count is then only a cap."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ..validation import check_int, check_scalar


def newton_minimize(
    derivatives: Callable,
    shape,
    dtype,
    *,
    num_steps: int = 40,
    max_step: float = 10.0,
    tol: float | None = None,
    start=None,
) -> jax.Array:
    """Minimiser `[*shape]` of convex scalar functions, elementwise.

    derivatives: `delta [*shape] -> (first [*shape], second [*shape])`;
    start: `[*shape]` the first iterate (default 0).
    """
    check_int("num_steps", num_steps, 0)
    check_scalar("max_step", max_step, 0, low_open=True)
    if tol is not None:
        check_scalar("tol", tol, 0)

    def body(delta):
        first, second = derivatives(delta)
        move = jnp.where(second > 0, -first / jnp.where(second > 0, second, 1.0), -jnp.sign(first))
        return jnp.clip(delta + jnp.clip(move, -1.0, 1.0), -max_step, max_step)

    start = jnp.zeros(shape, dtype) if start is None else jnp.clip(jnp.asarray(start, dtype), -max_step, max_step)
    if tol is None:
        return jax.lax.fori_loop(0, num_steps, lambda _, delta: body(delta), start)

    def cond(carry):
        step, _, moving = carry
        return (step < num_steps) & moving

    def loop_body(carry):
        step, delta, _ = carry
        new = body(delta)
        return step + 1, new, jnp.any(jnp.abs(new - delta) > tol * jnp.maximum(1.0, jnp.abs(new)))

    return jax.lax.while_loop(cond, loop_body, (jnp.zeros((), jnp.int32), start, jnp.asarray(True)))[1]
