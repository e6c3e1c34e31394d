"""`CrfsuiteTagger`: python-crfsuite's `Tagger` interface over a lossfns model.

`sklearn.CRF.tagger_` is one, as sklearn-crfsuite's is a `pycrfsuite.Tagger`:
`open` (a CRFsuite model file or a lossfns one), `labels`, `set`, `tag`,
`probability`, `marginal`, `info`, `dump`, `close`. Items are feature dicts
(or lists of attribute names), read as the estimator reads them; the scores
come from the library's chain functions on the model's potentials. CRFsuite's
own data files (`crfsuite tag`'s input: a label and attributes per line) are
read by `read_attribute_file` and labelled by an `AttributeFileTagger`, which
is how `lossfns label` applies a CRFsuite model.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from . import corpora, crfsuite_model, model_file
from .features.corpus import check_sentences
from .features.dicts import flatten_corpus
from .lattices import chain
from .tagger import Tagger

__all__ = ["AttributeFileTagger", "CrfsuiteTagger", "ModelInfo", "read_attribute_file"]


class ModelInfo(NamedTuple):
    """What `CrfsuiteTagger.info()` gives, as pycrfsuite's `ParsedDump`:
    `labels` {label: id}, `attributes` {attribute: id}, `transitions`
    {(label_from, label_to): weight}, `state_features` {(attribute, label):
    weight} (non-zero weights only), `header` {name: value}."""

    labels: dict
    attributes: dict
    transitions: dict
    state_features: dict
    header: dict


class CrfsuiteTagger:
    """A tagger answering `pycrfsuite.Tagger`'s methods. `tagger`: the lossfns
    `Tagger` it wraps (preset `feature_dicts`), or None until `open`."""

    def __init__(self, tagger: Tagger | None = None):
        self.tagger = tagger
        self._items: list | None = None
        self._potentials = None

    # -- opening ------------------------------------------------------------

    def open(self, name) -> contextlib.closing:
        """Read a model file (CRFsuite's or lossfns'); usable as `with tagger.open(path):`."""
        if crfsuite_model.is_crfsuite_file(name):
            saved = crfsuite_model.to_saved_model(crfsuite_model.read(name))
        else:
            saved = model_file.load(name, reading=model_file.FEATURE_DICTS)
        return self._opened(saved)

    def open_inmemory(self, value: bytes) -> contextlib.closing:
        """`open` from the file's bytes."""
        is_crfsuite = bytes(value[: len(crfsuite_model.MAGIC)]) == crfsuite_model.MAGIC
        if is_crfsuite:
            saved = crfsuite_model.to_saved_model(crfsuite_model.from_bytes(value))
        else:
            saved = model_file.from_bytes(value)
            model_file.check_reads(saved, model_file.FEATURE_DICTS, "<bytes>")
        return self._opened(saved)

    def _opened(self, saved: model_file.SavedModel) -> contextlib.closing:
        self.tagger = Tagger.from_saved(saved, iob_constraints=False)
        self._items, self._potentials = None, None
        return contextlib.closing(self)

    def close(self) -> None:
        """Forget the model."""
        self.tagger, self._items, self._potentials = None, None, None

    def _model(self) -> Tagger:
        if self.tagger is None or self.tagger.model is None:
            raise ValueError("the tagger has no model: call open() first")
        return self.tagger

    # -- an item sequence ---------------------------------------------------

    def labels(self) -> list[str]:
        """The model's labels."""
        return list(self._model().labels)

    def set(self, xseq: Sequence) -> None:
        """Set the item sequence (feature dicts, or lists of attribute names) that
        `probability` and `marginal` read."""
        tagger = self._model()
        corpus = flatten_corpus([xseq])
        ids, values = corpus.token_arrays(tagger.index)  # pyright: ignore[reportArgumentType]  # a fitted model
        length = ids.shape[0]
        model = tagger.model
        assert model is not None  # _model checked it
        potentials = model(ids[None], None, None if values is None else values[None])
        self._items, self._potentials = list(xseq), (potentials, jnp.asarray([length], jnp.int32))

    def _set(self) -> tuple:
        if self._potentials is None:
            raise ValueError("no item sequence: call set(xseq) (or tag(xseq)) first")
        return self._potentials

    def tag(self, xseq: Sequence | None = None) -> list[str]:
        """The most likely labels of `xseq` (default: the sequence given to `set`)."""
        if xseq is not None:
            self.set(xseq)
        potentials, lengths = self._set()
        _, path = chain.viterbi(potentials, lengths)
        labels = self.labels()
        return [labels[j] for j in np.asarray(path)[0, : int(lengths[0])].tolist()]

    def probability(self, yseq: Sequence[str]) -> float:
        """`P(yseq | xseq)` of the sequence given to `set`."""
        potentials, lengths = self._set()
        labels = {label: i for i, label in enumerate(self.labels())}
        if len(yseq) != int(lengths[0]):
            raise ValueError(f"yseq must have one label per item ({int(lengths[0])}), got {len(yseq)}")
        unknown = [label for label in yseq if label not in labels]
        if unknown:
            raise ValueError(f"yseq holds labels the model does not know: {unknown[:5]}")
        ids = jnp.asarray([[labels[label] for label in yseq]], jnp.int32)
        score = chain.score(potentials, ids, lengths) - chain.log_partition(potentials, lengths)
        return float(np.exp(np.asarray(score, np.float64)[0]))

    def marginal(self, y: str, pos: int) -> float:
        """`P(y_pos = y | xseq)` of the sequence given to `set`."""
        potentials, lengths = self._set()
        labels = self.labels()
        if y not in labels:
            raise ValueError(f"y must be one of the model's labels {labels}, got {y!r}")
        if not 0 <= pos < int(lengths[0]):
            raise ValueError(f"pos must lie in [0, {int(lengths[0])}), got {pos}")
        return float(np.asarray(chain.node_marginals(potentials, lengths))[0, pos, labels.index(y)])

    # -- the model ----------------------------------------------------------

    def info(self) -> ModelInfo:
        """The model's labels, attributes and non-zero weights (pycrfsuite's `ParsedDump`)."""
        tagger = self._model()
        model, unigram = tagger.model, tagger.index.unigram  # pyright: ignore[reportOptionalMemberAccess]  # opened
        assert model is not None and unigram is not None  # string tables: feature dicts are not hashed
        labels, names = tagger.labels, sorted(unigram, key=unigram.__getitem__)
        emission, transitions = np.asarray(model.emission), np.asarray(model.transitions)
        state = {(names[i], labels[j]): float(emission[i, j]) for i, j in zip(*np.nonzero(emission))}
        moves = {(labels[i], labels[j]): float(transitions[i, j]) for i, j in zip(*np.nonzero(transitions))}
        header = {"num_labels": len(labels), "num_attrs": len(names)}
        return ModelInfo(
            {label: i for i, label in enumerate(labels)},
            {name: i for i, name in enumerate(names)},
            moves,
            state,
            header,
        )

    def dump(self, filename=None) -> None:
        """Write the model as text (labels, attributes, transitions, state
        features, as CRFsuite's dump lists them) to `filename`, default stdout."""
        info = self.info()
        lines = ["LABELS = {", *(f"  {i:5d}: {label}" for label, i in info.labels.items()), "}", "", "ATTRIBUTES = {"]
        lines += [*(f"  {i:5d}: {name}" for name, i in info.attributes.items()), "}", "", "TRANSITIONS = {"]
        lines += [*(f"  ({a}) --> ({b}): {w:f}" for (a, b), w in info.transitions.items()), "}", ""]
        lines += ["STATE_FEATURES = {", *(f"  ({a}) --> ({y}): {w:f}" for (a, y), w in info.state_features.items())]
        text = "\n".join([*lines, "}", ""])
        if filename is None:
            sys.stdout.write(text)
        else:
            with open(filename, "w", encoding="utf-8") as file:
                file.write(text)


# -- CRFsuite's data files ------------------------------------------------------


def _unescaped(field: str, start: int) -> tuple[str, int]:
    """The text of `field` from `start` to the next unescaped colon (`\\:` is
    a colon, `\\\\` a backslash, any other backslash itself), and where it
    stopped, as CRFsuite's reader (frontend/iwa.c) reads a name or value."""
    out, i = [], start
    while i < len(field) and field[i] != ":":
        if field[i] == "\\" and i + 1 < len(field) and field[i + 1] in ":\\":
            i += 1
        out.append(field[i])
        i += 1
    return "".join(out), i


def parse_attribute(field: str) -> tuple[str, float]:
    """`(name, value)` of one attribute field of a CRFsuite data file:
    `name` or `name:value` (a missing or empty value is 1), escapes as CRFsuite's
    reader; a value that is not a finite number is a ValueError."""
    name, end = _unescaped(field, 0)
    if end == len(field):
        return name, 1.0
    text, _ = _unescaped(field, end + 1)
    if not text:
        return name, 1.0
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"attribute {name!r} has value {text!r}, not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"attribute {name!r} has value {text!r}: attribute values must be finite")
    return name, value


def read_attribute_file(path, *, labelled: bool = False, encoding: str = "utf-8") -> corpora.ColumnFile:
    """A data file in CRFsuite's format, as `crfsuite tag` reads it
    (frontend/iwa.c): one item (token) per line, its fields separated by tabs
    (consecutive tabs are one), the first field the item's label and the
    others its attributes, `name` or `name:value` (value 1 when missing;
    `\\:` and `\\\\` escape a colon and a backslash); an empty line ends a
    sequence. Attribute names are sklearn-crfsuite's feature dicts flattened
    (`{"word": "the"}` is `word:the`, written `word\\:the`; `{"len": 0.75}`
    is `len:0.75`).

    The result is a `corpora.ColumnFile` (every line kept, for
    `labelled_output`): each token row is the line's fields, label first,
    which `AttributeFileTagger` reads; with `labelled` (`--check`) the first
    field is also the sentence's gold label, else it is ignored (CRFsuite
    requires it; tagging, it only reads it with `-t`). A line of tabs only
    ends a sequence, a carriage return before the line end is dropped, and
    an attribute value that is not a finite number is a ValueError naming
    `path:line`."""
    path = os.fspath(path)
    lines = [line.rstrip("\r") for line in corpora.read_lines(path, encoding).read().split("\n")]
    if lines and lines[-1] == "":
        lines.pop()  # the final line end
    sentences, rows, tokens, numbers = [], [], [], []
    for number, line in enumerate([*lines, ""]):
        fields = tuple(field for field in line.split("\t") if field)
        if fields:
            for field in fields[1:]:
                try:
                    parse_attribute(field)
                except ValueError as problem:
                    raise ValueError(f"{path}:{number + 1}: {problem}") from None
            tokens.append(fields)
            numbers.append(number)
        elif tokens:
            labels = tuple(row[0] for row in tokens) if labelled else ()
            sentences.append(corpora.Sentence(tuple(tokens), labels))
            rows.append(tuple(numbers))
            tokens, numbers = [], []
    return corpora.ColumnFile(tuple(lines), tuple(sentences), tuple(rows), path)


def attribute_items(rows: Sequence[Sequence[str]]) -> list[dict]:
    """The items of one sequence of `read_attribute_file` as feature dicts
    `{attribute: value}` (the fields after each row's label; the values of a
    repeated attribute summed, as CRFsuite sums its scores)."""
    items = []
    for row in rows:
        item: dict = {}
        for field in row[1:]:
            name, value = parse_attribute(field)
            item[name] = item.get(name, 0.0) + value
        items.append(item)
    return items


class AttributeFileTagger(Tagger):
    """A `Tagger` of a CRFsuite model (`crfsuite_model.to_saved_model`, preset
    `feature_dicts`) whose sentences are `read_attribute_file`'s: `predict`,
    `predict_kbest`, `predict_marginals` read each token row's attributes
    (the fields after its label; attributes the model does not know are
    ignored, as by CRFsuite). Open it with `iob_constraints=False` to
    decode as CRFsuite does. `output_separator`: what `lossfns label`
    appends its labels with (the files' own, a tab)."""

    output_separator = "\t"

    def _decode(self, sentences, decode, *arguments):
        check_sentences(sentences, labelled=False)
        _, index = self._require_model()
        corpus = flatten_corpus([attribute_items(s.tokens) for s in sentences]).pack(index, None, None)
        return corpus, self.decode_packed(corpus, decode, *arguments)
