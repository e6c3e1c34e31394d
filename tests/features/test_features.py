"""Feature templates (CRF++/Wapiti syntax, errors with line numbers), the
named presets (against hand-written oracles such as the sklearn-crfsuite
tutorial's dict features), the observation index (min count, hashing) and
the padded / packed id arrays."""

import re
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lossfns.features import (
    FeatureIndex,
    TokenFeatures,
    observed_label_pairs,
    pad_batch,
    parse_templates,
    preset,
    read_templates,
)
from lossfns.features.index import pack
from lossfns.features.templates import wapiti_regex

# The sklearn-crfsuite tutorial's features, as it writes them (the oracle of the crfsuite_ner preset).
from benchmarks.tutorial_features import word2features as _tutorial_word2features

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


def test_regex_macros_and_upper_case_variants():
    # As in Wapiti, %X, %T, %M lower-case their result; their regexes still match case-sensitively.
    templates = parse_templates(
        'U1:%t[0,0,"^[A-Z]"]\nU2:%m[0,0,"[aeiou]+"]\nU3:%T[0,0,"^m"]\nU4:%X[0,0]\nU5:%M[0,0,"M.."]\nU6:%T[0,0,"^M"]'
    )
    assert templates(TOKENS).unigram[0] == ["U1:true", "U2:ua", "U3:false", "U4:juan", "U5:", "U6:false"]
    assert templates(TOKENS).unigram[3] == ["U1:true", "U2:a", "U3:false", "U4:madrid", "U5:mad", "U6:true"]


def _wapiti_match(pattern, text):
    """Wapiti's matcher (src/pattern.c: rex_match, rex_matchme, rex_matchit)
    interpreted directly, as the oracle of `wapiti_regex`: the first match's
    (start, length), or None."""
    classes = {
        "a": str.isalpha,
        "d": str.isdigit,
        "l": str.islower,
        "u": str.isupper,
        "w": str.isalnum,
        "s": str.isspace,
        "p": lambda c: c in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    }

    def one(atom, rest):
        if not rest:
            return False
        c = rest[0]
        if not c.isascii():  # the C locale's classes hold ASCII only
            return (
                atom == "."
                or (atom[0] != "\\" and atom == c)
                or (atom[0] == "\\" and atom[1] == c)
                or (atom[0] == "\\" and atom[1].lower() in classes and atom[1].isupper())
            )
        if atom == ".":
            return True
        if atom[0] == "\\":
            if atom[1].lower() in classes:
                return classes[atom[1].lower()](c) != atom[1].isupper()
            return atom[1] == c
        return atom == c

    def here(regex, rest):  # the length matched at the start of rest, or None
        if not regex:
            return 0
        if regex == "$":
            return 0 if not rest else None
        width = 2 if regex[0] == "\\" else 1
        atom, after = regex[:width], regex[width:]
        if after[:1] == "*":
            used = 0
            while True:
                tail = here(after[1:], rest[used:])
                if tail is not None:
                    return used + tail
                if not one(atom, rest[used:]):
                    return None
                used += 1
        if after[:1] == "?":
            if one(atom, rest):
                tail = here(after[1:], rest[1:])
                if tail is not None:
                    return 1 + tail
            return here(after[1:], rest)
        if one(atom, rest):
            tail = here(after, rest[1:])
            return None if tail is None else 1 + tail
        return None

    if pattern.startswith("^"):
        length = here(pattern[1:], text)
        return None if length is None else (0, length)
    for start in range(len(text) + 1):
        length = here(pattern, text[start:])
        if length is not None:
            return start, length
    return None


@given(
    st.lists(
        st.sampled_from(["a", "b", ".", "\\d", "\\u", "\\l", "\\p", "\\A", "\\W", "\\.", "-", "é"]),
        min_size=1,
        max_size=5,
    ),
    st.lists(st.sampled_from(["", "*", "?"]), min_size=5, max_size=5),
    st.booleans(),
    st.booleans(),
    st.text(alphabet="abAB1.-_ é", max_size=8),
)
def test_wapiti_regexes_match_as_wapitis_matcher(atoms, repeats, start, end, text):
    pattern = ("^" if start else "") + "".join(a + r for a, r in zip(atoms, repeats)) + ("$" if end else "")
    found = re.search(wapiti_regex(pattern), text, re.DOTALL)
    expected = _wapiti_match(pattern, text)
    assert (None if found is None else (found.start(), found.end() - found.start())) == expected, pattern


def test_wapiti_pattern_files_as_they_come():
    # The layout of Wapiti's own pattern files: repeated `U:` names, spaces, signs, its regexes,
    # comments anywhere, lower-case type letters, a constant `*` (bias and transitions).
    templates = parse_templates(
        """*
u:wrd L=%X[-1,0]   # the previous word, lower-cased
U:wrd X=%x[ 0,0]
*:Pre-2 X=%m[ 0,0,"^.?.?"]
*:Suf-2 X=%m[ 0,0,".?.?$"]
*:Caps? X=%t[ 0,0,"\\u"]
*:AllC? X=%t[ 0,0,"^\\u*$"]
b:Pos R=%x[+1,1]
""",
        dialect="wapiti",
    )
    assert templates.transitions and templates.dialect == "wapiti"
    features = templates(TOKENS)
    assert features.unigram[0] == [
        "*:",
        "u:wrd L=_b-1",
        "U:wrd X=Juan",
        "*:Pre-2 X=Ju",
        "*:Suf-2 X=an",
        "*:Caps? X=true",
        "*:AllC? X=false",
    ]
    assert features.pair[3] == ["*:Pre-2 X=Ma", "*:Suf-2 X=id", "*:Caps? X=true", "*:AllC? X=false", "b:Pos R=_B+1"]
    assert parse_templates("U:%x[0,0] # kept", dialect="python")(TOKENS[:1]).unigram == [["U:Juan # kept"]]
    with pytest.raises(ValueError, match=r"<templates>:1: bad regex '\*a'.*nothing to repeat"):
        parse_templates('U:%t[0,0,"*a"]', dialect="wapiti")
    with pytest.raises(ValueError, match="dialect must be one of"):
        parse_templates("U:%x[0,0]", dialect="crf++")


CRFPP_NER = """# Unigram
U00:%x[-2,0]
U01:%x[-1,0]
U02:%x[0,0]
U03:%x[1,0]
U04:%x[2,0]
U05:%x[-1,0]/%x[0,0]
U06:%x[0,0]/%x[1,0]

U10:%x[-2,1]
U11:%x[-1,1]
U12:%x[0,1]
U13:%x[1,1]
U14:%x[2,1]
U15:%x[-2,1]/%x[-1,1]
U16:%x[-1,1]/%x[0,1]
U17:%x[0,1]/%x[1,1]
U18:%x[1,1]/%x[2,1]

U20:%x[-2,1]/%x[-1,1]/%x[0,1]
U21:%x[-1,1]/%x[0,1]/%x[1,1]
U22:%x[0,1]/%x[1,1]/%x[2,1]

# Bigram
B
"""


def test_the_standard_crfpp_pattern():
    templates = parse_templates(CRFPP_NER)
    assert len(templates.unigram) == 19 and templates.pair == () and templates.transitions
    assert parse_templates(CRFPP_NER, dialect="wapiti") == templates._replace(dialect="wapiti")
    features = templates(TOKENS)[1]
    assert templates(TOKENS).unigram[1][:7] == [
        "U00:_B-1",
        "U01:Juan",
        "U02:vive",
        "U03:en",
        "U04:Madrid",
        "U05:Juan/vive",
        "U06:vive/en",
    ]
    assert templates(TOKENS).unigram[1][-3:] == ["U20:_B-1/NP/VMI", "U21:NP/VMI/SP", "U22:VMI/SP/NP"]
    assert features == [[] for _ in TOKENS]


def test_absolute_and_indirect_rows():
    tokens = (("a", "1"), ("b", "-1"), ("c", "0"))
    templates = parse_templates("U1:%x[@1,0]/%x[@-1,0]\nU2:%x[*1,0]")
    assert templates(tokens).unigram == [["U1:a/c", "U2:b"], ["U1:a/c", "U2:a"], ["U1:a/c", "U2:c"]]
    with pytest.raises(ValueError, match=r"reads a row offset from column 0, but token 0 has 'a'"):
        parse_templates("U:%x[*0,0]")(tokens)


def test_constant_template_and_no_transitions():
    templates = parse_templates("U\nUbias\nu%x[0,1]")
    assert not templates.transitions and templates.pair == ()
    assert templates(TOKENS[:1]).unigram == [["U:", "Ubias:", "uNP:"]]
    # A constant tested with the label pair is the transitions (B01, a bare *, b).
    for text in ("B01", "b", "*:bias", "B01:x"):
        assert parse_templates(text).transitions and parse_templates(text).pair == ()
    assert [t.name for t in parse_templates("*:bias").unigram] == ["*"]


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("U00:%x[0,0]\nU01:%x[0]", 2, "malformed macro"),
        ("U00:%x[0,0]\n\n%x[0,0]", 3, "must start with U, B or"),
        ("U00:%x[0,0]\nU00:%x[1,0]", 2, "'U00:' before the first macro is already used on line 1"),
        ("*1:%x[0,0]\nB:x\nB1:%x[1,0]\nU1:%x[0,1]\n*1:%x[1,1]", 5, "already used on line 1"),
        ('U00:%t[0,0,"("]', 1, "bad regex"),
        ("U00:%t[0,0]", 1, "needs a regex"),
        ('U00:%x[0,0,"a"]', 1, "takes no regex"),
        ("U:%q[0,0]", 1, "malformed macro"),
    ],
)
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
    with pytest.raises(ValueError, match=r"template U9 .*reads column 2"):
        parse_templates("U9:%x[0,2]")(TOKENS)


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
    assert {
        "suffix1=.",
        "suffix2=r.",
        "suffix3=Sr.",
        "first_upper",
        "first_alphanumeric",
        "capitalised_with_dot",
    } == set(s2.unigram[0]) - {"word=Sr."}
    assert "hyphen" in s2.unigram[1] and "all_capitals" not in s2.unigram[1]
    assert {"-1:word=_B-1", "+1:word=Lopez-Garcia", "+1:hyphen"} <= set(s3.unigram[0])


def test_lavergne_pos_preset():
    features = preset("lavergne_pos")((("The",), ("U.S.",), ("rose",)))
    first = set(features.unigram[0])
    assert {
        "word=The",
        "lower=the",
        "shape=Xx",
        "prefix1=T",
        "prefix3=The",
        "suffix2=he",
        "-2:word=_B-2",
        "-1:word=_B-1",
        "+1:word=U.S.",
        "+2:word=rose",
        "-1+0:words=_B-1|The",
        "+0+1:words=The|U.S.",
    } <= first
    assert "prefix4=The" not in first
    assert "shape=X.X." in features.unigram[1]
    with pytest.raises(ValueError, match="unknown feature preset 'nope'"):
        preset("nope")

    last = features.unigram[2]  # the right edge, and the full, ordered list of a token
    assert last == [
        "word=rose",
        "lower=rose",
        "shape=x",
        *[f"prefix{n}=rose"[: len("prefix1=") + n] for n in range(1, 5)],
        *["suffix1=e", "suffix2=se", "suffix3=ose", "suffix4=rose"],
        *["-2:word=The", "-1:word=U.S.", "+1:word=_B+1", "+2:word=_B+2"],
        *["-2-1:words=The|U.S.", "-1+0:words=U.S.|rose", "+0+1:words=rose|_B+1", "+1+2:words=_B+1|_B+2"],
    ]
    assert preset("lavergne_pos")(()).unigram == []


def test_index_corpus_is_build_index_then_encode_with_the_collector_paused():
    """`index_corpus` gives `build_index` and `encode`'s ids, pauses Python's
    cycle collector only while it runs (restored after an error too), and
    `FeatureIndex.encode` drops unknown strings whether or not a sentence has any."""
    import gc

    from lossfns import corpora, features

    sentences = [
        corpora.Sentence((("El",), ("rey",)), ("O", "B-PER")),
        corpora.Sentence((("rey",), ("Ana",), ("vive",)), ("B-PER", "B-PER", "O")),
    ]
    extractor = features.extractor("altun_s2")
    index, encoded, ids = features.index_corpus(extractor, sentences, ("B-PER", "O"), min_count=2)
    extracted = [extractor(s.tokens) for s in sentences]
    assert index == features.build_index(extracted, min_count=2)
    assert encoded == [index.encode(f) for f in extracted] == features.encode(index, extractor, sentences)
    assert ids == [[1, 0], [0, 0, 1]]
    known = set(index.unigram)
    for sentence, found in zip(extracted, encoded):
        for names, token_ids in zip(sentence.unigram, found[0]):
            assert token_ids == [index.unigram[name] for name in names if name in known]
    assert gc.isenabled()
    gc.disable()
    try:
        features.index_corpus(extractor, sentences, ("O",))
        assert not gc.isenabled()
    finally:
        gc.enable()

    def broken(tokens):
        assert not gc.isenabled()
        raise RuntimeError("extractor failed")

    with pytest.raises(RuntimeError, match="extractor failed"):
        features.index_corpus(broken, sentences, ("O",))
    assert gc.isenabled()


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
    encoded = [
        ([[int(x) for x in rng.integers(0, 9, size=rng.integers(1, 4))] for _ in range(n)], [[] for _ in range(n)])
        for n in lengths
    ]
    labels = [[int(x) for x in rng.integers(0, 4, size=n)] for n in lengths]
    packed = pack(encoded, labels, num_buckets=2)
    assert sorted(np.concatenate(packed.members).tolist()) == list(range(len(lengths)))
    for positions, bucket_lengths, bucket_labels, members in zip(
        packed.positions, packed.lengths, packed.labels, packed.members
    ):
        for row, sentence in enumerate(members):
            n = lengths[sentence]
            assert bucket_lengths[row] == n
            assert np.all(positions[row, n:] == -1) and np.all(bucket_labels[row, n:] == -1)
            np.testing.assert_array_equal(bucket_labels[row, :n], labels[sentence])
            for t in range(n):
                ids = packed.unigram_ids[positions[row, t]]
                assert ids[ids >= 0].tolist() == encoded[sentence][0][t]


def _reference_features(templates, tokens):
    """Each template at each position, literally as CRF++ and Wapiti define it
    (the oracle of the corpus-wide expansion)."""

    def cell(macro, t):
        if macro.mode == "@":
            i = macro.row + len(tokens) if macro.row < 0 else macro.row - 1
        elif macro.mode == "*":
            i = t + int(tokens[t][macro.row])
        else:
            i = t + macro.row
        value = f"_B{i}" if i < 0 else f"_B+{i - len(tokens) + 1}" if i >= len(tokens) else tokens[i][macro.column]
        if macro.kind in "tT":
            value = "true" if macro.pattern.search(value) else "false"
        elif macro.kind in "mM":
            found = macro.pattern.search(value)
            value = found.group(0) if found else ""
        return value.lower() if macro.kind.isupper() else value

    expand = lambda template, t: "".join(p if isinstance(p, str) else cell(p, t) for p in template.parts)
    return TokenFeatures(
        [[expand(u, t) for u in templates.unigram] for t in range(len(tokens))],
        [[expand(p, t) for p in templates.pair] for t in range(len(tokens))],
    )


CORPUS_PATTERN = r"""
U00:%x[-3,0]
U01:%x[0,0]/%x[1,1]/%x[-1,0]
U02:%X[2,0]
U03:%t[0,0,"^\u"]
U04:%T[-1,0,"^\u"]/%m[1,0,"..$"]
U05:%M[0,0,"^\u\l"]
U06:%x[@1,0]/%x[@-2,1]
U07:%x[*2,0]
U08:lit%x[0,1]mid%x[0,1]end
U09:bias
*10:%x[1,1]
B11:%x[0,0]/%x[-1,0]
B
"""


def test_templates_expand_over_a_corpus_as_sentence_by_sentence():
    """`expand_templates` / `apply_templates_to_corpus` (one pass per template
    over the whole corpus, strings built once per distinct cells) give each
    token the strings of the literal definition, across sentence boundaries,
    for empty and one-token sentences, every macro kind."""
    from lossfns.features.templates import apply_templates_to_corpus, expand_templates

    rng = np.random.default_rng(0)
    words = ["Juan", "vive", "en", "Madrid", "EFE", "de", "Ana", "la", "25", ".", "Mayo"]
    sentences = []
    for length in [0, 1, 2, 5, 0, 3, 1, 8, 4, 0]:
        offsets = rng.integers(-1, 2, size=length)
        offsets = [min(max(int(o), -t), length - 1 - t) for t, o in enumerate(offsets)]  # rows inside the sentence
        sentences.append(
            tuple((str(rng.choice(words)), str(rng.choice(["NP", "VMI", "SP", "Z"])), str(o)) for o in offsets)
        )
    for dialect in ("wapiti", "python"):
        text = CORPUS_PATTERN if dialect == "wapiti" else CORPUS_PATTERN.replace("\\u", "[A-Z]").replace("\\l", "[a-z]")
        templates = parse_templates(text, dialect=dialect)
        expected = [_reference_features(templates, tokens) for tokens in sentences]
        assert apply_templates_to_corpus(templates, sentences) == expected
        assert [templates(tokens) for tokens in sentences] == expected
        unigram, pair = expand_templates(templates, sentences)
        assert [list(token) for token in zip(*(column.tolist() for column in unigram))] == [
            token for features in expected for token in features.unigram
        ]
        assert [list(token) for token in zip(*(column.tolist() for column in pair))] == [
            token for features in expected for token in features.pair
        ]
    unigram, pair = expand_templates(templates, [])
    assert [column.codes.size for column in unigram + pair] == [0] * (len(unigram) + len(pair))
    with pytest.raises(ValueError, match=r"template U9 .*reads column 2"):
        apply_templates_to_corpus(parse_templates("U9:%x[0,2]"), [TOKENS[:1], TOKENS])


def test_pack_sentences_is_pack_of_encode():
    """`pack_sentences` (templates straight to the token stack) gives the
    arrays of `pack(encode(...))`, unknown strings dropped, labels and
    buckets alike; other extractors and hashed indexes take that path."""
    from lossfns import corpora, features

    rng = np.random.default_rng(1)
    words = ["Juan", "vive", "en", "Madrid", "EFE", "de", "Ana", "la"]
    make = lambda count: [
        corpora.Sentence(
            tuple((str(rng.choice(words)), str(rng.choice(["NP", "SP"])), "0") for _ in range(n)),
            tuple(str(rng.choice(["O", "B-PER"])) for _ in range(n)),
        )
        for n in rng.integers(1, 9, size=count)
    ]
    train, test = make(30), make(25)
    for extractor in (parse_templates(CORPUS_PATTERN, dialect="wapiti"), preset("crfsuite_ner")):
        indexes = [features.build_index(features.extract(extractor, train)), FeatureIndex.hashed_index(64, 16)]
        for index in indexes:
            labels = features.label_ids(test, ("O", "B-PER"))
            for ids, buckets in ((None, None), (labels, 3)):
                expected = pack(features.encode(index, extractor, test), ids, buckets)
                packed = features.pack_sentences(index, extractor, test, ids, buckets)
                assert packed.unigram_ids.dtype == expected.unigram_ids.dtype
                for got, want in zip(packed, expected):
                    if isinstance(want, tuple):
                        assert len(got) == len(want) and all(map(np.array_equal, got, want))
                    elif want is None:
                        assert got is None
                    else:
                        np.testing.assert_array_equal(got, want)
                        assert got.shape == want.shape
