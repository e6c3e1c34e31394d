"""Metrics: hand-computed conlleval cases, strict IOB2 versus conlleval on
invalid sequences, agreement with seqeval (both modes) on random label
sequences, token accuracy and ambiguous-word accuracy against direct counts."""

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
        ("PER", 0, 2), ("LOC", 3, 5), ("LOC", 5, 6), ("PER", 6, 7)]
    assert metrics.entities(["O", "O"]) == [] and metrics.entities([]) == []
    # Strict IOB2: an I- that continues nothing is not an entity.
    assert metrics.entities(["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-PER"], strict=True) == [
        ("PER", 0, 2), ("LOC", 5, 6)]


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
    dictionary = {"the": frozenset({"D"}), "can": frozenset({"N", "V"}), "run": frozenset({"N", "V"}),
                  "fast": frozenset({"A"})}  # "dog" is unknown: counted as ambiguous
    ambiguous = [(g, p) for ws, gs, ps in zip(words, gold, predicted) for w, g, p in zip(ws, gs, ps)
                 if w in ("can", "run", "dog")]
    expected = sum(g == p for g, p in ambiguous) / len(ambiguous)
    assert metrics.ambiguous_accuracy(words, gold, predicted, dictionary) == pytest.approx(expected)
    assert metrics.tag_dictionary([["a", "b", "a"]], [["X", "Y", "Z"]]) == {"a": frozenset({"X", "Z"}),
                                                                              "b": frozenset({"Y"})}
