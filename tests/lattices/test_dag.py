"""Acyclic-lattice forward algorithms against brute-force path enumeration.

The oracle enumerates paths from the raw arc triples with its own recursion
(independent of `dag.enumerate_paths`, which is checked against it), scores
each path in numpy and reduces with each semiring's definition.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.test_util import check_grads

from lossfns import semirings
from lossfns.lattices import chain, dag

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

PAD = dict(num_states=7, num_arcs=12, num_levels=6, width=6, in_degree=12)
SEMIRINGS = [semirings.Log, semirings.Real, semirings.Max, semirings.Entropy, semirings.Counting, semirings.KMax(3)]


def random_lattice(rng):
    """Random arcs `(src, dst, symbol)` with src < dst, finals, and scores
    (some -inf); duplicate parallel arcs allowed."""
    num_states = int(rng.integers(1, PAD["num_states"] + 1))
    pairs = [(i, j) for i in range(num_states) for j in range(i + 1, num_states)]
    count = int(rng.integers(0, min(len(pairs) + 3, PAD["num_arcs"]) + 1)) if pairs else 0
    arcs = [pairs[k] + (int(rng.integers(0, 3)),) for k in rng.integers(0, len(pairs), count)] if pairs else []
    final = sorted(set(rng.integers(0, num_states, int(rng.integers(0, 3))).tolist()) | {num_states - 1})
    scores = rng.normal(size=len(arcs))
    scores[rng.random(len(arcs)) < 0.15] = -np.inf
    return arcs, final, num_states, scores


def oracle_paths(arcs, final, start=0):
    """All accepting paths as tuples of arc indices (independent recursion)."""
    out = [()] if start in final else []
    for index, (src, dst, _) in enumerate(arcs):
        if src == start:
            out += [(index,) + rest for rest in oracle_paths(arcs, final, dst)]
    return out


def oracle(semiring, path_scores):
    """The semiring's output over a finite list of path scores (numpy float64)."""
    s = np.asarray(path_scores, float)
    finite = s[np.isfinite(s)]
    log_z = np.logaddexp.reduce(finite) if finite.size else -np.inf
    if semiring.name in ("log", "real"):
        return log_z
    if semiring.name == "max":
        return s.max() if s.size else -np.inf
    if semiring.name == "entropy":
        p = np.exp(finite - log_z) if finite.size else finite
        return float(-np.sum(p * np.log(p)))
    if semiring.name == "counting":
        return float(finite.size)
    return np.concatenate([np.sort(s)[::-1], np.full(semiring.k, -np.inf)])[: semiring.k]


def no_path_cases():
    """All arcs forbidden; a final state that no arc reaches."""
    return [
        ([(0, 1, 0), (0, 1, 1), (1, 2, 0), (0, 2, 2)], [2], 3, np.full(4, -np.inf)),
        ([(0, 1, 0), (1, 2, 0)], [3], 4, np.array([0.5, 1.0])),
    ]


@pytest.fixture(scope="module")
def random_batch():
    rng = np.random.default_rng(0)
    cases = [random_lattice(rng) for _ in range(40)] + no_path_cases()
    lattices = [dag.pad(dag.from_arcs(a, f, n), **PAD) for a, f, n, _ in cases]
    scores = np.stack([np.concatenate([s, np.zeros(PAD["num_arcs"] - len(s))]) for *_, s in cases])
    return cases, dag.stack(lattices), jnp.asarray(scores)


@functools.cache
def jitted_forward(semiring):
    return jax.jit(functools.partial(dag.forward, semiring))


@pytest.mark.parametrize("semiring", SEMIRINGS, ids=lambda s: s.name)
def test_forward_matches_enumeration(semiring, random_batch):
    cases, lattices, scores = random_batch
    got = np.asarray(jitted_forward(semiring)(lattices, scores))
    for (arcs, final, _, arc_scores), value in zip(cases, got):
        path_scores = [sum(arc_scores[list(p)]) for p in oracle_paths(arcs, final)]
        np.testing.assert_allclose(value, oracle(semiring, path_scores), rtol=1e-9, atol=1e-9)
    assert not np.isnan(got).any()


def test_enumerate_paths_matches_oracle(random_batch):
    for arcs, final, num_states, _ in random_batch[0]:
        assert dag.enumerate_paths(dag.from_arcs(arcs, final, num_states)) == sorted(oracle_paths(arcs, final))


def test_jit_vmap_loop_agree(random_batch):
    _cases, lattices, scores = random_batch
    batched = dag.log_partition(lattices, scores)
    mapped = jax.jit(jax.vmap(dag.log_partition))(lattices, scores)
    looped = [dag.log_partition(jax.tree_util.tree_map(lambda x: x[i], lattices), scores[i]) for i in range(8)]
    np.testing.assert_allclose(batched, mapped, rtol=1e-12)
    np.testing.assert_allclose(batched[:8], looped, rtol=1e-12)


def test_arc_marginals_are_path_posteriors(random_batch):
    cases, lattices, scores = random_batch
    got = np.asarray(jax.jit(dag.arc_marginals)(lattices, scores))
    assert np.isfinite(got).all()
    for (arcs, final, _, arc_scores), marginal in zip(cases, got):
        paths = oracle_paths(arcs, final)
        path_scores = np.array([sum(arc_scores[list(p)]) for p in paths])
        expected = np.zeros(PAD["num_arcs"])
        if np.isfinite(path_scores).any():
            weights = np.exp(path_scores - np.logaddexp.reduce(path_scores))
            for path, weight in zip(paths, weights):
                for arc in path:
                    expected[arc] += weight
        np.testing.assert_allclose(marginal, expected, atol=1e-10)


def test_viterbi_matches_enumeration(random_batch):
    cases, lattices, scores = random_batch
    best, best_arcs, best_symbols = jax.jit(dag.viterbi)(lattices, scores)
    np.testing.assert_allclose(best, jitted_forward(semirings.Max)(lattices, scores))
    for (arcs, final, _, arc_scores), score, path, symbols in zip(cases, best, best_arcs, best_symbols):
        paths = oracle_paths(arcs, final)
        path_scores = [sum(arc_scores[list(p)]) for p in paths]
        if not paths or max(path_scores) == -np.inf:
            assert score == -np.inf and (np.asarray(path) == -1).all()
            continue
        chosen = tuple(int(a) for a in path if a >= 0)
        assert chosen in paths
        np.testing.assert_allclose(sum(arc_scores[list(chosen)]), max(path_scores), rtol=1e-12)
        assert [int(s) for s in symbols if s >= 0] == [arcs[a][2] for a in chosen]


def _diamond():
    """Two-level lattice with parallel arcs and a skip arc (paths of different lengths)."""
    return dag.from_arcs([(0, 1, 0), (0, 1, 1), (1, 2, 0), (0, 2, 2), (2, 3, 1), (1, 3, 2)], final=[3])


def test_log_partition_gradients():
    lattice = _diamond()
    scores = jnp.asarray(np.random.default_rng(1).normal(size=6))
    for semiring in (semirings.Log, semirings.Real):
        check_grads(
            lambda s: dag.log_partition(lattice, s, semiring=semiring), (scores,), order=1, modes=("rev",), eps=1e-5
        )


def test_entropy_gradients():
    lattice = _diamond()
    scores = jnp.asarray(np.random.default_rng(2).normal(size=6))
    check_grads(lambda s: dag.forward(semirings.Entropy, lattice, s), (scores,), order=1, modes=("rev",), eps=1e-5)


def chain_lattice(T, L):
    """The lattice of a chain: state 1 + t L + j is label j at position t."""
    arcs = [(0, 1 + j, j) for j in range(L)]
    arcs += [(1 + (t - 1) * L + i, 1 + t * L + j, j) for t in range(1, T) for i in range(L) for j in range(L)]
    return dag.from_arcs(arcs, final=[1 + (T - 1) * L + j for j in range(L)], num_states=1 + T * L)


def chain_arc_scores(potentials):
    return jnp.concatenate([potentials[0, 0], potentials[1:].reshape(-1)])


@pytest.mark.parametrize("semiring", SEMIRINGS, ids=lambda s: s.name)
def test_chain_shaped_lattice_equals_chain(semiring):
    T, L = 5, 3
    potentials = jnp.asarray(np.random.default_rng(3).normal(size=(T, L, L)) * 2)
    potentials = potentials.at[2, 1, 0].set(-jnp.inf)
    expected = jax.jit(functools.partial(chain.forward, semiring))(potentials)
    got = dag.forward(semiring, chain_lattice(T, L), chain_arc_scores(potentials))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_chain_marginals_equal_chain_marginals():
    T, L = 5, 3
    potentials = jnp.asarray(np.random.default_rng(4).normal(size=(T, L, L)))
    expected = jax.jit(chain.marginals)(potentials)
    got = jax.jit(dag.arc_marginals)(chain_lattice(T, L), chain_arc_scores(potentials))
    np.testing.assert_allclose(got, chain_arc_scores(expected), atol=1e-10)


@pytest.mark.slow
def test_float32_long_chain_matches_float64():
    rng = np.random.default_rng(5)
    T, L = 300, 2
    potentials = rng.normal(size=(T, L, L)) * 3
    alpha = potentials[0, 0]
    for t in range(1, T):  # float64 numpy forward as the reference
        alpha = np.logaddexp.reduce(alpha[:, None] + potentials[t], axis=0)
    reference = np.logaddexp.reduce(alpha)
    lattice = chain_lattice(T, L)
    scores64 = chain_arc_scores(jnp.asarray(potentials))
    for semiring in (semirings.Log, semirings.Real):
        value = dag.log_partition(lattice, scores64.astype(jnp.float32), semiring=semiring)
        assert value.dtype == jnp.float32
        np.testing.assert_allclose(value, reference, rtol=1e-6)


def test_large_scores_do_not_overflow_real():
    lattice = _diamond()
    scores = jnp.asarray([500.0, 400.0, 300.0, 900.0, 200.0, -300.0])
    np.testing.assert_allclose(
        dag.log_partition(lattice, scores, semiring=semirings.Real), dag.log_partition(lattice, scores), rtol=1e-12
    )


@pytest.mark.parametrize(
    "semiring",
    [semirings.Log, semirings.Real, semirings.Entropy, semirings.Max, semirings.KMax(3)],
    ids=lambda s: s.name,
)
def test_gradients_are_finite_and_zero_without_paths(semiring, random_batch):
    """The batch ends with lattices without a finite path (their values are
    checked against the oracle above): their gradients must be exactly 0."""
    _cases, lattices, scores = random_batch
    if semiring.name in ("log", "real", "entropy"):
        # Cotangent 1 even at -inf outputs: the derivative of an empty sum is 0.
        total = lambda s: jnp.sum(jitted_forward(semiring)(lattices, s))
    else:  # max-like outputs: keep -inf out of the sum; backward must stay NaN-free
        total = lambda s: jnp.sum(jnp.where(jnp.isfinite(v := jitted_forward(semiring)(lattices, s)), v, 0.0))
    grad = np.asarray(jax.jit(jax.grad(total))(scores))
    assert np.isfinite(grad).all()
    assert not grad[-len(no_path_cases()) :].any()


def test_viterbi_without_path():
    score, arcs, symbols = dag.viterbi(_diamond(), jnp.full((6,), -jnp.inf))
    assert score == -np.inf and (np.asarray(arcs) == -1).all() and (np.asarray(symbols) == -1).all()


def test_empty_string_and_start_final():
    lattice = dag.from_string([])
    assert dag.enumerate_strings(lattice) == [()]
    np.testing.assert_allclose(dag.log_partition(lattice, jnp.zeros((0,))), 0.0)
    score, arcs, _ = dag.viterbi(lattice, jnp.zeros((0,)))
    assert score == 0.0 and arcs.shape == (0,)


def test_from_string_and_candidate_lists():
    assert dag.enumerate_strings(dag.from_string([4, 2, 4])) == [(4, 2, 4)]
    candidates = [[1, 2, 3], [1, 2], [], [1, 2]]
    assert sorted(dag.enumerate_strings(dag.from_strings(candidates))) == sorted(map(tuple, candidates))
    assert sorted(dag.enumerate_strings(dag.from_strings(candidates, deterministic=True))) == sorted(
        set(map(tuple, candidates))
    )
    # Candidate i's arcs are contiguous: scoring candidate 0 = the sum of its arcs' scores.
    lattice = dag.from_strings(candidates)
    assert (0, 1, 2) in dag.enumerate_paths(lattice) and (3, 4) in dag.enumerate_paths(lattice)


@given(st.lists(st.lists(st.integers(0, 2), max_size=4), max_size=6))
def test_minimal_acceptor_is_deterministic_and_exact(strings):
    lattice = dag.from_strings(strings, deterministic=True)
    accepted = dag.enumerate_strings(lattice)
    assert sorted(accepted) == sorted(set(map(tuple, strings)))
    valid = np.asarray(lattice.arc_valid)
    out = list(zip(np.asarray(lattice.src)[valid], np.asarray(lattice.symbol)[valid]))
    assert len(out) == len(set(out)), "two arcs leave one state with the same symbol"


def test_union_accepts_both():
    left, right = dag.from_strings([[1, 2], [3]]), dag.from_strings([[], [2, 2, 2]])
    both = dag.union(left, right)
    assert sorted(dag.enumerate_strings(both)) == sorted([(1, 2), (3,), (), (2, 2, 2)])
    scores = jnp.asarray(np.random.default_rng(6).normal(size=both.num_arcs))
    assert np.isfinite(dag.log_partition(both, scores))


def test_rejects_cycles_and_bad_input():
    with pytest.raises(ValueError, match="topological"):
        dag.from_arcs([(0, 1, 0), (1, 2, 0), (2, 1, 0)], final=[2])
    with pytest.raises(ValueError, match="topological"):
        dag.from_arcs([(0, 0, 0)], final=[0])
    with pytest.raises(ValueError, match="outside"):
        dag.from_arcs([(0, 5, 0)], final=[1], num_states=3)
    with pytest.raises(ValueError, match=r"\[A, 3\]"):
        dag.from_arcs([(0, 1)], final=[1])
    lattice = _diamond()
    with pytest.raises(ValueError, match="arc_scores"):
        dag.log_partition(lattice, jnp.zeros((5,)))
    with pytest.raises(TypeError, match="arc_scores"):
        dag.log_partition(lattice, jnp.zeros((6,), jnp.int32))
    with pytest.raises(ValueError, match="NaN"):
        dag.log_partition(lattice, jnp.full((6,), jnp.nan))
    with pytest.raises(ValueError, match="batch shape"):
        dag.log_partition(dag.stack([lattice, lattice]), jnp.zeros((3, 6)))
    with pytest.raises(ValueError, match="Log or Real"):
        dag.log_partition(lattice, jnp.zeros((6,)), semiring=semirings.Max)
    with pytest.raises(ValueError, match="at least"):
        dag.pad(lattice, 2, 6, 3, 1, 3)


def test_shared_lattice_with_batched_scores():
    lattice = _diamond()
    scores = jnp.asarray(np.random.default_rng(7).normal(size=(2, 3, 6)))
    batched = dag.log_partition(lattice, scores)
    assert batched.shape == (2, 3)
    for index in itertools.product(range(2), range(3)):
        np.testing.assert_allclose(batched[index], dag.log_partition(lattice, scores[index]), rtol=1e-12)


# ---------------------------------------------------------------------------
# Packed batches
# ---------------------------------------------------------------------------

PACKABLE = [semirings.Log, semirings.Real, semirings.Max, semirings.KMax(3)]


@pytest.fixture(scope="module")
def random_pack():
    rng = np.random.default_rng(10)
    cases = [random_lattice(rng) for _ in range(30)] + no_path_cases()
    packed = dag.pack([dag.from_arcs(a, f, n) for a, f, n, _ in cases], num_lattices=len(cases) + 3)
    scores = np.concatenate([s for *_, s in cases] + [np.zeros(0)])
    return cases, packed, jnp.asarray(scores)


@pytest.mark.parametrize("semiring", PACKABLE, ids=lambda s: s.name)
def test_packed_forward_matches_enumeration(semiring, random_pack):
    cases, packed, scores = random_pack
    got = np.asarray(dag.packed_forward(semiring, packed, scores))
    assert got.shape[0] == len(cases) + 3
    for (arcs, final, _, arc_scores), value in zip(cases, got):
        path_scores = [sum(arc_scores[list(p)]) for p in oracle_paths(arcs, final)]
        np.testing.assert_allclose(value, oracle(semiring, path_scores), rtol=1e-9, atol=1e-9)
    for value in got[len(cases) :]:  # padding rows: the empty string, score 0
        np.testing.assert_allclose(value, oracle(semiring, [0.0]))


def test_packed_gradients_and_viterbi_match_stacked(random_pack):
    cases, packed, scores = random_pack
    offsets = np.cumsum([0] + [len(a) for a, *_ in cases])
    stacked = dag.stack([dag.from_arcs(arcs, final, num_states) for arcs, final, num_states, _ in cases])
    stacked_scores = jnp.asarray(np.stack([np.pad(s, (0, stacked.src.shape[-1] - len(s))) for *_, s in cases]))
    for semiring in (semirings.Log, semirings.Real):
        total = lambda s: jnp.sum(
            jnp.where(jnp.isfinite(v := dag.packed_log_partition(packed, s, semiring=semiring)), v, 0.0)
        )
        marginals = np.asarray(jax.grad(total)(scores))
        assert np.isfinite(marginals).all()
        expected = dag.arc_marginals(stacked, stacked_scores)  # one batched call: one compilation
        for i, (arcs, *_) in enumerate(cases):
            np.testing.assert_allclose(marginals[offsets[i] : offsets[i + 1]], expected[i, : len(arcs)], atol=1e-9)
    best, best_arcs, best_symbols = dag.packed_viterbi(packed, scores)
    expected_best, expected_paths, expected_symbols = dag.viterbi(stacked, stacked_scores)
    for i in range(len(cases)):
        np.testing.assert_allclose(best[i], expected_best[i])
        chosen = [int(a) - offsets[i] for a in best_arcs[i] if a >= 0]
        assert chosen == [int(a) for a in expected_paths[i] if a >= 0]
        assert [int(s) for s in best_symbols[i] if s >= 0] == [int(s) for s in expected_symbols[i] if s >= 0]


def test_pack_sizes_blocks_and_errors(random_pack):
    cases, packed, scores = random_pack
    lattices = [dag.from_arcs(a, f, n) for a, f, n, _ in cases]
    sizes = dag.packed_sizes(packed)
    bigger = dict(
        sizes,
        num_arcs=sizes["num_arcs"] + 5,
        num_levels=sizes["num_levels"] + 2,
        width=tuple(w + 1 for w in sizes["width"]),
        num_finals=sizes["num_finals"] + 1,
        num_states=sizes["num_states"] + 3,
    )
    wide = dag.pack(lattices, **bigger)
    # Packs of other lattices padded to the same sizes have the same shapes (one compiled program).
    assert jax.tree_util.tree_map(np.shape, dag.pack(lattices[:-1], **bigger)) == jax.tree_util.tree_map(np.shape, wide)
    padded_scores = jnp.concatenate([scores, jnp.zeros(5)])
    one_block = dag.pack(lattices, in_degree=(max(sizes["in_degree"]),))
    for semiring in PACKABLE:
        expected = dag.packed_forward(semiring, packed, scores)
        np.testing.assert_allclose(dag.packed_forward(semiring, wide, padded_scores), expected, rtol=1e-12)
        np.testing.assert_allclose(
            dag.packed_forward(semiring, one_block, scores)[: len(cases)], expected[: len(cases)], rtol=1e-12
        )
    with pytest.raises(ValueError, match=r"use dag\.stack"):
        dag.packed_forward(semirings.Entropy, packed, scores)
    with pytest.raises(ValueError, match="num_lattices"):
        dag.pack(lattices, num_lattices=2)
    with pytest.raises(ValueError, match="num_states"):
        dag.pack(lattices, num_states=sizes["num_states"] - 1)
    with pytest.raises(ValueError, match="in_degree"):
        dag.pack(lattices, in_degree=(1,))
    with pytest.raises(ValueError, match="packed arc"):
        dag.packed_forward(semirings.Log, packed, scores[:-1])


def test_a_state_far_behind_its_level_that_wins_later_is_exact():
    """Each state is shifted by its own best in-arc, so a branch 200 nats
    behind the level's best (past float32's range) that wins later keeps its
    mass, with the real semiring as with the log semiring, jitted or not."""
    lattice = dag.from_arcs([(0, 1, 0), (0, 2, 0), (1, 3, 0), (2, 4, 0), (3, 5, 0), (4, 5, 0)], final=[5])
    scores = jnp.array([0.0, -200.0, 0.0, 300.0, 0.0, 0.0], jnp.float32)
    for semiring in (semirings.Log, semirings.Real):
        np.testing.assert_allclose(dag.log_partition(lattice, scores, semiring=semiring), 100.0, rtol=1e-6)
        np.testing.assert_allclose(
            jax.jit(lambda s: dag.log_partition(lattice, s, semiring=semiring))(scores), 100.0, rtol=1e-6
        )
        marginals = dag.arc_marginals(lattice, scores, semiring=semiring)
        np.testing.assert_allclose(marginals, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(dag.packed_log_partition(dag.pack([lattice]), scores), [100.0], rtol=1e-6)
