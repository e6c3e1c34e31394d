"""The real semiring's fast paths (`lattices.scaled_forward_backward`,
closed-form forward-backward derivatives; factored rows batch last, and
per-position potentials) against the generic log-semiring scan of `chain`,
whose derivatives are autodiff: values, gradients under uneven cotangents,
Hessians (forward over reverse mode), chains with no allowed path, empty rows
and batching. Enumeration checks of the Real semiring
(which now runs this path) are in test_chain.py and test_chain_rows.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import semirings, testing
from lossfns.lattices import FactoredPotentials, chain, scaled_forward_backward

B, T, L = 4, 7, 3


def problem(seed, forbid=True):
    """Rows of several chains with forbidden transitions; row 2 is empty,
    row 3 one chain of length 1 followed by a chain with no allowed path."""
    rng = np.random.default_rng(seed)
    transitions = rng.normal(size=(L, L))
    if forbid:
        transitions[0, 1] = transitions[2, 2] = -np.inf
    unary = rng.normal(size=(B, T, L))
    unary[3, 3] = -np.inf  # every label forbidden at one position of the second chain in row 3
    starts = np.zeros((B, T), bool)
    starts[0, [3, 5]] = starts[1, 2] = starts[3, 1] = True
    lengths = np.array([T, 5, 0, 4], np.int32)
    potentials = FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions), jnp.asarray(rng.normal(size=L)))
    return potentials, jnp.asarray(starts), jnp.asarray(lengths)


@functools.lru_cache(maxsize=None)
def weighted_gradient(semiring):
    """Value and gradient of `sum_b w_b log Z_b` over the rows with a finite log Z."""
    def total(potentials, starts, lengths, weights):
        log_z = chain.row_log_partition(potentials, starts, lengths, semiring=semiring)
        return jnp.sum(jnp.where(jnp.isfinite(log_z), weights * log_z, 0.0)), log_z
    return jax.jit(jax.value_and_grad(total, has_aux=True))


def test_values_and_uneven_cotangents_match_the_generic_scan():
    potentials, starts, lengths = problem(0)
    weights = jnp.asarray([0.5, -2.0, 3.0, 1.5])
    (_, fast), fast_grad = weighted_gradient(semirings.Real)(potentials, starts, lengths, weights)
    (_, generic), generic_grad = weighted_gradient(semirings.Log)(potentials, starts, lengths, weights)
    np.testing.assert_allclose(fast, generic, rtol=1e-12)
    assert fast[2] == 0.0 and fast[3] == -np.inf
    for got, want in zip(fast_grad, generic_grad):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=1e-12)
    # The chain with no allowed path contributes nothing; the chain before it does.
    assert np.all(fast_grad.unary[3, 1:4] == 0) and np.any(fast_grad.unary[0] != 0)


def test_hessian_matches_the_generic_scan():
    """`jax.hessian` is forward over reverse mode. (Finite differences of
    order two in both modes: test_chain.py's factored real checks.)"""
    potentials, _, _ = problem(1, forbid=False)
    lengths = jnp.asarray(3)

    def hessian(semiring):
        log_z = lambda u: chain.log_partition(FactoredPotentials(u, potentials.transitions, potentials.start),
                                              lengths, semiring=semiring)
        return jax.jit(jax.hessian(log_z))(potentials.unary[0, :4])

    np.testing.assert_allclose(hessian(semirings.Real), hessian(semirings.Log), atol=1e-12)


def assert_hessian_vector_products_match(potentials, starts, lengths):
    """Forward over reverse mode (jvp of grad) along a direction that is zero at -inf scores."""
    direction = jax.tree_util.tree_map(lambda x: jnp.where(jnp.isfinite(x), 0.1, 0.0), potentials)

    def hessian_vector(semiring):
        gradient = jax.grad(lambda p: jnp.sum(jnp.where(
            jnp.isfinite(log_z := chain.row_log_partition(p, starts, lengths, semiring=semiring)), log_z, 0.0)))
        return jax.jit(lambda p, d: jax.jvp(gradient, (p,), (d,))[1])(potentials, direction)

    for got, want in zip(hessian_vector(semirings.Real), hessian_vector(semirings.Log)):
        np.testing.assert_allclose(got, want, atol=1e-10)


def test_second_derivatives_of_rows_match_the_generic_scan():
    assert_hessian_vector_products_match(*problem(2))


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_batching_jit_and_loop_agree(jit):
    potentials, starts, lengths = problem(3)
    stacked = FactoredPotentials(jnp.stack([potentials.unary, 2 * potentials.unary]), potentials.transitions,
                                 potentials.start)
    run = lambda u: chain.row_log_partition(FactoredPotentials(u, potentials.transitions, potentials.start),
                                            starts, lengths, semiring=semirings.Real)
    run = jax.jit(run) if jit else run
    mapped = jax.vmap(run)(stacked.unary)
    looped = jnp.stack([run(u) for u in stacked.unary])
    both = chain.row_log_partition(stacked, jnp.stack([starts] * 2), jnp.stack([lengths] * 2), semiring=semirings.Real)
    np.testing.assert_allclose(mapped, looped, rtol=1e-12)
    np.testing.assert_allclose(both, looped, rtol=1e-12)


def test_no_positions():
    potentials = FactoredPotentials(jnp.zeros((2, 0, L)), jnp.zeros((L, L)), jnp.zeros(L))
    value, gradient = jax.value_and_grad(lambda u: jnp.sum(chain.log_partition(
        potentials._replace(unary=u), semiring=semirings.Real)))(potentials.unary)
    assert value == 0.0 and gradient.shape == (2, 0, L)


def test_edge_sums_after_the_scan_match_the_generic_scan():
    """Many labels and rows: the edge marginals come from one matrix product
    after the backward scan instead of sums inside it."""
    rng = np.random.default_rng(4)
    rows, labels = 90, 20
    assert not scaled_forward_backward._edge_sums_in_scan(labels, rows)
    transitions = rng.normal(size=(labels, labels))
    transitions[3, :5] = -np.inf
    potentials = FactoredPotentials(jnp.asarray(rng.normal(size=(rows, 5, labels))), jnp.asarray(transitions),
                                    jnp.asarray(rng.normal(size=labels)))
    starts = jnp.asarray(rng.random((rows, 5)) < 0.3)
    lengths = jnp.asarray(rng.integers(0, 6, size=rows), jnp.int32)
    weights = jnp.asarray(rng.normal(size=rows))
    (_, fast), fast_grad = weighted_gradient(semirings.Real)(potentials, starts, lengths, weights)
    (_, generic), generic_grad = weighted_gradient(semirings.Log)(potentials, starts, lengths, weights)
    np.testing.assert_allclose(fast, generic, rtol=1e-12)
    for got, want in zip(fast_grad, generic_grad):
        np.testing.assert_allclose(got, want, atol=1e-12)
    assert_hessian_vector_products_match(potentials, starts, lengths)


# ---------------------------------------------------------------------------
# Per-position potentials `[B, T, L, L]`
# ---------------------------------------------------------------------------


def per_position_problem(seed):
    """Per-position chains with forbidden transitions at some positions;
    lengths T, 4, 0 and 1; chain 4 has no allowed path (every edge into
    position 2 forbidden)."""
    rng = np.random.default_rng(seed)
    potentials = rng.normal(size=(5, T, L, L))
    potentials[0, 2, 0, 1] = potentials[1, 3, :, 2] = -np.inf
    potentials[4, 2] = -np.inf
    potentials[0, 5:, 1] = -np.inf  # rows past the length may hold anything
    return jnp.asarray(potentials), jnp.asarray([T, 4, 0, 1, T], jnp.int32)


@functools.lru_cache(maxsize=None)
def per_position_variant(keep, fused):
    """`log_partition_per_position` with its exponentiated potentials kept
    (`keep`) or exponentiated again in the backward pass, and its products
    fused (`fused`) or as batched dots, whatever the sizes."""
    def log_partition(potentials, lengths):
        module = scaled_forward_backward
        saved = module._KEEP_FACTORS_BYTES, module._FUSED_PRODUCTS_MAX_LABELS
        module._KEEP_FACTORS_BYTES = 2 ** 62 if keep else 0
        module._FUSED_PRODUCTS_MAX_LABELS = 2 ** 62 if fused else 0
        try:
            return module.log_partition_per_position(potentials, lengths)
        finally:
            module._KEEP_FACTORS_BYTES, module._FUSED_PRODUCTS_MAX_LABELS = saved
    return log_partition


def weighted_total(log_partition, potentials, lengths, weights):
    log_z = log_partition(potentials, lengths)
    return jnp.sum(jnp.where(jnp.isfinite(log_z), weights * log_z, 0.0))


@pytest.mark.parametrize("keep, fused", [(True, True), (False, False)], ids=["kept-fused", "recomputed-dot"])
def test_per_position_values_gradients_and_hessian_vector_products(keep, fused):
    potentials, lengths = per_position_problem(5)
    weights = jnp.asarray([0.5, -2.0, 3.0, 1.5, 1.0])
    generic = lambda p, n: chain.log_partition(p, n, semiring=semirings.Log)
    fast = per_position_variant(keep, fused)
    np.testing.assert_allclose(jax.jit(fast)(potentials, lengths), generic(potentials, lengths), rtol=1e-12)
    assert fast(potentials, lengths)[2] == 0.0 and fast(potentials, lengths)[4] == -np.inf

    gradient = lambda log_partition: jax.grad(lambda p: weighted_total(log_partition, p, lengths, weights))
    got, want = jax.jit(gradient(fast))(potentials), jax.jit(gradient(generic))(potentials)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert np.all(got[4] == 0) and np.all(got[1, 4:] == 0) and np.all(got[:, 0, 1:] == 0)

    direction = jnp.where(jnp.isfinite(potentials), 0.1, 0.0)
    hessian_vector = lambda log_partition: jax.jit(
        lambda p, d: jax.jvp(gradient(log_partition), (p,), (d,))[1])(potentials, direction)
    np.testing.assert_allclose(hessian_vector(fast), hessian_vector(generic), atol=1e-10)


def test_per_position_dispatch_batching_and_no_positions():
    """`chain.log_partition` with `Real` runs this path for any batch shape, as
    vmap, jit and a loop do; T = 0 gives log Z = 0 and an empty gradient."""
    potentials, lengths = per_position_problem(6)
    stacked = jnp.stack([potentials, 2 * potentials])
    real = lambda p, n: chain.log_partition(p, n, semiring=semirings.Real)
    looped = jnp.stack([scaled_forward_backward.log_partition_per_position(p, lengths) for p in stacked])
    np.testing.assert_allclose(real(stacked, jnp.stack([lengths] * 2)), looped, rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(jax.jit(real), (0, None))(stacked, lengths), looped, rtol=1e-12)
    np.testing.assert_allclose(looped, jnp.stack([chain.log_partition(p, lengths) for p in stacked]), rtol=1e-12)
    empty = jnp.zeros((2, 0, L, L))
    value, gradient = jax.value_and_grad(lambda p: jnp.sum(real(p, None)))(empty)
    assert value == 0.0 and gradient.shape == (2, 0, L, L)
