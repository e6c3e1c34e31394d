"""The max (tropical, Viterbi) semiring."""

import jax.numpy as jnp

from .base import LogDomainSemiring


class MaxSemiring(LogDomainSemiring):
    """`plus = max`, `times = +`, zero `-inf`, one `0`: the best-path score.

    The derivative of `max` splits evenly among exact ties, so best paths are
    decoded with explicit back-pointers (`lattices.chain.viterbi`), not by
    differentiating this semiring.
    """

    name = "max"

    def sum(self, a, axis):
        return jnp.max(a, axis=axis)
