"""Property-based fuzzing of `lossfns.lattices.chain` and `lossfns.semirings`.

Inputs: float64, float32 and bfloat16 scores mixing ordinary values, +-1e30,
0 and `-inf` patterns (forbidden transitions, dead ends, chains with no
allowed path), lengths from 0 to T. Every public function must give either
a correct result (checked against the brute-force oracles of
`lossfns.testing`, computed in float64 from the same cast inputs) or a
clear `ValueError`/`TypeError`; never NaN, never an XLA crash.

Shapes are fixed per test so that each dtype compiles one fused program
(the suite shares 2 cores); hypothesis varies the values and lengths. The
budget is the `ci` profile of tests/conftest.py (25 examples per test, or
LOSSFNS_HYPOTHESIS_EXAMPLES).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lossfns import semirings, testing
from lossfns.lattices import chain
from lossfns.lattices.chain import FactoredPotentials

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

DTYPES = {"float64": jnp.float64, "float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Relative accuracy expected of log-space results, in units of the input magnitude.
RELATIVE = {"float64": 1e-9, "float32": 1e-5, "bfloat16": 6e-2}
BATCH, T, L, K = 3, 4, 3, 3
# Where `max |finite score|` stays below this, the answer is well conditioned
# and the probabilities themselves are compared with the oracle.
WELL_CONDITIONED = 30.0

ordinary = st.floats(-8.0, 8.0, allow_nan=False, width=32)
extreme = st.sampled_from([-np.inf, 1e30, -1e30, 0.0])
scores = st.one_of(ordinary, ordinary, extreme)


def score_arrays(shape):
    return hnp.arrays(np.float64, shape, elements=scores)


lengths_arrays = hnp.arrays(np.int32, (BATCH,), elements=st.integers(0, T))


# ---------------------------------------------------------------------------
# One fused program per input form and dtype: everything public at once
# ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames="parallel")
def _everything(potentials, lengths, labels, key, parallel):
    """Every public chain function on one batch; the parallel algorithm
    (the costliest compile) only where `parallel`."""
    out = {"log_partition_parallel": chain.log_partition(potentials, lengths, algorithm="parallel")} if parallel else {}
    return out | {
        "log_partition": chain.log_partition(potentials, lengths),
        "log_partition_real": chain.forward(semirings.Real, potentials, lengths),
        "max": chain.forward(semirings.Max, potentials, lengths),
        "count": chain.forward(semirings.Counting, potentials, lengths),
        "marginals": chain.marginals(potentials, lengths),
        "node_marginals": chain.node_marginals(potentials, lengths),
        "entropy": chain.entropy(potentials, lengths),
        "entropy_gradient": jax.grad(lambda p: jnp.sum(chain.entropy(p, lengths)))(potentials),
        "viterbi": chain.viterbi(potentials, lengths),
        "kbest": chain.kbest(potentials, lengths, K),
        "sample": chain.sample(key, potentials, lengths),
        "score": chain.score(potentials, labels, lengths),
    }


def _no_nan(tree):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            assert not np.isnan(np.asarray(leaf, np.float64)).any(), f"NaN in {jax.tree_util.keystr(path)}"


def _magnitude(dense):
    """A scale for absolute tolerances: the largest possible |path score|."""
    finite = np.where(np.isfinite(dense), np.abs(dense), 0.0)
    return float(finite.max(initial=0.0)) * T + T * math.log(L) + 1.0


def _absorbs_log_terms(dense, dtype_name):
    """Whether path scores are so large that adding `log(number of terms)` to
    them is lost to rounding, which (until the core fix) breaks marginals."""
    return _magnitude(dense) * float(jnp.finfo(DTYPES[dtype_name]).eps) > 0.05


def _assert_close(got, want, atol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), f"{what}: -inf pattern {got} vs {want}"
    finite = np.isfinite(want)
    assert np.isfinite(got[finite]).all(), f"{what}: {got} vs {want}"
    np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=atol, err_msg=what)


def _check_label_paths(labels, lengths, scores, dense, atol, what):
    """Labels `[B, ..., T]` are in [0, L) inside the length and -1 past it
    (or -1 throughout for a path that does not exist), and score `scores`."""
    labels = np.asarray(labels)
    inside = np.arange(T) < np.asarray(lengths)[:, None]
    inside = inside.reshape(inside.shape[:1] + (1,) * (labels.ndim - 2) + inside.shape[1:])
    present = np.isfinite(np.asarray(scores, np.float64))[..., None]
    assert (labels[~inside & np.broadcast_to(True, labels.shape)] == -1).all(), f"{what}: label past length"
    expect_labels = np.broadcast_to(inside, labels.shape) & np.broadcast_to(present, labels.shape)
    assert ((labels >= 0) == expect_labels).all(), f"{what}: labels {labels} for scores {scores}"
    assert (labels < L).all()
    flat = labels.reshape(BATCH, -1, T)
    for j in range(flat.shape[1]):
        path_scores = testing.sequence_score(dense, np.where(flat[:, j] < 0, 0, flat[:, j]), lengths)
        want = np.asarray(scores, np.float64).reshape(BATCH, -1)[:, j]
        ok = np.isfinite(want)
        np.testing.assert_allclose(path_scores[ok], want[ok], rtol=0, atol=atol, err_msg=what)


def _check_everything(out, dense, lengths, labels, dtype_name):
    """Compare the fused outputs with the enumeration oracles (`dense` is the
    float64 `[B, T, L, L]` form of the inputs, after the cast)."""
    _no_nan(out)
    atol = RELATIVE[dtype_name] * _magnitude(dense)
    log_z = testing.log_partition(dense, lengths)
    _assert_close(out["log_partition"], log_z, atol, "log_partition")
    if "log_partition_parallel" in out:
        _assert_close(out["log_partition_parallel"], log_z, atol, "log_partition parallel")
    # The scaled real semiring may underflow a path whose step is ~1e30 below
    # the best entry of that step (documented): it can only lose mass.
    real = np.asarray(out["log_partition_real"], np.float64)
    assert (real <= log_z + atol).all(), f"real semiring {real} above log Z {log_z}"
    best, _ = testing.viterbi(dense, lengths)
    _assert_close(out["max"], best, atol, "max semiring")
    # Not bit-exact integers: the counting semiring renormalises like the real one (reported).
    np.testing.assert_allclose(
        np.asarray(out["count"], np.float64), testing.count_paths(dense, lengths), rtol=max(RELATIVE[dtype_name], 1e-12)
    )

    score, path = out["viterbi"]
    _assert_close(score, best, atol, "viterbi score")
    _check_label_paths(path, lengths, score, dense, atol, "viterbi")
    kbest_scores, kbest_labels = out["kbest"]
    _assert_close(kbest_scores, testing.kbest_scores(dense, lengths, K), atol, "kbest scores")
    _check_label_paths(kbest_labels, lengths, kbest_scores, dense, atol, "kbest")
    _assert_close(out["score"], testing.sequence_score(dense, labels, lengths), atol, "score")

    samples = np.asarray(out["sample"])
    inside = np.arange(T) < lengths[:, None]
    assert (samples[~inside] == -1).all() and (samples[inside] >= -1).all() and (samples < L).all()
    reachable = np.isfinite(log_z)
    sample_scores = testing.sequence_score(dense, np.maximum(samples, 0), lengths)
    assert np.isfinite(sample_scores[reachable]).all(), "sampled a forbidden path"
    assert (samples[reachable[:, None] & inside] >= 0).all()

    node = np.asarray(out["node_marginals"], np.float64)
    tolerance = {"float64": 1e-6, "float32": 1e-4, "bfloat16": 6e-2}[dtype_name]
    if not _absorbs_log_terms(dense, dtype_name):  # huge scores: the log terms vanish in rounding
        assert (node >= -tolerance).all() and (node <= 1 + tolerance).all()
        expected_sums = np.where(inside & reachable[:, None], 1.0, 0.0)
        np.testing.assert_allclose(node.sum(-1), expected_sums, atol=tolerance * L)
    entropy = np.asarray(out["entropy"], np.float64)
    paths = np.maximum(testing.count_paths(dense, lengths), 1)
    assert (entropy >= -tolerance * 10).all() and (entropy <= np.log(paths) + tolerance * 10).all()
    for leaf in jax.tree_util.tree_leaves((out["entropy_gradient"], out["marginals"])):
        assert np.isfinite(np.asarray(leaf, np.float64)).all(), "infinite derivative"

    marginals = out["marginals"]
    if isinstance(marginals, FactoredPotentials):
        np.testing.assert_array_equal(np.asarray(marginals.unary, np.float64), node)
        edge = (np.asarray(marginals.transitions, np.float64), np.asarray(marginals.start, np.float64))
    else:
        edge = np.asarray(marginals, np.float64)
        np.testing.assert_allclose(edge.sum(-2), node, atol=tolerance)
    if dtype_name == "float64" and _magnitude(dense) <= WELL_CONDITIONED * T + T * math.log(L) + 1:
        oracle_edge = testing.marginals(dense, lengths)
        if isinstance(edge, tuple):  # expected transition counts and start marginals
            np.testing.assert_allclose(edge[0], oracle_edge[:, 1:].sum(1), atol=1e-7)
            np.testing.assert_allclose(edge[1], oracle_edge[:, 0, 0], atol=1e-7)
        else:
            np.testing.assert_allclose(edge, oracle_edge, atol=1e-7)
        np.testing.assert_allclose(node, testing.node_marginals(dense, lengths), atol=1e-7)
        np.testing.assert_allclose(entropy, testing.entropy(dense, lengths), atol=1e-7)
        _assert_close(out["log_partition_real"], log_z, atol, "log_partition real")


def _inputs(data, dtype_name):
    labels = data.draw(hnp.arrays(np.int32, (BATCH, T), elements=st.integers(0, L - 1)), label="labels")
    lengths = data.draw(lengths_arrays, label="lengths")
    labels = np.where(np.arange(T) < lengths[:, None], labels, -1)
    key = jax.random.key(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    return jnp.asarray(lengths), jnp.asarray(labels), key


@pytest.mark.parametrize("dtype_name", DTYPES)
@given(data=st.data())
def test_fuzz_dense_potentials(dtype_name, data):
    raw = data.draw(score_arrays((BATCH, T, L, L)), label="potentials")
    potentials = jnp.asarray(raw, DTYPES[dtype_name])
    lengths, labels, key = _inputs(data, dtype_name)
    out = _everything(potentials, lengths, labels, key, parallel=dtype_name == "float64")
    _check_everything(out, np.asarray(potentials, np.float64), np.asarray(lengths), np.asarray(labels), dtype_name)


@given(data=st.data())
def test_fuzz_factored_potentials(data):
    dtype_name = "float32"  # the training dtype; one compiled program
    dtype = DTYPES[dtype_name]
    potentials = FactoredPotentials(
        jnp.asarray(data.draw(score_arrays((BATCH, T, L)), label="unary"), dtype),
        jnp.asarray(data.draw(score_arrays((L, L)), label="transitions"), dtype),
        jnp.asarray(data.draw(score_arrays((L,)), label="start"), dtype),
    )
    lengths, labels, key = _inputs(data, dtype_name)
    out = _everything(potentials, lengths, labels, key, parallel=False)
    dense = np.asarray(chain.materialize(jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), potentials)))
    _check_everything(out, dense, np.asarray(lengths), np.asarray(labels), dtype_name)


def _dead_end():
    """Label 1 at position 1 is reachable only through a step 2e30 below the
    best entry of its matrix, and every other label dead-ends at position 2."""
    potentials = np.zeros((BATCH, T, L, L))
    potentials[:, 1] = -np.inf
    potentials[:, 1, 0, 0] = 1e30
    potentials[:, 1, 0, 1] = -1e30
    potentials[:, 2] = -np.inf
    potentials[:, 2, 1, :] = 0.0
    return potentials


NAMED_CASES = {
    "no allowed path": np.full((BATCH, T, L, L), -np.inf),
    "only one allowed path": np.where(np.eye(L, dtype=bool)[None, None] & (np.arange(L) == 0), 0.0, -np.inf)
    * np.ones((BATCH, T, 1, 1)),
    "exact ties": np.zeros((BATCH, T, L, L)),
    "huge scores": np.full((BATCH, T, L, L), 1e30),
    "huge negative scores": np.full((BATCH, T, L, L), -1e30),
    "dead end after a tiny step": _dead_end(),
}


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("case", NAMED_CASES)
def test_named_extreme_cases(case, dtype_name):
    potentials = jnp.asarray(NAMED_CASES[case], DTYPES[dtype_name])
    lengths = jnp.asarray([0, T, 2], jnp.int32)
    labels = jnp.where(jnp.arange(T) < lengths[:, None], 0, -1).astype(jnp.int32)
    out = _everything(potentials, lengths, labels, jax.random.key(0), parallel=dtype_name == "float64")
    _check_everything(out, np.asarray(potentials, np.float64), np.asarray(lengths), np.asarray(labels), dtype_name)


@pytest.mark.parametrize("dtype, magnitude", [(jnp.float32, 1e8), (jnp.float64, 1e17)])
def test_marginals_stay_normalised_for_huge_scores(dtype, magnitude):
    weights = jax.grad(lambda x: semirings.logsumexp(x, -1))(jnp.full((3,), magnitude, dtype))
    np.testing.assert_allclose(weights, np.full(3, 1 / 3), rtol=1e-3)


# ---------------------------------------------------------------------------
# Semirings: every operation on extreme values, against numpy in float64
# ---------------------------------------------------------------------------

SEMIRINGS = {
    "log": semirings.Log,
    "max": semirings.Max,
    "real": semirings.Real,
    "entropy": semirings.Entropy,
    "counting": semirings.Counting,
    "kmax": semirings.KMax(2),
}


@jax.jit
def _semiring_results(x):
    """For each semiring: the row sums of `x [R, C]` directly, after
    `normalize`, with a semiring zero appended, and times one; plus the
    derivatives of `logsumexp` and `finite_max`."""
    out = {}
    for name, semiring in SEMIRINGS.items():
        value, shift = semiring.convert_scaled(x, (-1,))
        normalized, scale = semiring.normalize(value, -1)
        zero = semiring.zero(x.shape[:-1] + (1,), x.dtype)
        padded = jax.tree_util.tree_map(lambda v, z: jnp.concatenate([v, z], axis=-1), value, zero)
        one = semiring.one(x.shape, x.dtype)
        out[name] = {
            "sum": semiring.unconvert(semiring.sum(value, -1), shift),
            "normalized_sum": semiring.unconvert(semiring.sum(normalized, -1), shift + scale),
            "padded_sum": semiring.unconvert(semiring.sum(padded, -1), shift),
            "times_one": semiring.unconvert(semiring.sum(semiring.times(value, one), -1), shift),
        }
    total = lambda y: jnp.sum(semirings.logsumexp(y, -1))
    out["logsumexp_gradient"] = jax.grad(total)(x)
    out["logsumexp_hessian_vector"] = jax.jvp(jax.grad(total), (x,), (jnp.ones_like(x),))[1]
    out["finite_max"] = semirings.finite_max(x, -1)
    out["finite_max_gradient"] = jax.grad(lambda y: jnp.sum(semirings.finite_max(y, -1)))(x)
    return out


def _row_oracles(x):
    """numpy float64 oracles of each semiring's row sum of `x [R, C]`."""
    finite = np.isfinite(x)
    peak = np.where(finite.any(-1), np.max(np.where(finite, x, -np.inf), -1), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        shifted = np.where(finite, np.exp(x - peak[:, None]), 0.0)
        mass = shifted.sum(-1)
        log_z = np.where(mass > 0, np.log(mass) + peak, -np.inf)
        p = shifted / np.where(mass > 0, mass, 1.0)[:, None]
        entropy = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(-1)
    top = -np.sort(-x, axis=-1)[:, :2]
    return {
        "log": log_z,
        "real": log_z,
        "max": x.max(-1),
        "counting": finite.sum(-1).astype(float),
        "entropy": entropy,
        "kmax": top,
    }


@pytest.mark.parametrize("dtype_name", DTYPES)
@given(raw=hnp.arrays(np.float64, (4, 3), elements=scores))
def test_fuzz_semirings(dtype_name, raw):
    x = jnp.asarray(raw, DTYPES[dtype_name])
    out = _semiring_results(x)
    _no_nan(out)
    x64 = np.asarray(x, np.float64)
    atol = RELATIVE[dtype_name] * (np.where(np.isfinite(x64), np.abs(x64), 0.0).max() * 2 + 2)
    oracles = _row_oracles(x64)
    for name, oracle in oracles.items():
        for variant, value in out[name].items():
            what = f"{name} semiring, {variant}"
            if name == "entropy" and _absorbs_log_terms(x64[:, :, None, None], dtype_name):
                continue  # its probabilities come from the same exp(x - out) weights (the core issue)
            # Counts are renormalised like real numbers, so not exact integers (reported).
            _assert_close(value, oracle, atol if name != "counting" else RELATIVE[dtype_name] * 4, what)
    gradient = np.asarray(out["logsumexp_gradient"], np.float64)
    assert np.isfinite(gradient).all() and (gradient >= 0).all()
    assert (gradient[~np.isfinite(x64)] == 0).all(), "a -inf entry got a non-zero derivative"
    assert np.isfinite(np.asarray(out["logsumexp_hessian_vector"], np.float64)).all()
    if not _absorbs_log_terms(x64[:, :, None, None], dtype_name):
        has_finite = np.isfinite(x64).any(-1)
        np.testing.assert_allclose(gradient.sum(-1), has_finite.astype(float), atol=RELATIVE[dtype_name] * 10 + 1e-6)
    # XLA on CPU flushes subnormals to zero: allow the smallest normal number.
    _assert_close(
        out["finite_max"],
        np.where(np.isfinite(x64).any(-1), x64.max(-1), 0.0),
        float(jnp.finfo(DTYPES[dtype_name]).tiny),
        "finite_max",
    )
    assert (np.asarray(out["finite_max_gradient"]) == 0).all()
