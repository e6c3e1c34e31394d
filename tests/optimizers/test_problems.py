"""Small test problems shared by the optimizer tests, their reference solvers
(proximal gradient), and checks that the problems themselves are right
(the CRF objective against brute-force enumeration)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from lossfns import testing
from lossfns.lattices import chain

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

NUM_LABELS = 3


class CrfData(NamedTuple):
    """features: `[N, T, F]` binary observation tests; labels: `[N, T]`; lengths: `[N]`."""

    features: jax.Array
    labels: jax.Array
    lengths: jax.Array


def make_crf_data(seed=0, num_sequences=24, max_length=5, num_features=10, num_labels=NUM_LABELS) -> CrfData:
    """Sequences sampled from a random sparse CRF, so the L1 solution is sparse but not empty.

    Concrete arrays even when first called inside a trace (callers cache it)."""
    with jax.ensure_compile_time_eval():
        return _sample_crf_data(seed, num_sequences, max_length, num_features, num_labels)


def _sample_crf_data(seed, num_sequences, max_length, num_features, num_labels):
    rng = np.random.default_rng(seed)
    features = (rng.random((num_sequences, max_length, num_features)) < 0.3).astype(np.float64)
    features[..., 0] = 1.0  # a bias test, active everywhere
    emission = rng.normal(size=(num_features, num_labels)) * 2.0
    emission[num_features // 2 :] = 0.0
    transitions = rng.normal(size=(num_labels, num_labels))
    lengths = rng.integers(1, max_length + 1, size=num_sequences)
    potentials = chain.FactoredPotentials(jnp.asarray(features @ emission), jnp.asarray(transitions))
    labels = chain.sample(jax.random.PRNGKey(seed), potentials, jnp.asarray(lengths))
    labels = jnp.where(labels < 0, 0, labels)
    return CrfData(jnp.asarray(features), labels.astype(jnp.int32), jnp.asarray(lengths, jnp.int32))


def crf_init(num_features=10, num_labels=NUM_LABELS):
    return {"emission": jnp.zeros((num_features, num_labels)), "transitions": jnp.zeros((num_labels, num_labels))}


def crf_potentials(params, features):
    return chain.FactoredPotentials(features @ params["emission"], params["transitions"])


def crf_loss(params, data: CrfData):
    """Summed CRF negative log-likelihood `sum_i log Z(x_i) - s(x_i, y_i)`."""
    potentials = crf_potentials(params, data.features)
    return jnp.sum(chain.log_partition(potentials, data.lengths) - chain.score(potentials, data.labels, data.lengths))


@functools.cache
def crf_problem():
    """The shared CRF objective `params -> crf_loss(params, make_crf_data())`
    (one object, so jitted functions taking it as a static argument compile once)."""
    return functools.partial(crf_loss, data=make_crf_data())


@functools.cache
def crf_value_and_grad():
    """Jitted `value_and_grad` of the shared CRF objective (compiled once for all tests)."""
    return jax.jit(jax.value_and_grad(crf_problem()))


@functools.cache
def crf_reference(l1: float):
    """A long proximal-gradient solution of the shared CRF problem with L1 `l1`."""
    return proximal_gradient(crf_problem(), crf_init(), l1, 3000)


@functools.partial(jax.jit, static_argnames=("fun", "num_steps"))
def proximal_gradient(fun, params, l1, num_steps):
    """Reference L1 solver: FISTA with backtracking and adaptive restart,
    `num_steps` iterations on `fun(params) + l1 ||params||_1`."""
    x0, unravel = ravel_pytree(params)
    smooth = lambda x: fun(unravel(x))
    value_and_grad = jax.value_and_grad(smooth)
    soft = lambda z, r: jnp.sign(z) * jnp.maximum(jnp.abs(z) - r, 0.0)
    total = lambda x: smooth(x) + l1 * jnp.sum(jnp.abs(x))

    def body(_, carry):
        x, y, momentum, lipschitz = carry
        fy, gy = value_and_grad(y)

        def cond(lip):
            p = soft(y - gy / lip, l1 / lip)
            return smooth(p) > fy + gy @ (p - y) + 0.5 * lip * jnp.sum((p - y) ** 2) + 1e-13 * jnp.abs(fy)

        lipschitz = jax.lax.while_loop(cond, lambda lip: lip * 2.0, lipschitz * 0.9)
        x_new = soft(y - gy / lipschitz, l1 / lipschitz)
        restart = total(x_new) > total(x)
        momentum_new = jnp.where(restart, 1.0, (1 + jnp.sqrt(1 + 4 * momentum**2)) / 2)
        y_new = jnp.where(restart, x_new, x_new + (momentum - 1) / momentum_new * (x_new - x))
        return x_new, y_new, momentum_new, lipschitz

    x, _, _, _ = jax.lax.fori_loop(0, num_steps, body, (x0, x0, jnp.asarray(1.0, x0.dtype), jnp.asarray(1.0, x0.dtype)))
    return unravel(x)


def test_crf_loss_matches_brute_force_enumeration():
    data = make_crf_data(num_sequences=4)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(np.random.default_rng(1).normal(size=x.shape)), crf_init())
    potentials = crf_potentials(params, data.features)
    expected = np.sum(
        testing.log_partition(potentials, data.lengths) - testing.sequence_score(potentials, data.labels, data.lengths)
    )
    np.testing.assert_allclose(crf_loss(params, data), expected, rtol=1e-12)


def test_proximal_gradient_reaches_a_subgradient_optimum():
    l1 = 2.0
    solution = crf_reference(l1)
    theta, _ = ravel_pytree(solution)
    grad, _ = ravel_pytree(crf_value_and_grad()(solution)[1])
    # Optimality: grad = -l1 sign(theta) on the support, |grad| <= l1 off it.
    # (3000 first-order steps: KKT residual about 1e-6; OWL-QN's objective agrees to 1e-12.)
    np.testing.assert_allclose(np.where(theta != 0, grad + l1 * np.sign(theta), 0.0), 0.0, atol=1e-5)
    assert np.all(np.abs(np.where(theta == 0, grad, 0.0)) <= l1 + 1e-5)
    assert 0 < np.sum(theta != 0) < theta.size


def assert_resume_bit_identical(step_fn, loop, stop_fn, interrupt_at, path):
    """Run `loop` to the end in one go, and again stopped after
    `interrupt_at` steps, saved with equinox, reloaded and continued: every
    leaf of the two final `LoopState`s must be bit-identical."""
    import equinox as eqx

    from lossfns.optimizers.minimize import run_loop_jit

    run = lambda state, until: run_loop_jit(step_fn, state, until, stop_fn)
    max_steps = loop.trace.shape[0]
    straight = run(loop, max_steps)
    assert int(straight.step) > interrupt_at, "the interruption must fall inside the run"
    eqx.tree_serialise_leaves(path, run(loop, interrupt_at))
    resumed = run(eqx.tree_deserialise_leaves(path, loop), max_steps)
    for a, b in zip(jax.tree_util.tree_leaves(straight), jax.tree_util.tree_leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return straight


def linear_potentials(theta, features):
    """A CRF linear in a flat `theta [F * L + L * L]`, for one sequence `features [T, F]`."""
    num_features = features.shape[-1]
    emission = theta[: num_features * NUM_LABELS].reshape(num_features, NUM_LABELS)
    transitions = theta[num_features * NUM_LABELS :].reshape(NUM_LABELS, NUM_LABELS)
    return chain.FactoredPotentials(features @ emission, transitions)


def num_linear_parameters(num_features=10):
    return num_features * NUM_LABELS + NUM_LABELS * NUM_LABELS
