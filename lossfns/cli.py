"""The `lossfns` command line: train and apply a CRF tagger on CoNLL column
files, with Wapiti's conventions (its option letters, CRF++/Wapiti pattern
files, its labelled output).

    lossfns train -p examples/ner.pattern esp.train ner.model
    lossfns label -m ner.model --check esp.testb labelled.txt

`train` reads a column file (tokens one per line, columns separated by
spaces or tabs, the label last, blank lines between sentences,
`-DOCSTART-` lines ignored), extracts the pattern's features, trains a
`Tagger` (OWL-QN, or L-BFGS when `-1 0`, on `sum_i loss_i + rho1 ||w||_1 +
rho2 / 2 ||w||^2`, Wapiti's objective) with a progress bar and the
objective after each iteration on stderr, and writes the model file.
`label` writes each input line with the predicted label appended as a last
column (`labelled_output`); `--check` reads the last column as the gold
label and prints token accuracy and conlleval's per-type precision,
recall and F1 (`metrics.conlleval_report`) on stderr.

Everything is the library's public pieces (`corpora`, `features.templates`,
`Tagger`, `labelled_output`, `metrics`); this module only parses options.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from . import corpora, labelled_output, losses, metrics
from .features.templates import read_templates
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
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
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
    label = modes.add_parser("label", help="label a column file with a trained model")
    label.add_argument("-m", "--model", required=True, help="model file written by `lossfns train`")
    label.add_argument(
        "-c",
        "--check",
        action="store_true",
        help="the input's last column is the gold label: print accuracy and per-type P/R/F1",
    )
    label.add_argument("-n", "--nbest", type=_positive_int, default=1, help="write the N best label sequences")
    label.add_argument("-s", "--score", action="store_true", help="write each sequence's log-probability")
    label.add_argument(
        "-p",
        "--post",
        action="store_true",
        help="posterior decoding: each token's most probable label and its probability",
    )
    label.add_argument("input", metavar="INPUT", help="column file to label")
    label.add_argument("output", metavar="OUTPUT", nargs="?", help="output file (default: standard output)")
    label.set_defaults(parser=label)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` (default `sys.argv[1:]`); 0 on success."""
    options = parser().parse_args(argv)
    return _train(options) if options.mode == "train" else _label(options)


def _error(message: str) -> int:
    print(f"lossfns: error: {message}", file=sys.stderr)
    return 2


def _train(options) -> int:
    if options.algo not in TRAINED:
        options.parser.error(
            f"argument -a/--algo: {options.algo} is not trained from the command line yet; "
            f"use one of {', '.join(TRAINED)}"
        )
    if options.algo == "lbfgs" and options.rho1 > 0:
        options.parser.error(
            f"argument -a/--algo: lbfgs trains without L1: give -1 0 (got -1 {options.rho1}), or use -a owlqn"
        )
    try:
        sentences = corpora.read_conll(options.input)
        templates = read_templates(options.pattern, dialect=options.dialect)
        devel = corpora.read_conll(options.devel) if options.devel else None
    except (OSError, ValueError) as problem:
        return _error(str(problem))
    if not sentences:
        return _error(f"{options.input} holds no sentence")
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
    if options.post and (options.nbest > 1 or options.score):
        options.parser.error(
            "argument -p/--post: posterior decoding gives one labelling per sentence, with "
            "token probabilities: it cannot be combined with --nbest > 1 or --score"
        )
    try:
        tagger = Tagger.load(options.model)
        file = corpora.read_column_file(options.input, labelled=options.check)
    except (OSError, ValueError) as problem:
        return _error(str(problem))
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
    if options.output:
        with open(options.output, "w", encoding="utf-8") as out:
            labelled_output.write_labelled(
                file, labels, out, sequence_scores=sequence_scores, token_scores=token_scores
            )
    else:
        labelled_output.write_labelled(
            file, labels, sys.stdout, sequence_scores=sequence_scores, token_scores=token_scores
        )
    print(f"* Labelled {len(sentences)} sentences in {seconds:.1f} s", file=sys.stderr)
    if options.check:
        gold = [s.labels for s in sentences]
        predicted = [paths[0] for paths in labels]
        print(f"* Token accuracy {metrics.token_accuracy(gold, predicted):.4f}", file=sys.stderr)
        print(metrics.conlleval_report(gold, predicted), end="", file=sys.stderr)
    return 0
