"""Log forward scores at every position of a chain (`forward_scores`).

`chain.forward` returns only each chain's total; a truncated
forward-backward (Lavergne et al. 2010, section 4.1, used by
`optimizers.bcd`) needs the forward scores at every position, so that a
chain can be resumed from stored scores and the backward scores are the
forward scores of the reversed chain. They come from the same exact kernel
as `chain.forward` (`lattices.kernel`), split into a max-normalised shape
and a log scale so that float32 keeps its precision on long chains.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import semirings
from . import chain, kernel, sparse_chain
from .forms import DensePotentials, FactoredPotentials
from .sparse_chain import SparsePotentials


class ForwardScores(NamedTuple):
    """Log forward scores, split for precision into a per-position shape and
    scale: `log alpha_t(j) = scores[..., t, j] + log_scale[..., t]`.

    scores: `[..., T, L]`, maximum 0 over the labels at each position inside
    the length; log_scale: `[..., T]`. Positions at or past each length
    repeat the last position's values.
    """

    scores: jax.Array
    log_scale: jax.Array


def _segment_cumsum(shifts, starts):
    """Per column of `shifts [T, B]`, the running sum restarted at each `starts [T, B]`."""
    total = jnp.cumsum(shifts, axis=0)
    positions = jnp.arange(shifts.shape[0])[:, None]
    first = jax.lax.cummax(jnp.where(starts, positions, 0), axis=0)
    before = jnp.take_along_axis(total, jnp.maximum(first - 1, 0), axis=0)
    return total - jnp.where(first > 0, before, 0.0)


@jax.jit
def _factored_forward_scores(potentials: FactoredPotentials, lengths, starts) -> ForwardScores:
    rows = kernel._rows_forward(potentials.unary, potentials.transitions, potentials.start, starts, lengths)
    return ForwardScores(jnp.transpose(rows.log_alphas, (2, 0, 1)), _segment_cumsum(rows.shifts, rows.starts).T)


@jax.jit
def _dense_forward_scores(scores, lengths, starts) -> ForwardScores:
    # A chain that starts inside a row scores its first labels with a block
    # that ignores the previous label (row 0 copied to every row), so the
    # row's forward scores carry the earlier chains' total in their shifts;
    # that total (the log-sum of the normalised scores before the start) is
    # taken out again.
    restart = starts & (jnp.arange(scores.shape[1]) > 0)
    scores = jnp.where(restart[:, :, None, None], scores[:, :, :1, :], scores)
    chains = kernel._chains_forward(scores, lengths)
    previous = jnp.concatenate([jnp.zeros_like(chains.log_alphas[:1]), chains.log_alphas[:-1]])
    carried = jax.nn.logsumexp(previous, axis=-1)
    valid = jnp.arange(scores.shape[1])[:, None] < lengths[None, :]
    own_shifts = jnp.where(restart.T & valid, chains.shifts - carried, chains.shifts)
    row_starts = (restart.T | (jnp.arange(scores.shape[1]) == 0)[:, None]) & valid
    return ForwardScores(jnp.transpose(chains.log_alphas, (1, 0, 2)), _segment_cumsum(own_shifts, row_starts).T)


def forward_scores(potentials, lengths=None, starts=None) -> ForwardScores:
    """Log forward scores at every position: `log alpha_t(j)`, the log-sum of
    the scores of all label sequences of the chain up to position `t` that
    end in label `j` (the `alpha` of the forward-backward algorithm).

    Exact (the log semiring's values, through the chain kernel of `lattices.kernel`). What a
    truncated forward-backward needs (Lavergne et al. 2010, section 4.1):
    the backward scores are the forward scores of the reversed chain, and
    `logsumexp(scores[..., t, :] + log_scale[..., t])` at a chain's last
    position is its `log_partition`.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`
        (forms other than factored with shared transitions and per-position
        potentials are materialised as `[..., T, L, L]`).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      starts: `[..., T]` bool or None: rows of back-to-back chains, each
        chain's scores restarting at its first position (as `row_forward`).
    Returns:
      `ForwardScores(scores [..., T, L], log_scale [..., T])`.
    """
    form, lengths, batch_shape, T, L = chain._prepare(potentials, lengths)
    starts = jnp.zeros(batch_shape + (T,), bool) if starts is None else chain._as_starts(starts, batch_shape + (T,))
    size = math.prod(batch_shape)
    if T == 0 or size == 0:
        dtype = form.dtype
        return ForwardScores(jnp.zeros(batch_shape + (T, L), dtype), jnp.zeros(batch_shape + (T,), dtype))
    flat_starts, flat_lengths = starts.reshape(size, T), lengths.reshape(size)
    if chain._exact_kernel(semirings.Log, form, "sequential") is chain._kernel_rows:
        out = _factored_forward_scores(FactoredPotentials(form.unary.reshape(size, T, L), form.transitions,
                                                          form.start), flat_lengths, flat_starts)
    else:
        if isinstance(form, DensePotentials):
            dense = form.scores
        elif isinstance(form, SparsePotentials):
            dense = sparse_chain.to_dense(form)
        else:
            dense = chain.materialize(form)
        out = _dense_forward_scores(dense.reshape(size, T, L, L), flat_lengths, flat_starts)
    return ForwardScores(out.scores.reshape(batch_shape + (T, L)), out.log_scale.reshape(batch_shape + (T,)))
