"""SGD with Tsuruoka et al.'s (2009) cumulative L1 penalty (MATH.md section 6).

After each stochastic gradient step, `u` (the total L1 penalty a weight
could have received so far, `sum_t eta_t l1`) and `q_k` (the penalty
actually applied to weight `k`) clip each weight towards 0 without letting it
cross 0: the weights that the noisy gradient keeps pushing around zero end
exactly at zero, which plain SGD on `l1 * sign(theta)` never achieves.

`sgd_l1` is an optax `GradientTransformationExtraArgs` (learning rates may
be optax schedules); `calibrate_learning_rate` picks a safe initial rate on a
sample of the data, as Bottou's CRFsgd does, because a fixed default rate
diverges on some corpora (Wapiti's on CoNLL-2002 Spanish NER). Run either
with `minimize.minimize_stochastic`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from ..validation import concrete
from .minimize import check_float_params, check_int, check_scalar, epoch_step_fn, num_examples
from .owlqn import check_penalties, elastic_net_penalty, penalised_vector


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
    clipped = jnp.where(weights > 0, jnp.maximum(0.0, weights - (total_penalty + applied_penalty)),
                        jnp.where(weights < 0, jnp.minimum(0.0, weights + (total_penalty - applied_penalty)),
                                  weights))
    clipped = jnp.where(penalised > 0, clipped, weights)
    return clipped, applied_penalty + (clipped - weights)


def sgd_l1(learning_rate, l1: float, l2: float = 0.0, *,
           mask=None) -> optax.GradientTransformationExtraArgs:
    """SGD on `f + l1 ||theta||_1 + l2/2 ||theta||^2` with the cumulative L1 penalty.

    Args:
      learning_rate: a float or an optax schedule `step -> rate`.
      l1, l2: penalty weights, on the same scale as the gradients passed to
        `update` (for a summed corpus loss, minibatch gradients scaled by
        `N / batch_size`, as `minimize_stochastic` does).
      mask: which coordinates are penalised (True), as in `owlqn`; `None`: all.
    """
    check_penalties(l1, l2)
    if not callable(learning_rate):
        check_scalar("learning_rate", learning_rate, 0, low_open=True)
    schedule = learning_rate if callable(learning_rate) else optax.constant_schedule(learning_rate)

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


def calibrate_learning_rate(fun: Callable, params, data, l1: float, *, key, l2: float = 0.0,
                            mask=None, batch_size: int = 1, sample_size: int = 500,
                            candidates: Sequence[float] = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001, 3e-4, 1e-4)
                            ) -> jax.Array:
    """A constant learning rate for `sgd_l1`, chosen on a sample of the data.

    Runs one epoch of `sgd_l1` from `params` on `sample_size` random
    examples for each candidate (per-example rates, divided by the number
    of examples because `fun` sums over the corpus) and returns the one with
    the lowest sample objective (non-finite objectives, i.e. divergence,
    lose). All candidates run in one `vmap`.

    fun: `(params, batch) -> summed loss over the batch`; data: pytree with a
    leading example axis `N`. Returns `[]`, the chosen rate.
    """
    check_penalties(l1, l2)
    check_float_params(params)
    check_int("batch_size", batch_size)
    check_int("sample_size", sample_size)
    _check_candidates(candidates)
    total = num_examples(data)
    size = min(sample_size, total)
    sample_key, epoch_key = jax.random.split(key)
    sample = jax.tree_util.tree_map(lambda x: x[jax.random.permutation(sample_key, total)[:size]], data)
    penalty = elastic_net_penalty(l1 * size / total, l2 * size / total, mask)
    rates = jnp.asarray(candidates, ravel_pytree(params)[0].dtype) / total

    def sample_objective(rate):
        optimizer = sgd_l1(rate, l1 * size / total, l2 * size / total, mask=mask)
        step = epoch_step_fn(fun, optimizer, sample, batch_size=batch_size, penalty=penalty)
        _, value = step((params, optimizer.init(params), epoch_key), jnp.zeros((), jnp.int32))
        return value

    values = jax.vmap(sample_objective)(rates)
    values = jnp.where(jnp.isfinite(values), values, jnp.inf)
    return rates[jnp.argmin(values)]


def _check_candidates(candidates) -> None:
    """The candidate learning rates: a non-empty 1-D list of numbers > 0 (when concrete)."""
    values = concrete(candidates)
    if values is None:
        return
    if values.dtype.kind not in "iuf":
        raise TypeError(f"candidates must be a sequence of learning rates > 0, got {candidates!r}")
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"candidates must be a non-empty sequence of learning rates > 0 (at least one), "
                         f"got {candidates!r}")
    if not (values > 0).all():
        raise ValueError(f"candidates must all be learning rates > 0, got {float(values[~(values > 0)][0])!r}")


def decaying_schedule(initial_rate, steps_per_epoch: int, decay_per_epoch: float = 0.85):
    """Tsuruoka et al.'s exponential decay `eta_0 * decay ** (step / steps_per_epoch)`."""
    check_scalar("initial_rate", initial_rate, 0, low_open=True)
    check_int("steps_per_epoch", steps_per_epoch)
    check_scalar("decay_per_epoch", decay_per_epoch, 0, 1, low_open=True)
    return optax.exponential_decay(initial_rate, transition_steps=steps_per_epoch, decay_rate=decay_per_epoch)
