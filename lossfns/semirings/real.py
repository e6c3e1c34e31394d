"""The real (probability-space) semiring with scaling, as CRFsuite and Wapiti use."""

import jax
import jax.numpy as jnp

from .base import Semiring, finite_max


class RealSemiring(Semiring):
    """`plus = +`, `times = *` on `exp(scores)`; the fast CPU path.

    Products are matrix products (no `exp`/`log` in the inner loop). Values
    never leave a safe range because the algorithms shift scores by their
    per-step maximum before `exp` (`convert_scaled`) and renormalise the
    carried vector at every step (`normalize`), keeping the logs of both.
    `unconvert` returns the log of the sum, e.g. `log Z`, like the log
    semiring. Probabilities below the float range of a step underflow to 0;
    use the log semiring where exact `-inf` structure with huge score ranges
    matters more than speed.
    """

    name = "real"

    def convert(self, scores):
        return jnp.exp(scores)

    def convert_scaled(self, scores, axes):
        shift = finite_max(scores, axes)
        return jnp.exp(scores - jnp.expand_dims(shift, axes)), shift

    def unconvert(self, value, log_scale):
        positive = value > 0
        empty = jnp.where(jnp.isnan(value), jnp.nan, -jnp.inf)
        return jnp.where(positive, jnp.log(jnp.where(positive, value, 1.0)), empty) + log_scale

    def zero(self, shape, dtype):
        return jnp.zeros(shape, dtype)

    def one(self, shape, dtype):
        return jnp.ones(shape, dtype)

    def times(self, a, b):
        return a * b

    def sum(self, a, axis):
        return jnp.sum(a, axis=axis)

    def normalize(self, a, axis):
        total = jax.lax.stop_gradient(jnp.sum(a, axis=axis))
        positive = total > 0
        safe = jnp.where(positive, total, 1.0)
        return a / jnp.expand_dims(safe, axis), jnp.log(safe)

    def vecmat(self, vector, matrix):
        return jnp.einsum("...i,...ij->...j", vector, matrix)

    def matmul(self, left, right):
        return jnp.matmul(left, right)
