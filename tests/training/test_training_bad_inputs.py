"""Bad input to lossfns.training: each case raises the stated exception type
with a message naming the offending argument.

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import optimizers, training
from lossfns.features import FeatureBatch, pack
from lossfns.lattices.chain import FactoredPotentials
from lossfns.models import LinearChainModel
from lossfns.training import reranking
from tests.bad_inputs import EXAMPLES, NAN, L, T, assert_raises_a_named_error, case_ids, squares, x32

_FEATURE_BATCH = FeatureBatch(
    jnp.zeros((4, 1, 1), jnp.int32),
    jnp.zeros((4, 1, 0), jnp.int32),
    jnp.ones(4, jnp.int32),
    jnp.zeros((4, 1), jnp.int32),
)


def _lazy_step(model, segments=1):
    sgd = optimizers.lazy_sgd_l1(0.1, 0.1)
    step = training.lazy_epoch_step_fn(
        squares, sgd, _FEATURE_BATCH, batch_size=2, max_rows=(1, 0), segments_per_epoch=segments
    )
    return step((model, None, jax.random.key(0)), jnp.zeros((), jnp.int32))


def _bcd_corpus(ids=(0, 1, 0), labels=(0, 1, 0)):
    """One labelled sentence of T tokens, one unigram test each."""
    return pack([([[i] for i in ids], [[] for _ in ids])], [list(labels)])


def _bcd_data():
    return training.bcd_data(_bcd_corpus(), LinearChainModel.zeros(2, L))


def _sequence_data():
    return training.SequenceData(jnp.zeros((2, T, L)), jnp.zeros((2, T), jnp.int32), jnp.array([T, T]))


def _unary_model(theta, inputs):
    return FactoredPotentials(inputs + theta[:L], theta[L:].reshape(L, L), None)


def _reranking_data(features=None, reference=(0, 1), mask=None):
    return reranking.reranking_data(jnp.zeros((2, 3, 4)) if features is None else features, jnp.array(reference), mask)


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    # --- SGD-L1 calibration, lazy SGD-L1, the linear-chain trainer ---
    (
        "calibrate-candidates",
        "no candidate learning rates to calibrate",
        lambda _: training.calibrate_learning_rate(
            squares, jnp.zeros(2), EXAMPLES, 0.1, key=jax.random.key(0), candidates=()
        ),
        ValueError,
        ["candidates", "at least one", "()"],
    ),
    (
        "calibrate-sample-size",
        "a calibration sample of 0 examples",
        lambda _: training.calibrate_learning_rate(
            squares, jnp.zeros(2), EXAMPLES, 0.1, key=jax.random.key(0), sample_size=0
        ),
        ValueError,
        ["sample_size", ">= 1", "0"],
    ),
    (
        "lazy-sgd-segments",
        "more segments of an epoch than minibatches",
        lambda _: _lazy_step(LinearChainModel.zeros(1, 2), segments=3),
        ValueError,
        ["segments_per_epoch", "[1, 2]", "3"],
    ),
    (
        "train-linear-chain-model-shape",
        "a starting model of other shapes than the corpus's counts",
        lambda _: training.train_linear_chain(_bcd_corpus(), 2, 2, model=LinearChainModel.zeros(3, 2)),
        ValueError,
        ["model", "emission [K, L] = (2, 2)", "(3, 2)"],
    ),
    (
        "lazy-sgd-max-rows-batch",
        "batch_size = 0 to bound the rows of a minibatch",
        lambda _: training.max_rows_per_batch(_FEATURE_BATCH, 0),
        ValueError,
        ["batch_size", ">= 1", "0"],
    ),
    # --- block coordinate descent, perceptron, sequence boosting ---
    (
        "bcd-max-steps",
        "max_steps = 0 for BCD",
        lambda _: training.bcd(_bcd_data(), LinearChainModel.zeros(2, L), 0.1, max_steps=0),
        ValueError,
        ["max_steps", ">= 1", "0"],
    ),
    (
        "bcd-corpus",
        "a padded id array instead of a PackedCorpus for BCD",
        lambda _: training.bcd_data(np.zeros((1, T, 1), np.int32), LinearChainModel.zeros(2, L)),
        TypeError,
        ["corpus", "PackedCorpus", "ndarray"],
    ),
    (
        "bcd-model",
        "a parameter dict instead of a LinearChainModel for BCD",
        lambda _: training.bcd_data(_bcd_corpus(), {"emission": jnp.zeros((2, L))}),
        TypeError,
        ["model", "LinearChainModel", "dict"],
    ),
    (
        "bcd-feature-ids",
        "a feature id past the model's rows for BCD",
        lambda _: training.bcd_data(_bcd_corpus(ids=(0, 2, 0)), LinearChainModel.zeros(2, L)),
        ValueError,
        ["corpus.unigram_ids", "[-1, 2)", "[0, 2]"],
    ),
    (
        "bcd-labels",
        "a label past the model's labels for BCD",
        lambda _: training.bcd_data(_bcd_corpus(labels=(0, 2, 0)), LinearChainModel.zeros(2, L)),
        ValueError,
        ["labels", "[0, 2)", "got 2"],
    ),
    (
        "sparse-perceptron-ids",
        "a fractional feature id for the sparse perceptron",
        lambda _: training.sparse_sequence_data([[[0, 1.5], [2]]], [[0, 1]], 3),
        TypeError,
        ["feature_ids[0][0]", "integer", "1.5"],
    ),
    (
        "sparse-perceptron-id-range",
        "a feature id equal to num_features (the padding id)",
        lambda _: training.sparse_sequence_data([[[0, 3], [2]]], [[0, 1]], 3),
        ValueError,
        ["feature ids", "[0, 3)", "got 3"],
    ),
    (
        "perceptron-max-steps",
        "max_steps = 0 for the perceptron",
        lambda _: training.perceptron(_unary_model, jnp.zeros(L + L * L), _sequence_data(), max_steps=0),
        ValueError,
        ["max_steps", ">= 1", "0"],
    ),
    (
        "perceptron-data",
        "a plain tuple instead of SequenceData",
        lambda _: training.perceptron(_unary_model, jnp.zeros(L + L * L), tuple(_sequence_data()), max_steps=1),
        TypeError,
        ["data", "SequenceData", "tuple"],
    ),
    (
        "boosting-max-steps",
        "max_steps = 0 for sequence boosting",
        lambda _: training.sequence_boosting(_unary_model, _sequence_data(), L + L * L, max_steps=0),
        ValueError,
        ["max_steps", ">= 1", "0"],
    ),
    (
        "boosting-step",
        "an unknown boosting step rule",
        lambda _: training.sequence_boosting(_unary_model, _sequence_data(), L + L * L, max_steps=2, step="newton"),
        ValueError,
        ["step", "line_search", "'newton'"],
    ),
    (
        "chain-boosting-labels",
        "a label equal to num_labels for sparse sequence boosting",
        lambda _: training.chain_boosting_data(np.zeros((1, T, 1), np.int32), np.array([[0, 2, 1]]), [3], 2, 2),
        ValueError,
        ["labels", "[0, 2)", "got 2"],
    ),
    (
        "chain-boosting-ids",
        "an observation id equal to num_features for sparse sequence boosting",
        lambda _: training.chain_boosting_data(np.full((1, T, 1), 4, np.int32), np.zeros((1, T), np.int32), [3], 4, 2),
        ValueError,
        ["ids", "[-1, 4)", "got 4"],
    ),
    (
        "chain-boosting-lengths",
        "a length longer than the sequences for sparse sequence boosting",
        lambda _: training.chain_boosting_data(np.zeros((1, T, 1), np.int32), np.zeros((1, T), np.int32), [5], 2, 2),
        ValueError,
        ["lengths", "[0, 3]", "got 5"],
    ),
    (
        "boost-data",
        "a SequenceData instead of a boosting layout for boost",
        lambda _: training.boost(_sequence_data(), _unary_model, max_steps=2),
        TypeError,
        ["data", "BoostingData", "ChainBoostingData", "SequenceData"],
    ),
    (
        "boost-potentials",
        "a potentials_fn with the sparse boosting layout",
        lambda _: training.boost(
            training.chain_boosting_data(np.zeros((1, T, 1), np.int32), np.zeros((1, T), np.int32), [3], 2, 2),
            _unary_model,
            max_steps=2,
        ),
        ValueError,
        ["potentials_fn", "None", "ChainBoostingData"],
    ),
    # --- reranking: boosting with shrinkage, FSLR, BLasso ---
    (
        "rerank-shrinkage",
        "shrinkage = 0",
        lambda _: training.boosting_with_shrinkage_step_fn(_reranking_data(), 0.0),
        ValueError,
        ["shrinkage", "(0, 1]", "0.0"],
    ),
    (
        "fslr-epsilon",
        "a negative FSLR step epsilon",
        lambda _: training.fslr_step_fn(_reranking_data(), -0.1),
        ValueError,
        ["epsilon", "> 0", "-0.1"],
    ),
    (
        "blasso-epsilon",
        "BLasso step epsilon = 0",
        lambda _: training.blasso_step_fn(_reranking_data(), 0.0),
        ValueError,
        ["epsilon", "> 0", "0.0"],
    ),
    (
        "blasso-tolerance",
        "a negative BLasso tolerance",
        lambda _: training.blasso_step_fn(_reranking_data(), 0.1, tolerance=-1.0),
        ValueError,
        ["tolerance", ">= 0", "-1.0"],
    ),
    (
        "rerank-data",
        "raw features instead of RerankingData",
        lambda _: training.reranking_init(jnp.zeros((2, 3, 4))),
        TypeError,
        ["data", "RerankingData", "got "],
    ),
    (
        "rerank-reference",
        "a reranking reference >= C",
        lambda _: _reranking_data(reference=(0, 3)),
        ValueError,
        ["reference", "[0, 3)", "got 3 at index 1"],
    ),
    (
        "rerank-reference-wrap",
        "an int64 reranking reference 2**32 + 1 (int32 would read 1)",
        lambda _: x32(lambda: reranking.reranking_data(jnp.zeros((2, 3, 4)), np.array([0, 2**32 + 1]))),
        ValueError,
        ["reference", "int32", "4294967297"],
    ),
    (
        "rerank-reference-absent",
        "a reranking reference that mask marks absent",
        lambda _: _reranking_data(mask=jnp.array([[1, 1, 1], [1, 0, 1]])),
        ValueError,
        ["reference", "mask", "got 1"],
    ),
    (
        "rerank-features-nan",
        "NaN in reranking features",
        lambda _: _reranking_data(features=jnp.zeros((2, 3, 4)).at[1, 2, 0].set(NAN)),
        ValueError,
        ["features", "finite", "nan", "(1, 2, 0)"],
    ),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)
