"""Bad input to the applications (lossfns.tagger.Tagger, model files,
the `lossfns` command line, labelled output, lossfns.sklearn.CRF): each case
raises the stated exception type with a message naming the offending argument
(and, for files, the file); the command line refuses before any work, with
exit status 2 and no traceback.

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import functools
import io
import os
import tracemalloc

import equinox as eqx
import jax.numpy as jnp
import pytest

from lossfns import checkpoint, cli, crfsuite_model, labelled_output, losses, model_file, parallel
from lossfns.checkpoint import CheckpointError, ModelFileError
from lossfns.corpora import Sentence
from lossfns.crfsuite_tagger import CrfsuiteTagger
from lossfns.features.presets import preset
from lossfns.sklearn import CRF as EstimatorCRF
from lossfns.tagger import Tagger
from tests.bad_inputs import assert_raises_a_named_error, case_ids, column_file, command_line, fifo, within

_SENTENCE = Sentence((("El", "DA"), ("rey", "NC")), ("O", "O"))


_TINY_CORPUS = [
    Sentence((("El", "DA"), ("rey", "NC"), ("Juan", "NP")), ("O", "O", "B-PER")),
    Sentence((("Ana", "NP"), ("vive", "VM")), ("B-PER", "O")),
]


@functools.cache
def _tiny_tagger():
    return Tagger("crfsuite_ner", l2=1.0, max_iterations=2, num_buckets=1, progress=False).fit(_TINY_CORPUS)


def _not_a_tagger(tmp_path):
    path = tmp_path / "bad.tagger"
    path.write_text("El DA O\n")
    return Tagger.load(path)


def _damaged_model_file(tmp_path, damage):
    """Save the tiny tagger, apply `damage(bytes) -> bytes`, load it back."""
    path = tmp_path / "ner.tagger"
    _tiny_tagger().save(path)
    path.write_bytes(damage(path.read_bytes()))
    return Tagger.load(path)


def _flip_bit(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :]


def _fit_in_locked_directory(tmp_path):
    with checkpoint.DirectoryLock(tmp_path / "run"):
        return Tagger("crfsuite_ner", max_iterations=1, num_buckets=1, progress=False).fit(
            _TINY_CORPUS, checkpoint_dir=tmp_path / "run"
        )


def _load_within_a_bounded_read(tmp_path):
    """Load a 2 GiB junk file (sparse: no disk used) as a model file; an
    AssertionError if loading it took more than a megabyte of memory (the
    whole file read before its magic bytes were checked)."""
    path = tmp_path / "junk.tagger"
    with open(path, "wb") as junk:
        junk.write(b"PK\x03\x04 not a model")
        junk.truncate(2 << 30)
    tracemalloc.start()
    try:
        Tagger.load(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 1 << 20, f"{peak} bytes allocated to refuse a junk file"


def _fit_into_a_file(tmp_path):
    (tmp_path / "run").write_text("not a directory")
    return Tagger("crfsuite_ner", max_iterations=1, num_buckets=1, progress=False).fit(
        _TINY_CORPUS, checkpoint_dir=tmp_path / "run"
    )


def _feature_dicts_model(tmp_path):
    """The tiny tagger saved as `lossfns.sklearn.CRF` saves its models: preset
    `feature_dicts` (a model that reads a feature dict per token)."""
    path = tmp_path / "dicts.tagger"
    model_file.save(path, _tiny_tagger().saved()._replace(features=preset("feature_dicts")))
    return path


def _crfsuite_file(tmp_path):
    """The tiny tagger in CRFsuite's format (what `lossfns.sklearn.CRF(model_filename=)` writes)."""
    path = tmp_path / "dicts.crfsuite"
    saved = _tiny_tagger().saved()
    no_start = eqx.tree_at(lambda model: model.start, saved.model, jnp.zeros_like(saved.model.start))  # as CRFsuite
    crfsuite_model.write(
        path, crfsuite_model.from_saved_model(saved._replace(features=preset("feature_dicts"), model=no_start))
    )
    return path


_TRAIN_CONLL = "El DA O\nrey NC O\nJuan NP B-PER\n\nAna NP B-PER\nvive VM O\n"


_PATTERN = "U00:%x[0,0]\nU01:%x[0,1]\nB\n"


def _lossfns(tmp_path, *arguments, pattern=_PATTERN):
    """`lossfns ARGUMENTS` in `tmp_path`, beside `train.conll`, `test.conll`
    (one column), `ner.pattern` and `ner.tagger` (the tiny tagger: its
    preset reads two columns)."""
    (tmp_path / "train.conll").write_text(_TRAIN_CONLL)
    (tmp_path / "test.conll").write_text("El\nrey\n")
    (tmp_path / "ner.pattern").write_text(pattern)
    _tiny_tagger().save(tmp_path / "ner.tagger")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        return command_line(cli.main, list(arguments))
    finally:
        os.chdir(here)


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    # --- lossfns.tagger.Tagger ---
    (
        "tagger-preset",
        "an unknown feature preset name",
        lambda _: Tagger("crfsuite_nerr"),
        ValueError,
        ["features", "'crfsuite_nerr'", "crfsuite_ner'"],
    ),
    (
        "tagger-num-buckets",
        "num_buckets = 0",
        lambda _: Tagger(num_buckets=0),
        ValueError,
        ["num_buckets", ">= 1", "0"],
    ),
    ("tagger-min-count", "min_count = 0", lambda _: Tagger(min_count=0), ValueError, ["min_count", ">= 1", "0"]),
    ("tagger-hash-size", "hash_size = 0", lambda _: Tagger(hash_size=0), ValueError, ["hash_size", ">= 1", "0"]),
    (
        "tagger-memory-size",
        "memory_size = 0 for the tagger",
        lambda _: Tagger(memory_size=0),
        ValueError,
        ["memory_size", ">= 1", "0"],
    ),
    ("tagger-period", "a stopping period of 0", lambda _: Tagger(period=0), ValueError, ["period", ">= 1", "0"]),
    ("tagger-tol", "a negative tagger tol", lambda _: Tagger(tol=-1.0), ValueError, ["tol", ">= 0", "-1.0"]),
    ("tagger-l1-string", "a string as l1", lambda _: Tagger(l1="0.1"), TypeError, ["l1", "number", "'0.1'"]),
    (
        "tagger-dtype",
        "an integer weight dtype",
        lambda _: Tagger(dtype=jnp.int32),
        TypeError,
        ["dtype", "floating", "int32"],
    ),
    (
        "tagger-optimizer",
        "an optimizer that is not an optax transformation",
        lambda _: Tagger(optimizer="adam"),
        TypeError,
        ["optimizer", "GradientTransformation", "str"],
    ),
    (
        "tagger-predict-unfitted",
        "predict before fit",
        lambda _: Tagger().predict([_SENTENCE]),
        ValueError,
        ["no model", "fit()"],
    ),
    (
        "tagger-predict-element",
        "a string instead of a Sentence in predict",
        lambda _: Tagger().predict(["El rey"]),
        TypeError,
        ["sentences[0]", "corpora.Sentence", "str"],
    ),
    (
        "tagger-predict-tokens",
        "token rows given as plain strings",
        lambda _: Tagger().predict([Sentence(("El", "rey"), ("O", "O"))]),
        TypeError,
        ["sentences[0].tokens[0]", "tuple of strings", "'El'"],
    ),
    (
        "tagger-fit-empty",
        "fit on an empty corpus",
        lambda _: Tagger().fit([]),
        ValueError,
        ["sentences", "at least one", "got 0"],
    ),
    (
        "tagger-fit-lengths",
        "a sentence with fewer labels than tokens",
        lambda _: Tagger().fit([Sentence(_SENTENCE.tokens, ("O",))]),
        ValueError,
        ["[0]", "2 tokens", "1 label"],
    ),
    (
        "tagger-fit-element",
        "a non-Sentence element passed to fit",
        lambda _: Tagger().fit([_SENTENCE, ("El", "DA")]),
        TypeError,
        ["sentences[1]", "corpora.Sentence", "tuple"],
    ),
    (
        "tagger-fit-corpus",
        "a string instead of a corpus in fit",
        lambda _: Tagger().fit("El DA O"),
        TypeError,
        ["sentences", "list or tuple", "str"],
    ),
    (
        "tagger-kbest-k",
        "k = 0 best sequences",
        lambda _: Tagger().predict_kbest([_SENTENCE], 0),
        ValueError,
        ["k", ">= 1", "0"],
    ),
    (
        "tagger-mesh-loss",
        "a custom loss with data-parallel training",
        lambda _: Tagger(loss=losses.sequence_log_loss).fit([_SENTENCE], mesh=parallel.data_mesh()),
        ValueError,
        ["mesh", "default log-loss"],
    ),
    (
        "tagger-load",
        "Tagger.load of a file that is not a tagger",
        _not_a_tagger,
        ValueError,
        ["bad.tagger", "not a lossfns tagger file"],
    ),
    # --- model files, checkpoint directories ---
    (
        "model-file-bit-flip",
        "a model file with one flipped bit",
        lambda tmp: _damaged_model_file(tmp, _flip_bit),
        ModelFileError,
        ["ner.tagger"],
    ),
    (
        "model-file-truncated",
        "a truncated model file",
        lambda tmp: _damaged_model_file(tmp, lambda data: data[:-7]),
        ModelFileError,
        ["ner.tagger"],
    ),
    (
        "model-file-missing",
        "Tagger.load of a missing file",
        lambda tmp: Tagger.load(tmp / "none.tagger"),
        ModelFileError,
        ["none.tagger"],
    ),
    (
        "checkpoint-dir-in-use",
        "a second training run on one checkpoint_dir",
        _fit_in_locked_directory,
        CheckpointError,
        ["run", "in use"],
    ),
    (
        "checkpoint-dir-a-file",
        "a checkpoint_dir that is a regular file",
        _fit_into_a_file,
        CheckpointError,
        ["checkpoint_dir", "run", "not a directory"],
    ),
    (
        "model-file-fifo",
        "Tagger.load of a FIFO (a read would wait for a writer forever)",
        lambda tmp: within(10, lambda: Tagger.load(fifo(tmp, "pipe.tagger"))),
        ModelFileError,
        ["pipe.tagger", "FIFO", "not a regular file"],
    ),
    (
        "model-file-huge-junk",
        "a 2 GiB junk file as a model file (refused after its first bytes, not read whole)",
        _load_within_a_bounded_read,
        ModelFileError,
        ["junk.tagger", "not a lossfns tagger file"],
    ),
    (
        "model-file-reads-feature-dicts",
        "a model of feature dicts (lossfns.sklearn.CRF's) loaded to read column files",
        lambda tmp: model_file.load(_feature_dicts_model(tmp), reading=model_file.COLUMNS),
        ModelFileError,
        ["dicts.tagger", "feature dicts", "lossfns.sklearn.CRF"],
    ),
    (
        "model-file-reads-columns",
        "a model of column files opened by the pycrfsuite-style tagger (feature dicts)",
        lambda tmp: _tiny_tagger().save(tmp / "ner.tagger") or CrfsuiteTagger().open(tmp / "ner.tagger"),
        ModelFileError,
        ["ner.tagger", "reads the columns", "not feature dicts"],
    ),
    # --- the command line (`lossfns`): refused before any work, exit status 2, no traceback ---
    (
        "cli-model-is-the-corpus",
        "lossfns train -p P data.conll data.conll (the model written over the corpus)",
        lambda tmp: _lossfns(tmp, "train", "-p", "ner.pattern", "train.conll", "train.conll"),
        SystemExit,
        ["exit status 2", "lossfns: error: MODEL", "is the TRAIN file", "destroy"],
    ),
    (
        "cli-output-is-the-input",
        "lossfns label -m M in.conll in.conll (the output written over the input)",
        lambda tmp: _lossfns(tmp, "label", "-m", "ner.tagger", "test.conll", "test.conll"),
        SystemExit,
        ["exit status 2", "OUTPUT", "is the INPUT file"],
    ),
    (
        "cli-model-directory-missing",
        "lossfns train with MODEL in a missing directory (found before training)",
        lambda tmp: _lossfns(tmp, "train", "-p", "ner.pattern", "train.conll", "none/model"),
        SystemExit,
        ["exit status 2", "MODEL none/model", "directory none does not exist"],
    ),
    (
        "cli-output-directory-missing",
        "lossfns label with OUTPUT in a missing directory (found before labelling)",
        lambda tmp: _lossfns(tmp, "label", "-m", "ner.tagger", "test.conll", "none/out"),
        SystemExit,
        ["exit status 2", "OUTPUT none/out", "directory none does not exist"],
    ),
    (
        "cli-pattern-missing-column",
        "a pattern that reads a column the training file lacks",
        lambda tmp: _lossfns(tmp, "train", "-p", "ner.pattern", "train.conll", "m", pattern="U:%x[0,4]\n"),
        SystemExit,
        ["exit status 2", "-p/--pattern", "reads 5 columns", "has 2 besides its label column"],
    ),
    (
        "cli-pattern-only-comments",
        "a pattern file with only comments",
        lambda tmp: _lossfns(tmp, "train", "-p", "ner.pattern", "train.conll", "m", pattern="# U:%x[0,0]\n"),
        SystemExit,
        ["exit status 2", "holds no U or * template"],
    ),
    (
        "cli-rho2-inf",
        "lossfns train -2 inf",
        lambda tmp: _lossfns(tmp, "train", "-2", "inf", "-p", "ner.pattern", "train.conll", "m"),
        SystemExit,
        ["exit status 2", "-2/--rho2", "finite", "inf"],
    ),
    (
        "cli-model-reads-more-columns",
        "lossfns label with a model that reads more columns than the input has",
        lambda tmp: _lossfns(tmp, "label", "-m", "ner.tagger", "test.conll"),
        SystemExit,
        ["exit status 2", "-m/--model", "reads 2 columns", "INPUT", "has 1"],
    ),
    (
        "cli-feature-dicts-model",
        "lossfns label with a model saved by lossfns.sklearn.CRF (feature dicts)",
        lambda tmp: _lossfns(tmp, "label", "-m", str(_feature_dicts_model(tmp)), "test.conll"),
        SystemExit,
        ["exit status 2", "dicts.tagger", "feature dicts", "not the columns of a column file"],
    ),
    (
        "cli-crfsuite-model",
        "lossfns label with a CRFsuite model (lossfns.sklearn.CRF(model_filename=)'s)",
        lambda tmp: _lossfns(tmp, "label", "-m", str(_crfsuite_file(tmp)), "test.conll"),
        SystemExit,
        ["exit status 2", "dicts.crfsuite", "CRFsuite model", "feature dict"],
    ),
    # --- labelled output ---
    (
        "labelled-output-length",
        "predicted labels shorter than their sentence",
        lambda tmp: labelled_output.write_labelled(column_file(tmp, b"El DA\nrey NC\n"), [[("O",)]], io.StringIO()),
        ValueError,
        ["labels[0][0]", "1 labels", "2 tokens", "bad.conll:1"],
    ),
    # --- lossfns.sklearn.CRF ---
    (
        "sklearn-algorithm",
        "an algorithm that is not CRFsuite's",
        lambda _: EstimatorCRF(algorithm="newton").fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["algorithm", "'newton'", "'lbfgs'"],
    ),
    (
        "sklearn-unknown-algorithm",
        "an algorithm name CRFsuite does not have either",
        lambda _: EstimatorCRF(algorithm="newton").fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["algorithm", "'newton'"],
    ),
    (
        "sklearn-ragged-y",
        "y with fewer labels than its sentence of X has tokens",
        lambda _: EstimatorCRF().fit([[{"w": "a"}, {"w": "b"}]], [["O"]]),
        ValueError,
        ["y[0]", "2 tokens", "1 labels"],
    ),
    (
        "sklearn-y-count",
        "y with another number of sentences than X",
        lambda _: EstimatorCRF().fit([[{"w": "a"}]], [["O"], ["O"]]),
        ValueError,
        ["y", "1 sentences", "2 label"],
    ),
    (
        "sklearn-other-trainer-setting",
        "a setting of CRFsuite's passive-aggressive trainer with lbfgs",
        lambda _: EstimatorCRF(pa_type=1).fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["pa_type", "None"],
    ),
    (
        "sklearn-l2sgd-c2",
        "l2sgd without an L2 weight (its learning rate is 1 / (c2 t))",
        lambda _: EstimatorCRF(algorithm="l2sgd", c2=0.0).fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["c2", "l2sgd", "> 0"],
    ),
    (
        "sklearn-setting-of-another-algorithm",
        "an l2sgd setting given to the averaged perceptron",
        lambda _: EstimatorCRF(algorithm="ap", calibration_eta=0.1).fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["calibration_eta", "algorithm='ap'", "None"],
    ),
    (
        "sklearn-unfitted",
        "predict before fit",
        lambda _: EstimatorCRF().predict([[{"w": "a"}]]),
        ValueError,
        ["not fitted", "fit()"],
    ),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)
