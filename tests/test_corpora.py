"""Corpus readers (CoNLL columns, NLTK corpora via NLTK_DATA), the universal
tagset, length buckets (against brute-force optimal bucketing) and
deterministic shuffling."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import corpus_or_fail
from lossfns import corpora
from lossfns.corpora import Sentence

CONLL_TEXT = """-DOCSTART- -X- O

El DA O
Abogado NC B-PER
General AQ I-PER

Madrid NP B-LOC
"""


def test_parse_conll_splits_sentences_and_columns():
    sentences = corpora.parse_conll(CONLL_TEXT.splitlines())
    assert sentences == [
        Sentence((("El", "DA"), ("Abogado", "NC"), ("General", "AQ")), ("O", "B-PER", "I-PER")),
        Sentence((("Madrid", "NP"),), ("B-LOC",)),
    ]
    assert sentences[0].words == ("El", "Abogado", "General")
    pos = corpora.parse_conll(CONLL_TEXT.splitlines(), label_column=1, observation_columns=[0])
    assert pos[0] == Sentence((("El",), ("Abogado",), ("General",)), ("DA", "NC", "AQ"))


@pytest.mark.parametrize("text, line", [
    ("a B O\nb C\n", 2),             # fewer columns than the sentence's first line
    ("a B O\n\nsolo\n", 3),          # a single column: no label
    ("a B O\nb C D E\n", 2),         # more columns
])
def test_malformed_lines_name_file_and_line(tmp_path, text, line):
    path = tmp_path / "bad.conll"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"bad\.conll:{line}:"):
        corpora.read_conll(str(path))


def test_observation_column_out_of_range_is_reported():
    with pytest.raises(ValueError, match=r"<lines>:1: too few columns"):
        corpora.parse_conll(["a B O"], observation_columns=[0, 5])


def test_find_data_error_names_nltk_data(monkeypatch):
    monkeypatch.setenv("NLTK_DATA", "/nonexistent")
    with pytest.raises(FileNotFoundError, match="NLTK_DATA"):
        corpora.conll2002("esp.train")
    with pytest.raises(ValueError, match="split must be one of"):
        corpora.conll2002("ned.train")


def test_conll2002_spanish():
    corpus_or_fail(("corpora", "conll2002"))
    train = corpora.conll2002("esp.train")
    assert len(train) == 8323
    assert sum(len(s.labels) for s in train) == 264715
    assert train[0].tokens[:3] == (("Melbourne", "NP"), ("(", "Fpa"), ("Australia", "NP"))
    assert train[0].labels[:3] == ("B-LOC", "O", "B-LOC")
    labels = {label for s in train for label in s.labels}
    assert labels == {"O"} | {f"{p}-{t}" for p in "BI" for t in ("PER", "LOC", "ORG", "MISC")}
    assert corpora.conll2002("esp.testb")[0].tokens[:2] == (("La", "DA"), ("Coruña", "NC"))


def test_conll2000_pos_and_chunk_columns():
    corpus_or_fail(("corpora", "conll2000"))
    pos = corpora.conll2000("train.txt", task="pos")
    chunk = corpora.conll2000("train.txt", task="chunk")
    assert len(pos) == len(chunk) == 8936
    assert pos[0].tokens[:2] == (("Confidence",), ("in",)) and pos[0].labels[:3] == ("NN", "IN", "DT")
    assert chunk[0].tokens[0] == ("Confidence", "NN") and chunk[0].labels[:2] == ("B-NP", "B-PP")
    assert len(corpora.conll2000("test.txt", task="pos")) == 2012


def test_treebank_sample_and_universal_tagset():
    corpus_or_fail(("corpora", "treebank"))
    corpus_or_fail(("taggers", "universal_tagset"))
    sentences = corpora.treebank()
    assert len(sentences) == 3914
    assert sentences[0].words[:2] == ("Pierre", "Vinken") and sentences[0].labels[:2] == ("NNP", "NNP")
    assert all("-NONE-" not in s.labels for s in sentences)
    table = corpora.universal_tagset("en-ptb")
    coarse = corpora.map_labels(sentences, table)
    assert coarse[0].labels[:4] == ("NOUN", "NOUN", ".", "NUM")
    assert {label for s in coarse for label in s.labels} <= set(table.values())
    with pytest.raises(ValueError, match="'XYZ' of sentence 0"):
        corpora.map_labels([Sentence((("a",),), ("XYZ",))], table)


def _padded(length, multiple):
    return max(multiple * -(-length // multiple), multiple)


def _best_bucketing_cost(lengths, num_buckets, multiple):
    """Brute force: every way to cut the sorted distinct padded sizes into at most num_buckets groups."""
    sizes = sorted({_padded(n, multiple) for n in lengths})
    best = None
    for k in range(1, min(num_buckets, len(sizes)) + 1):
        for cuts in itertools.combinations(range(1, len(sizes)), k - 1):
            bounds = list(cuts) + [len(sizes)]
            cost, low = 0, 0
            for high in bounds:
                group = sizes[low:high]
                cost += sum(1 for n in lengths if _padded(n, multiple) in group) * group[-1]
                low = high
            best = cost if best is None else min(best, cost)
    return best


@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(1, 4), st.sampled_from([1, 4, 8]))
def test_length_buckets_are_optimal_partitions(lengths, num_buckets, multiple):
    buckets = corpora.length_buckets(lengths, num_buckets, multiple)
    assert 1 <= len(buckets) <= num_buckets
    members = np.concatenate([indices for indices, _ in buckets])
    assert sorted(members.tolist()) == list(range(len(lengths)))
    for indices, padded_length in buckets:
        assert np.all(np.diff(indices) > 0)
        assert all(lengths[i] <= padded_length for i in indices)
    cost = sum(len(indices) * padded_length for indices, padded_length in buckets)
    assert cost == _best_bucketing_cost(lengths, num_buckets, multiple)
    assert [t for _, t in buckets] == sorted(t for _, t in buckets)


def test_length_buckets_validation():
    assert corpora.length_buckets([], 3) == []
    with pytest.raises(ValueError, match="lengths must have shape"):
        corpora.length_buckets([[1, 2]], 2)
    with pytest.raises(ValueError, match="num_buckets"):
        corpora.length_buckets([1], 0)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        corpora.length_buckets([3, -1], 2)


def test_shuffled_is_a_deterministic_permutation():
    first, again, other = corpora.shuffled(50, 7), corpora.shuffled(50, 7), corpora.shuffled(50, 8)
    assert sorted(first.tolist()) == list(range(50))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # Pinned: the order must not change across runs, numpy versions or platforms.
    np.testing.assert_array_equal(corpora.shuffled(5, 0), [2, 4, 3, 0, 1])


# ---------------------------------------------------------------------------
# File errors: columns across the whole file, byte-order marks, encodings
# ---------------------------------------------------------------------------


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_a_sentence_that_drops_its_label_column_is_an_error(tmp_path):
    # Read per sentence, the second sentence would silently get its POS tags as labels.
    text = "El DA O\nrey NC O\n\nMadrid NP\nes VS\n"
    path = _write(tmp_path, "bad.conll", text.encode())
    with pytest.raises(ValueError) as error:
        corpora.read_conll(path)
    message = str(error.value)
    assert message.startswith(f"{path}:4: expected 3 columns") and "got 2" in message, message
    assert "line 1 has 3" in message and "label column" in message, message
    with pytest.raises(ValueError, match=r"<lines>:4: expected 3 columns .*got 2"):
        corpora.parse_conll(text.splitlines())
    with pytest.raises(ValueError, match=r"<lines>:4: expected 2 columns .*got 3"):  # and the other way round
        corpora.parse_conll(["a B", "", "-DOCSTART- -X- O", "c D E"])


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_token(tmp_path):
    path = _write(tmp_path, "bom.conll", "\ufeffEl DA O\nrey NC O\n".encode("utf-8"))
    sentences = corpora.read_conll(path)
    assert sentences[0].tokens[0] == ("El", "DA")
    assert corpora.parse_conll(["\ufeffEl DA O"])[0].tokens[0] == ("El", "DA")


def test_latin1_bytes_name_file_and_line_with_an_encoding_hint(tmp_path):
    path = _write(tmp_path, "latin.conll", "El DA O\n\nLa DA O\nCoruña NC B-LOC\n".encode("latin-1"))
    with pytest.raises(ValueError) as error:
        corpora.read_conll(path)
    message = str(error.value)
    assert message.startswith(f"{path}:4: byte 0xf1 at column 5 is not valid utf-8"), message
    assert "encoding='latin-1'" in message, message
    assert corpora.read_conll(path, encoding="latin-1")[1].tokens[1] == ("Coruña", "NC")


def test_windows_line_endings_still_read(tmp_path):
    path = _write(tmp_path, "crlf.conll", b"El DA O\r\nrey NC O\r\n\r\nMadrid NP B-LOC\r\n")
    assert [s.labels for s in corpora.read_conll(path)] == [("O", "O"), ("B-LOC",)]


def test_template_file_with_a_byte_order_mark_is_accepted(tmp_path):
    from lossfns.features import templates

    path = _write(tmp_path, "bom.tpl", "\ufeffU00:%x[0,0]\nB\n".encode("utf-8"))
    parsed = templates.read_templates(path)
    assert [t.name for t in parsed.unigram] == ["U00"] and parsed.transitions
    assert templates.parse_templates("\ufeff# comment\nU00:%x[0,0]\n").unigram[0].name == "U00"


def test_template_file_in_latin1_names_file_and_line(tmp_path):
    from lossfns.features import templates

    path = _write(tmp_path, "latin.tpl", "U00:%x[0,0]\n# años\nU01:%x[1,0]\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"^{path}:2: byte 0xf1 at column 4 is not valid utf-8.*encoding"):
        templates.read_templates(path)
