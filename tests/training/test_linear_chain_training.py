"""`training.train_linear_chain(model=)` and `initial_chain_model`: the
model a caller builds (to train it with other optimizers too, or to force a
potential form) is the one trained; the sparse and the dense
forward-backward train the same objective (Lavergne et al.'s Table 2 runs),
and the per-chunk callback sees weights that `with_weights` turns back into
the model. `shards=` without a mesh trains on blocks summed one at a time
(`models.blockwise_corpus_loss`): the same run as on the whole corpus."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import features, models, optimizers, training

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

K, K2, L = 6, 3, 3


@pytest.fixture(scope="module")
def sentences():
    """Sentences whose labels cycle 0 -> 1 -> 2 -> 0, so the observed label
    pairs (3 of 9) take the sparse form; each token has a word test and a
    pair test. `(encoded, labels)`."""
    rng = np.random.default_rng(0)
    encoded, labels = [], []
    for length in rng.integers(1, 6, 8):
        first = int(rng.integers(L))
        sentence = [(first + t) % L for t in range(length)]
        unigram = [[int(rng.integers(K)), K - 1 - y] for y in sentence]
        pair = [[int(rng.integers(K2))] for _ in sentence]
        encoded.append((unigram, pair))
        labels.append(sentence)
    return encoded, labels


@pytest.fixture(scope="module")
def corpus(sentences):
    return features.pack_rows(*sentences)


def _train(corpus, model=None, **options):
    """`(trained model, Result)`."""
    result = training.train_linear_chain(
        corpus,
        L,
        K,
        K2,
        l1=0.1,
        l2=0.01,
        max_steps=6,
        stop=optimizers.relative_change_below(0.0),
        dtype=jnp.float64,
        progress=False,
        model=model,
        **options,
    )
    return result.params, result


def test_the_dense_form_trains_the_sparse_forms_objective(corpus):
    initial = training.initial_chain_model(corpus, L, K, K2, dtype=jnp.float64)
    assert initial.pair_support is not None and len(initial.pair_support[0]) == 3  # the sparse form
    dense = initial.with_pair_mask(initial.pair_mask, max_sparse_fraction=0.0)
    assert dense.pair_support is None
    sparse_model, sparse = _train(corpus)
    dense_model, dense_result = _train(corpus, dense)
    assert dense_model.pair_support is None and sparse_model.pair_support is not None
    steps = int(sparse.num_steps)
    assert steps == 6 == int(dense_result.num_steps)
    np.testing.assert_allclose(np.asarray(dense_result.trace), np.asarray(sparse.trace), rtol=1e-10)
    for ours, theirs in zip(jax.tree_util.tree_leaves(dense_model), jax.tree_util.tree_leaves(sparse_model)):
        np.testing.assert_allclose(np.asarray(ours, float), np.asarray(theirs, float), atol=1e-8)


def test_the_given_initial_model_is_the_default_and_the_callback_sees_its_weights(corpus):
    seen = []
    initial = training.initial_chain_model(corpus, L, K, K2, dtype=jnp.float64)
    structure = initial.structure()
    callback = lambda report: seen.append(initial.with_weights(report.inner[0], structure))
    given, _ = _train(corpus, initial, callback=callback, chunk_steps=3)
    default, _ = _train(corpus)
    for ours, theirs in zip(jax.tree_util.tree_leaves(given), jax.tree_util.tree_leaves(default)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert len(seen) == 2  # two chunks of 3 iterations
    for ours, theirs in zip(jax.tree_util.tree_leaves(seen[-1]), jax.tree_util.tree_leaves(given)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    # Weights outside the observed pairs stay 0.
    emission = np.asarray(given.emission)
    assert np.all(emission[~np.asarray(initial.emission_mask)] == 0) and np.count_nonzero(emission) > 0


def test_blocks_one_at_a_time_train_the_whole_corpus_objective(sentences, corpus):
    """Oracle: the run on the whole packed corpus (float64); blocks of
    unequal content padded to one shape, dense form (the memory-bound case)."""
    initial = training.initial_chain_model(corpus, L, K, K2, dtype=jnp.float64)
    dense = initial.with_pair_mask(initial.pair_mask, max_sparse_fraction=0.0)
    blocks = features.pack_shards(*sentences, K, 3)
    assert jax.tree_util.tree_leaves(blocks)[0].shape[0] == 3
    whole_model, whole = _train(corpus, dense)
    blocked_model, blocked = _train(corpus, dense, shards=blocks)
    np.testing.assert_allclose(np.asarray(blocked.trace), np.asarray(whole.trace), rtol=1e-10)
    for ours, theirs in zip(jax.tree_util.tree_leaves(blocked_model), jax.tree_util.tree_leaves(whole_model)):
        np.testing.assert_allclose(np.asarray(ours, float), np.asarray(theirs, float), atol=1e-8)
    arrays = features.corpus_arrays(corpus, K)
    value = models.blockwise_corpus_loss(blocked_model, blocks)
    np.testing.assert_allclose(float(value), float(models.corpus_loss(blocked_model, arrays)), rtol=1e-12)
    with pytest.raises(ValueError, match="shards"):
        _train(corpus, dense, shards=blocks, loss=lambda p, labels, lengths: jnp.zeros(lengths.shape))
