"""Intersection of a word lattice with a log-linear tagging model.

A word lattice (`dag.Lattice` whose arc symbols are word ids: a sentence, a
neighbourhood, a candidate list) times a first- or second-order tagger gives a
lattice of (string, tag sequence) paths, with (word-lattice state, tag history)
states; its arc scores are a differentiable gather from the model parameters
(`arc_scores`), so its `dag.log_partition` is `log sum_{(x, y)} exp theta . f(x, y)`
over the word lattice's strings (Smith & Eisner 2005). Tag id `num_tags` is the
sentence boundary. A word `w` tagged `t` after tags `(u, v)` scores `emission[t, w]
+ bigram[v, t] (+ trigram[u, v, t]) (+ sum of spelling[f, t] over w's features f)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import dag


class TaggedLattice(NamedTuple):
    """A word lattice intersected with a tagger of `order` 1 or 2.

    lattice: `dag.Lattice` whose arc symbols are tags (padding arcs: -1);
    word: `[..., A]` word id of each arc;
    history: `[..., A, order]` the previous tags, oldest first (the boundary
    tag `num_tags` before the first word).
    """

    lattice: dag.Lattice
    word: jax.Array | np.ndarray  # numpy while built (`as_numpy`), then device arrays
    history: jax.Array | np.ndarray


class TaggerParams(NamedTuple):
    """Log-linear tagger weights (`K` tags, `V` words, `F` spelling features).

    emission: `[K, V]`; bigram: `[K + 1, K]` (row K: after the boundary);
    trigram: `[K + 1, K + 1, K]` or None (second order only);
    spelling: `[F, K]` or None.
    """

    emission: jax.Array
    bigram: jax.Array
    trigram: jax.Array | None = None
    spelling: jax.Array | None = None


def init_params(
    num_tags: int, vocabulary_size: int, *, order: int = 1, num_spelling_features: int = 0, dtype=jnp.float32
) -> TaggerParams:
    """All-zero weights (Smith & Eisner start CE at theta = 0)."""
    _check_order(order)
    K = num_tags
    return TaggerParams(
        jnp.zeros((K, vocabulary_size), dtype),
        jnp.zeros((K + 1, K), dtype),
        jnp.zeros((K + 1, K + 1, K), dtype) if order == 2 else None,
        jnp.zeros((num_spelling_features, K), dtype) if num_spelling_features else None,
    )


def _check_order(order):
    if order not in (1, 2):
        raise ValueError(f"order must be 1 (tag bigrams) or 2 (tag trigrams), got {order!r}")


def intersect(
    word_lattice: dag.Lattice, num_tags: int, *, order: int = 1, tag_dictionary=None, as_numpy: bool = False
) -> TaggedLattice:
    """The (string, tag sequence) lattice of one word lattice and a tagger.

    Args:
      word_lattice: an unbatched `dag.Lattice` of word ids.
      num_tags: K.
      order: 1 (states remember the previous tag) or 2 (the previous two).
      tag_dictionary: `[V, K]` bool, the tags each word may take (None: all).
      as_numpy: return numpy arrays (for building many lattices that are
        stacked later) instead of jax arrays.
    Only (state, history) pairs reachable from the start are built.
    """
    _check_order(order)
    src, dst, word, valid, final = (
        np.asarray(x)
        for x in (word_lattice.src, word_lattice.dst, word_lattice.symbol, word_lattice.arc_valid, word_lattice.final)
    )
    if src.ndim != 1:
        raise ValueError(f"intersect takes one word lattice (src [A]), got batch shape {src.shape[:-1]}")
    K, base = num_tags, num_tags + 1
    if tag_dictionary is None:
        allowed = np.ones((int(word[valid].max(initial=-1)) + 1, K), bool)
    else:
        allowed = np.asarray(tag_dictionary, bool)
        if allowed.ndim != 2 or allowed.shape[1] != K:
            raise ValueError(f"tag_dictionary must have shape [V, {K}] (num_tags = {K}), got {allowed.shape}")
    if valid.any() and word[valid].max() >= allowed.shape[0]:
        raise ValueError(f"word id {int(word[valid].max())} is outside the tag dictionary's {allowed.shape[0]} words")
    start_code = sum(K * base**i for i in range(order))  # the all-boundary history
    histories = {0: np.array([start_code])}
    pieces = []
    for state in range(final.shape[0]):  # topological order: a state's histories are complete here
        codes = histories.pop(state, None)
        out = np.flatnonzero(valid & (src == state))
        if codes is None or not out.size:
            continue
        codes = np.unique(codes)
        pair_arc, pair_tag = np.nonzero(allowed[word[out]])
        pair_arc = out[pair_arc]
        code = np.repeat(codes, pair_arc.size)
        arc, tag = np.tile(pair_arc, codes.size), np.tile(pair_tag, codes.size)
        new_code = (code % base ** (order - 1)) * base + tag
        pieces.append((np.full(code.size, state), code, dst[arc], new_code, arc, tag))
        for target in np.unique(dst[arc]):
            histories[target] = np.concatenate(
                [histories.get(target, np.zeros(0, np.int64)), new_code[dst[arc] == target]]
            )
    columns = [np.concatenate([p[i] for p in pieces]) if pieces else np.zeros(0, np.int64) for i in range(6)]
    from_state, from_code, to_state, to_code, arc, tag = columns
    # Product states sorted by (word-lattice state, history): topological, start first.
    keys = np.unique(
        np.concatenate([[start_code], from_state * base**order + from_code, to_state * base**order + to_code])
    )
    number = lambda state, code: np.searchsorted(keys, state * base**order + code)
    product_final = np.flatnonzero(final[keys // base**order])
    lattice = dag.from_arcs_numpy(
        np.stack([number(from_state, from_code), number(to_state, to_code), tag], axis=1),
        final=product_final,
        num_states=keys.size,
    )
    history = np.stack([from_code // base ** (order - 1 - i) % base for i in range(order)], axis=-1)
    tagged = TaggedLattice(lattice, np.asarray(word[arc], np.int32), np.asarray(history.reshape(-1, order), np.int32))
    # numpy while building, device arrays (a transfer, no compilation) once.
    return tagged if as_numpy else TaggedLattice(dag.to_jax(lattice), *jax.device_put(tuple(tagged[1:])))


def stack(tagged: Sequence[TaggedLattice]) -> TaggedLattice:
    """Pad tagged lattices to common sizes and stack them into a batch."""
    lattices = dag.stack([t.lattice for t in tagged])
    A = lattices.num_arcs
    grow = lambda a, value: np.concatenate([np.asarray(a), np.full((A - a.shape[0],) + a.shape[1:], value, a.dtype)])
    return TaggedLattice(
        lattices,
        jnp.asarray(np.stack([grow(t.word, 0) for t in tagged])),
        jnp.asarray(np.stack([grow(t.history, 0) for t in tagged])),
    )


def pack(tagged: Sequence[TaggedLattice], **sizes) -> TaggedLattice:
    """Tagged lattices in one `dag.PackedLattices` (`dag.pack`; `sizes` are its
    optional padded sizes): arc `j` of lattice `b` follows the arcs of the
    lattices before it. Far less padding than `stack`."""
    packed = dag.pack([t.lattice for t in tagged], **sizes)
    A = packed.num_arcs
    cat = lambda parts, width: np.concatenate(
        [np.asarray(p).reshape((-1,) + width) for p in parts] + [np.zeros((0,) + width, np.int32)]
    ).astype(np.int32)
    word = cat([t.word for t in tagged], ())
    history = cat([t.history for t in tagged], tuple(np.shape(tagged[0].history)[1:]) if tagged else (1,))
    word = np.concatenate([word, np.zeros(A - word.shape[0], np.int32)])
    history = np.concatenate([history, np.zeros((A - history.shape[0],) + history.shape[1:], np.int32)])
    return TaggedLattice(jax.device_put(packed), *jax.device_put((word, history)))


@jax.jit
def arc_scores(tagged: TaggedLattice, params: TaggerParams, spelling_ids=None) -> jax.Array:
    """Arc scores `[..., A]` of a (batch of) tagged lattice(s) (stacked or
    packed): a gather from `params`, differentiable in them (padding arcs
    score 0).

    spelling_ids: `[V, F_max]` int spelling-feature ids of each word (-1
    padded, from `spelling_features`); required when `params.spelling` is set.
    """
    tag = jnp.maximum(tagged.lattice.symbol, 0)
    previous = tagged.history[..., -1]
    score = params.emission[tag, tagged.word] + params.bigram[previous, tag]
    if params.trigram is not None:
        if tagged.history.shape[-1] != 2:
            raise ValueError("params.trigram needs a lattice intersected with order=2")
        score = score + params.trigram[tagged.history[..., 0], previous, tag]
    if params.spelling is not None:
        if spelling_ids is None:
            raise ValueError("params.spelling needs spelling_ids [V, F_max] (from spelling_features)")
        ids = jnp.asarray(spelling_ids)[tagged.word]
        weights = params.spelling[jnp.maximum(ids, 0), tag[..., None]]
        score = score + jnp.sum(jnp.where(ids >= 0, weights, 0.0), axis=-1)
    return jnp.where(tagged.lattice.arc_valid, score, 0.0)


def spelling_features(vocabulary: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Smith & Eisner's spelling features of each word: its 1-, 2- and
    3-character suffixes, initial capital, hyphen, digit.

    Returns `(ids [V, 6] int32, -1 padded; names [F])`; the suffix features are
    those observed in `vocabulary`.
    """
    names, index = [], {}
    rows = []
    for word in vocabulary:
        features = [f"suffix{n}:{word[-n:]}" for n in (1, 2, 3) if len(word) >= n]
        features += [
            name
            for name, test in (
                ("capitalized", word[:1].isupper()),
                ("hyphen", "-" in word),
                ("digit", any(c.isdigit() for c in word)),
            )
            if test
        ]
        rows.append([index.setdefault(f, len(index)) for f in features])
    names = list(index)
    ids = np.full((len(rows), 6), -1, np.int32)
    for row, features in enumerate(rows):
        ids[row, : len(features)] = features
    return ids, names
