"""A tagged corpus through the features, as every application takes it.

The steps from `corpora.Sentence`s to the arrays a model reads are public
functions, so that the Tagger, the experiments and the benchmarks share one path:
`extractor` (a preset name, template text, a `Preset` or `Templates`),
`build_index`, `encode` and `label_ids` (`index_corpus`: all three), then
`index.pack` or `index.pack_rows` and `corpus_arrays` (the `CorpusArrays` a
`LinearChainModel` reads); `pack_shards` for data-parallel training, and
`padded_buckets` and `in_corpus_order` for per-bucket views and results.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import functools
import gc
import itertools
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np

from .design import SparseDesign, bucket_design
from .extraction import TokenFeatures
from .index import PADDING_ID, FeatureBatch, FeatureIndex, PackedCorpus, pack, pack_rows, pack_tokens, ragged_rows
from .presets import PRESETS, Preset, preset
from .templates import TemplateColumn, Templates, apply_templates_to_corpus, expand_templates, parse_templates

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


def extract(features: Extractor, sentences) -> list[TokenFeatures]:
    """`features(tokens)` of every sentence; templates are expanded over the
    whole corpus at once (`templates.apply_templates_to_corpus`: the same
    strings, faster than sentence by sentence)."""
    if isinstance(features, Templates):
        return apply_templates_to_corpus(features, [s.tokens for s in sentences])
    return [features(s.tokens) for s in sentences]


@_cycle_collector_paused
def encode(index: FeatureIndex, features: Extractor, sentences) -> list:
    """`index.encode(features(tokens))` of every sentence."""
    return [index.encode(f) for f in extract(features, sentences)]


@_cycle_collector_paused
def pack_sentences(
    index: FeatureIndex,
    features: Extractor,
    sentences,
    labels: Sequence[Sequence[int]] | None = None,
    num_buckets: int | None = 6,
) -> PackedCorpus:
    """`index.pack(encode(index, features, sentences), labels, num_buckets)`:
    the same arrays. Templates over an index of strings go straight to the
    token stack: each template's strings over the corpus
    (`templates.expand_templates`) are looked up once per distinct string,
    and no per-token lists are built (the command line's labelling)."""
    if not isinstance(features, Templates) or index.unigram is None or index.pair is None:
        return pack(encode(index, features, sentences), labels, num_buckets)
    unigram, pair = expand_templates(features, [s.tokens for s in sentences])
    lengths = [len(s.tokens) for s in sentences]
    count = sum(lengths)
    unigram_ids, pair_ids = _id_stack(index.unigram, unigram, count), _id_stack(index.pair, pair, count)
    return pack_tokens(unigram_ids, lengths, labels, num_buckets, pair_ids=pair_ids)


def _id_stack(table: dict, columns: Sequence[TemplateColumn], count: int) -> np.ndarray:
    """`[N, F]` int32: per token the ids of its known strings, in template
    order, then `PADDING_ID` (as `pack` lays out `FeatureIndex.encode`'s lists)."""
    ids = np.empty((count, len(columns)), np.int32)
    for j, column in enumerate(columns):
        known = np.fromiter(map(table.get, column.strings, itertools.repeat(PADDING_ID)), np.int32, len(column.strings))
        ids[:, j] = known[column.codes]
    kept = ids != PADDING_ID
    return ragged_rows(ids[kept], kept.sum(axis=1), PADDING_ID)


@_cycle_collector_paused
def index_corpus(
    features: Extractor, sentences, labels: Sequence[str], *, min_count: int = 1, hash_size: int | None = None
) -> tuple[FeatureIndex, list, list[list[int]]]:
    """A labelled training corpus extracted, indexed (`build_index`) and
    encoded: `(index, encoded [N], label ids [N][T] in labels)`."""
    extracted = extract(features, sentences)
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
    blocks = [
        corpus_arrays(
            pad_corpus(p, tokens, unigram_width, pair_width, ((rows, p.positions[0].shape[1]),)), num_features
        )
        for p in packs
    ]
    nonzeros = max(block.design.indices.shape[0] for block in blocks)
    blocks = [block._replace(design=pad_design(block.design, nonzeros)) for block in blocks]
    return jax.tree_util.tree_map(lambda *leaves: np.stack(leaves), *blocks)


def pad_corpus(packed: PackedCorpus, tokens: int, unigram_width: int, pair_width: int, bucket_shapes) -> PackedCorpus:
    """`packed` with its token stack padded to `[tokens, unigram_width]` and
    `[tokens, pair_width]` (ids -1, values 0) and bucket b to `bucket_shapes[b]
    = (B_b, T_b)` (empty rows of length 0, positions and labels -1, no
    starts): the padding adds nothing to a loss and decodes to nothing.
    Every size must be at least the corpus's own."""

    def grown(array: np.ndarray, shape: tuple, fill) -> np.ndarray:
        out = np.full(shape, fill, array.dtype)
        out[tuple(slice(0, n) for n in array.shape)] = array
        return out

    def buckets(arrays: tuple | None, fill) -> tuple | None:
        if arrays is None:
            return None
        return tuple(grown(a, shape[: a.ndim], fill) for a, shape in zip(arrays, bucket_shapes))

    values = packed.unigram_values
    return packed._replace(
        unigram_ids=grown(packed.unigram_ids, (tokens, unigram_width), PADDING_ID),
        pair_ids=grown(packed.pair_ids, (tokens, pair_width), PADDING_ID),
        unigram_values=None if values is None else grown(values, (tokens, unigram_width), 0.0),
        positions=buckets(packed.positions, PADDING_ID),
        lengths=buckets(packed.lengths, 0),
        labels=buckets(packed.labels, -1),
        starts=buckets(packed.starts, False),
    )


def pad_design(design: SparseDesign, nonzeros: int) -> SparseDesign:
    """`design` with room for `nonzeros` entries: entries past `indptr[-1]` are
    outside every row, so their padding (column 0, value 0) is never read."""
    grow = lambda a: np.concatenate([a, np.zeros((nonzeros - a.shape[0],), a.dtype)])
    return design._replace(indices=grow(design.indices), values=grow(design.values))


def ladder(size: int) -> int:
    """The smallest size `>= size` on the ladder 1, 2, ..., 16, 18, 20, ...,
    32, 36, 40, ... (`m 2^e`, `m` in 8..15): each rung at most 1.125 times the
    one below, so padding to it costs at most an eighth more work, while
    corpora of similar sizes (cross-validation folds, other test sets) share
    compiled shapes."""
    if size <= 16:
        return max(int(size), 0)
    exponent = (int(size) - 1).bit_length() - 4  # size in (8 2^e, 16 2^e]
    return -(-int(size) // 2**exponent) * 2**exponent


def _ladder_corpus(packed: PackedCorpus) -> PackedCorpus:
    """`pad_corpus` of `packed` to the `ladder` sizes of its feature widths and
    bucket shapes `[B_b, T_b]`, with room for a token in every cell (`sum_b
    B_b T_b` tokens): the shapes then depend on those ladder sizes alone."""
    shapes = tuple((ladder(p.shape[0]), ladder(p.shape[1])) for p in packed.positions)
    tokens = max(sum(rows * steps for rows, steps in shapes), packed.unigram_ids.shape[0])
    widths = ladder(packed.unigram_ids.shape[1]), ladder(packed.pair_ids.shape[1])
    return pad_corpus(packed, tokens, *widths, shapes)


def ladder_arrays(packed: PackedCorpus, num_features: int) -> CorpusArrays:
    """The `CorpusArrays` of `_ladder_corpus(packed)` over `num_features`
    features, with room for every cell's every feature in its design: corpora
    whose sizes fall on the same ladder rungs give arrays of the same shapes."""
    padded = _ladder_corpus(packed)
    arrays = corpus_arrays(padded, num_features)
    cells = sum(positions.size for positions in padded.positions)
    return arrays._replace(design=pad_design(arrays.design, cells * padded.unigram_ids.shape[1]))


def bucket_corpora(packed: PackedCorpus, num_features: int) -> list[CorpusArrays]:
    """Each bucket of `packed` as `CorpusArrays` of its own, for decoding
    bucket by bucket: `[B, T]` padded to a power of two rows and a `ladder` length,
    the bucket's cells as its token stack (`[B T, F]`, -1 outside the
    lengths) and room for `B T F` design entries, so its shapes depend only
    on the ladder sizes of `B`, `T` and the feature widths `F`, `F2`: other
    sentence sets of similar sizes re-use the compiled decoders."""
    unigram_width, pair_width = ladder(packed.unigram_ids.shape[1]), ladder(packed.pair_ids.shape[1])
    out = []
    for b, positions in enumerate(packed.positions):
        rows, steps = 1 << max(positions.shape[0] - 1, 0).bit_length(), ladder(positions.shape[1])
        cells = pad_corpus(_single_bucket(packed, b), 0, unigram_width, pair_width, ((rows, steps),))
        flat = cells.positions[0].reshape(-1)
        inside = flat >= 0
        take = lambda stack, fill: np.where(inside[:, None], stack[np.maximum(flat, 0)], fill)
        stack_values = packed.unigram_values
        values = None if stack_values is None else take(_rows_or_empty(stack_values, unigram_width), 0.0)
        cells = cells._replace(
            unigram_ids=take(_rows_or_empty(packed.unigram_ids, unigram_width), PADDING_ID).astype(np.int32),
            pair_ids=take(_rows_or_empty(packed.pair_ids, pair_width), PADDING_ID).astype(np.int32),
            unigram_values=values,
            positions=(np.where(inside, np.arange(flat.size), PADDING_ID).reshape(rows, steps).astype(np.int32),),
        )
        arrays = corpus_arrays(cells, num_features)
        out.append(arrays._replace(design=pad_design(arrays.design, rows * steps * unigram_width)))
    return out


def _single_bucket(packed: PackedCorpus, b: int) -> PackedCorpus:
    """Bucket `b` of `packed` alone (the token stack emptied: `bucket_corpora` lays out its own)."""
    pick = lambda arrays: None if arrays is None else (arrays[b],)
    empty = lambda stack: None if stack is None else stack[:0]
    return packed._replace(
        unigram_ids=packed.unigram_ids[:0],
        pair_ids=packed.pair_ids[:0],
        unigram_values=empty(packed.unigram_values),
        positions=(packed.positions[b],),
        lengths=(packed.lengths[b],),
        labels=pick(packed.labels),
        members=(packed.members[b],),
        starts=pick(packed.starts),
    )


def _rows_or_empty(stack: np.ndarray, width: int) -> np.ndarray:
    """`stack [N, F]` widened to `[max(N, 1), width]` (-1 / 0 fill): gathers stay in range on an empty corpus."""
    fill = 0.0 if np.issubdtype(stack.dtype, np.floating) else PADDING_ID
    out = np.full((max(stack.shape[0], 1), width), fill, stack.dtype)
    out[: stack.shape[0], : stack.shape[1]] = stack
    return out


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
