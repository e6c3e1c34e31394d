"""The `lossfns` command line: train and apply a CRF tagger on CoNLL column files, with
Wapiti's conventions (its option letters, CRF++/Wapiti pattern files, its labelled output).

    lossfns train -p examples/ner.pattern esp.train ner.model
    lossfns label -m ner.model --check esp.testb labelled.txt

Built from the library's public pieces; this module parses options and checks
every path and argument before any work (`_checked_train`, `_checked_label`): a
refusal is `lossfns: error: ...`, exit status 2, no traceback, nothing written.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from . import corpora, crfsuite_model, labelled_output, losses, metrics, model_file
from .features.templates import Templates, read_templates
from .tagger import Tagger

ALGORITHMS = ("owlqn", "lbfgs", "sgd-l1", "bcd", "perceptron")
"""Wapiti's training algorithms (`-a/--algo`)."""
TRAINED = ("owlqn", "lbfgs")
"""The ones the command line trains (the others are refused with a message)."""
LOSSES = {
    "crf": None,
    "hinge": losses.structured_hinge_loss,
    "exp": losses.sequence_exp_loss,
    "log-exp": losses.log_sequence_exp_loss,
}
"""`--loss`: the per-sentence losses `(potentials, labels, lengths) -> [B]` (None: the CRF log-loss)."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    """The `lossfns` argument parser (`train` and `label`)."""
    top = argparse.ArgumentParser(
        prog="lossfns", description="Train and apply CRF taggers on CoNLL column files (Wapiti's options and formats)."
    )
    modes = top.add_subparsers(dest="mode", required=True)
    train = modes.add_parser("train", help="train a model on a labelled column file")
    train.add_argument(
        "-a", "--algo", choices=ALGORITHMS, default="owlqn", help="optimizer (default owlqn; lbfgs needs -1 0)"
    )
    train.add_argument("-p", "--pattern", required=True, help="CRF++/Wapiti pattern (template) file")
    train.add_argument(
        "--dialect",
        choices=("wapiti", "python"),
        default="wapiti",
        help="how the pattern's regexes read (default wapiti)",
    )
    train.add_argument("-1", "--rho1", type=_non_negative_float, default=0.5, help="L1 weight (default 0.5)")
    train.add_argument("-2", "--rho2", type=_non_negative_float, default=0.0001, help="L2 weight (default 0.0001)")
    train.add_argument(
        "-i",
        "--maxiter",
        type=_non_negative_int,
        default=0,
        help="iterations at most (default 0: until the stop rule, at most 10000)",
    )
    train.add_argument(
        "-e",
        "--stopeps",
        type=_non_negative_float,
        default=0.02,
        help="stop when the objective improved by less than this (relative) ...",
    )
    train.add_argument("-w", "--stopwin", type=_positive_int, default=5, help="... over this many iterations")
    train.add_argument("-d", "--devel", help="a labelled column file scored after training")
    train.add_argument("--loss", choices=sorted(LOSSES), default="crf", help="per-sentence loss (default crf)")
    train.add_argument("--quiet", action="store_true", help="no progress bar nor objective lines")
    train.add_argument("input", metavar="TRAIN", help="labelled column file")
    train.add_argument("model", metavar="MODEL", help="model file to write")
    train.set_defaults(parser=train)
    label = modes.add_parser(
        "label",
        help="label a column file with a trained model",
        description="Label a column file with a model written by `lossfns train`, or a CRFsuite data file with a "
        "CRFsuite model (sklearn-crfsuite's, python-crfsuite's, `crfsuite learn`'s; told by its magic bytes).",
        epilog="CRFsuite data files are `crfsuite tag`'s input: a line per token, tab-separated fields, the first "
        "the token's label (read by --check, else ignored, but present), then its attributes NAME or NAME:VALUE "
        "(value 1 when missing; \\: and \\\\ escape a colon and a backslash in names); a blank line ends a "
        "sentence. Their attribute names are sklearn-crfsuite's feature dicts flattened: {'word': 'the'} is "
        "word\\:the, {'len': 0.75} is len:0.75. A column file with a CRFsuite model is refused: such a model "
        "reads attributes, not a pattern's columns.",
    )
    label.add_argument(
        "-m",
        "--model",
        required=True,
        help="model file written by `lossfns train`, or a CRFsuite model (then INPUT is a CRFsuite data file)",
    )
    label.add_argument(
        "-c",
        "--check",
        action="store_true",
        help="the input's last column (a CRFsuite data file's first field) is the gold label: print accuracy and "
        "per-type P/R/F1",
    )
    label.add_argument("-n", "--nbest", type=_positive_int, default=1, help="write the N best label sequences")
    label.add_argument("-s", "--score", action="store_true", help="write each sequence's log-probability")
    label.add_argument(
        "-p",
        "--post",
        action="store_true",
        help="posterior decoding: each token's most probable label and its probability",
    )
    label.add_argument(
        "input", metavar="INPUT", help="column file to label (a CRFsuite data file for a CRFsuite model)"
    )
    label.add_argument("output", metavar="OUTPUT", nargs="?", help="output file (default: standard output)")
    label.set_defaults(parser=label)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` (default `sys.argv[1:]`); 0 on success,
    2 (with `lossfns: error: ...` on stderr) for a path or argument refused
    before any work."""
    options = parser().parse_args(argv)
    try:
        return _train(options) if options.mode == "train" else _label(options)
    except Refused as problem:
        print(f"lossfns: error: {problem}", file=sys.stderr)
        return 2


class Refused(Exception):
    """A path, file or argument the command line refuses before training or
    labelling (the message names it as the command line does)."""


# ---------------------------------------------------------------------------
# The checks: every path and argument, before any work
# ---------------------------------------------------------------------------


def _checked_train(options) -> tuple[list, Templates, list | None]:
    """`(sentences, templates, devel sentences or None)` once every argument,
    input and output of `train` is checked."""
    if options.algo not in TRAINED:
        options.parser.error(
            f"argument -a/--algo: {options.algo} is not trained from the command line yet; "
            f"use one of {', '.join(TRAINED)}"
        )
    if options.algo == "lbfgs" and options.rho1 > 0:
        options.parser.error(
            f"argument -a/--algo: lbfgs trains without L1: give -1 0 (got -1 {options.rho1}), or use -a owlqn"
        )
    inputs = {"TRAIN": options.input, "-p/--pattern": options.pattern, "-d/--devel": options.devel}
    _check_output("MODEL", options.model, inputs)
    templates = _read("-p/--pattern", options.pattern, lambda path: read_templates(path, dialect=options.dialect))
    if not (templates.unigram or templates.pair):
        raise Refused(
            f"-p/--pattern {options.pattern} holds no U or * template (only comments, blank lines or B): "
            "the model would read nothing of the tokens"
        )
    columns = model_file.reads(templates)["columns"]
    sentences = _read("TRAIN", options.input, corpora.read_conll)
    if not sentences:
        raise Refused(f"TRAIN {options.input} holds no sentence")
    _check_columns(columns, f"-p/--pattern {options.pattern}", sentences, f"TRAIN {options.input}", True)
    devel = None
    if options.devel:
        devel = _read("-d/--devel", options.devel, corpora.read_conll)
        _check_columns(columns, f"-p/--pattern {options.pattern}", devel, f"-d/--devel {options.devel}", True)
    return sentences, templates, devel


def _checked_label(options) -> tuple[Tagger, corpora.ColumnFile]:
    """`(tagger, input file)` once every argument, input and output of
    `label` is checked."""
    if options.post and (options.nbest > 1 or options.score):
        options.parser.error(
            "argument -p/--post: posterior decoding gives one labelling per sentence, with "
            "token probabilities: it cannot be combined with --nbest > 1 or --score"
        )
    if options.output:
        _check_output("OUTPUT", options.output, {"INPUT": options.input, "-m/--model": options.model})
    saved = _read("-m/--model", options.model, _load_model)
    if model_file.reads(saved.features)["tokens"] == model_file.FEATURE_DICTS:  # a CRFsuite model (`_load_model`)
        return _checked_attribute_input(options, saved)
    file = _read("INPUT", options.input, lambda path: corpora.read_column_file(path, labelled=options.check))
    columns = model_file.reads(saved.features)["columns"]
    _check_columns(columns, f"-m/--model {options.model}", file.sentences, f"INPUT {options.input}", options.check)
    return Tagger.from_saved(saved), file


def _load_model(path: str) -> model_file.SavedModel:
    """The model at `path`: a CRFsuite model (told by its magic bytes), which
    reads CRFsuite's data files, or a lossfns model file, refused unless it
    reads the columns of a column file."""
    if crfsuite_model.is_crfsuite_file(path):
        return crfsuite_model.to_saved_model(crfsuite_model.read(path))
    return model_file.load(path, reading=model_file.COLUMNS)


def _checked_attribute_input(options, saved: model_file.SavedModel) -> tuple[Tagger, corpora.ColumnFile]:
    """`label` with a CRFsuite model: `(tagger, input file)`, the input read
    as a CRFsuite data file (`crfsuite_tagger.read_attribute_file`), refused
    when none of its attributes is one the model knows (a column file, whose
    fields a CRFsuite model has no pattern to read, or another model's data):
    every token would be labelled from the transition weights alone."""
    from .crfsuite_tagger import AttributeFileTagger, parse_attribute, read_attribute_file

    file = _read("INPUT", options.input, lambda path: read_attribute_file(path, labelled=options.check))
    known = saved.index.unigram or {}
    fields = (field for sentence in file.sentences for row in sentence.tokens for field in row[1:])
    if not any(parse_attribute(field)[0] in known for field in fields):
        raise Refused(
            f"-m/--model {options.model} is a CRFsuite model: it reads CRFsuite's data format (a line per "
            "token: its label, then tab-separated attributes name[:value], sklearn-crfsuite's feature dicts "
            f"flattened), but no attribute of INPUT {options.input} is one the model knows. A column file is "
            "labelled by a model trained on its columns with a pattern (lossfns train -p)"
        )
    return AttributeFileTagger.from_saved(saved, iob_constraints=False), file


def _read(argument: str, path: str, read):
    """`read(path)`, its errors (a missing file, bad bytes, a bad line) refused naming `argument`."""
    try:
        return read(path)
    except OSError as problem:
        raise Refused(f"{argument} {path}: {problem.strerror or problem}") from None
    except ValueError as problem:  # messages name the file (and line) already
        raise Refused(f"{argument}: {problem}") from None


def _check_output(argument: str, path: str, inputs: dict) -> None:
    """Refuse an output path that cannot be written, or that is one of the
    `inputs` (`{argument: path or None}`), also through a link: writing
    there would destroy the input."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise Refused(f"{argument} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise Refused(f"{argument} {path}: directory {directory} is not writable")
    if os.path.isdir(path):
        raise Refused(f"{argument} {path} is a directory; give a file name")
    for name, source in inputs.items():
        if source and os.path.exists(path) and os.path.exists(source) and os.path.samefile(path, source):
            raise Refused(
                f"{argument} {path} is the {name} file {source}: writing it would destroy the input; give another path"
            )


def _check_columns(needed: int, reader: str, sentences, argument: str, labelled: bool) -> None:
    """Refuse a column file whose tokens have fewer observation columns than
    `reader` (the pattern, or a model's) reads."""
    have = min((len(row) for sentence in sentences for row in sentence.tokens), default=needed)
    if have < needed:
        raise Refused(
            f"{reader} reads {needed} columns of each token (up to column {needed - 1}, counting from 0), "
            f"but {argument} has {have}{' besides its label column' if labelled else ''}"
        )


# ---------------------------------------------------------------------------
# The work
# ---------------------------------------------------------------------------


def _train(options) -> int:
    sentences, templates, devel = _checked_train(options)
    tagger = Tagger(
        templates,
        loss=LOSSES[options.loss],
        l1=options.rho1,
        l2=options.rho2,
        max_iterations=options.maxiter or 10_000,
        tol=options.stopeps,
        period=options.stopwin,
        progress=not options.quiet,
    )
    tokens = sum(len(s.tokens) for s in sentences)
    print(f"* Train {options.input}: {len(sentences)} sentences, {tokens} tokens", file=sys.stderr)
    start = time.perf_counter()
    tagger.fit(sentences, callback=None if options.quiet else _print_objective)
    seconds = time.perf_counter() - start
    tagger.save(options.model)
    print(
        f"* Done: {len(tagger.history)} iterations ({tagger.status.name}), {seconds:.1f} s; "
        f"{tagger.index.num_unigram} observations, {len(tagger.labels)} labels, "
        f"{tagger.model.num_nonzero()} non-zero weights; model written to {options.model}",
        file=sys.stderr,
    )
    if devel:
        scores = tagger.evaluate(devel)
        print(
            f"* Devel {options.devel}: token accuracy {scores['token_accuracy']:.4f}, entity F1 {scores['f1']:.4f}",
            file=sys.stderr,
        )
    return 0


def _print_objective(report) -> None:
    print(f"  [{report.step:4d}] obj={report.value:.6f}", file=sys.stderr, flush=True)


def _label(options) -> int:
    tagger, file = _checked_label(options)
    sentences = file.sentences
    start = time.perf_counter()
    sequence_scores = token_scores = None
    if options.post:
        marginals = tagger.predict_marginals(sentences)
        labels = [[tuple(tagger.labels[j] for j in np.argmax(m, axis=1))] for m in marginals]
        token_scores = [[np.max(m, axis=1).tolist()] for m in marginals]
    elif options.nbest > 1 or options.score:
        best = tagger.predict_kbest(sentences, options.nbest)
        labels = [[path for path, _ in paths] for paths in best]
        sequence_scores = [[score for _, score in paths] for paths in best] if options.score else None
    else:
        labels = [[path] for path in tagger.predict(sentences)]
    seconds = time.perf_counter() - start
    separator = getattr(tagger, "output_separator", None)  # a CRFsuite data file's: a tab
    with open(options.output, "w", encoding="utf-8") if options.output else contextlib.nullcontext(sys.stdout) as out:
        labelled_output.write_labelled(
            file, labels, out, sequence_scores=sequence_scores, token_scores=token_scores, separator=separator
        )
    print(f"* Labelled {len(sentences)} sentences in {seconds:.1f} s", file=sys.stderr)
    if options.check:
        gold = [s.labels for s in sentences]
        predicted = [paths[0] for paths in labels]
        print(f"* Token accuracy {metrics.token_accuracy(gold, predicted):.4f}", file=sys.stderr)
        print(metrics.conlleval_report(gold, predicted), end="", file=sys.stderr)
    return 0
