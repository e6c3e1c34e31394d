"""Optimisation loops as pure state machines.

Every optimizer in `lossfns.optimizers` is run by the same loop: a `LoopState` (the
optimizer's state, a step counter, the objective and its trace, a `done` flag) is
advanced by `step_fn(inner_state, step) -> (inner_state, objective)` inside
`jax.lax.while_loop` until a `StopRule` fires. Nothing is mutated on the Python
side, so `run_loop` is jit-compiled end to end, and a run saved and reloaded at any
step ends bit-identical to an uninterrupted one. `advance` is one chunk of a run
(`minimize` one chunk to the end; `optimizers.driver` runs chunks); `gradient_step_fn`
specialises the loop to optax transformations, line searches included.
"""

from __future__ import annotations

import enum
import functools
import numbers
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ..validation import (
    check_callable,
    check_float_params,
    check_int,
    check_key,
    check_optimizer,
    check_scalar,
    concrete,
)


class Status(enum.IntEnum):
    """Why an optimisation loop stopped: `Result.status` holds the
    code as a `[]` int32 array (inside `jit` a run cannot raise, so the status
    is the signal); `status_name(code)` spells it."""

    CONVERGED = 0  # the stopping test fired (relative change below tol)
    ITERATION_LIMIT = 1  # max_steps used up
    NON_FINITE_OBJECTIVE = 2  # the objective was NaN or +-inf (at the start: nothing done)
    LINE_SEARCH_FAILED = 3  # no trial step decreased the objective (the parameters stay put)


# One assignment each, so that documentation tools (griffe) see them.
CONVERGED = Status.CONVERGED
"""`Status.CONVERGED`."""
ITERATION_LIMIT = Status.ITERATION_LIMIT
"""`Status.ITERATION_LIMIT`."""
NON_FINITE_OBJECTIVE = Status.NON_FINITE_OBJECTIVE
"""`Status.NON_FINITE_OBJECTIVE`."""
LINE_SEARCH_FAILED = Status.LINE_SEARCH_FAILED
"""`Status.LINE_SEARCH_FAILED`."""


def status_name(code) -> str:
    """`'CONVERGED'`, `'ITERATION_LIMIT'`, `'NON_FINITE_OBJECTIVE'` or
    `'LINE_SEARCH_FAILED'` for a status code (an int or a concrete `[]` array)."""
    value = concrete(code)
    if value is None:
        raise TypeError("status_name needs a concrete status code, got a traced value (call it outside jit)")
    try:
        return Status(int(value)).name
    except ValueError:
        raise ValueError(
            f"code must be one of {[int(s) for s in Status]} (a minimize status), got {int(value)}"
        ) from None


def _state_field(opt_state, name: str):
    """The optimizer state's one field `name`, or None (none, or several: a
    chain of transformations, which gives no single signal)."""
    try:
        return optax.tree.get(opt_state, name)
    except KeyError:
        return None


def optimizer_status(opt_state) -> jax.Array:
    """`[]` int32 from the optimizer's own state: `LINE_SEARCH_FAILED` or
    `NON_FINITE_OBJECTIVE` when its last update could not move (`owlqn`'s
    `status`; an `optax.lbfgs` zoom line search that ended with a zero step
    and no sufficient decrease), else `CONVERGED` (no failure to report)."""

    code = _state_field(opt_state, "status")
    if code is not None:
        return jnp.asarray(code, jnp.int32)
    rate, decrease_error = _state_field(opt_state, "learning_rate"), _state_field(opt_state, "decrease_error")
    if rate is None or decrease_error is None:
        return jnp.asarray(CONVERGED, jnp.int32)
    failed = (rate == 0) & (decrease_error > 0)
    return jnp.where(failed, jnp.int32(LINE_SEARCH_FAILED), jnp.int32(CONVERGED))


def halt_on_failure(inner, value) -> jax.Array:
    """`run_loop`'s `halt_fn` for `minimize` and `minimize_stochastic`: stop
    at a non-finite objective or a failed line search (another step would
    repeat the same failure)."""
    return ~jnp.isfinite(value) | (optimizer_status(inner[1]) >= NON_FINITE_OBJECTIVE)


@jax.jit  # one program, where its steps outside `jit` would compile or load one each
def loop_status(loop: LoopState) -> jax.Array:
    """The `Status` code `[]` int32 of a finished `minimize` loop."""
    failure = optimizer_status(loop.inner[1])
    return jnp.where(
        ~jnp.isfinite(loop.value),
        jnp.int32(NON_FINITE_OBJECTIVE),
        jnp.where(
            failure == LINE_SEARCH_FAILED,
            jnp.int32(LINE_SEARCH_FAILED),
            jnp.where(loop.done, jnp.int32(CONVERGED), jnp.int32(ITERATION_LIMIT)),
        ),
    )


def warn_on_failure(status) -> None:
    """A `RuntimeWarning` when a concrete `status` is a failure."""
    value = concrete(status)
    if value is not None and int(value) >= NON_FINITE_OBJECTIVE:
        warnings.warn(
            f"optimisation stopped early with status {status_name(value)} (see Result.status and .trace)",
            RuntimeWarning,
            stacklevel=3,
        )


def check_objective(name: str, fun: Callable, *arguments) -> None:
    """Refuse an objective whose value at `arguments` is not a real scalar
    (e.g. a vector of per-example losses, which `jax.grad` refuses deep in the
    loop): its output is found by tracing it once (`jax.eval_shape`), before
    any step."""
    check_scalar_output(name, jax.eval_shape(fun, *arguments))


def check_scalar_output(name: str, out) -> None:
    """Refuse `out` (a value, a tracer or a shape) unless it is a real scalar:
    inside a traced step its shape is known, so the check costs nothing."""
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if shape == () and dtype is not None and jnp.issubdtype(dtype, jnp.floating):
        return
    given = f"an array of shape {shape} dtype {dtype}" if shape is not None else type(out).__name__
    raise ValueError(
        f"{name} must return a floating-point scalar (the objective to minimise), got {given}; "
        "sum or average per-example losses (jnp.sum)"
    )


class LoopState(NamedTuple):
    """State of an optimisation loop.

    inner: the optimizer's state pytree (for `minimize`: `(params, opt_state)`).
    step: `[]` int32, steps taken so far.
    value: `[]` objective after the last step (`inf` before the first).
    trace: `[max_steps]` objective after each step; NaN for steps not taken.
    done: `[]` bool, the stopping test has fired.
    """

    inner: Any
    step: jax.Array
    value: jax.Array
    trace: jax.Array
    done: jax.Array

    @property
    def status(self) -> jax.Array:
        """Why the loop stopped, a `Status` code `[]` int32, for every loop
        (BCD, the perceptrons, boosting, the rerankers): a non-finite last
        objective, else the stopping test fired (`CONVERGED`), else the
        iteration limit. (`minimize`'s result also knows a failed line search.)"""
        return jnp.where(
            self.step > 0,
            jnp.where(
                ~jnp.isfinite(self.value),
                jnp.int32(NON_FINITE_OBJECTIVE),
                jnp.where(self.done, jnp.int32(CONVERGED), jnp.int32(ITERATION_LIMIT)),
            ),
            jnp.int32(ITERATION_LIMIT),
        )


def init_loop(inner, max_steps: int, dtype=None) -> LoopState:
    """A fresh `LoopState` around the optimizer state `inner`."""
    max_steps = check_int("max_steps", max_steps)
    return LoopState(
        inner, *_fresh_loop_fields(max_steps, jnp.dtype(jnp.result_type(float) if dtype is None else dtype))
    )


@functools.partial(jax.jit, static_argnums=(0, 1))
def _fresh_loop_fields(max_steps: int, dtype) -> tuple:
    """A fresh loop's `(step, value, trace [max_steps], done)`, in one program."""
    return (
        jnp.zeros((), jnp.int32),
        jnp.asarray(jnp.inf, dtype),
        jnp.full((max_steps,), jnp.nan, dtype),
        jnp.zeros((), bool),
    )


class RelativeChange(NamedTuple):
    """Stop rule: `|f_{k-1} - f_k| <= tol * max(|f_k|, 1)` between the last
    two objectives; `tol = 0` never stops. (`relative_change_below(tol)`)"""

    tol: float

    def __call__(self, trace, step):
        value, previous = trace[step - 1], trace[jnp.maximum(step - 2, 0)]
        close = jnp.abs(previous - value) <= self.tol * jnp.maximum(jnp.abs(value), 1.0)
        return (self.tol > 0) & (step >= 2) & close


class RelativeImprovement(NamedTuple):
    """Stop rule of CRFsuite's L-BFGS (its `period` and `delta`): the
    objective improved by less than `tol` (relative to the current value)
    over the last `period` steps, `(f_{k-period} - f_k) / |f_k| < tol`;
    never before `period + 1` steps, never with `tol = 0`.
    (`relative_improvement_below(tol, period)`)"""

    tol: float
    period: int

    def __call__(self, trace, step):
        return (self.tol > 0) & (step > self.period) & (_relative_drop(trace, step, self.period) < self.tol)


def _relative_drop(trace, step, period: int):
    """`(f_{k-period} - f_k) / |f_k|` of the last `step` objectives in `trace`."""
    value, before = trace[step - 1], trace[jnp.maximum(step - 1 - period, 0)]
    return (before - value) / jnp.maximum(jnp.abs(value), jnp.finfo(trace.dtype).tiny)


class RelativeChangeOver(NamedTuple):
    """Stop rule for stochastic optimizers: the objective changed by less
    than `tol` (relative to the current value) over the last `period` steps
    in either direction, `|f_{k-period} - f_k| / |f_k| < tol`; never before
    `period + 1` steps, never with `tol = 0`. Where CRFsuite's rule
    (`RelativeImprovement`) stops on any rise, this one goes on: with a
    decaying step size, an objective that rises over a period means steps
    still too large, not convergence. (`relative_change_over(tol, period)`)"""

    tol: float
    period: int

    def __call__(self, trace, step):
        return (self.tol > 0) & (step > self.period) & (jnp.abs(_relative_drop(trace, step, self.period)) < self.tol)


#: `(trace [max_steps], num_steps []) -> []` bool (see `run_loop`). A rule that
#: needs the host (a development-set score) is a `driver.drive` callback.
StopRule = Callable[[jax.Array, jax.Array], jax.Array]
"""A stop rule: `(trace [max_steps], step []) -> [] bool`, True to stop."""


def relative_change_below(tol: float) -> RelativeChange:
    """Stop rule `|previous - value| <= tol * max(|value|, 1)`; `tol = 0` never stops.

    Rules are values (equal tolerances give equal rules), so jitted loops are re-used."""
    check_scalar("tol", tol, 0)
    return RelativeChange(float(tol))


def relative_improvement_below(tol: float, period: int) -> RelativeImprovement:
    """CRFsuite's stop rule: relative improvement below `tol` over the last `period` steps."""
    check_scalar("tol", tol, 0)
    check_int("period", period)
    return RelativeImprovement(float(tol), int(period))


def relative_change_over(tol: float, period: int) -> RelativeChangeOver:
    """Relative change below `tol` over the last `period` steps, either way (SGD epochs)."""
    check_scalar("tol", tol, 0)
    check_int("period", period)
    return RelativeChangeOver(float(tol), int(period))


def run_loop(
    step_fn: Callable, loop: LoopState, until, stop_fn: StopRule, halt_fn: Callable | None = None
) -> LoopState:
    """Advance `loop` with `step_fn` until `until` steps in total, the trace is
    full, or the stop rule `stop_fn(trace, num_steps)` fires (or `halt_fn(inner,
    value)`, e.g. `halt_on_failure`). Jit-able (`until` may be traced;
    `step_fn`, `stop_fn` and `halt_fn` are static).

    step_fn: `(inner, step) -> (inner, objective)`; `step` is the int32 step index.
    stop_fn: `(trace [max_steps], num_steps []) -> []` bool, asked after each
      step with the objectives so far (`trace[:num_steps]`; NaN beyond), e.g.
      `relative_change_below(tol)`, `relative_improvement_below(tol, period)`
      or `relative_change_over(tol, period)`.
    """
    max_steps = loop.trace.shape[0]
    until = jnp.minimum(jnp.asarray(until, jnp.int32), max_steps)

    def cond(state):
        return (state.step < until) & ~state.done

    def body(state):
        inner, value = step_fn(state.inner, state.step)
        value = jnp.asarray(value, state.value.dtype)
        trace, step = state.trace.at[state.step].set(value), state.step + 1
        done = stop_fn(trace, step)
        if halt_fn is not None:
            done = done | halt_fn(inner, value)
        return LoopState(inner, step, value, trace, done)

    return jax.lax.while_loop(cond, body, loop)


class HaltOn(NamedTuple):
    """`run_loop`'s `halt_fn` of `advance`: `halt_on_failure`, or also a
    trainer's own test on its state, `halt(inner, value) -> [] bool` (e.g.
    boosting's `boosting_converged`). A value, so compiled chunks are re-used."""

    halt: Callable | None = None

    def __call__(self, inner, value) -> jax.Array:
        failed = halt_on_failure(inner, value)
        return failed if self.halt is None else failed | self.halt(inner, value)


def advance(
    make_step: Callable, stop_fn: StopRule, loop: LoopState, until, data=None, halt: Callable | None = None
) -> LoopState:
    """One chunk of a run: `run_loop(make_step(data), loop, until, stop_fn,
    HaltOn(halt))`. The data is an argument, so that under `jit` it is an
    input of the compiled program, never a constant baked into it (XLA's
    constant folding of a `[K, L]` mask took minutes). `minimize` is one
    chunk to the end; `driver.drive` runs jitted chunks of this function.

    make_step: `data -> step_fn` (see `run_loop`), e.g. `gradient_steps(...)`.
    """
    return run_loop(make_step(data), loop, until, stop_fn, HaltOn(halt))


def _value_and_grad(fun, opt_state):
    """`optax.value_and_grad_from_state` when the optimizer stores `value` and
    `grad` (line-search optimizers: no re-evaluation), else `jax.value_and_grad`."""
    if optax.tree.get(opt_state, "value") is not None and optax.tree.get(opt_state, "grad") is not None:
        return lambda params: optax.value_and_grad_from_state(fun)(params, state=opt_state)
    return jax.value_and_grad(fun)


def optimizer_update(optimizer: optax.GradientTransformation, fun: Callable, params, opt_state):
    """`optimizer.update` at `params` for the objective `fun`: `(updates, opt_state)`.

    Optimizers whose state says `evaluates_objective` (`owlqn`) are given
    only `value_fn=fun` and evaluate it themselves; others get `fun`'s value
    and gradient (re-used from the state when it stores them)."""
    # A plain GradientTransformation's update takes no extra arguments: wrapped, it ignores them.
    update = optax.with_extra_args_support(optimizer).update
    if getattr(opt_state, "evaluates_objective", False):
        return update(None, opt_state, params, value_fn=fun)  # pyright: ignore[reportArgumentType]  # no gradient: it evaluates fun
    value, grad = _value_and_grad(fun, opt_state)(params)
    return update(grad, opt_state, params, value=value, grad=grad, value_fn=fun)


def update_and_value(optimizer: optax.GradientTransformation, fun: Callable, params, opt_state):
    """One `optimizer_update`, applied: `(new params, opt_state, fun(new params))`.

    Line-search optimizers store `fun` at the new point, which is re-used
    (no extra evaluation); for others `fun` is evaluated there."""
    updates, opt_state = optimizer_update(optimizer, fun, params, opt_state)
    params = optax.apply_updates(params, updates)
    stored = optax.tree.get(opt_state, "value")
    return params, opt_state, fun(params) if stored is None else stored


def _undo_a_failed_search_that_rose(before, after):
    """`after = (params, opt_state, value)` of a step from `before = (params,
    value, grad)`, or, where a line search that failed (a positive
    `decrease_error` at its end) raised the objective by more than its own
    magnitude, `before` again with the state reporting the failure
    (`optimizer_status`: a zero learning rate), which halts the loop. optax's
    zoom search, finding neither a sufficient decrease nor a safe step, moves
    to its last trial point, however high (seen: a float32 run of the sequential
    exp loss from -336 to 4e7, then reported as converged). Smaller rises,
    float32 noise near an optimum, are left to the stop rules."""
    params, start, grad = before
    new_params, state, value = after
    rate, decrease_error = _state_field(state, "learning_rate"), _state_field(state, "decrease_error")
    if rate is None or decrease_error is None:
        return after
    rose = (decrease_error > 0) & (value - start > jnp.maximum(jnp.abs(start), 1.0))
    kept = lambda old, new: jnp.where(rose, old, new)
    state = optax.tree.set(
        state,
        learning_rate=kept(jnp.zeros_like(rate), rate),
        value=kept(start, optax.tree.get(state, "value")),
        grad=jax.tree_util.tree_map(kept, grad, optax.tree.get(state, "grad")),
    )
    return jax.tree_util.tree_map(kept, params, new_params), state, kept(start, value)


def gradient_step_fn(
    fun: Callable, optimizer: optax.GradientTransformation, penalty: Callable | None = None
) -> Callable:
    """The `step_fn` of one optax update on `inner = (params, opt_state)`.

    The objective recorded is `fun(params) + penalty(params)` at the new
    parameters (`penalty` is the non-smooth part the optimizer handles
    itself, e.g. `l1_penalty(...)` for `owlqn`).
    """
    update = optax.with_extra_args_support(optimizer).update  # as in `optimizer_update`

    def step_fn(inner, step):
        params, opt_state = inner
        if getattr(opt_state, "evaluates_objective", False):
            # owlqn evaluates `fun` itself and takes no step from a non-finite value.
            params, opt_state, value = update_and_value(optimizer, fun, params, opt_state)
        else:
            start, grad = _value_and_grad(fun, opt_state)(params)

            def move(_):
                updates, new_state = update(grad, opt_state, params, value=start, grad=grad, value_fn=fun)
                new_params = optax.apply_updates(params, updates)
                stored = optax.tree.get(new_state, "value")
                value = jnp.asarray(fun(new_params) if stored is None else stored, jnp.result_type(start))
                return _undo_a_failed_search_that_rose((params, start, grad), (new_params, new_state, value))

            # A NaN/inf objective at `params`: no update (it would spread NaN
            # into the parameters); the loop's `halt_on_failure` stops there.
            params, opt_state, value = jax.lax.cond(
                jnp.isfinite(start), move, lambda _: (params, opt_state, jnp.asarray(start)), None
            )
        return (params, opt_state), value if penalty is None else value + penalty(params)

    return step_fn


class GradientSteps(NamedTuple):
    """`data -> gradient_step_fn(objective(., data) + regularizer, optimizer,
    penalty)`: the `make_step` of `advance` for an optax optimizer on an
    objective with data. A value (equal arguments give equal makers), so
    compiled chunks are re-used.

    objective: `(params, data) -> scalar`; regularizer: `params -> scalar`
    (smooth, optimised) or None; penalty: the non-smooth part the optimizer
    handles itself (`owlqn`'s elastic net), only added to the recorded value.
    """

    objective: Callable
    optimizer: optax.GradientTransformation
    regularizer: Callable | None = None
    penalty: Callable | None = None

    def __call__(self, data):
        objective, regularizer = self.objective, self.regularizer

        def fun(params):
            value = objective(params, data)
            check_scalar_output("objective", value)  # a vector would fail deep in jax.grad
            return value if regularizer is None else value + regularizer(params)

        return gradient_step_fn(fun, self.optimizer, self.penalty)


class Result(NamedTuple):
    """What every loop of `optimizers` and `training` returns.

    params: the trained parameters (`drive`: the loop's whole inner state,
      which the callers that know their parameters replace); state: the
      final optimizer state (the optax state of a gradient loop, a trainer's
      own state, e.g. `PerceptronState`; `drive`: the final `LoopState`, from
      which `drive` continues the run); trace: `[max_steps]` objective after
      each step (NaN past `num_steps`); num_steps: `[]` steps taken; status:
      `[]` int32 `Status` code (`status_name(result.status)` spells it);
      compile_seconds, run_seconds: the driver's timings (0 for a loop run in
      one call, which the caller times); step_seconds: `[num_steps]` numpy,
      each step's share of its chunk's time (driver only, else None);
      records: the driver's `{name: array}` (`drive(record=)`, a trainer's
      extras such as `boost`'s evaluations), else None.
    """

    params: Any
    state: Any
    trace: jax.Array
    num_steps: jax.Array
    status: jax.Array
    compile_seconds: float = 0.0
    run_seconds: float = 0.0
    step_seconds: Any = None
    records: dict | None = None


def minimize(
    fun: Callable,
    params,
    optimizer: optax.GradientTransformation,
    *,
    max_steps: int,
    tol: float = 1e-9,
    penalty: Callable | None = None,
) -> Result:
    """Minimise `fun(params)` (+ `penalty(params)`) with an optax optimizer.

    Runs up to `max_steps` updates in one `jax.lax.while_loop`, stopping when
    the objective's relative change falls below `tol`. Jit-able as a whole
    (make `fun`, `optimizer`, `max_steps`, `tol`, `penalty` static).

    `result.status` says why the run stopped (`status_name` spells it). A
    NaN or infinite objective stops it (`NON_FINITE_OBJECTIVE`); at the start
    no update is made and the parameters are those given (line-search
    optimizers, `owlqn` and `optax.lbfgs`, never accept a non-finite trial
    point; a plain gradient step can reach one). A failed line search stops
    it with `LINE_SEARCH_FAILED` (another step would repeat it). Outside
    `jit` these two also give a `RuntimeWarning`.

    Returns:
      `Result(params, state, trace [max_steps], num_steps, status)`, the
      optimizer's state as `state`.
    """
    check_callable("fun", fun)
    check_optimizer(optimizer)
    check_int("max_steps", max_steps)
    check_float_params(params)
    check_objective("fun", fun, params)
    relative_change_below(tol)
    loop = init_loop((params, optimizer.init(params)), max_steps, float_dtype(params))
    loop = advance(
        GradientSteps(lambda params, _: fun(params), optimizer, penalty=penalty),
        relative_change_below(tol),
        loop,
        max_steps,
    )
    return minimize_result(loop)


def minimize_result(loop: LoopState) -> Result:
    """The `Result` of a finished gradient loop (`inner = (params,
    opt_state, ...)`), warning outside `jit` when it stopped on a failure."""
    status = loop_status(loop)
    warn_on_failure(status)
    return Result(loop.inner[0], loop.inner[1], loop.trace, loop.step, status)


def loop_result(loop: LoopState, params) -> Result:
    """The `Result` of a trainer's finished loop: `params` (read off its
    state by the trainer), the loop's inner state as `state`, its `status`."""
    return Result(params, loop.inner, loop.trace, loop.step, loop.status)


def float_dtype(tree):
    """The floating dtype of a pytree's floating leaves (the trace's dtype)."""
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.result_type(leaf), jnp.floating)]
    return jnp.result_type(*leaves) if leaves else jnp.result_type(float)


def num_examples(data) -> int:
    """The size `N` of the leading example axis shared by every leaf of `data`."""
    sizes = {jnp.shape(leaf)[0] if jnp.ndim(leaf) else None for leaf in jax.tree_util.tree_leaves(data)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"data must be a pytree of arrays sharing a leading example axis [N, ...], "
            f"got leading sizes {sorted(map(str, sizes))}"
        )
    size = sizes.pop()
    assert size is not None  # refused above
    return size


def epoch_step_fn(
    fun: Callable, optimizer: optax.GradientTransformation, data, *, batch_size: int, penalty: Callable | None = None
) -> Callable:
    """The `step_fn` of one shuffled epoch of minibatch updates.

    inner: `(params, opt_state, key)`; the epoch's order is
    `permutation(fold_in(key, step))`, so it depends only on the step index
    (a resumed run replays the same batches). `fun(params, batch)` is the
    loss summed over a batch; its gradient is scaled by `N / batch_size` to
    estimate the gradient of the corpus sum. The last `N mod batch_size`
    examples of each permutation are skipped. The objective recorded is
    `fun(params, data) + penalty(params)` on the whole data after the epoch.
    """
    total = num_examples(data)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise TypeError(
            f"batch_size must be an int in [1, {total}] (the number of examples), "
            f"got {type(batch_size).__name__} {batch_size!r}"
        )
    if not 1 <= batch_size <= total:
        raise ValueError(f"batch_size must lie in [1, {total}] (the number of examples), got {batch_size}")
    steps_per_epoch = total // batch_size
    grad_fn = jax.grad(fun)

    def step_fn(inner, step):
        params, opt_state, key = inner
        order = jax.random.permutation(jax.random.fold_in(key, step), total)

        def minibatch(index, carry):
            params, opt_state = carry
            rows = jax.lax.dynamic_slice_in_dim(order, index * batch_size, batch_size)
            batch = jax.tree_util.tree_map(lambda x: x[rows], data)
            grads = jax.tree_util.tree_map(lambda g: g * (total / batch_size), grad_fn(params, batch))
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        params, opt_state = jax.lax.fori_loop(0, steps_per_epoch, minibatch, (params, opt_state))
        value = fun(params, data)
        if penalty is not None:
            value = value + penalty(params)
        return (params, opt_state, key), value

    return step_fn


def minimize_stochastic(
    fun: Callable,
    params,
    optimizer: optax.GradientTransformation,
    data,
    *,
    key,
    batch_size: int,
    max_steps: int,
    tol: float = 0.0,
    penalty: Callable | None = None,
) -> Result:
    """Minibatch training for up to `max_steps` epochs in one `while_loop`.

    fun: `(params, batch) -> loss summed over the batch`; data: pytree with a
    leading example axis `[N, ...]`; key: PRNG key for the shuffles. The
    trace holds the full objective after each epoch; `tol > 0` stops when
    its relative change falls below `tol`. Jit-able.
    """
    check_callable("fun", fun)
    check_optimizer(optimizer)
    check_int("max_steps", max_steps)
    check_float_params(params)
    check_key("key", key)
    relative_change_below(tol)
    step_fn = epoch_step_fn(fun, optimizer, data, batch_size=batch_size, penalty=penalty)
    batch = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct((batch_size,) + jnp.shape(x)[1:], jnp.result_type(x)), data
    )
    check_objective("fun", fun, params, batch)
    loop = init_loop((params, optimizer.init(params), key), max_steps, float_dtype(params))
    return minimize_result(advance(lambda _: step_fn, relative_change_below(tol), loop, max_steps))


run_loop_jit = jax.jit(run_loop, static_argnums=(0, 3, 4))
"""`run_loop` compiled once per `(step_fn, stop_fn, halt_fn)` (pass the same objects to re-use it)."""
