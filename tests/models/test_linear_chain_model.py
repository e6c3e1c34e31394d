"""LinearChainModel: potentials against a dense one-hot oracle (test-only),
gradients against the closed form `X^T G` and finite differences (float64),
the emission mask, flat view and non-zero count, packed buckets, jit / vmap,
and argument errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import testing
from lossfns.features.design import bucket_design
from lossfns.features.index import pack, pad_batch
from lossfns.lattices import chain
from lossfns.lattices.chain import FactoredPotentials
from lossfns.losses.sequence import sequence_log_loss
from lossfns.models import LinearChainModel

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

K, K2, L, T, F = 7, 3, 3, 5, 4


def _random_model(seed, pair=True, mask=None, dtype=jnp.float64):
    rng = np.random.default_rng(seed)
    return LinearChainModel(
        jnp.asarray(rng.normal(size=(K, L)), dtype),
        jnp.asarray(rng.normal(size=(L, L)), dtype),
        jnp.asarray(rng.normal(size=(L,)), dtype),
        jnp.asarray(rng.normal(size=(K2 if pair else 0, L, L)), dtype),
        mask,
    )


def _random_ids(seed, shape, size, width):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, size, size=shape + (width,))
    ids[rng.random(ids.shape) < 0.3] = -1  # padding anywhere in a row
    return jnp.asarray(ids, jnp.int32)


def _counts(ids, size):
    """Dense `[..., T, size]` feature counts (the oracle's one-hot sums)."""
    ids = np.asarray(ids)
    out = np.zeros(ids.shape[:-1] + (size,))
    for index in np.ndindex(*ids.shape):
        if ids[index] >= 0:
            out[index[:-1] + (ids[index],)] += 1
    return out


def _oracle_edges(model, unigram_ids, pair_ids):
    unary = _counts(unigram_ids, K) @ np.asarray(model.emission)
    pair = np.einsum("...k,kij->...ij", _counts(pair_ids, K2), np.asarray(model.pair_emission))
    edges = np.asarray(model.transitions) + pair + unary[..., None, :]
    edges[..., 0, :, :] = np.asarray(model.start) + unary[..., 0, None, :]
    return edges


def test_factored_potentials_without_pair_features():
    model = _random_model(0, pair=False)
    ids = _random_ids(1, (2, T), K, F)
    potentials = model(ids)
    assert isinstance(potentials, FactoredPotentials)
    np.testing.assert_allclose(potentials.unary, _counts(ids, K) @ np.asarray(model.emission), atol=1e-12)
    assert potentials.transitions is model.transitions and potentials.start is model.start


def test_pair_features_give_position_dependent_edges():
    model = _random_model(2)
    unigram_ids, pair_ids = _random_ids(3, (2, T), K, F), _random_ids(4, (2, T), K2, 2)
    edges = model(unigram_ids, pair_ids)
    assert edges.shape == (2, T, L, L)
    np.testing.assert_allclose(edges, _oracle_edges(model, unigram_ids, pair_ids), atol=1e-12)
    # The chain oracle agrees on log Z computed from these potentials.
    np.testing.assert_allclose(chain.log_partition(edges), testing.log_partition(np.asarray(edges)), atol=1e-10)


def test_emission_gradient_is_the_feature_count_transpose():
    model = _random_model(5, pair=False)
    ids = _random_ids(6, (3, T), K, F)
    cotangent = jnp.asarray(np.random.default_rng(7).normal(size=(3, T, L)))
    grad = jax.grad(
        lambda emission: jnp.sum(eqx.tree_at(lambda m: m.emission, model, emission).unary(ids) * cotangent)
    )(model.emission)
    expected = np.einsum("btk,btl->kl", _counts(ids, K), np.asarray(cotangent))
    np.testing.assert_allclose(grad, expected, atol=1e-12)


@pytest.mark.slow
def test_log_loss_gradients_by_finite_differences():
    unigram_ids, pair_ids = _random_ids(8, (2, 3), K, F), _random_ids(9, (2, 3), K2, 2)
    labels = jnp.asarray(np.random.default_rng(10).integers(0, L, size=(2, 3)), jnp.int32)
    lengths = jnp.asarray([3, 2], jnp.int32)
    base = _random_model(11)

    @jax.jit
    def loss(emission, transitions, start, pair_emission):
        model = LinearChainModel(emission, transitions, start, pair_emission)
        return jnp.sum(sequence_log_loss(model(unigram_ids, pair_ids), labels, lengths))

    # Reverse mode only: the gather's custom VJP has no forward rule.
    testing.check_gradients(
        loss, (base.emission, base.transitions, base.start, base.pair_emission), order=1, modes=("rev",)
    )


def test_emission_mask_freezes_excluded_weights():
    mask = np.random.default_rng(12).random((K, L)) < 0.5
    model = _random_model(13, pair=False, mask=jnp.asarray(mask))
    ids = _random_ids(14, (2, T), K, F)
    unary = model(ids).unary
    np.testing.assert_allclose(unary, _counts(ids, K) @ np.where(mask, np.asarray(model.emission), 0.0), atol=1e-12)
    params, static = model.trainable()
    grads = jax.grad(lambda p: jnp.sum(eqx.combine(p, static)(ids).unary ** 2))(params)
    assert np.all(np.asarray(grads.emission)[~mask] == 0)
    assert np.any(np.asarray(grads.emission)[mask] != 0)
    assert grads.emission_mask is None  # the mask is not a trainable leaf


def test_flat_view_and_counts():
    model = LinearChainModel.zeros(K, L, K2, emission_mask=np.ones((K, L), bool), dtype=jnp.float64)
    vector, unflatten = model.flat()
    assert vector.shape == (K * L + L * L + L + K2 * L * L,)
    assert model.num_nonzero() == 0
    vector = vector.at[jnp.array([0, 5, K * L + 1])].set(jnp.array([1.0, -2.0, 3.0]))
    rebuilt = unflatten(vector)
    assert rebuilt.num_nonzero() == 3
    assert rebuilt.emission[0, 0] == 1.0 and rebuilt.emission[1, 2] == -2.0 and rebuilt.transitions[0, 1] == 3.0
    assert rebuilt.emission_mask is model.emission_mask
    masked = LinearChainModel.zeros(K, L, emission_mask=np.eye(K, L, dtype=bool))
    assert masked.num_parameters() == L + L * L + L


@pytest.mark.parametrize("form, pair_tests", [("dense", 2), ("sparse", 2), ("sparse", 1)])
def test_packed_potentials_equal_padded_batches(form, pair_tests):
    """Dense, one sparse support (two pair tests per position) and a support
    per position (one)."""
    model = _random_model(15)
    if form == "sparse":
        mask = np.zeros((K2, L, L), bool)
        mask[:, 0, 1] = mask[1, 2, 0] = True
        model = model.with_pair_mask(mask)
    rng = np.random.default_rng(16)
    lengths = [4, 1, 6, 2, 0, 3]
    encoded = [
        (
            [[int(x) for x in rng.integers(0, K, size=rng.integers(0, 3))] for _ in range(n)],
            [[int(x) for x in rng.integers(0, K2, size=rng.integers(0, pair_tests + 1))] for _ in range(n)],
        )
        for n in lengths
    ]
    packed = pack(encoded, num_buckets=2)
    design = jax.tree_util.tree_map(jnp.asarray, bucket_design(packed, K))
    assert packed.pair_ids.shape[-1] == pair_tests
    buckets = model.packed_potentials(
        design, jnp.asarray(packed.pair_ids), tuple(jnp.asarray(p) for p in packed.positions)
    )
    if form == "sparse":
        assert all(b.per_position == (pair_tests == 1) for b in buckets)
    for potentials, members in zip(buckets, packed.members):
        padded = pad_batch([encoded[i] for i in members], max_length=jax.tree_util.tree_leaves(potentials)[0].shape[1])
        # Padding reads no features in either layout, so even the positions
        # past each length agree.
        for got, want in zip(
            jax.tree_util.tree_leaves(potentials), jax.tree_util.tree_leaves(model(padded.unigram_ids, padded.pair_ids))
        ):
            np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.slow
def test_jit_vmap_and_loop_agree():
    model = _random_model(17, pair=False)
    unigram_ids, pair_ids = _random_ids(18, (2, 3), K, F), _random_ids(19, (2, 3), K2, 2)
    lengths = jnp.asarray([3, 1], jnp.int32)

    def log_z(m, u, p, n):
        return chain.log_partition(m(u, p), n)

    eager = log_z(model, unigram_ids, pair_ids, lengths)
    jitted = eqx.filter_jit(log_z)(model, unigram_ids, pair_ids, lengths)
    mapped = jax.vmap(log_z, in_axes=(None, 0, 0, 0))(model, unigram_ids, pair_ids, lengths)
    looped = jnp.stack([log_z(model, unigram_ids[b], pair_ids[b], lengths[b]) for b in range(2)])
    for other in (jitted, mapped, looped):
        np.testing.assert_allclose(other, eager, rtol=1e-12)


def test_float32_model_stays_float32():
    model = LinearChainModel.zeros(K, L)
    potentials = model(jnp.zeros((T, F), jnp.int32))
    assert potentials.unary.dtype == jnp.float32 and model.transitions.dtype == jnp.float32


def test_argument_errors():
    model = _random_model(20)
    with pytest.raises(TypeError, match=r"unigram_ids must be an integer array \[\.\.\., T, F\]"):
        model(jnp.zeros((T, F)), None)
    with pytest.raises(ValueError, match=r"unigram_ids must have shape \[\.\.\., T, F\] \(rank >= 2\)"):
        model(jnp.zeros((F,), jnp.int32))
    with pytest.raises(ValueError, match=r"unigram_ids must hold ids in \[-1, 7\)"):
        model(jnp.full((T, F), K, jnp.int32))
    with pytest.raises(ValueError, match=r"pair_ids .* is required"):
        model(jnp.zeros((T, F), jnp.int32))
    with pytest.raises(ValueError, match=r"pair_ids must have shape \[\.\.\., T, F2\] with \[\.\.\., T\] = \(5,\)"):
        model(jnp.zeros((T, F), jnp.int32), jnp.zeros((T + 1, 1), jnp.int32))
    with pytest.raises(ValueError, match=r"emission_mask must have shape \[K, L\]"):
        LinearChainModel.zeros(K, L, emission_mask=np.ones((L, K), bool))


@pytest.mark.parametrize("pair_tests", [2, 1])
def test_sparse_pair_weights_give_the_dense_models_loss_and_gradient(pair_tests):
    """A pair mask on few label pairs makes the model build `SparsePotentials`
    (one support for two pair tests per position, a support per position for
    one); its loss and gradient equal those of the same masked model on the
    dense per-position form (float32 to 1e-5, float64 to 1e-10), and the
    masked weights get zero gradient."""
    from lossfns.lattices.sparse_chain import SparsePotentials

    rng = np.random.default_rng(7)
    mask = np.zeros((K2, L, L), bool)
    mask[0, 0, 1] = mask[1, 2, 2] = mask[2, 0, 1] = mask[2, 1, 0] = True  # 3 of the 9 label pairs
    mask[1, 0, 0] = True  # a test with pair (0, 0), where padding listings point
    ids, pair_ids = _random_ids(8, (2, T), K, F), _random_ids(9, (2, T), K2, pair_tests)
    labels = jnp.asarray(rng.integers(0, L, size=(2, T)))
    lengths = jnp.array([T, 3])
    for dtype, tolerance in ((jnp.float32, 1e-5), (jnp.float64, 1e-10)):
        sparse_model = _random_model(10, dtype=dtype).with_pair_mask(mask)
        assert sparse_model.pair_support is not None
        np.testing.assert_array_equal(sparse_model.pair_slots, [[1, -1], [0, 8], [1, 3]])
        potentials = sparse_model(ids, pair_ids)
        assert isinstance(potentials, SparsePotentials) and potentials.per_position == (pair_tests == 1)
        dense_model = _random_model(10, dtype=dtype).with_pair_mask(mask, max_sparse_fraction=0.0)
        assert dense_model.pair_support is None and not isinstance(dense_model(ids, pair_ids), tuple)

        def loss_and_gradient(model):
            params, static = model.trainable()
            loss = lambda p: jnp.sum(sequence_log_loss(eqx.combine(p, static)(ids, pair_ids), labels, lengths))
            return jax.jit(jax.value_and_grad(loss))(params)

        (sparse_loss, sparse_grad), (dense_loss, dense_grad) = (
            loss_and_gradient(sparse_model),
            loss_and_gradient(dense_model),
        )
        np.testing.assert_allclose(sparse_loss, dense_loss, rtol=tolerance)
        for got, want in zip(jax.tree_util.tree_leaves(sparse_grad), jax.tree_util.tree_leaves(dense_grad)):
            np.testing.assert_allclose(got, want, atol=tolerance, rtol=tolerance)
        assert np.all(np.asarray(sparse_grad.pair_emission)[~mask] == 0)
        assert np.any(np.asarray(sparse_grad.pair_emission)[mask] != 0)
