"""Everyday calls, each in a fresh process, as a new user runs them: fit,
predict and a randomized search with `lossfns.sklearn.CRF` against
sklearn-crfsuite on 500 CoNLL-2002 Spanish training sentences with the
sklearn-crfsuite tutorial's features (issue 44).

Each step is a new Python process (imports, feature reading, compilation
or its cache, the work); its wall time is measured from outside. lossfns
runs once on an empty compilation cache (time to first result on a fresh
machine) and then on the warm cache (every later run).

    NLTK_DATA=../shared/nltk_data python -m benchmarks --only everyday --tag cpu-2core
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

TRAIN_SENTENCES = 500
SETTINGS = dict(algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=100, all_possible_transitions=True)
SEARCH = dict(n_iter=4, cv=3, random_state=0)
STEPS = ("fit", "predict", "search")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data(part: str, count: int | None = None):
    from lossfns import corpora

    from benchmarks.tutorial_features import word2features

    sentences = corpora.conll2002(part)[:count]
    X = [[word2features(s.tokens, i) for i in range(len(s.tokens))] for s in sentences]
    return X, [list(s.labels) for s in sentences]


def _estimator(peer: str):
    if peer == "sklearn-crfsuite":
        from sklearn_crfsuite import CRF
    else:
        from lossfns.sklearn import CRF
    return CRF


def run_step(step: str, peer: str, directory: str) -> dict:
    """One step in this process: `fit` (writes the pickled model to
    `directory`), `predict` (esp.testb with that model), `search` (3-fold
    RandomizedSearchCV over 4 (c1, c2) candidates, refit included)."""
    model = os.path.join(directory, f"{peer}.pickle")
    if step == "fit":
        X, y = _data("esp.train", TRAIN_SENTENCES)
        crf = _estimator(peer)(**SETTINGS).fit(X, y)
        with open(model, "wb") as file:
            pickle.dump(crf, file)
        return {"iterations": len(crf.training_log_.iterations) if peer == "lossfns" else None}
    if step == "predict":
        X, y = _data("esp.testb")
        with open(model, "rb") as file:
            crf = pickle.load(file)
        predicted = crf.predict(X)
        from lossfns import metrics

        return {"f1": metrics.entity_scores(y, predicted).f1, "tokens": sum(map(len, X))}
    from sklearn.metrics import make_scorer
    from sklearn.model_selection import RandomizedSearchCV

    from lossfns import metrics

    X, y = _data("esp.train", TRAIN_SENTENCES)
    candidates = {"c1": [0.05, 0.1, 0.2, 0.4], "c2": [0.01, 0.05, 0.1, 0.2]}
    scorer = make_scorer(lambda truth, predicted: metrics.entity_scores(truth, predicted).f1)
    search = RandomizedSearchCV(_estimator(peer)(**SETTINGS), candidates, scoring=scorer, **SEARCH)
    search.fit(X, y)
    return {"best_params": search.best_params_, "best_score": float(search.best_score_)}


def _timed_process(step: str, peer: str, directory: str, environment: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.everyday_benchmark", "--step", step, "--peer", peer, "--dir", directory],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
        cwd=ROOT,  # the checkout whose lossfns and benchmarks are measured
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{peer} {step} failed:\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False, log=print, repeats: int = 3) -> dict:
    """Each step for each peer in fresh processes: lossfns on an empty cache
    first (`cold`), then `repeats` warm runs interleaved with the peer's."""
    repeats = 1 if quick else repeats
    records = []
    with tempfile.TemporaryDirectory() as directory:
        environment = dict(os.environ, LOSSFNS_CACHE_DIR=os.path.join(directory, "cache"))
        # A user's Python caches bytecode (pip compiles it at install): without it each process recompiles lossfns.
        environment.pop("PYTHONDONTWRITEBYTECODE", None)
        for step in STEPS:
            cold, details = _timed_process(step, "lossfns", directory, environment)
            log(f"{step}: lossfns on an empty cache {cold:.2f} s {details}")
            times: dict = {"sklearn-crfsuite": [], "lossfns": []}
            for _ in range(repeats):
                for peer in times:
                    seconds, details = _timed_process(step, peer, directory, environment)
                    times[peer].append(seconds)
                    log(f"{step}: {peer} {seconds:.2f} s {details}")
            peer, ours = statistics.median(times["sklearn-crfsuite"]), statistics.median(times["lossfns"])
            records.append(
                {
                    "step": step,
                    "sklearn_crfsuite_s": peer,
                    "lossfns_warm_s": ours,
                    "lossfns_cold_s": cold,
                    "warm_ratio": ours / peer,
                    "cold_ratio": cold / peer,
                    "all_s": times,
                }
            )
    return {"train_sentences": TRAIN_SENTENCES, "settings": SETTINGS, "search": SEARCH, "records": records}


def markdown(report: dict) -> list:
    lines = [
        "## Everyday calls, each in a fresh process, vs sklearn-crfsuite",
        "",
        f"{report['train_sentences']} CoNLL-2002 esp.train sentences, the sklearn-crfsuite tutorial's features, "
        f"{report['settings']}; predict: esp.testb with the pickled model; search: RandomizedSearchCV "
        f"{report['search']} over c1, c2 (refit included). Wall time of the whole process (imports included); "
        "medians of interleaved runs.",
        "",
        "| step | sklearn-crfsuite s | lossfns s (warm cache) | ratio | lossfns s (empty cache) | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in report["records"]:
        lines.append(
            f"| {r['step']} | {r['sklearn_crfsuite_s']:.2f} | {r['lossfns_warm_s']:.2f} | {r['warm_ratio']:.2f}x "
            f"| {r['lossfns_cold_s']:.2f} | {r['cold_ratio']:.2f}x |"
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", choices=STEPS, required=True)
    parser.add_argument("--peer", choices=("lossfns", "sklearn-crfsuite"), required=True)
    parser.add_argument("--dir", required=True)
    arguments = parser.parse_args()
    print(json.dumps(run_step(arguments.step, arguments.peer, arguments.dir)))


if __name__ == "__main__":
    main()
