"""The semiring interface shared by every forward algorithm in lossfns.

A semiring value is a pytree of arrays. All of its leaves share the *logical*
shape of the value as trailing dimensions; a semiring may put extra leading
dimensions in front (the k-max semiring keeps its k scores in a leading axis),
so algorithms address logical axes with negative indices only.

Scores enter a semiring in log space (`convert`) and leave it through
`unconvert`, which also receives the log of the scale factors that the
algorithms divided out along the way (per-step renormalisation).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def logsumexp(x: jax.Array, axis: int = -1) -> jax.Array:
    """`log(sum(exp(x), axis))` that is exact and NaN-free at `-inf`.

    An all-`-inf` slice gives `-inf` with a zero gradient, and `-inf` entries
    among finite ones get a zero gradient (jax.nn.logsumexp gives NaN for the
    first case); NaN stays NaN. A custom JVP rather than a VJP, so forward
    mode, reverse mode and any order of derivatives all work.

    Args:
      x: an array, e.g. `[..., N]`.
      axis: the axis summed over.

    Returns:
      `x`'s shape without `axis`, e.g. `[...]`.
    """
    return _logsumexp_parts(x, axis)[0]


def _logsumexp_parts(x, axis):
    """`(logsumexp(x), softmax(x))` from one pass of shifted exponentials.

    The weights are normalised by the sum itself rather than computed as
    `exp(x - logsumexp(x))`, which is off when `log(sum)` is lost to rounding
    next to huge scores; they are zero where the whole slice is `-inf`.
    """
    peak = jnp.max(x, axis=axis, keepdims=True)
    peak = jax.lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))
    shifted = jnp.exp(x - peak)
    total = jnp.sum(shifted, axis=axis, keepdims=True)
    positive = total > 0
    safe_total = jnp.where(positive, total, 1.0)
    # NaN must stay NaN (never be read as an empty sum).
    empty = jnp.where(jnp.isnan(total), jnp.nan, -jnp.inf)
    out = jnp.where(positive, jnp.log(safe_total) + peak, empty)
    return jnp.squeeze(out, axis=axis), shifted / safe_total


@logsumexp.defjvp
def _logsumexp_jvp(axis, primals, tangents):
    (x,), (dx,) = primals, tangents
    out, weights = _logsumexp_parts(x, axis)
    # The weights are exactly zero at -inf entries; masking dx keeps an
    # infinite or NaN tangent there from leaking in as 0 * inf.
    dx = jnp.where(weights > 0, dx, 0.0)
    return out, jnp.sum(weights * dx, axis=axis)


def finite_max(x: jax.Array, axis) -> jax.Array:
    """Maximum over `axis` with `-inf` replaced by 0 where nothing is finite.

    Used as a shift under `stop_gradient`: the quantity it shifts is exactly
    invariant to the shift, so no derivative flows through it.

    Args:
      x: an array.
      axis: the axis (or axes) reduced.

    Returns:
      `x`'s shape without `axis`, with no derivative.
    """
    peak = jnp.max(x, axis=axis)
    return jax.lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))


def pairwise_sum(x: jax.Array) -> jax.Array:
    """Sum over the leading axis as a balanced tree: rounding error grows like
    log T, not T, when summing T per-step log normalisers in float32.

    Args:
      x: `[T, ...]`.

    Returns:
      `[...]`.
    """
    while x.shape[0] > 1:
        if x.shape[0] % 2:
            x = jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)])
        x = x[0::2] + x[1::2]
    return x[0] if x.shape[0] else jnp.zeros(x.shape[1:], x.dtype)


class Semiring:
    """Base class: the operations an algorithm over a semiring may use.

    Subclasses implement `convert`, `unconvert`, `zero`, `one`, `times`,
    `sum` and `normalize`; `vecmat`, `matmul` and `select` have generic
    definitions in terms of those that a subclass may replace by a faster one.
    Semirings are immutable and hashable, so they can be static arguments of
    `jax.jit`.
    """

    name: str = "semiring"

    # -- conversion -------------------------------------------------------
    def convert(self, scores: jax.Array):
        """Lift log-space scores (any shape) into semiring values."""
        raise NotImplementedError

    def convert_scaled(self, scores: jax.Array, axes: tuple[int, ...]):
        """Lift scores with a per-slice shift divided out over `axes`.

        Returns `(value, log_shift)` with `log_shift` of the scores' shape
        less `axes`; `unconvert` must be given the accumulated shifts. Only
        the real semiring needs this (to keep `exp` from overflowing).
        """
        shape = tuple(s for i, s in enumerate(scores.shape) if i - scores.ndim not in axes)
        return self.convert(scores), jnp.zeros(shape, scores.dtype)

    def unconvert(self, value, log_scale: jax.Array) -> jax.Array:
        """The semiring's output for `value` times `exp(log_scale)`."""
        raise NotImplementedError

    # -- constants --------------------------------------------------------
    def zero(self, shape, dtype):
        raise NotImplementedError

    def one(self, shape, dtype):
        raise NotImplementedError

    # -- arithmetic -------------------------------------------------------
    def times(self, a, b):
        raise NotImplementedError

    def sum(self, a, axis: int):
        """Semiring sum over the logical axis `axis` (negative)."""
        raise NotImplementedError

    def normalize(self, a, axis: int):
        """Divide `a` by a scale along `axis`; returns `(a', log_scale)`.

        `log_scale` has the logical shape of `a` without `axis`; it is
        `-inf`-free where `a` is all zeros (then it is 0 for log-like
        semirings). Used to keep long products in range (float32 drift).
        """
        raise NotImplementedError

    # -- derived operations (generic; subclasses may specialise) -----------
    def select(self, mask: jax.Array, a, b):
        """`a` where `mask`, else `b`; `mask` has the logical shape (or broadcasts)."""
        return jax.tree_util.tree_map(lambda x, y: jnp.where(mask, x, y), a, b)

    def expand_dims(self, a, axis: int):
        return jax.tree_util.tree_map(lambda x: jnp.expand_dims(x, axis), a)

    def vecmat(self, vector, matrix):
        """`[..., L] x [..., L, M] -> [..., M]` in the semiring."""
        return self.sum(self.times(self.expand_dims(vector, -1), matrix), -2)

    def matmul(self, left, right):
        """`[..., L, M] x [..., M, N] -> [..., L, N]` in the semiring."""
        product = self.times(self.expand_dims(left, -1), self.expand_dims(right, -3))
        return self.sum(product, -2)

    def __repr__(self):
        return f"{type(self).__name__}()"

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self):
        return hash((type(self), tuple(sorted(vars(self).items()))))


class LogDomainSemiring(Semiring):
    """Values are log-scores: `times = +`, zero `-inf`, one `0`, normalised by
    the finite maximum. Subclasses define only `sum` (`logaddexp`, `max`, ...)."""

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

    def normalize(self, a, axis):
        shift = finite_max(a, axis)
        return a - jnp.expand_dims(shift, axis), shift
