"""Labelled output in Wapiti's formats: the input file again, each token line
with its predicted label appended as a last column.

The command line's `label` mode reads a file with `corpora.read_column_file`,
decodes it and writes it back here, line for line: a token line gets its label
appended (a tab when its columns are tab-separated; gold then prediction with
`--check`, as conlleval reads them), a `-DOCSTART-` line the label `O`, blank
lines stay; `--nbest N` writes each sentence N times, best first, and scores
(`-s`, `--post`) add a `# n SCORE` line per copy and `LABEL/SCORE` per token.
Design notes: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from .corpora import ColumnFile

OUTSIDE = "O"
"""The label outside every chunk (IOB2's `O`)."""


def write_labelled(
    file: ColumnFile,
    labels: Sequence[Sequence[Sequence[str]]],
    out: TextIO,
    *,
    sequence_scores: Sequence[Sequence[float]] | None = None,
    token_scores: Sequence[Sequence[Sequence[float]]] | None = None,
    separator: str | None = None,
) -> None:
    """Write `file`'s lines to `out` with the predicted labels appended.

    labels: per sentence of `file`, `[N][T]` label strings (N >= 1 label
      sequences, best first; N = 1 for plain decoding);
    sequence_scores: per sentence `[N]` scores (a `# n SCORE` line before
      each sequence), or None;
    token_scores: per sentence `[N][T]` scores (`LABEL/SCORE` after each
      label), or None;
    separator: the column separator appended; None: a tab when the line
      has one, else a space.
    Raises:
      ValueError naming the sentence (and its first line) whose labels or
      scores do not fit it.
    """
    _check_shapes(file, labels, sequence_scores, token_scores)
    last_row = {rows[-1]: s for s, rows in enumerate(file.rows)}
    in_sentence = {row for rows in file.rows for row in rows}
    for number, line in enumerate(file.lines):
        if number in last_row:
            _write_sentence(file, last_row[number], labels, sequence_scores, token_scores, separator, out)
        elif number not in in_sentence:
            out.write(line + "\n" if not line.strip() else line + _separator(line, separator) + OUTSIDE + "\n")


def _separator(line: str, separator: str | None) -> str:
    if separator is not None:
        return separator
    return "\t" if "\t" in line else " "


def _write_sentence(file, s, labels, sequence_scores, token_scores, separator, out) -> None:
    for n, sequence in enumerate(labels[s]):
        if n:
            out.write("\n")
        if sequence_scores is not None:
            out.write(f"# {n} {sequence_scores[s][n]:f}\n")
        for t, (row, label) in enumerate(zip(file.rows[s], sequence)):
            line = file.lines[row]
            sep = _separator(line, separator)
            scored = "" if token_scores is None else f"{sep}{label}/{token_scores[s][n][t]:f}"
            out.write(f"{line}{sep}{label}{scored}\n")


def _check_shapes(file, labels, sequence_scores, token_scores) -> None:
    if len(labels) != len(file.sentences):
        raise ValueError(
            f"labels must hold one [N][T] entry per sentence of {file.source} "
            f"({len(file.sentences)}), got {len(labels)}"
        )
    for s, (sentence, rows, sequences) in enumerate(zip(file.sentences, file.rows, labels)):
        where = f"sentence {s} ({file.source}:{rows[0] + 1})"
        if isinstance(sequences, str) or not sequences or any(isinstance(q, str) for q in sequences):
            raise ValueError(
                f"labels[{s}] must be [N][T] label strings (N >= 1 sequences) for {where}, got {sequences!r:.60}"
            )
        for name, scores in (("sequence_scores", sequence_scores), ("token_scores", token_scores)):
            if scores is not None and len(scores[s]) != len(sequences):
                raise ValueError(
                    f"{name}[{s}] must hold one entry per label sequence ({len(sequences)}) of "
                    f"{where}, got {len(scores[s])}"
                )
        for n, sequence in enumerate(sequences):
            if len(sequence) != len(sentence.tokens):
                raise ValueError(
                    f"labels[{s}][{n}] has {len(sequence)} labels for the {len(sentence.tokens)} tokens of {where}"
                )
            if token_scores is not None and len(token_scores[s][n]) != len(sentence.tokens):
                raise ValueError(
                    f"token_scores[{s}][{n}] has {len(token_scores[s][n])} scores for the "
                    f"{len(sentence.tokens)} tokens of {where}"
                )
