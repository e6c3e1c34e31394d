"""python-crfsuite vs the lossfns Tagger on the same features, same objective.

    NLTK_DATA=/path/to/nltk_data python -m experiments.crfsuite_comparison            # NER, CoNLL-2002 Spanish
    NLTK_DATA=/path/to/nltk_data python -m experiments.crfsuite_comparison --task pos  # POS, CoNLL-2000

Both train `-sum_i log p(y_i | x_i) + c1 ||w||_1 + c2 ||w||^2` (CRFsuite's
scaling: the log-likelihood is a sum over sentences) by OWL-QN, with state
features only for the (attribute, label) pairs seen in training (CRFsuite's
default), from the identical observation strings (the `crfsuite_ner` or
`lavergne_pos` preset). Prints test scores, training times (lossfns includes
its compilation), their ratio and the number of non-zero weights.
Needs python-crfsuite (`pip install -e .[benchmarks]`).
"""

from __future__ import annotations

import argparse
import time

from lossfns import corpora, metrics
from lossfns.features import preset
from lossfns.tagger import Tagger, crfsuite_elastic_net

TASKS = {
    "ner": {
        "preset": "crfsuite_ner",
        "train": lambda: corpora.conll2002("esp.train"),
        "tests": {
            "esp.testb": lambda: corpora.conll2002("esp.testb"),
            "esp.testa": lambda: corpora.conll2002("esp.testa"),
        },
    },
    "pos": {
        "preset": "lavergne_pos",
        "train": lambda: corpora.conll2000("train.txt", task="pos"),
        "tests": {"test.txt": lambda: corpora.conll2000("test.txt", task="pos")},
    },
}


def train_crfsuite(sentences, extractor, params: dict, path, algorithm: str = "lbfgs"):
    """Train python-crfsuite's `algorithm` with `params` (CRFsuite's names:
    `c1`, `c2`, `max_iterations`, ...) on the preset's strings; returns
    `(tagger, seconds, non-zero weights, iterations)`, `iterations` CRFsuite's
    log of each (`loss` the objective)."""
    import pycrfsuite

    # Timed from the sentences, as the Tagger's fit is: feature extraction and
    # CRFsuite's own data loading (`append` interns the attribute strings) included.
    start = time.perf_counter()
    trainer = pycrfsuite.Trainer(algorithm=algorithm, verbose=False)
    for sentence in sentences:
        trainer.append(extractor(sentence.tokens).unigram, list(sentence.labels))
    trainer.set_params(params)
    trainer.train(path)
    seconds = time.perf_counter() - start
    tagger = pycrfsuite.Tagger()
    tagger.open(path)
    info = tagger.info()
    # CRFsuite writes only the features with non-zero weights to the model file.
    nonzero = sum(1 for w in info.state_features.values() if w != 0) + sum(
        1 for w in info.transitions.values() if w != 0
    )
    return tagger, seconds, nonzero, trainer.logparser.iterations


def scores(gold, predicted):
    entity = metrics.entity_scores(gold, predicted)
    return {"token_accuracy": metrics.token_accuracy(gold, predicted), "f1": entity.f1}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASKS), default="ner")
    parser.add_argument("--c1", type=float, default=0.1)
    parser.add_argument("--c2", type=float, default=0.1)
    parser.add_argument("--max-iterations", type=int, default=100)
    parser.add_argument("--train-limit", type=int, default=None, help="use only the first N training sentences")
    parser.add_argument("--model-path", default="/tmp/crfsuite_comparison.crfsuite")
    args = parser.parse_args(argv)

    task = TASKS[args.task]
    train = task["train"]()[: args.train_limit]
    tests = {name: load() for name, load in task["tests"].items()}
    extractor = preset(task["preset"])
    print(
        f"task {args.task}: {len(train)} training sentences, preset {task['preset']}, "
        f"c1 = {args.c1}, c2 = {args.c2}, at most {args.max_iterations} iterations"
    )

    crfsuite_tagger, crfsuite_seconds, crfsuite_nonzero, _ = train_crfsuite(
        train, extractor, {"c1": args.c1, "c2": args.c2, "max_iterations": args.max_iterations}, args.model_path
    )
    start = time.perf_counter()
    tagger = Tagger(extractor, **crfsuite_elastic_net(args.c1, args.c2), max_iterations=args.max_iterations)
    tagger.fit(train)
    lossfns_seconds = time.perf_counter() - start

    key = "f1" if args.task == "ner" else "token_accuracy"
    for name, sentences in tests.items():
        gold = [s.labels for s in sentences]
        ours = scores(gold, tagger.predict(sentences))
        theirs = scores(gold, [tuple(crfsuite_tagger.tag(extractor(s.tokens).unigram)) for s in sentences])
        print(
            f"{name}: {key} crfsuite {theirs[key]:.4f}  lossfns {ours[key]:.4f}  "
            f"(token accuracy crfsuite {theirs['token_accuracy']:.4f}, lossfns {ours['token_accuracy']:.4f})"
        )
        if args.task == "ner":
            # The Tagger decodes only valid IOB2 sequences by default; CRFsuite cannot.
            tagger.iob_constraints = False
            free = scores(gold, tagger.predict(sentences))
            tagger.iob_constraints = None
            print(
                f"{name}: lossfns without IOB2 decoding constraints: f1 {free['f1']:.4f}  "
                f"token accuracy {free['token_accuracy']:.4f}"
            )
    print(
        f"training seconds: crfsuite {crfsuite_seconds:.1f}  lossfns {lossfns_seconds:.1f} "
        f"(of which optimisation loop {tagger.training_seconds:.1f})  ratio lossfns/crfsuite "
        f"{lossfns_seconds / crfsuite_seconds:.2f}"
    )
    print(
        f"non-zero weights: crfsuite {crfsuite_nonzero}  lossfns {tagger.model.num_nonzero()}  "
        f"ratio {tagger.model.num_nonzero() / max(crfsuite_nonzero, 1):.3f}"
    )
    print(f"lossfns iterations: {len(tagger.history)}, final objective {tagger.history[-1]:.2f}")


if __name__ == "__main__":
    main()
