"""A tagged corpus through the features, as every application takes it.

The steps from `corpora.Sentence`s to the arrays a model reads, each a
public function, so that the Tagger, the experiments and the benchmarks
share one path (and one way of batching a corpus):

* `extractor`: a preset name, CRF++/Wapiti template text, a `Preset` or
  `Templates` -> a feature extractor (`extractor_spec` and
  `extractor_from_spec` round-trip it through a model file);
* `build_index`: the observation-string index of the extracted training
  features (or a hashed one);
* `encode` and `label_ids`: id lists per sentence (`index_corpus`: extract,
  index and encode a training corpus in one call);
* `index.pack` (length buckets, for decoding and custom losses) or
  `index.pack_rows` (rows of back-to-back sentences, for the log-loss),
  then `corpus_arrays`: the `CorpusArrays` a `LinearChainModel` reads
  (`models.corpus_loss`, `models.decode`);
* `pack_shards`: the same arrays for data-parallel training, one equally
  shaped block per device, stacked along a leading shard axis;
* `padded_buckets` and `in_corpus_order`: the padded per-bucket view of a
  packed corpus (`FeatureBatch`es) and per-sentence results back in corpus
  order.
"""

from __future__ import annotations

import functools
import gc
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np

from .design import SparseDesign, bucket_design
from .extraction import TokenFeatures
from .index import PADDING_ID, FeatureBatch, FeatureIndex, PackedCorpus, pack_rows
from .presets import PRESETS, Preset, preset
from .templates import Templates, parse_templates

Extractor = Preset | Templates
"""What turns a sentence into features: a `Preset` or parsed `Templates`."""


def extractor(features) -> Extractor:
    """A feature extractor from a preset name (`presets.PRESETS`), CRF++/
    Wapiti template text, a `Preset` or `Templates`."""
    if isinstance(features, (Preset, Templates)):
        return features
    if not isinstance(features, str):
        raise TypeError(
            "features must be a preset name, template text, a features.Preset or features.Templates, "
            f"got {type(features).__name__}"
        )
    if features in PRESETS:
        return preset(features)
    try:
        return parse_templates(features)
    except ValueError as error:
        if re.fullmatch(r"[A-Za-z_][\w.-]*", features.strip()):
            raise ValueError(
                f"features: unknown feature preset {features!r}; expected one of "
                f"{sorted(PRESETS)} or CRF++/Wapiti template text"
            ) from error
        raise ValueError(f"features: not a preset name and not valid template text: {error}") from error


def extractor_spec(features: Extractor) -> dict:
    """What rebuilds an extractor: `{"preset": name}` or `{"templates": text,
    "dialect": dialect}` (how the text's regexes read)."""
    if isinstance(features, Preset):
        return {"preset": features.name}
    return {"templates": features.text, "dialect": features.dialect}


def extractor_from_spec(spec: dict) -> Extractor:
    """The extractor of an `extractor_spec`."""
    if "preset" in spec:
        return preset(spec["preset"])
    return parse_templates(spec["templates"], dialect=spec.get("dialect", "python"))


def check_sentences(sentences, labelled: bool = True) -> None:
    """Reject a corpus that is not a list/tuple of `corpora.Sentence` (token
    rows, and one label per token when `labelled`; at least one sentence
    then), naming the first bad sentence."""
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, Sequence):
        raise TypeError(f"sentences must be a list or tuple of corpora.Sentence, got {type(sentences).__name__}")
    if labelled and len(sentences) == 0:
        raise ValueError("sentences must hold at least one sentence, got 0")
    for i, sentence in enumerate(sentences):
        if not hasattr(sentence, "tokens") or (labelled and not hasattr(sentence, "labels")):
            raise TypeError(
                f"sentences[{i}] must be a corpora.Sentence(tokens, labels), "
                f"got {type(sentence).__name__} {sentence!r:.60}"
            )
        for t, row in enumerate(sentence.tokens):
            if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) == 0:
                raise TypeError(
                    f"sentences[{i}].tokens[{t}] must be a row of columns (a tuple of strings, word "
                    f"first), got {type(row).__name__} {row!r:.60}"
                )
        if labelled and len(sentence.labels) != len(sentence.tokens):
            raise ValueError(
                f"sentences[{i}] must have one label per token, got {len(sentence.tokens)} tokens "
                f"and {len(sentence.labels)} labels"
            )


def build_index(
    extracted: Sequence[TokenFeatures], *, min_count: int = 1, hash_size: int | None = None
) -> FeatureIndex:
    """The index of the extracted training features: every string seen at
    least `min_count` times, or (with `hash_size`) `hash_size` hashed ids
    (and as many for pair features, when the extractor has any)."""
    if hash_size is None:
        return FeatureIndex.build(extracted, min_count)
    has_pairs = any(token for sentence in extracted for token in sentence.pair)
    return FeatureIndex.hashed_index(hash_size, hash_size if has_pairs else 0)


def _cycle_collector_paused(function: Callable) -> Callable:
    """`function` with Python's cycle collector paused. Extraction and
    encoding build millions of small lists and strings, none in a cycle
    (reference counts free them), and the collector's repeated passes over
    them took two thirds of the time (conll2000 with `lavergne_pos`: 4.1 s
    of 5.6 s)."""

    @functools.wraps(function)
    def paused(*args, **kwargs):
        enabled = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return paused


@_cycle_collector_paused
def encode(index: FeatureIndex, features: Extractor, sentences) -> list:
    """`index.encode(features(tokens))` of every sentence."""
    return [index.encode(features(s.tokens)) for s in sentences]


@_cycle_collector_paused
def index_corpus(
    features: Extractor, sentences, labels: Sequence[str], *, min_count: int = 1, hash_size: int | None = None
) -> tuple[FeatureIndex, list, list[list[int]]]:
    """A labelled training corpus extracted, indexed (`build_index`) and
    encoded: `(index, encoded [N], label ids [N][T] in labels)`."""
    extracted = [features(s.tokens) for s in sentences]
    index = build_index(extracted, min_count=min_count, hash_size=hash_size)
    return index, [index.encode(f) for f in extracted], label_ids(sentences, labels)


def label_ids(sentences, labels: Sequence[str]) -> list[list[int]]:
    """Label ids `[N][T]` of the sentences' labels in `labels` (-1: a label not in it)."""
    lookup = {label: i for i, label in enumerate(labels)}
    return [[lookup.get(label, -1) for label in s.labels] for s in sentences]


class CorpusArrays(NamedTuple):
    """A packed corpus as a model reads it (`LinearChainModel.packed_potentials`).

    design: the unigram features, one row per bucket cell (`design.bucket_design`);
    pair_ids: `[N, F2]` pair-feature ids over the N tokens (-1 = none);
    positions, lengths, labels, starts: per bucket `[B_b, T_b]`, `[B_b]`,
      `[B_b, T_b]` (or None: unlabelled) and `[B_b, T_b]` bool (or None:
      a sentence per row), as in `index.PackedCorpus`.
    numpy arrays (`jax.tree_util.tree_map(jnp.asarray, arrays)` puts them on
    a device); a pytree, passed to compiled programs as an argument.
    """

    design: SparseDesign
    pair_ids: np.ndarray
    positions: tuple
    lengths: tuple
    labels: tuple | None = None
    starts: tuple | None = None


def corpus_arrays(packed: PackedCorpus, num_features: int) -> CorpusArrays:
    """The `CorpusArrays` of a packed corpus over `num_features` (K) unigram features."""
    return CorpusArrays(
        bucket_design(packed, num_features),
        packed.pair_ids,
        packed.positions,
        packed.lengths,
        packed.labels,
        packed.starts,
    )


def _balanced_groups(sizes: Sequence[int], count: int) -> list[list[int]]:
    """Indices split into `count` groups of nearly equal total size (largest first, into the lightest group)."""
    groups, totals = [[] for _ in range(count)], np.zeros(count, np.int64)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        lightest = int(np.argmin(totals))
        groups[lightest].append(i)
        totals[lightest] += sizes[i]
    return [sorted(group) for group in groups]


def _pad_rows(array: np.ndarray, rows: int, fill) -> np.ndarray:
    """`array` `[n, ...]` padded with `fill` to `[rows, ...]` (and to the widths of `fill`'s shape)."""
    out = np.full((rows,) + array.shape[1:], fill, array.dtype)
    out[: array.shape[0]] = array
    return out


def pack_shards(encoded: Sequence, labels: Sequence[Sequence[int]], num_features: int, num_shards: int) -> CorpusArrays:
    """Labelled encoded sentences as `num_shards` equally shaped blocks of
    rows (`index.pack_rows`), each block's `CorpusArrays` stacked along a
    new leading axis `[num_shards, ...]` (for `parallel.shard_leading_axis`).

    Sentences are dealt to blocks so their token counts are balanced; the
    blocks are padded to the same rows, tokens, feature widths and design
    non-zeros (empty rows of length 0, ids -1, zero counts), which add
    nothing to a log-loss.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    width = max(8 * -(-max((len(u) for u, _ in encoded), default=0) // 8), 8)
    packs = []
    for group in _balanced_groups([len(u) for u, _ in encoded], num_shards):
        packs.append(pack_rows([encoded[i] for i in group], [labels[i] for i in group], width=width))
    rows = max(p.positions[0].shape[0] for p in packs)
    tokens = max(p.unigram_ids.shape[0] for p in packs)
    unigram_width = max(p.unigram_ids.shape[1] for p in packs)
    pair_width = max(p.pair_ids.shape[1] for p in packs)
    blocks = []
    for p in packs:
        unigram = np.full((tokens, unigram_width), PADDING_ID, np.int32)
        unigram[: p.unigram_ids.shape[0], : p.unigram_ids.shape[1]] = p.unigram_ids
        pair = np.full((tokens, pair_width), PADDING_ID, np.int32)
        pair[: p.pair_ids.shape[0], : p.pair_ids.shape[1]] = p.pair_ids
        padded = p._replace(
            unigram_ids=unigram,
            pair_ids=pair,
            positions=(_pad_rows(p.positions[0], rows, PADDING_ID),),
            lengths=(_pad_rows(p.lengths[0], rows, 0),),
            labels=(_pad_rows(p.labels[0], rows, -1),),
            starts=(_pad_rows(p.starts[0], rows, False),),
        )
        blocks.append(corpus_arrays(padded, num_features))
    nonzeros = max(block.design.indices.shape[0] for block in blocks)
    blocks = [
        block._replace(
            design=block.design._replace(
                indices=_pad_rows(block.design.indices, nonzeros, 0),
                values=_pad_rows(block.design.values, nonzeros, 0.0),
            )
        )
        for block in blocks
    ]
    # Entries past indptr[-1] are outside every row: the padding of indices and values is never read.
    return jax.tree_util.tree_map(lambda *leaves: np.stack(leaves), *blocks)


def padded_buckets(packed: PackedCorpus) -> tuple:
    """Per-bucket `FeatureBatch`es `[B_b, T_b, F]` of a packed corpus (ids
    -1 past each length; pair ids -1 at each sentence's first position,
    where pair features do not apply)."""
    # Position -1 (padding) reads the appended last row, whose ids are all -1.
    unigram = np.concatenate([packed.unigram_ids, np.full((1, packed.unigram_ids.shape[1]), -1, np.int32)])
    pair = np.concatenate([packed.pair_ids, np.full((1, packed.pair_ids.shape[1]), -1, np.int32)])
    starts = packed.starts if packed.starts is not None else (None,) * len(packed.positions)
    labels = packed.labels if packed.labels is not None else (None,) * len(packed.positions)
    out = []
    for positions, lengths, bucket_labels, first in zip(packed.positions, packed.lengths, labels, starts):
        pair_ids = pair[positions]
        if first is not None:
            pair_ids = np.where(np.asarray(first)[..., None], -1, pair_ids)
        out.append(FeatureBatch(unigram[positions], pair_ids, lengths, bucket_labels))
    return tuple(out)


def in_corpus_order(packed: PackedCorpus, bucket_values: Sequence, time_axis: int | None = 1) -> list:
    """Per-sentence values in corpus order from per-bucket arrays of an
    `index.pack`ed corpus, `[B_b, T_b, ...]` (or e.g. `[B_b, k, T_b]` with
    `time_axis=2`), each cut to its sentence's length: `[N]` arrays
    `[T_i, ...]` (or `[k, T_i]`; `time_axis=None`: not cut)."""
    out: list = [None] * sum(len(members) for members in packed.members)
    for members, lengths, values in zip(packed.members, packed.lengths, bucket_values):
        values = np.asarray(values)
        for row, index in enumerate(members):
            cut = () if time_axis is None else (slice(None),) * (time_axis - 1) + (slice(0, lengths[row]),)
            out[index] = values[row][cut]
    return out
