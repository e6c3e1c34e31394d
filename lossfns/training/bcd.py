"""Block coordinate descent (BCD) for L1-penalised linear-chain CRFs, as Lavergne,
Cappe & Yvon (2010, sections 3.4 and 4.1) describe it and Wapiti implements it.

It trains a `models.LinearChainModel` on `l(theta) + l1 ||theta||_1 + l2/2 ||theta||^2`
one block of weights (an observation test's row, or the transitions) at a time, from
a truncated forward-backward of only the sentences where the block is active, with
Wapiti's closed-form curvature and a soft-thresholded Newton step that backtracking
keeps a decrease. Blocks active in disjoint sentences are updated together, in
rounds (`training.bcd_schedule`). Weights outside the model's masks stay 0.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..features.index import PackedCorpus
from ..lattices import prefix
from ..lattices.chain import FactoredPotentials
from ..models.linear_chain import LinearChainModel
from ..optimizers.minimize import Result, init_loop, loop_result, relative_change_below, run_loop
from ..optimizers.owlqn import check_penalties
from ..validation import check_int, check_scalar
from . import bcd_schedule as schedule


class PackedChains(eqx.Module):
    """Chains packed into jobs of `rows x width` cells (`bcd_schedule.Jobs`
    as device arrays)."""

    chain_begin: jax.Array
    round_begin: jax.Array
    cell: jax.Array
    token: jax.Array
    length: jax.Array
    mode: jax.Array
    slot: jax.Array
    direction: jax.Array
    rows: int = eqx.field(static=True)
    width: int = eqx.field(static=True)
    max_chains: int = eqx.field(static=True)


class CellChunks(eqx.Module):
    """Active cells per round in chunks: round_begin `[R + 1]` (chunks of
    round r), token, slot, count `[chunks, size]` (-1: padding); max_chunks:
    the most chunks of one round."""

    round_begin: jax.Array
    token: jax.Array
    slot: jax.Array
    count: jax.Array
    max_chunks: int = eqx.field(static=True)


class BcdData(eqx.Module):
    """The plan of a BCD sweep over a labelled corpus (see `bcd_data`).

    Token stack: unigram_ids `[N, F]`, pair_ids `[N, F2]`, labels `[N]`,
    is_first `[N]` (a sentence's first token). Per round `[R, B]`: each
    block slot's vector part (`bcd_schedule.EMISSION`, `START` or none) and
    row, matrix part (`PAIR`, `TRANSITIONS` or none), row and matrix slot;
    matrix_block `[R, B2]` the block of each matrix slot. Active cells
    (`CellChunks`) of the vector and matrix parts, for visits active at one
    position (`*_single`: their line search is closed-form) and at several
    (`*_multi`: their line search re-scores windows). Chains: forward and
    backward per visit (`bcd_schedule.chain_extents`), windows (`[max(f - 1,
    0), l]`) per visit active at several positions, and sentences (every
    sentence whole, for the objective).
    """

    unigram_ids: jax.Array
    pair_ids: jax.Array
    labels: jax.Array
    is_first: jax.Array
    vector_part: jax.Array
    vector_row: jax.Array
    matrix_part: jax.Array
    matrix_row: jax.Array
    matrix_slot: jax.Array
    matrix_block: jax.Array
    vector_single: CellChunks
    vector_multi: CellChunks
    matrix_single: CellChunks
    matrix_multi: CellChunks
    forward: PackedChains
    backward: PackedChains
    windows: PackedChains
    sentences: PackedChains

    @property
    def num_rounds(self) -> int:
        return self.vector_part.shape[0]


def _device_jobs(jobs: schedule.Jobs, rows: int, width: int) -> PackedChains:
    as32 = lambda x: jnp.asarray(np.asarray(x, np.int64), jnp.int32)
    # One unused entry at the end, so that no array is empty (never read).
    padded = lambda x: as32(np.concatenate([x, [0]]))
    return PackedChains(
        as32(jobs.chain_begin),
        as32(jobs.round_begin),
        padded(jobs.cell),
        padded(jobs.token),
        padded(jobs.length),
        padded(jobs.mode),
        padded(jobs.slot),
        padded(jobs.direction),
        rows,
        width,
        jobs.max_chains,
    )


def _per_round(round_of, slot, values, num_rounds, width, fill):
    out = np.full((num_rounds, max(width, 1)), fill, np.int64)
    out[round_of, slot] = values
    return jnp.asarray(out, jnp.int32)


def bcd_data(
    corpus: PackedCorpus,
    model: LinearChainModel,
    *,
    rows_per_job: int = 128,
    window_rows: int = 16,
    cells_per_chunk: int = 1024,
) -> BcdData:
    """The static plan of BCD sweeps of `model`'s weights on a labelled corpus.

    corpus: a `features.PackedCorpus` with labels (`features.pack` or
      `features.pack_rows`), its ids in the model's `[0, K)` and `[0, K2)`.
    model: the `LinearChainModel` to train (its sizes decide the blocks).
    rows_per_job, window_rows: rows of the job grids of the forward and
      backward chains, and of the line search's windows (each row as wide
      as the longest sentence, rounded up to 8).
    cells_per_chunk: active cells per step of the statistics pass.
    """
    if not isinstance(corpus, PackedCorpus):
        raise TypeError(
            f"corpus must be a features.PackedCorpus (features.pack or features.pack_rows), got {type(corpus).__name__}"
        )
    if not isinstance(model, LinearChainModel):
        raise TypeError(f"model must be a models.LinearChainModel, got {type(model).__name__}")
    for name, value in (
        ("rows_per_job", rows_per_job),
        ("window_rows", window_rows),
        ("cells_per_chunk", cells_per_chunk),
    ):
        check_int(name, value)
    K, K2, L = model.emission.shape[0], model.pair_emission.shape[0], model.num_labels
    unigram_ids, pair_ids = np.asarray(corpus.unigram_ids), np.asarray(corpus.pair_ids)
    for name, ids, size in (("corpus.unigram_ids", unigram_ids, K), ("corpus.pair_ids", pair_ids, K2)):
        if ids.size and (ids.min() < -1 or ids.max() >= size):
            raise ValueError(
                f"{name} must hold ids in [-1, {size}) (the model's rows), got values in [{ids.min()}, {ids.max()}]"
            )
    sentences = schedule.corpus_sentences(corpus)
    if sentences.labels.size and sentences.labels.max() >= L:
        raise ValueError(f"corpus labels must lie in [0, {L}) (the model's labels), got {sentences.labels.max()}")
    num_sentences = sentences.offsets.shape[0] - 1
    blocks = schedule.corpus_blocks(corpus, sentences, K, K2)
    visits = schedule.block_visits(blocks, sentences)
    num_blocks = blocks.vector_part.shape[0]
    round_of_block = schedule.colour_blocks(visits, num_blocks, num_sentences)
    num_rounds = int(round_of_block.max(initial=-1)) + 1
    # Slots: a block's index in its round; matrix slots count the blocks with a matrix part.
    order = np.lexsort((np.arange(num_blocks), round_of_block))
    round_sizes = np.bincount(round_of_block, minlength=num_rounds)
    slot = np.empty(num_blocks, np.int64)
    slot[order] = np.arange(num_blocks) - np.concatenate([[0], np.cumsum(round_sizes)])[round_of_block[order]]
    has_matrix = blocks.matrix_part != schedule.NO_PART
    matrix_rank = np.zeros(num_blocks, np.int64)
    ranked = order[has_matrix[order]]
    matrix_sizes = np.bincount(round_of_block[ranked], minlength=num_rounds)
    matrix_rank[ranked] = (
        np.arange(ranked.shape[0]) - np.concatenate([[0], np.cumsum(matrix_sizes)])[round_of_block[ranked]]
    )
    width = int(round_sizes.max(initial=1))
    matrix_width = int(matrix_sizes.max(initial=1))
    per_round = lambda values, fill=0: _per_round(round_of_block, slot, values, num_rounds, width, fill)
    matrix_slot = np.where(has_matrix, matrix_rank, matrix_width)
    matrix_block = np.full((num_rounds, max(matrix_width, 1)), width, np.int64)
    matrix_block[round_of_block[has_matrix], matrix_rank[has_matrix]] = slot[has_matrix]

    # Cells, per round: vector cells (node statistics) and matrix cells (edge
    # statistics), of visits active at one position and at several.
    cell_block, cell_token, cell_count, cell_matrix = blocks.cells
    cell_round = round_of_block[cell_block]
    several = (visits.first < visits.last)[visits.cell_visit]
    chunks = []
    for part, slot_of in ((~cell_matrix, slot), (cell_matrix, matrix_slot)):
        for keep in (part & ~several, part & several):
            begin, (token, slots, count) = schedule.chunk_cells(
                cell_round[keep],
                num_rounds,
                cells_per_chunk,
                cell_token[keep],
                slot_of[cell_block[keep]],
                cell_count[keep],
            )
            chunks.append(
                CellChunks(
                    jnp.asarray(begin, jnp.int32),
                    jnp.asarray(token, jnp.int32),
                    jnp.asarray(slots, jnp.int32),
                    jnp.asarray(count, jnp.int32),
                    max(int(np.diff(begin).max(initial=0)), 1),
                )
            )

    # Chains of each visit (the paper's truncation) and of each sentence.
    offsets = sentences.offsets
    lengths = np.diff(offsets)
    row_width = max(8, -(-int(lengths.max(initial=1)) // 8) * 8)
    visit_round = round_of_block[visits.block]
    visit_slot = slot[visits.block]
    start_token = offsets[visits.sentence]
    window_start = np.maximum(visits.first - 1, 0)
    extents = schedule.chain_extents(visits, visit_round, sentences)
    forward = schedule.pack_jobs(
        visit_round,
        num_rounds,
        extents.forward_token,
        extents.forward_length,
        extents.forward_mode,
        visit_slot,
        1,
        rows_per_job,
        row_width,
    )
    backward = schedule.pack_jobs(
        visit_round,
        num_rounds,
        extents.backward_token,
        extents.backward_length,
        extents.backward_mode,
        visit_slot,
        -1,
        rows_per_job,
        row_width,
    )
    multi = visits.first < visits.last
    windows = schedule.pack_jobs(
        visit_round[multi],
        num_rounds,
        (start_token + window_start)[multi],
        (visits.last - window_start + 1)[multi],
        np.where(visits.first > 0, schedule.FROM_FORWARD, schedule.SENTENCE_START)[multi],
        visit_slot[multi],
        1,
        window_rows,
        row_width,
    )
    nonempty = np.nonzero(lengths > 0)[0]
    whole = schedule.pack_jobs(
        np.zeros_like(nonempty),
        1,
        offsets[nonempty],
        lengths[nonempty],
        np.full_like(nonempty, schedule.SENTENCE_START),
        np.zeros_like(nonempty),
        1,
        rows_per_job,
        row_width,
    )
    is_first = np.zeros(offsets[-1], bool)
    is_first[offsets[:-1]] = True
    return BcdData(
        *[
            jnp.asarray(unigram_ids, jnp.int32),
            jnp.asarray(pair_ids, jnp.int32),
            jnp.asarray(sentences.labels, jnp.int32),
            jnp.asarray(is_first),
            per_round(blocks.vector_part),
            per_round(blocks.vector_row),
            per_round(blocks.matrix_part),
            per_round(blocks.matrix_row),
            per_round(matrix_slot, matrix_width),
            jnp.asarray(matrix_block, jnp.int32),
            *chunks,
            _device_jobs(forward, rows_per_job, row_width),
            _device_jobs(backward, rows_per_job, row_width),
            _device_jobs(windows, window_rows, row_width),
            _device_jobs(whole, rows_per_job, row_width),
        ]
    )  # a list: the chunks' count is not static


# ---------------------------------------------------------------------------
# The model's weights as BCD reads and writes them
# ---------------------------------------------------------------------------


class _Weights(NamedTuple):
    """The model's weights with the masked ones at 0, and its masks (1 where
    a weight exists): emission `[K, L]`, transitions `[L, L]`, start `[L]`,
    pair_emission `[K2, L, L]`."""

    emission: jax.Array
    transitions: jax.Array
    start: jax.Array
    pair_emission: jax.Array
    emission_mask: jax.Array
    transitions_mask: jax.Array
    pair_mask: jax.Array


def _weights(model: LinearChainModel) -> _Weights:
    ones = lambda x: jnp.ones(x.shape, bool)
    emission_mask = ones(model.emission) if model.emission_mask is None else jnp.asarray(model.emission_mask, bool)
    if model.pair_mask is None:
        pair_mask, transitions_mask = ones(model.pair_emission), ones(model.transitions)
    else:
        pair_mask = jnp.asarray(model.pair_mask, bool)
        transitions_mask = jnp.any(pair_mask, axis=0)
    return _Weights(
        jnp.where(emission_mask, model.emission, 0.0),
        jnp.where(transitions_mask, model.transitions, 0.0),
        model.start,
        jnp.where(pair_mask, model.pair_emission, 0.0),
        emission_mask,
        transitions_mask,
        pair_mask,
    )


def _with_weights(model: LinearChainModel, weights: _Weights) -> LinearChainModel:
    return dataclasses.replace(
        model,
        emission=weights.emission,
        transitions=weights.transitions,
        start=weights.start,
        pair_emission=weights.pair_emission,
    )


def _pad_row(x):
    """`x [N, ...]` with a zero row at index N (the padding token)."""
    return jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)])


def _pair_scores(weights: _Weights, data: BcdData, token):
    """Label-pair-observation scores `[..., L, L]` of tokens (N = padding: 0)."""
    ids = jnp.concatenate([data.pair_ids, jnp.full((1, data.pair_ids.shape[1]), -1, jnp.int32)])[token]
    rows = weights.pair_emission.at[jnp.where(ids >= 0, ids, weights.pair_emission.shape[0])].get(
        mode="fill", fill_value=0
    )
    return jnp.sum(rows, axis=-3)


def _dense(data: BcdData) -> bool:
    """Whether the model has label-pair-observation features (per-position potentials)."""
    return data.pair_ids.shape[1] > 0


# ---------------------------------------------------------------------------
# Jobs: packed chains scored by `prefix.forward_scores`
# ---------------------------------------------------------------------------


class _Cells(NamedTuple):
    """The cells of one job, flat `[G]`: token (N where unused), starts,
    valid; lengths `[rows]`; per chain `[M]`: last cell, last token, slot,
    present."""

    token: jax.Array
    starts: jax.Array
    valid: jax.Array
    mode: jax.Array
    lengths: jax.Array
    last_cell: jax.Array
    last_token: jax.Array
    slot: jax.Array
    present: jax.Array


def _job_cells(jobs: PackedChains, j, num_tokens: int) -> _Cells:
    size, M = jobs.rows * jobs.width, jobs.max_chains
    index = jobs.chain_begin[j] + jnp.arange(M)
    present = index < jobs.chain_begin[j + 1]
    take = lambda x: jnp.where(present, x.at[index].get(mode="fill", fill_value=0), 0)
    first_cell = jnp.where(present, take(jobs.cell), size)
    length, token0, mode, slot = take(jobs.length), take(jobs.token), take(jobs.mode), take(jobs.slot)
    owner = jax.lax.cummax(
        jnp.full((size,), -1, jnp.int32).at[first_cell].set(jnp.arange(M, dtype=jnp.int32), mode="drop")
    )
    chain_of = jnp.maximum(owner, 0)
    offset = jnp.arange(size) - first_cell[chain_of]
    valid = (owner >= 0) & (offset < length[chain_of])
    direction = jobs.direction[j]
    token = jnp.where(valid, token0[chain_of] + direction * offset, num_tokens)
    lengths = jnp.sum(valid.reshape(jobs.rows, jobs.width), axis=1)
    last_cell = jnp.clip(first_cell + length - 1, 0, size - 1)
    return _Cells(
        token,
        valid & (offset == 0),
        valid,
        mode[chain_of],
        lengths,
        last_cell,
        token0 + direction * (length - 1),
        slot,
        present,
    )


class _Offsets(NamedTuple):
    """Trial moves of the round's blocks: per block slot, the change of its
    vector part `[B + 1, L]` and matrix part `[B2 + 1, L, L]` (last rows 0),
    applied at each token as many times as the block is active there; and
    the change of the shared transitions `[L, L]` (factored models, whose
    only matrix block is the transitions')."""

    vector: jax.Array
    matrix: jax.Array
    transitions: jax.Array


def _job_scores(jobs: PackedChains, j, weights: _Weights, buffers, data: BcdData, offsets=None, stored=None):
    """`(cells, scores [G, L], log_scale [G])`: the forward scores of job j's
    chains from the tokens' emission scores `buffers.unary`, the trial
    `offsets` (`_Offsets` or None) and the stored forward (or backward) scores
    `stored [N + 1, L]` that `FROM_FORWARD` (`FROM_BACKWARD`) chains start
    from (passed explicitly: a loop that writes a buffer must read the one it
    writes, or the buffer is copied)."""
    num_tokens = data.labels.shape[0]
    cells = _job_cells(jobs, j, num_tokens)
    token, L = cells.token, buffers.unary.shape[-1]

    def emission(scored):
        if offsets is None:
            return buffers.unary[scored]
        count = buffers.vector_count[scored].astype(offsets.vector.dtype)[:, None]
        return buffers.unary[scored] + count * offsets.vector[buffers.vector_slot[scored]]

    emitted = emission(token)
    sentence_start = weights.start + emitted
    forward = jobs.direction[j] > 0
    transitions = weights.transitions if offsets is None else weights.transitions + offsets.transitions
    first = jnp.where((cells.mode == schedule.SENTENCE_START)[:, None], sentence_start, emitted)
    if stored is not None:
        resumed = stored[token]
        if not _dense(data):  # a reversed factored chain scores each label's own unary
            resumed = jnp.where((cells.mode == schedule.FROM_BACKWARD)[:, None], resumed + emitted, resumed)
        from_stored = (cells.mode == schedule.FROM_FORWARD) | (cells.mode == schedule.FROM_BACKWARD)
        first = jnp.where(from_stored[:, None], resumed, first)
    shape = (jobs.rows, jobs.width)
    starts = cells.starts.reshape(shape)
    if not _dense(data):
        potentials = FactoredPotentials(
            jnp.where(cells.starts[:, None], first, emitted).reshape(shape + (L,)),
            jnp.where(forward, transitions, transitions.T),
            jnp.zeros_like(weights.start),
        )
    else:

        def blocks(scored):
            psi = transitions + _pair_scores(weights, data, scored) + emission(scored)[:, None, :]
            if offsets is None:
                return psi
            count = buffers.matrix_count[scored].astype(psi.dtype)[:, None, None]
            return psi + count * offsets.matrix[buffers.matrix_slot[scored]]

        # Reversed, step t scores the transposed block of the position after t.
        psi = jax.lax.cond(
            forward,
            lambda: blocks(token),
            lambda: jnp.swapaxes(blocks(jnp.where(cells.valid, token + 1, num_tokens)), -1, -2),
        )
        reversed_first = jnp.where((cells.mode == schedule.REVERSED_START)[:, None], 0.0, first)
        psi = jnp.where(cells.starts[:, None, None], reversed_first[:, None, :], psi)
        potentials = psi.reshape(shape + (L, L))
    scores = prefix.forward_scores(potentials, cells.lengths, starts)
    return cells, scores.scores.reshape(-1, L), scores.log_scale.reshape(-1)


def _chain_totals(cells: _Cells, scores, log_scale, beta):
    """Per chain `[M]`: log-sum over its paths, its last cell's forward scores
    plus `beta` there (0 for whole sentences)."""
    last = scores[cells.last_cell] + beta[cells.last_token]
    total = jax.nn.logsumexp(last, axis=-1) + log_scale[cells.last_cell]
    return jnp.where(cells.present, total, 0.0)


# ---------------------------------------------------------------------------
# One round: statistics, proposal, line search, update
# ---------------------------------------------------------------------------


class _Buffers(NamedTuple):
    """Per token `[N + 1, ...]` (row N: padding): emission scores (kept up to
    date through the sweep), normalised forward and backward scores of the
    current round, and for the tokens of the round's windows the block slot
    and multiplicity of each (vector and matrix parts; slot B / B2 and
    count 0 elsewhere)."""

    unary: jax.Array
    alpha: jax.Array
    beta: jax.Array
    vector_slot: jax.Array
    vector_count: jax.Array
    matrix_slot: jax.Array
    matrix_count: jax.Array


def _cell_fields(cells: CellChunks, c, num_tokens: int, num_slots: int):
    """Chunk c's tokens (padding: N), slots (padding: `num_slots`) and counts (padding: 0)."""
    return (
        jnp.where(cells.token[c] >= 0, cells.token[c], num_tokens),
        jnp.where(cells.slot[c] >= 0, cells.slot[c], num_slots),
        jnp.maximum(cells.count[c], 0),
    )


def _mark_round(buffers: _Buffers, data: BcdData, r, clear: bool) -> _Buffers:
    """Write (or clear) the slots and counts of the round's window tokens."""
    N, B, B2 = data.labels.shape[0], data.vector_part.shape[1], data.matrix_block.shape[1]

    def mark(cells: CellChunks, slots, counts, num_slots):
        def body(c, carry):
            token, slot, count = _cell_fields(cells, c, N, num_slots)
            if clear:
                slot, count = jnp.full_like(slot, num_slots), jnp.zeros_like(count)
            return carry[0].at[token].set(slot), carry[1].at[token].set(count)

        return jax.lax.fori_loop(cells.round_begin[r], cells.round_begin[r + 1], body, (slots, counts))

    vector_slot, vector_count = mark(data.vector_multi, buffers.vector_slot, buffers.vector_count, B)
    matrix_slot, matrix_count = mark(data.matrix_multi, buffers.matrix_slot, buffers.matrix_count, B2)
    return buffers._replace(
        vector_slot=vector_slot, vector_count=vector_count, matrix_slot=matrix_slot, matrix_count=matrix_count
    )


def _forward_backward(weights: _Weights, data: BcdData, buffers: _Buffers, r) -> _Buffers:
    """The truncated forward and backward scores of the round's visits."""

    def run(jobs: PackedChains, buffer, backward: bool):
        def body(j, buffer):
            cells, scores, _ = _job_scores(jobs, j, weights, buffers, data, stored=buffer)
            if backward and not _dense(data):
                scores = scores - buffers.unary[cells.token]  # the reversed chain scored each label's own unary
            return buffer.at[cells.token].set(scores)

        return jax.lax.fori_loop(jobs.round_begin[r], jobs.round_begin[r + 1], body, buffer)

    alpha = run(data.forward, buffers.alpha, False)
    buffers = buffers._replace(alpha=alpha)
    return buffers._replace(beta=run(data.backward, buffers.beta, True))


class _Statistics(NamedTuple):
    """Per block slot: expected counts, curvature and gold counts of the
    vector parts `[B, L]` and matrix parts `[B2, L, L]`; and the log-marginals
    at the cells of visits active at one position (`[chunks x size, L]` and
    `[chunks x size, L, L]`, the round's chunks in order)."""

    vector_expected: jax.Array
    vector_curvature: jax.Array
    vector_gold: jax.Array
    matrix_expected: jax.Array
    matrix_curvature: jax.Array
    matrix_gold: jax.Array
    vector_single: jax.Array
    matrix_single: jax.Array


def _log_marginals(weights: _Weights, data: BcdData, buffers: _Buffers, token, matrix: bool):
    """Log node marginals `[Q, L]` (or log edge marginals `[Q, L, L]` ending
    at) the tokens, from the round's forward and backward scores."""
    if not matrix:
        scores = buffers.alpha[token] + buffers.beta[token]
        return scores - jax.nn.logsumexp(scores, axis=-1, keepdims=True)
    L = weights.start.shape[0]
    psi = weights.transitions + buffers.unary[token][:, None, :]
    if _dense(data):
        psi = psi + _pair_scores(weights, data, token)
    scores = (buffers.alpha[token - 1][:, :, None] + psi + buffers.beta[token][:, None, :]).reshape(-1, L * L)
    return (scores - jax.nn.logsumexp(scores, axis=-1, keepdims=True)).reshape(-1, L, L)


def _statistics(weights: _Weights, data: BcdData, buffers: _Buffers, r) -> _Statistics:
    B, B2, L = data.vector_part.shape[1], data.matrix_block.shape[1], weights.start.shape[0]
    N, dtype = data.labels.shape[0], weights.start.dtype
    labels = jnp.concatenate([data.labels, jnp.zeros((1,), jnp.int32)])
    one_hot = lambda token: jax.nn.one_hot(labels[token], L, dtype=dtype)
    gold_of = {
        False: one_hot,
        True: lambda token: one_hot(jnp.maximum(token - 1, 0))[:, :, None] * one_hot(token)[:, None, :],
    }

    def accumulate(cells: CellChunks, num_slots, matrix: bool, totals, store=None):
        size = cells.token.shape[1]

        def body(c, carry):
            totals, store = carry
            token, slot, count = _cell_fields(cells, c, N, num_slots)
            log_marginal = _log_marginals(weights, data, buffers, token, matrix)
            marginal = jnp.exp(log_marginal)
            weight = count.astype(dtype).reshape((-1,) + (1,) * log_marginal.ndim)[:, 0]
            add = lambda total, x: total + jax.ops.segment_sum(x, slot, num_segments=num_slots + 1)[:num_slots]
            totals = (
                add(totals[0], weight * marginal),
                add(totals[1], weight**2 * marginal * (1 - marginal)),
                add(totals[2], weight * gold_of[matrix](token)),
            )
            if store is not None:
                store = jax.lax.dynamic_update_slice_in_dim(store, log_marginal, (c - cells.round_begin[r]) * size, 0)
            return totals, store

        return jax.lax.fori_loop(cells.round_begin[r], cells.round_begin[r + 1], body, (totals, store))

    def zeros(num_slots, shape):
        return tuple(jnp.zeros((num_slots,) + shape, dtype) for _ in range(3))

    def single_store(cells, shape):
        return jnp.zeros((cells.max_chunks * cells.token.shape[1],) + shape, dtype)

    vector, vector_single = accumulate(
        data.vector_single, B, False, zeros(B, (L,)), single_store(data.vector_single, (L,))
    )
    vector, _ = accumulate(data.vector_multi, B, False, vector)
    matrix, matrix_single = accumulate(
        data.matrix_single, B2, True, zeros(B2, (L, L)), single_store(data.matrix_single, (L, L))
    )
    matrix, _ = accumulate(data.matrix_multi, B2, True, matrix)
    return _Statistics._make((*vector, *matrix, vector_single, matrix_single))


class _Blocks(NamedTuple):
    """The round's blocks: current weights, masks and parts (vector `[B, L]`,
    matrix `[B2, L, L]`)."""

    vector: jax.Array
    vector_mask: jax.Array
    vector_part: jax.Array
    vector_row: jax.Array
    matrix: jax.Array
    matrix_mask: jax.Array
    matrix_part: jax.Array
    matrix_row: jax.Array


def _round_blocks(weights: _Weights, data: BcdData, r) -> _Blocks:
    vector_part, vector_row = data.vector_part[r], data.vector_row[r]
    matrix_block = data.matrix_block[r]
    B = vector_part.shape[0]
    matrix_part = jnp.where(matrix_block < B, data.matrix_part[r][jnp.minimum(matrix_block, B - 1)], 0)
    matrix_row = jnp.where(matrix_block < B, data.matrix_row[r][jnp.minimum(matrix_block, B - 1)], 0)
    is_emission = (vector_part == schedule.EMISSION)[:, None]
    vector = jnp.where(
        is_emission,
        weights.emission[vector_row],
        jnp.where((vector_part == schedule.START)[:, None], weights.start[None], 0.0),
    )
    vector_mask = jnp.where(is_emission, weights.emission_mask[vector_row], (vector_part == schedule.START)[:, None])
    is_pair = (matrix_part == schedule.PAIR)[:, None, None]
    pair_row = jnp.minimum(matrix_row, max(weights.pair_emission.shape[0] - 1, 0))
    pair_weights = (
        weights.pair_emission[pair_row] if weights.pair_emission.shape[0] else jnp.zeros_like(weights.transitions)[None]
    )
    pair_mask = (
        weights.pair_mask[pair_row]
        if weights.pair_emission.shape[0]
        else jnp.zeros((1,) + weights.transitions.shape, bool)
    )
    matrix = jnp.where(
        is_pair,
        pair_weights,
        jnp.where((matrix_part == schedule.TRANSITIONS)[:, None, None], weights.transitions[None], 0.0),
    )
    matrix_mask = jnp.where(
        is_pair, pair_mask, (matrix_part == schedule.TRANSITIONS)[:, None, None] & weights.transitions_mask[None]
    )
    return _Blocks(vector, vector_mask, vector_part, vector_row, matrix, matrix_mask, matrix_part, matrix_row)


def _proposal(theta, gradient, curvature, mask, l1, l2, max_step):
    """The minimiser of the L1-penalised diagonal quadratic model (module
    docstring) and the curvature it used."""
    curvature = jnp.maximum(curvature, jnp.abs(gradient) / max_step)
    z = curvature * theta - gradient
    denominator = curvature + l2
    shrunk = jnp.sign(z) * jnp.maximum(jnp.abs(z) - l1, 0.0) / jnp.where(denominator > 0, denominator, 1.0)
    return jnp.where(mask & (denominator > 0), shrunk, theta), curvature


def _per_block(vector_terms, matrix_terms, matrix_block, num_blocks):
    """Per block `[B]`: its vector part's term plus its matrix part's."""
    return vector_terms + jax.ops.segment_sum(matrix_terms, matrix_block, num_segments=num_blocks + 1)[:num_blocks]


def _penalty(vector, matrix, matrix_block, num_blocks, l1, l2):
    """Per block `[B]`: the elastic-net penalty of its weights."""
    terms = lambda x, axes: jnp.sum(l1 * jnp.abs(x) + 0.5 * l2 * x**2, axis=axes)
    return _per_block(terms(vector, 1), terms(matrix, (1, 2)), matrix_block, num_blocks)


def _window_sums(weights: _Weights, data: BcdData, buffers: _Buffers, r, offsets=None):
    """Per block slot `[B]`: the sum over its visits active at several
    positions of the window's log-sum (its sentence's `log Z` up to terms
    the block does not change)."""
    B = data.vector_part.shape[1]

    def body(j, totals):
        cells, scores, log_scale = _job_scores(data.windows, j, weights, buffers, data, offsets, stored=buffers.alpha)
        chains = _chain_totals(cells, scores, log_scale, buffers.beta)
        return totals + jax.ops.segment_sum(chains, jnp.where(cells.present, cells.slot, B), num_segments=B + 1)[:B]

    return jax.lax.fori_loop(
        data.windows.round_begin[r], data.windows.round_begin[r + 1], body, jnp.zeros((B,), weights.start.dtype)
    )


def _single_changes(data: BcdData, stats: _Statistics, r, vector_move, matrix_move):
    """Per block slot `[B]`: the change of `log Z` summed over its visits active
    at one position `t`, `log sum_j P_t(j) exp(c_t move_j)`, for the moves
    `vector_move [B, L]` and `matrix_move [B2, L, L]` (exact: only position t's
    scores change)."""
    N, B, B2 = data.labels.shape[0], data.vector_part.shape[1], data.matrix_block.shape[1]
    pad = lambda x: jnp.concatenate([x, jnp.zeros_like(x[:1])])
    matrix_block = jnp.concatenate([data.matrix_block[r], jnp.full((1,), B, jnp.int32)])

    def total(cells: CellChunks, store, move, num_slots, block_of):
        size, axes = cells.token.shape[1], tuple(range(1, move.ndim))

        def body(c, totals):
            _, slot, count = _cell_fields(cells, c, N, num_slots)
            log_marginal = jax.lax.dynamic_slice_in_dim(store, (c - cells.round_begin[r]) * size, size, 0)
            shift = count.astype(move.dtype).reshape((-1,) + (1,) * len(axes)) * move[slot]
            change = jax.nn.logsumexp(log_marginal + shift, axis=axes)
            return (
                totals + jax.ops.segment_sum(jnp.where(count > 0, change, 0.0), block_of(slot), num_segments=B + 1)[:B]
            )

        return jax.lax.fori_loop(cells.round_begin[r], cells.round_begin[r + 1], body, jnp.zeros((B,), move.dtype))

    return total(data.vector_single, stats.vector_single, pad(vector_move), B, lambda slot: slot) + total(
        data.matrix_single, stats.matrix_single, pad(matrix_move), B2, lambda slot: matrix_block[slot]
    )


def _trial_offsets(data: BcdData, blocks: _Blocks, vector_step, matrix_step) -> _Offsets:
    """The trial moves `vector_step [B, L]`, `matrix_step [B2, L, L]` as `_Offsets`
    (a start move reaches a sentence's first scores through its first token's
    vector offset, the transitions' one the shared matrix of factored models)."""
    pad = lambda x: jnp.concatenate([x, jnp.zeros_like(x[:1])])
    if _dense(data):
        return _Offsets(pad(vector_step), pad(matrix_step), jnp.zeros_like(matrix_step[0]))
    transitions = jnp.sum(
        jnp.where((blocks.matrix_part == schedule.TRANSITIONS)[:, None, None], matrix_step, 0.0), axis=0
    )
    return _Offsets(pad(vector_step), pad(matrix_step), transitions)


def _round_update(weights: _Weights, data: BcdData, buffers: _Buffers, r, l1, l2, max_step, max_backtracking):
    """One round of block updates; returns the new weights and buffers."""
    buffers = _mark_round(buffers, data, r, clear=False)
    buffers = _forward_backward(weights, data, buffers, r)
    stats = _statistics(weights, data, buffers, r)
    blocks = _round_blocks(weights, data, r)
    B, dtype = blocks.vector.shape[0], weights.start.dtype
    matrix_block = data.matrix_block[r]
    per_block = lambda vector, matrix: _per_block(vector, matrix, matrix_block, B)
    of_matrix = lambda x: x[jnp.minimum(matrix_block, B - 1)][:, None, None]  # padding slots never move
    vector_gradient = stats.vector_expected - stats.vector_gold
    matrix_gradient = stats.matrix_expected - stats.matrix_gold
    vector_target, vector_curvature = _proposal(
        blocks.vector, vector_gradient, stats.vector_curvature, blocks.vector_mask, l1, l2, max_step
    )
    matrix_target, matrix_curvature = _proposal(
        blocks.matrix, matrix_gradient, stats.matrix_curvature, blocks.matrix_mask, l1, l2, max_step
    )
    vector_delta, matrix_delta = vector_target - blocks.vector, matrix_target - blocks.matrix
    gold_change = per_block(
        jnp.sum(stats.vector_gold * vector_delta, 1), jnp.sum(stats.matrix_gold * matrix_delta, (1, 2))
    )
    penalty_before = _penalty(blocks.vector, blocks.matrix, matrix_block, B, l1, l2)
    # The quadratic model's decrease; below the objective's rounding a move is not worth (nor able) checking.
    predicted = (
        per_block(
            jnp.sum(vector_gradient * vector_delta + 0.5 * vector_curvature * vector_delta**2, 1),
            jnp.sum(matrix_gradient * matrix_delta + 0.5 * matrix_curvature * matrix_delta**2, (1, 2)),
        )
        + _penalty(vector_target, matrix_target, matrix_block, B, l1, l2)
        - penalty_before
    )
    cells = per_block(jnp.sum(stats.vector_gold, 1), jnp.sum(stats.matrix_gold, (1, 2)))
    noise = 16 * jnp.finfo(dtype).eps * (cells + 1)

    def search():
        reference = _window_sums(weights, data, buffers, r)
        noise_ = noise + 16 * jnp.finfo(dtype).eps * jnp.abs(reference)

        def change(step):
            vector_move, matrix_move = step[:, None] * vector_delta, of_matrix(step) * matrix_delta
            offsets = _trial_offsets(data, blocks, vector_move, matrix_move)
            log_z = (
                _window_sums(weights, data, buffers, r, offsets)
                - reference
                + _single_changes(data, stats, r, vector_move, matrix_move)
            )
            penalty = _penalty(blocks.vector + vector_move, blocks.matrix + matrix_move, matrix_block, B, l1, l2)
            return log_z - step * gold_change + penalty - penalty_before

        def cond(carry):
            count, _, settled = carry
            return (count < max_backtracking) & ~jnp.all(settled)

        def body(carry):
            count, step, settled = carry
            accepted = ~settled & (change(step) <= 0)
            halved = jnp.where(settled | accepted, step, 0.5 * step)
            # A decrease too small to tell from rounding: the block stays put.
            hopeless = ~(settled | accepted) & (halved * -predicted <= noise_)
            return count + 1, jnp.where(hopeless, 0.0, halved), settled | accepted | hopeless

        worth = predicted < -noise_
        _, step, settled = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), worth.astype(dtype), ~worth))
        return jnp.where(settled, step, 0.0)

    step = jax.lax.cond(jnp.any(predicted < -noise), search, lambda: jnp.zeros((B,), dtype))
    new_vector = jnp.where((step == 1)[:, None], vector_target, blocks.vector + step[:, None] * vector_delta)
    new_matrix = jnp.where(of_matrix(step) == 1, matrix_target, blocks.matrix + of_matrix(step) * matrix_delta)
    weights = _write_blocks(weights, blocks, new_vector, new_matrix)
    # Keep the tokens' emission scores in step with the emission rows just written.
    change = jnp.where((blocks.vector_part == schedule.EMISSION)[:, None], new_vector - blocks.vector, 0.0)
    change = jnp.concatenate([change, jnp.zeros_like(change[:1])])
    N = data.labels.shape[0]

    def add(cells: CellChunks):
        def body(c, unary):
            token, slot, count = _cell_fields(cells, c, N, B)
            return unary.at[token].add(count.astype(dtype)[:, None] * change[slot])

        return lambda unary: jax.lax.fori_loop(cells.round_begin[r], cells.round_begin[r + 1], body, unary)

    unary = add(data.vector_multi)(add(data.vector_single)(buffers.unary))
    return weights, _mark_round(buffers._replace(unary=unary), data, r, clear=True)


def _write_blocks(weights: _Weights, blocks: _Blocks, vector, matrix) -> _Weights:
    K, K2 = weights.emission.shape[0], weights.pair_emission.shape[0]
    emission_rows = jnp.where(blocks.vector_part == schedule.EMISSION, blocks.vector_row, K)
    emission = weights.emission.at[emission_rows].set(vector, mode="drop")
    is_start = (blocks.vector_part == schedule.START)[:, None]
    start = jnp.where(jnp.any(is_start), jnp.sum(jnp.where(is_start, vector, 0.0), 0), weights.start)
    pair_rows = jnp.where(blocks.matrix_part == schedule.PAIR, blocks.matrix_row, K2)
    pair_emission = weights.pair_emission.at[pair_rows].set(matrix, mode="drop") if K2 else weights.pair_emission
    is_transitions = (blocks.matrix_part == schedule.TRANSITIONS)[:, None, None]
    transitions = jnp.where(
        jnp.any(is_transitions), jnp.sum(jnp.where(is_transitions, matrix, 0.0), 0), weights.transitions
    )
    return weights._replace(emission=emission, start=start, pair_emission=pair_emission, transitions=transitions)


def _initial_buffers(weights: _Weights, model: LinearChainModel, data: BcdData) -> _Buffers:
    N, L = data.labels.shape[0], weights.start.shape[0]
    B, B2 = data.vector_part.shape[1], data.matrix_block.shape[1]
    unary = _pad_row(dataclasses.replace(model, emission=weights.emission).unary(data.unigram_ids[:, None, :])[:, 0])
    zeros = jnp.zeros((N + 1, L), weights.start.dtype)
    return _Buffers(
        unary,
        zeros,
        zeros,
        jnp.full((N + 1,), B, jnp.int32),
        jnp.zeros((N + 1,), jnp.int32),
        jnp.full((N + 1,), B2, jnp.int32),
        jnp.zeros((N + 1,), jnp.int32),
    )


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------


def _check_data(data) -> None:
    if not isinstance(data, BcdData):
        raise TypeError(f"data must be a BcdData (from bcd_data(corpus, model)), got {type(data).__name__}")


def _check_model(model, data: BcdData) -> None:
    if not isinstance(model, LinearChainModel):
        raise TypeError(f"model must be a models.LinearChainModel, got {type(model).__name__}")
    if _dense(data) != (model.pair_emission.shape[0] > 0):
        raise ValueError(
            "model and data disagree about label-pair-observation features: build the data with "
            "bcd_data(corpus, model) for this model"
        )


def bcd_loss(model: LinearChainModel, data: BcdData) -> jax.Array:
    """The summed negative log-likelihood `[]` of the data's corpus (the
    smooth part of the objective BCD minimises)."""
    _check_data(data)
    _check_model(model, data)
    weights = _weights(model)
    buffers = _initial_buffers(weights, model, data)
    zero_beta = jnp.zeros_like(buffers.alpha)

    def body(j, total):
        cells, scores, log_scale = _job_scores(data.sentences, j, weights, buffers, data)
        return total + jnp.sum(_chain_totals(cells, scores, log_scale, zero_beta))

    log_z = jax.lax.fori_loop(0, data.sentences.chain_begin.shape[0] - 1, body, jnp.zeros((), weights.start.dtype))
    return log_z - _gold_score(weights, buffers.unary, data)


def _gold_score(weights: _Weights, unary, data: BcdData) -> jax.Array:
    """The summed score of the gold label sequences."""
    N = data.labels.shape[0]
    labels = data.labels
    previous = jnp.concatenate([jnp.zeros((1,), jnp.int32), labels[:-1]])
    emitted = jnp.sum(jnp.take_along_axis(unary[:N], labels[:, None], 1))
    edges = jnp.where(data.is_first, weights.start[labels], weights.transitions[previous, labels])
    if _dense(data):
        ids = data.pair_ids
        rows = weights.pair_emission.at[
            jnp.where(ids >= 0, ids, weights.pair_emission.shape[0]), previous[:, None], labels[:, None]
        ].get(mode="fill", fill_value=0)
        edges = edges + jnp.where(data.is_first, 0.0, jnp.sum(rows, 1))
    return emitted + jnp.sum(edges)


def bcd_objective(model: LinearChainModel, data: BcdData, l1, l2=0.0) -> jax.Array:
    """`bcd_loss + l1 ||theta||_1 + l2/2 ||theta||^2` over the four weight tables, `[]`."""
    check_penalties(l1, l2)
    weights = _weights(model)
    tables = (weights.emission, weights.transitions, weights.start, weights.pair_emission)
    return bcd_loss(model, data) + sum(l1 * jnp.sum(jnp.abs(x)) + 0.5 * l2 * jnp.sum(x**2) for x in tables)


def bcd_block_statistics(model: LinearChainModel, data: BcdData) -> tuple[LinearChainModel, LinearChainModel]:
    """Every block's gradient and diagonal curvature at `model`, computed as a
    sweep computes them (no update): `(gradient, curvature)`, each the model
    with its weight tables replaced (`emission [K, L]`, `transitions`,
    `start`, `pair_emission`); 0 for masked weights and absent rows."""
    _check_data(data)
    _check_model(model, data)
    weights = _weights(model)
    dtype = weights.start.dtype
    zeros = weights._replace(
        **{
            name: jnp.zeros_like(getattr(weights, name))
            for name in ("emission", "transitions", "start", "pair_emission")
        }
    )

    def body(r, carry):
        gradient, curvature, buffers = carry
        buffers = _mark_round(buffers, data, r, clear=False)
        buffers = _forward_backward(weights, data, buffers, r)
        stats = _statistics(weights, data, buffers, r)
        blocks = _round_blocks(weights, data, r)
        masked = lambda x, mask: jnp.where(mask, x, 0.0).astype(dtype)
        # Every block is in one round: its rows are written once.
        gradient = _write_blocks(
            gradient,
            blocks,
            masked(stats.vector_expected - stats.vector_gold, blocks.vector_mask),
            masked(stats.matrix_expected - stats.matrix_gold, blocks.matrix_mask),
        )
        curvature = _write_blocks(
            curvature,
            blocks,
            masked(stats.vector_curvature, blocks.vector_mask),
            masked(stats.matrix_curvature, blocks.matrix_mask),
        )
        return gradient, curvature, _mark_round(buffers, data, r, clear=True)

    gradient, curvature, _ = jax.lax.fori_loop(
        0, data.num_rounds, body, (zeros, zeros, _initial_buffers(weights, model, data))
    )
    return _with_weights(model, gradient), _with_weights(model, curvature)


def bcd_sweep_fn(data: BcdData, l1, l2=0.0, *, max_step: float = 1.0, max_backtracking: int = 20):
    """The `run_loop` step function of one sweep (every block once, round by
    round): `(model, step) -> (model, objective)`, the objective being
    `bcd_objective` after the sweep.

    max_step: the largest Newton step of one coordinate (module docstring).
    max_backtracking: halvings of a block's step before it is left unchanged.
    """
    _check_data(data)
    check_penalties(l1, l2)
    check_scalar("max_step", max_step, 0, low_open=True)
    check_int("max_backtracking", max_backtracking)

    def step_fn(model, step):
        _check_model(model, data)
        weights = _weights(model)

        def body(r, carry):
            return _round_update(carry[0], data, carry[1], r, l1, l2, max_step, max_backtracking)

        weights, _ = jax.lax.fori_loop(0, data.num_rounds, body, (weights, _initial_buffers(weights, model, data)))
        model = _with_weights(model, weights)
        return model, bcd_objective(model, data, l1, l2)

    return step_fn


def bcd(
    data: BcdData,
    model: LinearChainModel,
    l1,
    l2=0.0,
    *,
    max_steps: int,
    tol: float = 1e-10,
    max_step: float = 1.0,
    max_backtracking: int = 20,
) -> Result:
    """Run up to `max_steps` sweeps from `model`, stopping when the objective's
    relative change falls below `tol`. Jit-able.

    Returns a `Result`: `params` (and `state`) the trained model, `trace`
    `[max_steps]` the objective after each sweep."""
    _check_data(data)
    check_int("max_steps", max_steps)
    loop = init_loop(model, max_steps, model.emission.dtype)
    loop = run_loop(
        bcd_sweep_fn(data, l1, l2, max_step=max_step, max_backtracking=max_backtracking),
        loop,
        max_steps,
        relative_change_below(tol),
    )
    return loop_result(loop, loop.inner)
