"""Feature dicts (`lossfns.features.dicts`): python-crfsuite's flattening
rules checked against python-crfsuite itself (`ItemSequence`, and the
marginals of a trained CRFsuite model, which see duplicates and real
values), the vectorised corpus path against the per-token one, the index,
ids and packed arrays, and the errors python-crfsuite does not give."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lossfns.features import FeatureIndex, dicts, pack
from lossfns.lattices import chain
from lossfns.lattices.chain import FactoredPotentials
from lossfns.models import LinearChainModel

pycrfsuite = pytest.importorskip("pycrfsuite")

ITEMS = [
    {"bias": 1.0, "word.lower()": "juan", "word.istitle()": True, "word.isdigit()": False, "count": 3, "f": 0.25},
    {"w": "vive", "nested": {"a": 1, "b": "x", "deeper": {"q": "w"}}, "list": ["u", "v"], "set": {"k", "j"}},
    ["plain", "strings"],
    {b"bytes": b"value", "np": np.float32(1.5), "ni": np.int64(2), "empty": ""},
    {},
]


def _crfsuite(item):
    return pycrfsuite.ItemSequence([item]).items()[0]


@pytest.mark.parametrize("item", ITEMS)
def test_flatten_is_python_crfsuites(item):
    assert dict(dicts.flatten(item)) == pytest.approx(_crfsuite(item))
    assert len(dicts.flatten(item)) == len(_crfsuite(item))  # no duplicates in these


scalars = st.one_of(
    st.sampled_from(["a", "b", "a:b", ""]),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(-2, 2, allow_nan=False).map(lambda x: round(x, 3)),
)
keys = st.sampled_from(["k", "w", "a", "pos", "x:y"])
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.dictionaries(keys, inner, max_size=3), st.lists(st.sampled_from(["p", "q"]), max_size=2)
    ),
    max_leaves=5,
)
items = st.dictionaries(keys, values, max_size=4)


@given(st.lists(st.lists(items, min_size=1, max_size=3), min_size=1, max_size=3))
def test_random_dicts_read_as_python_crfsuite_and_both_paths_agree(X):
    corpus = dicts.flatten_corpus(X)
    offsets = np.concatenate([[0], np.cumsum(corpus.token_counts)])
    tokens = [item for sentence in X for item in sentence]
    for n, item in enumerate(tokens):
        ours = [
            (corpus.names[a], v)
            for a, v in zip(corpus.attributes[offsets[n] : offsets[n + 1]], corpus.values[offsets[n] : offsets[n + 1]])
        ]
        assert sorted(ours) == sorted(dicts.flatten(item))
        summed = {}
        for name, value in ours:  # python-crfsuite's items() keeps the last of a repeated name
            summed[name] = value
        assert summed == pytest.approx(_crfsuite(item))
    np.testing.assert_array_equal(corpus.sentence_lengths, [len(s) for s in X])
    assert len(set(corpus.names)) == len(corpus.names)


def test_vectorised_and_per_token_paths_give_one_corpus():
    X = [[{"w": "a", "n": 2, "t": True}, {"w": "b", "n": 0.5}], [{"w": "a", "t": False}]]
    fast = dicts.flatten_corpus(X)
    slow = dicts._flatten_each([item for s in X for item in s], fast.sentence_lengths)
    assert [fast.names[a] for a in fast.attributes] == [slow.names[a] for a in slow.attributes]
    np.testing.assert_array_equal(fast.values, slow.values)
    np.testing.assert_array_equal(fast.token_counts, slow.token_counts)
    # A number under key "a:b" and the string "b" under key "a" are one CRFsuite attribute "a:b".
    clash = dicts.flatten_corpus([[{"a:b": 2.0}, {"a": "b"}]])
    assert clash.names == ["a:b"] and clash.attributes.tolist() == [0, 0] and clash.values.tolist() == [2.0, 1.0]


@pytest.fixture(scope="module")
def crfsuite_model(tmp_path_factory):
    """A small CRFsuite model trained on real-valued features, with its weights."""
    rng = np.random.default_rng(0)
    X, y = [], []
    for _ in range(30):
        n = int(rng.integers(1, 5))
        X.append(
            [
                {
                    "w": str(rng.choice(["a", "b", "c"])),
                    "x": float(rng.normal()),
                    "p": ["s", "t"][: rng.integers(3)],
                    "n": {"d": float(rng.normal())},
                }
                for _ in range(n)
            ]
        )
        y.append([str(rng.choice(["A", "B", "C"])) for _ in range(n)])
    trainer = pycrfsuite.Trainer(verbose=False)
    for xseq, yseq in zip(X, y):
        trainer.append(xseq, yseq)
    trainer.set_params({"c2": 0.1, "max_iterations": 30, "feature.possible_transitions": True})
    path = str(tmp_path_factory.mktemp("crfsuite") / "model.crfsuite")
    trainer.train(path)
    tagger = pycrfsuite.Tagger()
    tagger.open(path)
    return tagger


def test_scores_match_a_crfsuite_model_with_duplicates_and_values(crfsuite_model):
    info = crfsuite_model.info()
    labels = crfsuite_model.labels()
    names = sorted({attribute for attribute, _ in info.state_features})
    index = FeatureIndex({name: i for i, name in enumerate(names)}, {}, len(names), 0)
    emission = np.zeros((len(names), len(labels)))
    for (attribute, label), weight in info.state_features.items():
        emission[index.unigram[attribute], labels.index(label)] = weight
    transitions = np.zeros((len(labels), len(labels)))
    for (first, second), weight in info.transitions.items():
        transitions[labels.index(first), labels.index(second)] = weight
    model = LinearChainModel(
        jnp.asarray(emission),
        jnp.asarray(transitions),
        jnp.zeros(len(labels)),
        jnp.zeros((0, len(labels), len(labels))),
    )
    # Repeated names add up in CRFsuite: a list with "s" twice, and "n:d" written two ways.
    xseq = [
        {"w": "b", "x": -1.25, "p": ["s", "s"], "n": {"d": 0.5}, "n:d": 2.0},
        {"w": "a", "x": 3.0, "p": ["t"], "n": {"d": -0.75}},
        {"w": "zzz", "x": 0.5, "unseen": 1.0},
    ]
    crfsuite_model.set(xseq)
    expected = np.array([[crfsuite_model.marginal(label, t) for label in labels] for t in range(len(xseq))])
    batch = pack([index.encode(dicts.item_features(xseq))], num_buckets=1)
    ids, values = dicts.flatten_corpus([xseq]).token_arrays(index)
    np.testing.assert_array_equal(ids, batch.unigram_ids)
    np.testing.assert_allclose(values, batch.unigram_values)
    potentials = model(ids[None], unigram_values=values[None])
    ours = chain.marginals(FactoredPotentials(potentials.unary, potentials.transitions, potentials.start))
    np.testing.assert_allclose(np.asarray(ours.unary)[0], expected, atol=1e-6)


def test_index_encode_and_pack():
    X = [[{"w": "a", "v": 2.0}, {"w": "b"}], [{"w": "a", "v": 0.5, "new": 1}]]
    corpus = dicts.flatten_corpus(X)
    index = corpus.index(min_count=2)
    assert index.unigram == {"w:a": 0, "v": 1} and index.num_pair == 0
    assert corpus.index().num_unigram == 4
    np.testing.assert_array_equal(corpus.encode(index), [0, 1, -1, 0, 1, -1])
    packed = corpus.pack(index, labels=[[0, 1], [1]], num_buckets=1)
    rows = {tuple(zip(packed.unigram_ids[n].tolist(), packed.unigram_values[n].tolist())) for n in range(3)}
    assert rows == {((0, 1.0), (1, 2.0)), ((-1, 0.0), (-1, 0.0)), ((0, 1.0), (1, 0.5))}
    assert corpus.pack_rows(index, [[0, 1], [1]]).starts is not None
    binary = dicts.flatten_corpus([[{"w": "a", "t": True}]])
    assert binary.pack(binary.index()).unigram_values is None  # all 1: the binary fast path
    hashed = FeatureIndex.hashed_index(7)
    assert corpus.encode(hashed).tolist() == [
        hashed.encode(dicts.item_features(s))[0][t][f] for s in X for t in range(len(s)) for f in range(len(s[t]))
    ]


@pytest.mark.parametrize(
    "X, error, message",
    [
        ([["word", "rey"]], TypeError, r"X\[0\]\[0\]: a token's features must be a dict.*str 'word'"),
        ([[{"w": None}]], TypeError, r"X\[0\]\[0\]\['w'\]: a feature value must be .* got NoneType"),
        ([[{"w": "a"}, {"x": float("nan")}]], ValueError, r"X\[0\]\[1\]\['x'\] = nan: feature values must be finite"),
        ([[{"w": "a"}], [{1: "a"}]], TypeError, r"X\[1\]\[0\]: a key must be a string, got int"),
        ([[{"l": ["a", 2]}]], TypeError, r"X\[0\]\[0\]\['l'\]: a list element must be a string, got int"),
        ([{"w": "a"}], TypeError, r"X\[0\] must be a list of token feature dicts, got dict"),
        ("abc", TypeError, r"X must be a list of token feature dicts, got str"),
    ],
)
def test_bad_feature_dicts_are_named(X, error, message):
    with pytest.raises(error, match=message):
        dicts.flatten_corpus(X)
