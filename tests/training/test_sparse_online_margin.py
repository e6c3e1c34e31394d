"""The sparse passive-aggressive and AROW epochs (`training.sparse_online_margin`)
equal the dense ones (`pa_epoch_fn`, `arow_epoch_fn`, themselves checked against
brute force and pycrfsuite in test_online_margin.py) epoch by epoch, in float64,
on a feature-id corpus with repeated observations, feature values, masked
emission and transition weights, start weights, sentences of one token and
sentences longer than the smallest decoding window."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import training
from lossfns.models import LinearChainModel

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

NUM_FEATURES, NUM_LABELS, WIDTH = 7, 4, 3


def _corpus(seed: int, with_values: bool):
    """Sentences of token ids (-1: none; id 0, a bias, on every token), labels and values."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray([1, 5, 11, 3, 9, 2, 14, 6])
    total = int(lengths.sum())
    ids = rng.integers(1, NUM_FEATURES, size=(total, WIDTH))
    ids[:, 0] = 0
    ids[rng.random((total, WIDTH)) < 0.2] = -1
    values = rng.uniform(0.5, 2.0, size=(total, WIDTH)) if with_values else None
    labels = rng.integers(0, NUM_LABELS, size=total)
    return ids, values, labels, lengths


def _dense_data(ids, values, labels, lengths) -> training.SequenceData:
    """The same corpus one padded sentence per row, for the dense epochs."""
    longest, starts = int(lengths.max()), np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rows = np.full((lengths.size, longest, WIDTH), -1)
    row_values = np.zeros((lengths.size, longest, WIDTH))
    row_labels = np.full((lengths.size, longest), -1)
    for i, (start, length) in enumerate(zip(starts, lengths)):
        rows[i, :length] = ids[start : start + length]
        row_labels[i, :length] = labels[start : start + length]
        if values is not None:
            row_values[i, :length] = values[start : start + length]
    inputs = (jnp.asarray(rows, jnp.int32), None if values is None else jnp.asarray(row_values))
    return training.SequenceData(inputs, jnp.asarray(row_labels, jnp.int32), jnp.asarray(lengths, jnp.int32))


def _model(seed: int) -> LinearChainModel:
    """Random starting weights on random emission and transition masks, start weights kept."""
    rng = np.random.default_rng(seed + 1)
    emission_mask = rng.random((NUM_FEATURES, NUM_LABELS)) < 0.7
    transition_mask = rng.random((NUM_LABELS, NUM_LABELS)) < 0.8
    model = LinearChainModel.zeros(NUM_FEATURES, NUM_LABELS, emission_mask=emission_mask, dtype=jnp.float64)
    model = model.with_transition_mask(transition_mask)
    return model.with_weights(
        jax.tree_util.tree_map(lambda w: jnp.asarray(rng.normal(size=w.shape) * 0.3), model.weights()),
        model.structure(),
    )


def _tables(model: LinearChainModel):
    weights = model.weights()
    return weights._replace(emission=model.emission, transitions=model.transitions * model.weight_masks().transitions)


@pytest.mark.parametrize(
    "algorithm, settings, with_values",
    [
        ("pa", dict(pa_type=0), True),
        ("pa", dict(pa_type=1, c=0.3, error_sensitive=False), False),
        ("pa", dict(pa_type=2, c=0.7), True),
        ("arow", dict(gamma=0.5), True),
        ("arow", dict(gamma=2.0), False),
    ],
)
def test_every_epoch_equals_the_dense_epoch(algorithm, settings, with_values):
    ids, values, labels, lengths = _corpus(3, with_values)
    model = _model(3)
    structure, masks = model.structure(), model.weight_masks()
    key = jax.random.PRNGKey(5)

    def potentials(params, inputs):
        row_ids, row_values = inputs
        return LinearChainModel.from_weights(params, structure)(row_ids, None, row_values)

    stack = training.token_stack(ids, values, labels, lengths)
    if algorithm == "pa":
        dense_step = training.pa_epoch_fn(potentials, _dense_data(ids, values, labels, lengths), **settings)
        sparse_step = training.sparse_pa_epoch_fn(stack, masks, max_length=14, **settings)
        dense, sparse = training.pa_init(model.weights(), key), training.pa_init(_tables(model), key)
    else:
        dense_step = training.arow_epoch_fn(potentials, _dense_data(ids, values, labels, lengths), **settings)
        sparse_step = training.sparse_arow_epoch_fn(stack, masks, max_length=14, **settings)
        dense, sparse = training.arow_init(model.weights(), 0.8, key), training.arow_init(_tables(model), 0.8, key)
    rows, columns = structure.emission_pairs
    for step in range(3):
        dense, dense_cost = jax.jit(dense_step)(dense, step)
        sparse, sparse_cost = jax.jit(sparse_step)(sparse, step)
        assert float(dense_cost) > 0  # mistakes were made: the updates ran
        np.testing.assert_allclose(sparse_cost, dense_cost, rtol=1e-10)
        trees = [(sparse.params, dense.params)]
        trees.append(
            (sparse.weighted_updates, dense.weighted_updates)
            if algorithm == "pa"
            else (sparse.variance, dense.variance)
        )
        for tables, weights in trees:
            np.testing.assert_allclose(tables.emission[rows, columns], weights.emission, rtol=1e-10, atol=1e-12)
            off = np.ones((NUM_FEATURES, NUM_LABELS), bool)
            off[rows, columns] = False
            if algorithm == "pa":  # weights off the mask stay 0 (variances off it are never read)
                assert not np.any(np.asarray(tables.emission)[off])
            np.testing.assert_allclose(
                tables.transitions * masks.transitions, weights.transitions * masks.transitions, rtol=1e-10, atol=1e-12
            )
            np.testing.assert_allclose(tables.start, weights.start, rtol=1e-10, atol=1e-12)


def test_token_stack_refuses_lengths_that_do_not_cover_the_tokens():
    ids, values, labels, lengths = _corpus(0, True)
    with pytest.raises(ValueError, match="lengths must be > 0 and sum to"):
        training.token_stack(ids, values, labels, lengths[:-1])
    with pytest.raises(ValueError, match="feature_values must be"):
        training.token_stack(ids, values[:, :1], labels, lengths)
