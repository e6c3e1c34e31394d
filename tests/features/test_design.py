"""Sparse design matrices (`lossfns.features.design`): the CSR product and
its gradient against gathers and scatter-adds written out here, finite
differences, duplicate ids, empty rows, and the bucket layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from lossfns.features.design import bucket_design, bucket_slices, design_from_ids, design_matmul
from lossfns.features.index import pack

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

K = 7


def _oracle(ids, table):
    """`sum_f table[ids[:, f]]` by explicit loops (ids < 0 read nothing)."""
    out = np.zeros((ids.shape[0],) + table.shape[1:])
    for row in range(ids.shape[0]):
        for feature in ids[row]:
            if feature >= 0:
                out[row] += table[feature]
    return out


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(0)
    ids = rng.integers(-1, K, size=(6, 4))
    ids[0] = [3, 3, -1, 3]  # a feature active three times in one row counts three times
    ids[4] = -1  # an empty row
    return ids, jax.tree_util.tree_map(jnp.asarray, design_from_ids(ids, K))


@pytest.mark.parametrize("trailing", [(3,), (2, 2)])
def test_product_and_gradient_match_gather_and_scatter(case, trailing):
    ids, design = case
    table = np.random.default_rng(1).standard_normal((K,) + trailing)
    np.testing.assert_allclose(design_matmul(design, jnp.asarray(table)), _oracle(ids, table), atol=1e-12)
    cotangent = np.random.default_rng(2).standard_normal((ids.shape[0],) + trailing)
    expected = np.zeros_like(table)
    for row in range(ids.shape[0]):
        for feature in ids[row]:
            if feature >= 0:
                expected[feature] += cotangent[row]
    gradient = jax.jit(jax.grad(lambda w: jnp.sum(design_matmul(design, w) * cotangent)))(jnp.asarray(table))
    np.testing.assert_allclose(gradient, expected, atol=1e-12)


def test_finite_differences_second_order(case):
    _, design = case
    table = jnp.asarray(np.random.default_rng(3).standard_normal((K, 3)))
    check_grads(lambda w: jnp.sum(jnp.sin(design_matmul(design, w))), (table,), order=2, modes=["rev"])


def test_float32_keeps_dtype(case):
    _, design = case
    assert design_matmul(design, jnp.ones((K, 2), jnp.float32)).dtype == jnp.float32


def test_no_active_features_gives_zeros():
    design = jax.tree_util.tree_map(jnp.asarray, design_from_ids(np.full((3, 2), -1), K))
    out, gradient = jax.value_and_grad(lambda w: jnp.sum(design_matmul(design, w)))(jnp.ones((K, 2)))
    assert float(out) == 0.0 and not np.any(np.asarray(gradient))


@pytest.mark.parametrize(
    "ids, message",
    [
        (np.array([[0, K]]), r"ids must lie in \[-1, 7\)"),
        (np.array([[0, -2]]), r"ids must lie in \[-1, 7\)"),
        (np.array([0, 1]), r"ids must be an integer array \[R, F\]"),
        (np.array([[0.5]]), r"ids must be an integer array \[R, F\]"),
    ],
)
def test_bad_ids(ids, message):
    with pytest.raises(ValueError, match=message):
        design_from_ids(ids, K)


def test_bucket_layout_matches_positions():
    rng = np.random.default_rng(4)
    lengths = [4, 1, 6, 2, 0, 3, 9]
    encoded = [
        ([[int(x) for x in rng.integers(0, K, size=rng.integers(0, 3))] for _ in range(n)], [[] for _ in range(n)])
        for n in lengths
    ]
    packed = pack(encoded, num_buckets=3)
    table = rng.standard_normal((K, 2))
    design = jax.tree_util.tree_map(jnp.asarray, bucket_design(packed, K))
    buckets = bucket_slices(design_matmul(design, jnp.asarray(table)), [p.shape for p in packed.positions])
    for bucket, positions in zip(buckets, packed.positions):
        tokens = _oracle(packed.unigram_ids, table)
        expected = np.where(positions[..., None] >= 0, tokens[np.maximum(positions, 0)], 0.0)
        np.testing.assert_allclose(bucket, expected, atol=1e-12)
