"""Vectorised minimisation of many convex one-dimensional functions at once
(one per candidate feature), as the boosting-style optimizers need for their
step sizes: damped Newton steps from 0, each clipped to `[-1, 1]`, the
result clipped to `[-max_step, max_step]` (a function that keeps decreasing
towards infinity, e.g. a feature that separates the data, gets the bound)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from .minimize import check_int, check_scalar


def newton_minimize(derivatives: Callable, shape, dtype, *, num_steps: int = 40,
                    max_step: float = 10.0) -> jax.Array:
    """Minimiser `[*shape]` of convex scalar functions, elementwise.

    derivatives: `delta [*shape] -> (first [*shape], second [*shape])`.
    """
    check_int("num_steps", num_steps, 0)
    check_scalar("max_step", max_step, 0, low_open=True)
    def body(_, delta):
        first, second = derivatives(delta)
        move = jnp.where(second > 0, -first / jnp.where(second > 0, second, 1.0), -jnp.sign(first))
        return jnp.clip(delta + jnp.clip(move, -1.0, 1.0), -max_step, max_step)

    return jax.lax.fori_loop(0, num_steps, body, jnp.zeros(shape, dtype))
