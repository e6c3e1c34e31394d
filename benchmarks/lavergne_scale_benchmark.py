"""Lavergne et al. (2010) at full scale: what one epoch, sweep or start costs.

On all 8,936 sentences of conll2000's train.txt with Lavergne's POS feature
set (`experiments.lavergne2010`'s `lavergne_pos`, the experiment's encoding),
one part per run (each in its own process, so that its peak memory is its own):

* `sgd`: one epoch of SGD-L1, dense (`optimizers.sgd_l1`: every weight at
  every step) against lazy (`optimizers.lazy_sgd_l1`: the rows a minibatch
  uses), the same minibatches; the lazy epoch also with every step at the
  corpus's padded width (`length_tiers=()`, the default) against widths
  16, 32, 64 (`length_tiers=None`). The dense epoch is timed on the first
  `--dense-sentences` sentences (same feature index, so the same O(K) step)
  and extrapolated to the whole set, stated as such; the lazy epoch runs
  whole. The full objective after the epoch is timed apart.
* `bcd`: the plan (`training.bcd_data`) and one sweep of `training.bcd`,
  with the chain cells the sweep runs.
* `startup`: the Tagger's path with `lavergne_pos` on the 319 joint
  POS|chunk labels of train.txt: time to the first iteration (features,
  indexing, packing, the model and its masks, compilation), to the end of
  the first (one OWL-QN iteration), and the process's peak memory.
* `probe`: one full-scale unit of the experiment (`--task`, `--optimizer`;
  `OWL-QN`, `SGD-L1`, `BCD`, or `sparse`/`dense` on the `sparse` task) run
  through the experiment's own unit (`chain_unit`, `forward_backward_unit`:
  the same model, packing, checkpoints and evaluation) with its caps cut to
  `--iterations`, in a temporary run directory: seconds per iteration
  (epoch, sweep) at steady state, setup and compilation, and the process's
  peak memory; a watchdog ends the process past `--limit-gib` (the machine
  is shared). `--all` runs every probe, one process after another, and
  writes them to one file (`experiments.lavergne2010` reads it for its
  wall-time estimates).
* `sgd-gap`: on the first `--sentences` sentences (default 1,000) of the
  `pos` and `pairs` tasks, OWL-QN and SGD-L1 (the calibrated rate, then each
  of `--rates`) to the experiment's stop rules, no fine-tuning: the final
  objectives side by side (SGD-L1's over OWL-QN's), test error and active
  features. It shows at small scale the full pairs run's gap (SGD-L1 stops
  far above OWL-QN's objective with the pair features, not without them).

    NLTK_DATA=../shared/nltk_data python -m benchmarks.lavergne_scale_benchmark --part sgd
    NLTK_DATA=../shared/nltk_data python -m benchmarks.lavergne_scale_benchmark --part probe --all
    NLTK_DATA=../shared/nltk_data python -m benchmarks.lavergne_scale_benchmark --part sgd-gap --sentences 1000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from lossfns import corpora, features, models, optimizers, training
from lossfns.models import LinearChainModel

from experiments import lavergne2010
from experiments.harness import RunDirectory

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
RATE = 1e-5  # per-example rate; timing only (the experiment calibrates it)


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _timed(fn, *args):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def _compiled(fn, *args):
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def _pos_task(sentences=None):
    start = time.perf_counter()
    data = lavergne2010.load("pos", dict(num_train=sentences, num_test=10))
    encoded = lavergne2010.encode(data, lavergne2010.Extractor("lavergne_pos"), 1)
    return data, encoded, time.perf_counter() - start


def _subset(batch, count):
    return jax.tree_util.tree_map(lambda x: x[:count], batch)


def sgd_part(batch_sizes, dense_sentences: int, sentences=None, log=print) -> dict:
    data, encoded, index_seconds = _pos_task(sentences)
    stacked, L = encoded.stacked, len(data.labels)
    N = int(stacked.lengths.shape[0])
    model = LinearChainModel.zeros(encoded.num_unigram, L, encoded.num_pair)
    penalty = optimizers.elastic_net_penalty(lavergne2010.L1, lavergne2010.L2)
    objective = lambda m, d: models.batch_loss(m, d) + penalty(m)
    log(
        f"conll2000 POS: {N} sentences, {encoded.num_unigram} observation tests, {L} labels, "
        f"{model.emission.size + L * L + L} weights; indexing {index_seconds:.1f} s"
    )
    full_objective, objective_compile = _compiled(objective, model, stacked)
    _, objective_seconds = _timed(full_objective, model, stacked)
    records = []
    key = jax.random.PRNGKey(0)
    for batch_size in batch_sizes:
        row = {"batch_size": batch_size, "steps_per_epoch": N // batch_size}
        lazy = optimizers.lazy_sgd_l1(RATE, lavergne2010.L1, lavergne2010.L2)
        max_rows = training.max_rows_per_batch(stacked, batch_size)
        inner = (model, lazy.init(model), key)
        # Default length tiers (each step on the narrowest width that holds its
        # sentences) against every step at the corpus's padded width.
        for tiers, prefix in ((None, "lazy"), ((), "lazy_whole_width")):
            lazy_epoch = lambda inner, d, tiers=tiers: training.lazy_epoch_step_fn(
                models.batch_loss, lazy, d, batch_size=batch_size, max_rows=max_rows, length_tiers=tiers
            )(inner, jnp.int32(0))
            compiled, row[f"{prefix}_compile_s"] = _compiled(lazy_epoch, inner, stacked)
            (_, value), seconds = _timed(compiled, inner, stacked)
            row[f"{prefix}_epoch_s"] = seconds - objective_seconds
            row[f"{prefix}_objective"] = float(value)
            log(
                f"  batch {batch_size}: {prefix.replace('_', ' ')} epoch {row[f'{prefix}_epoch_s']:.1f} s "
                f"(+ {objective_seconds:.1f} s objective; compile {row[f'{prefix}_compile_s']:.1f} s), "
                f"rows per step <= {max_rows}"
            )
        row["length_tiers_speedup"] = row["lazy_whole_width_epoch_s"] / row["lazy_epoch_s"]
        log(f"  batch {batch_size}: length tiers {row['length_tiers_speedup']:.2f}x faster than the whole width")
        subset = _subset(stacked, max(batch_size, min(dense_sentences, N)))
        part = int(subset.lengths.shape[0])
        dense = optimizers.sgd_l1(RATE, lavergne2010.L1, lavergne2010.L2)
        dense_epoch = lambda inner, d: optimizers.epoch_step_fn(models.batch_loss, dense, d, batch_size=batch_size)(
            inner, jnp.int32(0)
        )
        inner = (model, dense.init(model), key)
        compiled, row["dense_compile_s"] = _compiled(dense_epoch, inner, subset)
        _, seconds = _timed(compiled, inner, subset)
        part_objective, _ = _compiled(models.batch_loss, model, subset)
        _, subset_objective = _timed(part_objective, model, subset)
        per_step = (seconds - subset_objective) / (part // batch_size)
        row.update(
            dense_sentences=part,
            dense_step_s=per_step,
            dense_epoch_s=per_step * (N // batch_size),
            lazy_step_s=row["lazy_epoch_s"] / (N // batch_size),
        )
        row["speedup"] = row["dense_epoch_s"] / row["lazy_epoch_s"]
        log(
            f"  batch {batch_size}: dense {1e3 * per_step:.1f} ms per step on {part} sentences -> epoch "
            f"{row['dense_epoch_s']:.0f} s (extrapolated); lazy {1e3 * row['lazy_step_s']:.2f} ms per step: "
            f"{row['speedup']:.1f}x"
        )
        records.append(row)
    return {
        "sentences": N,
        "observation_tests": encoded.num_unigram,
        "labels": L,
        "index_s": index_seconds,
        "objective_s": objective_seconds,
        "objective_compile_s": objective_compile,
        "records": records,
        "peak_gib": _peak_gib(),
    }


def bcd_part(sentences=None, log=print) -> dict:
    data, encoded, index_seconds = _pos_task(sentences)
    L = len(data.labels)
    model = lavergne2010.chain_model(encoded, L)
    start = time.perf_counter()
    plan = training.bcd_data(encoded.rows, model)
    plan_seconds = time.perf_counter() - start
    cells = {
        kind: int(np.sum(np.asarray(getattr(plan, kind).length)))
        for kind in ("forward", "backward", "windows", "sentences")
    }
    log(f"BCD plan {plan_seconds:.1f} s: {plan.num_rounds} rounds, cells per sweep {cells}")
    sweep = lambda m, d: training.bcd_sweep_fn(d, lavergne2010.L1, lavergne2010.L2)(m, jnp.int32(0))
    compiled, compile_seconds = _compiled(sweep, model, plan)
    (model, value), sweep_seconds = _timed(compiled, model, plan)
    log(
        f"one sweep {sweep_seconds:.1f} s (compile {compile_seconds:.1f} s), objective {float(value):.1f}, "
        f"{int(model.num_nonzero())} non-zero weights"
    )
    cost = lavergne2010.bcd_cost(encoded, L)
    return {
        "sentences": len(data.train),
        "observation_tests": encoded.num_unigram,
        "labels": L,
        "index_s": index_seconds,
        "plan_s": plan_seconds,
        "rounds": plan.num_rounds,
        "cells": cells,
        "counted": cost,
        "compile_s": compile_seconds,
        "sweep_s": sweep_seconds,
        "objective": float(value),
        "peak_gib": _peak_gib(),
    }


def startup_part(iterations: int, log=print) -> dict:
    """The Tagger's training path (`features.index_corpus`, `features.pack_rows`,
    `training.train_linear_chain`, as `Tagger.fit` runs them: bit-identical,
    `tests/applications/test_tagger.py`), each step timed."""
    sentences = [lavergne2010.joint_labels(s) for s in corpora.conll2000("train.txt", task="chunk")]
    labels = tuple(sorted({label for s in sentences for label in s.labels}))
    start = time.perf_counter()
    index, encoded, ids = features.index_corpus(features.extractor("lavergne_pos"), sentences, labels)
    indexed = time.perf_counter()
    packed = features.pack_rows(encoded, ids)
    setup = time.perf_counter()
    result = training.train_linear_chain(
        packed,
        len(labels),
        index.num_unigram,
        l1=lavergne2010.L1,
        l2=lavergne2010.L2,
        max_steps=iterations,
        stop=optimizers.relative_improvement_below(1e-5, 10),
        progress=False,
    )
    total = time.perf_counter() - start
    # The driver times compilation and iterations; the rest of its call is the model and its masks.
    model_s = total - (setup - start) - result.compile_seconds - result.run_seconds
    out = {
        "sentences": len(sentences),
        "labels": len(labels),
        "features": index.num_unigram,
        "iterations": iterations,
        "features_index_encode_s": indexed - start,
        "pack_s": setup - indexed,
        "model_and_masks_s": model_s,
        "compile_s": result.compile_seconds,
        "iterations_s": result.run_seconds,
        "to_first_iteration_s": total - result.run_seconds,
        "seconds": total,
        "peak_gib": _peak_gib(),
    }
    log(
        f"Tagger path at {len(labels)} labels: {out['to_first_iteration_s']:.1f} s to the first iteration "
        f"(features, index and encoding {out['features_index_encode_s']:.1f} s, packing {out['pack_s']:.1f} s, "
        f"model and masks {model_s:.1f} s, compilation {result.compile_seconds:.1f} s), "
        f"{total:.1f} s to the end of iteration {iterations}; peak {out['peak_gib']:.2f} GiB"
    )
    return out


# Every unit of the full experiment, (task, optimizer or form), and the
# iterations (epochs, sweeps) each probe runs: enough for a steady state.
PROBES = (
    ("pos", "OWL-QN", 6),
    ("pos", "SGD-L1", 2),
    ("pos", "BCD", 2),
    ("pairs", "OWL-QN", 6),
    ("pairs", "SGD-L1", 2),
    ("pairs", "BCD", 2),
    ("joint", "OWL-QN", 4),
    ("joint", "SGD-L1", 2),
    ("joint", "BCD", 2),
    ("sparse", "sparse", 6),
    ("sparse", "dense", 6),
)


def _resident_gib() -> float:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def _watchdog(limit_gib: float) -> None:
    """End the process (exit status 3) when its resident memory passes
    `limit_gib`, and make it the kernel's first choice when memory runs out
    (a probe, not the other runs on the machine, is the one killed)."""
    with open("/proc/self/oom_score_adj", "w") as stream:
        stream.write("1000")

    def watch():
        while True:
            if _resident_gib() > limit_gib:
                print(f"probe stopped: resident memory above {limit_gib} GiB", flush=True)
                os._exit(3)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def probe_part(task: str, optimizer: str, iterations: int, limit_gib: float, log=print) -> dict:
    """One unit of the full experiment, its caps cut to `iterations`."""
    _watchdog(limit_gib)
    config = dict(lavergne2010.FULL[task], owlqn_steps=iterations, sgd_epochs=iterations, bcd_sweeps=iterations)
    config.update(chunk=1, finetune_steps=min(config["finetune_steps"], 2), stop=(0.0, 1), epoch_stop=(0.0, 1))
    start = time.perf_counter()
    data = lavergne2010.load(task, config)
    extractor = lavergne2010.Extractor(config["features"], config["pairs"])
    encoded = lavergne2010.encode(data, extractor, config["num_buckets"], config["blocks"])
    model = lavergne2010.chain_model(encoded, len(data.labels))
    setup_seconds = time.perf_counter() - start
    log(f"[{task} {optimizer}] setup {setup_seconds:.1f} s, {model.num_parameters()} weights, {_peak_gib():.2f} GiB")
    with tempfile.TemporaryDirectory() as directory:
        run = RunDirectory(directory)
        if task == "sparse":
            unit = lavergne2010.forward_backward_unit(run, optimizer, data, encoded, config, False)
        else:
            unit = lavergne2010.chain_unit(run, task, optimizer, data, encoded, model, config, False)
    row = unit["rows"][0]
    seconds = [point["seconds"] for point in row["curve"]]
    per_iteration = (seconds[-1] - seconds[0]) / (len(seconds) - 1) if len(seconds) > 1 else seconds[0]
    out = {
        "task": task,
        "optimizer": optimizer,
        "labels": len(data.labels),
        "weights_in_model": model.num_parameters(),
        "possible_features": lavergne2010.possible_features(encoded, len(data.labels)),
        "iterations": row["iterations"],
        "setup_s": setup_seconds,
        "compile_s": row["compile_seconds"],
        "first_iteration_s": seconds[0],
        "per_iteration_s": per_iteration,
        "calibration_s": row.get("calibration", {}).get("seconds"),
        "plan_s": row.get("plan_seconds"),
        "peak_gib": _peak_gib(),
    }
    log(
        f"[{task} {optimizer}] {per_iteration:.2f} s per iteration (first {seconds[0]:.2f} s, compile "
        f"{out['compile_s']:.1f} s), peak {out['peak_gib']:.2f} GiB"
    )
    return out


def all_probes(limit_gib: float, machine: str) -> dict:
    """Every probe of `PROBES`, each in its own process (its own peak memory)."""
    records = []
    for task, optimizer, iterations in PROBES:
        with tempfile.TemporaryDirectory() as directory:
            command = [sys.executable, "-m", "benchmarks.lavergne_scale_benchmark", "--part", "probe"]
            command += ["--task", task, "--optimizer", optimizer, "--iterations", str(iterations)]
            command += ["--limit-gib", str(limit_gib), "--machine", machine, "--out", directory]
            finished = subprocess.run(command, check=False)
            path = os.path.join(directory, "probe.json")
            if finished.returncode == 0 and os.path.exists(path):
                with open(path) as stream:
                    records.append(json.load(stream))
            else:
                status = "over the memory limit" if finished.returncode == 3 else f"exit {finished.returncode}"
                records.append({"task": task, "optimizer": optimizer, "failed": status, "limit_gib": limit_gib})
    command = f"python -m benchmarks.lavergne_scale_benchmark --part probe --all --limit-gib {limit_gib:g}"
    return {"probes": records, "limit_gib": limit_gib, "command": command}


def sgd_gap_part(sentences: int, rates, log=print) -> dict:
    """OWL-QN against SGD-L1 (calibrated, then each fixed rate) on `sentences`
    training sentences of `pos` and `pairs`, each to the experiment's stop rule."""
    rows = []
    for task in ("pos", "pairs"):
        config = dict(lavergne2010.FULL[task], num_train=sentences, finetune_steps=0, crfsuite=())
        data = lavergne2010.load(task, config)
        extractor = lavergne2010.Extractor(config["features"], config["pairs"])
        encoded = lavergne2010.encode(data, extractor, config["num_buckets"], config["blocks"])
        model = lavergne2010.chain_model(encoded, len(data.labels))
        runs = [("OWL-QN", None)] + [("SGD-L1", None)] + [("SGD-L1", rate) for rate in rates]
        for optimizer, rate in runs:
            settings = config if rate is None else dict(config, sgd_rate=rate)
            with tempfile.TemporaryDirectory() as directory:
                unit = lavergne2010.chain_unit(
                    RunDirectory(directory), task, optimizer, data, encoded, model, settings, False
                )
            row = unit["rows"][0]
            rows.append(
                {
                    "task": task,
                    "optimizer": optimizer,
                    "rate": row.get("calibration", {}).get("rate"),
                    "calibrated": rate is None and optimizer == "SGD-L1",
                    "objective": row["trace"][-1],
                    "iterations": row["iterations"],
                    "error": row["error"],
                    "nonzero": row["nonzero"],
                    "train_s": row["train_seconds"],
                }
            )
            owlqn = next(r["objective"] for r in rows if r["task"] == task and r["optimizer"] == "OWL-QN")
            last = rows[-1]
            rate_text = "" if last["rate"] is None else f" rate {last['rate']:.2g}"
            log(
                f"[{task} {optimizer}{rate_text}] objective {last['objective']:.1f} "
                f"({last['objective'] / owlqn:.3f} x OWL-QN's), {last['error']:.2f}% error, "
                f"{last['nonzero']} active, {last['iterations']} it., {last['train_s']:.0f} s"
            )
    return {"sentences": sentences, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("sgd", "bcd", "startup", "probe", "sgd-gap"), required=True)
    parser.add_argument("--task", choices=lavergne2010.TASKS, default="pos")
    parser.add_argument("--optimizer", default="OWL-QN", help="OWL-QN, SGD-L1, BCD (sparse task: sparse, dense)")
    parser.add_argument("--all", action="store_true", help="probe: every unit, one process each")
    parser.add_argument("--limit-gib", type=float, default=12.0, help="probe: end the process past this")
    parser.add_argument("--out", default=None, help="probe: write probe.json into this folder")
    parser.add_argument("--batch-sizes", default="64,8")
    parser.add_argument("--dense-sentences", type=int, default=512)
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=None, help="training sentences (default: all 8,936)")
    parser.add_argument("--machine", default="cpu-2core")
    parser.add_argument("--rates", default="2.5e-4,6e-5", help="sgd-gap: fixed SGD-L1 rates beside the calibrated one")
    args = parser.parse_args()
    if args.part == "probe" and not args.all:
        os.makedirs(args.out or ".", exist_ok=True)  # before the probe's minutes: it crashed after them
        result = probe_part(args.task, args.optimizer, args.iterations, args.limit_gib)
        with open(os.path.join(args.out or ".", "probe.json"), "w") as handle:
            json.dump(result, handle, indent=1)
        return
    if args.part == "probe":
        result = all_probes(args.limit_gib, args.machine)
    elif args.part == "sgd":
        result = sgd_part([int(b) for b in args.batch_sizes.split(",")], args.dense_sentences, args.sentences)
    elif args.part == "bcd":
        result = bcd_part(args.sentences)
    elif args.part == "sgd-gap":
        result = sgd_gap_part(args.sentences or 1000, [float(rate) for rate in args.rates.split(",") if rate])
    else:
        result = startup_part(args.iterations)
    result.update(machine=args.machine, platform=platform.platform(), jax=jax.__version__, cpus=os.cpu_count())
    name = (
        f"lavergne-scale-{args.part}s-{args.machine}"
        if args.part == "probe"
        else f"lavergne-scale-{args.part}-{args.machine}"
    )
    name += f"-{args.sentences}" if args.sentences else ""
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as handle:
        json.dump(result, handle, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
