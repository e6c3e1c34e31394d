"""Tagging metrics over label strings: token accuracy, entity-level
precision / recall / F1 (conlleval's chunking, or strict IOB2), and accuracy
on ambiguous words given a tagging dictionary.

Inputs are sequences of sentences, each a sequence of label strings, gold
and predicted aligned token by token.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, NamedTuple, Sequence

Labels = Sequence[Sequence[str]]


def _check_aligned(gold: Labels, predicted: Labels) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"predicted must have one sequence per gold sequence ({len(gold)}), got {len(predicted)}")
    for index, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"predicted[{index}] has {len(p)} labels, gold[{index}] has {len(g)}")


def token_accuracy(gold: Labels, predicted: Labels) -> float:
    """Fraction of tokens whose predicted label equals the gold one (0 when there are none)."""
    _check_aligned(gold, predicted)
    total = sum(len(g) for g in gold)
    correct = sum(a == b for g, p in zip(gold, predicted) for a, b in zip(g, p))
    return correct / total if total else 0.0


def _split(label: str) -> tuple[str, str]:
    """`"B-PER"` -> `("B", "PER")`; `"O"` -> `("O", "")`."""
    if label == "O":
        return "O", ""
    prefix, dash, kind = label.partition("-")
    if not dash:
        return label, ""
    return prefix, kind


def _chunk_ends(previous: str, previous_kind: str, tag: str, kind: str) -> bool:
    """conlleval's endOfChunk: does a chunk end between the previous token and this one?"""
    if previous in ("B", "I") and tag in ("B", "O"):
        return True
    return previous not in ("O", ".") and previous_kind != kind


def _chunk_starts(previous: str, previous_kind: str, tag: str, kind: str) -> bool:
    """conlleval's startOfChunk: does a chunk start at this token?"""
    if tag == "B" or (previous == "O" and tag == "I"):
        return True
    return tag not in ("O", ".") and previous_kind != kind


def entities(labels: Sequence[str], *, strict: bool = False) -> list[tuple[str, int, int]]:
    """Entity spans `(type, start, end)` (end exclusive) of one label sequence.

    `strict=False` follows conlleval's rules for IOB labels (an `I-X` after
    `O` or after another type starts a chunk); `strict=True` is strict
    IOB2 (as `seqeval` with `mode="strict", scheme=IOB2`): an entity is
    `B-X` followed by `I-X`s, and an `I-X` that does not continue one is no
    entity at all.
    """
    spans = []
    if strict:
        start, current = None, None
        for t, label in enumerate(list(labels) + ["O"]):
            tag, kind = _split(label)
            if start is not None and not (tag == "I" and kind == current):
                spans.append((current, start, t))
                start = None
            if tag == "B":
                start, current = t, kind
        return spans
    previous, previous_kind, start = "O", "", None
    for t, label in enumerate(list(labels) + ["O"]):
        tag, kind = _split(label)
        if start is not None and _chunk_ends(previous, previous_kind, tag, kind):
            spans.append((previous_kind, start, t))
            start = None
        if t < len(labels) and _chunk_starts(previous, previous_kind, tag, kind):
            start = t
        previous, previous_kind = tag, kind
    return spans


class EntityScores(NamedTuple):
    """precision, recall, f1 (in [0, 1]); counts; per_type: type -> (precision, recall, f1)."""

    precision: float
    recall: float
    f1: float
    correct: int
    predicted: int
    gold: int
    per_type: dict


def _prf(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_scores(gold: Labels, predicted: Labels, *, strict: bool = False) -> EntityScores:
    """Entity-level precision, recall and F1 over a corpus: an entity counts as
    correct when its type, start and end all match (conlleval's definition;
    `strict` as in `entities`)."""
    _check_aligned(gold, predicted)
    counts: dict = defaultdict(Counter)
    for g, p in zip(gold, predicted):
        gold_spans, predicted_spans = set(entities(g, strict=strict)), set(entities(p, strict=strict))
        for kind, _, _ in gold_spans:
            counts[kind]["gold"] += 1
        for kind, _, _ in predicted_spans:
            counts[kind]["predicted"] += 1
        for kind, _, _ in gold_spans & predicted_spans:
            counts[kind]["correct"] += 1
    total = Counter()
    for c in counts.values():
        total.update(c)
    per_type = {kind: _prf(c["correct"], c["predicted"], c["gold"]) for kind, c in sorted(counts.items())}
    return EntityScores(*_prf(total["correct"], total["predicted"], total["gold"]),
                        total["correct"], total["predicted"], total["gold"], per_type)


def tag_dictionary(words: Iterable[Sequence[str]], labels: Labels) -> dict[str, frozenset]:
    """word -> the set of labels it carries in a labelled corpus."""
    table: dict = defaultdict(set)
    for sentence_words, sentence_labels in zip(words, labels):
        for word, label in zip(sentence_words, sentence_labels):
            table[word].add(label)
    return {word: frozenset(tags) for word, tags in table.items()}


def ambiguous_accuracy(words: Sequence[Sequence[str]], gold: Labels, predicted: Labels,
                       dictionary: dict) -> float:
    """Token accuracy restricted to ambiguous words: those with more than one
    label in `dictionary` (a word missing from it counts as ambiguous, since
    any label is possible). Smith & Eisner's evaluation measure."""
    _check_aligned(gold, predicted)
    _check_aligned(gold, words)
    correct = total = 0
    for sentence_words, g, p in zip(words, gold, predicted):
        for word, a, b in zip(sentence_words, g, p):
            if len(dictionary.get(word, ())) != 1:
                total += 1
                correct += a == b
    return correct / total if total else 0.0
