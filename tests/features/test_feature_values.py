"""Real-valued observation features end to end (`TokenFeatures.unigram_values`
-> `FeatureIndex.encode` -> `pad_batch` / `pack` / `pack_rows` ->
`bucket_design` -> `LinearChainModel`): emission scores against a hand
computation on both the gather path and the sparse-design path, gradients
against finite differences (float64), float32, jit, and values of 1 giving
exactly the binary path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import losses
from lossfns.features import FeatureIndex, TokenFeatures, pack, pack_rows, pad_batch
from lossfns.features.design import bucket_design, bucket_slices, design_from_ids, design_matmul
from lossfns.models import LinearChainModel
from lossfns.testing import check_gradients

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

L = 3
SENTENCES = [
    TokenFeatures([["a", "b"], ["a", "a", "c"], ["zz"]], [[], [], []], [[2.0, -0.5], [1.0, 0.25, 3.0], [9.0]]),
    TokenFeatures([["c"], []], [[], []], [[-1.5], []]),
]
LABELS = [[0, 2, 1], [1, 0]]
INDEX = FeatureIndex({"a": 0, "b": 1, "c": 2}, {}, 3, 0)
TABLE = np.random.default_rng(0).standard_normal((3, L))


def _by_hand(features):
    """`[T, L]`: sum over a token's known strings of value * TABLE[string]."""
    return np.array(
        [
            sum(
                (value * TABLE[INDEX.unigram[name]] for name, value in zip(names, values) if name in INDEX.unigram),
                np.zeros(L),
            )
            for names, values in zip(features.unigram, features.unigram_values)
        ]
    )


_UNARY = jax.jit(lambda model, ids, values: model.unary(ids, values))


def _model(table=TABLE):
    return LinearChainModel(jnp.asarray(table), jnp.zeros((L, L)), jnp.zeros(L), jnp.zeros((0, L, L)))


def test_encode_keeps_values_beside_ids():
    assert INDEX.encode(SENTENCES[0]) == ([[0, 1], [0, 0, 2], []], [[], [], []], [[2.0, -0.5], [1.0, 0.25, 3.0], []])
    assert INDEX.encode(SENTENCES[0]._replace(unigram_values=None)) == ([[0, 1], [0, 0, 2], []], [[], [], []])


@pytest.mark.parametrize("jit", [False, True])
def test_emission_scores_by_hand_on_the_gather_path(jit):
    batch = pad_batch([INDEX.encode(s) for s in SENTENCES], LABELS)
    unary = (_UNARY if jit else LinearChainModel.unary)(_model(), batch.unigram_ids, batch.unigram_values)
    for b, sentence in enumerate(SENTENCES):
        np.testing.assert_allclose(unary[b, : len(sentence.unigram)], _by_hand(sentence), atol=1e-12)
    np.testing.assert_allclose(_model().potentials(batch).unary, unary, atol=1e-12)


@pytest.mark.parametrize("packer", ["buckets", "rows"])
def test_emission_scores_by_hand_on_the_design_path(packer):
    encoded = [INDEX.encode(s) for s in SENTENCES]
    packed = pack(encoded, LABELS, num_buckets=2) if packer == "buckets" else pack_rows(encoded, LABELS)
    design = bucket_design(packed, INDEX.num_unigram)
    scores = bucket_slices(design_matmul(design, jnp.asarray(TABLE)), [p.shape for p in packed.positions])
    tokens = np.concatenate([_by_hand(s) for s in SENTENCES])
    for bucket, positions in zip(scores, packed.positions):
        expected = np.where(positions[..., None] >= 0, tokens[np.maximum(positions, 0)], 0.0)
        np.testing.assert_allclose(bucket, expected, atol=1e-12)


def _packed_loss(table, design, packed):
    model = _model(table)
    buckets = model.packed_potentials(design, packed.pair_ids, packed.positions, packed.starts)
    if packed.starts is not None:
        return sum(
            jnp.sum(losses.row_sequence_log_loss(p, y, s, n))
            for p, y, s, n in zip(buckets, packed.labels, packed.starts, packed.lengths)
        )
    return sum(jnp.sum(losses.sequence_log_loss(p, y, n)) for p, y, n in zip(buckets, packed.labels, packed.lengths))


@pytest.mark.parametrize("packer", ["buckets", "rows"])
def test_gradients_match_finite_differences_and_the_gather_path(packer):
    encoded = [INDEX.encode(s) for s in SENTENCES]
    packed = pack(encoded, LABELS, num_buckets=2) if packer == "buckets" else pack_rows(encoded, LABELS)
    design = bucket_design(packed, INDEX.num_unigram)
    check_gradients(lambda table: _packed_loss(table, design, packed), (TABLE,), order=1, modes=("rev",))
    batch = pad_batch(encoded, LABELS)

    def gathered(table):
        return jnp.sum(losses.sequence_log_loss(_model(table).potentials(batch), batch.labels, batch.lengths))

    check_gradients(gathered, (TABLE,), order=1, modes=("rev",))
    np.testing.assert_allclose(
        jax.grad(lambda t: _packed_loss(t, design, packed))(TABLE), jax.grad(gathered)(TABLE), atol=1e-10
    )


def test_values_of_one_are_the_binary_path_and_float32_stays_float32():
    ones = [s._replace(unigram_values=[[1.0] * len(names) for names in s.unigram]) for s in SENTENCES]
    binary = [s._replace(unigram_values=None) for s in SENTENCES]
    valued = pack([INDEX.encode(s) for s in ones], LABELS, num_buckets=1)
    plain = pack([INDEX.encode(s) for s in binary], LABELS, num_buckets=1)
    assert plain.unigram_values is None and valued.unigram_values is not None
    np.testing.assert_array_equal(valued.unigram_ids, plain.unigram_ids)
    table32 = jnp.asarray(TABLE, jnp.float32)
    first = design_matmul(bucket_design(valued, 3), table32)
    np.testing.assert_array_equal(first, design_matmul(bucket_design(plain, 3), table32))
    assert first.dtype == jnp.float32
    values32 = jnp.asarray(pad_batch([INDEX.encode(SENTENCES[0])]).unigram_values, jnp.float32)
    assert _model(table32).unary(pad_batch([INDEX.encode(SENTENCES[0])]).unigram_ids, values32).dtype == jnp.float32


def test_zero_values_are_left_out_of_the_design():
    """A value 0 (a False flag) adds nothing: the design is the binary one of
    the other entries (so they keep the binary path), the product the same."""
    ids = np.array([[0, 1, 2], [2, 0, -1]])
    flagged = design_from_ids(ids, 3, np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 5.0]]))
    binary = design_from_ids(np.array([[0, -1, 2], [-1, 0, -1]]), 3)
    assert flagged.row_values is None
    for got, expected in zip(flagged, binary):
        np.testing.assert_array_equal(got, expected)
    valued = design_from_ids(ids, 3, np.array([[2.0, 0.0, 1.0], [0.0, 1.0, 5.0]]))
    np.testing.assert_array_equal(valued.row_ids, binary.row_ids)
    np.testing.assert_allclose(design_matmul(valued, TABLE), [2 * TABLE[0] + TABLE[2], TABLE[0]])


def test_design_values_checked():
    with pytest.raises(ValueError, match=r"values must have the shape of ids \(1, 2\), got \(1, 3\)"):
        design_from_ids(np.array([[0, 1]]), 3, np.ones((1, 3)))
    with pytest.raises(ValueError, match=r"values must be finite, got inf at \(0, 1\)"):
        design_from_ids(np.array([[0, 1]]), 3, np.array([[1.0, np.inf]]))
    design_from_ids(np.array([[0, -1]]), 3, np.array([[1.0, np.nan]]))  # padding may hold anything
    with pytest.raises(ValueError, match=r"unigram_values must be a float array of the shape of unigram_ids"):
        _model().unary(np.zeros((1, 2, 2), np.int32), np.ones((1, 2, 3)))
    with pytest.raises(ValueError, match="encoded sentences must all carry values or none"):
        pack([INDEX.encode(SENTENCES[0]), INDEX.encode(SENTENCES[1]._replace(unigram_values=None))])
