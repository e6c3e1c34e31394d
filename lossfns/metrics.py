"""Tagging metrics over label strings: token accuracy, entity-level
precision / recall / F1 (conlleval's chunking, or strict IOB2) and
conlleval's printed report, and accuracy on ambiguous words given a tagging
dictionary.

Inputs are sequences of sentences, each a sequence of label strings, gold
and predicted aligned token by token.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

Labels = Sequence[Sequence[str]]
"""Label sequences: per sentence, its labels."""


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
    """`"B-PER"` -> `("B", "PER")`; `"O"` -> `("O", "")`: conlleval's split at
    the first `-`, where a type Perl reads as false (`"0"`) is no type."""
    if label == "O":
        return "O", ""
    prefix, _, kind = label.partition("-")
    return prefix, (kind if kind != "0" else "")


# conlleval's endOfChunk and startOfChunk: (previous tag, tag) pairs that end
# or start a chunk, besides a change of type and the one-token `[`/`]` chunks.
_ENDS = {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
_STARTS = {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")}


def _chunk_ends(previous: str, previous_kind: str, tag: str, kind: str) -> bool:
    """conlleval's endOfChunk: does a chunk end between the previous token and this one?"""
    return (previous, tag) in _ENDS or (previous not in ("O", ".") and previous_kind != kind) or previous in ("[", "]")


def _chunk_starts(previous: str, previous_kind: str, tag: str, kind: str) -> bool:
    """conlleval's startOfChunk: does a chunk start at this token?"""
    return (previous, tag) in _STARTS or (tag not in ("O", ".") and previous_kind != kind) or tag in ("[", "]")


def entities(labels: Sequence[str], *, strict: bool = False) -> list[tuple[str, int, int]]:
    """Entity spans `(type, start, end)` (end exclusive) of one label sequence.

    `strict=False` follows conlleval's rules (IOB, IOE and `[`/`]` tags; an
    `I-X` after `O` or after another type starts a chunk; a label splits
    at its first `-` into tag and type); `strict=True` is strict
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
    """precision, recall, f1 (in [0, 1]); counts; per_type: type ->
    (precision, recall, f1); per_type_counts: type -> (correct, predicted,
    gold), for every type of a gold or predicted entity."""

    precision: float
    recall: float
    f1: float
    correct: int
    predicted: int
    gold: int
    per_type: dict
    per_type_counts: dict | None = None


def _prf(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_scores(gold: Labels, predicted: Labels, *, strict: bool = False) -> EntityScores:
    """Entity-level precision, recall and F1 over a corpus: an entity counts as
    correct when its type, start and end all match (conlleval's definition;
    `strict` as in `entities`). Without `strict` the counts are conlleval's
    own, read token by token over the corpus with a boundary between
    sentences: on label sequences where every chunk ends (all of IOB2,
    among others) they are those of the spans of `entities`; on odd ones
    (a chunk left open by a `.` tag, say) they keep conlleval's quirks."""
    _check_aligned(gold, predicted)
    if strict:
        counts: dict = defaultdict(Counter)
        for g, p in zip(gold, predicted):
            gold_spans, predicted_spans = set(entities(g, strict=True)), set(entities(p, strict=True))
            for kind, _, _ in gold_spans:
                counts[kind]["gold"] += 1
            for kind, _, _ in predicted_spans:
                counts[kind]["predicted"] += 1
            for kind, _, _ in gold_spans & predicted_spans:
                counts[kind]["correct"] += 1
    else:
        counts = _conlleval_counts(gold, predicted)
    total = Counter()
    for c in counts.values():
        total.update(c)
    per_type_counts = {kind: (c["correct"], c["predicted"], c["gold"]) for kind, c in sorted(counts.items())}
    per_type = {kind: _prf(*c) for kind, c in per_type_counts.items()}
    return EntityScores(
        *_prf(total["correct"], total["predicted"], total["gold"]),
        total["correct"],
        total["predicted"],
        total["gold"],
        per_type,
        per_type_counts,
    )


def tagging_scores(gold: Labels, predicted: Labels) -> dict:
    """`{"token_accuracy", "precision", "recall", "f1"}`: token accuracy and
    conlleval's entity scores (`entity_scores`) of a tagged corpus."""
    scores = entity_scores(gold, predicted)
    accuracy = token_accuracy(gold, predicted)
    return {"token_accuracy": accuracy, "precision": scores.precision, "recall": scores.recall, "f1": scores.f1}


def _conlleval_counts(gold: Labels, predicted: Labels) -> dict:
    """type -> Counter(gold=, predicted=, correct=), as conlleval's main loop
    counts them: a chunk is found where it starts, and correct when gold and
    prediction start it together with one type and end it together."""
    counts: dict = defaultdict(Counter)
    in_correct = False
    last_gold = last_guess = ("O", "")

    def step(gold_tag, guess_tag):
        nonlocal in_correct, last_gold, last_guess
        if in_correct:
            gold_ends, guess_ends = _chunk_ends(*last_gold, *gold_tag), _chunk_ends(*last_guess, *guess_tag)
            if gold_ends and guess_ends and last_guess[1] == last_gold[1]:
                in_correct = False
                counts[last_gold[1]]["correct"] += 1
            elif gold_ends != guess_ends or guess_tag[1] != gold_tag[1]:
                in_correct = False
        gold_starts, guess_starts = _chunk_starts(*last_gold, *gold_tag), _chunk_starts(*last_guess, *guess_tag)
        if gold_starts and guess_starts and guess_tag[1] == gold_tag[1]:
            in_correct = True
        if gold_starts:
            counts[gold_tag[1]]["gold"] += 1
        if guess_starts:
            counts[guess_tag[1]]["predicted"] += 1
        last_gold, last_guess = gold_tag, guess_tag

    for g, p in zip(gold, predicted):
        for a, b in zip(g, p):
            step(_split(a), _split(b))
        step(("O", ""), ("O", ""))  # the sentence boundary, which conlleval reads as an O token
    if in_correct:
        counts[last_gold[1]]["correct"] += 1
    return counts


def conlleval_report(gold: Labels, predicted: Labels) -> str:
    """conlleval's report, as its Perl script prints it: tokens, entities
    found and correct, token accuracy, overall and per-type precision,
    recall and FB1 (percentages), the per-type lines with the number of
    predicted entities of that type. Example (a corpus of 2 tokens)::

        processed 2 tokens with 1 phrases; found: 1 phrases; correct: 1.
        accuracy: 100.00%; precision: 100.00%; recall: 100.00%; FB1: 100.00
                      PER: precision: 100.00%; recall: 100.00%; FB1: 100.00  1
    """
    scores = entity_scores(gold, predicted)
    tokens = sum(len(g) for g in gold)
    lines = [
        f"processed {tokens} tokens with {scores.gold} phrases; found: {scores.predicted} phrases; "
        f"correct: {scores.correct}."
    ]
    if tokens:
        precision, recall, f1 = _percentages(scores.correct, scores.predicted, scores.gold)
        # conlleval compares tokens after its split (`B-0` and `B` are both tag B without a type).
        correct_tags = sum(_split(a) == _split(b) for g, p in zip(gold, predicted) for a, b in zip(g, p))
        lines.append(
            f"accuracy: {100 * correct_tags / tokens:6.2f}%; "
            f"precision: {precision:6.2f}%; recall: {recall:6.2f}%; FB1: {f1:6.2f}"
        )
    # conlleval lists the types of gold and of predicted chunks, sorted, each
    # once, except after the empty type (false to Perl), which so repeats.
    listed, last = [], None
    for kind in sorted(
        [k for k, c in scores.per_type_counts.items() if c[2]] + [k for k, c in scores.per_type_counts.items() if c[1]]
    ):
        if not last or last != kind:
            listed.append(kind)
        last = kind
    for kind in listed:
        counts = scores.per_type_counts[kind]
        precision, recall, f1 = _percentages(*counts)
        lines.append(f"{kind:>17}: precision: {precision:6.2f}%; recall: {recall:6.2f}%; FB1: {f1:6.2f}  {counts[1]}")
    return "\n".join(lines) + "\n"


def _percentages(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    """Precision, recall and FB1 in percent, computed as conlleval does (F
    from the percentages), so that its rounding to 2 decimals is the same."""
    precision = 100 * correct / predicted if predicted else 0.0
    recall = 100 * correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def tag_dictionary(words: Iterable[Sequence[str]], labels: Labels) -> dict[str, frozenset]:
    """word -> the set of labels it carries in a labelled corpus."""
    table: dict = defaultdict(set)
    for sentence_words, sentence_labels in zip(words, labels):
        for word, label in zip(sentence_words, sentence_labels):
            table[word].add(label)
    return {word: frozenset(tags) for word, tags in table.items()}


def ambiguous_accuracy(words: Sequence[Sequence[str]], gold: Labels, predicted: Labels, dictionary: dict) -> float:
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
