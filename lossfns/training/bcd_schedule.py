"""The plan of a block coordinate descent sweep, built once in numpy.

A block update (`training.bcd`) needs the forward-backward scores of exactly the
sentences in which the block is active (Lavergne et al. 2010, section 3.4). This
module turns a labelled corpus into the static arrays a compiled sweep walks
through: the blocks; their visits (block, sentence, active span and cells); rounds
of blocks that share no sentence; the chains each visit runs (resumed from scores
still exact since the sentence's last visit); and jobs that pack chains into fixed
grids, so that every job of a kind compiles to one shape.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

import numpy as np

# Block parts: what the L-vector and the L x L-matrix part of a block are.
NO_PART, EMISSION, START = 0, 1, 2  # vector parts
PAIR, TRANSITIONS = 1, 2  # matrix parts (NO_PART: none)
# How a chain's first cell is scored: the sentence's start scores, the stored
# forward scores, the reversed chain's start, the stored backward scores.
SENTENCE_START, FROM_FORWARD, REVERSED_START, FROM_BACKWARD = 0, 1, 2, 3


class Sentences(NamedTuple):
    """labels: `[N]` gold label of each token; offsets: `[S + 1]` first token
    of each sentence (and N)."""

    labels: np.ndarray
    offsets: np.ndarray


def corpus_sentences(corpus) -> Sentences:
    """The sentences of a labelled `features.PackedCorpus` (`pack` or
    `pack_rows`) as runs of its token stack."""
    num_tokens = corpus.unigram_ids.shape[0]
    if corpus.labels is None:
        raise ValueError("corpus must be labelled (features.pack(encoded, labels) or features.pack_rows)")
    labels = np.full(num_tokens, -1, np.int64)
    first = np.zeros(num_tokens, bool)
    seen = np.zeros(num_tokens, bool)
    for b, positions in enumerate(corpus.positions):
        positions = np.asarray(positions)
        inside = positions >= 0
        labels[positions[inside]] = np.asarray(corpus.labels[b])[inside]
        seen[positions[inside]] = True
        starts = (
            (np.arange(positions.shape[1]) == 0)[None, :] if corpus.starts is None else np.asarray(corpus.starts[b])
        )
        first[positions[inside & starts]] = True
    if not seen.all():
        raise ValueError(f"corpus: token {int(np.argmin(seen))} of the token stack is in no bucket")
    if (labels < 0).any():
        raise ValueError(
            f"corpus labels must be label ids >= 0 (a labelled corpus), got {int(labels.min())} at "
            f"token {int(np.argmin(labels))}"
        )
    offsets = np.concatenate([np.nonzero(first)[0], [num_tokens]]).astype(np.int64)
    if num_tokens and offsets[0] != 0:
        raise ValueError("corpus: the token stack must start with a sentence's first token")
    return Sentences(labels, offsets)


class Blocks(NamedTuple):
    """vector_part, matrix_part: `[B]` kinds; vector_row, matrix_row: `[B]`
    rows in their tables; cells: `(block [C], token [C], count [C], is_matrix
    [C])` the active cells."""

    vector_part: np.ndarray
    vector_row: np.ndarray
    matrix_part: np.ndarray
    matrix_row: np.ndarray
    cells: tuple


def _occurrences(ids: np.ndarray, num_rows: int, keep: np.ndarray):
    """Distinct `(row, token)` pairs of `ids [N, F]` (rows < num_rows, tokens
    where `keep`) with their multiplicities, sorted by row."""
    tokens = np.broadcast_to(np.arange(ids.shape[0])[:, None], ids.shape)
    valid = (ids >= 0) & (ids < num_rows) & keep[:, None]
    key = ids[valid].astype(np.int64) * ids.shape[0] + tokens[valid]
    unique, counts = np.unique(key, return_counts=True)
    return unique // ids.shape[0], unique % ids.shape[0], counts


def corpus_blocks(corpus, sentences: Sentences, num_features: int, num_pair_features: int) -> Blocks:
    """Block 0: transitions and start; then the emission rows that occur; then
    the label-pair rows that occur after a sentence's first position."""
    num_tokens = sentences.labels.shape[0]
    first = np.zeros(num_tokens, bool)
    first[sentences.offsets[:-1]] = True
    rows, tokens, counts = _occurrences(np.asarray(corpus.unigram_ids), num_features, np.ones(num_tokens, bool))
    emission_rows, emission_block = np.unique(rows, return_inverse=True)
    pair_ids = np.asarray(corpus.pair_ids)
    if pair_ids.shape[1] and num_pair_features:
        pair_rows_of, pair_tokens, pair_counts = _occurrences(pair_ids, num_pair_features, ~first)
    else:
        pair_rows_of = pair_tokens = pair_counts = np.zeros(0, np.int64)
    pair_rows, pair_block = np.unique(pair_rows_of, return_inverse=True)
    num_emission = emission_rows.shape[0]
    all_tokens = np.arange(num_tokens)
    block = np.concatenate([np.zeros(num_tokens, np.int64), 1 + emission_block, 1 + num_emission + pair_block])
    token = np.concatenate([all_tokens, tokens, pair_tokens])
    count = np.concatenate([np.ones(num_tokens, np.int64), counts, pair_counts])
    is_matrix = np.concatenate([~first, np.zeros(tokens.shape[0], bool), np.ones(pair_tokens.shape[0], bool)])
    num_pair = pair_rows.shape[0]
    vector_part = np.concatenate([[START], np.full(num_emission, EMISSION), np.full(num_pair, NO_PART)])
    vector_row = np.concatenate([[0], emission_rows, np.zeros(num_pair, np.int64)])
    matrix_part = np.concatenate([[TRANSITIONS], np.full(num_emission, NO_PART), np.full(num_pair, PAIR)])
    matrix_row = np.concatenate([[0], np.zeros(num_emission, np.int64), pair_rows])
    return Blocks(vector_part, vector_row, matrix_part, matrix_row, (block, token, count, is_matrix))


class Visits(NamedTuple):
    """Per (block, sentence) pair: block, sentence, first and last active
    positions `[V]`; cell_visit: `[C]` the visit of each active cell."""

    block: np.ndarray
    sentence: np.ndarray
    first: np.ndarray
    last: np.ndarray
    cell_visit: np.ndarray


def block_visits(blocks: Blocks, sentences: Sentences) -> Visits:
    block, token = blocks.cells[0], blocks.cells[1]
    sentence = np.searchsorted(sentences.offsets, token, side="right") - 1
    position = token - sentences.offsets[sentence]
    num_sentences = sentences.offsets.shape[0] - 1
    key = block * num_sentences + sentence
    order = np.argsort(key, kind="stable")
    unique, starts, cell_visit = np.unique(key[order], return_index=True, return_inverse=True)
    first = np.minimum.reduceat(position[order], starts)
    last = np.maximum.reduceat(position[order], starts)
    inverse = np.empty_like(cell_visit)
    inverse[order] = cell_visit
    return Visits(unique // num_sentences, unique % num_sentences, first, last, inverse)


class Extents(NamedTuple):
    """Per visit `[V]`: first token, length and first-cell mode of its forward
    chain and of its backward chain (length 0: none needed)."""

    forward_token: np.ndarray
    forward_length: np.ndarray
    forward_mode: np.ndarray
    backward_token: np.ndarray
    backward_length: np.ndarray
    backward_mode: np.ndarray


def chain_extents(visits: Visits, visit_round: np.ndarray, sentences: Sentences) -> Extents:
    """The forward and backward chains of each visit, reusing the scores the
    sentence's previous visit (in round order) left exact (module docstring)."""
    offsets = sentences.offsets
    order = np.lexsort((visit_round, visits.sentence))
    sentence, first, last = visits.sentence[order], visits.first[order], visits.last[order]
    length = offsets[sentence + 1] - offsets[sentence]
    begin = offsets[sentence]
    seen = np.concatenate([[False], sentence[1:] == sentence[:-1]])
    previous_first = np.concatenate([[0], first[:-1]])
    previous_last = np.concatenate([[0], last[:-1]])
    # Forward: from the sentence start, or from the stored scores at f' - 1.
    resume = seen & (previous_first > 0)
    forward_from = np.where(resume, previous_first - 1, 0)
    forward_length = np.where(resume & (last < previous_first), 0, last - forward_from + 1)
    forward_mode = np.where(resume, FROM_FORWARD, SENTENCE_START)
    # Backward (reversed): from the sentence end, or from the stored scores at l' + 1.
    resume = seen & (previous_last < length - 1)
    backward_from = np.where(resume, previous_last + 1, length - 1)
    backward_length = np.where(resume & (first > previous_last), 0, backward_from - first + 1)
    backward_mode = np.where(resume, FROM_BACKWARD, REVERSED_START)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.shape[0])
    return Extents(
        *(
            x[inverse]
            for x in (
                begin + forward_from,
                forward_length,
                forward_mode,
                begin + backward_from,
                backward_length,
                backward_mode,
            )
        )
    )


def colour_blocks(visits: Visits, num_blocks: int, num_sentences: int) -> np.ndarray:
    """`[B]` round of each block: first fit over the rounds, blocks with the
    most visits first, never two blocks of a round in one sentence."""
    visit_counts = np.bincount(visits.block, minlength=num_blocks)
    starts = np.concatenate([[0], np.cumsum(visit_counts)])  # visits are sorted by block
    words = max(1, -(-2 * int(np.bincount(visits.sentence, minlength=num_sentences).max(initial=1)) // 64))
    used = np.zeros((num_sentences, words), np.uint64)
    rounds = np.zeros(num_blocks, np.int64)
    order = np.argsort(-visit_counts, kind="stable")
    several = order[visit_counts[order] > 1]
    for b in several:
        members = visits.sentence[starts[b] : starts[b + 1]]
        free = ~np.bitwise_or.reduce(used[members], axis=0)
        if not free.any():
            used = np.concatenate([used, np.zeros_like(used)], axis=1)
            free = ~np.bitwise_or.reduce(used[members], axis=0)
        word = int(np.argmax(free != 0))
        bit = int(free[word]) & -int(free[word])
        rounds[b] = word * 64 + bit.bit_length() - 1
        used[members, word] |= np.uint64(bit)
    # Blocks seen in one sentence only: that sentence's lowest free rounds.
    single = order[visit_counts[order] == 1]
    sentence_of = visits.sentence[starts[single]]
    by_sentence = np.argsort(sentence_of, kind="stable")
    single, sentence_of = single[by_sentence], sentence_of[by_sentence]
    bounds = np.concatenate([[0], np.cumsum(np.bincount(sentence_of, minlength=num_sentences))])
    for s in np.nonzero(np.diff(bounds))[0]:
        members = single[bounds[s] : bounds[s + 1]]
        free = np.nonzero(~np.unpackbits(used[s].view(np.uint8), bitorder="little").astype(bool))[0]
        if free.shape[0] < members.shape[0]:
            extra = np.arange(used.shape[1] * 64, used.shape[1] * 64 + members.shape[0])
            free = np.concatenate([free, extra])
        rounds[members] = free[: members.shape[0]]
    # Renumber the rounds used, keeping their order.
    return np.unique(rounds, return_inverse=True)[1]


class Jobs(NamedTuple):
    """Chains packed into jobs of `rows x width` cells.

    chain_begin: `[J + 1]` chains of job j are `[chain_begin[j],
    chain_begin[j + 1])`; round_begin: `[R + 1]` jobs of round r; cell:
    `[Z]` the chain's first cell in its job's grid (row-major); token,
    length, mode, slot: `[Z]`; direction: `[J]` +1 or -1 (token step);
    max_chains: the most chains in one job.
    """

    chain_begin: np.ndarray
    round_begin: np.ndarray
    cell: np.ndarray
    token: np.ndarray
    length: np.ndarray
    mode: np.ndarray
    slot: np.ndarray
    direction: np.ndarray
    max_chains: int


def _next_fit(lengths: list[int], width: int) -> list[int]:
    """Row of each chain (in the given order): next fit into rows of `width`."""
    cumulative = [0]
    for length in lengths:
        cumulative.append(cumulative[-1] + length)
    rows, row, begin = [], 0, 0
    while begin < len(lengths):
        end = bisect.bisect_right(cumulative, cumulative[begin] + width) - 1
        rows.extend([row] * (end - begin))
        row, begin = row + 1, end
    return rows


def pack_jobs(
    round_of: np.ndarray,
    num_rounds: int,
    token: np.ndarray,
    length: np.ndarray,
    mode: np.ndarray,
    slot: np.ndarray,
    direction: int,
    rows: int,
    width: int,
) -> Jobs:
    """Pack chains (`[Z]` fields; `round_of` their round; chains of length 0
    are dropped) into jobs per round, longest chains first (next fit), `rows`
    rows of `width` cells per job."""
    keep = length > 0
    round_of, token, length, mode, slot = (x[keep] for x in (round_of, token, length, mode, slot))
    order = np.lexsort((-length, round_of))
    round_of, token, length, mode, slot = (x[order] for x in (round_of, token, length, mode, slot))
    bounds = np.concatenate([[0], np.cumsum(np.bincount(round_of, minlength=num_rounds))])
    cell = np.zeros(order.shape[0], np.int64)
    job = np.zeros(order.shape[0], np.int64)
    round_begin, jobs = [0], 0
    for r in range(num_rounds):
        lo, hi = bounds[r], bounds[r + 1]
        row_of = np.asarray(_next_fit(length[lo:hi].tolist(), width), np.int64)
        if hi > lo:
            before = np.cumsum(length[lo:hi]) - length[lo:hi]  # cells before each chain, over the round
            column = before - before[np.searchsorted(row_of, row_of)]
            job[lo:hi] = jobs + row_of // rows
            cell[lo:hi] = (row_of % rows) * width + column
            jobs += int(row_of[-1]) // rows + 1
        round_begin.append(jobs)
    chain_begin = np.searchsorted(job, np.arange(jobs + 1), side="left")
    max_chains = int(np.diff(chain_begin).max(initial=1))
    return Jobs(
        chain_begin,
        np.asarray(round_begin),
        cell,
        token,
        length,
        mode,
        slot,
        np.full(jobs, direction, np.int64),
        max_chains,
    )


def chunk_cells(round_of: np.ndarray, num_rounds: int, size: int, *fields):
    """Cells (`fields`, each `[C]`) grouped by round and padded to whole
    chunks of `size`: `(round_begin [R + 1] in chunks, fields as [chunks,
    size])`, padding filled with -1."""
    order = np.argsort(round_of, kind="stable")
    counts = np.bincount(round_of, minlength=num_rounds)
    chunks = -(-counts // size)
    round_begin = np.concatenate([[0], np.cumsum(chunks)])
    rank = np.arange(order.shape[0]) - np.concatenate([[0], np.cumsum(counts)])[round_of[order]]
    place = round_begin[round_of[order]] * size + rank
    out = []
    for field in fields:
        # At least one chunk, so that no array is empty (a round without cells never reads it).
        padded = np.full(max(int(round_begin[-1]), 1) * size, -1, np.int64)
        padded[place] = field[order]
        out.append(padded.reshape(-1, size))
    return round_begin, out
