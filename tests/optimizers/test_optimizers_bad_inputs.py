"""Bad input to lossfns.optimizers and lossfns.parallel: each case raises the
stated exception type with a message naming the offending argument; every
optimizer result says why the run stopped (a non-finite objective included).

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lossfns import optimizers, parallel
from tests.bad_inputs import EXAMPLES, INF, NAN, assert_raises_a_named_error, case_ids, squares


def _tree_squares(params):
    return sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(params))


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    # --- OWL-QN, SGD-L1, schedules ---
    ("owlqn-l1", "a negative l1 for OWL-QN", lambda _: optimizers.owlqn(-0.1), ValueError, ["l1", ">= 0", "-0.1"]),
    (
        "owlqn-memory-size",
        "memory_size = 0 for OWL-QN",
        lambda _: optimizers.owlqn(0.1, memory_size=0),
        ValueError,
        ["memory_size", ">= 1", "got 0"],
    ),
    (
        "owlqn-shrink",
        "a line-search shrink factor >= 1",
        lambda _: optimizers.owlqn(0.1, shrink=1.5),
        ValueError,
        ["shrink", "(0, 1)", "1.5"],
    ),
    (
        "owlqn-decrease-factor",
        "an Armijo decrease_factor of 0",
        lambda _: optimizers.owlqn(0.1, decrease_factor=0.0),
        ValueError,
        ["decrease_factor", "(0, 1)", "0.0"],
    ),
    (
        "owlqn-linesearch-steps",
        "max_linesearch_steps = 0",
        lambda _: optimizers.owlqn(0.1, max_linesearch_steps=0),
        ValueError,
        ["max_linesearch_steps", ">= 1", "0"],
    ),
    (
        "sgd-learning-rate",
        "a learning rate of 0 for SGD-L1",
        lambda _: optimizers.sgd_l1(0.0, 0.1),
        ValueError,
        ["learning_rate", "> 0", "0.0"],
    ),
    (
        "sgd-learning-rate-string",
        "a string as learning rate",
        lambda _: optimizers.sgd_l1("fast", 0.1),
        TypeError,
        ["learning_rate", "a number > 0", "'fast'"],
    ),
    (
        "sgd-learning-rate-inf",
        "an infinite learning rate for SGD-L1",
        lambda _: optimizers.sgd_l1(INF, 0.1),
        ValueError,
        ["learning_rate", "> 0", "finite", "inf"],
    ),
    (
        "sgd-learning-rate-bool",
        "True as a learning rate",
        lambda _: optimizers.sgd_l1(True, 0.1),
        TypeError,
        ["learning_rate", "a number > 0", "True"],
    ),
    (
        "owlqn-l1-inf",
        "an infinite l1 for OWL-QN",
        lambda _: optimizers.owlqn(INF),
        ValueError,
        ["l1", ">= 0", "finite", "inf"],
    ),
    ("owlqn-l2-nan", "a NaN l2 for OWL-QN", lambda _: optimizers.owlqn(0.1, l2=NAN), ValueError, ["l2", "nan"]),
    (
        "owlqn-memory-size-bool",
        "memory_size = True",
        lambda _: optimizers.owlqn(0.1, memory_size=True),
        TypeError,
        ["memory_size", "int", "True"],
    ),
    (
        "owlqn-int-params",
        "integer parameters for OWL-QN",
        lambda _: optimizers.owlqn(0.1).init({"w": jnp.zeros(2, jnp.int32)}),
        TypeError,
        ["params", "floating point", "int32", "['w']"],
    ),
    (
        "decay-initial-rate-inf",
        "an infinite initial rate",
        lambda _: optimizers.decaying_schedule(INF, 10),
        ValueError,
        ["initial_rate", "finite", "inf"],
    ),
    (
        "sgd-l2",
        "a negative l2 for SGD-L1",
        lambda _: optimizers.sgd_l1(0.1, 0.1, l2=-1.0),
        ValueError,
        ["l2", ">= 0", "-1.0"],
    ),
    (
        "lazy-sgd-learning-rate",
        "a learning rate of 0 for lazy SGD-L1",
        lambda _: optimizers.lazy_sgd_l1(0.0, 0.1),
        ValueError,
        ["learning_rate", "> 0", "0.0"],
    ),
    (
        "decay-steps",
        "steps_per_epoch = 0 for the decaying schedule",
        lambda _: optimizers.decaying_schedule(0.1, 0),
        ValueError,
        ["steps_per_epoch", ">= 1", "0"],
    ),
    (
        "decay-rate",
        "a decay factor above 1",
        lambda _: optimizers.decaying_schedule(0.1, 10, 1.5),
        ValueError,
        ["decay_per_epoch", "(0, 1]", "1.5"],
    ),
    # --- minimize, minimize_stochastic, drive, finetune ---
    (
        "minimize-max-steps",
        "max_steps = 0",
        lambda _: optimizers.minimize(squares, jnp.ones(2), optax.sgd(0.1), max_steps=0),
        ValueError,
        ["max_steps", ">= 1", "0"],
    ),
    (
        "minimize-optimizer",
        "an optax constructor not called (optax.adam)",
        lambda _: optimizers.minimize(squares, jnp.ones(2), optax.adam, max_steps=5),
        TypeError,
        ["optimizer", "GradientTransformation", "function adam"],
    ),
    (
        "minimize-int-params",
        "integer parameters for L-BFGS (an OverflowError in optax)",
        lambda _: optimizers.minimize(squares, jnp.ones(2, jnp.int32), optax.lbfgs(), max_steps=5),
        TypeError,
        ["params", "floating point", "int32"],
    ),
    (
        "minimize-int-params-owlqn",
        "integer parameters for OWL-QN via minimize",
        lambda _: optimizers.minimize(squares, jnp.ones(2, jnp.int32), optimizers.owlqn(0.1), max_steps=5),
        TypeError,
        ["params", "floating point", "int32"],
    ),
    (
        "status-name",
        "an unknown status code",
        lambda _: optimizers.status_name(7),
        ValueError,
        ["code", "minimize status", "7"],
    ),
    (
        "minimize-tol",
        "a negative tolerance",
        lambda _: optimizers.minimize(squares, jnp.ones(2), optax.sgd(0.1), max_steps=5, tol=-1e-3),
        ValueError,
        ["tol", ">= 0", "-0.001"],
    ),
    (
        "stochastic-batch-size",
        "batch_size = 0",
        lambda _: optimizers.minimize_stochastic(
            squares, jnp.ones(2), optax.sgd(0.1), EXAMPLES, key=jax.random.key(0), batch_size=0, max_steps=1
        ),
        ValueError,
        ["batch_size", "[1, 4]", "0"],
    ),
    (
        "stochastic-batch-size-float",
        "a float batch_size",
        lambda _: optimizers.minimize_stochastic(
            squares, jnp.ones(2), optax.sgd(0.1), EXAMPLES, key=jax.random.key(0), batch_size=2.5, max_steps=1
        ),
        TypeError,
        ["batch_size", "int", "float 2.5"],
    ),
    (
        "stochastic-int-params",
        "integer parameters for SGD-L1",
        lambda _: optimizers.minimize_stochastic(
            squares,
            jnp.ones(2, jnp.int32),
            optimizers.sgd_l1(0.1, 0.1),
            EXAMPLES,
            key=jax.random.key(0),
            batch_size=2,
            max_steps=1,
        ),
        TypeError,
        ["params", "floating point", "int32"],
    ),
    (
        "stochastic-num-epochs",
        "max_steps = 0",
        lambda _: optimizers.minimize_stochastic(
            squares, jnp.ones(2), optax.sgd(0.1), EXAMPLES, key=jax.random.key(0), batch_size=2, max_steps=0
        ),
        ValueError,
        ["max_steps", ">= 1", "0"],
    ),
    (
        "minimize-vector-objective",
        "an objective that returns a vector (per-example losses)",
        lambda _: optimizers.minimize(lambda p: p**2, jnp.ones(2), optax.sgd(0.1), max_steps=3),
        ValueError,
        ["fun", "scalar", "shape (2,)", "jnp.sum"],
    ),
    (
        "train-vector-objective",
        "the driver's objective returns a vector (found while tracing the first chunk, at no cost)",
        lambda _: optimizers.train(lambda p, d: (p - d) ** 2, jnp.ones(2), optax.sgd(0.1), jnp.zeros(2), max_steps=3),
        ValueError,
        ["objective", "scalar", "shape (2,)", "jnp.sum"],
    ),
    (
        "stochastic-vector-objective",
        "a minibatch objective that returns a vector",
        lambda _: optimizers.minimize_stochastic(
            lambda p, batch: (p - batch) ** 2,
            jnp.ones(2),
            optax.sgd(0.1),
            EXAMPLES,
            key=jax.random.key(0),
            batch_size=2,
            max_steps=2,
        ),
        ValueError,
        ["fun", "scalar", "shape (2, 2)"],
    ),
    (
        "stochastic-key-shape",
        "an old-style PRNG key of the wrong shape",
        lambda _: optimizers.minimize_stochastic(
            squares,
            jnp.ones(2),
            optax.sgd(0.1),
            EXAMPLES,
            key=jnp.arange(3, dtype=jnp.uint32),
            batch_size=2,
            max_steps=2,
        ),
        TypeError,
        ["key", "PRNG key", "shape (3,)"],
    ),
    (
        "owlqn-mask-structure",
        "an OWL-QN mask whose structure is not the parameters'",
        lambda _: optimizers.minimize(
            _tree_squares, {"a": jnp.ones(2), "b": jnp.ones(3)}, optimizers.owlqn(0.1, mask={"a": True}), max_steps=2
        ),
        ValueError,
        ["mask", "structure", "{'a': *}", "{'a': *, 'b': *}"],
    ),
    (
        "sgd-l1-mask-shape",
        "an SGD-L1 mask array that does not fit its parameters",
        lambda _: optimizers.minimize(
            squares, jnp.ones(3), optimizers.sgd_l1(0.1, 0.1, mask=jnp.array([True, False])), max_steps=2
        ),
        ValueError,
        ["mask", "(2,)", "(3,)", "broadcast"],
    ),
    (
        "drive-keep",
        "keep = 0 checkpoints",
        lambda tmp: optimizers.drive(
            lambda data: lambda inner, step: (inner, 0.0),
            optimizers.init_loop(0.0, 2),
            stop=optimizers.relative_change_below(0.0),
            checkpoint_dir=tmp,
            keep=0,
        ),
        ValueError,
        ["keep", ">= 1", "0"],
    ),
    (
        "drive-chunk-steps",
        "chunk_steps = 0 for the driver",
        lambda _: optimizers.drive(
            lambda data: lambda inner, step: (inner, 0.0),
            optimizers.init_loop(0.0, 2),
            stop=optimizers.relative_change_below(0.0),
            chunk_steps=0,
        ),
        ValueError,
        ["chunk_steps", ">= 1", "0"],
    ),
    (
        "drive-callback",
        "a driver callback that is not callable",
        lambda _: optimizers.drive(
            lambda data: lambda inner, step: (inner, 0.0),
            optimizers.init_loop(0.0, 2),
            stop=optimizers.relative_change_below(0.0),
            callback="print",
        ),
        TypeError,
        ["callback", "callable", "str"],
    ),
    (
        "train-objective",
        "a training objective that is not callable",
        lambda _: optimizers.train("loss", jnp.ones(2), optax.lbfgs(), max_steps=2),
        TypeError,
        ["objective", "callable"],
    ),
    (
        "stop-period",
        "a stopping period of 0 for CRFsuite's rule",
        lambda _: optimizers.relative_improvement_below(1e-5, 0),
        ValueError,
        ["period", ">= 1", "0"],
    ),
    (
        "stop-period-either-way",
        "a stopping period of 0 for the either-way rule",
        lambda _: optimizers.relative_change_over(1e-4, 0),
        ValueError,
        ["period", ">= 1", "0"],
    ),
    (
        "finetune-l2",
        "a negative l2 for fine-tuning",
        lambda _: optimizers.finetune(squares, jnp.ones(2), l2=-1.0),
        ValueError,
        ["l2", ">= 0", "-1.0"],
    ),
    # --- lossfns.parallel ---
    (
        "mesh-axes",
        "a mesh without a data axis and with two axes",
        lambda _: parallel.data_axis(jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("a", "b"))),
        ValueError,
        ["mesh", "'data'", "('a', 'b')"],
    ),
    (
        "mesh-data-scalar",
        "a scalar data leaf to split over a mesh",
        lambda _: parallel.shard_leading_axis({"x": np.zeros(())}, parallel.data_mesh()),
        ValueError,
        ["data leaf ['x']", "leading axis", "()"],
    ),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)


# ---------------------------------------------------------------------------
# Optimizer status: every result says why the run stopped
# ---------------------------------------------------------------------------

_OPTIMIZERS = {
    "owlqn": lambda: optimizers.owlqn(0.0, max_linesearch_steps=3),
    "lbfgs": optax.lbfgs,
    "sgd": lambda: optax.sgd(0.1),
}


def _bowl(params):
    return jnp.sum((params - 3.0) ** 2)


def _cliff(params):
    """Finite at the start (all ones) only: every trial step is NaN."""
    return jnp.where(jnp.all(params == 1.0), jnp.sum(params**2), NAN)


def _nan_everywhere(params):
    return jnp.sum(params**2) + NAN


def _run(objective, name, max_steps, jit):
    run = lambda p: optimizers.minimize(objective, p, _OPTIMIZERS[name](), max_steps=max_steps)
    return (jax.jit(run) if jit else run)(jnp.ones(2))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_status_converged(name, jit):
    result = _run(_bowl, name, 200, jit)
    assert int(result.status) == optimizers.Status.CONVERGED and optimizers.status_name(result.status) == "CONVERGED"
    assert int(result.num_steps) < 200
    np.testing.assert_allclose(result.params, 3.0, atol=1e-3)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_status_iteration_limit(name, jit):
    result = _run(_bowl, name, 1, jit)
    assert optimizers.status_name(result.status) == "ITERATION_LIMIT" and int(result.num_steps) == 1


@pytest.mark.parametrize("objective", [_nan_everywhere, lambda p: _bowl(p) + INF], ids=["nan", "inf"])
@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_status_non_finite_objective_at_the_start_stops_at_once(name, objective):
    with pytest.warns(RuntimeWarning, match="NON_FINITE_OBJECTIVE"):
        result = _run(objective, name, 20, jit=False)
    assert optimizers.status_name(result.status) == "NON_FINITE_OBJECTIVE"
    assert int(result.num_steps) == 1 and not np.isfinite(result.trace[0])
    np.testing.assert_array_equal(result.params, jnp.ones(2))  # untouched, not NaN
    jitted = _run(objective, name, 20, jit=True)  # inside jit: no warning, the status is the signal
    assert int(jitted.status) == optimizers.Status.NON_FINITE_OBJECTIVE
    if name == "owlqn":  # one evaluation at the start, no line search
        assert int(result.state.count) == 1 and int(result.state.status) == optimizers.Status.NON_FINITE_OBJECTIVE


def test_owlqn_does_not_search_from_a_non_finite_start():
    calls = []

    def counted(params):
        jax.debug.callback(lambda: calls.append(1))
        return _nan_everywhere(params)

    with pytest.warns(RuntimeWarning):
        optimizers.minimize(counted, jnp.ones(2), optimizers.owlqn(0.1), max_steps=5)
    assert len(calls) == 1  # the start only: no trial of the line search, no second step


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", ["owlqn", "lbfgs"])
def test_status_line_search_failed(name, jit):
    if jit:
        result = _run(_cliff, name, 20, jit=True)
    else:
        with pytest.warns(RuntimeWarning, match="LINE_SEARCH_FAILED"):
            result = _run(_cliff, name, 20, jit=False)
    assert optimizers.status_name(result.status) == "LINE_SEARCH_FAILED"
    assert int(result.num_steps) == 1  # another step would repeat the same failed search
    np.testing.assert_array_equal(result.params, jnp.ones(2))


def test_stochastic_status_non_finite_when_sgd_diverges():
    with pytest.warns(RuntimeWarning, match="NON_FINITE_OBJECTIVE"):
        result = optimizers.minimize_stochastic(
            squares,
            jnp.ones(2),
            optimizers.sgd_l1(1e30, 0.0),
            jnp.zeros((4, 2)),
            key=jax.random.key(0),
            batch_size=2,
            max_steps=50,
        )
    assert optimizers.status_name(result.status) == "NON_FINITE_OBJECTIVE"
    assert int(result.num_steps) < 50
    fine = optimizers.minimize_stochastic(
        squares,
        jnp.ones(2),
        optimizers.sgd_l1(0.01, 0.0),
        jnp.zeros((4, 2)),
        key=jax.random.key(0),
        batch_size=2,
        max_steps=3,
    )
    assert optimizers.status_name(fine.status) == "ITERATION_LIMIT"
