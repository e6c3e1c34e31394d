"""`lossfns.testing.check_gradients` (JAX's `check_grads` in float64) catches wrong derivatives of each order and mode."""

import jax
import jax.numpy as jnp
import pytest

from lossfns import testing

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

ARGS = (jnp.asarray([0.3, -1.2, 2.0]),)


def _with_derivative(derivative):
    """`sum(sin(x))` whose JVP rule is `derivative(x) * tangent`."""

    @jax.custom_jvp
    def f(x):
        return jnp.sum(jnp.sin(x))

    f.defjvp(lambda primals, tangents: (f(*primals), jnp.sum(derivative(*primals) * tangents[0])))
    return f


def test_passes_exact_derivatives_of_order_two_in_both_modes():
    testing.check_gradients(_with_derivative(jnp.cos), ARGS, order=2)


@pytest.mark.parametrize("modes", [("fwd",), ("rev",)])
def test_a_wrong_first_derivative_fails_in_each_mode(modes):
    with pytest.raises(AssertionError):
        testing.check_gradients(_with_derivative(lambda x: 1.01 * jnp.cos(x)), ARGS, order=1, modes=modes)


@pytest.mark.parametrize("modes", [("fwd",), ("rev",)])
def test_a_wrong_second_derivative_fails_only_at_order_two(modes):
    # cos(x) at float64 through a function whose own derivative is zero: right
    # first derivative, wrong (zero) second derivative.
    frozen_cosine = jax.custom_jvp(jnp.cos)
    frozen_cosine.defjvp(lambda primals, tangents: (jnp.cos(*primals), jnp.zeros_like(tangents[0])))
    f = _with_derivative(frozen_cosine)
    testing.check_gradients(f, ARGS, order=1, modes=modes)
    with pytest.raises(AssertionError):
        testing.check_gradients(f, ARGS, order=2, modes=modes)
