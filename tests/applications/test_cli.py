"""The `lossfns` command line, run in-process (`cli.main`) on a tiny CoNLL
file and pattern file written here: train, then label; the output is the
input with one label column appended (checked line by line against the
input and against the `Tagger`'s own predictions, the oracle), n-best,
posteriors, `--check`'s report (against `metrics.conlleval_report`), and
argparse errors that name the option."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from lossfns import checkpoint, cli, corpora, metrics, model_file
from lossfns.tagger import Tagger

TRAIN = """-DOCSTART- -X- O

El DA O
rey NC O
Juan NP B-PER
Carlos NP I-PER
visita VM O
Madrid NP B-LOC
. Fp O

Ana NP B-PER
vive VM O
en SP O
Roma NP B-LOC

Luis NP B-PER
come VM O
en SP O
Paris NP B-LOC
"""
TEST = """Ana\tNP\tB-PER
visita\tVM\tO
Madrid\tNP\tB-LOC

El DA O
rey NC O
"""
PATTERN = """# words and tags
U00:%x[-1,0]
U01:%x[0,0]
U02:%x[1,0]
U03:%x[0,1]
U04:%t[0,0,"^\\u"]

B
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli")
    for name, text in (("train.conll", TRAIN), ("test.conll", TEST), ("ner.pattern", PATTERN)):
        (directory / name).write_text(text)
    model = directory / "model"
    assert (
        cli.main(
            [
                "train",
                "-p",
                str(directory / "ner.pattern"),
                "-1",
                "0.01",
                "-2",
                "0.1",
                "-i",
                "30",
                "--quiet",
                "-d",
                str(directory / "test.conll"),
                str(directory / "train.conll"),
                str(model),
            ]
        )
        == 0
    )
    return directory, model


def _label(capsys, *arguments):
    assert cli.main(["label", *map(str, arguments)]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_train_writes_a_model_that_labels_like_the_tagger(files, capsys):
    directory, model = files
    tagger = Tagger.load(model)
    assert set(tagger.labels) == {"O", "B-PER", "I-PER", "B-LOC"}  # -DOCSTART- is no token
    out, _ = _label(capsys, "-m", model, directory / "test.conll")
    lines, inputs = out.splitlines(), TEST.splitlines()
    assert len(lines) == len(inputs)
    expected = tagger.predict(corpora.read_column_file(directory / "test.conll", labelled=False).sentences)
    labels = iter(label for sentence in expected for label in sentence)
    for line, source in zip(lines, inputs):
        if source:
            separator = "\t" if "\t" in source else " "
            assert line == source + separator + next(labels)
        else:
            assert line == ""
    output = directory / "labelled.txt"
    _label(capsys, "-m", model, directory / "test.conll", output)
    assert output.read_text() == out


def test_check_prints_accuracy_and_the_conlleval_report(files, capsys):
    directory, model = files
    out, err = _label(capsys, "-m", model, "--check", directory / "test.conll")
    gold = [s.labels for s in corpora.read_conll(str(directory / "test.conll"))]
    predicted = [[line.split()[-1] for line in block.splitlines()] for block in out.strip().split("\n\n")]
    assert all(len(line.split()) == 4 for line in out.splitlines() if line)  # word, tag, gold, prediction
    assert f"Token accuracy {metrics.token_accuracy(gold, predicted):.4f}" in err
    assert metrics.conlleval_report(gold, predicted) in err


def test_nbest_scores_and_posteriors(files, capsys):
    directory, model = files
    out, _ = _label(capsys, "-m", model, "--nbest", "3", "--score", directory / "test.conll")
    scores = [float(line.split()[2]) for line in out.splitlines() if line.startswith("#")]
    assert len(scores) == 3 + 3  # 3-best of each sentence (both have >= 3 labellings)
    assert scores[:3] == sorted(scores[:3], reverse=True) and all(s <= 0 for s in scores)
    out, _ = _label(capsys, "-m", model, "--post", directory / "test.conll")
    tagger = Tagger.load(model)
    marginals = tagger.predict_marginals(corpora.read_column_file(directory / "test.conll", labelled=False).sentences)
    cells = [line.split()[-1] for line in out.splitlines() if line]
    expected = [f"{tagger.labels[int(np.argmax(row))]}/{np.max(row):.6f}" for m in marginals for row in m]
    assert cells == expected


@pytest.mark.parametrize(
    "arguments, words",
    [
        (["train", "-a", "sgd-l1", "-p", "p", "t", "m"], ["-a/--algo", "sgd-l1"]),
        (["train", "-a", "lbfgs", "-p", "p", "t", "m"], ["-a/--algo", "-1 0"]),
        (["train", "-a", "newton", "-p", "p", "t", "m"], ["-a/--algo", "newton"]),
        (["train", "--maxiter=-3", "-p", "p", "t", "m"], ["-i/--maxiter", "-3"]),
        (["train", "t", "m"], ["-p/--pattern"]),
        (["label", "-m", "m", "--nbest", "0", "x"], ["-n/--nbest", "0"]),
        (["label", "-m", "m", "--post", "--nbest", "2", "x"], ["-p/--post", "--nbest"]),
        (["label", "x"], ["-m/--model"]),
    ],
)
def test_bad_options_are_argparse_errors_naming_the_option(arguments, words, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(arguments)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err


def test_missing_files_are_clear_errors(files, capsys):
    directory, _model = files
    assert cli.main(["label", "-m", str(directory / "none"), str(directory / "test.conll")]) == 2
    assert "none" in capsys.readouterr().err
    assert cli.main(["train", "-p", str(directory / "none.pattern"), str(directory / "train.conll"), "m"]) == 2
    assert "none.pattern" in capsys.readouterr().err


def test_the_console_script_entry_point_runs(files):
    """`python -m lossfns` is the same command line (a subprocess: its own exit status)."""
    done = subprocess.run(
        [sys.executable, "-m", "lossfns", "label", "--help"], capture_output=True, check=False, text=True
    )
    assert done.returncode == 0 and "--nbest" in done.stdout


@pytest.mark.parametrize("link", ["same path", "symlink", "hard link"])
def test_a_model_path_that_is_the_corpus_is_refused_before_training(files, capsys, link):
    """`lossfns train -p P data.conll data.conll` wrote the model over the
    corpus and exited 0; now it is refused before any work, by path or by
    the file itself (a link to it)."""
    directory, _model = files
    corpus = directory / "train.conll"
    model = {"same path": corpus, "symlink": directory / "link.conll", "hard link": directory / "hard.conll"}[link]
    if link == "symlink":
        model.symlink_to(corpus)
    elif link == "hard link":
        model.hardlink_to(corpus)
    try:
        assert cli.main(["train", "-p", str(directory / "ner.pattern"), "--quiet", str(corpus), str(model)]) == 2
    finally:
        if model != corpus:
            model.unlink()
    err = capsys.readouterr().err
    assert "is the TRAIN file" in err and "* Train" not in err and "Traceback" not in err
    assert corpus.read_text() == TRAIN


def test_the_model_file_records_the_columns_its_pattern_reads(files):
    """`%x[0,1]` is the pattern's highest column: the model reads rows of 2 columns."""
    _directory, model = files
    data = model.read_bytes()
    header, _ = checkpoint.unpack_file(model, data, model_file.MODEL_FILE)
    assert header["reads"] == {"tokens": "columns", "columns": 2}


@pytest.fixture(scope="module")
def crfsuite_files(tmp_path_factory):
    """A CRFsuite model that python-crfsuite trained on toy feature dicts, and
    the test items as a CRFsuite data file (gold labels first)."""
    pycrfsuite = pytest.importorskip("pycrfsuite")
    from test_crfsuite_model import X_TEST, X_TRAIN, Y_TRAIN, sentences, write_attribute_file

    directory = tmp_path_factory.mktemp("crfsuite")
    trainer = pycrfsuite.Trainer(verbose=False)
    for x, y in zip(X_TRAIN, Y_TRAIN):
        trainer.append(x, y)
    trainer.set_params({"c1": 0.01, "c2": 0.01, "max_iterations": 60})
    trainer.train(str(directory / "model.crfsuite"))
    gold = sentences(1, len(X_TEST))[1]
    write_attribute_file(directory / "test.txt", X_TEST, gold)
    return directory, directory / "model.crfsuite", X_TEST, gold


def test_label_tags_a_crfsuite_data_file_with_a_crfsuite_model_as_pycrfsuite(crfsuite_files, capsys):
    """`lossfns label -m MODEL.crfsuite DATA`: each line of the data file with
    pycrfsuite's label appended (a tab), `--post`'s probabilities its marginals,
    `--check` scores the data file's first field."""
    import pycrfsuite

    directory, model, X, gold = crfsuite_files
    tagger = pycrfsuite.Tagger()
    tagger.open(str(model))
    expected = [tagger.tag(x) for x in X]
    out, _ = _label(capsys, "-m", model, directory / "test.txt")
    lines, inputs = out.splitlines(), (directory / "test.txt").read_text().splitlines()
    assert len(lines) == len(inputs) and len(set(map(tuple, expected))) > 5
    labels = iter(label for sequence in expected for label in sequence)
    assert lines == [line + "\t" + next(labels) if line else "" for line in inputs]
    out, _ = _label(capsys, "-m", model, "--post", directory / "test.txt")
    cells = [line.rsplit("\t", 1)[1].split("/") for line in out.splitlines() if line]
    probabilities = []
    for x, sequence in zip(X, expected):
        tagger.set(x)
        probabilities += [tagger.marginal(label, t) for t, label in enumerate(sequence)]
    assert [label for label, _ in cells] == [label for sequence in expected for label in sequence]
    np.testing.assert_allclose([float(p) for _, p in cells], probabilities, rtol=0, atol=2e-6)
    out, err = _label(capsys, "-m", model, "--check", "--nbest", "2", directory / "test.txt")
    accuracy = metrics.token_accuracy(gold, expected)
    assert f"Token accuracy {accuracy:.4f}" in err and accuracy > 0.9  # the gold labels are the first fields
    assert sum(line.startswith("#") for line in out.splitlines()) == 0 and out.count("\n\n") >= 2 * len(X) - 1


def test_label_refuses_a_column_file_with_a_crfsuite_model(crfsuite_files, files, capsys):
    _, model, _, _ = crfsuite_files
    directory, _ = files
    assert cli.main(["label", "-m", str(model), str(directory / "test.conll")]) == 2
    err = capsys.readouterr().err
    assert "lossfns: error: -m/--model" in err and "is a CRFsuite model" in err and "Traceback" not in err
    assert "no attribute of INPUT" in err and "lossfns train -p" in err


_LABEL_CHILD = """
import json, sys
import jax
events = []
jax.monitoring.register_event_duration_secs_listener(lambda event, _, **info: events.append(event))
from lossfns import cli
status = cli.main(sys.argv[1:])
print(json.dumps({"status": status, "events": events}))
"""


def test_a_second_label_process_traces_and_compiles_nothing(files, tmp_path):
    """`lossfns label` in a new process on a warm cache loads every decoding
    program it ran before: JAX traces, lowers and compiles nothing (its own
    monitoring events), and the output is the first process's, byte for byte."""
    import json
    import os

    directory, model = files
    environment = dict(os.environ, LOSSFNS_CACHE_DIR=str(tmp_path / "cache"))
    outputs = []
    for run in range(2):
        output = tmp_path / f"labelled-{run}.txt"
        arguments = ["label", "-m", str(model), str(directory / "test.conll"), str(output)]
        done = subprocess.run(
            [sys.executable, "-c", _LABEL_CHILD, *arguments],
            capture_output=True,
            text=True,
            env=environment,
            check=True,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["status"] == 0
        outputs.append((output.read_bytes(), result["events"]))
    (first, first_events), (second, second_events) = outputs
    assert "/jax/core/compile/backend_compile_duration" in first_events
    assert second_events == [], f"a warm label run traced or compiled: {second_events}"
    assert second == first
