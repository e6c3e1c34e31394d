"""CRFsuite's passive-aggressive and AROW with sparse updates, for the usual CRF.

The algorithms of `online_margin` (the same steps, costs and shuffled order)
for the model `emission [K, L]` rows summed over a token's observation ids
(times their values), `transitions [L, L]` and `start [L]`: each sentence is
decoded in the smallest length window that holds it, and only the weights of
its wrong positions are read and written, so an epoch costs the sentences'
lengths, not the model's size. The step needs `||delta||^2` of the summed
feature difference (an observation may repeat across positions): the entries
are added into a zero scratch table, read back, and the cells reset.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np

from ..lattices import FactoredPotentials, chain, decode
from ..models.linear_chain import ChainWeights
from ..validation import check_int
from .online_margin import ArowState, PassiveAggressiveState, check_positive, epoch_order

_CHUNK = 8  # wrong positions per scatter


class TokenStack(NamedTuple):
    """A labelled corpus as one stack of tokens (`token_stack`).

    feature_ids: `[N + pad, F]` int32 observation ids, -1 for none;
    feature_values: `[N + pad, F]` their values, or None (all 1);
    labels: `[N + pad]` int32 gold label ids; offsets, lengths: `[S]` int32
    each sentence's first token and length; `pad` is the longest length.
    """

    feature_ids: jax.Array
    feature_values: jax.Array | None
    labels: jax.Array
    offsets: jax.Array
    lengths: jax.Array


def token_stack(feature_ids, feature_values, labels, lengths) -> TokenStack:
    """Stack `feature_ids [N, F]` (-1 for none), `feature_values [N, F]` or
    None, `labels [N]` and sentence `lengths [S]` (each > 0, summing to N),
    padded with the longest length of empty tokens."""
    ids, labels, lengths = (np.asarray(a) for a in (feature_ids, labels, lengths))
    if ids.ndim != 2 or labels.shape != ids.shape[:1] or lengths.ndim != 1:
        raise ValueError(
            f"feature_ids must be [N, F], labels [N] and lengths [S], got {ids.shape}, {labels.shape}, {lengths.shape}"
        )
    if lengths.size == 0 or np.any(lengths <= 0) or int(lengths.sum()) != ids.shape[0]:
        raise ValueError(f"lengths must be > 0 and sum to the {ids.shape[0]} tokens, got {lengths.tolist()[:8]}...")
    pad = int(lengths.max())
    ids = np.concatenate([ids, np.full((pad, ids.shape[1]), -1, ids.dtype)]).astype(np.int32)
    labels = np.concatenate([labels, np.zeros(pad, labels.dtype)]).astype(np.int32)
    values = None
    if feature_values is not None:
        values = np.asarray(feature_values)
        if values.shape != feature_ids.shape:
            raise ValueError(f"feature_values must be [N, F] like feature_ids, got {values.shape}")
        values = np.concatenate([values, np.zeros((pad, ids.shape[1]), values.dtype)])
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    # device_put: jnp.asarray would compile a copy program per shape
    stack = TokenStack(ids, values, labels, offsets, lengths.astype(np.int32))  # pyright: ignore[reportArgumentType]  # numpy until put
    return jax.device_put(stack)


def _windows(max_length: int) -> tuple:
    """Decoding windows: powers of two from 8, capped by the longest sentence."""
    return tuple(sorted({min(8 << k, max_length) for k in range(max(max_length.bit_length(), 1))}))


def _decode(width: int, max_length: int, params: ChainWeights, masks: ChainWeights, data: TokenStack, offset, length):
    """Viterbi labels `[max_length]` (-1 past `length`) of one sentence decoded
    in a window of `width` tokens; the positions where they are wrong
    `[max_length + _CHUNK]` (`max_length` past the last) and their number;
    `s(x, yhat) - s(x, y)`; and the summed
    feature differences `S(x, y) - S(x, yhat)` of the transitions `[L, L]` and
    start `[L]` (zero where the weight does not exist)."""
    ids = jax.lax.dynamic_slice_in_dim(data.feature_ids, offset, width)
    rows = params.emission.at[jnp.where(ids >= 0, ids, params.emission.shape[0])].get(mode="fill", fill_value=0)
    if data.feature_values is not None:
        rows = rows * jax.lax.dynamic_slice_in_dim(data.feature_values, offset, width)[..., None].astype(rows.dtype)
    potentials = FactoredPotentials(jnp.sum(rows, axis=1), params.transitions, params.start)
    gold = jax.lax.dynamic_slice_in_dim(data.labels, offset, width)
    predicted = decode.best_paths(1, potentials, length, stop_at_length=True)[1][0]
    path = jnp.maximum(predicted, 0)
    excess = chain.score(potentials, path, length) - chain.score(potentials, gold, length)
    num_labels = params.transitions.shape[0]
    inside = (jnp.arange(1, width) < length).astype(params.transitions.dtype)
    transitions = (
        jnp.zeros((num_labels, num_labels), params.transitions.dtype)
        .at[gold[:-1], gold[1:]]
        .add(inside)
        .at[path[:-1], path[1:]]
        .add(-inside)
    )
    start = jnp.zeros((num_labels,), params.start.dtype).at[gold[0]].add(1.0).at[path[0]].add(-1.0)
    if masks.transitions is not None:
        transitions = jnp.where(masks.transitions, transitions, 0.0)
    if masks.start is not None:
        start = jnp.where(masks.start, start, 0.0)
    # Wrong positions are found in the window, not over `max_length`: this runs for every sentence.
    wrong = (jnp.arange(width) < length) & (predicted != gold)
    found = jnp.nonzero(wrong, size=width, fill_value=max_length)[0].astype(jnp.int32)
    positions = jnp.full((max_length + _CHUNK,), max_length, jnp.int32).at[:width].set(found)
    num_wrong = jnp.sum(wrong, dtype=jnp.int32)
    predicted = jnp.full((max_length,), -1, jnp.int32).at[:width].set(predicted)
    return predicted, positions, num_wrong, excess, transitions, start


def _emission_entries(masks: ChainWeights, data: TokenStack, offset, positions, predicted, table):
    """`(rows, columns, values)`, each `[2, _CHUNK, F]`, of the emission
    difference at the wrong `positions [_CHUNK]` (`max_length` past the last
    one): `+value` on (observation, gold label), `-value` on (observation,
    predicted label), in the dtype of the emission `table [K, L]`; rows `K`
    (dropped) where there is none."""
    num_features, dtype = table.shape[0], table.dtype
    real = positions < predicted.shape[0]
    tokens = offset + jnp.where(real, positions, 0)
    ids = data.feature_ids[tokens]
    present = real[:, None] & (ids >= 0)
    values = jnp.ones(ids.shape, dtype) if data.feature_values is None else data.feature_values[tokens].astype(dtype)
    values = jnp.where(present, values, jnp.zeros((), dtype))
    rows = jnp.broadcast_to(jnp.where(present, ids, num_features), (2,) + ids.shape)
    labels = jnp.stack([data.labels[tokens], predicted.at[positions].get(mode="fill", fill_value=0)])
    columns = jnp.broadcast_to(labels[:, :, None], rows.shape)
    values = jnp.stack([values, -values])
    if masks.emission is not None:
        values = jnp.where(masks.emission.at[rows, columns].get(mode="fill", fill_value=False), values, 0.0)
    return rows, columns, values


def _epoch_fn(data: TokenStack, masks: ChainWeights, max_length: int, update) -> Callable:
    """One epoch over `data` in `epoch_order`: each sentence decoded in its
    window, then `update(state, scratch, over_chunks, num_wrong, excess,
    transitions, start) -> (state, scratch, cost)`, where
    `over_chunks(body, init)` folds `body(entries, carry)` over the chunks of
    the sentence's wrong positions (`_emission_entries`) and the last four
    are `_decode`'s. Objective: the summed cost."""
    max_length = check_int("max_length", max_length)
    windows = _windows(max_length)
    total = data.lengths.shape[0]

    def step_fn(state, step):
        order = epoch_order(state.key, step, total)

        def example(index, carry):
            state, scratch, loss = carry
            row = order[index]
            offset, length = data.offsets[row], data.lengths[row]
            branch = jnp.searchsorted(jnp.asarray(windows, jnp.int32), length).astype(jnp.int32)
            predicted, positions, num_wrong, excess, transitions, start = jax.lax.switch(
                branch,
                [functools.partial(_decode, width, max_length) for width in windows],
                state.params,
                masks,
                data,
                offset,
                length,
            )

            def over_chunks(body, init):
                def chunk(c, carry):
                    window = jax.lax.dynamic_slice_in_dim(positions, c * _CHUNK, _CHUNK)
                    return body(_emission_entries(masks, data, offset, window, predicted, state.params.emission), carry)

                return jax.lax.fori_loop(0, (num_wrong + _CHUNK - 1) // _CHUNK, chunk, init)

            state, scratch, cost = update(state, scratch, over_chunks, num_wrong, excess, transitions, start)
            return state, scratch, loss + cost.astype(loss.dtype)

        scratch = jnp.zeros_like(state.params.emission)
        state, _, loss = jax.lax.fori_loop(
            0, total, example, (state, scratch, jnp.zeros((), state.params.emission.dtype))
        )
        return state, loss

    return step_fn


def _add_entries(table, entries, scale: float | jax.Array = 1.0):
    rows, columns, values = entries
    return table.at[rows, columns].add((scale * values).astype(table.dtype), mode="drop")


def _read(table, entries):
    rows, columns, _ = entries
    return table.at[rows, columns].get(mode="fill", fill_value=0)


def _weighted_squares(scratch, over_chunks, weights=None):
    """`(scratch, weights, sum_cell weights[cell] D[cell]^2)` of the summed
    emission difference `D` (all weights 1 when None), `scratch` holding `D`
    (it was zero): the entries are added into it, then `sum_e value_e
    weights[cell_e] D[cell_e]` adds each cell's copies back up to `weights D^2`.
    The tables travel through the loops (read-only inputs of a loop that are
    written after it would be copied for every sentence)."""
    scratch = over_chunks(lambda entries, table: _add_entries(table, entries), scratch)

    def read(entries, carry):
        total, scratch, weights = carry
        weight = 1.0 if weights is None else _read(weights, entries)
        return total + jnp.sum(entries[2] * weight * _read(scratch, entries)), scratch, weights

    total, scratch, weights = over_chunks(read, (jnp.zeros((), scratch.dtype), scratch, weights))
    return scratch, weights, total


def sparse_pa_epoch_fn(
    data: TokenStack,
    masks: ChainWeights,
    *,
    max_length: int,
    pa_type: int = 1,
    c: float = 1.0,
    error_sensitive: bool = True,
):
    """`pa_epoch_fn` for dense tables: the `step_fn` of one passive-aggressive
    epoch over `data`, on a `pa_init` state of `ChainWeights` tables (emission
    `[K, L]`, transitions `[L, L]`, start `[L]`, no pair weights) whose weights
    off `masks` (`LinearChainModel.weight_masks()`) stay 0; `max_length`: at
    least the longest sentence. Objective: the summed cost."""
    if pa_type not in (0, 1, 2) or isinstance(pa_type, bool):
        raise ValueError(f"pa_type must be 0, 1 or 2, got {pa_type!r}")
    c = check_positive("c", c)

    def update(state: PassiveAggressiveState, scratch, over_chunks, num_wrong, excess, transitions, start):
        scratch, _, squares = _weighted_squares(scratch, over_chunks)
        norm = squares + jnp.sum(transitions**2) + jnp.sum(start**2)
        cost = excess + (jnp.sqrt(num_wrong.astype(excess.dtype)) if error_sensitive else 1.0)
        safe = jnp.where(norm > 0, norm, 1.0)
        tau = {0: lambda: cost / safe, 1: lambda: jnp.minimum(c, cost / safe), 2: lambda: cost / (norm + 0.5 / c)}
        tau = jnp.where((num_wrong > 0) & (norm > 0), tau[pa_type](), 0.0)
        step = tau * state.count.astype(tau.dtype)

        def apply(entries, tables):
            emission, weighted, scratch = tables
            rows, columns, _ = entries
            scratch = scratch.at[rows, columns].set(0.0, mode="drop")
            return _add_entries(emission, entries, tau), _add_entries(weighted, entries, step), scratch

        params, weighted = cast(ChainWeights, state.params), cast(ChainWeights, state.weighted_updates)
        emission, weighted_emission, scratch = over_chunks(apply, (params.emission, weighted.emission, scratch))
        params = params._replace(
            emission=emission, transitions=params.transitions + tau * transitions, start=params.start + tau * start
        )
        weighted = weighted._replace(
            emission=weighted_emission,
            transitions=weighted.transitions + step * transitions,
            start=weighted.start + step * start,
        )
        state = PassiveAggressiveState(params, weighted, state.count + 1, state.key)
        return state, scratch, jnp.where(num_wrong > 0, cost, 0.0)

    return _epoch_fn(data, masks, max_length, update)


def sparse_arow_epoch_fn(data: TokenStack, masks: ChainWeights, *, max_length: int, gamma: float = 1.0):
    """`arow_epoch_fn` for dense tables (as `sparse_pa_epoch_fn`, on an
    `arow_init` state): the `step_fn` of one AROW epoch over `data`.
    Objective: the summed cost."""
    gamma = check_positive("gamma", gamma)

    def update(state: ArowState, scratch, over_chunks, num_wrong, excess, transitions, start):
        variance = cast(ChainWeights, state.variance)
        scratch, emission_variance, spread = _weighted_squares(scratch, over_chunks, variance.emission)
        variance = variance._replace(emission=emission_variance)
        spread = spread + jnp.sum(variance.transitions * transitions**2) + jnp.sum(variance.start * start**2)
        cost = excess + num_wrong.astype(excess.dtype)
        alpha = jnp.where(num_wrong > 0, cost / (gamma + spread), 0.0)

        def move(entries, tables):
            # Each cell once, in the first chunk that holds it: every copy there writes the same value
            # from the summed difference, and a later chunk finds the cell's scratch reset to 0. (The reset
            # writes `0 * s` so that it follows the read: XLA then updates in place instead of copying
            # the whole table on every chunk.)
            emission, emission_variance, scratch = tables
            rows, columns, _ = entries
            v, s = _read(emission_variance, entries), _read(scratch, entries)
            emission = emission.at[rows, columns].set(_read(emission, entries) + alpha * v * s, mode="drop")
            emission_variance = emission_variance.at[rows, columns].set(v / (1.0 + v * s * s / gamma), mode="drop")
            return emission, emission_variance, scratch.at[rows, columns].set(0.0 * s, mode="drop")

        params = cast(ChainWeights, state.params)
        emission, emission_variance, scratch = over_chunks(move, (params.emission, variance.emission, scratch))
        params = params._replace(
            emission=emission,
            transitions=params.transitions + alpha * variance.transitions * transitions,
            start=params.start + alpha * variance.start * start,
        )
        mistaken = num_wrong > 0
        variance = variance._replace(
            emission=emission_variance,
            transitions=jnp.where(
                mistaken,
                variance.transitions / (1.0 + variance.transitions * transitions**2 / gamma),
                variance.transitions,
            ),
            start=jnp.where(mistaken, variance.start / (1.0 + variance.start * start**2 / gamma), variance.start),
        )
        return ArowState(params, variance, state.key), scratch, jnp.where(mistaken, cost, 0.0)

    return _epoch_fn(data, masks, max_length, update)
