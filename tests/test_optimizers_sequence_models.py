"""The perceptron (Collins 2002) and sequence boosting (Altun et al. 2002)
on small linear-chain problems: separation of separable data, the boosting
bound against the true round objective `Z_k` (by enumeration), monotone
exp-loss, sparsity, jit and resume."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from lossfns import testing
from lossfns.lattices import chain
from lossfns import optimizers
from lossfns.optimizers.minimize import init_loop, relative_change_below
from lossfns.optimizers.perceptron import SequenceData
from test_optimizers_problems import (NUM_LABELS, assert_resume_bit_identical, linear_potentials, make_crf_data,
                                      num_linear_parameters)


@functools.lru_cache(maxsize=None)
def _separable_data():
    """Gold labels are the Viterbi paths of a random model: separable by construction."""
    with jax.ensure_compile_time_eval():
        return _build_separable_data()


def _build_separable_data():
    crf = make_crf_data(seed=3, num_sequences=20)
    truth = jnp.asarray(np.random.default_rng(3).normal(size=num_linear_parameters()) * 2.0)
    _, labels = chain.viterbi(jax.vmap(lambda x: linear_potentials(truth, x))(crf.features), crf.lengths)
    return SequenceData(crf.features, labels, crf.lengths)


@jax.jit
def _decode(theta, data):
    return chain.viterbi(jax.vmap(lambda x: linear_potentials(theta, x))(data.inputs), data.lengths)[1]


def _mistakes(theta, data):
    predicted = _decode(theta, data)
    return int(np.sum(np.any(np.asarray(predicted) != np.asarray(data.labels), axis=1)))


@functools.partial(jax.jit, static_argnames=("average",))
def _train_perceptron(data, average):
    return optimizers.perceptron(linear_potentials, jnp.zeros(num_linear_parameters()), data,
                                        num_epochs=60, average=average)


def test_perceptron_separates_separable_data():
    data = _separable_data()
    assert _mistakes(jnp.zeros(num_linear_parameters()), data) > 0
    params, loop = _train_perceptron(data, False)
    epochs = int(loop.step)
    assert float(loop.trace[epochs - 1]) == 0 and epochs < 60
    assert _mistakes(params, data) == 0
    averaged = optimizers.averaged_params(loop.inner)
    assert _mistakes(averaged, data) <= 2


def _sufficient_statistics(features, labels, length):
    """`S(x, y)` of `linear_potentials` by direct counting (numpy): emission
    counts `sum_t x_t outer onehot(y_t)` and transition counts."""
    features, labels = np.asarray(features), np.asarray(labels)
    emission = np.zeros((features.shape[-1], NUM_LABELS))
    transitions = np.zeros((NUM_LABELS, NUM_LABELS))
    for t in range(int(length)):
        emission[:, labels[t]] += features[t]
        if t > 0:
            transitions[labels[t - 1], labels[t]] += 1
    return np.concatenate([emission.ravel(), transitions.ravel()])


def test_perceptron_update_adds_the_feature_difference():
    """Oracle: `theta += S(x, y) - S(x, yhat)`, counted directly."""
    data = _separable_data()
    theta = jnp.asarray(np.random.default_rng(5).normal(size=num_linear_parameters()))
    update = jax.jit(functools.partial(optimizers.perceptron_update, linear_potentials))
    predictions = _decode(theta, data)
    for index in range(3):
        inputs, labels, length = data.inputs[index], data.labels[index], data.lengths[index]
        new, mistake = update(theta, inputs, labels, length)
        predicted = predictions[index]
        assert bool(mistake) == bool(np.any(np.asarray(predicted) != np.asarray(labels)))  # no exact ties here
        difference = (_sufficient_statistics(inputs, labels, length)
                      - _sufficient_statistics(inputs, predicted, length))
        np.testing.assert_allclose(new, np.asarray(theta) + difference, atol=1e-12)


def test_perceptron_resume_is_bit_identical(tmp_path):
    data = _separable_data()
    step_fn = optimizers.perceptron_epoch_fn(linear_potentials, data)
    loop = init_loop(optimizers.perceptron_init(jnp.zeros(num_linear_parameters())), 6)
    assert_resume_bit_identical(step_fn, loop, relative_change_below(0.0), 2, tmp_path / "perceptron.eqx")


@functools.lru_cache(maxsize=None)
def _boosting_data():
    crf = make_crf_data(seed=4, num_sequences=8, max_length=4)
    return SequenceData(crf.features, crf.labels, crf.lengths)


@functools.lru_cache(maxsize=None)
def _statistics():
    compute = jax.jit(lambda data: optimizers.boosting_statistics(linear_potentials, data, num_linear_parameters(),
                                                                  jnp.float64))
    return compute(_boosting_data())


@functools.partial(jax.jit, static_argnames=("step", "num_rounds"))
def _boost(data, step, num_rounds):
    return optimizers.sequence_boosting(linear_potentials, data, num_linear_parameters(), num_rounds=num_rounds,
                                      step=step)


def _true_round_objective(theta, feature, delta, data):
    """`Z_k(delta) = sum_i D(i) sum_{y != y_i} pi_i(y) exp(delta u_ik(y))` by enumeration."""
    basis = jnp.zeros(num_linear_parameters()).at[feature].set(1.0)
    weights, terms = [], []
    for inputs, labels, length in zip(data.inputs, data.labels, data.lengths):
        sequences, scores = testing.enumerate_sequences(linear_potentials(theta, inputs), int(length))
        _, feature_values = testing.enumerate_sequences(linear_potentials(basis, inputs), int(length))
        gold = [tuple(seq) == tuple(np.asarray(labels)[:int(length)]) for seq in map(tuple, sequences)]
        gold_index = int(np.argmax(gold))
        probabilities = np.exp(scores - np.logaddexp.reduce(scores))
        others = np.arange(len(scores)) != gold_index
        weights.append(1.0 / probabilities[gold_index] - 1.0)
        pi = probabilities[others] / (1.0 - probabilities[gold_index])
        u = feature_values[others] - feature_values[gold_index]
        terms.append(np.sum(pi * np.exp(delta * u)))
    weights = np.asarray(weights)
    return float(np.sum(weights / weights.sum() * np.asarray(terms)))


@pytest.mark.slow
@pytest.mark.parametrize("step", ["line_search", "closed_form"])
def test_boosting_bound_holds_and_exp_loss_decreases(step):
    data = _boosting_data()
    num_rounds = 25
    theta, loop = _boost(data, step, num_rounds)
    initial_loss = jax.jit(functools.partial(optimizers.sequence_exp_loss, linear_potentials))(jnp.zeros_like(theta), data)
    losses = np.concatenate([[float(initial_loss)],
                             np.asarray(loop.trace)])
    assert int(loop.step) == num_rounds
    assert np.all(np.diff(losses) < 0)
    # Replay the first rounds: each bound is >= the true Z_k (by enumeration),
    # and the loss shrinks by exactly Z_k.
    state = optimizers.BoostingState(jnp.zeros_like(theta), jnp.ones(()), -jnp.ones((), jnp.int32))
    statistics = _statistics()
    step_fn = jax.jit(optimizers.sequence_boosting_step_fn(linear_potentials, data, statistics, step))
    for round_index in range(2):
        new_state, loss = step_fn(state, round_index)
        feature = int(new_state.feature)
        delta = float(new_state.theta[feature] - state.theta[feature])
        true_z = _true_round_objective(state.theta, feature, delta, data)
        assert float(new_state.bound) >= true_z - 1e-12
        np.testing.assert_allclose(float(loss) / losses[round_index], true_z, rtol=1e-9)
        state = new_state
    assert np.sum(np.asarray(theta) != 0) <= 0.5 * theta.size  # a sparse model


def test_line_search_bound_is_tighter_than_closed_form():
    data = _boosting_data()
    _, line_search = _boost(data, "line_search", 25)
    _, closed_form = _boost(data, "closed_form", 25)
    assert float(line_search.trace[-1]) <= float(closed_form.trace[-1])


def test_boosting_resume_is_bit_identical(tmp_path):
    data = _boosting_data()
    step_fn = optimizers.sequence_boosting_step_fn(linear_potentials, data, _statistics())
    state = optimizers.BoostingState(jnp.zeros(num_linear_parameters()), jnp.ones(()), -jnp.ones((), jnp.int32))
    assert_resume_bit_identical(step_fn, init_loop(state, 8), relative_change_below(0.0), 3,
                                tmp_path / "optimizers.eqx")


def test_boosting_rejects_unknown_step():
    with pytest.raises(ValueError, match="step"):
        optimizers.sequence_boosting_step_fn(linear_potentials, _boosting_data(), None, step="newton")
