"""Elastic-net fine-tuning (Lavergne, Cappe & Yvon 2010, section 5.3.1):
after an L1 optimizer has selected features, re-fit only the active ones
(non-zero weights) by L-BFGS (`optax.lbfgs`) with a small L2 penalty, which
removes the L1 shrinkage bias and lets SGD and BCD catch up with OWL-QN.

`finetune` is one jit-able loop; `train_finetune` runs the same
minimisation through the driver (`train`): in chunks, checkpointed and
resumable, for fine-tuning that takes hours."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from ..validation import check_callable, check_int, check_scalar
from .driver import train
from .elastic_net import L2Regularizer, lbfgs
from .minimize import Result, StopRule, minimize


def active_mask(params):
    """Pytree of float masks: 1 where the weight is non-zero."""
    return jax.tree_util.tree_map(lambda p: (p != 0).astype(p.dtype), params)


class ActiveObjective(NamedTuple):
    """`(params, (data, mask)) -> objective(mask * params, data)`, a value.

    The restriction is a reparametrisation `theta = mask * params`: the
    inactive coordinates get zero gradients, so L-BFGS never moves them and
    they stay exactly 0 (which also makes `||params||^2` the L2 term of the
    active weights alone)."""

    objective: Callable

    def __call__(self, params, data_and_mask) -> jax.Array:
        data, mask = data_and_mask
        return self.objective(jax.tree_util.tree_map(jnp.multiply, mask, params), data)


def finetune(
    fun: Callable, params, *, l2: float = 1e-5, max_steps: int = 200, tol: float = 1e-10, memory_size: int = 10
) -> Result:
    """Minimise `fun(theta) + l2/2 ||theta||^2` over the non-zero coordinates
    of `params` only (the others stay exactly 0). Jit-able.

    Returns `minimize`'s result; `trace` holds the restricted objective.
    """
    check_scalar("l2", l2, 0)
    check_int("memory_size", memory_size)
    restricted, mask, penalty = ActiveObjective(lambda theta, _: fun(theta)), active_mask(params), L2Regularizer(l2)
    return minimize(
        lambda p: restricted(p, (None, mask)) + penalty(p),
        params,
        optax.lbfgs(memory_size=memory_size),
        max_steps=max_steps,
        tol=tol,
    )


def train_finetune(
    objective: Callable,
    params,
    data=None,
    *,
    l2: float = 1e-5,
    max_steps: int = 200,
    stop: StopRule | None = None,
    memory_size: int = 10,
    **drive_options,
) -> Result:
    """`finetune` through the driver: minimise `objective(theta, data) +
    l2/2 ||theta||^2` over the non-zero coordinates of `params` in jitted
    chunks, checkpointed and resumed as `train` is.

    objective: `(params, data) -> scalar` (`models.weights_objective`).
    stop: default `relative_change_below(1e-9)`; `max_steps` the cap.
    drive_options: `until`, `time_limit`, `chunk_steps`, `checkpoint_dir`,
      `checkpoint_every`, `keep`, `settings`, `progress`, `callback`,
      `description` (`drive`); the active set is part of the data, so a
      checkpoint resumes only the fine-tuning of the same support.
    Returns `train`'s `Result`; its trace holds the restricted objective.
    """
    check_callable("objective", objective)
    check_scalar("l2", l2, 0)
    check_int("memory_size", memory_size)
    return train(
        ActiveObjective(objective),
        params,
        lbfgs(memory_size),
        (data, active_mask(params)),
        max_steps=max_steps,
        stop=stop,
        regularizer=L2Regularizer(l2) if l2 else None,
        **drive_options,
    )
