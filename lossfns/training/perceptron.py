"""The structured perceptron and its averaged variant (Collins 2002), over
`lossfns.lattices.chain.viterbi`.

For each training sequence in turn: decode `yhat = argmax_y s(x, y)`; if it differs
from the gold `y`, add `S(x, y) - S(x, yhat)` to the parameters. The model is any
`potentials_fn(params, inputs)` that is linear in `params`, so that difference is
the gradient of the perceptron loss (autodiff; no feature extraction code here).
The averaged perceptron returns the mean of the parameters after every example.
One loop step is one epoch in corpus order; its objective is the number of
mistakes in that epoch, and the loop stops after an epoch without mistakes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import losses
from ..optimizers.minimize import LoopState, Result, init_loop, loop_result, num_examples, run_loop
from ..validation import check_callable, check_int


class PerceptronState(NamedTuple):
    """params: current parameters; summed_params: sum of the parameters after
    every example seen; num_seen: `[]` int32 examples seen."""

    params: object
    summed_params: object
    num_seen: jax.Array


class SequenceData(NamedTuple):
    """inputs: pytree with a leading example axis `[N, ...]` (what
    `potentials_fn` reads); labels: `[N, T]` gold labels; lengths: `[N]`."""

    inputs: object
    labels: jax.Array
    lengths: jax.Array


def perceptron_init(params) -> PerceptronState:
    """The perceptron's state before the first epoch: `params`, a zero sum, no examples seen."""
    return PerceptronState(params, jax.tree_util.tree_map(jnp.zeros_like, params), jnp.zeros((), jnp.int32))


def averaged_params(state: PerceptronState):
    """The averaged perceptron's parameters (the current ones before any example)."""
    count = jnp.maximum(state.num_seen, 1)
    return jax.tree_util.tree_map(
        lambda total, current: jnp.where(state.num_seen > 0, total / count, current), state.summed_params, state.params
    )


def perceptron_update(potentials_fn: Callable, params, inputs, labels, length):
    """`(new params, mistake)` for one sequence: `labels [T]`, `length []`.

    The update is a unit gradient step on `lossfns.losses.perceptron_loss`,
    whose gradient is `S(x, yhat) - S(x, y)` (zero when Viterbi returns the
    gold sequence); `mistake` is `loss > 0` (the gold is not a best path).
    """
    loss, gradient = jax.value_and_grad(lambda p: losses.perceptron_loss(potentials_fn(p, inputs), labels, length))(
        params
    )
    return jax.tree_util.tree_map(jnp.subtract, params, gradient), loss > 0


def check_sequence_data(data) -> None:
    """Reject anything but a `SequenceData` whose labels are `[N, T]` and lengths `[N]`."""
    if not isinstance(data, SequenceData):
        raise TypeError(f"data must be a SequenceData(inputs, labels [N, T], lengths [N]), got {type(data).__name__}")
    total = num_examples(data)
    labels_shape, lengths_shape = jnp.shape(data.labels), jnp.shape(data.lengths)
    if len(labels_shape) != 2 or lengths_shape != (total,):
        raise ValueError(
            f"data.labels must have shape [N, T] and data.lengths [N] with N = {total}, "
            f"got {labels_shape} and {lengths_shape}"
        )


def perceptron_epoch_fn(potentials_fn: Callable, data: SequenceData) -> Callable:
    """The `step_fn` of one epoch over `data` in order; objective: mistakes made."""
    check_callable("potentials_fn", potentials_fn)
    check_sequence_data(data)
    total = num_examples(data)

    def step_fn(state: PerceptronState, step):
        def example(index, carry):
            state, mistakes = carry
            inputs = jax.tree_util.tree_map(lambda x: x[index], data.inputs)
            params, mistake = perceptron_update(
                potentials_fn, state.params, inputs, data.labels[index], data.lengths[index]
            )
            summed = jax.tree_util.tree_map(jnp.add, state.summed_params, params)
            return PerceptronState(params, summed, state.num_seen + 1), mistakes + mistake

        state, mistakes = jax.lax.fori_loop(0, total, example, (state, jnp.zeros((), jnp.int32)))
        return state, mistakes

    return step_fn


def no_mistakes(trace, num_steps):
    """Stop rule of the perceptron loop (trace: mistakes per epoch): an epoch without mistakes."""
    return trace[num_steps - 1] == 0


def perceptron(potentials_fn: Callable, params, data: SequenceData, *, max_steps: int, average: bool = True) -> Result:
    """Train for up to `max_steps` epochs (stopping after a clean one). Jit-able.

    potentials_fn: `(params, inputs_i) -> potentials` of one sequence
      (`[T, L, L]` or `FactoredPotentials`), linear in `params`.
    Returns a `Result`: `params` the averaged (or last) parameters, `state`
    the `PerceptronState`, `trace` `[max_steps]` the mistakes per epoch.
    """
    check_int("max_steps", max_steps)
    check_callable("potentials_fn", potentials_fn)
    check_sequence_data(data)
    loop: LoopState = init_loop(perceptron_init(params), max_steps)
    loop = run_loop(perceptron_epoch_fn(potentials_fn, data), loop, max_steps, no_mistakes)
    return loop_result(loop, averaged_params(loop.inner) if average else loop.inner.params)
