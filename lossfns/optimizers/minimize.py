"""Optimisation loops as pure state machines.

Every optimizer in `lossfns.optimizers` is run by the same loop: a
`LoopState` (the optimizer's own state pytree, a step counter, the last
objective value, the objective trace and a `done` flag) is advanced by a
`step_fn(inner_state, step) -> (inner_state, objective)` inside
`jax.lax.while_loop`. Nothing is mutated on the Python side, so

* `run_loop` is jit-compiled end to end;
* a run stopped at any step, saved (`lossfns.checkpoint.save` or
  `equinox.tree_serialise_leaves`), reloaded and continued executes the very
  same compiled loop body on the very same values, and so ends bit-identical
  to an uninterrupted run;
* `drive` is the Python-side wrapper for long runs: it calls the jitted loop
  in chunks, shows progress and writes an atomic checkpoint after each chunk,
  resuming from the newest checkpoint when one exists.

`minimize` specialises the loop to optax gradient transformations, including
those with a line search that take `value=`, `grad=`, `value_fn=`
(`optax.lbfgs`, `owlqn`).
"""

from __future__ import annotations

import enum
import functools
import numbers
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from .. import checkpoint
from .. import validation
from ..validation import concrete


# ---------------------------------------------------------------------------
# Argument checks shared by the optimizers (static values only: Python
# scalars and concrete arrays; traced values pass unchecked)
# ---------------------------------------------------------------------------

check_int = validation.check_int  # ints, numpy ints included; bool refused


def _interval(low, high, low_open, high_open) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def check_scalar(name: str, value, low=None, high=None, *, low_open: bool = False, high_open: bool = False) -> None:
    """Reject a concrete `value` that is not a finite real scalar inside the
    interval (NaN, +-inf and bools included); a traced value (under
    `jit`/`vmap`) is left unchecked."""
    expected = f"a number {_interval(low, high, low_open, high_open)}"
    array = concrete(value)
    if array is None:
        return
    if array.dtype.kind not in "iuf":  # bool refused: True is not a learning rate
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    if array.ndim != 0:
        raise ValueError(f"{name} must be {expected} (a scalar), got an array of shape {array.shape}")
    number = array.item()
    below = low is not None and (number <= low if low_open else number < low)
    above = high is not None and (number >= high if high_open else number > high)
    if number != number or below or above:
        raise ValueError(f"{name} must be {expected}, got {number!r}")
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be {expected} and finite, got {number!r}")


def check_optimizer(optimizer, name: str = "optimizer") -> None:
    """Reject anything but an optax transformation (e.g. `optax.adam` not called)."""
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        given = getattr(optimizer, "__name__", None)
        hint = f" (call the constructor: {given}(...), not {given})" if callable(optimizer) and given else ""
        raise TypeError(f"{name} must be an optax GradientTransformation (with .init and .update){hint}, "
                        f"got {type(optimizer).__name__}{' ' + given if given else ''}")


def check_float_params(params, name: str = "params") -> None:
    """Refuse parameters that are not floating point (an int array cannot take
    a fractional step: optax would fail deep inside with `OverflowError:
    cannot convert float infinity to integer`)."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    if not leaves:
        raise ValueError(f"{name} must hold at least one floating-point array, got {type(params).__name__} {params!r}")
    for path, leaf in leaves:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            where = f" at {jax.tree_util.keystr(path)}" if path else ""
            raise TypeError(f"{name} must be floating point (the optimizers take fractional steps), got dtype "
                            f"{dtype}{where}; pass e.g. jnp.asarray(params, jnp.float32)")


class Status(enum.IntEnum):
    """Why an optimisation loop stopped: `MinimizeResult.status` holds the
    code as a `[]` int32 array (inside `jit` a run cannot raise, so the status
    is the signal); `status_name(code)` spells it."""

    CONVERGED = 0  # the stopping test fired (relative change below tol)
    ITERATION_LIMIT = 1  # max_steps / num_epochs used up
    NON_FINITE_OBJECTIVE = 2  # the objective was NaN or +-inf (at the start: nothing done)
    LINE_SEARCH_FAILED = 3  # no trial step decreased the objective (the parameters stay put)


CONVERGED, ITERATION_LIMIT, NON_FINITE_OBJECTIVE, LINE_SEARCH_FAILED = (
    Status.CONVERGED, Status.ITERATION_LIMIT, Status.NON_FINITE_OBJECTIVE, Status.LINE_SEARCH_FAILED)


def status_name(code) -> str:
    """`'CONVERGED'`, `'ITERATION_LIMIT'`, `'NON_FINITE_OBJECTIVE'` or
    `'LINE_SEARCH_FAILED'` for a status code (an int or a concrete `[]` array)."""
    value = concrete(code)
    if value is None:
        raise TypeError("status_name needs a concrete status code, got a traced value (call it outside jit)")
    try:
        return Status(int(value)).name
    except ValueError:
        raise ValueError(f"code must be one of {[int(s) for s in Status]} (a minimize status), "
                         f"got {int(value)}") from None


def optimizer_status(opt_state) -> jax.Array:
    """`[]` int32 from the optimizer's own state: `LINE_SEARCH_FAILED` or
    `NON_FINITE_OBJECTIVE` when its last update could not move (`owlqn`'s
    `status`; an `optax.lbfgs` zoom line search that ended with a zero step
    and no sufficient decrease), else `CONVERGED` (no failure to report)."""
    def field(name):
        try:
            return optax.tree.get(opt_state, name)
        except KeyError:  # several fields of that name (a chain of transformations): no single signal
            return None

    code = field("status")
    if code is not None:
        return jnp.asarray(code, jnp.int32)
    rate, decrease_error = field("learning_rate"), field("decrease_error")
    if rate is None or decrease_error is None:
        return jnp.asarray(CONVERGED, jnp.int32)
    failed = (rate == 0) & (decrease_error > 0)
    return jnp.where(failed, jnp.int32(LINE_SEARCH_FAILED), jnp.int32(CONVERGED))


def halt_on_failure(inner, value) -> jax.Array:
    """`run_loop`'s `halt_fn` for `minimize` and `minimize_stochastic`: stop
    at a non-finite objective or a failed line search (another step would
    repeat the same failure)."""
    return ~jnp.isfinite(value) | (optimizer_status(inner[1]) >= NON_FINITE_OBJECTIVE)


def loop_status(loop: LoopState) -> jax.Array:
    """The `Status` code `[]` int32 of a finished `minimize` loop."""
    failure = optimizer_status(loop.inner[1])
    return jnp.where(~jnp.isfinite(loop.value), jnp.int32(NON_FINITE_OBJECTIVE),
                     jnp.where(failure == LINE_SEARCH_FAILED, jnp.int32(LINE_SEARCH_FAILED),
                               jnp.where(loop.done, jnp.int32(CONVERGED), jnp.int32(ITERATION_LIMIT))))


def _warn_on_failure(status) -> None:
    value = concrete(status)
    if value is not None and int(value) >= NON_FINITE_OBJECTIVE:
        warnings.warn(f"optimisation stopped early with status {status_name(value)} "
                      "(see MinimizeResult.status and .trace)", RuntimeWarning, stacklevel=3)


def check_callable(name: str, value) -> None:
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")


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
        return jnp.where(self.step > 0, jnp.where(~jnp.isfinite(self.value), jnp.int32(NON_FINITE_OBJECTIVE),
                                                  jnp.where(self.done, jnp.int32(CONVERGED),
                                                            jnp.int32(ITERATION_LIMIT))),
                         jnp.int32(ITERATION_LIMIT))


def init_loop(inner, max_steps: int, dtype=None) -> LoopState:
    """A fresh `LoopState` around the optimizer state `inner`."""
    max_steps = check_int("max_steps", max_steps)
    if dtype is None:
        dtype = jnp.result_type(float)
    return LoopState(inner, jnp.zeros((), jnp.int32), jnp.asarray(jnp.inf, dtype),
                     jnp.full((max_steps,), jnp.nan, dtype), jnp.zeros((), bool))


@functools.lru_cache(maxsize=None)
def relative_change_below(tol: float) -> Callable:
    """Stopping test `|previous - value| <= tol * max(|value|, 1)`; `tol = 0` never stops.

    Cached, so equal tolerances give the same function and jitted loops are re-used."""
    check_scalar("tol", tol, 0)

    def stop(previous, value):
        return (tol > 0) & (jnp.abs(previous - value) <= tol * jnp.maximum(jnp.abs(value), 1.0))

    return stop


def run_loop(step_fn: Callable, loop: LoopState, until, stop_fn: Callable,
             halt_fn: Optional[Callable] = None) -> LoopState:
    """Advance `loop` with `step_fn` until `until` steps in total, the trace is
    full, or `stop_fn(previous_value, value)` fires (or `halt_fn(inner,
    value)`, e.g. `halt_on_failure`). Jit-able (`until` may be traced;
    `step_fn`, `stop_fn` and `halt_fn` are static).

    step_fn: `(inner, step) -> (inner, objective)`; `step` is the int32 step index.
    """
    max_steps = loop.trace.shape[0]
    until = jnp.minimum(jnp.asarray(until, jnp.int32), max_steps)

    def cond(state):
        return (state.step < until) & ~state.done

    def body(state):
        inner, value = step_fn(state.inner, state.step)
        value = jnp.asarray(value, state.value.dtype)
        done = stop_fn(state.value, value)
        if halt_fn is not None:
            done = done | halt_fn(inner, value)
        return LoopState(inner, state.step + 1, value, state.trace.at[state.step].set(value), done)

    return jax.lax.while_loop(cond, body, loop)


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
    if getattr(opt_state, "evaluates_objective", False):
        return optimizer.update(None, opt_state, params, value_fn=fun)
    value, grad = _value_and_grad(fun, opt_state)(params)
    return optimizer.update(grad, opt_state, params, value=value, grad=grad, value_fn=fun)


def update_and_value(optimizer: optax.GradientTransformation, fun: Callable, params, opt_state):
    """One `optimizer_update`, applied: `(new params, opt_state, fun(new params))`.

    Line-search optimizers store `fun` at the new point, which is re-used
    (no extra evaluation); for others `fun` is evaluated there."""
    updates, opt_state = optimizer_update(optimizer, fun, params, opt_state)
    params = optax.apply_updates(params, updates)
    stored = optax.tree.get(opt_state, "value")
    return params, opt_state, fun(params) if stored is None else stored


def gradient_step_fn(fun: Callable, optimizer: optax.GradientTransformation,
                     penalty: Optional[Callable] = None) -> Callable:
    """The `step_fn` of one optax update on `inner = (params, opt_state)`.

    The objective recorded is `fun(params) + penalty(params)` at the new
    parameters (`penalty` is the non-smooth part the optimizer handles
    itself, e.g. `l1_penalty(...)` for `owlqn`).
    """
    def step_fn(inner, step):
        params, opt_state = inner
        if getattr(opt_state, "evaluates_objective", False):
            # owlqn evaluates `fun` itself and takes no step from a non-finite value.
            params, opt_state, value = update_and_value(optimizer, fun, params, opt_state)
        else:
            start, grad = _value_and_grad(fun, opt_state)(params)

            def move(_):
                updates, new_state = optimizer.update(grad, opt_state, params, value=start, grad=grad, value_fn=fun)
                new_params = optax.apply_updates(params, updates)
                stored = optax.tree.get(new_state, "value")
                value = fun(new_params) if stored is None else stored
                return new_params, new_state, jnp.asarray(value, jnp.result_type(start))

            # A NaN/inf objective at `params`: no update (it would spread NaN
            # into the parameters); the loop's `halt_on_failure` stops there.
            params, opt_state, value = jax.lax.cond(
                jnp.isfinite(start), move, lambda _: (params, opt_state, jnp.asarray(start)), None)
        return (params, opt_state), value if penalty is None else value + penalty(params)

    return step_fn


class MinimizeResult(NamedTuple):
    """params: the final parameters; state: the final optimizer state;
    trace: `[max_steps]` objective after each step (NaN past `num_steps`);
    num_steps: `[]` steps taken; status: `[]` int32 `Status` code
    (`CONVERGED`, `ITERATION_LIMIT`, `NON_FINITE_OBJECTIVE`,
    `LINE_SEARCH_FAILED`; `status_name(result.status)` spells it)."""

    params: Any
    state: Any
    trace: jax.Array
    num_steps: jax.Array
    status: jax.Array


def minimize(fun: Callable, params, optimizer: optax.GradientTransformation, *, max_steps: int,
             tol: float = 1e-9, penalty: Optional[Callable] = None) -> MinimizeResult:
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
      `MinimizeResult(params, state, trace [max_steps], num_steps, status)`.
    """
    check_callable("fun", fun)
    check_optimizer(optimizer)
    check_int("max_steps", max_steps)
    check_float_params(params)
    relative_change_below(tol)
    step_fn = gradient_step_fn(fun, optimizer, penalty)
    loop = init_loop((params, optimizer.init(params)), max_steps, _float_dtype(params))
    loop = run_loop(step_fn, loop, max_steps, relative_change_below(tol), halt_on_failure)
    (params, state) = loop.inner
    status = loop_status(loop)
    _warn_on_failure(status)
    return MinimizeResult(params, state, loop.trace, loop.step, status)


def _float_dtype(tree):
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.result_type(leaf), jnp.floating)]
    return jnp.result_type(*leaves) if leaves else jnp.result_type(float)


def num_examples(data) -> int:
    """The size `N` of the leading example axis shared by every leaf of `data`."""
    sizes = {jnp.shape(leaf)[0] if jnp.ndim(leaf) else None for leaf in jax.tree_util.tree_leaves(data)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"data must be a pytree of arrays sharing a leading example axis [N, ...], "
                         f"got leading sizes {sorted(map(str, sizes))}")
    return sizes.pop()


def epoch_step_fn(fun: Callable, optimizer: optax.GradientTransformation, data, *, batch_size: int,
                  penalty: Optional[Callable] = None) -> Callable:
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
        raise TypeError(f"batch_size must be an int in [1, {total}] (the number of examples), "
                        f"got {type(batch_size).__name__} {batch_size!r}")
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


def minimize_stochastic(fun: Callable, params, optimizer: optax.GradientTransformation, data, *, key,
                        batch_size: int, num_epochs: int, tol: float = 0.0,
                        penalty: Optional[Callable] = None) -> MinimizeResult:
    """Minibatch training for up to `num_epochs` epochs in one `while_loop`.

    fun: `(params, batch) -> loss summed over the batch`; data: pytree with a
    leading example axis `[N, ...]`; key: PRNG key for the shuffles. The
    trace holds the full objective after each epoch; `tol > 0` stops when
    its relative change falls below `tol`. Jit-able.
    """
    check_callable("fun", fun)
    check_optimizer(optimizer)
    check_int("num_epochs", num_epochs)
    check_float_params(params)
    relative_change_below(tol)
    step_fn = epoch_step_fn(fun, optimizer, data, batch_size=batch_size, penalty=penalty)
    loop = init_loop((params, optimizer.init(params), key), num_epochs, _float_dtype(params))
    loop = run_loop(step_fn, loop, num_epochs, relative_change_below(tol), halt_on_failure)
    params, state, _ = loop.inner
    status = loop_status(loop)
    _warn_on_failure(status)
    return MinimizeResult(params, state, loop.trace, loop.step, status)


run_loop_jit = jax.jit(run_loop, static_argnums=(0, 3, 4))
run_loop_jit.__doc__ = """`run_loop` compiled once per `(step_fn, stop_fn, halt_fn)` (pass the same objects to re-use it)."""


def drive(step_fn: Callable, loop: LoopState, *, stop_fn: Callable, chunk_steps: int = 100,
          until: Optional[int] = None, checkpoint_dir=None, keep: int = 2, progress: bool = True) -> LoopState:
    """Run a loop to completion from Python, in jitted chunks of `chunk_steps`.

    After each chunk the `LoopState` is written atomically to
    `checkpoint_dir/checkpoint-<step>.ckpt` (`lossfns.checkpoint`, keeping the
    newest `keep`). If `checkpoint_dir` already holds a checkpoint, the run
    resumes from it (`loop` then only supplies the structure), and ends
    bit-identical to an uninterrupted run. `until` stops after that many
    steps in total (a time-boxed run, resumed later). `progress` shows a tqdm bar with
    the current objective when tqdm is installed.
    """
    check_int("chunk_steps", chunk_steps)
    check_int("keep", keep)
    if until is not None:
        check_int("until", until, 0)
    # One writer per checkpoint directory (`checkpoint.DirectoryLock`, which
    # creates it): a second run on it gets a CheckpointError naming it.
    with checkpoint.locked(checkpoint_dir):
        if checkpoint_dir is not None:
            checkpoint_dir = Path(checkpoint_dir)
            latest = checkpoint.latest_checkpoint(checkpoint_dir)
            if latest is not None:
                loop = checkpoint.load(latest, loop)
        max_steps = loop.trace.shape[0]
        until = max_steps if until is None else min(until, max_steps)
        bar = _progress_bar(max_steps, int(loop.step)) if progress else None
        while int(loop.step) < until and not bool(loop.done):
            before = int(loop.step)
            loop = run_loop_jit(step_fn, loop, min(before + chunk_steps, until), stop_fn)
            if bar is not None:
                bar.update(int(loop.step) - before)
                bar.set_postfix(objective=float(loop.value))
            if checkpoint_dir is not None:
                checkpoint.save(checkpoint.checkpoint_path(checkpoint_dir, int(loop.step)), loop)
                checkpoint.prune_checkpoints(checkpoint_dir, keep)
        if bar is not None:
            bar.close()
    return loop


def _progress_bar(total: int, initial: int):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is an optional extra: run silently without it
        return None
    return tqdm(total=total, initial=initial, unit="step")
