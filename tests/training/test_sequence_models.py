"""The perceptron (Collins 2002) and sequence boosting (Altun et al. 2002)
on small linear-chain problems: separation of separable data, monotone
exp-loss and sparsity of boosting any linear model (its oracles:
tests/training/test_chain_boosting.py), jit and resume."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import training
from lossfns.lattices import chain
from lossfns.optimizers.minimize import init_loop, relative_change_below
from lossfns.training.perceptron import SequenceData, perceptron_update
from lossfns.training.sequence_boosting import boosting_data, sequence_boosting_step_fn, sequence_exp_loss
from lossfns.training.sparse_perceptron import (
    sparse_averaged_params,
    sparse_perceptron_epoch,
    sparse_perceptron_init,
    sparse_sequence_data,
)
from tests.optimizers.test_problems import (
    NUM_LABELS,
    assert_resume_bit_identical,
    linear_potentials,
    make_crf_data,
    num_linear_parameters,
)

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)


@functools.cache
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
    return training.perceptron(
        linear_potentials, jnp.zeros(num_linear_parameters()), data, max_steps=60, average=average
    )


def test_perceptron_separates_separable_data():
    data = _separable_data()
    assert _mistakes(jnp.zeros(num_linear_parameters()), data) > 0
    result = _train_perceptron(data, False)
    params, epochs = result.params, int(result.num_steps)
    assert float(result.trace[epochs - 1]) == 0 and epochs < 60
    assert _mistakes(params, data) == 0
    averaged = training.averaged_params(result.state)
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
    update = jax.jit(functools.partial(perceptron_update, linear_potentials))
    predictions = _decode(theta, data)
    for index in range(3):
        inputs, labels, length = data.inputs[index], data.labels[index], data.lengths[index]
        new, mistake = update(theta, inputs, labels, length)
        predicted = predictions[index]
        assert bool(mistake) == bool(np.any(np.asarray(predicted) != np.asarray(labels)))  # no exact ties here
        difference = _sufficient_statistics(inputs, labels, length) - _sufficient_statistics(inputs, predicted, length)
        np.testing.assert_allclose(new, np.asarray(theta) + difference, atol=1e-12)


def test_perceptron_resume_is_bit_identical(tmp_path):
    data = _separable_data()
    step_fn = training.perceptron_epoch_fn(linear_potentials, data)
    loop = init_loop(training.perceptron_init(jnp.zeros(num_linear_parameters())), 6)
    assert_resume_bit_identical(step_fn, loop, relative_change_below(0.0), 2, tmp_path / "perceptron.eqx")


@functools.cache
def _boosting_data():
    crf = make_crf_data(seed=4, num_sequences=8, max_length=4)
    return SequenceData(crf.features, crf.labels, crf.lengths)


@functools.partial(jax.jit, static_argnames=("step", "num_rounds"))
def _boost(data, step, num_rounds):
    return training.sequence_boosting(linear_potentials, data, num_linear_parameters(), max_steps=num_rounds, step=step)


# The bound against enumeration, the sparse layout against this dense one,
# the stop rules and resumption: tests/training/test_chain_boosting.py.


def test_boosting_of_any_linear_model_lowers_the_exp_loss_with_few_features():
    """`linear_potentials` has no start weights and real-valued features:
    the dense layout's general case."""
    data = _boosting_data()
    result = _boost(data, "line_search", 25)
    theta = result.params
    initial = jax.jit(functools.partial(sequence_exp_loss, linear_potentials))(jnp.zeros_like(theta), data)
    trace = np.concatenate([[np.log(float(initial))], np.asarray(result.trace)])
    assert int(result.num_steps) == 25 and np.all(np.diff(trace) < 0)
    # The exp-loss after the rounds, recomputed directly.
    np.testing.assert_allclose(np.exp(trace[-1]), sequence_exp_loss(linear_potentials, theta, data), rtol=1e-10)
    assert np.all(np.asarray(result.state.history.bound) < 1.0)
    assert np.sum(np.asarray(theta) != 0) <= 0.5 * theta.size  # a sparse model


def test_line_search_bound_is_tighter_than_closed_form():
    data = _boosting_data()
    line_search = _boost(data, "line_search", 25)
    closed_form = _boost(data, "closed_form", 25)
    assert float(line_search.trace[-1]) <= float(closed_form.trace[-1])


def test_boosting_rejects_unknown_step():
    with pytest.raises(ValueError, match="step"):
        sequence_boosting_step_fn(
            boosting_data(linear_potentials, _boosting_data(), num_linear_parameters()),
            linear_potentials,
            step="newton",
        )


def _reference_averaged_perceptron(
    sentences, labels, num_features, num_labels, epochs, emission=None, transitions=None
):
    """The averaged perceptron (Collins 2002) as plain Python loops: dense
    Viterbi (ties to the lowest label), `w += S(x, y) - S(x, yhat)`, and the
    average of the weights after every example, summed explicitly."""
    W = np.zeros((num_features, num_labels), np.int64) if emission is None else np.array(emission, np.int64)
    A = np.zeros((num_labels, num_labels), np.int64) if transitions is None else np.array(transitions, np.int64)
    sum_W, sum_A, seen = np.zeros_like(W), np.zeros_like(A), 0
    for _ in range(epochs):
        for ids, gold in zip(sentences, labels):
            T = len(ids)
            scores = [[sum(int(W[f, j]) for f in ids[t]) for j in range(num_labels)] for t in range(T)]
            delta, back = [scores[0]], []
            for t in range(1, T):
                row, pointers = [], []
                for j in range(num_labels):
                    best = max(range(num_labels), key=lambda i: (delta[-1][i] + A[i, j], -i))
                    row.append(delta[-1][best] + A[best, j] + scores[t][j])
                    pointers.append(best)
                delta.append(row)
                back.append(pointers)
            path = [max(range(num_labels), key=lambda j: (delta[-1][j], -j))]
            for t in range(T - 2, -1, -1):
                path.insert(0, back[t][path[0]])
            for t in range(T):
                for f in ids[t]:
                    W[f, gold[t]] += 1
                    W[f, path[t]] -= 1
            for t in range(1, T):
                A[gold[t - 1], gold[t]] += 1
                A[path[t - 1], path[t]] -= 1
            sum_W, sum_A, seen = sum_W + W, sum_A + A, seen + 1
    return W, A, sum_W / seen, sum_A / seen


def _random_tagging_problem(seed, num_sentences=40, num_features=15, num_labels=6, max_length=9):
    """Sentences whose labels mostly follow a planted feature -> label map
    (learnable, so the pruned decoders get used) with some noise."""
    rng = np.random.default_rng(seed)
    planted = rng.integers(0, num_labels, num_features)
    sentences, labels = [], []
    for _ in range(num_sentences):
        length = int(rng.integers(1, max_length + 1))
        ids = [sorted(set(rng.integers(0, num_features, rng.integers(1, 4)).tolist())) for _ in range(length)]
        labels.append(
            [int(planted[token[0]]) if rng.random() < 0.8 else int(rng.integers(0, num_labels)) for token in ids]
        )
        sentences.append(ids)
    return sentences, labels


@pytest.mark.parametrize("seed, start", [(0, "zero"), (1, "zero"), (2, "random"), (3, "large")])
def test_sparse_perceptron_epoch_equals_python_reference(seed, start):
    """The fast epoch (pruned exact Viterbi, sparse scatter updates, lazy
    averaging) gives exactly the weights of the plain-loop averaged perceptron,
    epoch after epoch, and the same average."""
    num_features, num_labels, epochs = 15, 6, 4
    sentences, labels = _random_tagging_problem(seed, num_features=num_features, num_labels=num_labels)
    data = sparse_sequence_data(sentences, labels, num_features)
    emission = transitions = None
    if start == "random":  # ties and pruning from the first sentence on
        rng = np.random.default_rng(seed)
        emission = rng.integers(-2, 3, (num_features, num_labels))
        transitions = rng.integers(-2, 3, (num_labels, num_labels))
    if start == "large":  # transition weights too large for the int16 decoder
        rng = np.random.default_rng(seed)
        emission = rng.integers(-3000, 3000, (num_features, num_labels))
        transitions = rng.integers(-5000, 5000, (num_labels, num_labels))
    state = sparse_perceptron_init(num_features, num_labels, emission=emission, transitions=transitions)
    epoch = jax.jit(sparse_perceptron_epoch, static_argnames=("max_length", "windows", "widths"))
    used = np.zeros(5, int)
    for e in range(1, epochs + 1):
        state, (mistakes, branches) = epoch(state, data, max_length=9, windows=(3, 6), widths=(1, 2, 4))
        assert int(mistakes) >= 0
        used += np.asarray(branches)
        W, A, average_W, average_A = _reference_averaged_perceptron(
            sentences, labels, num_features, num_labels, e, emission, transitions
        )
        np.testing.assert_array_equal(np.asarray(state.emission), W)
        np.testing.assert_array_equal(np.asarray(state.transitions), A)
        averaged = sparse_averaged_params(state)
        np.testing.assert_allclose(np.asarray(averaged[0]), average_W, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(np.asarray(averaged[1]), average_A, rtol=1e-6, atol=1e-5)
        assert int(state.num_seen) == e * len(sentences)
    assert used[:3].sum() > 0 or start == "large"  # the pruned decoders ran
    assert used[4 if start == "large" else 3] > 0  # the dense (int32 resp. int16) decoder ran
