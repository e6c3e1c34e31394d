"""The k-max semiring: the k best scores, kept in a leading axis."""

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from .base import Semiring, finite_max


def _top_k_leading(x, k):
    """Top k along the leading axis (sorted, best first)."""
    moved = jnp.moveaxis(x, 0, -1)
    if moved.shape[-1] < k:
        pad = [(0, 0)] * (moved.ndim - 1) + [(0, k - moved.shape[-1])]
        moved = jnp.pad(moved, pad, constant_values=-jnp.inf)
    return jnp.moveaxis(jax.lax.top_k(moved, k)[0], -1, 0)


class KMaxSemiring(Semiring):
    """Values are arrays `[k, *logical]` of the k best scores, best first.

    `plus` merges two sorted lists and keeps the k best; `times` takes the k
    best of all pairwise sums. `lax.top_k` routes each derivative to exactly
    one element, so the gradient of the j-th best score is the indicator of
    one path even on ties (used by `lattices.chain.kbest`).
    """

    name = "kmax"

    def __init__(self, k: int):
        # numpy integers are ints too; bool is not (KMax(True) is a mistake).
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.k = int(k)

    def __repr__(self):
        return f"KMaxSemiring(k={self.k})"

    def convert(self, scores):
        rest = jnp.full((self.k - 1,) + scores.shape, -jnp.inf, scores.dtype)
        return jnp.concatenate([scores[None], rest], axis=0)

    def unconvert(self, value, log_scale):
        return jnp.moveaxis(value + log_scale, 0, -1)

    def zero(self, shape, dtype):
        return jnp.full((self.k,) + tuple(shape), -jnp.inf, dtype)

    def one(self, shape, dtype):
        return self.convert(jnp.zeros(shape, dtype))

    def times(self, a, b):
        pairs = a[:, None] + b[None, :]
        pairs = pairs.reshape((self.k * self.k,) + pairs.shape[2:])
        return _top_k_leading(pairs, self.k)

    def sum(self, a, axis):
        # Fold the summed logical axis into the leading candidate axis.
        moved = jnp.moveaxis(a, axis, 1)
        merged = moved.reshape((-1,) + moved.shape[2:])
        return _top_k_leading(merged, self.k)

    def normalize(self, a, axis):
        shift = finite_max(a[0], axis)
        return a - jnp.expand_dims(shift, axis), shift
