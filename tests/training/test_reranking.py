"""Reranking optimizers (Gao, Suzuki & Yu 2006): vectorised candidate
updates against re-scoring, BLasso against the exact lasso minimum (OWL-QN)
at the alphas it visits, F-Boosting's larger L1 norm, boosting with
shrinkage's monotone decrease, jit and resume; the sparse layout against
the dense one, step for step."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns.optimizers.minimize import init_loop, minimize, relative_change_below, run_loop, run_loop_jit
from lossfns.optimizers.owlqn import elastic_net_penalty, owlqn
from lossfns.training import reranking
from tests.optimizers.test_problems import assert_resume_bit_identical

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

EPSILON = 0.02
NUM_STEPS = 400


@functools.cache
def _data():
    """Feature 3 is nearly `f1 + f2` while the truth uses f1 and f2: the lasso
    path takes f3 first and later shrinks it, which forward-only steps cannot.
    Concrete even when first needed inside a jitted function."""
    with jax.ensure_compile_time_eval():
        return _build_data()


def _build_data():
    rng = np.random.default_rng(0)
    num_examples, num_candidates = 40, 6
    features = rng.normal(size=(num_examples, num_candidates, 5))
    features[..., 3] = features[..., 1] + features[..., 2] + 0.3 * rng.normal(size=(num_examples, num_candidates))
    features[..., 0] = -2.0 * np.abs(rng.normal(size=(num_examples, num_candidates)))  # baseline log-probability
    truth = np.array([1.0, 2.0, 2.0, 0.0, 0.0])
    reference = np.argmax(features @ truth + 0.3 * rng.gumbel(size=(num_examples, num_candidates)), axis=1)
    return reranking.reranking_data(jnp.asarray(features), jnp.asarray(reference))


def _step_fns(data, epsilon=EPSILON, tolerance=1e-12):
    return {
        "blasso": reranking.blasso_step_fn(data, epsilon, tolerance=tolerance),
        "fboosting": reranking.blasso_step_fn(data, epsilon, backward=False, tolerance=tolerance),
        "shrinkage": reranking.boosting_with_shrinkage_step_fn(data, 0.5),
        "fslr": reranking.fslr_step_fn(data, epsilon),
        "capped_fslr": reranking.fslr_step_fn(data, epsilon, cap=True),
    }


@functools.cache
def _path(kind):
    """States after every step of one run, `[NUM_STEPS]`-stacked `LoopState`s."""
    data = _data()
    step_fn = _step_fns(data)[kind]
    stop = relative_change_below(0.0)
    one_step = lambda loop, _: (run_loop_jit(step_fn, loop, loop.step + 1, stop),) * 2
    run = jax.jit(lambda loop: jax.lax.scan(one_step, loop, None, length=NUM_STEPS)[1])
    return run(init_loop(reranking.reranking_init(data), NUM_STEPS))


def test_candidate_update_losses_match_rescoring():
    data = _data()
    rng = np.random.default_rng(1)
    weights = jnp.asarray(rng.normal(size=5) * 0.3)
    steps = jnp.asarray(rng.normal(size=5))
    margins = data.differences @ weights
    rescored = [reranking.exp_loss(data, data.differences @ weights.at[k].add(steps[k])) for k in range(5)]
    np.testing.assert_allclose(reranking.update_losses(data, margins, steps), rescored, rtol=1e-12)


def test_optimal_steps_match_collins_koo_closed_form():
    """With differences in {-1, 0, 1} the optimal step is `log(W+ / W-) / 2`."""
    rng = np.random.default_rng(2)
    features = rng.integers(0, 2, size=(30, 4, 3)).astype(np.float64)
    data = reranking.reranking_data(jnp.asarray(features), jnp.asarray(rng.integers(0, 4, size=30)))
    margins = jnp.asarray(rng.normal(size=(30, 4)) * 0.5)
    cached = np.asarray(jnp.exp(-margins))[..., None]
    plus = np.sum(cached * (np.asarray(data.differences) == 1), axis=(0, 1))
    minus = np.sum(cached * (np.asarray(data.differences) == -1), axis=(0, 1))
    np.testing.assert_allclose(reranking.optimal_steps(data, margins), 0.5 * np.log(plus / minus), rtol=1e-9)


def _lasso_loss(data, weights, alpha):
    """`ExpLoss + alpha ||lambda_{1:}||_1` of weights `[K]` (the baseline weight unpenalised)."""
    return reranking.exp_loss(data, reranking._margins(data, weights)) + alpha * jnp.sum(jnp.abs(weights[1:]))


def _run(step_fn, data, *, max_steps):
    """A method's run from `reranking_init` for up to `max_steps` steps (jit-able)."""
    loop = init_loop(reranking.reranking_init(data), max_steps, data.mask.dtype)
    return run_loop(step_fn, loop, max_steps, relative_change_below(0.0))


@functools.partial(jax.jit, static_argnames=("baseline",))
def _exact_lasso_loss(alpha, baseline):
    """`min over lambda_{1:}` of LassoLoss with `lambda_0` fixed (OWL-QN)."""
    data = _data()
    fun = lambda w: reranking.exp_loss(data, data.differences @ jnp.concatenate([jnp.array([baseline]), w]))
    result = minimize(fun, jnp.zeros(4), owlqn(alpha), max_steps=300, tol=1e-13, penalty=elastic_net_penalty(alpha))
    return _lasso_loss(data, jnp.concatenate([jnp.array([baseline]), result.params]), alpha)


def test_blasso_tracks_the_lasso_path():
    path = _path("blasso")
    alphas = np.asarray(path.inner.alpha)
    baseline = float(path.inner.weights[0, 0])
    # The solution for an alpha is the last state before alpha decreases.
    last_at_alpha = np.nonzero(np.diff(alphas) < 0)[0]
    assert len(last_at_alpha) > 50  # the path visits many alphas
    for index in last_at_alpha[:: len(last_at_alpha) // 8]:
        alpha = float(alphas[index])
        ours = float(_lasso_loss(_data(), path.inner.weights[index], alpha))
        assert ours <= 1.01 * float(_exact_lasso_loss(alpha, baseline))
    assert np.any(np.diff(np.sum(np.abs(np.asarray(path.inner.weights)[:, 1:]), axis=1)) < 0)  # backward steps


def test_forward_only_blasso_has_larger_l1_norm_at_equal_loss():
    blasso, forward_only = _path("blasso"), _path("fboosting")
    loss_b, loss_f = np.asarray(blasso.value), np.asarray(forward_only.value)
    norm_b = np.sum(np.abs(np.asarray(blasso.inner.weights)[:, 1:]), axis=1)
    norm_f = np.sum(np.abs(np.asarray(forward_only.inner.weights)[:, 1:]), axis=1)
    gaps = []
    for loss, norm in zip(loss_b, norm_b):
        if loss < loss_f.min():
            continue
        first = np.argmax(loss_f <= loss)  # forward-only reaches this loss here
        gaps.append(norm_f[first] - norm)
    gaps = np.asarray(gaps)
    assert np.all(gaps >= -2 * EPSILON)  # never clearly smaller (step granularity)
    assert gaps.max() > 0.2  # clearly larger where the lasso path shrinks feature 3


@pytest.mark.parametrize("kind", ["shrinkage", "fslr", "capped_fslr", "fboosting"])
def test_exp_loss_decreases(kind):
    path = _path(kind)
    losses = np.asarray(path.value)
    if kind == "fslr":
        # Fixed steps of epsilon overshoot once the optimal step is smaller: check the descent phase.
        assert np.any(np.diff(losses) > 0)
        losses = losses[:150]
    assert np.all(np.diff(losses) <= 1e-12 * losses[1:])
    assert losses[-1] < 0.5 * float(reranking.exp_loss(_data(), reranking.reranking_init(_data()).margins))
    # The cached margins stay equal to re-scored ones.
    np.testing.assert_allclose(path.inner.margins[-1], _data().differences @ path.inner.weights[-1], atol=1e-10)


def test_resume_is_bit_identical(tmp_path):
    data = _data()
    step_fn = reranking.blasso_step_fn(data, EPSILON)
    loop = init_loop(reranking.reranking_init(data), 60)
    assert_resume_bit_identical(step_fn, loop, relative_change_below(0.0), 25, tmp_path / "blasso.eqx")


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="features"):
        reranking.reranking_data(jnp.zeros((3, 4)), jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="reference"):
        reranking.reranking_data(jnp.zeros((3, 4, 2)), jnp.zeros(4, jnp.int32))
    with pytest.raises(ValueError, match="mask"):
        reranking.reranking_data(jnp.zeros((3, 4, 2)), jnp.zeros(3, jnp.int32), jnp.ones((3, 5)))


# ---------------------------------------------------------------------------
# The sparse layout against the dense one
# ---------------------------------------------------------------------------


def _random_problem(seed, counts, N=12, C=6, K=9):
    """Dense data with ragged lists and sparse features, integer counts or real values."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 3, (N, C, K)).astype(np.float64) if counts else rng.normal(size=(N, C, K))
    features = values * (rng.random((N, C, K)) < 0.4)
    features[:, :, 0] = -rng.exponential(2.0, (N, C))
    valid = rng.random((N, C)) < 0.85
    valid[:, 0] = True
    reference = np.array([rng.choice(np.flatnonzero(row)) for row in valid])
    return reranking.reranking_data(jnp.asarray(features), jnp.asarray(reference), jnp.asarray(valid))


def _sparse_of(dense):
    """The same differences in the sparse layout (entries of the invalid
    candidates, zero in the dense layout, are dropped by the constructor too)."""
    differences = np.asarray(dense.differences)
    example, candidate, feature = np.nonzero(differences[:, :, 1:])
    entries = (example, candidate, feature + 1, differences[example, candidate, feature + 1])
    return reranking.sparse_reranking_data(
        differences[:, :, 0], entries, np.asarray(dense.mask), num_features=differences.shape[-1], dtype=jnp.float64
    )


@pytest.mark.parametrize("counts", [True, False])
def test_sparse_layout_scores_like_the_dense_one(counts):
    dense = _random_problem(3, counts)
    sparse = _sparse_of(dense)
    assert sparse.entry_value.shape[0] == np.count_nonzero(np.asarray(dense.differences)[:, :, 1:])
    assert sparse.slot_value.shape[0] < sparse.entry_value.shape[0]  # equal (feature, value) entries share a slot
    rng = np.random.default_rng(4)
    weights, steps = jnp.asarray(rng.normal(size=9) * 0.3), jnp.asarray(rng.normal(size=9))
    margins = dense.differences @ weights
    np.testing.assert_allclose(_lasso_loss(sparse, weights, 0.7), _lasso_loss(dense, weights, 0.7), rtol=1e-12)
    np.testing.assert_allclose(
        reranking.update_losses(sparse, margins, steps), reranking.update_losses(dense, margins, steps), rtol=1e-12
    )
    np.testing.assert_allclose(
        reranking.optimal_steps(sparse, margins), reranking.optimal_steps(dense, margins), rtol=1e-9, atol=1e-12
    )
    for want, got in zip(reranking.reranking_init(dense), reranking.reranking_init(sparse)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("counts", [True, False])
@pytest.mark.parametrize("kind", ["shrinkage", "fslr", "capped_fslr", "blasso", "fboosting"])
def test_sparse_layout_takes_the_dense_steps(kind, counts):
    """Every method, step for step (the sparse data passed through jit as an
    argument, as research code runs it)."""
    dense = _random_problem(1, counts)
    sparse = _sparse_of(dense)
    run = lambda data: _run(_step_fns(data, 0.5)[kind], data, max_steps=60)
    want, got = run(dense), jax.jit(run)(sparse)
    np.testing.assert_allclose(got.inner.weights, want.inner.weights, atol=1e-12)
    np.testing.assert_allclose(got.inner.margins, want.inner.margins, atol=1e-11)
    np.testing.assert_allclose(got.trace, want.trace, rtol=1e-12)
    np.testing.assert_allclose(got.inner.alpha, want.inner.alpha, rtol=1e-9, atol=1e-12)  # alpha -> 0: losses' rounding
    if kind == "blasso" and counts:  # backward steps taken on this one: not F-Boosting's path
        forward_only = _run(_step_fns(sparse, 0.5)["fboosting"], sparse, max_steps=60)
        assert not np.allclose(got.trace, forward_only.trace)


def test_sparse_data_rejects_bad_inputs():
    entries = (np.array([0, 1]), np.array([1, 2]), np.array([1, 3]), np.array([1.0, -2.0]))
    good = dict(baseline=np.zeros((2, 3)), entries=entries, mask=np.ones((2, 3)))
    assert reranking.num_features(reranking.sparse_reranking_data(**good)) == 4
    assert reranking.num_features(reranking.sparse_reranking_data(**good, num_features=6)) == 6

    def rejects(match, **changes):
        with pytest.raises(ValueError, match=match):
            reranking.sparse_reranking_data(**{**good, **changes})

    rejects(r"baseline must have shape \[N, C\]", baseline=np.zeros((2, 3, 1)))
    rejects(r"mask must have shape \[N, C\] = \(2, 3\)", mask=np.ones((3, 2)))
    rejects("entries must be a tuple of 4 arrays", entries=entries[:3])
    rejects(r"entries' value must have shape \[E\]", entries=entries[:3] + (np.ones(3),))
    rejects("entries' feature must be an int array", entries=entries[:2] + (np.array([1.0, 3.0]), entries[3]))
    rejects(
        r"entries' feature must lie in \[1, 4\), got 0 at index 1",
        entries=entries[:2] + (np.array([1, 0]), entries[3]),
        num_features=4,
    )
    rejects(r"entries' feature must lie in \[1, 3\), got 3", num_features=3)
    rejects(r"entries' example must lie in \[0, 2\), got 2", entries=(np.array([0, 2]),) + entries[1:])
    rejects(r"entries' candidate must lie in \[0, 3\), got -1", entries=(entries[0], np.array([1, -1])) + entries[2:])
    rejects(r"entries' value must be finite, got nan at index \(1,\)", entries=entries[:3] + (np.array([1.0, np.nan]),))
    rejects("baseline must be finite", baseline=np.array([[0.0, np.inf, 0.0], [0.0, 0.0, 0.0]]))
    rejects("at most one value per", entries=(np.array([0, 0]), np.array([1, 1]), np.array([2, 2]), entries[3]))
    with pytest.raises(TypeError, match="baseline must be a floating-point array"):
        reranking.sparse_reranking_data(**{**good, "baseline": np.zeros((2, 3), np.int32)})
    with pytest.raises(TypeError, match=r"data must be a RerankingData .* or a SparseRerankingData"):
        reranking.fslr_step_fn(entries, 0.1)
