"""Observation-feature index: strings -> integer ids, and padded id arrays.

`FeatureIndex.build` keeps the observation strings seen at least `min_count`
times in a training corpus; `FeatureIndex.hashed` maps strings to `num_buckets`
ids by a stable hash (for feature sets too large to index; collisions share a
weight). `encode` turns a sentence's `TokenFeatures` into id lists, `pad_batch`
stacks sentences into `FeatureBatch` arrays padded with id -1, and `pack` and
`pack_rows` (`pack_tokens`, `pack_token_rows` from a token stack built elsewhere)
lay a corpus out as one stack of tokens plus length buckets (`PackedCorpus`).
Real values ride beside the ids as `unigram_values` (None: all 1, binary features).
"""

from __future__ import annotations

import bisect
import itertools
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from ..corpora import doubling_buckets, length_buckets
from .extraction import TokenFeatures

PADDING_ID = -1


class FeatureBatch(NamedTuple):
    """Featurised, padded sentences.

    unigram_ids: `[..., T, F]` int32 emission feature ids, -1 = padding;
    pair_ids: `[..., T, F2]` int32 label-pair-observation feature ids
      (`F2` may be 0);
    lengths: `[...]` int32;
    labels: `[..., T]` int32 gold label ids (-1 past each length), or None;
    unigram_values: `[..., T, F]` float64 values of the emission features
      (0 at padding), or None: every value 1.
    """

    unigram_ids: np.ndarray
    pair_ids: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray | None = None
    unigram_values: np.ndarray | None = None


def stable_hash(text: str, buckets: int) -> int:
    """The bucket in `[0, buckets)` of a feature name, the same in every
    process (Python's `hash()` is salted per process; crc32 is not)."""
    return zlib.crc32(text.encode("utf-8")) % buckets


class FeatureIndex(NamedTuple):
    """Ids of emission (`unigram`) and label-pair (`pair`) observation strings.

    unigram, pair: string -> id dictionaries (None when hashing);
    num_unigram, num_pair: K and K2, the row counts of the weight tables;
    hashed: whether ids come from a stable hash modulo K (resp. K2).
    """

    unigram: dict | None
    pair: dict | None
    num_unigram: int
    num_pair: int
    hashed: bool = False

    @staticmethod
    def build(features: Iterable[TokenFeatures], min_count: int = 1) -> FeatureIndex:
        """Index every observation string seen at least `min_count` times,
        in order of first appearance (so ids are deterministic)."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        features = list(features)
        unigram = vocabulary((name for sentence in features for token in sentence.unigram for name in token), min_count)
        pair = vocabulary((name for sentence in features for token in sentence.pair for name in token), min_count)
        return FeatureIndex(unigram, pair, len(unigram), len(pair))

    @staticmethod
    def hashed_index(num_unigram: int, num_pair: int = 0) -> FeatureIndex:
        """Hash strings into `num_unigram` (resp. `num_pair`) ids; no vocabulary is kept."""
        if num_unigram < 1 or num_pair < 0:
            raise ValueError(f"num_unigram must be >= 1 and num_pair >= 0, got {num_unigram} and {num_pair}")
        return FeatureIndex(None, None, num_unigram, num_pair, hashed=True)

    def _ids(self, names: Sequence[str], table: dict | None, size: int) -> list[int]:
        if self.hashed:
            return sorted({stable_hash(name, size) for name in names}) if size else []
        return [i for i in map(table.get, names) if i is not None]

    def encode(self, features: TokenFeatures) -> tuple:
        """Ids of one sentence's known observations: `(unigram [T][...], pair
        [T][...])`, and `(unigram, pair, unigram_values [T][...])` when the
        features carry values. Unknown strings (unseen or below `min_count`)
        are dropped, with their values. Hashed ids keep each string (and
        value) when there are values, so that colliding strings add up;
        without values a bucket hit twice counts once."""
        if self.unigram is not None and self.pair is not None and features.unigram_values is None:
            return _known_ids(self.unigram, features.unigram), _known_ids(self.pair, features.pair)
        pair = [self._ids(token, self.pair, self.num_pair) for token in features.pair]
        if features.unigram_values is None:
            return [self._ids(token, self.unigram, self.num_unigram) for token in features.unigram], pair
        unigram, values = [], []
        for names, token_values in zip(features.unigram, features.unigram_values):
            if self.hashed:
                ids = [stable_hash(name, self.num_unigram) for name in names]
                kept = list(token_values)
            else:
                found = [(i, value) for i, value in zip(map(self.unigram.get, names), token_values) if i is not None]
                ids, kept = [i for i, _ in found], [value for _, value in found]
            unigram.append(ids)
            values.append(kept)
        return unigram, pair, values


def _known_ids(table: dict, tokens: Sequence[Sequence[str]]) -> list[list[int]]:
    """Per token, the ids of its strings in `table`, unknown ones dropped."""
    try:  # every string known (a training corpus): one C-level pass, then a slice per token
        ids = list(map(table.__getitem__, itertools.chain.from_iterable(tokens)))
    except KeyError:
        return [[i for i in map(table.get, names) if i is not None] for names in tokens]
    ends = list(itertools.accumulate(map(len, tokens)))
    return [ids[start:end] for start, end in zip([0, *ends], ends)]


def vocabulary(names: Iterable[str], min_count: int) -> dict:
    """name -> id for the names seen at least `min_count` times, ids in order
    of first appearance (one C-level pass: dicts and Counters keep that order)."""
    if min_count == 1:
        kept = dict.fromkeys(names)
    else:
        kept = (name for name, count in Counter(names).items() if count >= min_count)
    return {name: i for i, name in enumerate(kept)}


def ragged_rows(flat: np.ndarray, counts: np.ndarray, fill, width: int | None = None) -> np.ndarray:
    """`[n, width]` rows from a ragged array: row i holds the next `counts[i]`
    entries of `flat [sum(counts)]`, then `fill` (width: the largest count)."""
    counts = np.asarray(counts, dtype=np.int64)
    flat = np.asarray(flat)
    width = int(counts.max(initial=0)) if width is None else width
    out = np.full((counts.size, width), fill, dtype=flat.dtype)
    starts = np.cumsum(counts) - counts
    row = np.repeat(np.arange(counts.size), counts)
    out[row, np.arange(flat.size) - starts[row]] = flat
    return out


def _pad(
    rows: Sequence[Sequence[Sequence]], max_length: int, fill: float = PADDING_ID, dtype: type = np.int32
) -> np.ndarray:
    """`[B, max_length, F]` from `[B][T][...]` nested lists (vectorised: one
    pass flattens them, one scatter places them)."""
    sentence_lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    tokens = list(itertools.chain.from_iterable(rows))
    counts = np.fromiter(map(len, tokens), np.int64, len(tokens))
    flat = np.fromiter(itertools.chain.from_iterable(tokens), dtype, int(counts.sum()))
    stack = ragged_rows(flat, counts, fill)
    out = np.full((len(rows), max_length, stack.shape[1]), fill, dtype=dtype)
    sentence = np.repeat(np.arange(len(rows)), sentence_lengths)
    out[sentence, np.arange(len(tokens)) - (np.cumsum(sentence_lengths) - sentence_lengths)[sentence]] = stack
    return out


def pad_batch(
    encoded: Sequence[tuple], labels: Sequence[Sequence[int]] | None = None, max_length: int | None = None
) -> FeatureBatch:
    """Stack encoded sentences (from `FeatureIndex.encode`, with or without
    values) into a `FeatureBatch` padded to `max_length` positions (default:
    the longest) and to the widest token."""
    lengths = np.array([len(sentence[0]) for sentence in encoded], dtype=np.int32)
    longest = int(lengths.max()) if lengths.size else 0
    max_length = longest if max_length is None else max_length
    if max_length < longest:
        raise ValueError(f"max_length must be >= the longest sentence ({longest}), got {max_length}")
    unigram_ids = _pad([sentence[0] for sentence in encoded], max_length)
    pair_ids = _pad([sentence[1] for sentence in encoded], max_length)
    unigram_values = None
    if any(len(sentence) > 2 for sentence in encoded):
        ones = lambda sentence: [[1.0] * len(token) for token in sentence[0]]  # one encoded without values
        unigram_values = _pad(
            [sentence[2] if len(sentence) > 2 else ones(sentence) for sentence in encoded], max_length, 0.0, np.float64
        )
    label_array = None
    if labels is not None:
        label_array = np.full((len(encoded), max_length), -1, dtype=np.int32)
        for b, sequence in enumerate(labels):
            if len(sequence) != lengths[b]:
                raise ValueError(f"labels[{b}] has {len(sequence)} labels for a sentence of {lengths[b]} tokens")
            label_array[b, : len(sequence)] = sequence
    return FeatureBatch(unigram_ids, pair_ids, lengths, label_array, unigram_values)


def observed_label_pairs(batches: Iterable[FeatureBatch], num_features: int, num_labels: int) -> np.ndarray:
    """`[K, L]` bool: which (emission feature, label) pairs occur in the
    labelled batches. CRFsuite creates state features only for these (its
    default), so a model masked by it has CRFsuite's parameter set."""
    seen = np.zeros((num_features, num_labels), dtype=bool)
    for batch in batches:
        ids = batch.unigram_ids
        labels = np.broadcast_to(batch.labels[..., None], ids.shape)
        keep = (ids >= 0) & (labels >= 0)
        seen[ids[keep], labels[keep]] = True
    return seen


def observed_label_triples(batches: Iterable[FeatureBatch], num_pair_features: int, num_labels: int) -> np.ndarray:
    """`[K2, L, L]` bool: which (label-pair-observation feature, previous
    label, label) triples occur in the labelled batches (from the second
    position of each sentence on, where pair features apply): the
    `pair_mask` of `LinearChainModel.with_pair_mask`, CRFsuite's convention
    of creating only features seen in training."""
    seen = np.zeros((num_pair_features, num_labels, num_labels), dtype=bool)
    for batch in batches:
        ids, labels = batch.pair_ids[..., 1:, :], batch.labels
        previous = np.broadcast_to(labels[..., :-1, None], ids.shape)
        current = np.broadcast_to(labels[..., 1:, None], ids.shape)
        keep = (ids >= 0) & (previous >= 0) & (current >= 0)
        seen[ids[keep], previous[keep], current[keep]] = True
    return seen


def observed_transitions(packed: PackedCorpus, num_labels: int) -> np.ndarray:
    """`[L, L]` bool: which (previous label, label) pairs follow each other
    inside a sentence of the labelled packed corpus (never across the
    sentence boundaries of `pack_rows`' rows): the transition features
    CRFsuite creates without `possible_transitions`."""
    if packed.labels is None:
        raise ValueError("packed must be labelled (packed with labels)")
    seen = np.zeros((num_labels, num_labels), dtype=bool)
    starts = packed.starts if packed.starts is not None else (None,) * len(packed.positions)
    for positions, labels, first in zip(packed.positions, packed.labels, starts):
        positions, labels = np.asarray(positions), np.asarray(labels)
        follows = (positions[:, 1:] >= 0) & (positions[:, :-1] >= 0)
        if first is not None:
            follows &= ~np.asarray(first)[:, 1:]
        seen[labels[:, :-1][follows], labels[:, 1:][follows]] = True
    return seen


class PackedCorpus(NamedTuple):
    """A corpus as one stack of real tokens plus padded length buckets that
    point into it, so feature gathers never touch padding and only a few
    bucket shapes are compiled.

    unigram_ids: `[N, F]` int32 over all N tokens of the corpus (-1 = padding);
    pair_ids: `[N, F2]` int32;
    positions: per bucket `[B_b, T_b]` int32 rows of the token stack (-1 past each length);
    lengths: per bucket `[B_b]` int32;
    labels: per bucket `[B_b, T_b]` int32 (-1 past each length), or None;
    members: per bucket `[B_b]` the sentences' indices in the corpus (for
      rows of several sentences, `pack_rows`: every sentence in the bucket,
      in packing order);
    starts: None (one sentence per row), or per bucket `[B_b, T_b]` bool,
      True at each sentence's first position in its row (`pack_rows`);
    unigram_values: `[N, F]` float64 values of `unigram_ids` (0 at
      padding), or None: every value 1.
    """

    unigram_ids: np.ndarray
    pair_ids: np.ndarray
    positions: tuple
    lengths: tuple
    labels: tuple | None
    members: tuple
    starts: tuple | None = None
    unigram_values: np.ndarray | None = None


def _token_stack(encoded):
    """`(sentence lengths, FeatureBatch of all tokens as one row)`."""
    sentence_lengths = [len(sentence[0]) for sentence in encoded]
    if len({len(sentence) for sentence in encoded}) > 1:
        raise ValueError("encoded sentences must all carry values or none (2- or 3-tuples from FeatureIndex.encode)")
    stack = pad_batch(
        [
            tuple(
                list(itertools.chain.from_iterable(sentence[part] for sentence in encoded))
                for part in range(len(encoded[0]) if encoded else 2)
            )
        ]
    )
    return sentence_lengths, stack


def _stacked(stack: FeatureBatch) -> dict:
    """The keyword arguments of `pack_tokens` held by a one-row `FeatureBatch`."""
    return {
        "pair_ids": stack.pair_ids[0],
        "unigram_values": None if stack.unigram_values is None else stack.unigram_values[0],
    }


def _check_label_lengths(labels, sentence_lengths) -> None:
    for i, (sequence, length) in enumerate(zip(labels, sentence_lengths)):
        if len(sequence) != length:
            raise ValueError(f"labels[{i}] has {len(sequence)} labels for a sentence of {length} tokens")


def _check_stack(unigram_ids, sentence_lengths, pair_ids, unigram_values):
    """The token stack's arrays, checked against each other: `(unigram_ids,
    sentence lengths, offsets [S + 1], pair_ids, unigram_values)`."""
    unigram_ids = np.asarray(unigram_ids)
    if unigram_ids.ndim != 2:
        raise ValueError(f"unigram_ids must have shape [N, F], got shape {unigram_ids.shape}")
    sentence_lengths = [int(n) for n in sentence_lengths]
    offsets = np.concatenate([[0], np.cumsum(sentence_lengths)]).astype(np.int64)
    if offsets[-1] != unigram_ids.shape[0]:
        raise ValueError(
            f"sentence_lengths must add up to the {unigram_ids.shape[0]} tokens of unigram_ids, got {offsets[-1]}"
        )
    pair_ids = np.zeros((unigram_ids.shape[0], 0), np.int32) if pair_ids is None else np.asarray(pair_ids)
    if pair_ids.shape[0] != unigram_ids.shape[0]:
        raise ValueError(f"pair_ids must have shape [N, F2] with N = {unigram_ids.shape[0]}, got {pair_ids.shape}")
    if unigram_values is not None:
        unigram_values = np.asarray(unigram_values, dtype=np.float64)
        if unigram_values.shape != unigram_ids.shape:
            raise ValueError(
                f"unigram_values must have the shape of unigram_ids {unigram_ids.shape}, got {unigram_values.shape}"
            )
    return unigram_ids, sentence_lengths, offsets, pair_ids, unigram_values


def pack(
    encoded: Sequence[tuple], labels: Sequence[Sequence[int]] | None = None, num_buckets: int | None = 6
) -> PackedCorpus:
    """Pack encoded sentences (from `FeatureIndex.encode`, with or without
    values) and optional label ids into a `PackedCorpus` with at most
    `num_buckets` length buckets (`corpora.length_buckets`), or with None one
    bucket per power-of-two length (`corpora.doubling_buckets`: the decoding
    layout, whose shapes other corpora share)."""
    sentence_lengths, stack = _token_stack(encoded)
    return pack_tokens(stack.unigram_ids[0], sentence_lengths, labels, num_buckets, **_stacked(stack))


def pack_tokens(
    unigram_ids,
    sentence_lengths: Sequence[int] | np.ndarray,
    labels: Sequence[Sequence[int]] | None = None,
    num_buckets: int | None = 6,
    *,
    pair_ids=None,
    unigram_values=None,
) -> PackedCorpus:
    """`pack` from a token stack: `unigram_ids [N, F]` (-1 = padding) over the
    N tokens of sentences of `sentence_lengths [S]`, in order; `pair_ids
    [N, F2]` (default none) and `unigram_values [N, F]` (default all 1)."""
    unigram_ids, sentence_lengths, offsets, pair_ids, unigram_values = _check_stack(
        unigram_ids, sentence_lengths, pair_ids, unigram_values
    )
    if labels is not None:
        _check_label_lengths(labels, sentence_lengths)
    positions, lengths, label_arrays, members = [], [], [], []
    buckets = (
        doubling_buckets(sentence_lengths) if num_buckets is None else length_buckets(sentence_lengths, num_buckets)
    )
    for indices, padded_length in buckets:
        bucket_lengths = np.array([sentence_lengths[i] for i in indices], dtype=np.int32)
        steps = np.arange(padded_length)
        inside = steps < bucket_lengths[:, None]
        positions.append(np.where(inside, offsets[indices][:, None] + steps, PADDING_ID).astype(np.int32))
        lengths.append(bucket_lengths)
        members.append(np.asarray(indices))
        if labels is not None:
            bucket_labels = np.full((len(indices), padded_length), -1, dtype=np.int32)
            for row, i in enumerate(indices):
                bucket_labels[row, : sentence_lengths[i]] = labels[i]
            label_arrays.append(bucket_labels)
    return PackedCorpus(
        unigram_ids,
        pair_ids,
        tuple(positions),
        tuple(lengths),
        tuple(label_arrays) if labels is not None else None,
        tuple(members),
        None,
        unigram_values,
    )


def pack_rows(
    encoded: Sequence[tuple], labels: Sequence[Sequence[int]], width: int | None = None, multiple: int = 8
) -> PackedCorpus:
    """Pack labelled encoded sentences back to back into rows of `width`
    positions (default: the longest sentence, rounded up to `multiple`),
    `starts` marking each sentence's first position, for the row losses
    (`losses.row_sequence_log_loss`). Rows are filled greedily, each from
    the longest sentence left, then the longest that still fit, so padding
    is only at row ends. Sentences longer than `width` go into a second
    bucket of rows as wide as the longest (rounded up to `multiple`): the
    scan over a row takes its positions one after another, so narrow rows
    for most sentences and a few wide ones for the outliers train faster
    than every row as wide as the longest sentence.
    Sentences of length 0 are left out (they add nothing to a log-loss)."""
    sentence_lengths, stack = _token_stack(encoded)
    return pack_token_rows(stack.unigram_ids[0], sentence_lengths, labels, width, multiple, **_stacked(stack))


def _greedy_rows(pool: list, width: int) -> list:
    """`pool`'s sentences `[(length, index)]` (sorted) in rows of at most
    `width` positions: each row from the longest left, then the longest that still fit."""
    rows = []
    while pool:
        length, i = pool.pop()
        row, free = [i], width - length
        while pool:
            k = bisect.bisect_right(pool, (free, np.iinfo(np.int64).max)) - 1
            if k < 0:
                break
            length, i = pool.pop(k)
            row.append(i)
            free -= length
        rows.append(row)
    return rows


def _row_bucket(rows: list, width: int, sentence_lengths: np.ndarray, offsets: np.ndarray, labels: np.ndarray):
    """`(positions, row lengths, row labels, members, starts)` of `rows`
    (lists of sentence indices) `width` positions wide, as `pack_token_rows`
    returns them, filled vectorised; `labels` `[N]` label ids of the token stack."""
    members = np.fromiter(itertools.chain.from_iterable(rows), np.int64)
    member_lengths = sentence_lengths[members]
    sizes = np.fromiter(map(len, rows), np.int64, len(rows))
    row_of = np.repeat(np.arange(len(rows)), sizes)
    # Each sentence's first column: its offset in the concatenation minus its row's.
    begins = np.cumsum(member_lengths) - member_lengths
    column = begins - np.repeat(begins[np.cumsum(sizes) - sizes], sizes)
    token_step = np.arange(int(member_lengths.sum())) - np.repeat(begins, member_lengths)
    token_rows = np.repeat(row_of, member_lengths)
    token_columns = np.repeat(column, member_lengths) + token_step
    tokens = np.repeat(offsets[members], member_lengths) + token_step
    positions = np.full((len(rows), width), PADDING_ID, dtype=np.int32)
    row_labels = np.full((len(rows), width), -1, dtype=np.int32)
    starts = np.zeros((len(rows), width), dtype=bool)
    positions[token_rows, token_columns] = tokens
    row_labels[token_rows, token_columns] = labels[tokens]
    starts[row_of, column] = True
    row_lengths = np.bincount(row_of, weights=member_lengths, minlength=len(rows)).astype(np.int32)
    return positions, row_lengths, row_labels, members, starts


def pack_token_rows(
    unigram_ids,
    sentence_lengths: Sequence[int] | np.ndarray,
    labels: Sequence[Sequence[int]],
    width: int | None = None,
    multiple: int = 8,
    *,
    pair_ids=None,
    unigram_values=None,
) -> PackedCorpus:
    """`pack_rows` from a token stack (arguments as in `pack_tokens`)."""
    unigram_ids, sentence_lengths, offsets, pair_ids, unigram_values = _check_stack(
        unigram_ids, sentence_lengths, pair_ids, unigram_values
    )
    _check_label_lengths(labels, sentence_lengths)
    wide = max(multiple * -(-max(sentence_lengths, default=0) // multiple), multiple)
    if width is None:
        width = wide
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
        raise ValueError(f"width must be a positive int, got {width!r}")
    pool = sorted((length, i) for i, length in enumerate(sentence_lengths) if length > 0)
    split = bisect.bisect_right(pool, (width, np.iinfo(np.int64).max))
    groups = [(width, pool[:split])] + ([(wide, pool[split:])] if split < len(pool) else [])
    stack_labels = np.fromiter(itertools.chain.from_iterable(labels), np.int32, int(offsets[-1]))
    lengths = np.asarray(sentence_lengths, np.int64)
    buckets = [
        _row_bucket(_greedy_rows(group, bucket_width), bucket_width, lengths, offsets, stack_labels)
        for bucket_width, group in groups
    ]
    positions, row_lengths, row_labels, members, starts = (tuple(parts) for parts in zip(*buckets))
    return PackedCorpus(unigram_ids, pair_ids, positions, row_lengths, row_labels, members, starts, unigram_values)
