"""The counting semiring: the number of paths with a finite score."""

import jax.numpy as jnp

from .base import Semiring
from .real import RealSemiring


class CountingSemiring(RealSemiring):
    """Real arithmetic on path indicators: `convert` maps a finite score to 1
    and `-inf` (a forbidden transition) to 0, so the forward sum counts the
    allowed paths. `unconvert` returns the count itself (a float, which
    overflows to `inf` for astronomically many paths).
    """

    name = "counting"

    def convert(self, scores):
        return jnp.where(scores > -jnp.inf, 1.0, 0.0).astype(scores.dtype)

    # Indicators need no shift: use the unscaled conversion of the base class.
    convert_scaled = Semiring.convert_scaled

    def unconvert(self, value, log_scale):
        return value * jnp.exp(log_scale)

    def normalize(self, a, axis):
        # Counts are exact integers in floating point; dividing them would
        # make them inexact, so no rescaling (they overflow only past ~1e308).
        return a, jnp.zeros(a.shape[: a.ndim + axis] + a.shape[a.ndim + axis + 1 :], a.dtype)
