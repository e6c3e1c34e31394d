"""Log forward scores at every position of a chain (`forward_scores`), and
the exact log node marginals they give with the reversed chain's
(`log_node_marginals`).

`chain.forward` returns only each chain's total; a truncated forward-backward
(Lavergne et al. 2010, section 4.1, used by `training.bcd`) resumes chains from
stored scores, and the backward scores are the forward scores of the reversed
chain. They come from the one chain scan (`kernel.scan`, its exact log steps),
split into a max-normalised shape and a log scale so that float32 keeps its
precision on long chains.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import semirings
from . import chain, kernel
from .forms import reversed_in_time


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
    form, lengths, batch_shape, T, L = chain.prepare_inputs(potentials, lengths)
    starts = jnp.zeros(batch_shape + (T,), bool) if starts is None else chain.as_starts(starts, batch_shape + (T,))
    if T == 0 or math.prod(batch_shape) == 0:
        dtype = form.dtype
        return ForwardScores(jnp.zeros(batch_shape + (T, L), dtype), jnp.zeros(batch_shape + (T,), dtype))
    return chain.map_batch(_forward_scores_instance, form, lengths, starts)


def _all_forward_scores(potentials, lengths, algorithm: str) -> jax.Array:
    """Log forward scores `[..., T, L]` up to a constant per position: the
    sequential scan's max-normalised shapes (`forward_scores`), or, for the
    parallel algorithm, row 0 of every prefix product of the chain's
    `[T, L, L]` matrices (`lax.associative_scan` of the exact
    `kernel.log_matmul`: O(T L^3) work, O(log T) depth)."""
    if algorithm == "sequential":
        return forward_scores(potentials, lengths).scores
    dense = chain.prepare_inputs(potentials, lengths)[0].dense_scores()  # the reversed form comes unchecked
    return jax.lax.associative_scan(kernel.log_matmul, dense, axis=lengths.ndim)[..., 0, :]


def log_node_marginals(potentials, lengths=None, *, algorithm: str = "auto") -> jax.Array:
    """`log P(y_t = j | x)`, `[..., T, L]`, exact in log space: `-inf` for
    a label no allowed sequence takes at `t`, and past each length.

    `log chain.node_marginals` underflows to `-inf` once a marginal falls
    below the float range (1e-38 in float32, at score differences of about
    90), where this stays finite. Forward-backward: the forward scores plus
    the forward scores of the reversed chain (the backward scores),
    normalised over the labels at each position. The marginals at a
    position sum to 1, so that normalisation absorbs every per-position
    scale and no large `log alpha + log beta - log Z` difference is formed:
    with the sequential scan's max-normalised scores, float32 keeps its
    precision on long chains. Differentiable (autodiff of the scans),
    NaN-free at `-inf` scores.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as `chain.forward`.
    """
    form, lengths, batch_shape, T, L = chain.prepare_inputs(potentials, lengths)
    algorithm = chain.resolve_algorithm(T, L, algorithm=algorithm)
    if T == 0 or math.prod(batch_shape) == 0:
        return jnp.full(batch_shape + (T, L), -jnp.inf, form.dtype)
    forward = _all_forward_scores(form, lengths, algorithm)
    # The chain read from its end: its forward score at `s = n - 1 - t` for
    # label `j` sums the suffixes from `t` that start in `j`, including
    # `own[..., t, j]` (the part of position `t`'s score that depends on
    # `y_t` alone); the first position's start scores belong to the forward
    # scores only.
    reversed_form, own = form.reversed(lengths)
    backward = _all_forward_scores(reversed_form, lengths, algorithm)
    scores = forward + reversed_in_time(backward, lengths, len(batch_shape), 0) - own
    log_norm = semirings.logsumexp(scores, -1)[..., None]
    # No allowed sequence at all: every label -inf (NaN scores stay NaN).
    impossible = jnp.isneginf(log_norm)
    log_marginals = jnp.where(impossible, -jnp.inf, scores - jnp.where(impossible, 0.0, log_norm))
    inside = (jnp.arange(T) < lengths[..., None])[..., None]
    return jnp.where(inside, log_marginals, -jnp.inf)
