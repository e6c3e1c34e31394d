"""Elastic-net fine-tuning (Lavergne, Cappe & Yvon 2010, section 5.3.1):
after an L1 optimizer has selected features, re-fit only the active ones
(non-zero weights) by L-BFGS (`optax.lbfgs`) with a small L2 penalty, which
removes the L1 shrinkage bias and lets SGD and BCD catch up with OWL-QN."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from .minimize import MinimizeResult, check_int, check_scalar, minimize


def active_mask(params):
    """Pytree of float masks: 1 where the weight is non-zero."""
    return jax.tree_util.tree_map(lambda p: (p != 0).astype(p.dtype), params)


def finetune(
    fun: Callable, params, *, l2: float = 1e-5, max_steps: int = 200, tol: float = 1e-10, memory_size: int = 10
) -> MinimizeResult:
    """Minimise `fun(theta) + l2/2 ||theta||^2` over the non-zero coordinates
    of `params` only (the others stay exactly 0). Jit-able.

    The restriction is a reparametrisation `theta = mask * params`, so the
    inactive coordinates get zero gradients and L-BFGS never moves them.
    Returns `minimize`'s result; `trace` holds the restricted objective.
    """
    check_scalar("l2", l2, 0)
    check_int("memory_size", memory_size)
    mask = active_mask(params)

    def restricted(p):
        theta = jax.tree_util.tree_map(jnp.multiply, mask, p)
        squares = sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(theta))
        return fun(theta) + 0.5 * l2 * squares

    return minimize(restricted, params, optax.lbfgs(memory_size=memory_size), max_steps=max_steps, tol=tol)
