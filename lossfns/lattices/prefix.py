"""Log forward scores at every position of a chain (`forward_scores`).

`chain.forward` returns only each chain's total; a truncated
forward-backward (Lavergne et al. 2010, section 4.1, used by
`optimizers.bcd`) needs the forward scores at every position, so that a
chain can be resumed from stored scores and the backward scores are the
forward scores of the reversed chain. They come from the one chain scan
(`kernel.scan`, its exact log steps) as `chain.forward`'s do, split into a max-normalised shape
and a log scale so that float32 keeps its precision on long chains.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import semirings
from . import chain, kernel


class ForwardScores(NamedTuple):
    """Log forward scores, split for precision into a per-position shape and
    scale: `log alpha_t(j) = scores[..., t, j] + log_scale[..., t]`.

    scores: `[..., T, L]`, maximum 0 over the labels at each position inside
    the length; log_scale: `[..., T]`. Positions at or past each length
    repeat the last position's values.
    """

    scores: jax.Array
    log_scale: jax.Array


def _segment_cumsum(scales, starts):
    """The running sum of `scales [T]`, restarted at each of `starts [T]`."""
    total = jnp.cumsum(scales)
    positions = jnp.arange(scales.shape[0])
    first = jax.lax.cummax(jnp.where(starts, positions, 0), axis=0)
    before = total[jnp.maximum(first - 1, 0)]
    return total - jnp.where(first > 0, before, 0.0)


def _forward_scores_instance(potentials, length, starts):
    """`ForwardScores` of one row (`scores [T, L]`, `log_scale [T]`)."""
    _, forward = kernel.scan(semirings.Log, potentials, length, starts, keep_values=True)
    own_starts = kernel.row_starts(starts, length)
    return ForwardScores(forward.values, _segment_cumsum(forward.scales, own_starts))


def forward_scores(potentials, lengths=None, starts=None) -> ForwardScores:
    """Log forward scores at every position: `log alpha_t(j)`, the log-sum of
    the scores of all label sequences of the chain up to position `t` that
    end in label `j` (the `alpha` of the forward-backward algorithm).

    Exact (the log semiring's values, from the one chain scan of
    `lattices.kernel` with its exact steps). What a truncated
    forward-backward needs (Lavergne et al. 2010, section 4.1): the backward
    scores are the forward scores of the reversed chain, and
    `logsumexp(scores[..., t, :] + log_scale[..., t])` at a chain's last
    position is its `log_partition`.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      starts: `[..., T]` bool or None: rows of back-to-back chains, each
        chain's scores restarting at its first position (as `row_forward`).
    Returns:
      `ForwardScores(scores [..., T, L], log_scale [..., T])`.
    """
    form, lengths, batch_shape, T, L = chain._prepare(potentials, lengths)
    starts = jnp.zeros(batch_shape + (T,), bool) if starts is None else chain._as_starts(starts, batch_shape + (T,))
    if T == 0 or math.prod(batch_shape) == 0:
        dtype = form.dtype
        return ForwardScores(jnp.zeros(batch_shape + (T, L), dtype), jnp.zeros(batch_shape + (T,), dtype))
    return chain._map_batch(_forward_scores_instance, form, lengths, starts)
