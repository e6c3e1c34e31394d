"""Semiring laws and the -inf-exact logsumexp."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import semirings, testing

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

SEMIRINGS = [semirings.Log, semirings.Max, semirings.Real, semirings.Entropy, semirings.KMax(3), semirings.Counting]


def test_logsumexp_all_minus_inf_gives_minus_inf_and_zero_gradients():
    x = jnp.full((4,), -jnp.inf)
    assert semirings.logsumexp(x, -1) == -jnp.inf
    assert np.all(np.asarray(jax.grad(lambda v: semirings.logsumexp(v, -1))(x)) == 0)
    assert np.all(np.asarray(jax.hessian(lambda v: semirings.logsumexp(v, -1))(x)) == 0)
    # jax.nn.logsumexp is the trap this guards against (NUMERICS.md 1).
    assert np.isnan(np.asarray(jax.grad(jax.nn.logsumexp)(x))).any()


def test_logsumexp_mixed_minus_inf_matches_finite_part():
    x = jnp.asarray([-jnp.inf, 1.0, 2.0, -jnp.inf])
    finite = jnp.asarray([1.0, 2.0])
    np.testing.assert_allclose(semirings.logsumexp(x, -1), jax.nn.logsumexp(finite))
    grad = jax.grad(lambda v: semirings.logsumexp(v, -1))(x)
    np.testing.assert_allclose(grad, [0.0, *jax.nn.softmax(finite), 0.0], rtol=1e-12)
    testing.check_gradients(lambda v: semirings.logsumexp(v, 0), (jnp.asarray([[0.3, -1.0], [2.0, 0.5]]),), order=2)


def test_logsumexp_large_values_do_not_overflow():
    x = jnp.asarray([1e30, 1e30], jnp.float32)
    assert float(semirings.logsumexp(x, -1)) == pytest.approx(1e30)


def _random_value(semiring, rng, shape):
    return semiring.convert(jnp.asarray(np.where(rng.random(shape) < 0.2, -np.inf, rng.normal(size=shape))))


def _close(semiring, a, b):
    out_a = semiring.unconvert(semiring.sum(semiring.expand_dims(a, -1), -1), jnp.zeros(()))
    out_b = semiring.unconvert(semiring.sum(semiring.expand_dims(b, -1), -1), jnp.zeros(()))
    np.testing.assert_allclose(np.asarray(out_a), np.asarray(out_b), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("semiring", SEMIRINGS, ids=lambda s: s.name)
def test_semiring_laws(semiring):
    rng = np.random.default_rng(0)
    a, b, c = (_random_value(semiring, rng, (5,)) for _ in range(3))
    one, zero = semiring.one((5,), jnp.float64), semiring.zero((5,), jnp.float64)
    stack = lambda *xs: jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves, axis=-1), *xs)
    plus = lambda x, y: semiring.sum(stack(x, y), -1)
    _close(semiring, semiring.times(a, one), a)
    _close(semiring, plus(a, zero), a)
    _close(semiring, semiring.times(semiring.times(a, b), c), semiring.times(a, semiring.times(b, c)))
    _close(semiring, plus(plus(a, b), c), plus(a, plus(b, c)))
    if semiring.name not in ("kmax",):  # k-max distributes only up to truncation at k
        _close(semiring, semiring.times(a, plus(b, c)), plus(semiring.times(a, b), semiring.times(a, c)))


@pytest.mark.parametrize("semiring", SEMIRINGS, ids=lambda s: s.name)
def test_matmul_is_associative_and_vecmat_agrees(semiring):
    rng = np.random.default_rng(1)
    a, b, c = (_random_value(semiring, rng, (3, 3)) for _ in range(3))
    v = _random_value(semiring, rng, (3,))
    left = semiring.matmul(semiring.matmul(a, b), c)
    right = semiring.matmul(a, semiring.matmul(b, c))
    total = lambda m: semiring.unconvert(semiring.sum(semiring.sum(m, -1), -1), jnp.zeros(()))
    np.testing.assert_allclose(np.asarray(total(left)), np.asarray(total(right)), rtol=1e-10)
    row = semiring.vecmat(v, a)
    via_matmul = jax.tree_util.tree_map(lambda x: x[..., 0, :], semiring.matmul(semiring.expand_dims(v, -2), a))
    np.testing.assert_allclose(
        np.asarray(total(semiring.expand_dims(row, -2))),
        np.asarray(total(semiring.expand_dims(via_matmul, -2))),
        rtol=1e-10,
    )


def test_semirings_are_hashable_static_arguments():
    assert semirings.KMax(2) == semirings.KMax(2) and hash(semirings.KMax(2)) == hash(semirings.KMax(2))
    assert semirings.KMax(2) != semirings.KMax(3)
    with pytest.raises(ValueError, match="k must be a positive int"):
        semirings.KMax(0)
