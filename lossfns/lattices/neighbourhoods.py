"""Contrastive-estimation neighbourhoods of a sentence as deterministic lattices.

Smith & Eisner (2005). A sentence is a sequence of word ids; each function returns
a `dag.Lattice` whose arc symbols are word ids. Every neighbourhood contains the
sentence itself, and every lattice is deterministic (no state has two arcs with
one symbol), so each string of the set lies on exactly one path: repeated words
never count a string twice. The finite neighbourhoods (DEL1WORD, TRANS1: O(m)
strings; DEL1SUBSEQ: O(m^2)) are listed and compiled into the minimal
deterministic acceptor (`dag.from_strings(..., deterministic=True)`); LENGTH
(|V|^m strings) is built directly as m positions of |V| arcs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import dag


def _as_sentence(sentence) -> tuple[int, ...]:
    words = np.asarray(sentence)
    if words.ndim != 1 or (words.size and not np.issubdtype(words.dtype, np.integer)):
        raise ValueError(
            f"sentence must be a 1-D sequence of integer word ids [m], got shape {words.shape} and dtype {words.dtype}"
        )
    if (words < 0).any():
        raise ValueError(f"sentence word ids must be non-negative, got {words.tolist()}")
    return tuple(int(w) for w in words)


def _deletions(words):
    return {words[:i] + words[i + 1 :] for i in range(len(words))}


def _transpositions(words):
    return {words[:i] + (words[i + 1], words[i]) + words[i + 2 :] for i in range(len(words) - 1)}


def del1word(sentence: Sequence[int]) -> dag.Lattice:
    """The sentence and every string with one word deleted (m + 1 strings
    when the words are distinct)."""
    words = _as_sentence(sentence)
    return dag.from_strings(sorted({words} | _deletions(words)), deterministic=True)


def trans1(sentence: Sequence[int]) -> dag.Lattice:
    """The sentence and every string with one adjacent pair swapped (m strings
    when the words are distinct)."""
    words = _as_sentence(sentence)
    return dag.from_strings(sorted({words} | _transpositions(words)), deterministic=True)


def delortrans1(sentence: Sequence[int]) -> dag.Lattice:
    """The union of DEL1WORD and TRANS1."""
    words = _as_sentence(sentence)
    return dag.from_strings(sorted({words} | _deletions(words) | _transpositions(words)), deterministic=True)


def del1subseq(sentence: Sequence[int]) -> dag.Lattice:
    """The sentence and every string left after deleting one contiguous
    subsequence that is strictly shorter than the sentence (O(m^2) strings)."""
    words = _as_sentence(sentence)
    m = len(words)
    kept = {words[:start] + words[stop:] for start in range(m) for stop in range(start + 1, m + 1) if stop - start < m}
    return dag.from_strings(sorted({words} | kept), deterministic=True)


def length(sentence: Sequence[int], vocabulary) -> dag.Lattice:
    """All strings of the sentence's length m over `vocabulary` (an int, the
    vocabulary size, or a sequence of distinct word ids): states 0..m, with
    one arc per word between consecutive states (m |V| arcs, never
    enumerated). The vocabulary must contain the sentence's words."""
    words = _as_sentence(sentence)
    vocabulary = np.arange(vocabulary) if np.ndim(vocabulary) == 0 else np.asarray(vocabulary, np.int64)
    if vocabulary.ndim != 1 or len(set(vocabulary.tolist())) != vocabulary.size:
        raise ValueError("vocabulary must be a size or a 1-D sequence of distinct word ids")
    missing = sorted(set(words) - set(vocabulary.tolist()))
    if missing:
        raise ValueError(f"vocabulary must contain the sentence's words; missing {missing}")
    m, size = len(words), vocabulary.size
    positions = np.repeat(np.arange(m), size)
    arcs = np.stack([positions, positions + 1, np.tile(vocabulary, m)], axis=1)
    return dag.from_arcs(arcs, final=[m], num_states=m + 1)
