"""The max (tropical, Viterbi) semiring."""

import jax.numpy as jnp

from .base import Semiring, finite_max


class MaxSemiring(Semiring):
    """`plus = max`, `times = +`, zero `-inf`, one `0`: the best-path score.

    The derivative of `max` splits evenly among exact ties, so best paths are
    decoded with explicit back-pointers (`lattices.chain.viterbi`), not by
    differentiating this semiring.
    """

    name = "max"

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
        return jnp.max(a, axis=axis)

    def normalize(self, a, axis):
        shift = finite_max(a, axis)
        return a - jnp.expand_dims(shift, axis), shift
