"""HMM and EM against brute-force enumeration of tag sequences."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import hmm

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

K, V = 2, 4
WORDS = np.array([[0, 1, 3, 2], [2, 2, 0, -1], [1, -1, -1, -1], [-1, -1, -1, -1]])
LENGTHS = np.array([4, 3, 1, 0])


def random_params(order, seed):
    key = jax.random.PRNGKey(seed)
    params = hmm.initial_params(K, V, order=order, key=key, noise=1.0, dtype=jnp.float64)
    return params


def sequence_counts(words, tags, order):
    """Counts of one tagged sentence, by hand."""
    transition, emission = np.zeros((K + 1,) * order + (K,)), np.zeros((K, V))
    history = (K,) * order + tuple(tags)
    for t, (w, y) in enumerate(zip(words, tags)):
        transition[history[t : t + order] + (y,)] += 1
        emission[y, w] += 1
    return transition, emission


def brute_force(params, words, order):
    """log P(x) and expected counts of one sentence by enumerating tag sequences."""
    log_t, log_e = np.asarray(params.log_transition), np.asarray(params.log_emission)
    scores, counts = [], []
    for tags in itertools.product(range(K), repeat=len(words)):
        transition, emission = sequence_counts(words, tags, order)
        score = np.sum(np.where(transition > 0, log_t * transition, 0.0)) + np.sum(
            np.where(emission > 0, log_e * emission, 0.0)
        )
        scores.append(score)
        counts.append((transition, emission))
    scores = np.array(scores)
    log_p = np.logaddexp.reduce(scores)
    posterior = np.exp(scores - log_p)
    expected = [sum(p * c[i] for p, c in zip(posterior, counts)) for i in range(2)]
    return log_p, expected, list(itertools.product(range(K), repeat=len(words)))[int(np.argmax(scores))]


@pytest.mark.parametrize("order", [1, 2])
def test_likelihood_counts_and_decoding_match_enumeration(order):
    params = random_params(order, order)
    log_p = hmm.log_likelihood(params, WORDS, LENGTHS)
    counts = hmm.expected_counts(params, WORDS, LENGTHS)
    tags = hmm.decode(params, WORDS, LENGTHS)
    total_transition, total_emission = 0, 0
    for i, (words, n) in enumerate(zip(WORDS, LENGTHS)):
        expected_log_p, (transition, emission), best = brute_force(params, words[:n], order)
        np.testing.assert_allclose(log_p[i], expected_log_p, rtol=1e-10)
        total_transition, total_emission = total_transition + transition, total_emission + emission
        assert tags[i, :n].tolist() == list(best) and (np.asarray(tags[i, n:]) == -1).all()
    np.testing.assert_allclose(counts.log_transition, total_transition, atol=1e-10)
    np.testing.assert_allclose(counts.log_emission, total_emission, atol=1e-10)


@pytest.mark.parametrize("order", [1, 2])
def test_supervised_counts(order):
    tags = np.array([[0, 1, 1, 0], [1, 1, 0, -1], [0, -1, -1, -1], [-1, -1, -1, -1]])
    counts = hmm.supervised_counts(WORDS, tags, LENGTHS, K, V, order=order, dtype=jnp.float64)
    expected = [sum(c) for c in zip(*(sequence_counts(w[:n], y[:n], order) for w, y, n in zip(WORDS, tags, LENGTHS)))]
    np.testing.assert_allclose(counts.log_transition, expected[0])
    np.testing.assert_allclose(counts.log_emission, expected[1])


def test_m_step_add_lambda_and_dictionary():
    counts = hmm.HMMParams(
        jnp.asarray([[1.0, 3.0], [0.0, 0.0], [2.0, 2.0]]), jnp.asarray([[1.0, 0.0, 2.0, 1.0], [0.0, 5.0, 0.0, 0.0]])
    )
    dictionary = np.array([[True, False], [True, True], [True, False], [False, True]])  # [V, K]
    params = hmm.m_step(counts, 0.5, dictionary)
    np.testing.assert_allclose(np.exp(params.log_transition), [[1.5 / 5, 3.5 / 5], [0.5, 0.5], [0.5, 0.5]])
    np.testing.assert_allclose(np.exp(params.log_emission[0]), [1.5 / 4.5, 0.5 / 4.5, 2.5 / 4.5, 0.0])
    np.testing.assert_allclose(np.exp(params.log_emission[1]), [0.0, 5.5 / 6, 0.0, 0.5 / 6])
    assert params.log_emission[0, 3] == -np.inf


@pytest.mark.slow
@pytest.mark.parametrize("order", [1, 2])
def test_em_increases_likelihood(order):
    rng = np.random.default_rng(order)
    words = rng.integers(0, V, (6, 5))
    lengths = np.array([5, 4, 5, 2, 1, 3])
    dictionary = np.array([[True, True], [True, False], [False, True], [True, True]])
    params = hmm.initial_params(
        K, V, order=order, tag_dictionary=dictionary, key=jax.random.PRNGKey(0), noise=0.5, dtype=jnp.float64
    )
    final, history = hmm.em(params, words, lengths, iterations=6, tag_dictionary=dictionary)
    assert np.all(np.diff(history) >= -1e-9) and history[-1] > history[0]
    assert np.all(np.exp(final.log_emission) * ~dictionary.T == 0)
    # With smoothing, EM is MAP-EM: log-likelihood + lambda * sum(log theta) never decreases.
    smoothing = 0.5

    def objective(p):
        log_theta = jnp.concatenate([p.log_transition.reshape(-1), p.log_emission.T[dictionary]])
        return float(jnp.sum(hmm.log_likelihood(p, words, lengths)) + smoothing * jnp.sum(log_theta))

    values, p = [], params
    for _ in range(5):
        values.append(objective(p))
        p, _ = hmm.em(p, words, lengths, iterations=1, smoothing=smoothing, tag_dictionary=dictionary)
    assert np.all(np.diff(values) >= -1e-9)


def test_bad_input():
    params = random_params(1, 0)
    with pytest.raises(ValueError, match="log_transition"):
        hmm.log_likelihood(hmm.HMMParams(params.log_transition[:2, :1], params.log_emission), WORDS, LENGTHS)
    with pytest.raises(ValueError, match="lengths"):
        hmm.log_likelihood(params, WORDS, np.array([5, 1, 1, 1]))
    with pytest.raises(ValueError, match="order"):
        hmm.initial_params(K, V, order=3)
