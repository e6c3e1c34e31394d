"""Block coordinate descent for L1 CRFs against OWL-QN on the same model,
its occurrence lists, the model's potentials against a dense construction,
sparsity under strong L1, jit and resume."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from lossfns import optimizers
from lossfns.optimizers.minimize import init_loop, minimize, relative_change_below
from lossfns.optimizers.owlqn import elastic_net_penalty, owlqn
from test_optimizers_problems import NUM_LABELS, assert_resume_bit_identical, make_crf_data

NUM_TESTS = 10


@functools.lru_cache(maxsize=None)
def _data():
    """The shared CRF data as lists of active observation tests per token
    (concrete even when first needed inside a jitted function)."""
    with jax.ensure_compile_time_eval():
        return _build_data()


def _build_data():
    crf = make_crf_data()
    features = np.asarray(crf.features)
    active = np.full(features.shape, -1, np.int32)
    for n, t in np.ndindex(*features.shape[:2]):
        ids = np.nonzero(features[n, t])[0]
        active[n, t, :len(ids)] = ids
    return optimizers.bcd_data(active, crf.labels, crf.lengths, NUM_TESTS)


@jax.jit
def _owlqn(l1):
    params = optimizers.bcd_init(NUM_TESTS, NUM_LABELS)
    fun = functools.partial(optimizers.bcd_loss, data=_data())
    return minimize(fun, params, owlqn(l1), max_steps=400, tol=1e-13, penalty=elastic_net_penalty(l1)).params


@jax.jit
def _bcd(l1):
    return optimizers.bcd(_data(), optimizers.bcd_init(NUM_TESTS, NUM_LABELS), l1, num_sweeps=40)


def _objective(params, l1):
    return float(optimizers.bcd_loss(params, _data()) + elastic_net_penalty(l1)(params))


def test_potentials_match_a_dense_construction():
    data = _data()
    rng = np.random.default_rng(0)
    params = {"emission": jnp.asarray(rng.normal(size=(NUM_TESTS, NUM_LABELS))),
              "pairs": jnp.asarray(rng.normal(size=(NUM_TESTS, NUM_LABELS, NUM_LABELS)))}
    features = np.asarray(make_crf_data().features)  # [N, T, X] indicators
    dense = (np.einsum("ntx,xj->ntj", features, np.asarray(params["emission"]))[..., None, :]
             + np.einsum("ntx,xij->ntij", features, np.asarray(params["pairs"])))
    np.testing.assert_allclose(optimizers.sparse_potentials(params, data.active), dense, atol=1e-12)


def test_occurrence_lists_hold_exactly_the_sequences_with_each_test():
    data = _data()
    features = np.asarray(make_crf_data().features)
    inside = np.arange(features.shape[1])[None, :] < np.asarray(data.lengths)[:, None]
    for x in range(NUM_TESTS):
        expected = set(np.nonzero(np.any(features[..., x] * inside, axis=1))[0])
        listed = set(int(i) for i in np.asarray(data.occurrences[x]) if i >= 0)
        assert listed == expected


@pytest.mark.slow
@pytest.mark.parametrize("l1", [2.0, 6.0])
def test_reaches_owlqn_objective_within_one_percent(l1):
    loop = _bcd(l1)
    reference = _owlqn(l1)
    ours, best = _objective(loop.inner, l1), _objective(reference, l1)
    assert best * (1 - 1e-9) <= ours <= 1.01 * best
    trace = np.asarray(loop.trace[:int(loop.step)])
    assert np.all(np.diff(trace) <= 1e-12 * np.abs(trace[1:]))  # every sweep is a decrease
    if l1 >= 6.0:
        theta = np.asarray(ravel_pytree(loop.inner)[0])
        assert 0.7 < np.mean(theta == 0) < 1


def test_resume_is_bit_identical(tmp_path):
    step_fn = optimizers.bcd_sweep_fn(_data(), 2.0)
    loop = init_loop(optimizers.bcd_init(NUM_TESTS, NUM_LABELS), 4)
    assert_resume_bit_identical(step_fn, loop, relative_change_below(0.0), 2, tmp_path / "bcd.eqx")


def test_rejects_bad_input():
    crf = make_crf_data()
    with pytest.raises(ValueError, match="active"):
        optimizers.bcd_data(np.zeros((2, 3), np.int32), crf.labels, crf.lengths, NUM_TESTS)
    with pytest.raises(ValueError, match="active"):
        optimizers.bcd_data(np.full((24, 5, 1), NUM_TESTS, np.int32), crf.labels, crf.lengths, NUM_TESTS)
    with pytest.raises(ValueError, match="labels"):
        optimizers.bcd_data(np.zeros((24, 5, 1), np.int32), crf.labels[:3], crf.lengths, NUM_TESTS)
    with pytest.raises(ValueError, match="l1"):
        optimizers.bcd_sweep_fn(_data(), -1.0)


def test_every_loop_result_carries_a_status():
    """`LoopState.status`: BCD stopped by its tolerance is CONVERGED, by its
    sweep count ITERATION_LIMIT, and a NaN objective reads NON_FINITE_OBJECTIVE."""
    converged = optimizers.bcd(_data(), optimizers.bcd_init(NUM_TESTS, NUM_LABELS), 0.1, num_sweeps=200, tol=1e-3)
    assert optimizers.status_name(converged.status) == "CONVERGED"
    limited = optimizers.bcd(_data(), optimizers.bcd_init(NUM_TESTS, NUM_LABELS), 0.1, num_sweeps=1, tol=0.0)
    assert optimizers.status_name(limited.status) == "ITERATION_LIMIT"
    broken = limited._replace(value=jnp.asarray(jnp.nan))
    assert optimizers.status_name(broken.status) == "NON_FINITE_OBJECTIVE"
