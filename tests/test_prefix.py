"""`lattices.prefix.forward_scores` against `chain.log_partition` of every
prefix of every chain (factored, per-position and sparse potentials, rows of
back-to-back chains, float32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns.lattices import chain, prefix
from lossfns.lattices.chain import FactoredPotentials

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
    reference = prefix.forward_scores(chain.sparse_chain.to_dense(sparse), jnp.asarray(lengths))
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
