"""A whole L1 training run with label-pair-observation features, sparse
forward-backward against dense (Lavergne et al. 2010, Table 2's question).

conll2000 POS (through `NLTK_DATA`; a planted synthetic corpus when it is
absent): Lavergne's unigram feature set (`lavergne_pos`) plus label-pair x
current-word features (`B01:%x[0,0]`, `f_{y', y, x}`), with only the
(feature, previous label, label) triples seen in training
(`features.observed_label_triples`). The same `LinearChainModel` trains
twice with OWL-QN from zero weights, stopping on the same relative objective
change: once on `SparsePotentials` (the model's own choice for a mask on few
label pairs) and once forced onto the dense per-position form
(`with_pair_mask(..., max_sparse_fraction=0)`). Reported: time to the first
objective and gradient (indexing excluded, compilation included), the
compilation of the whole run, its time and time per iteration (compilation
excluded), final objectives (they must agree), the fraction of zero pair
weights and of label pairs on the sparse support.

    NLTK_DATA=../shared/nltk_data python benchmarks/sparse_training_benchmark.py [--task pos|joint] [--sentences 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from lossfns import corpora, features, losses, optimizers
from lossfns.features import observed_label_triples, parse_templates, preset
from lossfns.models import LinearChainModel

PAIR_TEMPLATES = "B01:%x[0,0]"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def load(num_sentences: int, task: str):
    """Tagged sentences of conll2000 train (`task`: "pos", or "joint" POS|chunk
    labels, up to 319 of them), or a synthetic planted corpus."""
    try:
        if task == "pos":
            sentences = corpora.conll2000("train.txt", task="pos")
        else:
            sentences = [
                corpora.Sentence(
                    tuple((token[0],) for token in s.tokens),
                    tuple(f"{token[1]}|{label}" for token, label in zip(s.tokens, s.labels)),
                )
                for s in corpora.conll2000("train.txt", task="chunk")
            ]
        source = f"conll2000 train.txt ({task})"
    except FileNotFoundError:
        rng = np.random.default_rng(0)
        tags = [f"T{i}" for i in range(12)]
        sentences = [
            corpora.Sentence(
                tuple((f"w{int(w)}",) for w in rng.integers(0, 300, size=n)),
                tuple(tags[int(t)] for t in rng.integers(0, 12, size=n)),
            )
            for n in rng.integers(5, 25, size=num_sentences)
        ]
        source = "synthetic"
    return sentences[:num_sentences], source


def featurise(sentences, num_buckets: int = 3):
    """Padded length buckets (`features.pack`, `features.padded_buckets`), the index and the labels."""
    unigram, pairs = preset("lavergne_pos"), parse_templates(PAIR_TEMPLATES)
    extracted = [unigram(s.tokens)._replace(pair=pairs(s.tokens).pair) for s in sentences]
    index = features.build_index(extracted)
    labels = sorted({label for s in sentences for label in s.labels})
    packed = features.pack([index.encode(f) for f in extracted], features.label_ids(sentences, labels), num_buckets)
    return features.padded_buckets(packed), index, labels


def train(model: LinearChainModel, batches, l1: float, max_steps: int, tol: float):
    """OWL-QN from the model's zero weights through the driver, as one chunk.
    The data and the masks (`model.structure()`) are arguments of the compiled
    programs, never baked into them as constants (XLA would constant-fold the masks)."""
    device = tuple(jax.tree_util.tree_map(jnp.asarray, b) for b in batches), model.structure()

    def loss(weights, data):
        batches, structure = data
        m = model.with_weights(weights, structure)
        return sum(
            jnp.sum(losses.sequence_log_loss(m(b.unigram_ids, b.pair_ids), b.labels, b.lengths)) for b in batches
        )

    began = time.perf_counter()
    jax.block_until_ready(jax.jit(jax.value_and_grad(loss))(model.weights(), device))
    first_objective = time.perf_counter() - began
    result = optimizers.train(
        loss,
        model.weights(),
        optimizers.owlqn(l1=l1),
        device,
        max_steps=max_steps,
        stop=optimizers.relative_change_below(tol),
        chunk_steps=max_steps,
        progress=False,
    )
    steps = int(result.num_steps)
    return {
        "seconds_to_first_objective": first_objective,
        "seconds_compile_run": result.compile_seconds,
        "seconds_run": result.run_seconds,
        "steps": steps,
        "seconds_per_step": result.run_seconds / max(steps, 1),
        "final_objective": float(result.trace[steps - 1]),
        "status": str(result.status),
        "pair_weights_zero_fraction": float(
            np.mean(np.asarray(result.params.pair_emission)[np.asarray(model.pair_mask)] == 0)
        ),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--task", choices=("pos", "joint"), default="pos")
    parser.add_argument("--l1", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args(argv)
    sentences, source = load(args.sentences, args.task)
    began = time.perf_counter()
    batches, index, labels = featurise(sentences)
    indexing = time.perf_counter() - began
    mask = observed_label_triples(batches, index.num_pair, len(labels))
    base = LinearChainModel.zeros(index.num_unigram, len(labels), index.num_pair)
    sparse_model = base.with_pair_mask(mask)
    dense_model = base.with_pair_mask(mask, max_sparse_fraction=0.0)
    support = len(sparse_model.pair_support[0]) if sparse_model.pair_support else None
    report = {
        "source": source,
        "sentences": len(sentences),
        "tokens": int(sum(len(s.labels) for s in sentences)),
        "labels": len(labels),
        "unigram_features": index.num_unigram,
        "pair_features": index.num_pair,
        "seen_triples": int(mask.sum()),
        "support_label_pairs": support,
        "support_fraction_of_label_pairs": None if support is None else support / len(labels) ** 2,
        "indexing_seconds": indexing,
        "l1": args.l1,
        "tol": args.tol,
        "max_steps": args.max_steps,
        "machine": {"cores": os.cpu_count(), "jax": jax.__version__, "devices": [str(d) for d in jax.devices()]},
    }
    for name, model in (("sparse", sparse_model), ("dense", dense_model)):
        report[name] = train(model, batches, args.l1, args.max_steps, args.tol)
        print(name, json.dumps(report[name]))
    report["dense_over_sparse_run_time"] = report["dense"]["seconds_run"] / report["sparse"]["seconds_run"]
    report["dense_over_sparse_per_step"] = report["dense"]["seconds_per_step"] / report["sparse"]["seconds_per_step"]
    report["final_objective_relative_difference"] = abs(
        report["sparse"]["final_objective"] - report["dense"]["final_objective"]
    ) / abs(report["dense"]["final_objective"])
    print(json.dumps({k: v for k, v in report.items() if k not in ("sparse", "dense")}, indent=2))
    os.makedirs(RESULTS, exist_ok=True)
    stem = os.path.join(RESULTS, f"sparse-training-{args.task}-{args.tag}")
    with open(stem + ".json", "w") as out:
        json.dump(report, out, indent=2)
    print(f"wrote {stem}.json")


if __name__ == "__main__":
    main()
