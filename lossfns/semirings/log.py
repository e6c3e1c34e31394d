"""The log semiring: sum-product in log space (log-partition, marginals)."""

import jax.numpy as jnp

from .base import Semiring, finite_max, logsumexp


class LogSemiring(Semiring):
    """`plus = logaddexp`, `times = +`, zero `-inf`, one `0`.

    `unconvert` gives the log of the semiring sum, e.g. `log Z`.
    """

    name = "log"

    def convert(self, scores):
        return scores

    def unconvert(self, value, log_scale):
        return value + log_scale

    def zero(self, shape, dtype):
        return jnp.full(shape, -jnp.inf, dtype)

    def one(self, shape, dtype):
        return jnp.zeros(shape, dtype)

    def times(self, a, b):
        return a + b

    def sum(self, a, axis):
        return logsumexp(a, axis)

    def normalize(self, a, axis):
        shift = finite_max(a, axis)
        return a - jnp.expand_dims(shift, axis), shift
