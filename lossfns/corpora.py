"""Tagged corpora: CoNLL column files, the NLTK corpora found on NLTK's own
search path (plain or zipped, as NLTK's downloader leaves them), the
universal tagset, and batching into padded length buckets.

A corpus is a list of `Sentence`s: observation columns per token (word, POS,
...) and one label per token, plain strings; nothing here depends on JAX. Every
reader (`read_lines`, `read_conll`, `read_column_file`, so `features.read_templates`)
also takes a path through a zip archive, as NLTK writes them
(`.../corpora/conll2002.zip/conll2002/esp.train`), and reads the member in place,
without unzipping, with the same errors (file:line) as for a plain file.
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
from collections.abc import Iterable, Sequence
from typing import NamedTuple

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


def parse_conll(
    lines: Iterable[str],
    *,
    source: str = "<lines>",
    label_column: int = -1,
    observation_columns: Sequence[int] | None = None,
) -> list[Sentence]:
    """Parse whitespace-separated CoNLL columns; blank lines end sentences and
    `-DOCSTART-` lines (document markers) are skipped. A UTF-8 byte-order
    mark at the start of the first line is dropped.

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
    return _parse_columns(lines, source, label_column, observation_columns)[0]


def _parse_columns(
    lines: Iterable[str], source: str, label_column: int | None, observation_columns: Sequence[int] | None
):
    """`(sentences, rows, texts)`: `parse_conll`'s sentences (all columns
    observations and labels `()` when `label_column` is None), per sentence
    the 0-based indices of its lines, and every line without its line end."""
    sentences: list[Sentence] = []
    rows: list[tuple[str, ...]] = []
    labels: list[str] = []
    numbers: list[int] = []
    sentence_rows: list[tuple[int, ...]] = []
    texts: list[str] = []
    width = label_index = width_line = None
    keep: list[int] = []
    least = 1 if label_column is None else 2

    def flush():
        nonlocal rows, labels, numbers
        if rows:
            sentences.append(Sentence(tuple(rows), tuple(labels)))
            sentence_rows.append(tuple(numbers))
        rows, labels, numbers = [], [], []

    for number, line in enumerate(lines, start=1):
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]
        texts.append(line.rstrip("\r\n"))
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            flush()
            continue
        if width is None:
            width, width_line = len(fields), number
            if width < least:
                raise ValueError(
                    f"{source}:{number}: expected at least 2 columns (observation and label), got {line.rstrip()!r}"
                )
            if label_column is None:
                label_index = None
            elif -width <= label_column < width:
                label_index = label_column % width
            else:
                label_index = -1
            keep = (
                list(observation_columns)
                if observation_columns is not None
                else [i for i in range(width) if i != label_index]
            )
            if label_index == -1 or any(not -width <= i < width for i in keep):
                raise ValueError(
                    f"{source}:{number}: too few columns ({width}) for label column "
                    f"{label_column} and observation columns {observation_columns}: "
                    f"{line.rstrip()!r}"
                )
        if len(fields) != width:
            like = (
                "the previous lines of this sentence"
                if rows
                else f"the previous sentences of this file (line {width_line} has {width})"
            )
            hint = " (a missing label column?)" if len(fields) < width else ""
            raise ValueError(
                f"{source}:{number}: expected {width} columns like {like}, got {len(fields)}{hint}: {line.rstrip()!r}"
            )
        rows.append(tuple(fields[i] for i in keep))
        if label_index is not None:
            labels.append(fields[label_index])
        numbers.append(number - 1)
    flush()
    return sentences, sentence_rows, texts


def read_conll(
    path: str, *, label_column: int = -1, observation_columns: Sequence[int] | None = None, encoding: str = "utf-8"
) -> list[Sentence]:
    """Read a CoNLL column file (see `parse_conll`); bytes that are not valid
    in `encoding` raise a ValueError naming `path:line`."""
    hint = ", or pass read_conll(..., encoding='latin-1') (the file's encoding)"
    return parse_conll(
        read_lines(path, encoding, hint=hint),
        source=path,
        label_column=label_column,
        observation_columns=observation_columns,
    )


class ColumnFile(NamedTuple):
    """A CoNLL column file as the command line labels it: every line kept, so
    that the output can repeat the input with a predicted column appended.

    lines: `[n]` every line of the file, without its line end;
    sentences: the sentences (blank lines and `-DOCSTART-` lines end them);
      tokens hold the observation columns, labels the gold last column when
      read with `labelled=True`, else `()`;
    rows: per sentence `[T]` the indices into `lines` of its tokens (lines
      in no sentence are blank or document markers);
    source: the file name, for messages.
    """

    lines: tuple[str, ...]
    sentences: tuple[Sentence, ...]
    rows: tuple[tuple[int, ...], ...]
    source: str

    @property
    def labelled(self) -> bool:
        return any(sentence.labels for sentence in self.sentences)


def read_column_file(path, *, labelled: bool, encoding: str = "utf-8") -> ColumnFile:
    """Read a CoNLL column file for labelling, as Wapiti's `label` mode reads
    it: with `labelled=True` (`--check`) the last column is the gold label,
    otherwise every column is an observation. Errors as `read_conll`'s
    (file:line, columns checked file-wide, invalid bytes)."""
    path = os.fspath(path)
    hint = ", or pass encoding='latin-1' (the file's encoding)"
    sentences, rows, texts = _parse_columns(read_lines(path, encoding, hint=hint), path, -1 if labelled else None, None)
    return ColumnFile(tuple(texts), tuple(sentences), tuple(rows), path)


def read_lines(path, encoding: str = "utf-8", *, hint: str = "") -> io.StringIO:
    """The lines of a text file (universal newlines, as `open` reads them),
    or of a member of a zip archive given by a path through the archive
    (`.../conll2002.zip/conll2002/esp.train`). Bytes that are not valid in
    `encoding` raise ValueError with `path:line` and a hint, instead of a
    bare UnicodeDecodeError."""
    path = os.fspath(path)
    data = read_bytes(path)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise ValueError(
            f"{path}:{line}: byte {data[error.start]:#04x} at column {column} is not valid "
            f"{encoding} ({error.reason}); is the file in another encoding (e.g. latin-1)? "
            f"Convert it to {encoding}{hint}"
        ) from None
    return io.StringIO(text, newline=None)


def read_bytes(path) -> bytes:
    """The bytes of a file, or of a zip archive's member given by a path
    through the archive (`a/b.zip/b/c`: member `b/c` of `a/b.zip`, when no
    file `a/b.zip/b/c` exists)."""
    path = os.fspath(path)
    inside = _split_archive(path)
    if inside is None:
        with open(path, "rb") as handle:
            return handle.read()
    archive, member = inside
    with zipfile.ZipFile(archive) as opened:
        try:
            return opened.read(member)
        except KeyError:
            raise FileNotFoundError(f"{path}: the archive {archive} has no member {member!r}") from None


def _split_archive(path: str) -> tuple[str, str] | None:
    """`(archive, member)` when `path` does not exist as a file but runs
    through an existing zip file (`a/b.zip/b/c` -> `("a/b.zip", "b/c")`,
    the member with `/` separators as zip files name them), else None."""
    path = os.fspath(path)
    if os.path.exists(path):
        return None
    normal = path.replace(os.sep, "/")
    start = 0
    while True:
        found = normal.find(".zip/", start)
        if found < 0:
            return None
        archive = path[: found + 4]
        if os.path.isfile(archive):
            return archive, normal[found + 5 :]
        start = found + 1


# ---------------------------------------------------------------------------
# NLTK data: NLTK's search path, plain and zipped corpora
# ---------------------------------------------------------------------------


def _nltk_default_path() -> list[str]:
    """The directories NLTK searches after `NLTK_DATA`, in NLTK's order
    (`nltk/data.py`): `~/nltk_data`, then the interpreter's prefix and the
    system directories."""
    path = []
    if "APPENGINE_RUNTIME" not in os.environ and os.path.expanduser("~/") != "~/":
        path.append(os.path.expanduser("~/nltk_data"))
    prefixed = [
        os.path.join(sys.prefix, "nltk_data"),
        os.path.join(sys.prefix, "share", "nltk_data"),
        os.path.join(sys.prefix, "lib", "nltk_data"),
    ]
    if os.name == "nt":
        return (
            path
            + prefixed
            + [
                os.path.join(os.environ.get("APPDATA", "C:\\"), "nltk_data"),
                r"C:\nltk_data",
                r"D:\nltk_data",
                r"E:\nltk_data",
            ]
        )
    return (
        path
        + prefixed
        + ["/usr/share/nltk_data", "/usr/local/share/nltk_data", "/usr/lib/nltk_data", "/usr/local/lib/nltk_data"]
    )


def data_path() -> list[str]:
    """Where NLTK data is searched, in order: the directories of the
    `NLTK_DATA` variable (read now, `os.pathsep`-separated), then
    `nltk.data.path` when NLTK is already imported (it holds the user's own
    additions), else NLTK's default directories (`~/nltk_data`, then the
    interpreter's prefix and the system directories, in NLTK's order).
    NLTK itself is never imported here."""
    roots = [os.path.expanduser(root) for root in os.environ.get("NLTK_DATA", "").split(os.pathsep) if root]
    loaded = sys.modules.get("nltk.data")
    for root in list(getattr(loaded, "path", ())) if loaded is not None else _nltk_default_path():
        if root and root not in roots:
            roots.append(root)
    return roots


def _in_archive(archive: str, member: str) -> str | None:
    """`member` if the zip file `archive` holds it as a file, `member + "/"`
    if as a directory, else None."""
    try:
        with zipfile.ZipFile(archive) as opened:
            names = opened.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    directory = member.rstrip("/") + "/"
    if member in names and not member.endswith("/"):
        return member
    return directory if any(name.startswith(directory) for name in names) else None


def _find_in(roots: Sequence[str], parts: Sequence[str]) -> str | None:
    """NLTK's lookup of one resource name over the roots: a root that is a
    zip file is searched inside; otherwise the path under the root, read
    through the first `.zip` component of the name if it has one."""
    for root in roots:
        zipped = next((i for i, part in enumerate(parts) if part.endswith(".zip")), None)
        if root.endswith(".zip") and os.path.isfile(root):
            archive, inner = root, list(parts)
        elif zipped is None:
            path = os.path.join(root, *parts)
            if os.path.exists(path):
                return path
            continue
        else:
            archive, inner = os.path.join(root, *parts[: zipped + 1]), list(parts[zipped + 1 :])
            if not os.path.isfile(archive):
                continue
        member = _in_archive(archive, "/".join(inner))
        if member is not None:
            return os.path.join(archive, *member.split("/"))  # a trailing "" keeps a directory's "/"
    return None


def find_data(*parts: str) -> str:
    """Path of the NLTK resource `parts` (e.g. `"corpora", "conll2002"`),
    found as NLTK finds it: on `data_path()`, first as plain files, then
    inside a zip archive named after one of its components
    (`corpora/conll2002.zip/conll2002/...`, as NLTK's downloader leaves
    corpora). A path inside an archive is read in place by `read_lines` and
    the readers built on it (and by NLTK's corpus readers); a directory
    inside an archive ends with `/`, as NLTK names them.

    Raises:
      FileNotFoundError: naming the resource, the directories searched and
        how to install it.
    """
    roots = data_path()
    found = _find_in(roots, parts)
    for i in range(len(parts)):
        if found is not None:
            break
        found = _find_in(roots, [*parts[:i], parts[i] + ".zip", *parts[i:]])
    if found is not None:
        return found
    package = parts[min(1, len(parts) - 1)]  # the second component, or the only one
    raise FileNotFoundError(
        f"{'/'.join(parts)} not found (plain or zipped) in NLTK's data path: "
        f"NLTK_DATA={os.environ.get('NLTK_DATA', '')!r}, then {roots}; install it with "
        f"`python -m nltk.downloader {package}` or set NLTK_DATA to a directory holding the "
        "NLTK data layout"
    )


CONLL2002_SPLITS = ("esp.train", "esp.testa", "esp.testb", "ned.train", "ned.testa", "ned.testb")
"""The files of NLTK's conll2002 corpus (Spanish `esp.*`, Dutch `ned.*`)."""
CONLL2000_SPLITS = ("train.txt", "test.txt")
"""The files of NLTK's conll2000 corpus."""


def conll2002(split: str = "esp.train", *, encoding: str = "utf-8") -> list[Sentence]:
    """CoNLL-2002 NER, Spanish (`esp.*`) or Dutch (`ned.*`): tokens
    `(word, POS)`, IOB2 entity labels. The Dutch files mark articles with
    `-DOCSTART-` lines, which end a sentence and are skipped. NLTK ships the
    files in UTF-8; the original distribution's are latin-1
    (`encoding="latin-1"`)."""
    if split not in CONLL2002_SPLITS:
        raise ValueError(f"split must be one of {CONLL2002_SPLITS}, got {split!r}")
    return read_conll(find_data("corpora", "conll2002", split), encoding=encoding)


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
    PTB POS labels; empty elements (`-NONE-` traces) are dropped. (NLTK's
    readers open a path through a zip archive themselves.)"""
    from nltk.corpus.reader import BracketParseCorpusReader  # optional dependency, only needed here

    reader = BracketParseCorpusReader(find_data("corpora", "treebank", "combined"), r"wsj_.*\.mrg")
    sentences = []
    for tagged in reader.tagged_sents():
        kept = [(word, tag) for word, tag in tagged if tag != "-NONE-"]
        if kept:
            tokens, labels = tuple((word,) for word, _ in kept), tuple(tag for _, tag in kept)
            sentences.append(Sentence(tokens, labels))  # pyright: ignore[reportArgumentType]  # nltk's stubs: str words
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


def length_buckets(
    lengths: Sequence[int] | np.ndarray, num_buckets: int = 4, multiple: int = 8
) -> list[tuple[np.ndarray, int]]:
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


def doubling_buckets(lengths: Sequence[int] | np.ndarray, smallest: int = 8) -> list[tuple[np.ndarray, int]]:
    """Group sequence indices by their length rounded up to a power of two (at
    least `smallest`): a fixed set of padded lengths, so that other corpora
    share compiled shapes (decoding; `length_buckets` pads less but its
    lengths depend on the corpus). Returns `length_buckets`' format."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must have shape [N], got shape {lengths.shape}")
    if lengths.size and lengths.min() < 0:
        raise ValueError(f"lengths must be >= 0, got {int(lengths.min())}")
    padded = np.maximum(2 ** np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64), smallest)
    return [(np.flatnonzero(padded == size), int(size)) for size in np.unique(padded)]


def shuffled(count: int, seed: int) -> np.ndarray:
    """A permutation of `range(count)` that depends only on `seed`
    (numpy's PCG64, stable across runs and platforms)."""
    return np.random.Generator(np.random.PCG64(seed)).permutation(count)
