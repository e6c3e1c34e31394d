"""Corpus readers (CoNLL columns, NLTK corpora on NLTK's search path, plain
or zipped, against NLTK's own path list and readers), files read for
labelling, the universal tagset, length buckets (against brute-force optimal
bucketing) and deterministic shuffling."""

import itertools
import sys
import types
import zipfile

import numpy as np
import pytest
from conftest import corpus_or_fail
from hypothesis import given
from hypothesis import strategies as st

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


@pytest.mark.parametrize(
    "text, line",
    [
        ("a B O\nb C\n", 2),  # fewer columns than the sentence's first line
        ("a B O\n\nsolo\n", 3),  # a single column: no label
        ("a B O\nb C D E\n", 2),  # more columns
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, text, line):
    path = tmp_path / "bad.conll"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"bad\.conll:{line}:"):
        corpora.read_conll(str(path))


def test_observation_column_out_of_range_is_reported():
    with pytest.raises(ValueError, match=r"<lines>:1: too few columns"):
        corpora.parse_conll(["a B O"], observation_columns=[0, 5])


def _only(monkeypatch, tmp_path, nltk_data=None):
    """Search only where the test says: NLTK_DATA (or none), HOME in tmp_path,
    NLTK's other default directories elsewhere in tmp_path, NLTK not loaded."""
    if nltk_data is None:
        monkeypatch.delenv("NLTK_DATA", raising=False)
    else:
        monkeypatch.setenv("NLTK_DATA", nltk_data)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    monkeypatch.delitem(sys.modules, "nltk.data", raising=False)
    monkeypatch.setattr(
        corpora,
        "_nltk_default_path",
        lambda: [str(tmp_path / "home" / "nltk_data"), str(tmp_path / "prefix" / "nltk_data")],
    )


def test_find_data_error_names_the_search_path(monkeypatch, tmp_path):
    _only(monkeypatch, tmp_path, "/nonexistent")
    with pytest.raises(FileNotFoundError) as error:
        corpora.conll2002("esp.train")
    message = str(error.value)
    assert "corpora/conll2002/esp.train not found" in message and "NLTK_DATA='/nonexistent'" in message
    assert str(tmp_path / "home" / "nltk_data") in message and "nltk.downloader conll2002" in message
    with pytest.raises(ValueError, match="split must be one of"):
        corpora.conll2002("deu.train")


def test_default_path_is_nltks_own():
    nltk_data = pytest.importorskip("nltk.data")
    defaults = corpora._nltk_default_path()
    # nltk.data.path is NLTK_DATA's directories, then these (nothing else is added in the tests).
    assert nltk_data.path[-len(defaults) :] == defaults


SPANISH = "El DA O\nAbogado NC B-PER\nGeneral AQ I-PER\n\nMadrid NP B-LOC\n"
# The Dutch layout: article markers directly before a sentence's first line.
DUTCH = (
    "-DOCSTART- -DOCSTART- O\nDe Art O\nMorgen N B-ORG\n\n-DOCSTART- -DOCSTART- O\nJan N B-PER\n"
    "zegt V O\n\nGent N B-LOC\n"
)


def _zipped_conll2002(root, files):
    """`root/corpora/conll2002.zip` as NLTK's downloader leaves it (members under `conll2002/`)."""
    (root / "corpora").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(root / "corpora" / "conll2002.zip", "w") as archive:
        archive.writestr("conll2002/", "")
        for name, data in files.items():
            archive.writestr(f"conll2002/{name}", data)
    return root


def test_zipped_corpus_is_read_in_place(monkeypatch, tmp_path):
    root = _zipped_conll2002(tmp_path / "data", {"esp.train": SPANISH, "ned.testa": DUTCH})
    _only(monkeypatch, tmp_path, str(root))
    path = corpora.find_data("corpora", "conll2002", "esp.train")
    assert path == str(root / "corpora" / "conll2002.zip" / "conll2002" / "esp.train")
    assert corpora.conll2002("esp.train") == corpora.parse_conll(SPANISH.splitlines())
    assert corpora.find_data("corpora", "conll2002") == str(root / "corpora" / "conll2002.zip" / "conll2002") + "/"
    dutch = corpora.conll2002("ned.testa")
    assert [s.words for s in dutch] == [("De", "Morgen"), ("Jan", "zegt"), ("Gent",)]
    assert dutch[1].labels == ("B-PER", "O") and dutch[0].tokens[1] == ("Morgen", "N")
    assert not list((root / "corpora").glob("conll2002/*"))  # nothing was unzipped
    with pytest.raises(FileNotFoundError, match=r"ned\.train not found"):
        corpora.conll2002("ned.train")


def test_zipped_files_keep_every_reader_error(monkeypatch, tmp_path):
    files = {
        "bad": "El DA O\nrey NC O\n\nMadrid NP\n",
        "latin": "El DA O\nEspaña NP B-LOC\n".encode("latin-1"),
        "bom": "\ufeffEl DA O\n".encode("utf-8"),
        "tpl": "U00:%x[0,0]\nX\n",
    }
    root = _zipped_conll2002(tmp_path / "data", files)
    _only(monkeypatch, tmp_path, str(root))
    inside = str(root / "corpora" / "conll2002.zip" / "conll2002")
    with pytest.raises(ValueError, match=rf"^{inside}/bad:4: expected 3 columns"):
        corpora.read_conll(corpora.find_data("corpora", "conll2002", "bad"))
    with pytest.raises(ValueError, match=rf"^{inside}/latin:2: byte 0xf1 at column 5 is not valid utf-8"):
        corpora.read_conll(f"{inside}/latin")
    assert corpora.read_conll(f"{inside}/latin", encoding="latin-1")[0].tokens[1] == ("España", "NP")
    assert corpora.read_conll(f"{inside}/bom")[0].tokens[0] == ("El", "DA")
    from lossfns.features import read_templates

    with pytest.raises(ValueError, match=rf"^{inside}/tpl:2:"):
        read_templates(f"{inside}/tpl")
    with pytest.raises(FileNotFoundError, match="has no member 'conll2002/none'"):
        corpora.read_conll(f"{inside}/none")


def test_default_directories_after_nltk_data(monkeypatch, tmp_path):
    home = tmp_path / "home" / "nltk_data" / "corpora" / "conll2002"
    home.mkdir(parents=True)
    (home / "esp.testa").write_text(SPANISH)
    _only(monkeypatch, tmp_path)
    assert corpora.find_data("corpora", "conll2002", "esp.testa") == str(home / "esp.testa")
    # NLTK_DATA comes first, then the defaults ...
    first = tmp_path / "first" / "corpora" / "conll2002"
    first.mkdir(parents=True)
    (first / "esp.testa").write_text("Gent NC B-LOC\n")
    _only(monkeypatch, tmp_path, str(tmp_path / "first"))
    assert corpora.conll2002("esp.testa")[0].words == ("Gent",)
    # ... but, as in NLTK, a plain file anywhere on the path is found before a zipped one.
    zipped = _zipped_conll2002(tmp_path / "zipped", {"esp.testa": "Gent NC B-LOC\n"})
    _only(monkeypatch, tmp_path, str(zipped))
    assert corpora.find_data("corpora", "conll2002", "esp.testa") == str(home / "esp.testa")


def test_user_additions_to_nltk_data_path_and_zip_roots(monkeypatch, tmp_path):
    _only(monkeypatch, tmp_path)
    with zipfile.ZipFile(tmp_path / "bundle.zip", "w") as archive:  # a search-path entry that is a zip file
        archive.writestr("corpora/conll2002/esp.testb", SPANISH)
    monkeypatch.setitem(sys.modules, "nltk.data", types.SimpleNamespace(path=[str(tmp_path / "bundle.zip")]))
    path = corpora.find_data("corpora", "conll2002", "esp.testb")
    assert path == str(tmp_path / "bundle.zip" / "corpora" / "conll2002" / "esp.testb")
    assert corpora.conll2002("esp.testb")[1].labels == ("B-LOC",)


# The shared data holds the Spanish splits only; Dutch is read from a synthetic zip above.
@pytest.mark.parametrize("split", ["esp.testb"])
def test_conll2002_matches_nltks_reader(split):
    corpus_or_fail(("corpora", "conll2002", split))
    reader_module = pytest.importorskip("nltk.corpus.reader")
    root = corpora.find_data("corpora", "conll2002")  # NLTK's readers open zipped roots too
    reader = reader_module.ConllChunkCorpusReader(root, [split], ("LOC", "PER", "ORG", "MISC"), encoding="utf-8")
    expected = [(tuple((w, p) for w, p, _ in s), tuple(n for _, _, n in s)) for s in reader.iob_sents(split)]
    ours = corpora.conll2002(split)
    assert [(s.tokens, s.labels) for s in ours] == [e for e in expected if e[0]]
    assert {label for s in ours for label in s.labels} <= {"O"} | {
        f"{p}-{t}" for p in "BI" for t in ("PER", "LOC", "ORG", "MISC")
    }


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
    with pytest.raises(ValueError) as error:  # noqa: PT011  (the message, led by a path, is checked below)
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
    with pytest.raises(ValueError) as error:  # noqa: PT011  (the message, led by a path, is checked below)
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


def test_zipped_treebank_through_nltk(monkeypatch, tmp_path):
    pytest.importorskip("nltk")
    (tmp_path / "data" / "corpora").mkdir(parents=True)
    with zipfile.ZipFile(tmp_path / "data" / "corpora" / "treebank.zip", "w") as archive:
        archive.writestr(
            "treebank/combined/wsj_0001.mrg",
            "( (S (NP-SBJ (NNP Pierre) (NNP Vinken)) (VP (VBD joined) (-NONE- *-1)) (. .)) )\n",
        )
    _only(monkeypatch, tmp_path, str(tmp_path / "data"))
    assert corpora.treebank() == [Sentence((("Pierre",), ("Vinken",), ("joined",), (".",)), ("NNP", "NNP", "VBD", "."))]


# ---------------------------------------------------------------------------
# Files read for labelling: every line kept
# ---------------------------------------------------------------------------


def test_column_file_keeps_lines_and_gold(tmp_path):
    path = _write(tmp_path, "in.conll", (b"-DOCSTART- -X- O\n\nEl DA O\nrey NC B-PER\n\n\nMadrid NP B-LOC\n"))
    checked = corpora.read_column_file(path, labelled=True)
    assert checked.lines == ("-DOCSTART- -X- O", "", "El DA O", "rey NC B-PER", "", "", "Madrid NP B-LOC")
    assert checked.sentences == (
        Sentence((("El", "DA"), ("rey", "NC")), ("O", "B-PER")),
        Sentence((("Madrid", "NP"),), ("B-LOC",)),
    )
    assert checked.rows == ((2, 3), (6,)) and checked.labelled and checked.source == path
    plain = corpora.read_column_file(path, labelled=False)
    assert plain.sentences[0] == Sentence((("El", "DA", "O"), ("rey", "NC", "B-PER")), ())
    assert not plain.labelled and plain.rows == checked.rows
    one = _write(tmp_path, "words.txt", b"El\nrey\n")  # a single column is fine without gold
    assert corpora.read_column_file(one, labelled=False).sentences[0].tokens == (("El",), ("rey",))
    with pytest.raises(ValueError, match=r"words\.txt:1: expected at least 2 columns"):
        corpora.read_column_file(one, labelled=True)
    with pytest.raises(ValueError, match=r"in\.conll:3: expected 3 columns"):
        corpora.read_column_file(_write(tmp_path, "in.conll", b"El DA O\n\nMadrid NP\n\n\n\n\n"), labelled=True)
