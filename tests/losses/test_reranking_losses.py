"""Reranking objectives and regularisers against direct numpy sums and their
closed-form gradients (MATH.md sections 2 and 5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import losses

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)


def candidate_problem(seed=0, batch=3, candidates=5, features=4):
    rng = np.random.default_rng(seed)
    feature_values = rng.normal(size=(batch, candidates, features))
    weights = rng.normal(size=(features,))
    reference = np.array([0, 3, 1])[:batch]
    mask = np.ones((batch, candidates), bool)
    mask[1, 4] = mask[2, 2:] = False  # ragged candidate lists
    return feature_values, weights, reference, mask


def exp_loss_oracle(feature_values, weights, reference, mask, include_reference):
    """ExpLoss by direct summation, and its gradient in the weights:
    `sum_W exp(-M(W^R, W)) (f(W) - f(W^R))`."""
    value, grad = np.zeros(len(reference)), np.zeros((len(reference),) + weights.shape)
    for i, r in enumerate(reference):
        scores = feature_values[i] @ weights
        for w in np.flatnonzero(mask[i]):
            if w == r and not include_reference:
                continue
            term = np.exp(-(scores[r] - scores[w]))
            value[i] += term
            grad[i] += term * (feature_values[i, w] - feature_values[i, r])
    return value, grad


@pytest.mark.parametrize("include_reference", [True, False])
def test_reranking_exp_loss_matches_direct_sum_and_closed_form_gradient(include_reference):
    feature_values, weights, reference, mask = candidate_problem()
    loss = jax.jit(
        lambda w: losses.reranking_exp_loss(feature_values @ w, reference, mask, include_reference=include_reference)
    )
    value, grad = exp_loss_oracle(feature_values, weights, reference, mask, include_reference)
    np.testing.assert_allclose(loss(weights), value, rtol=1e-12)
    np.testing.assert_allclose(jax.jacrev(loss)(weights), grad, rtol=1e-10, atol=1e-14)


def test_reranking_exp_loss_differs_by_one_with_the_reference_term():
    feature_values, weights, reference, mask = candidate_problem(1)
    scores = feature_values @ weights
    with_reference = losses.reranking_exp_loss(scores, reference, mask)
    without = losses.reranking_exp_loss(scores, reference, mask, include_reference=False)
    np.testing.assert_allclose(with_reference - without, 1.0, rtol=1e-12)


def test_reranking_log_loss_is_the_softmax_cross_entropy():
    feature_values, weights, reference, mask = candidate_problem(2)
    scores = feature_values @ weights
    masked = np.where(mask, scores, -np.inf)
    log_softmax = masked - np.log(np.exp(masked).sum(-1, keepdims=True))
    expected = -log_softmax[np.arange(3), reference]
    np.testing.assert_allclose(losses.reranking_log_loss(scores, reference, mask), expected, rtol=1e-12)
    grad = jax.grad(lambda s: jnp.sum(losses.reranking_log_loss(s, reference, mask)))(scores)
    np.testing.assert_allclose(grad, np.exp(log_softmax) - np.eye(5)[reference], atol=1e-14)


def test_reranking_losses_jit_and_vmap():
    feature_values, weights, reference, mask = candidate_problem(3)
    scores = feature_values @ weights
    for fn in (losses.reranking_exp_loss, losses.reranking_log_loss):
        batched = fn(scores, reference, mask)
        mapped = jax.jit(jax.vmap(fn))(scores, reference, mask)
        looped = [fn(scores[i], reference[i], mask[i]) for i in range(3)]
        np.testing.assert_allclose(mapped, batched, rtol=1e-12)
        np.testing.assert_allclose(looped, batched, rtol=1e-12)


def test_reranking_losses_with_forbidden_candidates_stay_finite():
    feature_values, weights, reference, mask = candidate_problem(4)
    scores = np.where(np.arange(5) == 2, -np.inf, feature_values @ weights)  # candidate 2 scored -inf
    scores[2, 0] = 0.0  # example 2's reference stays allowed
    reference = np.array([0, 3, 0])
    for fn in (losses.reranking_exp_loss, losses.reranking_log_loss):
        grad = jax.grad(lambda s: jnp.sum(fn(s, reference, mask)))(scores)
        assert np.all(np.isfinite(fn(scores, reference, mask))) and np.all(np.isfinite(grad))
        assert np.all(grad[:, 2] == 0.0)


def test_reranking_losses_reject_bad_input():
    _, _, reference, mask = candidate_problem()
    scores = np.zeros((3, 5))
    with pytest.raises(ValueError, match="reference"):
        losses.reranking_exp_loss(scores, reference[:2], mask)
    with pytest.raises(TypeError, match="reference"):
        losses.reranking_exp_loss(scores, reference.astype(float), mask)
    with pytest.raises(ValueError, match="reference"):
        losses.reranking_log_loss(scores, np.array([0, 4, 1]), mask)  # candidate 4 of example 1 is masked
    with pytest.raises(ValueError, match="mask"):
        losses.reranking_log_loss(scores, reference, mask[:, :4])
    with pytest.raises(ValueError, match="scores"):
        losses.reranking_log_loss(np.full((3, 5), np.nan), reference, mask)


# ---------------------------------------------------------------------------
# Regularisers
# ---------------------------------------------------------------------------


def parameters():
    return {"base": jnp.array(2.0), "features": jnp.array([1.0, -3.0, 0.0, 0.5]), "bias": {"b": jnp.array([[-1.0]])}}


def test_penalties_match_numpy_and_their_gradients():
    params = parameters()
    flat = np.array([2.0, 1.0, -3.0, 0.0, 0.5, -1.0])
    np.testing.assert_allclose(losses.l2(params, 0.5), 0.25 * np.sum(flat**2))
    np.testing.assert_allclose(losses.l1(params, 0.3), 0.3 * np.sum(np.abs(flat)))
    np.testing.assert_allclose(
        losses.elastic_net(params, 0.3, 0.5), 0.3 * np.sum(np.abs(flat)) + 0.25 * np.sum(flat**2)
    )
    grad = jax.grad(lambda p: losses.elastic_net(p, 0.3, 0.5))(params)
    np.testing.assert_allclose(
        grad["features"], 0.3 * np.sign([1.0, -3.0, 0.0, 0.5]) + 0.5 * np.array([1.0, -3.0, 0.0, 0.5])
    )
    assert grad["features"][2] == 0.0  # the subgradient 0 at 0, not jnp.abs's 1


def test_masks_exclude_leaves_like_the_base_model_weight():
    params = parameters()
    mask = {"base": False, "features": True, "bias": True}  # a prefix: one bool for the "bias" subtree
    expected = 0.1 * (1.0 + 3.0 + 0.0 + 0.5 + 1.0)
    np.testing.assert_allclose(losses.l1(params, 0.1, mask=mask), expected)
    np.testing.assert_allclose(losses.l1(params, 0.1, mask=lambda p: {**mask, "bias": False}), expected - 0.1)
    grad = jax.grad(lambda p: losses.l2(p, 1.0, mask=mask))(params)
    assert grad["base"] == 0.0
    np.testing.assert_allclose(grad["features"], params["features"])
    elementwise = {"base": True, "features": jnp.array([True, False, True, False]), "bias": False}
    np.testing.assert_allclose(losses.l2(params, 2.0, mask=elementwise), 4.0 + 1.0)


def test_penalties_keep_float32():
    params = {"w": jnp.ones(3, jnp.float32)}
    for value in (losses.l2(params), losses.l1(params), losses.elastic_net(params, 0.1, 0.2)):
        assert value.dtype == jnp.float32
