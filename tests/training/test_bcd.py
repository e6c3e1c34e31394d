"""Block coordinate descent (`training.bcd`) on `models.LinearChainModel`:
its loss and block gradients against autodiff of the model's own loss, its
diagonal curvature against the marginals (and against the exact Hessian
diagonal where the closed form is exact), every sweep a decrease, the
optimum of a small problem shared with OWL-QN, masks, jit and resume."""

from __future__ import annotations

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import features, optimizers, training
from lossfns.lattices import chain
from lossfns.losses import sequence_log_loss
from lossfns.models import LinearChainModel
from lossfns.optimizers.minimize import init_loop, minimize, relative_change_below
from lossfns.optimizers.owlqn import elastic_net_penalty, owlqn
from lossfns.training.bcd import bcd_loss
from tests.optimizers.test_problems import assert_resume_bit_identical

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

K, K2, L = 8, 3, 3
MAX_LENGTH = 6


@functools.cache
def _corpus(pairs: bool):
    """20 random sentences: a bias test 0 everywhere, test 1 at most once per
    sentence, tests 2..K-1 at random (some several times in a sentence, or
    twice at one position), and pair tests."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, MAX_LENGTH + 1, size=20)
    encoded, labels = [], []
    for n in lengths:
        unigram = [[0] + [int(x) for x in rng.choice(np.arange(2, K), size=rng.integers(0, 3))] for _ in range(n)]
        if rng.random() < 0.7:
            unigram[rng.integers(n)].append(1)  # test 1: at most once per sentence
        pair = [[int(x) for x in rng.choice(K2, size=rng.integers(0, 2))] if pairs else [] for _ in range(n)]
        encoded.append((unigram, pair))
        labels.append([int(y) for y in rng.integers(0, L, size=n)])
    padded = features.pad_batch(encoded, labels)
    return features.pack(encoded, labels, num_buckets=2), padded


def _model(pairs: bool, seed=None) -> LinearChainModel:
    model = LinearChainModel.zeros(K, L, K2 if pairs else 0, dtype=jnp.float64)
    if pairs:
        mask = np.ones((K2, L, L), bool)
        mask[:, 2, 0] = False  # label 0 never follows label 2 under a pair test (nor as a transition)
        model = model.with_pair_mask(mask)
    if seed is None:
        return model
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    return dataclasses.replace(
        model,
        emission=jax.random.normal(keys[0], model.emission.shape),
        transitions=jax.random.normal(keys[1], (L, L)),
        start=jax.random.normal(keys[2], (L,)),
        pair_emission=jax.random.normal(keys[3], model.pair_emission.shape),
    )


@functools.cache
def _data(pairs: bool):
    # Jobs and cell chunks sized for 20 short sentences: the defaults (for whole
    # corpora) would be mostly padding, and these split a round into several
    # jobs and chunks, so the loops over them are exercised too.
    return training.bcd_data(_corpus(pairs)[0], _model(pairs), rows_per_job=8, window_rows=4, cells_per_chunk=16)


def _reference_loss(model: LinearChainModel, pairs: bool):
    """The model's own summed log-loss on the padded corpus (the oracle)."""
    padded = _corpus(pairs)[1]
    potentials = model(padded.unigram_ids, padded.pair_ids if pairs else None)
    return jnp.sum(sequence_log_loss(potentials, padded.labels, padded.lengths))


def _tables(model):
    return {name: np.asarray(getattr(model, name)) for name in ("emission", "transitions", "start", "pair_emission")}


@pytest.mark.parametrize("pairs", [False, True])
def test_loss_and_block_gradients_match_autodiff_of_the_models_loss(pairs):
    model = _model(pairs, seed=1)
    np.testing.assert_allclose(float(bcd_loss(model, _data(pairs))), float(_reference_loss(model, pairs)), rtol=1e-12)
    expected = eqx.filter_grad(_reference_loss)(model, pairs)
    gradient, _ = training.bcd_block_statistics(model, _data(pairs))
    for name, value in _tables(gradient).items():
        np.testing.assert_allclose(value, _tables(expected)[name], atol=1e-11, err_msg=name)


def _occurrences(pairs):
    """`[S, T, K]` multiplicity of each unigram test at each position."""
    padded = _corpus(pairs)[1]
    ids = np.asarray(padded.unigram_ids)
    counts = np.zeros(ids.shape[:2] + (K,))
    for s, t, f in zip(*np.nonzero(ids >= 0)):
        counts[s, t, ids[s, t, f]] += 1
    return counts


@pytest.mark.parametrize("pairs", [False, True])
def test_curvature_is_the_sum_of_per_position_variances(pairs):
    """Emission rows: `sum_t c_t^2 P_t (1 - P_t)` from the chain's node marginals."""
    model = _model(pairs, seed=2)
    padded = _corpus(pairs)[1]
    potentials = model(padded.unigram_ids, padded.pair_ids if pairs else None)
    node = np.asarray(chain.node_marginals(potentials, padded.lengths))  # [S, T, L], 0 past the lengths
    expected = np.einsum("stk,stj->kj", _occurrences(pairs) ** 2, node * (1 - node))
    _, curvature = training.bcd_block_statistics(model, _data(pairs))
    np.testing.assert_allclose(np.asarray(curvature.emission), expected, atol=1e-12)


def test_curvature_is_the_exact_hessian_diagonal_for_tests_active_once_per_sentence():
    model = _model(False, seed=3)
    vector, unflatten = model.flat()
    # Reverse over reverse: the model's gather has a custom VJP (no forward mode).
    hessian = jax.jacrev(jax.grad(lambda v: _reference_loss(unflatten(v), False)))(vector)
    exact = _tables(unflatten(jnp.diagonal(hessian)))["emission"]
    _, curvature = training.bcd_block_statistics(model, _data(False))
    once = np.all(_occurrences(False).sum(1) <= 1, axis=0)  # [K]: never twice in one sentence
    assert once.any() and not once.all()
    np.testing.assert_allclose(np.asarray(curvature.emission)[once], exact[once], atol=1e-12)
    assert not np.allclose(np.asarray(curvature.emission)[~once], exact[~once])


@functools.partial(jax.jit, static_argnames=("pairs", "max_steps"))
def _bcd(l1, pairs, max_steps):
    return training.bcd(_data(pairs), _model(pairs), l1, 0.1, max_steps=max_steps, tol=1e-12)


@functools.partial(jax.jit, static_argnames=("pairs",))
def _owlqn(l1, pairs):
    vector, unflatten = _model(pairs).flat()
    loss = lambda v: _reference_loss(unflatten(v), pairs)
    penalty = elastic_net_penalty(l1, 0.1)
    return unflatten(minimize(loss, vector, owlqn(l1, 0.1), max_steps=500, tol=1e-14, penalty=penalty).params)


@pytest.mark.parametrize("pairs", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_every_sweep_decreases_and_reaches_owlqns_optimum(pairs):
    l1 = 1.0
    result = _bcd(l1, pairs, 60)
    trace = np.asarray(result.trace[: int(result.num_steps)])
    assert np.all(np.diff(trace) <= 1e-12 * np.abs(trace[1:]))
    best = float(training.bcd_objective(_owlqn(l1, pairs), _data(pairs), l1, 0.1))
    ours = float(training.bcd_objective(result.params, _data(pairs), l1, 0.1))
    assert best - 1e-9 * abs(best) <= ours <= best + 1e-4 * abs(best)
    assert abs(trace[-1] - ours) <= 1e-12 * abs(ours)
    tables = _tables(result.params)
    assert 0 < np.mean(tables["emission"] == 0) < 1  # L1 makes it sparse, not empty
    if pairs:
        mask = np.asarray(_model(True).pair_mask)
        assert np.all(tables["pair_emission"][~mask] == 0) and np.all(tables["transitions"][2, 0] == 0)


def test_resume_is_bit_identical(tmp_path):
    step_fn = training.bcd_sweep_fn(_data(False), 1.0, 0.1)
    loop = init_loop(_model(False), 4, jnp.float64)
    assert_resume_bit_identical(step_fn, loop, relative_change_below(0.0), 2, tmp_path / "bcd.eqx")


def test_rejects_bad_input():
    corpus, _ = _corpus(False)
    with pytest.raises(TypeError, match="PackedCorpus"):
        training.bcd_data(np.zeros((2, 3), np.int32), _model(False))
    with pytest.raises(ValueError, match="unigram_ids"):
        training.bcd_data(corpus, LinearChainModel.zeros(K - 1, L))
    with pytest.raises(ValueError, match="labels"):
        training.bcd_data(corpus, LinearChainModel.zeros(K, L - 1))
    with pytest.raises(ValueError, match="label-pair"):
        bcd_loss(_model(True), _data(False))
    with pytest.raises(ValueError, match="l1"):
        training.bcd_sweep_fn(_data(False), -1.0)
    with pytest.raises(ValueError, match="max_steps"):
        training.bcd(_data(False), _model(False), 1.0, max_steps=0)


def test_every_loop_result_carries_a_status():
    converged = _bcd(1.0, False, 60)
    assert optimizers.status_name(converged.status) == "CONVERGED"
    limited = _bcd(1.0, False, 1)
    assert optimizers.status_name(limited.status) == "ITERATION_LIMIT"
