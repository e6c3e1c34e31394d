"""The real (probability-space) semiring with scaling, as CRFsuite and Wapiti use."""

import jax
import jax.numpy as jnp

from .base import Semiring, finite_max


class RealSemiring(Semiring):
    """`plus = +`, `times = *` on `exp(scores)`; `unconvert` returns the log
    of the sum (e.g. `log Z`), like the log semiring.

    Products are matrix products (no `exp`/`log` in the inner loop); values
    stay in range because algorithms shift scores before `exp`
    (`convert_scaled`) and renormalise (`normalize`), keeping the logs.
    Unchecked, that loses any mass that falls more than the float range
    behind the leading term, so no public algorithm runs it unchecked:
    `chain` computes `log Z` for `Real` with the exact kernel
    (`lattices.kernel`, the same computation as `Log`), and `dag` shifts
    every state by its own best in-arc, which keeps each state's largest
    term exactly 1.
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
