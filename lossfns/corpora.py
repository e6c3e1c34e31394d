"""Tagged corpora: CoNLL column files, the NLTK corpora found through
`NLTK_DATA`, the universal tagset, and batching into padded length buckets.

A corpus is a list of `Sentence`s: observation columns per token (word,
POS, ...) and one label per token, all plain strings. Nothing here depends
on JAX; featurisation and arrays come later (`lossfns.features`).
"""

from __future__ import annotations

import io
import os
from typing import Iterable, NamedTuple, Sequence

import numpy as np


class Sentence(NamedTuple):
    """One tagged sentence.

    tokens: `[T]` rows, each a tuple of observation columns (word first);
    labels: `[T]` label strings (e.g. IOB2 tags or POS tags).
    """

    tokens: tuple[tuple[str, ...], ...]
    labels: tuple[str, ...]

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(row[0] for row in self.tokens)


# ---------------------------------------------------------------------------
# CoNLL column files
# ---------------------------------------------------------------------------


def parse_conll(lines: Iterable[str], *, source: str = "<lines>", label_column: int = -1,
                observation_columns: Sequence[int] | None = None) -> list[Sentence]:
    """Parse whitespace-separated CoNLL columns; blank lines end sentences.
    A UTF-8 byte-order mark at the start of the first line is dropped.

    Args:
      lines: the file's lines.
      source: the file name used in error messages.
      label_column: the column holding the label (default: the last).
      observation_columns: the columns kept as observations, in order
        (default: every column except the label's).
    Raises:
      ValueError naming `source` and the 1-based line number when a line has
      a different number of columns than the lines before it (in its
      sentence or in the whole file: a sentence that drops its label column
      must not turn the POS column into labels), or too few columns for
      `label_column`/`observation_columns`.
    """
    sentences: list[Sentence] = []
    rows: list[tuple[str, ...]] = []
    labels: list[str] = []
    width = label_index = width_line = None
    keep: list[int] = []

    def flush():
        nonlocal rows, labels
        if rows:
            sentences.append(Sentence(tuple(rows), tuple(labels)))
        rows, labels = [], []

    for number, line in enumerate(lines, start=1):
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            flush()
            continue
        if width is None:
            width, width_line = len(fields), number
            if width < 2:
                raise ValueError(f"{source}:{number}: expected at least 2 columns (observation and label), "
                                 f"got {line.rstrip()!r}")
            label_index = label_column % width if -width <= label_column < width else None
            keep = (list(observation_columns) if observation_columns is not None
                    else [i for i in range(width) if i != label_index])
            if label_index is None or any(not -width <= i < width for i in keep):
                raise ValueError(f"{source}:{number}: too few columns ({width}) for label column "
                                 f"{label_column} and observation columns {observation_columns}: "
                                 f"{line.rstrip()!r}")
        if len(fields) != width:
            like = ("the previous lines of this sentence" if rows
                    else f"the previous sentences of this file (line {width_line} has {width})")
            hint = " (a missing label column?)" if len(fields) < width else ""
            raise ValueError(f"{source}:{number}: expected {width} columns like {like}, got {len(fields)}"
                             f"{hint}: {line.rstrip()!r}")
        rows.append(tuple(fields[i] for i in keep))
        labels.append(fields[label_index])
    flush()
    return sentences


def read_conll(path: str, *, label_column: int = -1, observation_columns: Sequence[int] | None = None,
               encoding: str = "utf-8") -> list[Sentence]:
    """Read a CoNLL column file (see `parse_conll`); bytes that are not valid
    in `encoding` raise a ValueError naming `path:line`."""
    hint = ", or pass read_conll(..., encoding='latin-1') (the file's encoding)"
    return parse_conll(read_lines(path, encoding, hint=hint), source=path, label_column=label_column,
                       observation_columns=observation_columns)


def read_lines(path, encoding: str = "utf-8", *, hint: str = "") -> io.StringIO:
    """The lines of a text file (universal newlines, as `open` reads them).
    Bytes that are not valid in `encoding` raise ValueError with `path:line`
    and a hint, instead of a bare UnicodeDecodeError."""
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise ValueError(f"{path}:{line}: byte {data[error.start]:#04x} at column {column} is not valid "
                         f"{encoding} ({error.reason}); is the file in another encoding (e.g. latin-1)? "
                         f"Convert it to {encoding}{hint}") from None
    return io.StringIO(text, newline=None)


# ---------------------------------------------------------------------------
# NLTK corpora through NLTK_DATA
# ---------------------------------------------------------------------------


def find_data(*parts: str) -> str:
    """Path of `parts` (e.g. `"corpora", "conll2002"`) under one of the
    directories in the `NLTK_DATA` environment variable."""
    roots = [root for root in os.environ.get("NLTK_DATA", "").split(os.pathsep) if root]
    for root in roots:
        path = os.path.join(root, *parts)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{'/'.join(parts)} not found under NLTK_DATA={os.environ.get('NLTK_DATA', '')!r}; "
                            "set NLTK_DATA to a directory holding the NLTK data layout")


CONLL2002_SPLITS = ("esp.train", "esp.testa", "esp.testb")
CONLL2000_SPLITS = ("train.txt", "test.txt")


def conll2002(split: str = "esp.train") -> list[Sentence]:
    """CoNLL-2002 Spanish NER: tokens `(word, POS)`, IOB2 entity labels."""
    if split not in CONLL2002_SPLITS:
        raise ValueError(f"split must be one of {CONLL2002_SPLITS}, got {split!r}")
    return read_conll(find_data("corpora", "conll2002", split))


def conll2000(split: str = "train.txt", *, task: str = "chunk") -> list[Sentence]:
    """CoNLL-2000 (WSJ). `task="chunk"`: tokens `(word, POS)`, IOB2 chunk
    labels; `task="pos"`: tokens `(word,)`, POS labels."""
    if split not in CONLL2000_SPLITS:
        raise ValueError(f"split must be one of {CONLL2000_SPLITS}, got {split!r}")
    path = find_data("corpora", "conll2000", split)
    if task == "chunk":
        return read_conll(path)
    if task == "pos":
        return read_conll(path, label_column=1, observation_columns=[0])
    raise ValueError(f"task must be 'chunk' or 'pos', got {task!r}")


def treebank() -> list[Sentence]:
    """The NLTK Penn Treebank sample (3,914 sentences), tokens `(word,)` and
    PTB POS labels; empty elements (`-NONE-` traces) are dropped."""
    from nltk.corpus.reader import BracketParseCorpusReader  # optional dependency, only needed here

    reader = BracketParseCorpusReader(find_data("corpora", "treebank", "combined"), r"wsj_.*\.mrg")
    sentences = []
    for tagged in reader.tagged_sents():
        kept = [(word, tag) for word, tag in tagged if tag != "-NONE-"]
        if kept:
            sentences.append(Sentence(tuple((word,) for word, _ in kept), tuple(tag for _, tag in kept)))
    return sentences


def universal_tagset(mapping: str = "en-ptb") -> dict[str, str]:
    """Fine tag -> universal (Petrov et al.) tag, from
    `taggers/universal_tagset/{mapping}.map`."""
    path = find_data("taggers", "universal_tagset", f"{mapping}.map")
    table = {}
    with read_lines(path) as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2:
                raise ValueError(f"{path}:{number}: expected 'fine<TAB>universal', got {line.rstrip()!r}")
            table[fields[0]] = fields[1]
    return table


def map_labels(sentences: Sequence[Sentence], mapping: dict[str, str]) -> list[Sentence]:
    """Relabel every token through `mapping` (e.g. `universal_tagset()`);
    an unmapped label raises ValueError naming it."""
    out = []
    for index, sentence in enumerate(sentences):
        try:
            out.append(sentence._replace(labels=tuple(mapping[label] for label in sentence.labels)))
        except KeyError as error:
            raise ValueError(f"label {error.args[0]!r} of sentence {index} has no entry in the mapping") from None
    return out


# ---------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------


def length_buckets(lengths: Sequence[int], num_buckets: int = 4, multiple: int = 8) -> list[tuple[np.ndarray, int]]:
    """Group sequence indices into at most `num_buckets` buckets of similar
    length, so that only a few padded shapes are ever compiled.

    The boundaries minimise the total padded size `sum_b count_b *
    padded_length_b` (dynamic programming over the distinct lengths, each
    rounded up to a multiple of `multiple`), so a few very long sentences get
    a bucket of their own instead of padding everything.

    Returns:
      `[(indices [n_b] int, padded_length)]`, shortest bucket first; every
      index appears exactly once, in increasing order within its bucket;
      `padded_length >= lengths[i]` for each member.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must have shape [N], got shape {lengths.shape}")
    if num_buckets < 1 or multiple < 1:
        raise ValueError(f"num_buckets and multiple must be >= 1, got {num_buckets} and {multiple}")
    if lengths.size == 0:
        return []
    if lengths.min() < 0:
        raise ValueError(f"lengths must be >= 0, got {int(lengths.min())}")
    padded = np.maximum(multiple * -(-lengths // multiple), multiple)
    sizes, counts = np.unique(padded, return_counts=True)
    before = np.concatenate([[0], np.cumsum(counts)])  # sequences with size < sizes[i]
    n, buckets = len(sizes), min(num_buckets, len(sizes))
    # best[b, i]: least padded size covering sizes[:i] with b buckets; the
    # last bucket spans sizes[j:i] and is padded to sizes[i - 1].
    best = np.full((buckets + 1, n + 1), np.inf)
    choice = np.zeros((buckets + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for b in range(1, buckets + 1):
        for i in range(1, n + 1):
            j = np.arange(i)
            cost = best[b - 1, j] + (before[i] - before[j]) * sizes[i - 1]
            choice[b, i] = int(np.argmin(cost))
            best[b, i] = cost[choice[b, i]]
    b = int(np.argmin(best[:, n]))
    bounds, i = [], n
    while i > 0:
        j = choice[b, i]
        bounds.append((sizes[j], sizes[i - 1]))
        i, b = j, b - 1
    return [(np.flatnonzero((padded >= low) & (padded <= high)), int(high)) for low, high in reversed(bounds)]


def shuffled(count: int, seed: int) -> np.ndarray:
    """A permutation of `range(count)` that depends only on `seed`
    (numpy's PCG64, stable across runs and platforms)."""
    return np.random.Generator(np.random.PCG64(seed)).permutation(count)
