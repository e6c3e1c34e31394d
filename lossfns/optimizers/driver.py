"""The training driver: every long run (the Tagger, the experiments) is this loop.

`drive` runs a `LoopState` to its end from Python in jitted chunks of
`minimize.advance`, its data an argument of the compiled chunk, and adds what a long
run needs: stop rules inside the compiled loop or host `callback`s, a progress bar,
atomic checkpoints that resume bit-identically (a checkpoint of other data or
settings is refused), and a device mesh (`lossfns.parallel`). `train` is the driver
for an objective `(params, data) -> scalar` and an optax-shaped optimizer; compiled
chunks are cached by `(make_step, stop, shapes)`, so equal shapes compile once.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from .. import checkpoint, compilation_cache, parallel
from ..validation import check_callable, check_float_params, check_int, check_optimizer, check_scalar
from .minimize import (
    GradientSteps,
    LoopState,
    Result,
    StopRule,
    advance,
    float_dtype,
    init_loop,
    minimize_result,
    relative_change_below,
)


class Report(NamedTuple):
    """What a `drive` callback sees after each chunk: `step` steps done,
    `value` the objective after the last, `trace` `[step]` the objectives so
    far (numpy), `inner` the optimizer state pytree (for `train`:
    `(params, opt_state)`)."""

    step: int
    value: float
    trace: np.ndarray
    inner: Any


def describe(value):
    """A JSON-able description of a setting that is the same in every
    process: callables by qualified name (a closure's captured values are not
    seen), partials with their arguments, never an object's address."""
    if isinstance(value, functools.partial):
        return [
            describe(value.func),
            [describe(a) for a in value.args],
            {k: describe(v) for k, v in sorted(value.keywords.items())},
        ]
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in sorted(value.items(), key=lambda item: str(item[0]))}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    text = repr(value)
    return type(value).__qualname__ if " at 0x" in text else text


def fingerprint(data, settings=None) -> np.ndarray:
    """SHA-256 `[32]` uint8 of `settings` (through `describe`) and of every
    leaf of `data` (structure, shapes, dtypes and bytes): what a checkpoint
    must match to be resumed."""
    digest = hashlib.sha256(json.dumps(describe(settings)).encode("utf-8"))
    leaves, structure = jax.tree_util.tree_flatten(data)
    digest.update(str(structure).encode("utf-8"))
    for leaf in leaves:
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(array.tobytes())
    return np.frombuffer(digest.digest(), dtype=np.uint8).copy()


def _strong(tree):
    """`tree` without weakly typed leaves (optax's initial states hold some;
    a chunk returns strong ones, which a compiled chunk would refuse)."""
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, x.dtype) if getattr(x, "weak_type", False) else x, tree)


class Recorded(NamedTuple):
    """`drive`'s `make_step` with `record`: the loop's inner state is the
    step's own tuple with `{name: [max_steps]}` arrays appended last (so
    `inner[0]`, `inner[1]`, what `minimize.halt_on_failure` reads, stay the
    params and the optimizer state), and after each step `record(inner,
    data)`'s scalars are written at that step's index, in the compiled loop.

    kind: the step's inner tuple type (a NamedTuple), None for a plain tuple."""

    make_step: Callable
    record: Callable
    kind: type | None = None

    def __call__(self, data):
        step_fn = self.make_step(data)

        def recorded(state, step):
            inner, value = step_fn(_without_records(state, self.kind), step)
            values = self.record(inner, data)
            records = {
                name: column.at[step].set(jnp.asarray(values[name], column.dtype)) for name, column in state[-1].items()
            }
            return (*inner, records), value

        return recorded


def _without_records(inner, kind: type | None):
    """The step's own inner state of a recorded loop's (`Recorded`)."""
    fields = inner[:-1]
    return tuple(fields) if kind is None else kind(*fields)


def _with_records(make_step, record: Callable, loop: LoopState, data) -> tuple[Recorded, LoopState]:
    """`(Recorded(make_step, record, kind), loop)` with `{name: [max_steps]}`
    arrays (NaN, or -1 for integers, until recorded) appended to its inner
    tuple, their dtypes those of `record(inner, data)`'s scalars."""
    inner = loop.inner
    if not isinstance(inner, tuple):
        raise TypeError(f"record needs a loop whose inner state is a tuple, got {type(inner).__name__}")
    kind = type(inner) if hasattr(inner, "_fields") else None
    shapes = jax.eval_shape(lambda inner, data: record(inner, data), inner, data)  # a NamedTuple takes no weakref
    if not isinstance(shapes, dict) or any(getattr(v, "shape", None) != () for v in shapes.values()):
        raise TypeError(f"record must return a dict of scalars, got {shapes!r:.200}")
    max_steps = loop.trace.shape[0]
    records = _unrecorded(max_steps, tuple((str(name), jnp.dtype(shape.dtype)) for name, shape in shapes.items()))
    return Recorded(make_step, record, kind), loop._replace(inner=(*inner, records))


@functools.partial(jax.jit, static_argnums=(0, 1))  # one program, not one per column
def _unrecorded(max_steps: int, columns: tuple) -> dict:
    """`{name: [max_steps]}` of NaN (-1 for integers) for `columns`, `((name, dtype), ...)`."""
    return {
        name: jnp.full((max_steps,), jnp.nan if jnp.issubdtype(dtype, jnp.inexact) else -1, dtype)
        for name, dtype in columns
    }


class Evaluation(NamedTuple):
    """Early stopping on a development set, for `drive(evaluation=)`.

    score: `(inner, step) -> float`, higher is better; asked at the start,
      every `every` steps (chunks end there), when the loop stops or reaches
      `max_steps`, and at the end of a run that reached `until` (once per step).
    patience: stop (status `CONVERGED`) once the last `patience` scores beat
      none before them by more than `min_improvement`; None: never.
    keep: `inner -> pytree`, what the best score's state keeps (default the
      inner state); a score counts as best when it beats all before it by
      more than `min_improvement`.
    """

    score: Callable
    every: int = 1
    patience: int | None = None
    min_improvement: float = 0.0
    keep: Callable | None = None

    def kept(self, inner):
        return inner if self.keep is None else self.keep(inner)


def _evaluations(evaluation: Evaluation, max_steps: int, inner) -> dict:
    """The host state of an `Evaluation`, in fixed shapes (a checkpoint
    holds it): `evaluations [E, 2]` (step, score; NaN until asked), `count`,
    `best` (`keep` of the best score's state), `plateau`."""
    best = jax.tree_util.tree_map(np.asarray, evaluation.kept(inner))
    return {
        "evaluations": np.full((-(-max_steps // evaluation.every) + 2, 2), np.nan),
        "count": np.zeros((), np.int64),
        "best": best,
        "plateau": np.zeros((), bool),
    }


def _evaluate(evaluation: Evaluation, state: dict, inner, step: int) -> dict:
    """`state` after `evaluation.score(inner, step)` (unchanged when this step was scored)."""
    count, history = int(state["count"]), state["evaluations"].copy()
    if count and history[count - 1, 0] == step:
        return state
    score = float(evaluation.score(inner, step))
    best = state["best"]
    if count == 0 or score > np.max(history[:count, 1]) + evaluation.min_improvement:
        best = jax.tree_util.tree_map(np.asarray, evaluation.kept(inner))
    history[count] = (step, score)
    count += 1
    plateau, patience = state["plateau"], evaluation.patience
    if patience is not None and count > patience:
        recent, earlier = history[count - patience : count, 1], history[: count - patience, 1]
        plateau = np.asarray(np.max(recent) <= np.max(earlier) + evaluation.min_improvement)
    return {"evaluations": history, "count": np.asarray(count), "best": best, "plateau": plateau}


class _UnrecordedHalt(NamedTuple):
    """A `halt` that sees the step's own inner state of a recorded loop."""

    halt: Callable
    kind: type | None

    def __call__(self, inner, value):
        return self.halt(_without_records(inner, self.kind), value)


def _compiled_chunk(make_step, stop, halt, loop, data, mesh):
    """`advance(make_step, stop, loop, until, data, halt)` compiled for these
    shapes (and shardings): `(executable, seconds spent compiling or loading it)`."""

    options: dict[str, Any] = {}
    if mesh is not None:
        copy = NamedSharding(mesh, PartitionSpec())
        split = NamedSharding(mesh, PartitionSpec(parallel.data_axis(mesh)))
        options = dict(in_shardings=(copy, copy, jax.tree_util.tree_map(lambda _: split, data)), out_shardings=copy)
    arguments = (loop, np.zeros((), np.int32), data)
    chunk = functools.partial(_advance_chunk, make_step, stop, halt)
    return compilation_cache.compiled((make_step, stop, halt, mesh), arguments, chunk, **options)


def _advance_chunk(make_step, stop, halt, loop, until, data):
    return advance(make_step, stop, loop, until, data, halt)


def _resume(directory: Path, like: dict, stamp: np.ndarray) -> dict | None:
    """The newest checkpoint in `directory`, read as `like` (`{fingerprint,
    loop, run_seconds[, evaluation]}`), or None when there is none."""
    latest = checkpoint.latest_checkpoint(directory)
    if latest is None:
        return None
    refusal = (
        f"checkpoint_dir {directory}: {latest.name} was written for other data or other training "
        "settings; use a new directory (or delete this one) to start afresh"
    )
    like = dict(like)
    try:
        # Checkpoints written before the driver kept its time hold none: they resume from 0 s.
        if all(leaf["path"] != "['run_seconds']" for leaf in checkpoint.read_header(latest)["leaves"]):
            del like["run_seconds"]
        # `latest_checkpoint` skipped damaged files, so a failure here is a structure mismatch.
        restored = checkpoint.load(latest, like)
    except checkpoint.CheckpointError as error:
        raise checkpoint.CheckpointError(f"{refusal} ({error})") from None
    if not np.array_equal(np.asarray(restored["fingerprint"]), stamp):
        raise checkpoint.CheckpointError(refusal)
    return restored


def _progress_bar(show: bool, total: int, initial: int, description: str | None):
    if not show:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is an optional extra: run silently without it
        return None
    return tqdm(total=total, initial=initial, unit="step", desc=description, leave=False)


def drive(
    make_step: Callable,
    loop: LoopState,
    data=None,
    *,
    stop: StopRule,
    halt: Callable | None = None,
    until: int | None = None,
    time_limit: float | None = None,
    chunk_steps: int = 1,
    checkpoint_dir=None,
    checkpoint_every: int = 1,
    keep: int = 1,
    settings=None,
    progress: bool | None = None,
    callback: Callable | None = None,
    evaluation: Evaluation | None = None,
    mesh=None,
    description: str | None = None,
    record: Callable | None = None,
) -> Result:
    """Run `loop` to its end: `advance(make_step, stop, loop, until, data, halt)`
    in jitted chunks of `chunk_steps` steps.

    make_step: `data -> step_fn` (`minimize.run_loop`'s `(inner, step) ->
      (inner, objective)`), a value or a module-level function (the compiled
      chunk is cached by it); data: a pytree of arrays, or None.
    stop: the stop rule, `(trace, num_steps) -> bool` (`minimize.StopRule`).
    halt: `(inner, value) -> [] bool`, a trainer's own stop test on its
      state, asked after each step besides the failure test
      (`minimize.halt_on_failure`); a value or module-level function.
    until: stop after this many steps in total (a time-boxed run, resumed
      later); default the loop's `max_steps`.
    time_limit: stop at the first chunk end once the run's seconds (its
      chunks and checkpoint saves, summed over the runs it resumed:
      `Result.run_seconds`) reach this many, with a checkpoint there (a time-boxed run: the loop is not
      done, its status `ITERATION_LIMIT`); default no limit.
    checkpoint_dir: save `{fingerprint, loop, run_seconds[, evaluation]}` there every `checkpoint_every`
      steps (at chunk ends) and at the end, keeping the newest `keep`; resume
      from the newest checkpoint found. `settings` (any value, described by
      `describe`) and `data` make the fingerprint a checkpoint must match.
    progress: a tqdm bar (default: when the loop has more than 20 steps).
    callback: `Report -> bool | None` after each chunk; True stops the run
      (the loop is `done`: status `CONVERGED`).
    evaluation: an `Evaluation` (scores on a development set, early stopping
      and the best state), kept in the checkpoints; its scores and best state
      are the result's `records["evaluations"]` `[E, 2]` and `records["best"]`.
    mesh: split `data` along its leading axis over the mesh's data axis
      (`parallel.shard_leading_axis`); the loop is replicated.
    record: `(inner, data) -> {name: scalar}` of the state after each step
      (e.g. `elastic_net.ElasticNetRecord`: the weights' norm, the gradient's),
      run in the compiled loop and kept on the device until the end (no
      per-step transfer); a value or module-level function, as `make_step`.
      It needs a tuple inner state; callbacks and the result see the loop
      without the records, and a checkpoint holds them.
    Returns a `Result`: `params` the final inner state (the caller knows
    which part of it are the parameters: `train` takes `inner[0]`), `state`
    the final `LoopState` (`drive(make_step, result.state, ...)` continues
    the run), trace, num_steps and status (`LoopState.status`) of that loop;
    compile_seconds: compiling the chunk (0 when cached or nothing was left
    to run); run_seconds: the chunks and the checkpoint saves before
    each (callbacks and evaluations excluded), summed over the runs that wrote the checkpoint this run resumed from (so
    a resumed run reports its whole time); step_seconds: `[num_steps]` numpy,
    each step's share of its chunk's time (NaN for the steps a resumed
    checkpoint holds); records: with `record`, `{name: [num_steps]}` numpy
    (and `evaluation`'s, above).
    """
    check_callable("make_step", make_step)
    check_callable("stop", stop)
    check_int("chunk_steps", chunk_steps)
    check_int("checkpoint_every", checkpoint_every)
    check_int("keep", keep)
    for name, value in (("halt", halt), ("callback", callback)):
        if value is not None:
            check_callable(name, value)
    if evaluation is not None:
        if not isinstance(evaluation, Evaluation):
            raise TypeError(f"evaluation must be a driver.Evaluation or None, got {type(evaluation).__name__}")
        check_callable("evaluation.score", evaluation.score)
        check_int("evaluation.every", evaluation.every)
    max_steps = loop.trace.shape[0]
    until = max_steps if until is None else min(check_int("until", until, 0), max_steps)
    if time_limit is not None:
        check_scalar("time_limit", time_limit, 0.0)
        time_limit = float(time_limit)
    unwrapped = None  # the loop without its records (`Recorded`)
    if record is not None:
        check_callable("record", record)
        recorded, loop = _with_records(make_step, record, loop, data)
        make_step, unwrapped = recorded, functools.partial(_without_records, kind=recorded.kind)
        halt = None if halt is None else _UnrecordedHalt(halt, recorded.kind)
    inner_of = (lambda inner: inner) if unwrapped is None else unwrapped
    loop = _strong(loop)
    scores = None if evaluation is None else _evaluations(evaluation, max_steps, inner_of(loop.inner))
    # One writer per checkpoint directory (`checkpoint.DirectoryLock`, which
    # creates it): a second run on it gets a CheckpointError naming it.
    with checkpoint.locked(checkpoint_dir):
        run_seconds = 0.0
        if checkpoint_dir is not None:
            checkpoint_dir, stamp = Path(checkpoint_dir), fingerprint(data, settings)
            like = {"fingerprint": stamp, "loop": loop, "run_seconds": np.zeros((), np.float64)}
            restored = _resume(checkpoint_dir, like if scores is None else {**like, "evaluation": scores}, stamp)
            if restored is not None:
                loop, run_seconds = _strong(restored["loop"]), float(restored.get("run_seconds", 0.0))
                if scores is not None:
                    scores = jax.tree_util.tree_map(np.asarray, restored["evaluation"])
        if mesh is None:  # on the device once, not copied from the host by every chunk
            data = jax.device_put(data)
        else:
            data, loop = parallel.shard_leading_axis(data, mesh), parallel.replicate(loop, mesh)
        step, saved = int(loop.step), int(loop.step)
        if evaluation is not None and scores is not None:  # (scores is None exactly without evaluation)
            scores = _evaluate(evaluation, scores, inner_of(loop.inner), step)
        step_seconds = np.full(max_steps, np.nan)
        bar = _progress_bar(max_steps > 20 if progress is None else progress, max_steps, step, description)
        executable, compile_seconds, saving_seconds = None, 0.0, 0.0
        out_of_time = time_limit is not None and run_seconds >= time_limit
        while (
            step < until
            and not out_of_time
            and not bool(loop.done)
            and not (scores is not None and bool(scores["plateau"]))
        ):
            if executable is None:
                executable, compile_seconds = _compiled_chunk(make_step, stop, halt, loop, data, mesh)
            end = min(step + chunk_steps, until)
            if evaluation is not None:  # a chunk ends at each evaluation
                end = min(end, (step // evaluation.every + 1) * evaluation.every)
            start = time.perf_counter()
            loop = executable(loop, np.asarray(end, np.int32), data)
            before, step = step, int(loop.step)  # int() waits for the chunk
            seconds = time.perf_counter() - start
            # The last checkpoint's save is charged here, so that the seconds a
            # checkpoint holds are the run's when it resumes from there.
            run_seconds += seconds + saving_seconds
            saving_seconds = 0.0
            out_of_time = time_limit is not None and run_seconds >= time_limit
            step_seconds[before:step] = seconds / max(step - before, 1)
            if bar is not None:
                bar.update(step - before)
                bar.set_postfix(objective=float(loop.value))
            stopped = False
            if (
                evaluation is not None
                and scores is not None
                and (step % evaluation.every == 0 or bool(loop.done) or step == max_steps)
            ):
                scores = _evaluate(evaluation, scores, inner_of(loop.inner), step)
                stopped = bool(scores["plateau"])
            # The trace is sliced on the host: a device slice per step length compiles a program each.
            if callback is not None and callback(
                Report(step, float(loop.value), np.asarray(loop.trace)[:step], inner_of(loop.inner))
            ):
                stopped = True
            if stopped:
                done = jnp.ones((), bool)
                loop = loop._replace(done=done if mesh is None else parallel.replicate(done, mesh))
            finished = step >= until or out_of_time or bool(loop.done)
            if checkpoint_dir is not None and (step - saved >= checkpoint_every or (finished and step > saved)):
                saving = time.perf_counter()
                state = {"fingerprint": stamp, "loop": loop, "run_seconds": np.asarray(run_seconds, np.float64)}
                checkpoint.save(
                    checkpoint.checkpoint_path(checkpoint_dir, step),
                    state if scores is None else {**state, "evaluation": scores},
                )
                checkpoint.prune_checkpoints(checkpoint_dir, keep)
                saved, saving_seconds = step, time.perf_counter() - saving
        if bar is not None:
            bar.close()
    records = None
    if unwrapped is not None:
        records = {name: np.asarray(column)[:step] for name, column in loop.inner[-1].items()}
        loop = loop._replace(inner=unwrapped(loop.inner))
    if evaluation is not None and scores is not None:
        if step >= until:
            scores = _evaluate(evaluation, scores, loop.inner, step)
        count = int(scores["count"])
        records = {**(records or {}), "evaluations": scores["evaluations"][:count], "best": scores["best"]}
    return Result(
        loop.inner, loop, loop.trace, loop.step, loop.status, compile_seconds, run_seconds, step_seconds[:step], records
    )


def train(
    objective: Callable,
    params,
    optimizer: optax.GradientTransformation,
    data=None,
    *,
    max_steps: int,
    stop: StopRule | None = None,
    regularizer: Callable | None = None,
    penalty: Callable | None = None,
    mesh=None,
    **drive_options,
) -> Result:
    """Minimise `objective(params, data) (+ regularizer(params))` with an
    optax-shaped optimizer, through `drive`.

    objective: `(params, data) -> scalar`; with a `mesh`, a sum over the
      examples along the data's leading axis (each device sums its block).
    regularizer: a smooth `params -> scalar` added to the objective (the L2
      term of a non-OWL-QN optimizer), outside the per-shard sum.
    penalty: the non-smooth part the optimizer handles itself (`owlqn`'s
      `elastic_net_penalty`): added to the recorded objective only.
    stop: default `relative_change_below(1e-9)`.
    drive_options: `until`, `time_limit`, `chunk_steps`, `checkpoint_dir`,
      `checkpoint_every`, `keep`, `settings`, `progress`, `callback`,
      `description`, `record` (see `drive`).
    Returns `Result(params, state, trace [max_steps], num_steps, status,
    compile_seconds, run_seconds, step_seconds, records)`, the optimizer's
    state as `state`; a run that stopped on a failure (status
    `NON_FINITE_OBJECTIVE`, `LINE_SEARCH_FAILED`) warns.
    """
    check_callable("objective", objective)
    check_optimizer(optimizer)
    check_float_params(params)
    if regularizer is not None:
        check_callable("regularizer", regularizer)
    if mesh is not None:
        objective = parallel.sum_over_shards(objective, mesh)
    make_step = GradientSteps(objective, optimizer, regularizer, penalty)
    return train_steps(
        make_step, (params, optimizer.init(params)), data, max_steps=max_steps, stop=stop, mesh=mesh, **drive_options
    )


def train_steps(
    make_step: Callable,
    inner: tuple,
    data=None,
    *,
    max_steps: int,
    stop: StopRule | None = None,
    mesh=None,
    **drive_options,
) -> Result:
    """`drive` a gradient loop from `inner = (params, opt_state)`: `train`
    with a `make_step` of the caller's (`data -> step_fn`, e.g. one that reads
    hyper-parameters from `data`, so that runs differing only in them share a
    compiled program). Arguments and result as `train`'s."""
    check_int("max_steps", max_steps)
    loop = init_loop(inner, max_steps, float_dtype(inner[0]))
    stop = relative_change_below(1e-9) if stop is None else stop
    run = drive(make_step, loop, data, stop=stop, mesh=mesh, **drive_options)
    result = minimize_result(run.state)
    return run._replace(params=result.params, state=result.state, status=result.status)
