"""sklearn-crfsuite's tutorial, run with `sklearn_crfsuite.CRF` and with
`lossfns.sklearn.CRF` in one process (issue 21).

CoNLL-2002 Spanish: fit on esp.train, evaluate on esp.testb, with the
tutorial's own `word2features` (`benchmarks.feature_dicts_benchmark`) and
settings: `CRF(algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=100,
all_possible_transitions=True)`. Reported for both: entity F1 (conlleval,
`lossfns.metrics`), fit wall time (reading the feature dicts included;
building `X` is user code, the same for both, timed apart), predict time,
the marginals' differences, model file size (`size_`) and the time to load
the model file and tag the first sentence. lossfns' fit time includes
compiling its training program (time to first result); its compile time is
also given apart.

    NLTK_DATA=../shared/nltk_data python -m benchmarks --only sklearn --tag cpu-2core
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from lossfns import corpora, crfsuite_model, metrics

from benchmarks.tutorial_features import word2features

SETTINGS = dict(algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=100, all_possible_transitions=True)


def _timed(function):
    start = time.perf_counter()
    out = function()
    return time.perf_counter() - start, out


def _features(sentences):
    return [[word2features(s.tokens, i) for i in range(len(s.tokens))] for s in sentences]


def _load_and_tag(open_file, estimator, path, xseq):
    """Seconds to read a model file (`open_file`), and for a new estimator
    on it (`model_filename`) to tag its first sentence."""
    seconds, _ = _timed(lambda: open_file(path))
    first, _ = _timed(lambda: estimator(model_filename=path).predict_single(xseq))
    return seconds, first


def _model_files_both_ways(estimator, pycrfsuite, directory: str, X_test, lossfns_labels, log) -> dict:
    """CRFsuite's model of the training set (written by sklearn-crfsuite)
    opened by lossfns, and lossfns' (written in CRFsuite's format by its
    `fit`) opened by pycrfsuite: the tokens of `X_test` labelled differently
    by the two readers of each file, and for CRFsuite's model the largest
    difference of the marginals."""
    tagger = pycrfsuite.Tagger()
    tagger.open(os.path.join(directory, "sklearn-crfsuite.model"))
    crfsuite = estimator(model_filename=os.path.join(directory, "sklearn-crfsuite.model"))
    ours = crfsuite.predict(X_test)
    theirs, largest = [], 0.0
    for xseq, sentence in zip(X_test, crfsuite.predict_marginals(X_test)):
        theirs.append(tagger.tag(xseq))
        tagger.set(xseq)
        for t, token in enumerate(sentence):
            largest = max(largest, *(abs(p - tagger.marginal(label, t)) for label, p in token.items()))
    exported = pycrfsuite.Tagger()
    exported.open(os.path.join(directory, "lossfns.model"))
    in_pycrfsuite = [exported.tag(xseq) for xseq in X_test]
    tokens = sum(map(len, X_test))
    differ = lambda a, b: sum(x != y for p, q in zip(a, b) for x, y in zip(p, q))
    report = {
        "tokens": tokens,
        "crfsuite_model_labels_differing": differ(ours, theirs),
        "crfsuite_model_marginals_max_abs_difference": largest,
        "lossfns_model_labels_differing_in_pycrfsuite": differ(lossfns_labels, in_pycrfsuite),
    }
    log(
        f"model files: CRFsuite's model in lossfns, {report['crfsuite_model_labels_differing']} of {tokens} "
        f"tokens labelled differently, marginals max |difference| {largest:.1e}; lossfns' model in pycrfsuite, "
        f"{report['lossfns_model_labels_differing_in_pycrfsuite']} tokens labelled differently"
    )
    return report


def run(quick: bool = False, log=print) -> dict:
    import pycrfsuite
    import sklearn_crfsuite

    from lossfns.sklearn import CRF

    train, test = corpora.conll2002("esp.train"), corpora.conll2002("esp.testb")
    if quick:
        train, test = train[:300], test[:100]
    seconds, (X_train, X_test) = _timed(lambda: (_features(train), _features(test)))
    y_train, y_test = [list(s.labels) for s in train], [list(s.labels) for s in test]
    log(f"esp.train {len(X_train)} sentences, esp.testb {len(X_test)}; word2features {seconds:.2f} s (user code)")
    settings = dict(SETTINGS, max_iterations=10) if quick else SETTINGS
    result = {"task": "CoNLL-2002 esp.train -> esp.testb, sklearn-crfsuite tutorial", "settings": settings}
    marginals, predictions = {}, {}
    with tempfile.TemporaryDirectory() as directory:
        for name, estimator in (("sklearn-crfsuite", sklearn_crfsuite.CRF), ("lossfns", CRF)):
            path = os.path.join(directory, name + ".model")
            fit_seconds, crf = _timed(lambda: estimator(**settings, model_filename=path).fit(X_train, y_train))
            predict_seconds, predicted = _timed(lambda: crf.predict(X_test))
            predictions[name] = predicted
            scores = metrics.entity_scores(y_test, predicted)
            marginals[name] = np.array(
                [
                    [token[label] for label in sorted(crf.classes_)]
                    for sentence in crf.predict_marginals(X_test[:500])
                    for token in sentence
                ]
            )
            # Both estimators write CRFsuite's format (`model_filename`); lossfns reads it with `crfsuite_model`.
            open_file = crfsuite_model.read if name == "lossfns" else lambda p: pycrfsuite.Tagger().open(p)
            load_seconds, first_seconds = _load_and_tag(open_file, estimator, path, X_test[0])
            extra = {"iterations": len(crf.training_log_.iterations)}
            if name == "lossfns":
                extra["training_seconds_compile_and_iterations"] = crf.training_log_.seconds
            result[name] = {
                "fit_seconds": fit_seconds,
                "predict_seconds": predict_seconds,
                "f1": scores.f1,
                "precision": scores.precision,
                "recall": scores.recall,
                "token_accuracy": metrics.token_accuracy(y_test, predicted),
                "model_file_bytes": os.path.getsize(path),
                "size_": crf.size_,
                "load_seconds": load_seconds,
                "load_and_tag_one_seconds": first_seconds,
                **extra,
            }
            log(
                f"{name}: fit {fit_seconds:.1f} s, predict {predict_seconds:.1f} s, F1 {scores.f1:.4f}, "
                f"model {os.path.getsize(path) / 1e6:.2f} MB, load {load_seconds:.3f} s"
            )
        result["model_files"] = _model_files_both_ways(CRF, pycrfsuite, directory, X_test, predictions["lossfns"], log)
    difference = np.abs(marginals["lossfns"] - marginals["sklearn-crfsuite"])
    ours, theirs = result["lossfns"], result["sklearn-crfsuite"]
    result["marginals_abs_difference"] = {
        "mean": float(difference.mean()),
        "p99": float(np.quantile(difference, 0.99)),
        "max": float(difference.max()),
        "tokens": int(difference.shape[0]),
    }
    result["ratios"] = {
        "fit_time_sklearn_crfsuite_over_lossfns": theirs["fit_seconds"] / ours["fit_seconds"],
        "f1_lossfns_minus_sklearn_crfsuite": ours["f1"] - theirs["f1"],
        "model_bytes_lossfns_over_crfsuite": ours["model_file_bytes"] / theirs["model_file_bytes"],
    }
    log(
        f"fit time sklearn-crfsuite / lossfns: {result['ratios']['fit_time_sklearn_crfsuite_over_lossfns']:.2f}x; "
        f"F1 difference {result['ratios']['f1_lossfns_minus_sklearn_crfsuite']:+.4f}; model bytes ratio "
        f"{result['ratios']['model_bytes_lossfns_over_crfsuite']:.2f}; marginals |diff| mean "
        f"{result['marginals_abs_difference']['mean']:.4f}, max {result['marginals_abs_difference']['max']:.3f}"
    )
    return result


def markdown(result: dict) -> list:
    """Markdown lines of `run`'s result."""
    ours, theirs, ratios = result["lossfns"], result["sklearn-crfsuite"], result["ratios"]
    lines = [
        "## sklearn-crfsuite's tutorial: sklearn_crfsuite.CRF vs lossfns.sklearn.CRF",
        "",
        f"Settings {result['settings']}.",
        "",
        "| | fit s (features included) | predict s | entity F1 | token accuracy | model file bytes | load s "
        "| load + tag one sentence s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in (("sklearn-crfsuite", theirs), ("lossfns", ours)):
        lines.append(
            f"| {name} | {row['fit_seconds']:.1f} | {row['predict_seconds']:.2f} | {row['f1']:.4f} | "
            f"{row['token_accuracy']:.4f} | {row['model_file_bytes']:,} | {row['load_seconds']:.3f} | "
            f"{row['load_and_tag_one_seconds']:.3f} |"
        )
    m = result["marginals_abs_difference"]
    lines += [
        "",
        f"Fit time sklearn-crfsuite / lossfns: {ratios['fit_time_sklearn_crfsuite_over_lossfns']:.2f}x "
        f"(lossfns compile + iterations {ours['training_seconds_compile_and_iterations']:.1f} s); "
        f"F1 difference {ratios['f1_lossfns_minus_sklearn_crfsuite']:+.4f}; model bytes lossfns / CRFsuite "
        f"{ratios['model_bytes_lossfns_over_crfsuite']:.2f}; marginals |difference| over "
        f"{m['tokens']} tokens: mean {m['mean']:.4f}, p99 {m['p99']:.4f}, max {m['max']:.3f}.",
        "",
    ]
    files = result.get("model_files")
    if files:
        lines += [
            f"Model files both ways, over the {files['tokens']} test tokens: sklearn-crfsuite's (CRFsuite's) "
            f"model opened by lossfns labels {files['crfsuite_model_labels_differing']} tokens differently from "
            f"pycrfsuite, marginals max |difference| {files['crfsuite_model_marginals_max_abs_difference']:.1e}; "
            f"lossfns' model, written in CRFsuite's format, labels "
            f"{files['lossfns_model_labels_differing_in_pycrfsuite']} tokens differently in pycrfsuite.",
            "",
        ]
    return lines
