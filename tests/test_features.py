"""Feature templates (CRF++/Wapiti syntax, errors with line numbers), the
named presets (against hand-written oracles such as the sklearn-crfsuite
tutorial's dict features), the observation index (min count, hashing) and
the padded / packed id arrays."""

import zlib

import numpy as np
import pytest

from lossfns.features import (FeatureIndex, TokenFeatures, observed_label_pairs, pad_batch, parse_templates, preset,
                              read_templates)
from lossfns.features.index import pack

TOKENS = (("Juan", "NP"), ("vive", "VMI"), ("en", "SP"), ("Madrid", "NP"))


def test_templates_expand_like_crfpp():
    templates = parse_templates("""# comment
U00:%x[-2,0]
U01:%x[0,0]/%x[0,1]
U02:%x[1,0]

B
B10:%x[0,1]
*20:%x[-1,1]
""")
    assert templates.transitions
    assert [t.name for t in templates.unigram] == ["U00", "U01", "U02", "*20"]
    assert [t.name for t in templates.pair] == ["B10", "*20"]
    features = templates(TOKENS)
    assert features.unigram[0] == ["U00:_B-2", "U01:Juan/NP", "U02:vive", "*20:_B-1"]
    assert features.unigram[3] == ["U00:vive", "U01:Madrid/NP", "U02:_B+1", "*20:SP"]
    assert features.pair[1] == ["B10:VMI", "*20:NP"]


def test_regex_macros_and_case_insensitive_variants():
    templates = parse_templates('U1:%t[0,0,"^[A-Z]"]\nU2:%m[0,0,"[aeiou]+"]\nU3:%T[0,0,"^m"]\nU4:%X[0,0]\n'
                                'U5:%M[0,0,"D"]')
    assert templates(TOKENS).unigram[0] == ["U1:true", "U2:ua", "U3:false", "U4:juan", "U5:"]
    assert templates(TOKENS).unigram[3] == ["U1:true", "U2:a", "U3:true", "U4:madrid", "U5:d"]


def test_constant_template_and_no_transitions():
    templates = parse_templates("U\nUbias")
    assert not templates.transitions and templates.pair == ()
    assert templates(TOKENS[:1]).unigram == [["U:", "Ubias:"]]


@pytest.mark.parametrize("text, line, message", [
    ("U00:%x[0,0]\nU01:%x[0]", 2, "malformed macro"),
    ("U00:%x[0,0]\n\n%x[0,0]", 3, "must start with U, B or"),
    ("U00 %x[0,0]", 1, "expected 'NAME:BODY'"),
    ("U00:%x[0,0]\nU00:%x[1,0]", 2, "already used on line 1"),
    ('U00:%t[0,0,"("]', 1, "bad regex"),
    ("U00:%t[0,0]", 1, "needs a regex"),
    ('U00:%x[0,0,"a"]', 1, "takes no regex"),
    ("U0 0:%x[0,0]", 1, "cannot contain spaces"),
])
def test_template_syntax_errors_name_the_line(text, line, message):
    with pytest.raises(ValueError, match=rf"<templates>:{line}: .*{message}"):
        parse_templates(text)


def test_template_file_errors_name_the_file(tmp_path):
    path = tmp_path / "patterns.txt"
    path.write_text("U00:%x[0,0]\nX\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"patterns\.txt:2:"):
        read_templates(str(path))
    path.write_text("U00:%x[0,0]\n", encoding="utf-8")
    assert read_templates(str(path))(TOKENS[:1]).unigram == [["U00:Juan"]]


def test_template_column_out_of_range_at_application():
    with pytest.raises(ValueError, match="template U9 .*reads column 2"):
        parse_templates("U9:%x[0,2]")(TOKENS)


def _tutorial_word2features(sent, i):
    """The sklearn-crfsuite tutorial's features, as it writes them (the oracle)."""
    word, postag = sent[i][0], sent[i][1]
    features = {"bias": 1.0, "word.lower()": word.lower(), "word[-3:]": word[-3:], "word[-2:]": word[-2:],
                "word.isupper()": word.isupper(), "word.istitle()": word.istitle(), "word.isdigit()": word.isdigit(),
                "postag": postag, "postag[:2]": postag[:2]}
    if i > 0:
        word1, postag1 = sent[i - 1][0], sent[i - 1][1]
        features.update({"-1:word.lower()": word1.lower(), "-1:word.istitle()": word1.istitle(),
                         "-1:word.isupper()": word1.isupper(), "-1:postag": postag1, "-1:postag[:2]": postag1[:2]})
    else:
        features["BOS"] = True
    if i < len(sent) - 1:
        word1, postag1 = sent[i + 1][0], sent[i + 1][1]
        features.update({"+1:word.lower()": word1.lower(), "+1:word.istitle()": word1.istitle(),
                         "+1:word.isupper()": word1.isupper(), "+1:postag": postag1, "+1:postag[:2]": postag1[:2]})
    else:
        features["EOS"] = True
    return features


def _as_binary(features):
    """CRFsuite semantics: a string value is the attribute `name=value` with
    weight 1; a number is the attribute `name` with that weight (0 = absent)."""
    out = set()
    for name, value in features.items():
        if isinstance(value, str):
            out.add(f"{name}={value}")
        elif value:
            out.add(name)
    return out


@pytest.mark.parametrize("tokens", [TOKENS, (("EFE", "NC"),), (("25", "Z"), ("DE", "SP"), ("Mayo", "NC"))])
def test_crfsuite_ner_preset_matches_the_tutorial(tokens):
    features = preset("crfsuite_ner")(tokens)
    assert features.pair == [[] for _ in tokens]
    for i, token_features in enumerate(features.unigram):
        assert set(token_features) == _as_binary(_tutorial_word2features(tokens, i))
        assert len(token_features) == len(set(token_features))


def test_altun_presets_nest_and_spell():
    s1, s2, s3 = (preset(name)((("Sr.", "X"), ("Lopez-Garcia", "X"))) for name in ("altun_s1", "altun_s2", "altun_s3"))
    assert s1.unigram[0] == ["word=Sr."]
    for t in range(2):
        assert set(s1.unigram[t]) < set(s2.unigram[t]) < set(s3.unigram[t])
    assert {"suffix1=.", "suffix2=r.", "suffix3=Sr.", "first_upper", "first_alphanumeric",
            "capitalised_with_dot"} == set(s2.unigram[0]) - {"word=Sr."}
    assert "hyphen" in s2.unigram[1] and "all_capitals" not in s2.unigram[1]
    assert {"-1:word=_B-1", "+1:word=Lopez-Garcia", "+1:hyphen"} <= set(s3.unigram[0])


def test_lavergne_pos_preset():
    features = preset("lavergne_pos")((("The",), ("U.S.",), ("rose",)))
    first = set(features.unigram[0])
    assert {"word=The", "lower=the", "shape=Xx", "prefix1=T", "prefix3=The", "suffix2=he", "-2:word=_B-2",
            "-1:word=_B-1", "+1:word=U.S.", "+2:word=rose", "-1+0:words=_B-1|The", "+0+1:words=The|U.S."} <= first
    assert "prefix4=The" not in first
    assert "shape=X.X." in features.unigram[1]
    with pytest.raises(ValueError, match="unknown feature preset 'nope'"):
        preset("nope")


def test_index_min_count_and_encoding():
    sentences = [TokenFeatures([["a", "b"], ["a", "c"]], [["p"], ["q"]]), TokenFeatures([["a", "b"]], [["p"]])]
    index = FeatureIndex.build(sentences, min_count=2)
    assert index.unigram == {"a": 0, "b": 1} and index.pair == {"p": 0}
    assert (index.num_unigram, index.num_pair) == (2, 1)
    assert index.encode(TokenFeatures([["c", "b", "a"]], [["q", "p"]])) == ([[1, 0]], [[0]])
    everything = FeatureIndex.build(sentences)
    assert everything.unigram == {"a": 0, "b": 1, "c": 2}
    with pytest.raises(ValueError, match="min_count"):
        FeatureIndex.build(sentences, min_count=0)


def test_hashed_index_is_stable_and_in_range():
    index = FeatureIndex.hashed_index(1000, 10)
    unigram, pair = index.encode(TokenFeatures([["word=a", "word=b", "word=a"]], [["x"]]))
    assert unigram == [sorted({zlib.crc32(b"word=a") % 1000, zlib.crc32(b"word=b") % 1000})]
    assert pair == [[zlib.crc32(b"x") % 10]]
    with pytest.raises(ValueError, match="num_unigram"):
        FeatureIndex.hashed_index(0)


def test_pad_batch_and_observed_pairs():
    encoded = [([[0, 2], [1]], [[], []]), ([[2]], [[]])]
    batch = pad_batch(encoded, [[1, 0], [2]], max_length=3)
    np.testing.assert_array_equal(batch.unigram_ids, [[[0, 2], [1, -1], [-1, -1]], [[2, -1], [-1, -1], [-1, -1]]])
    assert batch.pair_ids.shape == (2, 3, 0)
    np.testing.assert_array_equal(batch.lengths, [2, 1])
    np.testing.assert_array_equal(batch.labels, [[1, 0, -1], [2, -1, -1]])
    seen = observed_label_pairs([batch], num_features=3, num_labels=3)
    expected = np.zeros((3, 3), bool)
    for feature, label in [(0, 1), (2, 1), (1, 0), (2, 2)]:
        expected[feature, label] = True
    np.testing.assert_array_equal(seen, expected)
    with pytest.raises(ValueError, match="max_length must be >= the longest"):
        pad_batch(encoded, max_length=1)
    with pytest.raises(ValueError, match=r"labels\[1\] has 2 labels"):
        pad_batch(encoded, [[1, 0], [2, 2]])


def test_pack_points_every_token_to_its_row():
    rng = np.random.default_rng(0)
    lengths = [3, 1, 7, 2, 5]
    encoded = [([[int(x) for x in rng.integers(0, 9, size=rng.integers(1, 4))] for _ in range(n)], [[] for _ in range(n)])
               for n in lengths]
    labels = [[int(x) for x in rng.integers(0, 4, size=n)] for n in lengths]
    packed = pack(encoded, labels, num_buckets=2)
    assert sorted(np.concatenate(packed.members).tolist()) == list(range(len(lengths)))
    for positions, bucket_lengths, bucket_labels, members in zip(packed.positions, packed.lengths, packed.labels,
                                                                 packed.members):
        for row, sentence in enumerate(members):
            n = lengths[sentence]
            assert bucket_lengths[row] == n
            assert np.all(positions[row, n:] == -1) and np.all(bucket_labels[row, n:] == -1)
            np.testing.assert_array_equal(bucket_labels[row, :n], labels[sentence])
            for t in range(n):
                ids = packed.unigram_ids[positions[row, t]]
                assert ids[ids >= 0].tolist() == encoded[sentence][0][t]
