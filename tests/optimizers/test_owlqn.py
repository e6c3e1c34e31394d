"""OWL-QN against scikit-learn (L1 multinomial logistic regression = a chain
with T = 1), against a long proximal-gradient run on a small CRF, and its
state-machine properties (jit, resume, orthant projection)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from lossfns import optimizers
from lossfns.lattices import chain
from lossfns.optimizers.minimize import gradient_step_fn
from lossfns.optimizers.owlqn import elastic_net_penalty, owlqn, pseudo_gradient
from tests.optimizers.test_problems import assert_resume_bit_identical, crf_init, crf_reference, crf_value_and_grad
from tests.optimizers.test_problems import crf_problem as shared_crf_problem

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

sklearn_linear = pytest.importorskip("sklearn.linear_model")

NUM_INPUTS, NUM_CLASSES = 6, 3


def _logistic_data():
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(120, NUM_INPUTS))
    weights = rng.normal(size=(NUM_INPUTS, NUM_CLASSES)) * 1.5
    weights[3:] = 0.0
    targets = np.argmax(inputs @ weights + rng.gumbel(size=(120, NUM_CLASSES)), axis=1)
    return inputs, targets


def _logistic_loss(params, inputs, targets):
    """Multinomial logistic loss as a CRF over chains of length 1."""
    unary = (inputs @ params["weights"] + params["bias"])[:, None, :]
    potentials = chain.FactoredPotentials(unary, jnp.zeros((NUM_CLASSES, NUM_CLASSES)))
    return jnp.sum(chain.log_partition(potentials) - chain.score(potentials, targets[:, None]))


@functools.partial(jax.jit, static_argnames=("fun", "max_steps", "free_bias"))
def _run_owlqn(fun, params, l1, l2=0.0, max_steps=300, free_bias=False):
    """One compiled OWL-QN run per problem; the penalties are traced, not static."""
    mask = {"weights": True, "bias": False} if free_bias else None
    return optimizers.minimize(
        fun, params, owlqn(l1, l2, mask=mask), max_steps=max_steps, tol=1e-13, penalty=elastic_net_penalty(l1, l2, mask)
    )


def test_matches_scikit_learn_l1_multinomial_logistic_regression():
    inputs, targets = _logistic_data()
    strength = 0.1  # scikit-learn's C: it minimises C * loss + ||W||_1, intercept unpenalised
    fun = functools.partial(_logistic_loss, inputs=jnp.asarray(inputs), targets=jnp.asarray(targets))
    params = {"weights": jnp.zeros((NUM_INPUTS, NUM_CLASSES)), "bias": jnp.zeros(NUM_CLASSES)}
    result = _run_owlqn(fun, params, 1.0 / strength, free_bias=True)
    reference = sklearn_linear.LogisticRegression(
        l1_ratio=1.0, C=strength, solver="saga", tol=1e-12, max_iter=100_000
    ).fit(inputs, targets)
    reference_params = {"weights": jnp.asarray(reference.coef_.T), "bias": jnp.asarray(reference.intercept_)}
    objective = lambda p: fun(p) + elastic_net_penalty(1.0 / strength, 0.0, {"weights": True, "bias": False})(p)
    ours, theirs = float(objective(result.params)), float(objective(reference_params))
    assert abs(ours - theirs) <= 1e-6 * abs(theirs)
    np.testing.assert_array_equal(np.asarray(result.params["weights"]) != 0, reference.coef_.T != 0)
    assert 0 < np.sum(reference.coef_ != 0) < reference.coef_.size  # the support test is not vacuous
    assert float(result.trace[result.num_steps - 1]) == pytest.approx(ours, rel=1e-12)


@pytest.fixture(scope="module")
def crf_problem():
    return shared_crf_problem()


@pytest.mark.slow
@pytest.mark.parametrize("l1", [2.0])
def test_crf_matches_long_proximal_gradient_run(crf_problem, l1):
    result = _run_owlqn(crf_problem, crf_init(), l1)
    reference = crf_reference(l1)
    objective = lambda p: crf_problem(p) + elastic_net_penalty(l1)(p)
    ours, theirs = float(objective(result.params)), float(objective(reference))
    assert abs(ours - theirs) <= 1e-5 * abs(theirs)
    ours_flat, theirs_flat = ravel_pytree(result.params)[0], ravel_pytree(reference)[0]
    np.testing.assert_array_equal(np.asarray(ours_flat) != 0, np.asarray(theirs_flat) != 0)


def test_strong_l1_zeroes_most_weights(crf_problem):
    result = _run_owlqn(crf_problem, crf_init(), 6.0)
    theta = np.asarray(ravel_pytree(result.params)[0])
    assert 0.7 < np.mean(theta == 0) < 1
    # Monotone objective: the line search only accepts decreases.
    trace = np.asarray(result.trace[: int(result.num_steps)])
    assert np.all(np.diff(trace) <= 1e-12 * np.abs(trace[1:]))


def test_elastic_net_reaches_subgradient_optimum(crf_problem):
    l1, l2 = 1.0, 0.5
    result = _run_owlqn(crf_problem, crf_init(), l1, l2)
    theta = np.asarray(ravel_pytree(result.params)[0])
    grad = np.asarray(ravel_pytree(crf_value_and_grad()(result.params)[1])[0]) + l2 * theta
    np.testing.assert_allclose(np.where(theta != 0, grad + l1 * np.sign(theta), 0.0), 0.0, atol=1e-5)
    assert np.all(np.abs(grad[theta == 0]) <= l1 + 1e-6)


def test_pseudo_gradient_cases():
    theta = jnp.array([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    grad = jnp.array([0.5, 0.5, -3.0, 3.0, 0.5, 0.0])
    weight = jnp.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(pseudo_gradient(theta, grad, 1.0, weight), [1.5, -0.5, -2.0, 2.0, 0.0, 0.0])


def test_steps_never_cross_an_orthant(crf_problem):
    """Each accepted point lies in the orthant of the previous one (or at 0)."""
    optimizer = owlqn(3.0)
    params = jax.tree_util.tree_map(lambda x: x + 0.3, crf_init())
    state = optimizer.init(params)
    value_and_grad = crf_value_and_grad()
    update = jax.jit(functools.partial(optimizer.update, value_fn=crf_problem))
    for _ in range(6):
        value, grad = value_and_grad(params)
        updates, state = update(grad, state, params, value=value, grad=grad)
        new = optax.apply_updates(params, updates)
        old_flat, new_flat = np.asarray(ravel_pytree(params)[0]), np.asarray(ravel_pytree(new)[0])
        moved = old_flat != 0
        assert np.all((np.sign(new_flat[moved]) == np.sign(old_flat[moved])) | (new_flat[moved] == 0))
        params = new
    np.testing.assert_allclose(state.value, crf_problem(params), rtol=1e-12)


def test_jit_and_eager_update_agree(crf_problem):
    optimizer = owlqn(2.0)
    params = jax.tree_util.tree_map(lambda x: x + 0.3, crf_init())
    value, grad = crf_value_and_grad()(params)
    arguments = (grad, optimizer.init(params), params)
    eager = optimizer.update(*arguments, value=value, grad=grad, value_fn=crf_problem)
    jitted = jax.jit(functools.partial(optimizer.update, value_fn=crf_problem))(*arguments, value=value, grad=grad)
    for a, b in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)


def test_self_evaluating_update_follows_the_same_path(crf_problem):
    """`update(None, ..., value_fn=f)` (f evaluated inside the line search,
    the first point by the search's first pass) takes the same steps as the
    update given f's value and gradient, and stores f and its gradient at
    each accepted point."""
    optimizer = owlqn(2.0, 0.5)
    value_and_grad = crf_value_and_grad()
    given = jax.jit(functools.partial(optimizer.update, value_fn=crf_problem))
    evaluating = jax.jit(lambda state, params: optimizer.update(None, state, params, value_fn=crf_problem))
    params = jax.tree_util.tree_map(lambda x: x + 0.3, crf_init())
    given_params, given_state = params, optimizer.init(params)
    own_params, own_state = params, optimizer.init(params)
    for _ in range(8):
        value, grad = value_and_grad(given_params)
        updates, given_state = given(grad, given_state, given_params, value=value, grad=grad)
        given_params = optax.apply_updates(given_params, updates)
        updates, own_state = evaluating(own_state, own_params)
        own_params = optax.apply_updates(own_params, updates)
        for a, b in zip(
            jax.tree_util.tree_leaves((given_params, given_state)), jax.tree_util.tree_leaves((own_params, own_state))
        ):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        value, grad = value_and_grad(own_params)
        np.testing.assert_allclose(own_state.value, value, rtol=1e-12)
        for a, b in zip(jax.tree_util.tree_leaves(own_state.grad), jax.tree_util.tree_leaves(grad)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def owlqn_loop(crf_problem):
    """One `(step_fn, loop)` for the resume tests, so its loop compiles once."""
    optimizer = owlqn(2.0)
    step_fn = gradient_step_fn(crf_problem, optimizer, elastic_net_penalty(2.0))
    return step_fn, optimizers.init_loop((crf_init(), optimizer.init(crf_init())), 12)


def test_resume_is_bit_identical(owlqn_loop, tmp_path):
    step_fn, loop = owlqn_loop
    assert_resume_bit_identical(step_fn, loop, optimizers.relative_change_below(0.0), 5, tmp_path / "state.eqx")


def test_driver_resumes_from_its_checkpoints(owlqn_loop, tmp_path):
    step_fn, loop = owlqn_loop
    make_step = lambda _: step_fn  # one object: the chunk compiles once for every run below
    stop = optimizers.relative_change_below(0.0)
    straight = optimizers.drive(make_step, loop, stop=stop, chunk_steps=12, progress=False).state
    assert int(straight.step) == 12
    # An interrupted run: only the first chunk, then a new driver on the same directory.
    first = optimizers.drive(
        make_step, loop, stop=stop, chunk_steps=4, until=4, checkpoint_dir=tmp_path, progress=False
    ).state
    assert int(first.step) == 4
    resumed = optimizers.drive(make_step, loop, stop=stop, chunk_steps=4, checkpoint_dir=tmp_path, progress=False).state
    for a, b in zip(jax.tree_util.tree_leaves(straight), jax.tree_util.tree_leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="l1"):
        owlqn(-1.0)
    with pytest.raises(ValueError, match="memory_size"):
        owlqn(1.0, memory_size=0)
    with pytest.raises(ValueError, match="max_steps"):
        optimizers.init_loop({}, 0)
