"""Altun, Johnson & Hofmann (2003), "Investigating loss functions and
optimization methods for discriminative learning of label sequences".

The four losses (sequential / pointwise x log / exp) with the feature sets
S1, S2, S3 on CoNLL-2002 Spanish NER (entity F1 on esp.testb) and on WSJ POS
tagging (conll2000, token accuracy), each trained with L-BFGS under a
Gaussian prior; training time and non-zero parameters per row; learning
curves over the training-set size. The paper's conclusion to check: the
losses differ little while the feature sets matter much.
"""

from __future__ import annotations

import os
import shutil

import matplotlib.pyplot as plt
import numpy as np

from lossfns.optimizers import boost, chain_boosting_data, chain_boosting_model, sequence_pieces

from . import tagging
from .harness import RunDirectory, floors_section, markdown_table
from .tagging import LOSSES

# MATH.md section 7 (Altun et al. 2003, Tables 2 and 3): NER F1 for S1, S2, S3.
PAPER_NER_F1 = {
    "sequential log": (59.92, 69.75, 73.62),
    "sequential exp": (59.68, 67.30, 72.11),
    "pointwise log": (56.73, 68.28, 73.17),
    "pointwise exp": (58.26, 69.51, 73.82),
    "perceptron": (59.77, 69.29, 72.97),
    "boosting": (48.23, 66.11, 71.07),
}
PAPER_POS_ACCURACY = "94.6-95.7 (Penn Treebank, S1/S2, all four losses; Table 1)"
FLOORS = {("ner", "S3", "sequential log"): 73.0, ("pos", "S2", "sequential log"): 95.0}

# Sized for 2 shared CPU cores: the paper's POS data was 40x larger, and
# its iteration counts are not reported.
FULL = {
    "ner": dict(num_train=None, num_test=None, feature_sets=("S1", "S2", "S3"), num_buckets=6, max_steps=70,
                perceptron_epochs=5, curve_sizes=(300, 1000, 3000), curve_set="S2",
                curve_losses=LOSSES),
    "pos": dict(num_train=None, num_test=None, feature_sets=("S1", "S2"), num_buckets=6, max_steps=40,
                perceptron_epochs=8, curve_sizes=(), curve_set="S2", curve_losses=LOSSES),
}
QUICK = {
    "ner": dict(num_train=120, num_test=120, feature_sets=("S1", "S2", "S3"), num_buckets=1, max_steps=12,
                perceptron_epochs=3, curve_sizes=(), curve_set="S2", curve_losses=LOSSES),
    "pos": dict(num_train=60, num_test=60, feature_sets=("S1", "S2"), num_buckets=1, max_steps=12,
                perceptron_epochs=3, curve_sizes=(), curve_set="S2", curve_losses=LOSSES),
}
# Sequence boosting (Altun et al. 2002, the paper's "boosting" row) on the
# full training sets, cut into pieces of 8 tokens (experiments.altun2002):
# stopped when the log exp-loss fell by less than log(1 + tol) over `window`
# rounds, or at the round cap, chosen from the rounds per second measured by
# benchmarks/boosting_rounds.py (NER 6.3 at S1, 1.9 at S3; POS 1.7 at S1 on
# the shared 2-core machine) so that the five rows fit in about 4.5 hours.
BOOSTING = {"ner": dict(piece_length=8, max_rounds=10000, tol=1e-3, window=1000, eval_every=1000),
            "pos": dict(piece_length=8, max_rounds=5000, tol=1e-3, window=1000, eval_every=1000)}
BOOSTING_QUICK = {"ner": dict(piece_length=8, max_rounds=100, tol=1e-3, window=50, eval_every=50),
                  "pos": dict(piece_length=8, max_rounds=100, tol=1e-3, window=50, eval_every=50)}
L2_WEIGHT = 0.1  # Gaussian prior sigma^2 = 10, for every loss and task
TOLERANCE = 1e-6
SEED = 0


def _train_unit(run: RunDirectory, name: str, data, encoded, set_name: str, loss: str, config: dict,
                progress: bool) -> dict:
    def compute():
        params = tagging.init_params(encoded.num_features, len(data.labels))
        buckets = encoded.train[set_name]
        weights = [np.ones(bucket.lengths.shape[0]) for bucket in buckets]
        result = tagging.train(params, buckets, weights, loss, l2_weight=L2_WEIGHT, max_steps=config["max_steps"],
                               tol=TOLERANCE, checkpoint_dir=os.path.join(run.root, "checkpoints", name),
                               progress=progress)
        score = tagging.evaluate(result.params, encoded.test[set_name], encoded.test_order, data)
        print(f"  {name}: {score:.2f} ({result.num_steps} steps, {result.train_seconds:.0f} s)", flush=True)
        return {"task": data.name, "features": set_name, "loss": loss, "metric": data.metric, "score": score,
                "train_seconds": result.train_seconds, "compile_seconds": result.compile_seconds,
                "steps": result.num_steps, "nonzero_parameters": result.params.num_nonzero(),
                "num_train_sentences": len(data.train), "objective_trace": [float(v) for v in result.trace]}

    return run.unit(name, compute)


def _perceptron_unit(run: RunDirectory, name: str, data, encoded, set_name: str, config: dict, progress: bool) -> dict:
    def compute():
        params = tagging.init_params(encoded.num_features, len(data.labels))
        params, mistakes, seconds = tagging.train_perceptron(params, encoded.train[set_name],
                                                             num_epochs=config["perceptron_epochs"], progress=progress)
        score = tagging.evaluate(params, encoded.test[set_name], encoded.test_order, data)
        print(f"  {name}: {score:.2f} ({len(mistakes)} epochs, {seconds:.0f} s)", flush=True)
        return {"task": data.name, "features": set_name, "loss": "perceptron", "metric": data.metric, "score": score,
                "train_seconds": seconds, "steps": len(mistakes), "nonzero_parameters": params.num_nonzero(),
                "num_train_sentences": len(data.train), "mistakes_per_epoch": mistakes}

    return run.unit(name, compute)


def boosting_pieces(buckets, piece_length: int):
    """`(ids, labels, lengths)` numpy: the sentences of `buckets`
    (`tagging.Bucket`s) cut into pieces (`lossfns.optimizers.sequence_pieces`)."""
    return sequence_pieces([np.asarray(b.ids) for b in buckets], [np.asarray(b.labels) for b in buckets],
                           [np.asarray(b.lengths) for b in buckets], piece_length)


def _boosting_unit(run: RunDirectory, name: str, data, encoded, set_name: str, config: dict, progress: bool) -> dict:
    """The library's sequence boosting on pieces of the training set until
    its stop rule or cap; test scores every `eval_every` rounds (a curve, no
    selection); resumable from the checkpoints of its chunks."""
    def compute():
        sparse = chain_boosting_data(*boosting_pieces(encoded.train[set_name], config["piece_length"]),
                                     encoded.num_features, len(data.labels))
        directory = os.path.join(run.root, "checkpoints", name)
        score = lambda theta, _: tagging.evaluate(chain_boosting_model(theta, sparse), encoded.test[set_name],
                                                  encoded.test_order, data)
        result = boost(sparse, max_rounds=config["max_rounds"], tol=config["tol"], window=config["window"],
                       evaluate=score, eval_every=config["eval_every"], chunk_rounds=config["eval_every"],
                       checkpoint_dir=directory, progress=progress)
        rounds = int(result.loop.step)
        final = float(result.evaluations[-1, 1])
        print(f"  {name}: {final:.2f} ({rounds} rounds, {result.stopped_by}, {result.seconds:.0f} s)", flush=True)
        shutil.rmtree(directory, ignore_errors=True)
        return {"task": data.name, "features": set_name, "loss": "boosting", "metric": data.metric, "score": final,
                "train_seconds": result.seconds, "setup_seconds": result.setup_seconds, "steps": rounds,
                "rounds_per_second": rounds / max(result.seconds, 1e-9), "stopped_by": result.stopped_by,
                "converged": result.converged, "nonzero_parameters": int(np.count_nonzero(np.asarray(result.theta))),
                "num_weak_learners": sparse.num_weak_learners, "num_train_sentences": len(data.train),
                "num_pieces": int(sparse.lengths.shape[0]), "config": config,
                "curve": [[int(r), float(v)] for r, v in result.evaluations],
                "log_exp_loss": [float(v) for v in result.loop.trace[:rounds:max(1, rounds // 200)]]}

    return run.unit(name, compute)


def _run_task(run: RunDirectory, task: str, config: dict, progress: bool,
              boosting: dict | None = None) -> dict:
    data = tagging.load_task(task, config["num_train"], config["num_test"], SEED)
    print(f"[{task}] {data.source}: {len(data.train)} train / {len(data.test)} test sentences, "
          f"{len(data.labels)} labels", flush=True)
    encoded = tagging.encode_task(data, config["feature_sets"], config["num_buckets"])
    rows = [_train_unit(run, f"{task}-{set_name}-{loss}".replace(" ", "_"), data, encoded, set_name, loss,
                        config, progress)
            for set_name in config["feature_sets"] for loss in LOSSES]
    rows += [_perceptron_unit(run, f"{task}-{set_name}-perceptron", data, encoded, set_name, config, progress)
             for set_name in config["feature_sets"]]
    if boosting is not None:
        rows += [_boosting_unit(run, f"{task}-{set_name}-boosting", data, encoded, set_name, boosting, progress)
                 for set_name in config["feature_sets"]]
    rows = [row for row in rows if row is not None]  # None: unfinished (--report-only)
    # Learning curves: each subset is a fresh training set (its own feature
    # index, as in the paper): the first `size` sentences of a fixed shuffle.
    curve_set, curve = config["curve_set"], []
    for size in config["curve_sizes"]:
        if size >= len(data.train):
            continue
        chosen = np.sort(np.random.default_rng(SEED).permutation(len(data.train))[:size])
        subset = data._replace(train=[data.train[i] for i in chosen])
        subset_encoded = tagging.encode_task(subset, (curve_set,), config["num_buckets"])
        curve += [row for row in (_train_unit(run, f"{task}-curve{size}-{loss}".replace(" ", "_"), subset,
                                              subset_encoded, curve_set, loss, config, progress)
                                  for loss in config["curve_losses"]) if row is not None]
    curve += [row for row in rows if row["features"] == curve_set and row["loss"] in config["curve_losses"]]
    return {"source": data.source, "synthetic": data.source.startswith("synthetic"), "metric": data.metric,
            "num_train": len(data.train), "num_test": len(data.test), "num_labels": len(data.labels),
            "num_features_K": encoded.num_features, "rows": rows, "learning_curve": curve, "curve_set": curve_set}


def _score(rows, set_name, loss):
    return next((row["score"] for row in rows if row["features"] == set_name and row["loss"] == loss), None)


def _check_conclusion(task_result: dict, feature_sets) -> dict:
    """Altun et al.: losses differ little, feature sets matter much. Measured
    as the largest spread across losses within a feature set versus the
    smallest gain of the richest over the poorest feature set for a loss."""
    rows = task_result["rows"]
    spread = lambda scores: max(scores) - min(scores) if scores else 0.0
    spreads = [spread([r["score"] for r in rows if r["features"] == s and r["loss"] in LOSSES]) for s in feature_sets]
    gains = [_score(rows, feature_sets[-1], loss) - _score(rows, feature_sets[0], loss) for loss in LOSSES
             if None not in (_score(rows, feature_sets[-1], loss), _score(rows, feature_sets[0], loss))]
    complete = len([r for r in rows if r["loss"] in LOSSES]) == len(LOSSES) * len(feature_sets)
    # Reported beside it, not instead: the spread without the sequential
    # exp-loss, the one loss whose optimisation is dominated by the longest
    # sentences at the start (its trace tells whether it converged).
    without_exp = [spread([r["score"] for r in rows if r["features"] == s and r["loss"] in LOSSES
                           and r["loss"] != "sequential exp"]) for s in feature_sets]
    return {"largest_spread_across_losses": max(spreads), "smallest_gain_across_feature_sets": min(gains, default=None),
            "largest_spread_without_sequential_exp": max(without_exp),
            "complete": complete, "holds": complete and max(spreads) < min(gains)}


def _convergence_note(result: dict) -> str:
    """How far from converged the iteration-capped L-BFGS runs stopped: the
    relative objective decrease over their last 5 steps."""
    decreases = [(trace[-6] - trace[-1]) / abs(trace[-1]) for trace in
                 (row.get("objective_trace", []) for row in result["rows"]) if len(trace) > 5]
    if not decreases:
        return ""
    return (f"Convergence: over its last 5 steps each L-BFGS objective still fell by "
            f"{100 * min(decreases):.1f}% to {100 * max(decreases):.1f}%, so these rows are iteration-capped, "
            f"not converged.\n")


def _boosting_note(results: dict) -> str:
    """How each boosting row stopped (converged or the round cap), its rounds and wall time."""
    rows = [r for result in results.values() for r in result["rows"] if r["loss"] == "boosting"]
    if not rows:
        return "Boosting (Altun et al. 2002): not run yet.\n"
    parts = [f"{r['task']} {r['features']}: {r['steps']} rounds, "
             f"{'converged' if r['converged'] else 'not converged'} ({r['stopped_by']}), {r['train_seconds']:.0f} s "
             f"({r['rounds_per_second']:.1f} rounds/s; {r['setup_seconds']:.0f} s to the first round), "
             f"{r['nonzero_parameters']} of {r['num_weak_learners']} weak learners used" for r in rows]
    return ("Boosting rows: the library's sequence boosting (`lossfns.optimizers.boost` on "
            "`chain_boosting_data`, line-search bound, no prior) on the full training set cut into pieces of "
            f"{rows[0]['config']['piece_length']} tokens, stopped when the log exp-loss fell by less than "
            "log(1 + tol) over `window` rounds or at the round cap (configuration in the JSON); the score is "
            "the final model's. " + "; ".join(parts) + ".\n")


def _table(task: str, result: dict, feature_sets) -> str:
    metric = "entity F1 (esp.testb)" if result["metric"] == "entity_f1" else "token accuracy"
    header = ["loss"] + [f"{s} ours" for s in feature_sets]
    header += [f"{s} paper" for s in feature_sets] if task == "ner" else ["paper (S1/S2)"]
    header += [f"{s} train s" for s in feature_sets] + [f"{s} non-zeros" for s in feature_sets]
    rows = []
    for loss in list(LOSSES) + ["perceptron", "boosting"]:
        found = {r["features"]: r for r in result["rows"] if r["loss"] == loss}
        if not found and loss == "boosting":
            row = [loss + " (not run, see below)"] + [None] * len(feature_sets)
        else:
            row = [loss] + [found[s]["score"] if s in found else None for s in feature_sets]
        if task == "ner":
            row += list(PAPER_NER_F1[loss][: len(feature_sets)])
        else:
            row += [PAPER_POS_ACCURACY if loss == "sequential log" else ""]
        row += [found[s]["train_seconds"] if s in found else None for s in feature_sets]
        row += [found[s]["nonzero_parameters"] if s in found else None for s in feature_sets]
        rows.append(row)
    lines = [f"### {task.upper()}: {metric}, {result['source']}", "",
             f"{result['num_train']} training / {result['num_test']} test sentences, "
             f"{result['num_labels']} labels.", "",
             markdown_table(header, rows)]
    return "\n".join(lines)


def _plot_curves(run: RunDirectory, task: str, result: dict) -> str:
    figure, axis = plt.subplots(figsize=(5, 3.5))
    for loss in LOSSES:
        points = sorted((r["num_train_sentences"], r["score"]) for r in result["learning_curve"] if r["loss"] == loss)
        if points:
            axis.plot(*zip(*points), marker="o", label=loss)
    axis.set_xscale("log")
    sizes = sorted({r["num_train_sentences"] for r in result["learning_curve"]})
    axis.set_xticks(sizes, [str(size) for size in sizes])
    axis.minorticks_off()
    axis.set_xlabel("training sentences")
    axis.set_ylabel("entity F1 (%)" if result["metric"] == "entity_f1" else "accuracy (%)")
    data_kind = "synthetic" if result["synthetic"] else "real"
    axis.set_title(f"Altun 2003 learning curves, {task.upper()} ({data_kind}), {result['curve_set']}")
    axis.legend(fontsize=8)
    return run.save_figure(f"learning_curve_{task}.png", figure)


def _plot_feature_sets(run: RunDirectory, results: dict) -> str:
    figure, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.5), squeeze=False)
    for axis, (task, result) in zip(axes[0], results.items()):
        sets = sorted({r["features"] for r in result["rows"]})
        for offset, loss in enumerate(LOSSES):
            scores = [_score(result["rows"], s, loss) for s in sets]
            scores = [np.nan if score is None else score for score in scores]
            axis.bar(np.arange(len(sets)) + 0.2 * offset - 0.3, scores, width=0.2, label=loss)
        axis.set_xticks(np.arange(len(sets)), sets)
        axis.set_ylabel("entity F1 (%)" if result["metric"] == "entity_f1" else "accuracy (%)")
        axis.set_title(task.upper())
    axes[0][0].legend(fontsize=7)
    return run.save_figure("losses_by_feature_set.png", figure)


def run(run: RunDirectory, *, quick: bool = False, progress: bool = True, tasks=None) -> dict:
    """Run the experiment (`tasks`: a subset of ("ner", "pos"), default both)."""
    configs = {task: config for task, config in (QUICK if quick else FULL).items() if tasks is None or task in tasks}
    boosting = BOOSTING_QUICK if quick else BOOSTING
    results = {task: _run_task(run, task, config, progress, boosting.get(task)) for task, config in configs.items()}
    conclusions = {task: _check_conclusion(result, configs[task]["feature_sets"]) for task, result in results.items()}
    floors = {}
    for (task, set_name, loss), floor in FLOORS.items():
        if task not in results:
            continue
        score = _score(results[task]["rows"], set_name, loss)
        floors[f"{task} {set_name} {loss}"] = {"floor": floor, "ours": score,
                                               "applies": not results[task]["synthetic"] and not quick,
                                               "met": score is not None and score >= floor}
    steps = ", ".join(f"{task}: {config['max_steps']}" for task, config in configs.items())
    document = ["# Altun, Johnson & Hofmann (2003): four losses x feature sets", "",
                f"Mode: {'quick (small slices, few iterations: not comparable to the paper)' if quick else 'full'}. "
                f"L-BFGS (optax.lbfgs), Gaussian prior sigma^2 = {1 / L2_WEIGHT:g}, up to "
                f"{steps} steps, relative tolerance "
                f"{TOLERANCE:g}; seed {SEED}. L-BFGS seconds exclude compilation (in the JSON); "
                f"averaged-perceptron seconds include it.", ""]
    for task, result in results.items():
        document.append(_table(task, result, configs[task]["feature_sets"]))
        document.append(_convergence_note(result))
        check = conclusions[task]
        if not check["complete"]:
            document.append(f"Conclusion on {task.upper()}: not checked (rows still missing).\n")
        else:
            sets = configs[task]["feature_sets"]
            document.append(f"Conclusion 'losses differ little, feature sets matter much' on {task.upper()}: "
                            f"largest spread across losses {check['largest_spread_across_losses']:.2f} points, "
                            f"smallest gain from {sets[0]} to {sets[-1]} "
                            f"{check['smallest_gain_across_feature_sets']:.2f} points: "
                            f"{'HOLDS' if check['holds'] else 'DOES NOT HOLD'} (spread without the sequential "
                            f"exp-loss: {check['largest_spread_without_sequential_exp']:.2f} points).\n")
        if len({r["num_train_sentences"] for r in result["learning_curve"]}) > 1:
            document.append(f"![learning curve]({os.path.basename(_plot_curves(run, task, result))})\n")
    document.append(f"![losses by feature set]({os.path.basename(_plot_feature_sets(run, results))})\n")
    document.append(_boosting_note(results))
    document += floors_section(floors, "issue 7; real corpora, full runs only", "row missing")
    run.write_text("results.md", "\n".join(document) + "\n")
    summary = {"quick": quick, "l2_weight": L2_WEIGHT, "tolerance": TOLERANCE, "seed": SEED,
               "configs": configs, "tasks": results, "conclusions": conclusions, "floors": floors}
    run.write_json("results.json", summary)
    return summary
