"""`lattices.prefix.forward_scores` against `chain.log_partition` of every
prefix of every chain (factored, per-position and sparse potentials, rows of
back-to-back chains, float32), and `log_node_marginals` against `log` of
`chain.node_marginals` (the closed-form derivatives of log Z), both
algorithms, with forbidden transitions and lengths 0 and 1, where float32
underflows the marginals, and on a long float32 chain against float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns.lattices import chain, prefix, sparse_chain
from lossfns.lattices.chain import FactoredPotentials

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

B, T, L = 3, 7, 3


def _rows():
    rng = np.random.default_rng(0)
    unary = rng.normal(size=(B, T, L)) * 3
    transitions = rng.normal(size=(L, L))
    transitions[0, 1] = -np.inf  # a forbidden transition
    start = rng.normal(size=L)
    dense = rng.normal(size=(B, T, L, L)) * 3
    starts = rng.random((B, T)) < 0.3
    starts[:, 0] = True
    lengths = np.array([T, 5, 1])
    return unary, transitions, start, dense, starts, lengths


def _prefix_reference(potentials_of, starts, lengths):
    """`[B, T]` log Z of the prefix ending at each position of its own chain."""
    out = np.full((B, T), np.nan)
    for b in range(B):
        for t in range(lengths[b]):
            s = max(i for i in range(t + 1) if starts[b, i])
            out[b, t] = float(chain.log_partition(potentials_of(b, s, t + 1)))
    return out


def _totals(scores: prefix.ForwardScores):
    return np.asarray(jax.nn.logsumexp(scores.scores, axis=-1) + scores.log_scale)


@pytest.mark.parametrize("with_starts", [False, True])
@pytest.mark.parametrize("form", ["factored", "dense"])
def test_forward_scores_are_the_log_partitions_of_every_prefix(form, with_starts):
    unary, transitions, start, dense, starts, lengths = _rows()
    starts = starts if with_starts else (np.arange(T) == 0)[None].repeat(B, 0)
    if form == "factored":
        potentials = FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions), jnp.asarray(start))
        piece = lambda b, s, e: FactoredPotentials(
            jnp.asarray(unary[b, s:e]), jnp.asarray(transitions), jnp.asarray(start)
        )
    else:
        potentials = jnp.asarray(dense)
        piece = lambda b, s, e: jnp.asarray(dense[b, s:e])
    scores = prefix.forward_scores(potentials, jnp.asarray(lengths), jnp.asarray(starts) if with_starts else None)
    inside = np.arange(T)[None] < lengths[:, None]
    assert np.all(np.asarray(scores.scores).max(-1)[inside] == 0)  # max-normalised
    np.testing.assert_allclose(_totals(scores)[inside], _prefix_reference(piece, starts, lengths)[inside], rtol=1e-12)


def test_sparse_potentials_score_as_their_dense_form():
    unary, _transitions, start, _, _, lengths = _rows()
    rng = np.random.default_rng(1)
    previous, following = np.array([0, 1, 2]), np.array([1, 2, 0])
    sparse = chain.SparsePotentials(
        jnp.asarray(unary),
        jnp.asarray(rng.normal(size=(B, T, 3))),
        jnp.asarray(previous),
        jnp.asarray(following),
        jnp.asarray(start),
    )
    ours = prefix.forward_scores(sparse, jnp.asarray(lengths))
    reference = prefix.forward_scores(sparse_chain.to_dense(sparse), jnp.asarray(lengths))
    inside = np.arange(T)[None] < lengths[:, None]
    np.testing.assert_allclose(_totals(ours)[inside], _totals(reference)[inside], rtol=1e-12)


def test_float32_long_chain_keeps_its_precision():
    rng = np.random.default_rng(2)
    unary = jnp.asarray(rng.normal(size=(1, 2000, L)) * 30, jnp.float32)
    transitions = jnp.asarray(rng.normal(size=(L, L)), jnp.float32)
    potentials = FactoredPotentials(unary, transitions, jnp.zeros(L, jnp.float32))
    scores = prefix.forward_scores(potentials)
    assert scores.scores.dtype == jnp.float32
    total = _totals(scores)[0, -1]
    exact = float(
        chain.log_partition(
            FactoredPotentials(unary.astype(jnp.float64), transitions.astype(jnp.float64), jnp.zeros(L))
        )[0]
    )
    assert np.all(np.isfinite(np.asarray(scores.scores)))
    assert abs(total - exact) <= 1e-6 * abs(exact)


def _marginal_cases():
    """`{form: potentials}` over `[B, T, L]` with lengths `[T, 0, 1]`, -inf
    transitions included (a label unreachable at some positions)."""
    unary, transitions, start, dense, _, _ = _rows()
    rng = np.random.default_rng(3)
    dense = dense.copy()
    dense[:, 2:, :, 2] = -np.inf  # label 2 unreachable after position 1
    return {
        "dense": jnp.asarray(dense),
        "factored": FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions), jnp.asarray(start)),
        "sparse": chain.SparsePotentials(
            jnp.asarray(unary),
            jnp.asarray(rng.normal(size=(B, T, 3)) * 2),
            jnp.asarray(np.array([0, 1, 2])),
            jnp.asarray(np.array([1, 2, 0])),
            jnp.asarray(start),
            jnp.asarray(rng.normal(size=(L, L))),
        ),
    }


MARGINAL_LENGTHS = jnp.asarray([T, 0, 1])
_log_node_marginals = jax.jit(prefix.log_node_marginals, static_argnames="algorithm")


@pytest.mark.parametrize("algorithm", ["sequential", "parallel"])
@pytest.mark.parametrize("form", ["dense", "factored", "sparse"])
def test_log_node_marginals_are_the_log_of_the_node_marginals(form, algorithm):
    potentials = _marginal_cases()[form]
    with np.errstate(divide="ignore"):
        expected = np.log(np.asarray(chain.node_marginals(potentials, MARGINAL_LENGTHS)))
    ours = np.asarray(_log_node_marginals(potentials, MARGINAL_LENGTHS, algorithm=algorithm))
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(expected))  # past the lengths, unreachable labels
    finite = np.isfinite(expected)
    np.testing.assert_allclose(ours[finite], expected[finite], rtol=1e-11, atol=1e-12)
    # One unbatched chain, not jitted, equals its row of the batch.
    first = jax.tree_util.tree_map(lambda x: x[0] if x.ndim > 2 else x, potentials)
    unbatched = np.asarray(prefix.log_node_marginals(first, algorithm=algorithm))
    np.testing.assert_allclose(unbatched[finite[0]], ours[0][finite[0]], rtol=1e-11, atol=1e-12)


def test_log_node_marginals_gradients_are_finite_and_match_finite_differences():
    from lossfns import testing

    potentials = _marginal_cases()["dense"]
    inside = np.isfinite(np.asarray(prefix.log_node_marginals(potentials, MARGINAL_LENGTHS)))
    weights = jnp.asarray(np.random.default_rng(4).normal(size=inside.shape))

    def total(scores):
        values = prefix.log_node_marginals(scores, MARGINAL_LENGTHS)
        return jnp.sum(jnp.where(inside, weights * values, 0.0))

    grad = jax.grad(total)(potentials)
    assert np.all(np.isfinite(np.asarray(grad)))
    finite_rows = jnp.where(jnp.isfinite(potentials), potentials, -1e3)  # -inf is not differenced
    testing.check_gradients(total, (finite_rows,), order=1)


def test_float32_log_node_marginals_stay_finite_where_the_marginals_underflow():
    rng = np.random.default_rng(5)
    unary = rng.normal(size=(2, 30, L)) * 80  # margins of hundreds: marginals far below 1e-38
    transitions = rng.normal(size=(L, L))
    exact = np.asarray(prefix.log_node_marginals(FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions))))
    single = FactoredPotentials(jnp.asarray(unary, jnp.float32), jnp.asarray(transitions, jnp.float32))
    with np.errstate(divide="ignore"):
        underflowed = np.log(np.asarray(chain.node_marginals(single)))
    assert np.isneginf(underflowed).any() and np.isfinite(exact).all()
    ours = np.asarray(prefix.log_node_marginals(single))
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, exact, rtol=1e-5, atol=1e-3)


def test_float32_log_node_marginals_of_a_long_chain_match_float64():
    rng = np.random.default_rng(6)
    unary = rng.normal(size=(1, 10_000, L)) * 5
    transitions = rng.normal(size=(L, L))
    exact = np.asarray(prefix.log_node_marginals(FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions))))
    ours = prefix.log_node_marginals(
        FactoredPotentials(jnp.asarray(unary, jnp.float32), jnp.asarray(transitions, jnp.float32))
    )
    # No log alpha + log beta - log Z difference of large numbers is formed:
    # the error stays at the float32 rounding of the per-position scores.
    np.testing.assert_allclose(np.exp(np.asarray(ours)), np.exp(exact), atol=1e-5)
    big = exact > -20
    np.testing.assert_allclose(np.asarray(ours)[big], exact[big], atol=2e-4)
