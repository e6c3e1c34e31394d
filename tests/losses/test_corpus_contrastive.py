"""Contrastive estimation over packed lattices: the corpus sum of sentences
and neighbourhoods packed together (`corpus_contrastive_log_likelihood`)
against the sum of `contrastive_log_likelihood` per sentence, and both
lattice objectives on a `dag.PackedLattices`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import losses, semirings
from lossfns.lattices import dag, neighbourhoods, tagging

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

NUM_TAGS, VOCABULARY = 2, 4
SENTENCES = [[0, 1, 2], [3, 1], [2]]


def _params(seed):
    rng = np.random.default_rng(seed)
    return tagging.TaggerParams(
        jnp.asarray(rng.normal(size=(NUM_TAGS, VOCABULARY))), jnp.asarray(rng.normal(size=(NUM_TAGS + 1, NUM_TAGS)))
    )


def _tagged(word_lattice):
    return tagging.intersect(word_lattice, NUM_TAGS)


def _pairs():
    return [(_tagged(dag.from_string(s)), _tagged(neighbourhoods.delortrans1(s))) for s in SENTENCES]


def _per_sentence(params):
    """The oracle: `contrastive_log_likelihood` of each (unbatched) sentence, summed."""
    return sum(
        losses.contrastive_log_likelihood(
            x.lattice, tagging.arc_scores(x, params), n.lattice, tagging.arc_scores(n, params)
        )
        for x, n in _pairs()
    )


@pytest.mark.parametrize("semiring", [semirings.Log, semirings.Real])
def test_one_pack_of_sentences_and_neighbourhoods_is_the_sum_per_sentence(semiring):
    params = _params(0)
    numerators, denominators = zip(*_pairs())
    # Neighbourhoods first, sentences after, and two padding rows.
    packed = tagging.pack(list(denominators) + list(numerators), num_lattices=2 * len(SENTENCES) + 2)
    roles = jnp.array([-1.0] * len(SENTENCES) + [1.0] * len(SENTENCES) + [0.0, 0.0])

    def corpus(params):
        scores = tagging.arc_scores(packed, params)
        return losses.corpus_contrastive_log_likelihood(packed.lattice, scores, roles, semiring=semiring)

    value, grad = jax.value_and_grad(corpus)(params)
    want, want_grad = jax.value_and_grad(_per_sentence)(params)
    np.testing.assert_allclose(value, want, rtol=1e-6)
    for got, expected in zip(jax.tree_util.tree_leaves(grad), jax.tree_util.tree_leaves(want_grad)):
        np.testing.assert_allclose(got, expected, atol=1e-6)
    # Stacked lattices (`[B, A]` scores) give the same.
    stacked = tagging.stack(list(denominators) + list(numerators))
    stacked_value = losses.corpus_contrastive_log_likelihood(
        stacked.lattice, tagging.arc_scores(stacked, params), roles[: 2 * len(SENTENCES)], semiring=semiring
    )
    np.testing.assert_allclose(stacked_value, want, rtol=1e-6)


def test_packed_lattices_give_each_lattices_objective():
    params = _params(1)
    numerators, denominators = zip(*_pairs())
    packed_x, packed_n = tagging.pack(list(numerators)), tagging.pack(list(denominators))
    x_scores, n_scores = tagging.arc_scores(packed_x, params), tagging.arc_scores(packed_n, params)
    value = losses.contrastive_log_likelihood(packed_x.lattice, x_scores, packed_n.lattice, n_scores)
    marginal = losses.marginal_log_likelihood(packed_x.lattice, x_scores, 0.5)
    assert value.shape == marginal.shape == (len(SENTENCES),)
    for i, (x, n) in enumerate(_pairs()):
        x_alone, n_alone = tagging.arc_scores(x, params), tagging.arc_scores(n, params)
        np.testing.assert_allclose(
            value[i], losses.contrastive_log_likelihood(x.lattice, x_alone, n.lattice, n_alone), rtol=1e-6
        )
        np.testing.assert_allclose(marginal[i], losses.marginal_log_likelihood(x.lattice, x_alone) - 0.5, rtol=1e-6)


def test_a_sentence_without_analyses_gives_minus_infinity_not_nan():
    empty = dag.from_arcs([], final=[], num_states=1)
    packed = dag.pack([empty, empty])
    scores = jnp.zeros((packed.num_arcs,))
    value = losses.corpus_contrastive_log_likelihood(packed, scores, jnp.array([1.0, -1.0]))
    assert np.isneginf(value)
