"""Observation-feature index: strings -> integer ids, and padded id arrays.

`FeatureIndex.build` counts observation strings over a training corpus and
keeps those seen at least `min_count` times; `FeatureIndex.hashed` maps
strings to `num_buckets` ids by a stable hash instead (for feature sets too
large to index; collisions share a weight). `encode` turns one sentence's
`TokenFeatures` into id lists and `pad_batch` stacks sentences into
`FeatureBatch` arrays padded with id -1.
"""

from __future__ import annotations

import bisect
import zlib
from collections import Counter
from typing import Iterable, NamedTuple, Optional, Sequence

import numpy as np

from ..corpora import length_buckets
from .extraction import TokenFeatures

PADDING_ID = -1


class FeatureBatch(NamedTuple):
    """Featurised, padded sentences.

    unigram_ids: `[..., T, F]` int32 emission feature ids, -1 = padding;
    pair_ids: `[..., T, F2]` int32 label-pair-observation feature ids
      (`F2` may be 0);
    lengths: `[...]` int32;
    labels: `[..., T]` int32 gold label ids (-1 past each length), or None.
    """

    unigram_ids: np.ndarray
    pair_ids: np.ndarray
    lengths: np.ndarray
    labels: Optional[np.ndarray] = None


def _stable_hash(text: str, buckets: int) -> int:
    # Python's hash() is salted per process; crc32 is the same everywhere.
    return zlib.crc32(text.encode("utf-8")) % buckets


class FeatureIndex(NamedTuple):
    """Ids of emission (`unigram`) and label-pair (`pair`) observation strings.

    unigram, pair: string -> id dictionaries (None when hashing);
    num_unigram, num_pair: K and K2, the row counts of the weight tables;
    hashed: whether ids come from a stable hash modulo K (resp. K2).
    """

    unigram: Optional[dict]
    pair: Optional[dict]
    num_unigram: int
    num_pair: int
    hashed: bool = False

    @staticmethod
    def build(features: Iterable[TokenFeatures], min_count: int = 1) -> "FeatureIndex":
        """Index every observation string seen at least `min_count` times,
        in order of first appearance (so ids are deterministic)."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        features = list(features)

        def vocabulary(names):
            # One C-level pass over all strings (dicts and Counters keep first-seen order).
            if min_count == 1:
                kept = dict.fromkeys(names)
            else:
                kept = (name for name, count in Counter(names).items() if count >= min_count)
            return {name: i for i, name in enumerate(kept)}

        unigram = vocabulary(name for sentence in features for token in sentence.unigram for name in token)
        pair = vocabulary(name for sentence in features for token in sentence.pair for name in token)
        return FeatureIndex(unigram, pair, len(unigram), len(pair))

    @staticmethod
    def hashed_index(num_unigram: int, num_pair: int = 0) -> "FeatureIndex":
        """Hash strings into `num_unigram` (resp. `num_pair`) ids; no vocabulary is kept."""
        if num_unigram < 1 or num_pair < 0:
            raise ValueError(f"num_unigram must be >= 1 and num_pair >= 0, got {num_unigram} and {num_pair}")
        return FeatureIndex(None, None, num_unigram, num_pair, hashed=True)

    def _ids(self, names: Sequence[str], table: Optional[dict], size: int) -> list[int]:
        if self.hashed:
            return sorted({_stable_hash(name, size) for name in names}) if size else []
        return [i for i in map(table.get, names) if i is not None]

    def encode(self, features: TokenFeatures) -> tuple[list[list[int]], list[list[int]]]:
        """Ids of one sentence's known observations: `([T][...], [T][...])`.
        Unknown strings (unseen or below `min_count`) are dropped."""
        unigram = [self._ids(token, self.unigram, self.num_unigram) for token in features.unigram]
        pair = [self._ids(token, self.pair, self.num_pair) for token in features.pair]
        return unigram, pair


def _pad(rows: Sequence[Sequence[Sequence[int]]], max_length: int) -> np.ndarray:
    width = max((len(token) for sentence in rows for token in sentence), default=0)
    out = np.full((len(rows), max_length, width), PADDING_ID, dtype=np.int32)
    for b, sentence in enumerate(rows):
        for t, token in enumerate(sentence):
            out[b, t, : len(token)] = token
    return out


def pad_batch(encoded: Sequence[tuple[list[list[int]], list[list[int]]]], labels: Optional[Sequence[Sequence[int]]] = None,
              max_length: Optional[int] = None) -> FeatureBatch:
    """Stack encoded sentences into a `FeatureBatch` padded to `max_length`
    positions (default: the longest) and to the widest token."""
    lengths = np.array([len(unigram) for unigram, _ in encoded], dtype=np.int32)
    longest = int(lengths.max()) if lengths.size else 0
    max_length = longest if max_length is None else max_length
    if max_length < longest:
        raise ValueError(f"max_length must be >= the longest sentence ({longest}), got {max_length}")
    unigram_ids = _pad([u for u, _ in encoded], max_length)
    pair_ids = _pad([p for _, p in encoded], max_length)
    label_array = None
    if labels is not None:
        label_array = np.full((len(encoded), max_length), -1, dtype=np.int32)
        for b, sequence in enumerate(labels):
            if len(sequence) != lengths[b]:
                raise ValueError(f"labels[{b}] has {len(sequence)} labels for a sentence of {lengths[b]} tokens")
            label_array[b, : len(sequence)] = sequence
    return FeatureBatch(unigram_ids, pair_ids, lengths, label_array)


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
      True at each sentence's first position in its row (`pack_rows`).
    """

    unigram_ids: np.ndarray
    pair_ids: np.ndarray
    positions: tuple
    lengths: tuple
    labels: Optional[tuple]
    members: tuple
    starts: Optional[tuple] = None


def _token_stack(encoded):
    """`(sentence lengths, offsets [N + 1], FeatureBatch of all tokens as one row)`."""
    sentence_lengths = [len(unigram) for unigram, _ in encoded]
    offsets = np.concatenate([[0], np.cumsum(sentence_lengths)]).astype(np.int64)
    stack = pad_batch([([token for unigram, _ in encoded for token in unigram],
                        [token for _, pair in encoded for token in pair])])
    return sentence_lengths, offsets, stack


def _check_label_lengths(labels, sentence_lengths) -> None:
    for i, (sequence, length) in enumerate(zip(labels, sentence_lengths)):
        if len(sequence) != length:
            raise ValueError(f"labels[{i}] has {len(sequence)} labels for a sentence of {length} tokens")


def pack(encoded: Sequence[tuple[list[list[int]], list[list[int]]]], labels: Optional[Sequence[Sequence[int]]] = None,
         num_buckets: int = 6) -> PackedCorpus:
    """Pack encoded sentences (from `FeatureIndex.encode`) and optional label
    ids into a `PackedCorpus` with at most `num_buckets` length buckets."""
    sentence_lengths, offsets, stack = _token_stack(encoded)
    if labels is not None:
        _check_label_lengths(labels, sentence_lengths)
    positions, lengths, label_arrays, members = [], [], [], []
    for indices, padded_length in length_buckets(sentence_lengths, num_buckets):
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
    return PackedCorpus(stack.unigram_ids[0], stack.pair_ids[0], tuple(positions), tuple(lengths),
                        tuple(label_arrays) if labels is not None else None, tuple(members))


def pack_rows(encoded: Sequence[tuple[list[list[int]], list[list[int]]]], labels: Sequence[Sequence[int]],
              width: Optional[int] = None, multiple: int = 8) -> PackedCorpus:
    """Pack labelled encoded sentences back to back into rows of `width`
    positions (default: the longest sentence, rounded up to `multiple`):
    one bucket, `starts` marking each sentence's first position, for the
    row losses (`losses.row_sequence_log_loss`). Rows are filled greedily,
    each from the longest sentence left, then the longest that still fit,
    so padding is only at row ends. Sentences of length 0 are left out
    (they add nothing to a log-loss)."""
    sentence_lengths, offsets, stack = _token_stack(encoded)
    _check_label_lengths(labels, sentence_lengths)
    longest = max(sentence_lengths, default=0)
    if width is None:
        width = max(multiple * -(-longest // multiple), multiple)
    if width < longest:
        raise ValueError(f"width must be >= the longest sentence ({longest}), got {width}")
    pool = sorted((length, i) for i, length in enumerate(sentence_lengths) if length > 0)
    rows = []
    while pool:
        length, i = pool.pop()
        row, free = [i], width - length
        while pool:
            k = bisect.bisect_right(pool, (free, len(sentence_lengths))) - 1
            if k < 0:
                break
            length, i = pool.pop(k)
            row.append(i)
            free -= length
        rows.append(row)
    positions = np.full((len(rows), width), PADDING_ID, dtype=np.int32)
    row_labels = np.full((len(rows), width), -1, dtype=np.int32)
    starts = np.zeros((len(rows), width), dtype=bool)
    row_lengths = np.zeros(len(rows), dtype=np.int32)
    for r, row in enumerate(rows):
        used = 0
        for i in row:
            length = sentence_lengths[i]
            positions[r, used: used + length] = offsets[i] + np.arange(length)
            row_labels[r, used: used + length] = labels[i]
            starts[r, used] = True
            used += length
        row_lengths[r] = used
    members = np.asarray([i for row in rows for i in row], dtype=np.int64)
    return PackedCorpus(stack.unigram_ids[0], stack.pair_ids[0], (positions,), (row_lengths,), (row_labels,),
                        (members,), (starts,))
