"""CRFsuite's passive-aggressive and AROW on all of CoNLL-2002 Spanish:
`lossfns.sklearn.CRF` against sklearn-crfsuite, one process (issue 45).

The sklearn-crfsuite tutorial's features (`benchmarks.tutorial_features`),
`CRF(algorithm=..., max_iterations=100, all_possible_transitions=True)`, fit
on esp.train, entity F1 (conlleval, `lossfns.metrics`) on esp.testb. Fit wall
time includes reading the feature dicts and, for lossfns, compiling (or
loading) its training program; building `X` is user code, timed apart.

    NLTK_DATA=../shared/nltk_data python -m benchmarks --only margin --tag cpu-2core
"""

from __future__ import annotations

import time

from lossfns import corpora, metrics

from benchmarks.tutorial_features import word2features

ALGORITHMS = ("pa", "arow")
SETTINGS = dict(max_iterations=100, all_possible_transitions=True)


def _features(sentences):
    return [[word2features(s.tokens, i) for i in range(len(s.tokens))] for s in sentences]


def run(quick: bool = False, log=print) -> dict:
    import sklearn_crfsuite

    from lossfns.sklearn import CRF

    train, test = corpora.conll2002("esp.train"), corpora.conll2002("esp.testb")
    if quick:
        train, test = train[:300], test[:100]
    start = time.perf_counter()
    X_train, X_test = _features(train), _features(test)
    featurise = time.perf_counter() - start
    y_train, y_test = [list(s.labels) for s in train], [list(s.labels) for s in test]
    settings = dict(SETTINGS, max_iterations=5) if quick else SETTINGS
    records = []
    for algorithm in ALGORITHMS:
        row: dict = {"algorithm": algorithm}
        for peer, estimator in (("sklearn_crfsuite", sklearn_crfsuite.CRF), ("lossfns", CRF)):
            crf = estimator(algorithm=algorithm, **settings)
            start = time.perf_counter()
            crf.fit(X_train, y_train)
            seconds = time.perf_counter() - start
            f1 = metrics.entity_scores(y_test, crf.predict(X_test)).f1
            iterations = len(crf.training_log_.iterations)
            row[peer] = {"fit_s": seconds, "f1": f1, "iterations": iterations}
            log(f"{algorithm}: {peer} fit {seconds:.2f} s, entity F1 {f1:.4f}, {iterations} iterations")
        row["fit_ratio"] = row["lossfns"]["fit_s"] / row["sklearn_crfsuite"]["fit_s"]
        row["f1_difference"] = row["lossfns"]["f1"] - row["sklearn_crfsuite"]["f1"]
        records.append(row)
    return {
        "train_sentences": len(train),
        "test_sentences": len(test),
        "settings": settings,
        "featurise_s": featurise,
        "records": records,
    }


def markdown(report: dict) -> list:
    lines = [
        "## Passive-aggressive and AROW vs sklearn-crfsuite (CoNLL-2002 Spanish)",
        "",
        f"{report['train_sentences']} esp.train sentences, {report['test_sentences']} esp.testb sentences, the "
        f"sklearn-crfsuite tutorial's features, {report['settings']}. Fit: wall time in one process (lossfns: "
        "compilation or its cache included); F1: conlleval entity F1 on esp.testb.",
        "",
        "| algorithm | sklearn-crfsuite fit s | lossfns fit s | ratio | sklearn-crfsuite F1 | lossfns F1 | difference |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["records"]:
        peer, ours = r["sklearn_crfsuite"], r["lossfns"]
        lines.append(
            f"| {r['algorithm']} | {peer['fit_s']:.2f} | {ours['fit_s']:.2f} | {r['fit_ratio']:.2f}x "
            f"| {peer['f1']:.4f} | {ours['f1']:.4f} | {r['f1_difference']:+.4f} |"
        )
    return [*lines, ""]
