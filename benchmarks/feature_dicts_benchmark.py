"""Feature dicts: the time from sklearn-crfsuite's `X` (lists of token
feature dicts) to the arrays a model trains on, lossfns against
python-crfsuite (issue 21).

Data: CoNLL-2002 Spanish esp.train (8,323 sentences, 264,715 tokens) with
the sklearn-crfsuite tutorial's own `word2features` (about 5 million
attribute occurrences); building `X` is user code, the same for both, and
is timed apart.

* python-crfsuite `ItemSequence(xseq)` for every sentence: its conversion
  of the dicts alone (C++).
* python-crfsuite `Trainer.append(xseq, yseq)` for every sentence: what
  `sklearn_crfsuite.CRF.fit` does with `X` and `y` before training (its fit
  is this loop, then `train`): the conversion plus CRFsuite's attribute and
  label dictionaries.
* lossfns `flatten_corpus(X)`, `.index()`, label ids and `.pack_rows(...)`:
  the vectorised reading, the feature index and the packed rows
  (`PackedCorpus`, ids and values) that training reads; and, apart, the
  sparse design matrix of those rows (`bucket_design`).
* lossfns per sentence: `item_features` on each sentence, then
  `FeatureIndex.build`, `encode` and `pack_rows` (the extractor path of the
  template pipeline), for comparison.

Variants run interleaved in one process, `repeats` times; medians. Run:

    NLTK_DATA=../shared/nltk_data python -m benchmarks.feature_dicts_benchmark [--repeats 3] [--tag cpu-2core]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import time

from lossfns import corpora
from lossfns.features import FeatureIndex, dicts, pack_rows
from lossfns.features.design import bucket_design

from benchmarks.tutorial_features import word2features

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _timed(function):
    start = time.perf_counter()
    out = function()
    return time.perf_counter() - start, out


def _label_ids(y, labels):
    return [[labels[label] for label in sequence] for sequence in y]


def run(repeats: int = 3, log=print) -> dict:
    import pycrfsuite

    train = corpora.conll2002("esp.train")
    seconds, X = _timed(lambda: [[word2features(s.tokens, i) for i in range(len(s.tokens))] for s in train])
    y = [list(s.labels) for s in train]
    labels = {label: i for i, label in enumerate(sorted({label for s in y for label in s}))}
    occurrences = sum(len(token) for sentence in X for token in sentence)
    log(
        f"esp.train: {len(X)} sentences, {sum(map(len, X))} tokens, {occurrences} feature dict entries; "
        f"word2features {seconds:.2f} s (user code, not counted)"
    )

    def item_sequences():
        return [pycrfsuite.ItemSequence(xseq) for xseq in X]

    def trainer_append():
        trainer = pycrfsuite.Trainer(verbose=False)
        for xseq, yseq in zip(X, y):
            trainer.append(xseq, yseq)
        return trainer

    def lossfns_vectorised():
        corpus = dicts.flatten_corpus(X)
        index = corpus.index()
        return index, corpus.pack_rows(index, _label_ids(y, labels))

    def lossfns_per_sentence():
        features = [dicts.item_features(xseq) for xseq in X]
        index = FeatureIndex.build(features)
        return index, pack_rows([index.encode(f) for f in features], _label_ids(y, labels))

    variants = {
        "python-crfsuite ItemSequence": item_sequences,
        "python-crfsuite Trainer.append (sklearn-crfsuite fit's preprocessing)": trainer_append,
        "lossfns flatten_corpus + index + pack_rows": lossfns_vectorised,
        "lossfns per sentence: item_features + FeatureIndex.build + encode + pack_rows": lossfns_per_sentence,
    }
    times = {name: [] for name in variants}
    design_times = []
    for repeat in range(repeats):
        for name, function in variants.items():
            seconds, out = _timed(function)
            times[name].append(seconds)
            if name.startswith("lossfns flatten_corpus"):
                index, packed = out
                design_seconds, _ = _timed(lambda: bucket_design(packed, index.num_unigram))
                design_times.append(design_seconds)
            del out
        log(f"repeat {repeat + 1}/{repeats}: " + ", ".join(f"{times[n][-1]:.2f} s" for n in variants))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ours = medians["lossfns flatten_corpus + index + pack_rows"]
    result = {
        "task": "CoNLL-2002 esp.train, sklearn-crfsuite tutorial features",
        "sentences": len(X),
        "tokens": sum(map(len, X)),
        "feature_dict_entries": occurrences,
        "attributes": len(lossfns_vectorised()[0].unigram),
        "median_seconds": medians,
        "all_seconds": times,
        "bucket_design_median_seconds": statistics.median(design_times),
        "ratios": {name: medians[name] / ours for name in medians},
        "repeats": repeats,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pycrfsuite": importlib.metadata.version("python-crfsuite"),
        "date": datetime.date.today().isoformat(),
    }
    log("")
    log("| variant | median s | ratio to lossfns vectorised |")
    log("| --- | --- | --- |")
    for name, seconds in medians.items():
        log(f"| {name} | {seconds:.3f} | {seconds / ours:.2f}x |")
    log(f"| lossfns bucket_design of the packed rows (apart) | {result['bucket_design_median_seconds']:.3f} | |")
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tag", default=None, help="write benchmarks/results/feature-dicts-TAG.{json,md}")
    args = parser.parse_args(argv)
    lines = []

    def log(text):
        print(text, flush=True)
        lines.append(text)

    result = run(args.repeats, log)
    if args.tag:
        stem = os.path.join(RESULTS, f"feature-dicts-{args.tag}")
        with open(stem + ".json", "w") as handle:
            json.dump(result, handle, indent=1)
        with open(stem + ".md", "w") as handle:
            handle.write(
                f"# Feature dicts to training arrays ({result['date']}, {result['machine']}, "
                f"{result['cpus']} CPUs)\n\n"
                "`NLTK_DATA=../shared/nltk_data python -m benchmarks.feature_dicts_benchmark "
                f"--repeats {args.repeats} --tag {args.tag}`\n\n" + "\n".join(lines) + "\n"
            )


if __name__ == "__main__":
    main()
