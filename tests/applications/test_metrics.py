"""Metrics: hand-computed conlleval cases, strict IOB2 versus conlleval on
invalid sequences, agreement with seqeval (both modes, per type too) on
random label sequences, conlleval's printed report (texts printed by the
real conlleval.pl, 2004-01-26, on the same corpora), token accuracy and
ambiguous-word accuracy against direct counts."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lossfns import metrics

seqeval_metrics = pytest.importorskip("seqeval.metrics")
# seqeval warns when a random draw has no predicted entities; its score is then 0, as ours.
pytestmark = pytest.mark.filterwarnings("ignore:.*ill-defined")
seqeval_scheme = pytest.importorskip("seqeval.scheme")

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def test_conlleval_chunks_by_hand():
    # conlleval starts a chunk at an I- after O or after another type.
    assert metrics.entities(["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-PER"]) == [
        ("PER", 0, 2),
        ("LOC", 3, 5),
        ("LOC", 5, 6),
        ("PER", 6, 7),
    ]
    assert metrics.entities(["O", "O"]) == [] and metrics.entities([]) == []
    # Strict IOB2: an I- that continues nothing is not an entity.
    assert metrics.entities(["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-PER"], strict=True) == [
        ("PER", 0, 2),
        ("LOC", 5, 6),
    ]


def test_entity_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-PER"], ["B-LOC", "B-LOC"]]
    scores = metrics.entity_scores(gold, predicted)
    assert (scores.correct, scores.predicted, scores.gold) == (2, 4, 3)
    assert scores.precision == pytest.approx(0.5) and scores.recall == pytest.approx(2 / 3)
    assert scores.f1 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert scores.per_type["PER"] == pytest.approx((0.5, 1.0, 2 / 3))
    assert scores.per_type["LOC"] == pytest.approx((0.5, 0.5, 0.5))
    empty = metrics.entity_scores([["O"]], [["O"]])
    assert (empty.precision, empty.recall, empty.f1) == (0.0, 0.0, 0.0)


label_sequences = st.lists(st.lists(st.sampled_from(LABELS), min_size=0, max_size=8), min_size=1, max_size=6)


@given(label_sequences, st.data())
def test_agrees_with_seqeval(gold, data):
    predicted = [data.draw(st.lists(st.sampled_from(LABELS), min_size=len(g), max_size=len(g))) for g in gold]
    if not any(metrics.entities(g) for g in gold):
        return  # seqeval warns and divides by zero without gold entities
    ours = metrics.entity_scores(gold, predicted)
    assert ours.f1 == pytest.approx(seqeval_metrics.f1_score(gold, predicted), abs=1e-12)
    assert ours.precision == pytest.approx(seqeval_metrics.precision_score(gold, predicted), abs=1e-12)
    assert ours.recall == pytest.approx(seqeval_metrics.recall_score(gold, predicted), abs=1e-12)
    if any(metrics.entities(g, strict=True) for g in gold):
        strict = metrics.entity_scores(gold, predicted, strict=True)
        expected = seqeval_metrics.f1_score(gold, predicted, mode="strict", scheme=seqeval_scheme.IOB2)
        assert strict.f1 == pytest.approx(expected, abs=1e-12)


def test_token_accuracy_and_alignment_errors():
    assert metrics.token_accuracy([["A", "B"], ["C"]], [["A", "C"], ["C"]]) == pytest.approx(2 / 3)
    assert metrics.token_accuracy([], []) == 0.0
    with pytest.raises(ValueError, match=r"predicted\[0\] has 1 labels, gold\[0\] has 2"):
        metrics.token_accuracy([["A", "B"]], [["A"]])
    with pytest.raises(ValueError, match="one sequence per gold sequence"):
        metrics.entity_scores([["O"]], [])


def test_ambiguous_accuracy_against_direct_count():
    rng = np.random.default_rng(0)
    vocabulary, tags = ["the", "can", "run", "fast", "dog"], ["D", "N", "V", "A"]
    words = [[str(w) for w in rng.choice(vocabulary, size=6)] for _ in range(20)]
    gold = [[str(t) for t in rng.choice(tags, size=6)] for _ in range(20)]
    predicted = [[str(t) for t in rng.choice(tags, size=6)] for _ in range(20)]
    dictionary = {
        "the": frozenset({"D"}),
        "can": frozenset({"N", "V"}),
        "run": frozenset({"N", "V"}),
        "fast": frozenset({"A"}),
    }  # "dog" is unknown: counted as ambiguous
    ambiguous = [
        (g, p)
        for ws, gs, ps in zip(words, gold, predicted)
        for w, g, p in zip(ws, gs, ps)
        if w in ("can", "run", "dog")
    ]
    expected = sum(g == p for g, p in ambiguous) / len(ambiguous)
    assert metrics.ambiguous_accuracy(words, gold, predicted, dictionary) == pytest.approx(expected)
    assert metrics.tag_dictionary([["a", "b", "a"]], [["X", "Y", "Z"]]) == {
        "a": frozenset({"X", "Z"}),
        "b": frozenset({"Y"}),
    }


# Printed by conlleval.pl (2004-01-26) for CONLLEVAL_GOLD/PREDICTED written as "word gold guess" lines,
# each sentence followed by a blank line.
CONLLEVAL_GOLD = [["O", "B-PER", "I-PER", "O", "O"], ["B-LOC", "O", "B-MISC"]]
CONLLEVAL_PREDICTED = [["O", "B-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "O", "I-ORG"]]
CONLLEVAL_TEXT = """processed 8 tokens with 3 phrases; found: 4 phrases; correct: 2.
accuracy:  75.00%; precision:  50.00%; recall:  66.67%; FB1:  57.14
              LOC: precision:  50.00%; recall: 100.00%; FB1:  66.67  2
             MISC: precision:   0.00%; recall:   0.00%; FB1:   0.00  0
              ORG: precision:   0.00%; recall:   0.00%; FB1:   0.00  1
              PER: precision: 100.00%; recall: 100.00%; FB1: 100.00  1
"""
# conlleval's quirks: a `.` tag leaves a chunk open; `B-0` has no type (Perl reads "0" as false) and so
# matches a bare `B`; the empty type is listed twice.
QUIRKS_TEXT = """processed 5 tokens with 2 phrases; found: 2 phrases; correct: 1.
accuracy:  80.00%; precision:  50.00%; recall:  50.00%; FB1:  50.00
                 : precision:   0.00%; recall:   0.00%; FB1:   0.00  1
                 : precision:   0.00%; recall:   0.00%; FB1:   0.00  1
              PER: precision: 100.00%; recall: 100.00%; FB1: 100.00  1
"""

# IOE tags and conlleval's one-token `[`/`]` chunks.
IOE_TEXT = """processed 5 tokens with 4 phrases; found: 2 phrases; correct: 1.
accuracy:  60.00%; precision:  50.00%; recall:  25.00%; FB1:  33.33
                 : precision: 100.00%; recall:  50.00%; FB1:  66.67  1
                 : precision: 100.00%; recall:  50.00%; FB1:  66.67  1
              PER: precision:   0.00%; recall:   0.00%; FB1:   0.00  1
"""


def test_conlleval_report_is_conllevals_text():
    assert metrics.conlleval_report(CONLLEVAL_GOLD, CONLLEVAL_PREDICTED) == CONLLEVAL_TEXT
    assert (
        metrics.conlleval_report([["B-PER", "."], ["O", "B-0", "I"]], [["B-PER", "."], ["O", "B", "O"]]) == QUIRKS_TEXT
    )
    assert (
        metrics.conlleval_report([["I-PER", "E-PER", "E-PER", "[", "]"]], [["I-PER", "I-PER", "E-PER", "[", "O"]])
        == IOE_TEXT
    )
    assert metrics.conlleval_report([], []) == "processed 0 tokens with 0 phrases; found: 0 phrases; correct: 0.\n"
    scores = metrics.entity_scores(CONLLEVAL_GOLD, CONLLEVAL_PREDICTED)
    assert scores.per_type_counts == {"LOC": (1, 2, 1), "MISC": (0, 0, 1), "ORG": (0, 1, 0), "PER": (1, 1, 1)}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # seqeval's averages over no gold entity
@given(label_sequences, st.data())
def test_per_type_scores_agree_with_seqeval(gold, data):
    predicted = [data.draw(st.lists(st.sampled_from(LABELS), min_size=len(g), max_size=len(g))) for g in gold]
    ours = metrics.entity_scores(gold, predicted)
    report = seqeval_metrics.classification_report(gold, predicted, output_dict=True, zero_division=0)
    # seqeval reports every type found in the gold or the predicted labels.
    assert set(ours.per_type_counts) == {k for k in report if "avg" not in k}
    for kind, (_correct, _found, total) in ours.per_type_counts.items():
        expected = report[kind]
        assert ours.per_type[kind] == pytest.approx(
            (expected["precision"], expected["recall"], expected["f1-score"]), abs=1e-12
        )
        assert expected["support"] == total
