"""Rounds per second of the library's sequence boosting on the full
training sets of `experiments.altun2003` (NER esp.train at S1-S3, conll2000
POS at S1-S2), cut into pieces of 8 tokens as Altun et al. do: the cost that
decides whether converged runs are feasible. No peer implements sequence
boosting; the numbers are the library's alone. Reports the time to build
the sparse layout and to the first round (statistics and compilation)
apart from the steady state.

    NLTK_DATA=... python -m benchmarks.boosting_rounds [--rounds 300] [--out benchmarks/results/NAME.md]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from lossfns.training import boost, chain_boosting_data, sequence_pieces

from experiments import tagging

CASES = (("ner", "S1"), ("ner", "S3"), ("pos", "S1"), ("pos", "S2"))
PIECE_LENGTH = 8


def measure(task: str, set_name: str, rounds: int) -> dict:
    data = tagging.load_task(task, None, None)
    encoded = tagging.encode_task(data, (set_name,), 6)
    buckets = encoded.train[set_name]
    start = time.perf_counter()
    pieces = sequence_pieces(
        [np.asarray(b.ids) for b in buckets],
        [np.asarray(b.labels) for b in buckets],
        [np.asarray(b.lengths) for b in buckets],
        PIECE_LENGTH,
    )
    sparse = chain_boosting_data(*pieces, encoded.num_features, len(data.labels))
    build = time.perf_counter() - start
    run = boost(sparse, max_steps=rounds, tol=0.0, chunk_rounds=rounds)
    done = int(run.num_steps)
    return {
        "task": task,
        "features": set_name,
        "sentences": len(data.train),
        "pieces": len(pieces[2]),
        "labels": len(data.labels),
        "weak_learners": sparse.num_weak_learners,
        "build_seconds": build,
        "setup_seconds": run.compile_seconds,
        "rounds": done,
        "rounds_per_second": done / run.run_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--cases", default=",".join(f"{t}:{s}" for t, s in CASES))
    parser.add_argument("--out", default=None)
    arguments = parser.parse_args()
    lines = [
        f"Sequence boosting rounds per second ({platform.machine()}, {platform.processor() or 'cpu'}; "
        f"{arguments.rounds} rounds; pieces of {PIECE_LENGTH} tokens)",
        "",
        "| task | features | sentences | pieces | labels | weak learners | build (s) | to first round (s) | rounds/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for case in arguments.cases.split(","):
        task, set_name = case.split(":")
        r = measure(task, set_name, arguments.rounds)
        line = (
            f"| {r['task']} | {r['features']} | {r['sentences']} | {r['pieces']} | {r['labels']} | "
            f"{r['weak_learners']} | {r['build_seconds']:.1f} | {r['setup_seconds']:.1f} | "
            f"{r['rounds_per_second']:.1f} |"
        )
        print(line, flush=True)
        lines.append(line)
    if arguments.out:
        with open(arguments.out, "w") as stream:
            stream.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
