"""The training driver (`optimizers.driver`): stop rules on the objective
trace against a Python restatement of CRFsuite's test, `minimize` and
`train` as the same loop (bit-identical), per-chunk callbacks that can stop
a run, checkpoints refused for other data or settings and resumed
bit-identically, and the optimizer choice of `elastic_net_training`."""

import contextlib
import functools
import time
from typing import NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lossfns import checkpoint, optimizers
from lossfns.lattices import chain
from lossfns.optimizers.driver import describe, fingerprint
from lossfns.optimizers.minimize import run_loop_jit

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

TRACE = np.array([100.0, 60.0, 40.0, 30.0, 29.0, 28.5, 28.4, 28.39, 28.389, 28.3889, 28.3888, 28.3888])


# An SGD-like trace that rises for a while before it settles.
NOISY = np.array([100.0, 60.0, 50.0, 52.0, 55.0, 54.0, 50.0, 49.0, 48.99, 48.985, 48.984, 48.9839])


def test_a_rise_stops_crfsuite_rule_but_not_the_change_over_a_period():
    """The case that tells the two period rules apart: NOISY rises over
    steps 3-5, which CRFsuite's rule takes for convergence."""
    assert _crfsuite_stops_after(NOISY, 1e-3, 2) == 5
    assert _settled_stops_after(NOISY, 1e-3, 2) == 10


def _replay(values):
    """`make_step` of a loop whose objective after step k is `values[k]`."""
    return lambda data: lambda inner, step: (inner, jnp.asarray(values)[step])


def _crfsuite_stops_after(values, tol, period):
    """CRFsuite's rule, restated: after each iteration, stop when
    `(f[k - period] - f[k]) / f[k] < tol` (at least `period + 1` values)."""
    for k in range(len(values)):
        history = values[: k + 1]
        if tol > 0 and len(history) > period and (history[-1 - period] - history[-1]) / abs(history[-1]) < tol:
            return k + 1
    return len(values)


def _settled_stops_after(values, tol, period):
    """Like `_crfsuite_stops_after`, but on the absolute change: a rise never stops."""
    for k in range(len(values)):
        history = values[: k + 1]
        if tol > 0 and len(history) > period and abs(history[-1 - period] - history[-1]) / abs(history[-1]) < tol:
            return k + 1
    return len(values)


def _relative_change_stops_after(values, tol):
    for k in range(1, len(values)):
        if tol > 0 and abs(values[k - 1] - values[k]) <= tol * max(abs(values[k]), 1.0):
            return k + 1
    return len(values)


@pytest.mark.parametrize("tol, period", [(1e-2, 1), (1e-3, 2), (1e-4, 3), (0.0, 2), (1e-6, 1)])
def test_stop_rules_fire_where_their_definitions_say(tol, period):
    loop = optimizers.init_loop(jnp.zeros(()), len(TRACE), jnp.float64)
    rules = [
        (optimizers.relative_improvement_below(tol, period), _crfsuite_stops_after(TRACE, tol, period)),
        (optimizers.relative_change_below(tol), _relative_change_stops_after(TRACE, tol)),
        (optimizers.relative_change_over(tol, period), _settled_stops_after(TRACE, tol, period)),
        (optimizers.relative_improvement_below(tol, period), _crfsuite_stops_after(NOISY, tol, period), NOISY),
        (optimizers.relative_change_over(tol, period), _settled_stops_after(NOISY, tol, period), NOISY),
    ]
    for rule, expected, *values in rules:
        values = values[0] if values else TRACE
        done = run_loop_jit(_replay(values)(None), loop, len(values), rule)
        assert int(done.step) == expected, (rule, expected)
        status = int(done.status)
        stopped = expected < len(values) or bool(done.done)
        assert status == (optimizers.Status.CONVERGED if stopped else optimizers.Status.ITERATION_LIMIT)


def _crf_objective(params, data):
    """Summed CRF log-loss of factored potentials `features @ weights`."""
    potentials = chain.FactoredPotentials(data["features"] @ params["weights"], params["transitions"])
    return jnp.sum(
        chain.log_partition(potentials, data["lengths"]) - chain.score(potentials, data["labels"], data["lengths"])
    )


@pytest.fixture(scope="module")
def crf():
    rng = np.random.default_rng(0)
    data = {
        "features": rng.normal(size=(6, 5, 4)),
        "labels": rng.integers(0, 3, size=(6, 5)).astype(np.int32),
        "lengths": np.array([5, 4, 3, 5, 1, 0], np.int32),
    }
    params = {"weights": jnp.zeros((4, 3)), "transitions": jnp.zeros((3, 3))}
    return data, params


@pytest.mark.parametrize("optimizer", ["lbfgs", "owlqn"])
def test_train_in_chunks_is_minimize_bit_for_bit(crf, optimizer):
    """`minimize` is one chunk of the loop the driver runs in chunks."""
    data, params = crf
    make = {"lbfgs": lambda: optax.lbfgs(), "owlqn": lambda: optimizers.owlqn(0.5, 0.1)}[optimizer]
    penalty = optimizers.elastic_net_penalty(0.5, 0.1) if optimizer == "owlqn" else None
    whole = optimizers.minimize(
        functools.partial(_crf_objective, data=data), params, make(), max_steps=15, tol=1e-12, penalty=penalty
    )
    chunked = optimizers.train(
        _crf_objective,
        params,
        make(),
        data,
        max_steps=15,
        penalty=penalty,
        stop=optimizers.relative_change_below(1e-12),
        chunk_steps=4,
        progress=False,
    )
    assert int(whole.num_steps) == int(chunked.num_steps) > 5
    np.testing.assert_array_equal(np.asarray(whole.trace), np.asarray(chunked.trace))
    for a, b in zip(jax.tree_util.tree_leaves(whole.params), jax.tree_util.tree_leaves(chunked.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(whole.status) == int(chunked.status)


def test_callback_sees_every_chunk_and_can_stop_the_run(crf):
    data, params = crf
    reports = []

    def callback(report):
        reports.append(report)
        return report.step >= 5  # a host-side rule: stop after 5 steps

    result = optimizers.train(
        _crf_objective,
        params,
        optax.lbfgs(),
        data,
        max_steps=30,
        callback=callback,
        stop=optimizers.relative_change_below(0.0),
        chunk_steps=2,
        progress=False,
    )
    assert [r.step for r in reports] == [2, 4, 6] and int(result.num_steps) == 6
    assert int(result.status) == optimizers.Status.CONVERGED
    np.testing.assert_array_equal(reports[-1].trace, np.asarray(result.trace)[:6])
    assert reports[-1].value == float(result.trace[5])
    assert set(reports[-1].inner[0]) == {"weights", "transitions"}


def _twelve_lbfgs_steps(params, **options):
    """`optimizers.train` of the CRF objective from `params`: 12 L-BFGS steps, no stop before them."""
    return functools.partial(
        optimizers.train,
        _crf_objective,
        params,
        optax.lbfgs(),
        max_steps=12,
        stop=optimizers.relative_change_below(0.0),
        progress=False,
        **options,
    )


def test_checkpoints_resume_bit_identically_and_refuse_other_data_or_settings(crf, tmp_path):
    data, params = crf
    run = _twelve_lbfgs_steps(params, settings={"run": 1})
    straight = run(data)
    first = run(data, checkpoint_dir=tmp_path, until=5, checkpoint_every=2)
    assert int(first.num_steps) == 5 and checkpoint.latest_checkpoint(tmp_path) == checkpoint.checkpoint_path(
        tmp_path, 5
    )
    other = dict(data, labels=(data["labels"] + 1) % 3)
    with pytest.raises(checkpoint.CheckpointError, match="other data or other training settings"):
        run(other, checkpoint_dir=tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match="other data or other training settings"):
        optimizers.train(
            _crf_objective,
            params,
            optax.lbfgs(),
            data,
            max_steps=12,
            checkpoint_dir=tmp_path,
            stop=optimizers.relative_change_below(0.0),
            progress=False,
            settings={"run": 2},
        )
    resumed = run(data, checkpoint_dir=tmp_path)
    np.testing.assert_array_equal(np.asarray(resumed.trace), np.asarray(straight.trace))
    for a, b in zip(jax.tree_util.tree_leaves(resumed.params), jax.tree_util.tree_leaves(straight.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert resumed.compile_seconds >= 0 and resumed.run_seconds > 0


def test_a_resumed_run_reports_the_seconds_of_the_runs_before_it(crf, tmp_path):
    """run_seconds is summed over the runs that wrote the checkpoint: the
    checkpoint holds the first run's seconds, and a resumed run adds its own
    to them. A checkpoint without a time (written before the driver kept
    one) still resumes, from 0 s."""
    data, params = crf
    run = functools.partial(_twelve_lbfgs_steps(params, checkpoint_every=1), data)
    first = run(checkpoint_dir=tmp_path / "new", until=10)
    optimizer = optax.lbfgs()
    like = {
        "fingerprint": fingerprint(data),
        "loop": optimizers.init_loop((params, optimizer.init(params)), 12),
        "run_seconds": np.zeros((), np.float64),
    }
    stored = checkpoint.load(checkpoint.checkpoint_path(tmp_path / "new", 10), like)
    assert float(stored["run_seconds"]) == first.run_seconds > 0
    # Resumed with nothing left to run, a run reports exactly the stored time.
    assert run(checkpoint_dir=tmp_path / "new", until=10).run_seconds == first.run_seconds
    resumed = run(checkpoint_dir=tmp_path / "new")
    assert int(resumed.num_steps) == 12 and resumed.run_seconds > first.run_seconds

    del stored["run_seconds"]  # the layout before the driver kept its time
    (tmp_path / "old").mkdir()
    checkpoint.save(checkpoint.checkpoint_path(tmp_path / "old", 10), stored)
    assert run(checkpoint_dir=tmp_path / "old", until=10).run_seconds == 0.0
    old = run(checkpoint_dir=tmp_path / "old")
    np.testing.assert_array_equal(np.asarray(old.trace), np.asarray(resumed.trace))


def test_a_time_limit_stops_at_a_chunk_end_with_a_checkpoint_that_resumes(crf, tmp_path):
    """`time_limit` counts the run's seconds (`run_seconds`, the resumed
    runs' included): the chunk that reaches it ends the run, not done, with
    a checkpoint; a resumed run that has no time left runs nothing, and one
    without a limit ends where an uninterrupted run ends."""
    data, params = crf
    run = functools.partial(_twelve_lbfgs_steps(params, chunk_steps=3, checkpoint_dir=tmp_path), data)
    boxed = run(time_limit=1e-9)  # any chunk takes longer: one chunk runs
    assert int(boxed.num_steps) == 3 and boxed.run_seconds > 1e-9
    assert int(boxed.status) == optimizers.Status.ITERATION_LIMIT
    assert checkpoint.latest_checkpoint(tmp_path) == checkpoint.checkpoint_path(tmp_path, 3)
    again = run(time_limit=boxed.run_seconds)  # the stored seconds already reach it
    assert int(again.num_steps) == 3 and again.run_seconds == boxed.run_seconds
    finished = run()
    straight = _twelve_lbfgs_steps(params)(data)
    assert int(finished.num_steps) == 12
    np.testing.assert_array_equal(np.asarray(finished.trace), np.asarray(straight.trace))
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="time_limit"):
            run(time_limit=bad)


def test_a_time_limit_counts_the_checkpoint_saves(crf, tmp_path, monkeypatch):
    """A save of 0.3 s after each 3-step chunk (each of milliseconds): a box
    of 0.45 s ends the run after the third chunk (0.6 s of saves before it),
    the seconds the run reports are the ones its last checkpoint holds, and
    the resumed run reports them again."""
    data, params = crf
    save = checkpoint.save

    def slow_save(path, state):
        time.sleep(0.3)
        save(path, state)

    monkeypatch.setattr(checkpoint, "save", slow_save)
    run = functools.partial(_twelve_lbfgs_steps(params, chunk_steps=3, checkpoint_dir=tmp_path), data)
    boxed = run(time_limit=0.45)
    assert int(boxed.num_steps) == 9 and 0.6 <= boxed.run_seconds < 1.0
    assert int(boxed.status) == optimizers.Status.ITERATION_LIMIT
    assert run(time_limit=0.45).run_seconds == boxed.run_seconds


def test_fingerprint_and_describe_see_data_and_settings_not_addresses():
    data = {"x": np.arange(3.0)}
    assert np.array_equal(fingerprint(data, [1, "a"]), fingerprint(dict(data), [1, "a"]))
    assert not np.array_equal(fingerprint(data), fingerprint({"x": np.arange(3.0) + 1}))
    assert not np.array_equal(fingerprint(data), fingerprint({"x": np.arange(3.0, dtype=np.float32)}))
    described = describe([functools.partial(jnp.sum, axis=0), optax.lbfgs(), lambda x: x])
    assert described[0][0].endswith("sum") and "0x" not in str(described)


def test_elastic_net_training_chooses_the_optimizer_and_its_terms():
    w = {"a": jnp.array([1.0, -2.0])}
    owl = optimizers.elastic_net_training(0.5, 0.2)
    assert owl.regularizer is None and float(owl.penalty(w)) == pytest.approx(0.5 * 3 + 0.1 * 5)
    smooth = optimizers.elastic_net_training(0.0, 0.2, regularizer=lambda p: jnp.sum(p["a"]))
    assert smooth.penalty is None and float(smooth.regularizer(w)) == pytest.approx(0.1 * 5 - 1.0)
    assert optimizers.elastic_net_training(0.0, 0.0).regularizer is None
    with pytest.raises(ValueError, match="l1 > 0 needs optimizer=None"):
        optimizers.elastic_net_training(0.1, 0.0, optax.sgd(0.1))
    assert optimizers.crfsuite_elastic_net(0.1, 0.2) == {"l1": 0.1, "l2": pytest.approx(0.4)}


def test_a_plain_gradient_transformation_takes_no_extra_arguments():
    """`minimize` passes value/grad/value_fn to line searches; an optax
    `GradientTransformation` without extra-argument support (a user's own
    `update(updates, state, params)`) must still run: gradient descent on
    `|x|^2` with step 0.25 halves `x` each step."""
    descent = optax.GradientTransformation(
        lambda params: optax.EmptyState(),
        lambda updates, state, params=None: (jax.tree_util.tree_map(lambda g: -0.25 * g, updates), state),
    )
    result = optimizers.minimize(lambda x: jnp.sum(x**2), jnp.ones(3), descent, max_steps=3)
    np.testing.assert_allclose(result.params, 0.5**3 * np.ones(3), rtol=1e-12)


def _norms(inner, data):
    """A `record`: the params' norm and the line search's step (optax's zoom)."""
    theta = jax.flatten_util.ravel_pytree(inner[0])[0]
    return {"norm": jnp.linalg.norm(theta), "trials": optax.tree.get(inner[1], "num_linesearch_steps")}


def test_record_keeps_per_step_values_in_the_loop_and_resumes_with_them(crf, tmp_path):
    """`record`: its values after each step, computed in the compiled loop,
    come back as `[steps]` arrays (integers kept), bit-identical after a resume
    from a checkpoint (which holds them); the loop, the callbacks and the
    result see the optimizer's own state; each step has its seconds."""
    data, params = crf
    seen = []
    run = _twelve_lbfgs_steps(params, record=_norms, callback=lambda report: seen.append(report.inner) and None)
    straight = run(data)
    assert straight.records is not None and set(straight.records) == {"norm", "trials"}
    assert straight.records["norm"].shape == (12,) and straight.records["trials"].dtype.kind == "i"
    assert np.all(straight.records["trials"] >= 1) and np.all(np.diff(straight.records["norm"]) != 0)
    final = float(jnp.linalg.norm(jax.flatten_util.ravel_pytree(straight.params)[0]))
    assert straight.records["norm"][-1] == pytest.approx(final, rel=1e-6)
    assert len(seen[0]) == 2 and set(seen[0][0]) == {"weights", "transitions"}  # no records in the callback's view
    plain = _twelve_lbfgs_steps(params)(data)
    np.testing.assert_array_equal(np.asarray(plain.trace), np.asarray(straight.trace))  # recording changes nothing
    assert plain.records is None and plain.step_seconds.shape == (12,) and np.all(plain.step_seconds > 0)
    run(data, checkpoint_dir=tmp_path, until=5)
    resumed = run(data, checkpoint_dir=tmp_path)
    for name in ("norm", "trials"):
        np.testing.assert_array_equal(resumed.records[name], straight.records[name])
    assert np.all(np.isnan(resumed.step_seconds[:5])) and np.all(resumed.step_seconds[5:] > 0)


class _SearchInfo(NamedTuple):
    decrease_error: jax.Array


class _SearchState(NamedTuple):
    learning_rate: jax.Array
    value: jax.Array
    grad: jax.Array
    info: _SearchInfo


def _line_search_that_moves_by(shift: float, decrease_error: float) -> optax.GradientTransformation:
    """A stand-in for a line search (optax's zoom search's state fields) that
    always moves the parameters by `shift` and ends with `decrease_error`."""

    def init(params):
        return _SearchState(jnp.ones(()), jnp.asarray(jnp.inf), jnp.zeros_like(params), _SearchInfo(jnp.zeros(())))

    def update(updates, state, params, *, value_fn, **extra):
        del updates, extra
        moved = params + shift
        value, grad = jax.value_and_grad(value_fn)(moved)
        return jnp.full_like(params, shift), _SearchState(jnp.ones(()), value, grad, _SearchInfo(decrease_error))

    return optax.GradientTransformationExtraArgs(init, update)


@pytest.mark.parametrize(
    "shift, decrease_error, undone",
    [(10.0, 1.0, True), (10.0, 0.0, False), (1e-3, 1.0, False)],
    ids=["failed-and-rose-far", "succeeded", "failed-with-a-small-rise"],
)
def test_a_failed_line_search_that_raises_the_objective_is_undone_and_reported(shift, decrease_error, undone):
    """A failed search whose last trial point raised the objective by more
    than its magnitude (optax's zoom search moves there) is undone and
    halts the run as LINE_SEARCH_FAILED; a successful search, or a small
    rise (float32 noise near an optimum), is kept for the stop rules."""
    objective = lambda params, data: jnp.sum((params - 1.0) ** 2)
    start = jnp.asarray([1.5, 0.5])
    search = _line_search_that_moves_by(shift, decrease_error)
    warned = pytest.warns(RuntimeWarning, match="LINE_SEARCH_FAILED") if undone else contextlib.nullcontext()
    with warned:  # not silent: the driver warns
        result = optimizers.train(objective, start, search, None, max_steps=3)
    if undone:
        assert optimizers.status_name(result.status) == "LINE_SEARCH_FAILED"
        np.testing.assert_array_equal(result.params, start)
        assert int(result.num_steps) == 1 and float(result.trace[0]) == 0.5
    else:
        assert optimizers.status_name(result.status) != "LINE_SEARCH_FAILED"
        np.testing.assert_allclose(result.params, start + shift * int(result.num_steps))
