"""Altun, Hofmann & Johnson (2002), "Discriminative learning for label
sequences via boosting": sequence boosting against the exact losses it
approximates, on CoNLL-2002 Spanish NER (esp.train -> esp.testb; feature
sets S1, S2, S3 of `experiments.tagging`) and on WSJ POS tagging (conll2000;
S1, S2; the paper has no POS row, ours extends its test).

Rows per task and feature set, all trained on the whole training set:

* sequential log-loss and sequential exp-loss, L-BFGS under the Gaussian
  prior of `experiments.altun2003`, on whole sentences;
* sequential exp-loss, L-BFGS, on the boosting pieces (below): the
  objective boosting minimises, on the same data, by the exact optimiser;
* sequence boosting (the library's: `lossfns.training.boost` on
  `chain_boosting_data`, line-search bound with per-sequence ranges, MATH.md
  section 3), no prior, until its log exp-loss stops falling.

As in the paper ("we divided the sentences into pieces such that the
variation in the length of the sentences is small"), boosting trains on
pieces of `piece_length` tokens cut from the featurised sentences (features
keep their sentence context; only the chain is cut): `D(i)` is proportional
to `1 / P(y_i | x_i) - 1`, about `L^T` at the zero start, so whole sentences
would put all the weight on the longest one.

The whole-sentence and boosting rows are altun2003's (its Table 2 has this
boosting row), so they are computed once: by altun2003's unit functions,
into the altun2003 run directory beside this one (`shared_run`). Whichever
experiment runs first fills them for both; this experiment adds the
pieces rows, the token errors of Altun et al. 2002's Table 1, the boosting
curves and the conclusion. Every row runs to its stop rule (altun2003's:
L-BFGS until the objective improved by less than 1e-5 over 10 steps;
boosting until its development score stopped improving, or the log
exp-loss fell by less than log(1 + tol) over `window` rounds), its cap only
a safety limit.
"""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import numpy as np

from . import altun2003
from .altun2003 import L2_WEIGHT, LBFGS_CRITERION, PAPER_NER_F1
from .harness import RunDirectory, UsageError, converged_cell, markdown_table, missing_note, stale_note, verdict

# MATH.md section 7 (Altun et al. 2003, Table 2): NER entity F1 for S1, S2, S3.
PAPER_F1 = {
    "sequential log": PAPER_NER_F1["sequential log"],
    "sequential exp": PAPER_NER_F1["sequential exp"],
    "boosting": PAPER_NER_F1["boosting"],
}
# Altun et al. 2002, Table 1: test error (%) on the Spanish NER corpus. The
# table's text is garbled in papers/; read column by column (log, exp,
# boost) with rows S1, S2, S3 (the sequence-level losses, "H").
PAPER_TOKEN_ERROR = {
    "sequential log": (6.60, 6.72, 6.15),
    "sequential exp": (6.95, 7.03, 5.84),
    "boosting": (8.05, 6.93, 6.77),
}
PAPER_FEATURE_FRACTION = 0.10  # "boosting uses only about 10% of the features"
# The conclusion test: boosting within this many points (F1 or accuracy) of
# the sequential log-loss on the richest set (the paper's own gap: 73.62 -
# 71.07 = 2.55) while using at most this fraction of the weak learners.
COMPETITIVE_GAP = 3.0
SMALL_FRACTION = 0.15
METHODS = ("sequential log", "sequential exp", "sequential exp (pieces)", "boosting")
TASKS = ("ner", "pos")


def configs(quick: bool) -> dict:
    """Per task: altun2003's configuration (the shared units' settings) and
    its boosting configuration (`boosting`)."""
    base, boosting = (altun2003.QUICK, altun2003.BOOSTING_QUICK) if quick else (altun2003.FULL, altun2003.BOOSTING)
    return {task: dict(base[task], boosting=boosting[task]) for task in TASKS}


def shared_run(run: RunDirectory, quick: bool) -> RunDirectory:
    """altun2003's run directory beside `run`'s (`results/altun2003` for
    `results/altun2002`), where the rows both experiments report live."""
    root = os.path.join(os.path.dirname(os.path.abspath(run.root)), "altun2003" + ("-quick" if quick else ""))
    return RunDirectory(root, compute_missing=run.compute_missing, only=run.only)


def _row(unit: dict, method: str, weak_learners: int, config: dict) -> dict:
    """A table row from an altun2003 unit (`train_unit` or `boosting_unit`)."""
    return {
        "task": unit["task"],
        "features": unit["features"],
        "method": method,
        "metric": unit["metric"],
        "score": unit["score"],
        "token_error": unit.get("token_error"),  # altun2003's earlier L-BFGS units recorded the score only
        "features_used": unit["nonzero_parameters"],
        "num_weak_learners": weak_learners,
        "feature_fraction": unit["nonzero_parameters"] / weak_learners,
        "train_seconds": unit["train_seconds"],
        "steps": unit["steps"],
        "best_round": unit.get("best_round", unit["steps"]),  # earlier boosting units scored the final model
        "convergence": altun2003.row_convergence(unit, config),
        "stale": unit.get("stale", False),
        "unit": unit.get("unit"),
        "curve": unit.get("curve"),
        "curve_split": unit.get("curve_split", "test"),
        "chosen_features": unit.get("chosen_features"),
    }


def _run_task(run: RunDirectory, shared: RunDirectory, task: str, config: dict, progress: bool) -> dict:
    data, encoded = altun2003.load_and_encode(task, config)
    boosting, rows = config["boosting"], []
    for set_name in config["feature_sets"]:
        weak_learners = altun2003.num_weak_learners(encoded, set_name, len(data.labels))
        prefix = f"{task}-{set_name}"
        common = (data, encoded, set_name)
        units = {
            loss: altun2003.train_unit(shared, f"{prefix}-{loss}".replace(" ", "_"), *common, loss, config, progress)
            for loss in ("sequential log", "sequential exp")
        }
        units["sequential exp (pieces)"] = altun2003.train_unit(
            run,
            f"{prefix}-sequential_exp_pieces",
            *common,
            "sequential exp",
            config,
            progress,
            boosting["piece_length"],
        )
        units["boosting"] = altun2003.boosting_unit(shared, f"{prefix}-boosting", *common, boosting, progress)
        rows += [_row(unit, method, weak_learners, config) for method, unit in units.items() if unit is not None]
    return {
        "source": data.source,
        "synthetic": data.source.startswith("synthetic"),
        "metric": data.metric,
        "num_train": len(data.train),
        "num_test": len(data.test),
        "num_labels": len(data.labels),
        "num_features_K": encoded.num_features,
        "rows": rows,
    }


def _find(rows, set_name, method):
    return next((row for row in rows if row["features"] == set_name and row["method"] == method), None)


def check_conclusion(result: dict, feature_sets) -> dict:
    """Altun et al. 2002: boosting is competitive with the exact losses once
    the features are rich, and uses a small fraction of the features; it is
    worst with the poor set S1. Measured as the gap to the sequential
    log-loss per feature set (F1 or accuracy points) and the fraction of
    weak learners with a non-zero weight on the richest set."""
    rows, richest = result["rows"], feature_sets[-1]
    gaps = {}
    for set_name in feature_sets:
        log, boost = _find(rows, set_name, "sequential log"), _find(rows, set_name, "boosting")
        if log is not None and boost is not None:
            gaps[set_name] = log["score"] - boost["score"]
    boost = _find(rows, richest, "boosting")
    fraction = None if boost is None else boost["feature_fraction"]
    complete = richest in gaps
    competitive = complete and gaps[richest] <= COMPETITIVE_GAP
    sparse = fraction is not None and fraction <= SMALL_FRACTION
    read = [row for row in rows if row["method"] in ("sequential log", "boosting")]
    return {
        "gap_log_minus_boosting": gaps,
        "boosting_feature_fraction_richest": fraction,
        "competitive_on_richest": competitive,
        "small_fraction": sparse,
        "gap_narrows_with_features": len(gaps) > 1 and gaps.get(richest, np.inf) < gaps.get(feature_sets[0], -np.inf),
        "complete": complete,
        "holds": competitive and sparse,
        "converged": all(row["convergence"]["met"] for row in read),
        "current": not any(row["stale"] for row in read),
    }


def _label(method: str) -> str:
    return method.replace(" (pieces)", " on pieces") + ("" if method == "boosting" else ", L-BFGS")


def _tables(task: str, result: dict, feature_sets) -> str:
    """Score (F1 or accuracy), features used, convergence and seconds; for
    NER the token error beside Altun et al. 2002's Table 1."""
    ner = task == "ner"
    metric = "entity F1 (%) on esp.testb" if ner else "token accuracy (%) on conll2000 test.txt"
    header = ["method"] + [f"{s} ours" for s in feature_sets]
    header += [f"{s} paper" for s in feature_sets] if ner else []
    header += [f"{s} weak learners used" for s in feature_sets] + [f"{s} converged" for s in feature_sets]
    header += [f"{s} train s" for s in feature_sets]
    score_rows, error_rows = [], []
    for method in METHODS:
        cells = [_find(result["rows"], s, method) for s in feature_sets]
        row = [_label(method)] + [c["score"] if c else None for c in cells]
        if ner:
            row += [PAPER_F1[method][int(s[1:]) - 1] if method in PAPER_F1 else "" for s in feature_sets]
        row += [f"{c['features_used']} ({100 * c['feature_fraction']:.1f}%)" if c else None for c in cells]
        row += [converged_cell(c["convergence"]) if c else None for c in cells]
        row += [c["train_seconds"] if c else None for c in cells]
        score_rows.append(row)
        paper = PAPER_TOKEN_ERROR.get(method, ("",) * 3)
        error_rows.append(
            [_label(method)]
            + [c["token_error"] if c else None for c in cells]
            + [paper[int(s[1:]) - 1] for s in feature_sets]
        )
    lines = [
        f"## {task.upper()}: {metric}",
        "",
        f"{result['source']}: {result['num_train']} training / {result['num_test']} test sentences, "
        f"{result['num_labels']} labels.",
        "",
        markdown_table(header, score_rows),
    ]
    if ner:
        error_header = ["method"] + [f"{s} ours" for s in feature_sets]
        error_header += [f"{s} paper (2002)" for s in feature_sets]
        lines += [
            "Token error (%) on esp.testb ('-': altun2003's units of an earlier version recorded the F1 only):",
            "",
            markdown_table(error_header, error_rows),
        ]
    return "\n".join(lines)


def features_used_by_round(chosen: list, rounds: list) -> list:
    """Distinct weak learners chosen by each of `rounds` (the non-zero
    weights, unless a weight returned exactly to 0)."""
    first_seen = np.unique(np.asarray(chosen, dtype=np.int64), return_index=True)[1]
    return [int(np.sum(first_seen < r)) for r in rounds]


def _plot_rounds(run: RunDirectory, results: dict) -> str:
    """Per task: the score boosting stopped on (`curve_split`: development,
    or test in rows of an earlier configuration) against rounds per feature
    set, the L-BFGS sequential log-loss's test score dashed; and weak
    learners used."""
    figure, axes = plt.subplots(len(results), 2, figsize=(10, 3.6 * len(results)), squeeze=False)
    for (score_axis, used_axis), (task, result) in zip(axes, results.items()):
        for row in result["rows"]:
            if row["method"] != "boosting" or not row["curve"]:
                continue
            rounds, scores = zip(*row["curve"])
            (line,) = score_axis.plot(rounds, scores, label=f"boosting {row['features']} ({row['curve_split']})")
            log = _find(result["rows"], row["features"], "sequential log")
            if log is not None:
                score_axis.axhline(log["score"], color=line.get_color(), linestyle="--", linewidth=0.8)
            if row["chosen_features"]:
                used = features_used_by_round(row["chosen_features"], rounds)
                fractions = [100 * u / row["num_weak_learners"] for u in used]
                used_axis.plot(rounds, fractions, label=row["features"], color=line.get_color())
        score_axis.set_xlabel("boosting round")
        score_axis.set_ylabel("entity F1 (%)" if result["metric"] == "entity_f1" else "accuracy (%)")
        score_axis.set_title(f"{task.upper()}; dashed: sequential log-loss, L-BFGS (test)")
        used_axis.set_xlabel("boosting round")
        used_axis.set_ylabel("weak learners used (% of all)")
        used_axis.set_title(f"the paper's boosting: about {100 * PAPER_FEATURE_FRACTION:.0f}%")
        for axis in (score_axis, used_axis):
            if axis.get_legend_handles_labels()[0]:
                axis.legend(fontsize=8)
    figure.tight_layout()
    return run.save_figure("boosting_rounds.png", figure)


def _conclusion_text(task: str, conclusion: dict, feature_sets, quick: bool) -> list[str]:
    if not conclusion["complete"]:
        return [f"Conclusion ({task.upper()}): not checked (rows still missing).", ""]
    points = "F1" if task == "ner" else "accuracy"
    gaps = ", ".join(f"{s}: {gap:+.2f}" for s, gap in conclusion["gap_log_minus_boosting"].items())
    judged = verdict(conclusion["holds"], quick=quick, converged=conclusion["converged"], current=conclusion["current"])
    paper = (
        f"paper: gap {PAPER_F1['sequential log'][-1] - PAPER_F1['boosting'][-1]:.2f} F1 points on S3, about "
        f"{100 * PAPER_FEATURE_FRACTION:.0f}% of the features"
        if task == "ner"
        else "the paper has no POS row"
    )
    return [
        f"Conclusion ({task.upper()}): boosting is competitive with the exact losses on the richest features "
        f"(within {COMPETITIVE_GAP:g} {points} points of the sequential log-loss) while using a small fraction "
        f"(<= {100 * SMALL_FRACTION:g}%) of the weak learners: {judged} ({paper}). Ours: log-loss minus boosting "
        f"{gaps} ({'narrows' if conclusion['gap_narrows_with_features'] else 'does not narrow'} from the poorest to "
        f"the richest set); boosting uses {100 * conclusion['boosting_feature_fraction_richest']:.1f}% of the "
        f"{feature_sets[-1]} weak learners. Judged only from converged rows of the current configuration.",
        "",
    ]


def run(run: RunDirectory, *, quick: bool = False, progress: bool = True, tasks=None) -> dict:
    """Run the experiment (`tasks`: a subset of ("ner", "pos"), or of
    "task-set" names such as "ner-S2", default all)."""
    task_configs = configs(quick)
    if tasks is not None:
        chosen = {}
        for item in tasks:
            task, _, set_name = item.partition("-")
            if task not in task_configs or (set_name and set_name not in task_configs[task]["feature_sets"]):
                raise UsageError(
                    f"--tasks: altun2002's tasks are {', '.join(TASKS)} or TASK-SET (e.g. ner-S2), got {item!r}"
                )
            chosen.setdefault(task, []).append(set_name)
        task_configs = {
            task: dict(
                config, feature_sets=tuple(s for s in config["feature_sets"] if "" in chosen[task] or s in chosen[task])
            )
            for task, config in task_configs.items()
            if task in chosen
        }
    shared = shared_run(run, quick)
    results = {task: _run_task(run, shared, task, config, progress) for task, config in task_configs.items()}
    conclusions = {
        task: check_conclusion(result, task_configs[task]["feature_sets"]) for task, result in results.items()
    }
    shared_path = os.path.relpath(shared.root, run.root)
    pieces = "; ".join(
        f"{task}: {b['piece_length']} tokens, development score every {b['eval_every']} rounds, patience "
        f"{b['patience']}, tol {b['tol']:g} over {b['window']} rounds, cap {b['max_rounds']}"
        for task, b in ((task, config["boosting"]) for task, config in task_configs.items())
    )
    document = [
        "# Altun, Hofmann & Johnson (2002): sequence boosting vs the exact losses",
        "",
        f"Mode: {'quick (small slices, few rounds: not comparable to the paper)' if quick else 'full'}. "
        f"Whole training sets. L-BFGS rows: Gaussian prior sigma^2 = {1 / L2_WEIGHT:g}, until the "
        f"{LBFGS_CRITERION} (altun2003's rule and units). Boosting: line-search bound with per-sequence ranges, no "
        f"prior, on the training sentences cut into pieces ({pieces}), until the development score (NER esp.testa, "
        f"POS the treebank sample) had not improved in `patience` evaluations or the log exp-loss fell by less "
        f"than log(1 + tol) over `window` rounds (or the cap `max_rounds`); the best development evaluation's "
        f"model is scored on test. "
        f"'sequential exp on pieces' is L-BFGS on the objective boosting minimises, same pieces. Weak learners "
        f"used: observation feature x label, label pairs and start labels with a non-zero weight, of all of the "
        f"feature set's. The whole-sentence and boosting rows are altun2003's units (`{shared_path}`), computed once "
        f"for both experiments. Train seconds exclude compilation.",
        "",
        "Paper columns: F1 from Altun et al. 2003 (Table 2, MATH.md section 7; the boosting row there is this "
        "algorithm); token error from Altun et al. 2002 Table 1, read from its garbled text (order uncertain).",
        "",
    ]
    for task, result in results.items():
        sets = task_configs[task]["feature_sets"]
        document += [_tables(task, result, sets), ""]
        document += stale_note(result["rows"])
        document += _conclusion_text(task, conclusions[task], sets, quick)
    boosted = [row for result in results.values() for row in result["rows"] if row["method"] == "boosting"]
    capped = [f"{row['task']} {row['features']}" for row in boosted if not row["convergence"]["met"]]
    document += [
        f"![development score and weak learners used against boosting rounds]({os.path.basename(_plot_rounds(run, results))})",
        "",
        "Note: boosting's fraction of weak learners is bounded by its rounds (R rounds touch at most R weak "
        "learners): "
        + (
            f"the rows {', '.join(capped)} stopped at their round cap, so their fraction is bounded by the cap."
            if capped
            else "every row stopped on a convergence rule (development plateau or exp-loss) before its cap, so "
            "the fraction is the algorithm's, not a cap's."
        ),
        "",
    ]
    document += missing_note(run) + missing_note(shared)
    run.write_text("results.md", "\n".join(document) + "\n")
    summary = {
        "quick": quick,
        "configs": task_configs,
        "l2_weight": L2_WEIGHT,
        "stop": LBFGS_CRITERION,
        "results": results,
        "conclusions": conclusions,
        "paper": {"f1": PAPER_F1, "token_error": PAPER_TOKEN_ERROR, "feature_fraction": PAPER_FEATURE_FRACTION},
    }
    run.write_json("results.json", summary)
    return summary
