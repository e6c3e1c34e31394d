"""Contrastive estimation and the EM marginal likelihood against enumeration of
(string, tag sequence) pairs (MATH.md section 4), and a composed
semi-supervised objective (sequence log-loss + contrastive estimation)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import losses
from lossfns.lattices import dag, neighbourhoods, tagging
from lossfns.lattices.chain import FactoredPotentials

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

NUM_TAGS, VOCABULARY = 2, 4


def random_params(seed):
    rng = np.random.default_rng(seed)
    return tagging.TaggerParams(
        jnp.asarray(rng.normal(size=(NUM_TAGS, VOCABULARY))), jnp.asarray(rng.normal(size=(NUM_TAGS + 1, NUM_TAGS)))
    )


def features(string, tags):
    """`f(x, y)`: emission and tag-bigram counts, shaped like TaggerParams."""
    emission, bigram = np.zeros((NUM_TAGS, VOCABULARY)), np.zeros((NUM_TAGS + 1, NUM_TAGS))
    previous = NUM_TAGS  # the sentence boundary
    for word, tag in zip(string, tags):
        emission[tag, word] += 1
        bigram[previous, tag] += 1
        previous = tag
    return emission, bigram


def log_sum_and_expected_features(strings, params):
    """`log sum_{x in strings, y} exp theta . f(x, y)` and `E[f]`, by enumeration."""
    pairs = [(s, y) for s in strings for y in itertools.product(range(NUM_TAGS), repeat=len(s))]
    stats = [features(s, y) for s, y in pairs]
    scores = np.array([np.sum(e * params.emission) + np.sum(b * params.bigram) for e, b in stats])
    log_total = np.log(np.sum(np.exp(scores - scores.max()))) + scores.max()
    weights = np.exp(scores - log_total)
    expected = tuple(sum(w * s[i] for w, s in zip(weights, stats)) for i in range(2))
    return log_total, expected


def tagged(word_lattice):
    return tagging.intersect(word_lattice, NUM_TAGS)


def contrastive(params, numerator, denominator):
    return losses.contrastive_log_likelihood(
        numerator.lattice,
        tagging.arc_scores(numerator, params),
        denominator.lattice,
        tagging.arc_scores(denominator, params),
    )


SENTENCE = [0, 1, 2]
NEIGHBOURHOODS = {"trans1": neighbourhoods.trans1, "del1subseq": neighbourhoods.del1subseq}


@pytest.mark.parametrize("name", list(NEIGHBOURHOODS))
def test_contrastive_log_likelihood_matches_enumeration_and_its_gradient_formula(name):
    params = random_params(1)
    word_lattice = NEIGHBOURHOODS[name](SENTENCE)
    numerator, denominator = tagged(dag.from_string(SENTENCE)), tagged(word_lattice)
    value, grad = jax.value_and_grad(contrastive)(params, numerator, denominator)
    log_numerator, expected_numerator = log_sum_and_expected_features([tuple(SENTENCE)], params)
    log_denominator, expected_denominator = log_sum_and_expected_features(dag.enumerate_strings(word_lattice), params)
    np.testing.assert_allclose(value, log_numerator - log_denominator, rtol=1e-10)
    assert value <= 0
    # MATH.md section 4: the gradient is E[f | x] - E[f | N(x)].
    for got, numerator_part, denominator_part in zip(grad, expected_numerator, expected_denominator):
        np.testing.assert_allclose(got, numerator_part - denominator_part, atol=1e-10)


def hmm_params(seed):
    """A locally normalised (generative) first-order HMM as log-probabilities."""
    rng = np.random.default_rng(seed)
    emission = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(NUM_TAGS, VOCABULARY))), axis=-1)
    bigram = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(NUM_TAGS + 1, NUM_TAGS))), axis=-1)
    return tagging.TaggerParams(emission, bigram)


def test_em_marginal_likelihood_is_contrastive_estimation_over_all_strings_of_the_length():
    params = hmm_params(2)
    numerator = tagged(dag.from_string(SENTENCE))
    every_string = tagged(neighbourhoods.length(SENTENCE, VOCABULARY))
    scores = tagging.arc_scores(numerator, params)
    marginal = losses.marginal_log_likelihood(numerator.lattice, scores)
    # log p(x) by enumeration of the tag sequences.
    log_p_x, _ = log_sum_and_expected_features([tuple(SENTENCE)], params)
    np.testing.assert_allclose(marginal, log_p_x, rtol=1e-10)
    # An HMM puts mass 1 on the strings of each length, so the LENGTH
    # neighbourhood's denominator is log 1 = 0 and CE reduces to EM.
    np.testing.assert_allclose(contrastive(params, numerator, every_string), marginal, rtol=1e-10)
    # Its gradient in the arc scores is the arc posteriors (E-step counts).
    grad = jax.grad(lambda s: losses.marginal_log_likelihood(numerator.lattice, s))(scores)
    np.testing.assert_allclose(grad, dag.arc_marginals(numerator.lattice, scores), atol=1e-12)
    # A given global normaliser is subtracted.
    np.testing.assert_allclose(losses.marginal_log_likelihood(numerator.lattice, scores, 1.5), marginal - 1.5)


def test_batched_lattices_jit_and_empty_lattices():
    params = random_params(3)
    sentences = [[0, 1, 2], [3, 1]]
    numerators = tagging.stack([tagged(dag.from_string(s)) for s in sentences])
    denominators = tagging.stack([tagged(neighbourhoods.delortrans1(s)) for s in sentences])
    batched = jax.jit(contrastive)(params, numerators, denominators)
    assert batched.shape == (2,)
    for i, sentence in enumerate(sentences):
        one = contrastive(params, tagged(dag.from_string(sentence)), tagged(neighbourhoods.delortrans1(sentence)))
        np.testing.assert_allclose(batched[i], one, rtol=1e-10)
    # A lattice without any path gives -inf, not NaN, with finite gradients.
    empty = dag.from_arcs([], final=[], num_states=1)
    value, grad = jax.value_and_grad(lambda s: losses.contrastive_log_likelihood(empty, s, empty, s))(jnp.zeros((0,)))
    assert np.isneginf(value) and grad.shape == (0,)


def test_semi_supervised_objective_composes_sequence_log_loss_and_contrastive_estimation():
    """Labelled data: CRF log-loss of a chain built from the same tagger
    weights; unlabelled data: contrastive estimation (Smith & Eisner's future
    work); plus a Gaussian prior. The gradient is the sum of the parts'
    closed forms."""
    params = random_params(4)
    labelled_words, labelled_tags = np.array([[1, 3, 0]]), np.array([[0, 1, 1]])
    unlabelled = [2, 0, 3]
    numerator, denominator = tagged(dag.from_string(unlabelled)), tagged(neighbourhoods.trans1(unlabelled))
    weight, prior = 0.5, 0.1

    def chain_potentials(params, words):
        """The tagger as a CRF: emission scores per position, shared bigram transitions."""
        return FactoredPotentials(
            jnp.moveaxis(params.emission[:, words], 0, -1), params.bigram[:NUM_TAGS], params.bigram[NUM_TAGS]
        )

    def objective(params):
        supervised = jnp.sum(losses.sequence_log_loss(chain_potentials(params, labelled_words), labelled_tags))
        unsupervised = contrastive(params, numerator, denominator)
        return supervised - weight * unsupervised + losses.l2(params, prior)

    value, grad = jax.jit(jax.value_and_grad(objective))(params)
    log_z, expected_labelled = log_sum_and_expected_features([tuple(labelled_words[0])], params)
    gold = features(labelled_words[0], labelled_tags[0])
    gold_score = sum(np.sum(g * p) for g, p in zip(gold, params))
    log_numerator, expected_numerator = log_sum_and_expected_features([tuple(unlabelled)], params)
    log_denominator, expected_denominator = log_sum_and_expected_features(
        dag.enumerate_strings(neighbourhoods.trans1(unlabelled)), params
    )
    squared = sum(np.sum(np.square(p)) for p in params[:2])  # emission, bigram
    np.testing.assert_allclose(
        value, (log_z - gold_score) - weight * (log_numerator - log_denominator) + prior / 2 * squared, rtol=1e-10
    )
    for i, got in enumerate(grad[:2]):
        expected = (
            (expected_labelled[i] - gold[i])
            - weight * (expected_numerator[i] - expected_denominator[i])
            + prior * np.asarray(params[i])
        )
        np.testing.assert_allclose(got, expected, atol=1e-10)
