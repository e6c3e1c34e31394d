"""CRFsuite model files (`lossfns.crfsuite_model`) against python-crfsuite:
a model pycrfsuite trains reads back as its `Tagger.info()` reports it and
writes back byte for byte; a lossfns Tagger built from it labels as
pycrfsuite's Tagger does, with the same marginals; files lossfns writes,
of its own models too, open and tag the same in pycrfsuite; damaged files
and non-files are refused with a `ModelFileError` naming the file."""

import os
import random
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import crfsuite_model, crfsuite_tagger, model_file
from lossfns.checkpoint import ModelFileError
from lossfns.features import in_corpus_order
from lossfns.features.dicts import flatten, flatten_corpus
from lossfns.features.index import FeatureIndex
from lossfns.models import LinearChainModel, packed
from lossfns.tagger import Tagger

pycrfsuite = pytest.importorskip("pycrfsuite")

PLACES, NAMES = ["Paris", "Lyon", "Madrid", "Oslo"], ["Ana", "Bob", "Ivo"]
WORDS = ["the", "a", "went", "to", "saw", "in", "big", "old", "city", "with", "and"]


def sentences(seed: int, count: int) -> tuple[list, list]:
    """`(X, y)`: `count` toy NER sentences as sklearn-crfsuite's feature
    dicts (strings, numbers, bools, a nested dict, a list: every kind of
    attribute python-crfsuite builds) and their labels."""
    rng = random.Random(seed)
    X, y = [], []
    for _ in range(count):
        words, labels = [], []
        while len(words) < rng.randrange(3, 10):
            kind = rng.random()
            if kind < 0.2:
                words += ["New", rng.choice(PLACES)] if rng.random() < 0.3 else [rng.choice(PLACES)]
                labels += ["B-LOC", "I-LOC"][: len(words) - len(labels)]
            elif kind < 0.35:
                words.append(rng.choice(NAMES))
                labels.append("B-PER")
            else:
                words.append(rng.choice(WORDS) if rng.random() < 0.9 else "zz" + str(rng.randrange(9)))
                labels.append("O")
        X.append([token_features(words, t) for t in range(len(words))])
        y.append(labels)
    return X, y


def token_features(words: list, t: int) -> dict:
    word = words[t]
    return {
        "bias": 1.0,
        "word.lower()": word.lower(),
        "word[-2:]": word[-2:],
        "word.istitle()": word.istitle(),
        "len": len(word) / 4,
        "-1": {"word.lower()": words[t - 1].lower() if t else "BOS", "istitle": t > 0 and words[t - 1].istitle()},
        "shapes": ["upper" if word[:1].isupper() else "lower", "short" if len(word) < 4 else "long"],
    }


X_TRAIN, Y_TRAIN = sentences(0, 40)
X_TEST, _ = sentences(1, 25)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> str:
    """A model file that python-crfsuite trained (L1 leaves weights at 0, which it prunes)."""
    path = str(tmp_path_factory.mktemp("crfsuite") / "trained.crfsuite")
    trainer = pycrfsuite.Trainer(verbose=False)
    for x, y in zip(X_TRAIN, Y_TRAIN):
        trainer.append(x, y)
    trainer.set_params({"c1": 0.01, "c2": 0.01, "max_iterations": 60, "feature.possible_transitions": True})
    trainer.train(path)
    return path


@pytest.fixture(scope="module")
def model(trained) -> crfsuite_model.CrfsuiteModel:
    return crfsuite_model.read(trained)


@pytest.fixture(scope="module")
def original(trained) -> bytes:
    with open(trained, "rb") as file:
        return file.read()


def crfsuite_tags(path, X, labels) -> tuple[list, list]:
    """`(label sequences, marginals [T, L] per sentence in `labels` order)` by pycrfsuite's Tagger."""
    tagger = pycrfsuite.Tagger()
    tagger.open(str(path))
    paths, marginals = [], []
    for x in X:
        paths.append(tagger.tag(x))
        marginals.append(np.array([[tagger.marginal(label, t) for label in labels] for t in range(len(x))]))
    tagger.close()
    return paths, marginals


def lossfns_tags(saved: model_file.SavedModel, X) -> tuple[list, list]:
    """`(label sequences, marginals [T, L] per sentence)` by a lossfns Tagger of `saved`."""
    tagger = Tagger.from_saved(saved, iob_constraints=False)
    corpus = flatten_corpus(X).pack(tagger.index, None, tagger.num_buckets)
    paths = in_corpus_order(corpus, tagger.decode_packed(corpus, packed.viterbi))
    marginals = in_corpus_order(corpus, tagger.decode_packed(corpus, packed.marginals))
    return [[saved.labels[j] for j in path] for path in paths], [np.asarray(m) for m in marginals]


def assert_same_tagging(saved: model_file.SavedModel, path) -> None:
    """A lossfns Tagger of `saved` and pycrfsuite's Tagger of the file at
    `path` label every sentence alike, with marginals within 1e-5."""
    X = X_TEST + X_TRAIN
    expected_paths, expected_marginals = crfsuite_tags(path, X, saved.labels)
    paths, marginals = lossfns_tags(saved, X)
    assert paths == expected_paths
    assert len(set(map(tuple, paths))) > 10  # the sentences are told apart, not all tagged alike
    np.testing.assert_allclose(np.concatenate(marginals), np.concatenate(expected_marginals), rtol=0, atol=1e-5)


def test_reads_what_pycrfsuite_reports(trained, model):
    tagger = pycrfsuite.Tagger()
    tagger.open(trained)
    info = tagger.info()  # pycrfsuite's dump: ids as strings, weights printed with 6 decimals
    assert model.labels == tuple(sorted(info.labels, key=lambda label: int(info.labels[label])))
    assert model.attributes == tuple(sorted(info.attributes, key=lambda name: int(info.attributes[name])))
    state = model.state_features
    read = {(model.attributes[a], model.labels[l]): w for a, l, w in zip(*(array.tolist() for array in state))}
    assert read.keys() == info.state_features.keys() and len(read) > 50
    np.testing.assert_allclose(
        [read[key] for key in info.state_features], list(info.state_features.values()), atol=6e-7
    )
    sources, targets = np.nonzero(model.transitions)
    transitions = {(model.labels[i], model.labels[j]): model.transitions[i, j] for i, j in zip(sources, targets)}
    assert transitions.keys() == info.transitions.keys()
    np.testing.assert_allclose(
        [transitions[key] for key in info.transitions], list(info.transitions.values()), atol=6e-7
    )
    # CRFsuite's attributes are the names lossfns' feature dicts give the same tokens.
    assert set(model.attributes) <= set(flatten_corpus(X_TRAIN).names)
    assert model.transitions.dtype == np.float64 and state.weights.dtype == np.float64


def test_writes_a_pycrfsuite_model_back_byte_for_byte(trained, original, model, tmp_path):
    assert crfsuite_model.to_bytes(model) == original
    crfsuite_model.write(tmp_path / "again.crfsuite", model)
    assert (tmp_path / "again.crfsuite").read_bytes() == original
    assert (
        crfsuite_tags(tmp_path / "again.crfsuite", X_TEST, model.labels)[0]
        == crfsuite_tags(trained, X_TEST, model.labels)[0]
    )


def test_a_lossfns_tagger_of_a_crfsuite_model_tags_as_pycrfsuite(trained, model):
    saved = crfsuite_model.to_saved_model(model, num_buckets=2)
    assert saved.model.start.shape == (len(model.labels),) and not np.any(np.asarray(saved.model.start))
    assert_same_tagging(saved, trained)
    assert crfsuite_model.from_saved_model(saved).attributes == model.attributes


def lossfns_model(seed: int = 0) -> model_file.SavedModel:
    """A lossfns model of the training attributes with random weights, start
    weights 0, and a third of the attributes with no non-zero weight."""
    rng = np.random.default_rng(seed)
    index = flatten_corpus(X_TRAIN).index()
    labels = tuple(dict.fromkeys(label for sequence in Y_TRAIN for label in sequence))
    K, L = index.num_unigram, len(labels)
    emission = rng.normal(size=(K, L)) * (rng.random((K, L)) < 0.6) * (rng.random((K, 1)) < 0.67)
    model = LinearChainModel(
        jnp.asarray(emission), jnp.asarray(rng.normal(size=(L, L))), jnp.zeros(L), jnp.zeros((0, L, L))
    )
    return model_file.SavedModel(labels, Tagger("feature_dicts").extractor, index, model, 2)


def test_a_lossfns_model_exports_to_a_file_pycrfsuite_tags_alike(tmp_path):
    saved = lossfns_model()
    exported = crfsuite_model.from_saved_model(saved)
    crfsuite_model.write(tmp_path / "exported.crfsuite", exported)
    assert_same_tagging(saved, tmp_path / "exported.crfsuite")
    # Only attributes with a non-zero weight are kept, as CRFsuite keeps them.
    emission = np.asarray(saved.model.emission)
    assert len(exported.attributes) == np.count_nonzero(emission.any(axis=1)) < emission.shape[0]
    back = crfsuite_model.to_saved_model(crfsuite_model.read(tmp_path / "exported.crfsuite"))
    rows = [saved.index.unigram[name] for name in back.index.unigram]
    np.testing.assert_array_equal(np.asarray(back.model.emission), emission[rows])
    np.testing.assert_array_equal(np.asarray(back.model.transitions), np.asarray(saved.model.transitions))
    # Loaded from its lossfns model file (non-zero rows only), it exports to the same bytes.
    reloaded = model_file.from_bytes(model_file.to_bytes(saved))
    assert crfsuite_model.to_bytes(crfsuite_model.from_saved_model(reloaded)) == crfsuite_model.to_bytes(exported)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: with_tables(s, start=1.0), "start weights"),
        (lambda s: with_tables(s, pairs=1), "label-pair features"),
        (lambda s: s._replace(features=Tagger("crfsuite_ner").extractor), "feature_dicts"),
        (lambda s: s._replace(index=FeatureIndex.hashed_index(s.index.num_unigram)), "hashed"),
    ],
)
def test_refuses_models_crfsuite_cannot_represent(change, message):
    with pytest.raises(ValueError, match=message):
        crfsuite_model.from_saved_model(change(lossfns_model()))


def with_tables(saved, start=0.0, pairs=0):
    """`saved` with start weights `start` and `pairs` label-pair features."""
    model = saved.model
    L = model.transitions.shape[0]
    return saved._replace(
        model=LinearChainModel(model.emission, model.transitions, jnp.full(L, start), jnp.zeros((pairs, L, L)))
    )


def test_refuses_to_write_names_crfsuite_cannot_store(model):
    with pytest.raises(ValueError, match="NUL"):
        crfsuite_model.to_bytes(model._replace(labels=("B\0LOC",) + model.labels[1:]))
    with pytest.raises(ValueError, match="distinct"):
        crfsuite_model.to_bytes(model._replace(attributes=model.attributes[:1] * len(model.attributes)))


def test_lookup3_hash_matches_its_published_value():
    # lookup3.c's self-test: hashlittle("Four score and seven years ago", 30, 0) == 0x17770551.
    assert crfsuite_model._hashlittle([b"Four score and seven years ago"]).tolist() == [0x17770551]


def with_uint32(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + value.to_bytes(4, "little") + data[offset + 4 :]


@pytest.mark.parametrize("length", [0, 2, 4, 20, 47, 48, 100, 3000, -1])
def test_refuses_truncated_files(original, tmp_path, length):
    path = tmp_path / "cut.crfsuite"
    path.write_bytes(original[:length])
    with pytest.raises(ModelFileError, match=f"{path}.*(truncated|not a CRFsuite)"):
        crfsuite_model.read(path)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: b"LCRF" + data[4:], "not a CRFsuite model"),
        (lambda data: data + b"\0\0\0\0", "corrupted: its header gives"),
        (lambda data: with_uint32(data, 4, len(data) - 8), "corrupted: its header gives"),
        (lambda data: with_uint32(data, 4, len(data) + 8), "truncated: its header gives"),
        (lambda data: data[:8] + b"FOMD" + data[12:], "type b'FOMD'"),
        (lambda data: with_uint32(data, 36, len(data) + 100), "attribute database at offset"),  # off_attrs
        (lambda data: with_uint32(data, 28, 100), "features at offset 100"),  # off_features
        (lambda data: with_uint32(data, 44, len(data) - 4), "attribute references"),  # off_attrrefs
    ],
)
def test_refuses_damaged_files(original, tmp_path, damage, message):
    path = tmp_path / "damaged.crfsuite"
    path.write_bytes(damage(original))
    with pytest.raises(ModelFileError, match=f"{path}.*{message}"):
        crfsuite_model.read(path)
    with pytest.raises(ModelFileError, match=message):
        crfsuite_model.from_bytes(damage(original))


def test_refuses_what_is_not_a_regular_file(tmp_path):
    with pytest.raises(ModelFileError, match=f"{tmp_path} is a directory"):
        crfsuite_model.read(tmp_path)
    with pytest.raises(ModelFileError, match="does not exist"):
        crfsuite_model.read(tmp_path / "missing.crfsuite")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    raised = []
    # A FIFO without a writer blocks a plain open(): read in a thread, so a hang fails the test instead of stalling it.
    reader = threading.Thread(target=lambda: raised.append(_error_of(crfsuite_model.read, fifo)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO hung"
    assert isinstance(raised[0], ModelFileError) and f"{fifo} is a FIFO" in str(raised[0])
    assert not crfsuite_model.is_crfsuite_file(fifo)


def _error_of(function, *arguments):
    try:
        function(*arguments)
    except Exception as error:
        return error
    return None


def test_tells_crfsuite_files_from_others(trained, tmp_path):
    assert crfsuite_model.is_crfsuite_file(trained)
    model_file.save(tmp_path / "lossfns.model", lossfns_model())
    assert not crfsuite_model.is_crfsuite_file(tmp_path / "lossfns.model")
    assert not crfsuite_model.is_crfsuite_file(tmp_path)
    assert not crfsuite_model.is_crfsuite_file(tmp_path / "missing")


def escaped(name: str) -> str:
    """An attribute name as CRFsuite's data files write it (`\\` before a colon or a backslash)."""
    return name.replace("\\", "\\\\").replace(":", "\\:")


def write_attribute_file(path, X, y) -> None:
    """`X`, `y` in CRFsuite's data format (`crfsuite tag`'s input): per token
    its label, then its attributes `name:value` (python-crfsuite's names of the
    feature dicts, escaped; value-1 attributes without their value), tab-separated."""
    lines = []
    for x, labels in zip(X, y):
        for item, label in zip(x, labels):
            fields = [escaped(n) if v == 1 else f"{escaped(n)}:{v!r}" for n, v in flatten(item)]
            lines.append("\t".join([label, *fields]))
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


def test_crfsuite_data_files_are_read_as_crfsuite_reads_them(tmp_path):
    """`read_attribute_file`: a label, then `name[:value]` fields with CRFsuite's
    escapes; blank lines end sequences; repeated tabs are one; the attributes
    of each row are the feature dict's (`attribute_items`)."""
    (tmp_path / "data.txt").write_text(
        "B-PER\tword\\:Ana\tlen:0.75\t\tistitle\ta\\\\b:2\tfree:\nO\n\n\nO\tword\\:the\tword\\:the:2\r\n"
    )
    file = crfsuite_tagger.read_attribute_file(tmp_path / "data.txt", labelled=True)
    assert [s.labels for s in file.sentences] == [("B-PER", "O"), ("O",)]
    assert file.rows == ((0, 1), (4,)) and len(file.lines) == 5 and file.lines[4] == "O\tword\\:the\tword\\:the:2"
    items = [crfsuite_tagger.attribute_items(s.tokens) for s in file.sentences]
    assert items == [
        [{"word:Ana": 1.0, "len": 0.75, "istitle": 1.0, "a\\b": 2.0, "free": 1.0}, {}],
        [{"word:the": 3.0}],
    ]
    assert crfsuite_tagger.read_attribute_file(tmp_path / "data.txt").sentences[0].labels == ()
    (tmp_path / "bad.txt").write_text("O\tw\nO\tlen:big\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: attribute 'len' has value 'big', not a number"):
        crfsuite_tagger.read_attribute_file(tmp_path / "bad.txt")


def test_a_crfsuite_data_file_is_tagged_as_pycrfsuite_tags_its_items(trained, model, tmp_path):
    """An `AttributeFileTagger` of python-crfsuite's model, on the items written
    to a CRFsuite data file (escaped names, values, unknown attributes),
    labels every sentence as pycrfsuite's Tagger does, marginals within 1e-5."""
    X = X_TEST + X_TRAIN
    write_attribute_file(tmp_path / "test.txt", X, [["O"] * len(x) for x in X])
    file = crfsuite_tagger.read_attribute_file(tmp_path / "test.txt")
    tagger = crfsuite_tagger.AttributeFileTagger.from_saved(crfsuite_model.to_saved_model(model), iob_constraints=False)
    expected_paths, expected_marginals = crfsuite_tags(trained, X, model.labels)
    assert [list(path) for path in tagger.predict(file.sentences)] == expected_paths
    marginals = tagger.predict_marginals(file.sentences)
    np.testing.assert_allclose(np.concatenate(marginals), np.concatenate(expected_marginals), rtol=0, atol=1e-5)
