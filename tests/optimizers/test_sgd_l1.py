"""SGD with the cumulative L1 penalty (Tsuruoka et al. 2009) against OWL-QN
on the shared CRF problem, its clipping rule against a hand-worked example,
learning-rate calibration, the final active-set L-BFGS fine-tuning, jit and
resume."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from lossfns import optimizers
from lossfns.optimizers.finetune import finetune
from lossfns.optimizers.owlqn import elastic_net_penalty, owlqn
from lossfns.optimizers.sgd_l1 import cumulative_l1_clip, decaying_schedule, sgd_l1
from lossfns.training.sgd_l1 import calibrate_learning_rate
from tests.optimizers.test_problems import (
    assert_resume_bit_identical,
    crf_init,
    crf_loss,
    crf_problem,
    crf_value_and_grad,
    make_crf_data,
)

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

BATCH_SIZE = 4
NUM_EPOCHS = 60


@functools.cache
def _data():
    return make_crf_data()


@functools.partial(jax.jit, static_argnames=("max_steps",))
def _owlqn(l1, max_steps=300):
    return optimizers.minimize(
        crf_problem(), crf_init(), owlqn(l1), max_steps=max_steps, tol=1e-13, penalty=elastic_net_penalty(l1)
    )


@functools.partial(jax.jit, static_argnames=("candidates",))
def _calibrate(l1, key, candidates=None):
    options = {} if candidates is None else {"candidates": candidates}
    return calibrate_learning_rate(crf_loss, crf_init(), _data(), l1, key=key, batch_size=BATCH_SIZE, **options)


@jax.jit
def _sgd(l1, rate, key):
    # Tsuruoka's 0.85 per epoch decays too fast for 6 steps per epoch; 0.95 sums to 20 epochs of rate.
    schedule = decaying_schedule(rate, steps_per_epoch=_data().labels.shape[0] // BATCH_SIZE, decay_per_epoch=0.95)
    return optimizers.minimize_stochastic(
        crf_loss,
        crf_init(),
        sgd_l1(schedule, l1),
        _data(),
        key=key,
        batch_size=BATCH_SIZE,
        max_steps=NUM_EPOCHS,
        penalty=elastic_net_penalty(l1),
    )


def test_clipping_matches_a_hand_worked_example():
    # u = 0.5; q: weight 0 had 0.2 of its penalty applied (q = -0.2), weight 2 had none.
    weights = jnp.array([1.0, 0.1, -1.0, -0.1, 2.0])
    applied = jnp.array([-0.2, 0.0, 0.0, 0.0, 0.0])
    clipped, applied_after = cumulative_l1_clip(weights, 0.5, applied, jnp.array([1.0, 1.0, 1.0, 1.0, 0.0]))
    np.testing.assert_allclose(clipped, [0.7, 0.0, -0.5, 0.0, 2.0])
    np.testing.assert_allclose(applied_after, [-0.5, -0.1, 0.5, 0.1, 0.0])


@pytest.mark.slow
@pytest.mark.parametrize("l1", [2.0, 6.0])
def test_reaches_owlqn_objective_within_one_percent(l1):
    key = jax.random.PRNGKey(0)
    rate = _calibrate(l1, key)
    result = _sgd(l1, rate, key)
    reference = _owlqn(l1)
    objective = lambda p: crf_problem()(p) + elastic_net_penalty(l1)(p)
    ours, best = float(objective(result.params)), float(objective(reference.params))
    assert best <= ours <= 1.01 * best
    assert np.all(np.isfinite(np.asarray(result.trace)))
    theta = np.asarray(ravel_pytree(result.params)[0])
    if l1 >= 6.0:  # strong L1: most weights exactly zero (but not all), as OWL-QN's
        reference_theta = np.asarray(ravel_pytree(reference.params)[0])
        assert 0.7 < np.mean(theta == 0) < 1 and 0.7 < np.mean(reference_theta == 0) < 1


def test_calibration_rejects_too_large_and_too_small_rates():
    total = _data().labels.shape[0]
    chosen = _calibrate(2.0, jax.random.PRNGKey(1), candidates=(1e3, 0.3, 1e-6))
    assert float(chosen) == pytest.approx(0.3 / total)
    # The default candidates give a rate that trains without blowing up.
    default = _calibrate(2.0, jax.random.PRNGKey(1))
    assert np.all(np.isfinite(np.asarray(_sgd(2.0, default, jax.random.PRNGKey(1)).trace)))


def test_finetune_keeps_the_support_and_reaches_the_restricted_optimum():
    sparse = _owlqn(2.0).params
    l2 = 1e-3
    result = jax.jit(lambda p: finetune(crf_problem(), p, l2=l2, max_steps=200, tol=1e-15))(sparse)
    before, after = np.asarray(ravel_pytree(sparse)[0]), np.asarray(ravel_pytree(result.params)[0])
    np.testing.assert_array_equal(after[before == 0], 0.0)
    gradient = np.asarray(ravel_pytree(crf_value_and_grad()(result.params)[1])[0]) + l2 * after
    np.testing.assert_allclose(gradient[before != 0], 0.0, atol=1e-5)
    assert float(crf_problem()(result.params)) < float(crf_problem()(sparse))


def _crf_objective(params, data):
    del data  # the shared problem closes over its data
    return crf_problem()(params)


def test_train_finetune_reaches_the_restricted_optimum_and_resumes_bit_identically(tmp_path):
    sparse = _owlqn(2.0).params
    options = dict(l2=1e-3, max_steps=60, stop=optimizers.relative_change_below(1e-12), progress=False)
    whole = optimizers.train_finetune(_crf_objective, sparse, **options)
    before, after = np.asarray(ravel_pytree(sparse)[0]), np.asarray(ravel_pytree(whole.params)[0])
    np.testing.assert_array_equal(after[before == 0], 0.0)
    gradient = np.asarray(ravel_pytree(crf_value_and_grad()(whole.params)[1])[0]) + 1e-3 * after
    np.testing.assert_allclose(gradient[before != 0], 0.0, atol=1e-5)
    # The jit-able loop reaches the same optimum.
    looped = jax.jit(lambda p: finetune(crf_problem(), p, l2=1e-3, max_steps=200, tol=1e-15))(sparse)
    np.testing.assert_allclose(after, np.asarray(ravel_pytree(looped.params)[0]), atol=1e-4)
    # Stopped after 5 steps and started again on its checkpoint: the same run.
    checkpointed = dict(options, checkpoint_dir=tmp_path / "finetune", chunk_steps=2, checkpoint_every=2)
    stopped = optimizers.train_finetune(_crf_objective, sparse, until=5, **checkpointed)
    assert int(stopped.num_steps) == 5
    resumed = optimizers.train_finetune(_crf_objective, sparse, **checkpointed)
    assert int(resumed.num_steps) == int(whole.num_steps)
    np.testing.assert_array_equal(np.asarray(ravel_pytree(resumed.params)[0]), after)
    np.testing.assert_array_equal(np.asarray(resumed.trace), np.asarray(whole.trace))


def test_resume_is_bit_identical(tmp_path):
    optimizer = sgd_l1(optax.exponential_decay(1e-2, 6, 0.85), 2.0)
    step_fn = optimizers.epoch_step_fn(
        crf_loss, optimizer, _data(), batch_size=BATCH_SIZE, penalty=elastic_net_penalty(2.0)
    )
    loop = optimizers.init_loop((crf_init(), optimizer.init(crf_init()), jax.random.PRNGKey(2)), 6)
    assert_resume_bit_identical(step_fn, loop, optimizers.relative_change_below(0.0), 3, tmp_path / "sgd.eqx")


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="l1"):
        sgd_l1(0.1, -1.0)
    with pytest.raises(ValueError, match="batch_size"):
        optimizers.epoch_step_fn(crf_loss, sgd_l1(0.1, 1.0), _data(), batch_size=1000)
    with pytest.raises(ValueError, match="leading example axis"):
        optimizers.num_examples({"a": jnp.zeros(3), "b": jnp.zeros(4)})
