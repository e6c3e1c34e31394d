"""Sparse forward-backward (Lavergne section 4.1) against the dense chain and
brute-force enumeration."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import testing
from lossfns.lattices import chain, prefix, sparse_chain
from lossfns.lattices.sparse_chain import SparsePotentials

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

_log_partition = jax.jit(chain.log_partition)
_marginals = jax.jit(chain.marginals)


def _random(seed, batch_shape, T, L, density, dtype=jnp.float64, scale=1.0, with_start=True):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    previous, following = sparse_chain.random_support(keys[0], L, density)
    K = previous.shape[0]
    unary = scale * jax.random.normal(keys[1], batch_shape + (T, L), dtype)
    pair_weights = scale * jax.random.normal(keys[2], batch_shape + (T, K), dtype)
    start = scale * jax.random.normal(keys[3], (L,), dtype) if with_start else None
    return SparsePotentials(unary, pair_weights, previous, following, start)


def _random_lengths(seed, batch_shape, T):
    return jax.random.randint(jax.random.PRNGKey(seed + 1000), batch_shape, 0, T + 1)


def _pair_marginals_from_dense(edge, potentials):
    """Gather dense edge marginals `[..., T, L, L]` at the sparse support; at
    t = 0 only pairs from the start state (label 0) exist."""
    gathered = edge[..., potentials.pair_previous, potentials.pair_next]
    if gathered.shape[-2] == 0:
        return gathered
    from_start = jnp.asarray(potentials.pair_previous) == 0
    return gathered.at[..., 0, :].multiply(from_start)


# T in {0, 1, 2, 5}, L in {1, .., 4}, empty / partial / full support, batch shapes (), (3,), (2, 3)
_CASES = [(0, 1, 0.0, ()), (1, 2, 1.0, (3,)), (2, 3, 0.0, (2, 3)), (5, 4, 0.3, (3,))]


@pytest.mark.parametrize("T, L, density, batch_shape", _CASES)
def test_log_partition_and_marginals_match_enumeration(T, L, density, batch_shape):
    for seed in range(2):  # same shapes: one compilation per case
        potentials = _random(seed, batch_shape, T, L, density)
        lengths = _random_lengths(seed, batch_shape, T)
        dense = np.asarray(sparse_chain.to_dense(potentials))
        np.testing.assert_allclose(
            _log_partition(potentials, lengths), testing.log_partition(dense, lengths), rtol=1e-10, atol=1e-10
        )
        edge = jnp.asarray(testing.marginals(dense, lengths))
        result = _marginals(potentials, lengths)
        np.testing.assert_allclose(result.unary, edge.sum(axis=-2), atol=1e-10)
        np.testing.assert_allclose(result.pair_weights, _pair_marginals_from_dense(edge, potentials), atol=1e-10)
        np.testing.assert_allclose(result.start, edge[..., 0, 0, :] if T else np.zeros(batch_shape + (L,)), atol=1e-10)


def test_to_dense_is_the_oracle_it_claims():
    """`to_dense` must put weights where the support says: checked entry by entry."""
    potentials = _random(1, (), 3, 4, 0.4)
    dense = np.asarray(sparse_chain.to_dense(potentials))
    for t in range(3):
        for i in range(4):
            for j in range(4):
                expected = potentials.unary[t, j] + (potentials.start[j] if (t == 0 and i == 0) else 0.0)
                for k in range(potentials.pair_previous.shape[0]):
                    if (potentials.pair_previous[k], potentials.pair_next[k]) == (i, j):
                        expected += potentials.pair_weights[t, k]
                np.testing.assert_allclose(dense[t, i, j], expected)


def test_matches_dense_chain_at_333_labels_in_float32():
    """The benchmark setting (333 labels, 90% zero pair weights): float32 sparse
    equals the float64 dense chain to 1e-5."""
    potentials = _random(2, (2,), 4, 333, 0.1, dtype=jnp.float32)
    lengths = jnp.array([4, 3])
    dense64 = sparse_chain.to_dense(
        jax.tree_util.tree_map(
            lambda x: x.astype(jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x, potentials
        )
    )
    log_z = _log_partition(potentials, lengths)
    assert log_z.dtype == jnp.float32
    np.testing.assert_allclose(log_z, chain.log_partition(dense64, lengths), rtol=1e-6)
    edge = chain.marginals(dense64, lengths)
    result = _marginals(potentials, lengths)
    np.testing.assert_allclose(result.unary, edge.sum(axis=-2), atol=1e-5)
    np.testing.assert_allclose(result.pair_weights, _pair_marginals_from_dense(edge, potentials), atol=1e-5)


def test_large_weights_do_not_overflow():
    """Scores far above exp's float32 range (88) are shifted, not overflowed."""
    potentials = _random(3, (2,), 5, 4, 0.5, dtype=jnp.float32, scale=3.0)
    potentials = potentials._replace(
        unary=potentials.unary + 200.0, pair_weights=potentials.pair_weights + 95.0, start=potentials.start + 150.0
    )
    lengths = jnp.array([5, 3])
    dense64 = sparse_chain.to_dense(potentials).astype(jnp.float64)
    np.testing.assert_allclose(_log_partition(potentials, lengths), chain.log_partition(dense64, lengths), rtol=1e-6)
    edge = chain.marginals(dense64, lengths)
    result = _marginals(potentials, lengths)
    np.testing.assert_allclose(result.unary, edge.sum(axis=-2), atol=1e-5)
    np.testing.assert_allclose(result.pair_weights, _pair_marginals_from_dense(edge, potentials), atol=1e-5)


def test_forbidden_pairs_and_labels_give_finite_values_and_gradients():
    potentials = _random(4, (3,), 5, 4, 0.5)
    pair_weights = potentials.pair_weights.at[:, :, ::2].set(-jnp.inf)
    unary = potentials.unary.at[:, 2, 1].set(-jnp.inf)
    potentials = potentials._replace(unary=unary, pair_weights=pair_weights)
    lengths = jnp.array([5, 1, 0])
    dense = np.asarray(sparse_chain.to_dense(potentials))
    np.testing.assert_allclose(_log_partition(potentials, lengths), testing.log_partition(dense, lengths), rtol=1e-10)
    result = _marginals(potentials, lengths)
    for leaf in (result.unary, result.pair_weights, result.start):
        assert np.isfinite(np.asarray(leaf)).all()
    edge = jnp.asarray(testing.marginals(dense, lengths))
    np.testing.assert_allclose(result.pair_weights, _pair_marginals_from_dense(edge, potentials), atol=1e-10)


def test_padding_with_nan_does_not_leak():
    potentials = _random(5, (2,), 4, 3, 0.5)
    lengths = jnp.array([2, 4])
    clean = _marginals(potentials, lengths)
    poisoned = potentials._replace(
        unary=potentials.unary.at[0, 2:].set(-jnp.inf), pair_weights=potentials.pair_weights.at[0, 3:].set(-jnp.inf)
    )
    dirty = _marginals(poisoned, lengths)
    np.testing.assert_allclose(dirty.unary, clean.unary, atol=1e-12)
    np.testing.assert_allclose(dirty.pair_weights, clean.pair_weights, atol=1e-12)


def test_gradients_to_second_order():
    potentials = _random(6, (), 4, 3, 0.5)
    lengths = jnp.array(3)

    @jax.jit
    def objective(unary, pair_weights, start):
        return chain.log_partition(potentials._replace(unary=unary, pair_weights=pair_weights, start=start), lengths)

    testing.check_gradients(
        objective, (potentials.unary, potentials.pair_weights, potentials.start), order=2, modes=("rev",)
    )


def test_jit_vmap_and_loop_agree():
    potentials = _random(7, (3,), 5, 3, 0.5)
    lengths = jnp.array([5, 2, 0])
    batched = chain.log_partition(potentials, lengths)
    looped = [
        chain.log_partition(
            potentials._replace(unary=potentials.unary[b], pair_weights=potentials.pair_weights[b]), lengths[b]
        )
        for b in range(3)
    ]
    unbatched = lambda u, w, n: chain.log_partition(potentials._replace(unary=u, pair_weights=w), n)
    mapped = jax.vmap(unbatched)(potentials.unary, potentials.pair_weights, lengths)
    np.testing.assert_allclose(batched, np.stack(looped), rtol=1e-12)
    np.testing.assert_allclose(batched, mapped, rtol=1e-12)
    np.testing.assert_allclose(batched, _log_partition(potentials, lengths), rtol=1e-12)


def test_no_pairs_is_the_independent_model():
    """K = 0: every transition scores 0, so log Z is a sum of per-position logsumexps."""
    potentials = _random(8, (2,), 4, 3, 0.0, with_start=False)
    lengths = jnp.array([4, 2])
    per_position = jax.scipy.special.logsumexp(potentials.unary, axis=-1)
    expected = jnp.sum(jnp.where(jnp.arange(4) < lengths[:, None], per_position, 0.0), axis=-1)
    np.testing.assert_allclose(_log_partition(potentials, lengths), expected, rtol=1e-12)


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("unary", jnp.zeros((3,)), ValueError, "unary must have shape"),
        ("pair_weights", jnp.zeros((2, 3, 2)), ValueError, "pair_weights must have shape"),
        ("pair_previous", jnp.array([0, 5]), ValueError, "pair_previous must lie in"),
        ("pair_next", jnp.array([0.0, 1.0]), TypeError, "pair_next must be an integer"),
        ("pair_next", jnp.array([0]), ValueError, r"pair_next must have shape \[2\]"),
        ("start", jnp.zeros((4,)), ValueError, "start must have shape"),
        ("unary", jnp.full((2, 4, 3), jnp.nan), ValueError, "unary contains NaN"),
    ],
)
def test_bad_input_names_the_argument(field, value, error, message):
    potentials = SparsePotentials(jnp.zeros((2, 4, 3)), jnp.zeros((2, 4, 2)), jnp.array([0, 1]), jnp.array([1, 2]))
    with pytest.raises(error, match=message):
        chain.log_partition(potentials._replace(**{field: value}))
    with pytest.raises(ValueError, match="lengths must lie in"):
        chain.log_partition(potentials, jnp.array([5, 1]))


@pytest.mark.parametrize("scale", [10.0, 200.0])
def test_wide_and_strongly_negative_scores_are_exact_in_float32(scale):
    """Scale-200 scores (steps far past float32's range) and -inf pair
    weights: the checked steps recover in log space, so float32 values and
    node marginals match the float64 reference scan."""
    rng = np.random.default_rng(int(scale))
    L = 6
    previous, following = sparse_chain.random_support(jax.random.PRNGKey(3), L, 0.3)
    pair_weights = rng.normal(size=(3, 20, previous.shape[0])) * scale
    pair_weights[:, 3, 0] = -np.inf
    potentials64 = SparsePotentials(
        jnp.asarray(rng.normal(size=(3, 20, L)) * scale),
        jnp.asarray(pair_weights),
        previous,
        following,
        jnp.asarray(rng.normal(size=L)),
    )
    lengths = jnp.array([20, 11, 1])
    dense64 = sparse_chain.to_dense(potentials64)
    want = testing.reference_row_log_partition(dense64, None, lengths)
    want_nodes = jax.grad(lambda d: jnp.sum(testing.reference_row_log_partition(d, None, lengths)))(dense64).sum(-2)
    potentials32 = potentials64._replace(
        unary=potentials64.unary.astype(jnp.float32),
        pair_weights=potentials64.pair_weights.astype(jnp.float32),
        start=potentials64.start.astype(jnp.float32),
    )
    np.testing.assert_allclose(np.asarray(_log_partition(potentials32, lengths), np.float64), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(_marginals(potentials32, lengths).unary, np.float64), want_nodes, atol=1e-5)


def test_transitions_rows_decoding_and_scores_match_the_dense_form():
    """With a shared transition matrix: log Z and marginals (against
    enumeration of `to_dense`), rows of back-to-back chains, Viterbi, k-best,
    entropy and scores all equal the dense form's, jitted, vmapped or not."""
    rng = np.random.default_rng(11)
    B, T, L = 3, 5, 4
    previous, following = sparse_chain.random_support(jax.random.PRNGKey(5), L, 0.4)
    transitions = rng.normal(size=(L, L))
    transitions[1, 2] = -np.inf
    potentials = SparsePotentials(
        jnp.asarray(rng.normal(size=(B, T, L))),
        jnp.asarray(rng.normal(size=(B, T, previous.shape[0]))),
        previous,
        following,
        jnp.asarray(rng.normal(size=L)),
        jnp.asarray(transitions),
    )
    lengths = jnp.array([5, 2, 0])
    dense = sparse_chain.to_dense(potentials)
    np.testing.assert_allclose(
        _log_partition(potentials, lengths), testing.log_partition(np.asarray(dense), lengths), rtol=1e-12
    )
    edge = chain.marginals(dense, lengths)
    got = _marginals(potentials, lengths)
    np.testing.assert_allclose(got.unary, edge.sum(-2), atol=1e-12)
    np.testing.assert_allclose(got.transitions, edge[:, 1:].sum(1), atol=1e-12)
    np.testing.assert_allclose(got.pair_weights, _pair_marginals_from_dense(edge, potentials), atol=1e-12)
    for fn in (chain.viterbi, lambda p, n: chain.kbest(p, n, 3), chain.entropy):
        for a, b in zip(
            jax.tree_util.tree_leaves(fn(potentials, lengths)), jax.tree_util.tree_leaves(fn(dense, lengths))
        ):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    labels = jnp.asarray(rng.integers(0, L, size=(B, T)))
    np.testing.assert_allclose(
        chain.score(potentials, labels, lengths), chain.score(dense, labels, lengths), rtol=1e-12
    )
    one_chain = lambda u, w, n: chain.log_partition(potentials._replace(unary=u, pair_weights=w), n)
    mapped = jax.vmap(jax.jit(one_chain))(potentials.unary[:, None], potentials.pair_weights[:, None], lengths[:, None])
    np.testing.assert_allclose(mapped[:, 0], _log_partition(potentials, lengths), rtol=1e-12)
    # Rows: a chain starts at position 3 of row 0, where only the first scores apply.
    starts = jnp.zeros((B, T), bool).at[0, 3].set(True)
    first = potentials.first_scores()  # [B, T, L]
    dense_rows = jnp.where(starts[..., None, None] & (jnp.arange(L) == 0)[:, None], first[:, :, None, :], dense)
    np.testing.assert_allclose(
        chain.row_log_partition(potentials, starts, lengths),
        chain.row_log_partition(dense_rows, starts, lengths),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        chain.row_score(potentials, labels, starts, lengths),
        chain.row_score(dense_rows, labels, starts, lengths),
        rtol=1e-12,
    )


def test_every_chain_loss_takes_the_sparse_form():
    """The losses of `lossfns.losses` give the dense form's values for sparse potentials."""
    from lossfns import losses

    rng = np.random.default_rng(12)
    previous, following = sparse_chain.random_support(jax.random.PRNGKey(6), 4, 0.3)
    potentials = SparsePotentials(
        jnp.asarray(rng.normal(size=(2, 5, 4))),
        jnp.asarray(rng.normal(size=(2, 5, previous.shape[0]))),
        previous,
        following,
        jnp.asarray(rng.normal(size=4)),
    )
    dense = sparse_chain.to_dense(potentials)
    labels, lengths = jnp.asarray(rng.integers(0, 4, size=(2, 5))), jnp.array([5, 3])
    for loss in (
        losses.sequence_log_loss,
        losses.sequence_exp_loss,
        losses.pointwise_log_loss,
        losses.pointwise_exp_loss,
        losses.perceptron_loss,
        losses.structured_hinge_loss,
        losses.expected_hamming_loss,
    ):
        np.testing.assert_allclose(
            loss(potentials, labels, lengths), loss(dense, labels, lengths), rtol=1e-10, err_msg=loss.__name__
        )


def _random_per_position(seed, batch_shape, T, L, K, dtype=jnp.float64, transitions=True):
    """A support per position: `K` distinct random label pairs at each
    position, plus one padding listing (a repeat of the first pair, weight 0)."""
    rng = np.random.default_rng(seed)
    flat = np.argsort(rng.random(batch_shape + (T, L * L)), axis=-1)[..., :K]
    flat = np.concatenate([flat, flat[..., :1]], axis=-1)
    weights = rng.normal(size=batch_shape + (T, K + 1))
    weights[..., K] = 0.0
    previous, following = np.divmod(flat, L)
    return SparsePotentials(
        jnp.asarray(rng.normal(size=batch_shape + (T, L)), dtype),
        jnp.asarray(weights, dtype),
        jnp.asarray(previous, jnp.int32),
        jnp.asarray(following, jnp.int32),
        jnp.asarray(rng.normal(size=L), dtype),
        jnp.asarray(rng.normal(size=(L, L)), dtype) if transitions else None,
    )


def _per_position_pair_marginals(edge, potentials):
    """Dense edge marginals `[..., T, L, L]` gathered at each position's own
    support `[..., T, K]`; at t = 0 only pairs from the start state (label 0)."""
    gathered = jnp.take_along_axis(
        edge.reshape(edge.shape[:-2] + (edge.shape[-1] ** 2,)),
        potentials.pair_previous * edge.shape[-1] + potentials.pair_next,
        -1,
    )
    if gathered.shape[-2] == 0:
        return gathered
    return gathered.at[..., 0, :].multiply(potentials.pair_previous[..., 0, :] == 0)


@pytest.mark.parametrize(
    "T, L, K, batch_shape, transitions",
    [(0, 2, 1, (2,), True), (1, 3, 2, (), False), (5, 4, 3, (3,), True), (4, 3, 4, (2, 2), False)],
)
def test_a_support_per_position_matches_enumeration(T, L, K, batch_shape, transitions):
    """log Z, marginals (pairs at each position's own support, padding
    listings included), Viterbi, scores and node marginals through the
    reversed chain equal the dense form's, jitted, vmapped and looped."""
    potentials = _random_per_position(T + L, batch_shape, T, L, K, transitions=transitions)
    assert potentials.per_position
    lengths = _random_lengths(T + L, batch_shape, T)
    dense = np.asarray(sparse_chain.to_dense(potentials))
    log_z = _log_partition(potentials, lengths)
    np.testing.assert_allclose(log_z, testing.log_partition(dense, lengths), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(chain.log_partition(potentials, lengths), log_z, rtol=1e-12, atol=1e-12)
    edge = jnp.asarray(testing.marginals(dense, lengths))
    result = _marginals(potentials, lengths)
    np.testing.assert_allclose(result.unary, edge.sum(axis=-2), atol=1e-10)
    listed_once = np.ones(potentials.pair_weights.shape, bool)
    listed_once[..., K] = False  # the padding listing's derivative is the pair's marginal too: not compared
    np.testing.assert_allclose(
        np.asarray(result.pair_weights)[listed_once],
        np.asarray(_per_position_pair_marginals(edge, potentials))[listed_once],
        atol=1e-10,
    )
    np.testing.assert_allclose(
        prefix.log_node_marginals(potentials, lengths),
        prefix.log_node_marginals(jnp.asarray(dense), lengths),
        atol=1e-10,
    )
    labels = jnp.asarray(np.random.default_rng(T).integers(0, L, size=batch_shape + (T,)))
    np.testing.assert_allclose(
        chain.score(potentials, labels, lengths), chain.score(dense, labels, lengths), rtol=1e-12
    )
    for a, b in zip(
        jax.tree_util.tree_leaves(chain.viterbi(potentials, lengths)),
        jax.tree_util.tree_leaves(chain.viterbi(jnp.asarray(dense), lengths)),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    if batch_shape:
        one = lambda u, w, p, f, n: chain.log_partition(
            potentials._replace(unary=u, pair_weights=w, pair_previous=p, pair_next=f), n
        )
        fields = (potentials.unary, potentials.pair_weights, potentials.pair_previous, potentials.pair_next, lengths)
        flat = [x.reshape((int(np.prod(batch_shape)),) + x.shape[len(batch_shape) :]) for x in fields]
        mapped = jax.vmap(jax.jit(one))(*flat)
        looped = [one(*(x[b] for x in flat)) for b in range(flat[0].shape[0])]
        np.testing.assert_allclose(mapped, log_z.reshape(-1), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.stack(looped), log_z.reshape(-1), rtol=1e-12, atol=1e-12)


def test_a_support_per_position_in_float32_with_wide_and_forbidden_weights():
    """Scale-50 weights and -inf pairs, float32, rows of back-to-back chains:
    equal to the float64 dense form (the checked steps recover)."""
    potentials64 = _random_per_position(21, (3,), 12, 6, 5)
    potentials64 = potentials64._replace(
        unary=50 * potentials64.unary, pair_weights=(50 * potentials64.pair_weights).at[:, 4, 1].set(-jnp.inf)
    )
    lengths = jnp.array([12, 7, 1])
    dense64 = sparse_chain.to_dense(potentials64)
    cast = lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x
    potentials32 = jax.tree_util.tree_map(cast, potentials64)
    np.testing.assert_allclose(
        np.asarray(_log_partition(potentials32, lengths), np.float64), chain.log_partition(dense64, lengths), rtol=1e-5
    )
    got = _marginals(potentials32, lengths)
    for leaf in jax.tree_util.tree_leaves(got):
        assert np.isfinite(np.asarray(leaf)).all()
    np.testing.assert_allclose(got.unary, chain.marginals(dense64, lengths).sum(-2), atol=1e-5)
    starts = jnp.zeros((3, 12), bool).at[0, 5].set(True)
    first = potentials64.first_scores()
    dense_rows = jnp.where(starts[..., None, None] & (jnp.arange(6) == 0)[:, None], first[:, :, None, :], dense64)
    np.testing.assert_allclose(
        np.asarray(chain.row_log_partition(potentials32, starts, lengths), np.float64),
        chain.row_log_partition(dense_rows, starts, lengths),
        rtol=1e-5,
    )


def test_a_support_per_position_to_second_order():
    potentials = _random_per_position(22, (), 4, 3, 2)

    @jax.jit
    def objective(unary, pair_weights, transitions):
        return chain.log_partition(potentials._replace(unary=unary, pair_weights=pair_weights, transitions=transitions))

    testing.check_gradients(
        objective, (potentials.unary, potentials.pair_weights, potentials.transitions), order=2, modes=("rev",)
    )


def test_a_pair_listed_twice_with_weights_is_refused():
    potentials = _random_per_position(23, (2,), 3, 3, 2)
    twice = potentials._replace(pair_weights=potentials.pair_weights.at[1, 2, 2].set(0.5))  # the padding listing
    with pytest.raises(ValueError, match=r"list the label pair \(\d, \d\) twice at one position"):
        chain.log_partition(twice)
    with pytest.raises(ValueError, match=r"pair_next must have shape \[3\] \(one support\) or \[2, 3, 3\]"):
        chain.log_partition(potentials._replace(pair_next=potentials.pair_next[0]))
