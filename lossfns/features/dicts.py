"""Token features as sklearn-crfsuite users write them: one dict per token
(python-crfsuite's item format), read as CRFsuite attributes with values.

`flatten` follows python-crfsuite's rules (`{"key": "value"}` is attribute
`key:value` of value 1, `{"key": number}` attribute `key` of that value, nested
dicts and lists prefix `key:`), and refuses by name, at its place
(`X[3][5]['word']`), what python-crfsuite reads obscurely or silently wrong.
`item_features` is the per-sentence extractor; `flatten_corpus` reads a whole
corpus at once, vectorised, into an `AttributeCorpus` (index, ids, packed arrays).
Design notes: docs/internals.md.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from .extraction import TokenFeatures
from .index import FeatureIndex, PackedCorpus, pack_token_rows, pack_tokens, ragged_rows, stable_hash, vocabulary

_SEQUENCES = (list, tuple, set, frozenset)
_NUMBERS = (bool, np.bool_, numbers.Real)  # numpy's bool is no `numbers.Real`; python-crfsuite takes it


def _text(value, where: str, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{where}: {what} {value!r} is not UTF-8") from None
    raise TypeError(f"{where}: {what} must be a string, got {type(value).__name__} {value!r:.40}")


def _number(value, where: str) -> float:
    try:
        number = float(value)
    except OverflowError:  # an int beyond float's range (10**400)
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{where} = {value!r}: feature values must be finite")
    return number


def _elements(values, where: str) -> list[str]:
    texts = [_text(element, where, "a list element") for element in values]
    return sorted(texts) if isinstance(values, (set, frozenset)) else texts


def flatten(item, where: str = "item") -> list[tuple[str, float]]:
    """A token's attributes `[(name, value)]` by python-crfsuite's rules (see
    the module docstring); `where` names the token in error messages."""
    if isinstance(item, dict):
        out = []
        for key, value in item.items():
            name = _text(key, where, "a key")
            place = f"{where}[{key!r}]"
            if isinstance(value, (str, bytes)):
                out.append((f"{name}:{_text(value, place, 'a value')}", 1.0))
            elif isinstance(value, _NUMBERS):
                out.append((name, _number(value, place)))
            elif isinstance(value, (dict,) + _SEQUENCES):
                out.extend((f"{name}:{inner}", weight) for inner, weight in flatten(value, place))
            else:
                raise TypeError(
                    f"{place}: a feature value must be a string, a number, a bool, a dict or a list "
                    f"of strings, got {type(value).__name__} {value!r:.40}"
                )
        return out
    if isinstance(item, _SEQUENCES):
        return [(name, 1.0) for name in _elements(item, where)]
    raise TypeError(
        f"{where}: a token's features must be a dict (or a list of strings), got {type(item).__name__} {item!r:.40}"
    )


def item_features(items: Sequence) -> TokenFeatures:
    """The extractor of feature dicts: one sentence's `[T]` items ->
    `TokenFeatures` whose unigram strings are the attribute names and
    `unigram_values` their values (no label-pair features, as in
    CRFsuite)."""
    flat = [flatten(item, f"items[{t}]") for t, item in enumerate(_sequence(items, "items"))]
    return TokenFeatures(
        [[name for name, _ in token] for token in flat],
        [[] for _ in flat],
        [[value for _, value in token] for token in flat],
    )


def _sequence(value, name: str):
    """`value` as a sequence (a generator read into a list, as sklearn-crfsuite
    iterates), else a TypeError naming it."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list of token feature dicts, got {type(value).__name__} {value!r:.40}")
    return value if isinstance(value, Sequence) else list(value)


class AttributeCorpus(NamedTuple):
    """A corpus of feature dicts as attribute occurrences.

    names: `[U]` the distinct attribute names;
    attributes: `[A]` int64, each occurrence's index into `names`, token
      after token;
    values: `[A]` float64, each occurrence's value;
    token_counts: `[N]` int64, the occurrences of each token, in order;
    sentence_lengths: `[S]` int64, the tokens of each sentence.
    """

    names: list
    attributes: np.ndarray
    values: np.ndarray
    token_counts: np.ndarray
    sentence_lengths: np.ndarray

    def index(self, min_count: int = 1) -> FeatureIndex:
        """A `FeatureIndex` of the attributes occurring at least `min_count`
        times, in the order of `names`."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        counts = np.bincount(self.attributes, minlength=len(self.names))
        kept = vocabulary(itertools.compress(self.names, (counts >= min_count).tolist()), 1)
        return FeatureIndex(kept, {}, len(kept), 0)

    def encode(self, index: FeatureIndex) -> np.ndarray:
        """`[A]` int64 feature ids of the occurrences under `index` (-1 where
        the attribute is unknown to it)."""
        if index.hashed:
            lookup = [stable_hash(name, index.num_unigram) for name in self.names]
        else:
            lookup = [index.unigram.get(name, -1) for name in self.names]
        return np.asarray(lookup, dtype=np.int64)[self.attributes] if lookup else np.zeros(0, np.int64)

    def token_arrays(self, index: FeatureIndex) -> tuple[np.ndarray, np.ndarray | None]:
        """`(unigram_ids [N, F] int32, unigram_values [N, F] float64 or None)`:
        each token's known attributes under `index` (-1 = padding), and
        their values, None when every value is 1 (binary features keep the
        binary fast path)."""
        ids = self.encode(index)
        known = ids >= 0
        token = np.repeat(np.arange(self.token_counts.size), self.token_counts)
        counts = np.bincount(token[known], minlength=self.token_counts.size)
        unigram_ids = ragged_rows(ids[known].astype(np.int32), counts, np.int32(-1))
        values = self.values[known]
        return unigram_ids, (None if np.all(values == 1.0) else ragged_rows(values, counts, 0.0))

    def pack(
        self, index: FeatureIndex, labels: Sequence[Sequence[int]] | None = None, num_buckets: int | None = 6
    ) -> PackedCorpus:
        """The corpus packed in length buckets (`features.pack_tokens`; None: the decoding layout)."""
        unigram_ids, values = self.token_arrays(index)
        return pack_tokens(unigram_ids, self.sentence_lengths, labels, num_buckets, unigram_values=values)

    def pack_rows(
        self, index: FeatureIndex, labels: Sequence[Sequence[int]], width: int | None = None, multiple: int = 8
    ) -> PackedCorpus:
        """The labelled corpus packed back to back in rows (`features.pack_token_rows`)."""
        unigram_ids, values = self.token_arrays(index)
        return pack_token_rows(unigram_ids, self.sentence_lengths, labels, width, multiple, unigram_values=values)


def flatten_corpus(X: Sequence[Sequence]) -> AttributeCorpus:
    """Read a corpus of feature dicts, `X [S][T]` (sklearn-crfsuite's `X`),
    by `flatten`'s rules, vectorised where the dicts hold plain strings,
    numbers and bools (nested values take the per-token path)."""
    sentences = [_sequence(x, f"X[{s}]") for s, x in enumerate(_sequence(X, "X"))]
    sentence_lengths = np.fromiter(map(len, sentences), np.int64, len(sentences))
    tokens = list(itertools.chain.from_iterable(sentences))
    if not tokens or set(map(type, tokens)) == {dict}:
        flat = _flatten_dicts(tokens, sentence_lengths)
        if flat is not None:
            return flat
    return _flatten_each(tokens, sentence_lengths)


def _where(position: int, offsets: np.ndarray, sentence_offsets: np.ndarray) -> str:
    """`X[s][t]` of the token holding attribute occurrence `position`."""
    token = int(np.searchsorted(offsets, position, side="right")) - 1
    sentence = int(np.searchsorted(sentence_offsets, token, side="right")) - 1
    return f"X[{sentence}][{token - sentence_offsets[sentence]}]"


def _positions(objects: list) -> tuple[list, np.ndarray]:
    """`(distinct objects in order of first appearance, [len(objects)] int64
    index of each into them)`; TypeError if an object is unhashable."""
    table = dict.fromkeys(objects)
    for i, key in enumerate(table):
        table[key] = i
    return list(table), np.fromiter(map(table.__getitem__, objects), np.int64, len(objects))


def _flatten_dicts(tokens: list, sentence_lengths: np.ndarray) -> AttributeCorpus | None:
    """The vectorised path for flat dicts; None when a value is not a plain
    string, number or bool (the per-token path then reads, or refuses, it)."""
    counts = np.fromiter(map(len, tokens), np.int64, len(tokens))
    values = list(itertools.chain.from_iterable(map(dict.values, tokens)))
    try:
        distinct_values, value_ids = _positions(values)
    except TypeError:  # an unhashable value: a nested dict, list or set
        return None
    offsets = np.concatenate([[0], np.cumsum(counts)])
    # Keys through each token's key tuple: a feature function writes a few layouts, not one per token.
    layouts, layout_ids = _positions(list(map(tuple, tokens)))
    distinct_keys, layout_key_ids = _positions(list(itertools.chain.from_iterable(layouts)))
    layout_starts = np.concatenate([[0], np.cumsum(np.fromiter(map(len, layouts), np.int64, len(layouts)))])
    key_ids = layout_key_ids[np.repeat(layout_starts[layout_ids] - offsets[:-1], counts) + np.arange(offsets[-1])]
    sentence_offsets = np.concatenate([[0], np.cumsum(sentence_lengths)])
    for k, key in enumerate(distinct_keys):
        if not isinstance(key, str):
            where = _where(int(np.flatnonzero(key_ids == k)[0]), offsets, sentence_offsets)
            distinct_keys[k] = _text(key, where, "a key")
    is_text = np.zeros(len(distinct_values), bool)
    weight = np.ones(len(distinct_values))
    for v, value in enumerate(distinct_values):
        if isinstance(value, (str, bytes)):
            is_text[v] = True
            if isinstance(value, bytes):
                distinct_values[v] = _text(
                    value, _where(int(np.flatnonzero(value_ids == v)[0]), offsets, sentence_offsets), "a value"
                )
        elif isinstance(value, _NUMBERS):
            try:
                weight[v] = _number(value, "")
            except ValueError:  # not finite: find its first place (only then: a scan of every occurrence)
                occurrence = int(np.flatnonzero(value_ids == v)[0])
                _number(
                    value, f"{_where(occurrence, offsets, sentence_offsets)}[{distinct_keys[key_ids[occurrence]]!r}]"
                )
        else:
            return None
    # An attribute is (key, string value) or (key) for a number: one integer code each.
    width = len(distinct_values) + 1
    codes = key_ids * width + np.where(is_text[value_ids], value_ids + 1, 0)
    if len(distinct_keys) * width <= max(4 * codes.size, 1 << 20):
        present = np.zeros(len(distinct_keys) * width, bool)
        present[codes] = True
        unique = np.flatnonzero(present)
        lookup = np.zeros(present.size, np.int64)
        lookup[unique] = np.arange(unique.size)
        attributes = lookup[codes]
    else:
        unique, attributes = np.unique(codes, return_inverse=True)
    key_of, value_of = np.divmod(unique, width)
    names = [
        distinct_keys[k] if v == 0 else f"{distinct_keys[k]}:{distinct_values[v - 1]}"
        for k, v in zip(key_of.tolist(), value_of.tolist())
    ]
    # Different codes can spell one name (key "a:b" with a number, key "a" with "b"): one attribute, as in CRFsuite.
    table = vocabulary(names, 1)
    if len(table) < len(names):
        attributes = np.asarray([table[name] for name in names], np.int64)[attributes]
        names = list(table)
    return AttributeCorpus(names, attributes.astype(np.int64, copy=False), weight[value_ids], counts, sentence_lengths)


def _flatten_each(tokens: list, sentence_lengths: np.ndarray) -> AttributeCorpus:
    """The per-token path: `flatten` on every token."""
    sentence_offsets = np.concatenate([[0], np.cumsum(sentence_lengths)])
    sentence_of = np.repeat(np.arange(sentence_lengths.size), sentence_lengths)
    flat = [
        flatten(item, f"X[{s}][{n - sentence_offsets[s]}]")
        for n, (item, s) in enumerate(zip(tokens, sentence_of.tolist()))
    ]
    counts = np.fromiter(map(len, flat), np.int64, len(flat))
    occurrences = list(itertools.chain.from_iterable(flat))
    names, attributes = _positions([name for name, _ in occurrences])
    values = np.fromiter((value for _, value in occurrences), np.float64, len(occurrences))
    return AttributeCorpus(names, attributes, values, counts, sentence_lengths)
