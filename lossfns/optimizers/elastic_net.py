"""Which optimizer trains an elastic-net objective, and what it is given.

`f(w) + l1 ||w||_1 + l2 / 2 ||w||^2 (+ r(w))` is trained by OWL-QN when
`l1 > 0` (`owlqn` applies the whole elastic net itself, so the driver only
adds it to the recorded objective), else by `optax.lbfgs` or an optax
transformation of the caller's choice, which see the smooth terms `l2 / 2
||w||^2 + r(w)` as part of the objective. The Tagger, and the estimators and
command line built on it, choose this way; `crfsuite_elastic_net` converts
CRFsuite's penalty weights.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from ..validation import check_callable, check_int, check_optimizer, check_scalar
from .minimize import gradient_step_fn
from .owlqn import OwlqnState, elastic_net_penalty, owlqn, pseudo_gradient


def crfsuite_elastic_net(c1: float, c2: float) -> dict:
    """CRFsuite's `c1`, `c2` as `l1`, `l2`.

    CRFsuite's L-BFGS trainer minimises `-sum_i log p(y_i | x_i) + c1 ||w||_1
    + c2 ||w||^2` (train_lbfgs.c adds `c2 * ||w||^2` to the objective and
    `2 c2 w` to the gradient), so `l1 = c1` and `l2 = 2 c2`.
    """
    if c1 < 0 or c2 < 0:
        raise ValueError(f"c1 and c2 must be >= 0, got c1={c1}, c2={c2}")
    return {"l1": float(c1), "l2": 2.0 * float(c2)}


class ElasticNetTraining(NamedTuple):
    """What `driver.train` is given: `optimizer`, the smooth `regularizer`
    (`params -> scalar`, or None) and the `penalty` the optimizer applies
    itself (recorded only, or None)."""

    optimizer: optax.GradientTransformation
    regularizer: Callable | None
    penalty: Callable | None


def check_elastic_net(l1: float, l2: float, optimizer=None, regularizer=None) -> None:
    """Reject negative or non-numeric penalties, a non-optax optimizer, a
    custom optimizer with `l1 > 0` (OWL-QN is the L1 optimizer)."""
    check_scalar("l1", l1, 0)
    check_scalar("l2", l2, 0)
    if regularizer is not None:
        check_callable("regularizer", regularizer)
    if optimizer is not None:
        check_optimizer(optimizer)
        if l1 > 0:
            raise ValueError("l1 > 0 needs optimizer=None (OWL-QN); a custom optimizer only sees the smooth objective")


def elastic_net_training(
    l1: float,
    l2: float,
    optimizer: optax.GradientTransformation | None = None,
    *,
    memory_size: int = 6,
    regularizer: Callable | None = None,
) -> ElasticNetTraining:
    """The optimizer for `f + l1 ||w||_1 + l2 / 2 ||w||^2 (+ regularizer)`:
    OWL-QN when `optimizer` is None and `l1 > 0`, else `optimizer` (default
    `optax.lbfgs`), `memory_size` pairs of history for the defaults."""
    check_elastic_net(l1, l2, optimizer, regularizer)
    check_int("memory_size", memory_size)
    l1, l2 = float(l1), float(l2)
    if optimizer is None and l1 > 0:
        return ElasticNetTraining(_owlqn(l1, l2, memory_size), regularizer, _elastic_net_penalty(l1, l2))
    optimizer = optimizer or lbfgs(memory_size)
    return ElasticNetTraining(optimizer, L2Regularizer(l2, regularizer) if l2 else regularizer, None)


# One object per setting: the driver re-uses compiled programs for equal
# optimizers and objectives, and optax's transformations compare by identity.
@functools.lru_cache(maxsize=32)
def _owlqn(l1: float, l2: float, memory_size: int) -> optax.GradientTransformationExtraArgs:
    return owlqn(l1, l2, memory_size=memory_size)


@functools.lru_cache(maxsize=32)
def _elastic_net_penalty(l1: float, l2: float) -> Callable:
    return elastic_net_penalty(l1, l2)


@functools.lru_cache(maxsize=32)
def lbfgs(memory_size: int) -> optax.GradientTransformation:
    """`optax.lbfgs(memory_size)`, one object per size (see above)."""
    return optax.lbfgs(memory_size=memory_size)


class L2Regularizer(NamedTuple):
    """`params -> l2 / 2 ||params||^2 (+ regularizer(params))`, a value."""

    l2: float
    regularizer: Callable | None = None

    def __call__(self, params) -> jax.Array:
        total = jnp.asarray(0.5 * self.l2 * sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(params)))
        return total if self.regularizer is None else total + self.regularizer(params)


class ElasticNetSteps(NamedTuple):
    """`drive`'s `make_step` for `f + l1 ||w||_1 + l2 / 2 ||w||^2 (+
    regularizer)` with the penalty weights read from the data, `data =
    (objective's data, penalties [2] or [shards, 2])`, so fits that differ
    only in `l1` and `l2` (a grid search) share one compiled program: OWL-QN
    when `owlqn` (chosen when `l1 > 0`), else `optax.lbfgs`, both with
    `memory_size` pairs."""

    objective: Callable
    memory_size: int
    owlqn: bool
    regularizer: Callable | None = None

    def optimizer(self, l1, l2) -> optax.GradientTransformation:
        """The transformation for these penalty weights (traced or not)."""
        return owlqn(l1, l2, memory_size=self.memory_size) if self.owlqn else lbfgs(self.memory_size)

    def __call__(self, data):
        inner, penalties = data
        l1, l2 = jnp.reshape(penalties, (-1, 2))[0]  # one copy per shard on a mesh: all equal
        objective = self.objective
        # OWL-QN applies the whole elastic net itself; L-BFGS sees the L2 term as part of the objective.
        smooth = self.regularizer if self.owlqn else L2Regularizer(l2, self.regularizer)

        def fun(params):
            value = objective(params, inner)
            return value if smooth is None else value + smooth(params)

        penalty = elastic_net_penalty(l1, l2) if self.owlqn else None
        return gradient_step_fn(fun, self.optimizer(l1, l2), penalty)


def elastic_net_record(inner, data) -> dict:
    """`driver.drive`'s `record` for an `ElasticNetSteps` loop (`inner =
    (params, opt_state)`, `data = (objective's data, penalties)`): CRFsuite's
    (liblbfgs') progress values at the point each iteration reached, in the
    compiled loop. `feature_norm`: `||w||`; `error_norm`: the norm of the
    gradient of the whole objective (with OWL-QN, its orthant-wise
    pseudo-gradient, as liblbfgs); `active_features`: the non-zero weights;
    `linesearch_trials`: the objective evaluations of the iteration's line
    search; `linesearch_step`: the step it accepted along the search
    direction (`optax.lbfgs` scales its first direction to unit length, so its
    first step reads 1 where liblbfgs' reads `1 / ||g||`)."""
    params, opt_state = inner[0], inner[1]
    theta = ravel_pytree(params)[0]
    if isinstance(opt_state, OwlqnState):  # its gradient is the smooth part's, the elastic net apart
        l1, l2 = jnp.reshape(data[1], (-1, 2))[0]
        smooth = ravel_pytree(opt_state.grad)[0] + l2 * theta
        gradient = pseudo_gradient(theta, smooth, l1, jnp.ones_like(theta))
        trials, step = opt_state.trials, opt_state.step_size
    else:  # optax.lbfgs: the smooth objective's gradient (the L2 term included), its zoom line search
        gradient = ravel_pytree(optax.tree.get(opt_state, "grad"))[0]
        trials = optax.tree.get(opt_state, "num_linesearch_steps")
        step = optax.tree.get(opt_state, "learning_rate")
    return {
        "feature_norm": jnp.linalg.norm(theta),
        "error_norm": jnp.linalg.norm(gradient),
        "active_features": jnp.count_nonzero(theta).astype(jnp.int32),
        "linesearch_trials": jnp.asarray(trials, jnp.int32),
        "linesearch_step": jnp.asarray(step, theta.dtype),
    }
