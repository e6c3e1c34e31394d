"""The entropy semiring (Li & Eisner 2009, in log space): values are pytrees."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .base import Semiring, finite_max, logsumexp


class EntropyValue(NamedTuple):
    """A pair of arrays of one shape: `log_mass` (log of the unnormalised
    mass) and `entropy` (entropy of the paths summarised by this value)."""

    log_mass: jax.Array
    entropy: jax.Array


class EntropySemiring(Semiring):
    """`unconvert` gives the entropy `H(P) = log Z - E_P[s]` of the path
    distribution. Sum: `log_mass = logsumexp`, `entropy = sum_i p_i (H_i -
    log p_i)` with `p = softmax(log_mass)`; times adds both components.
    """

    name = "entropy"

    def convert(self, scores):
        return EntropyValue(scores, jnp.zeros_like(scores))

    def unconvert(self, value, log_scale):
        return value.entropy

    def zero(self, shape, dtype):
        return EntropyValue(jnp.full(shape, -jnp.inf, dtype), jnp.zeros(shape, dtype))

    def one(self, shape, dtype):
        return EntropyValue(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def times(self, a, b):
        return EntropyValue(a.log_mass + b.log_mass, a.entropy + b.entropy)

    def sum(self, a, axis):
        log_mass = logsumexp(a.log_mass, axis)
        finite = jnp.isfinite(a.log_mass) & jnp.isfinite(jnp.expand_dims(log_mass, axis))
        # Guard both branches: empty entries carry p = 0 and must add exactly 0.
        log_p = jnp.where(finite, a.log_mass - jnp.where(finite, jnp.expand_dims(log_mass, axis), 0.0), 0.0)
        p = jnp.where(finite, jnp.exp(log_p), 0.0)
        entropy = jnp.sum(jnp.where(finite, p * (a.entropy - log_p), 0.0), axis=axis)
        return EntropyValue(log_mass, entropy)

    def normalize(self, a, axis):
        shift = finite_max(a.log_mass, axis)
        return EntropyValue(a.log_mass - jnp.expand_dims(shift, axis), a.entropy), shift
