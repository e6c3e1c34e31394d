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
from concurrent import futures

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from lossfns import optimizers
from lossfns.training import boost, boosting_stopped_by, chain_boosting_data, chain_boosting_model, sequence_pieces

from . import tagging
from .harness import (
    RunDirectory,
    converged_cell,
    floors_section,
    lbfgs_failure,
    markdown_table,
    plateau_convergence,
    select_tasks,
    stale_note,
    trace_convergence,
    verdict,
)
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

# The paper states no stopping rule nor iteration counts. Every L-BFGS row
# runs until its objective improved by less than 1e-5 (relative) over 10
# steps (CRFsuite's default `delta` and `period`), with `max_steps` only a
# safety cap far beyond that (the capped runs of 70 / 40 steps were still
# falling 2.6-23.6% over their last 5 steps). The averaged perceptron is
# shuffled each epoch and stopped when its development score (NER:
# esp.testa; POS: the NLTK treebank sample, WSJ sections 00-01) has not
# improved for `perceptron_patience` epochs; the best epoch's model is kept.
# Sized for 2 shared CPU cores: the paper's POS data was 40x larger.
# The pointwise exp-loss creeps: both NER runs still improved 2-4e-5 per 10
# steps at a 2,000-step cap (0.2% over their last 500 steps), so its cap is
# set further out.
POINTWISE_EXP_CAP = {"pointwise exp": 10000}
FULL = {
    "ner": dict(
        num_train=None,
        num_test=None,
        num_dev=None,
        feature_sets=("S1", "S2", "S3"),
        num_buckets=6,
        max_length=None,
        max_steps=2000,
        max_steps_by_loss=POINTWISE_EXP_CAP,
        perceptron_epochs=100,
        perceptron_patience=3,
        curve_sizes=(300, 1000, 3000),
        curve_set="S2",
        curve_losses=LOSSES,
    ),
    "pos": dict(
        num_train=None,
        num_test=None,
        num_dev=None,
        feature_sets=("S1", "S2"),
        num_buckets=6,
        max_length=None,
        max_steps=2000,
        max_steps_by_loss=POINTWISE_EXP_CAP,
        perceptron_epochs=100,
        perceptron_patience=3,
        curve_sizes=(),
        curve_set="S2",
        curve_losses=LOSSES,
    ),
}
# The quick run (the README's first command): small slices, each row run to
# the full runs' own stop rule, so that its table shows converged rows.
# Compiling, not iterating, is most of its time (on 2 shared cores, about
# 30 s for the losses' one L-BFGS loop against 1-5 s for a row to converge,
# 20-25 s for each boosting row's rounds against 3-9 s of rounds), so it
# keeps the shapes few: one length bucket, and one safety cap for every loss
# (a loop's trace is as long as its cap, so another cap is another loop to
# compile). Sentences of at most 40 tokens: a step's time grows with the
# longest sentence (10 ms against 37 ms with the 106 tokens of the longest).
_QUICK_SHAPES = dict(max_length=40, num_buckets=1, max_steps_by_loss={}, curve_sizes=())
QUICK = {
    "ner": dict(FULL["ner"], num_train=140, num_test=140, num_dev=140, **_QUICK_SHAPES),
    "pos": dict(FULL["pos"], num_train=60, num_test=60, num_dev=60, **_QUICK_SHAPES),
}
# A quick run's tasks unless `--tasks` names others: NER alone (the paper's
# Tables 2 and 3, every method at every feature set) fits the README's budget
# of 90 s on 2 cores; POS (`--tasks ner,pos`) adds about 80% to it, as its
# rows compile their own programs (39 labels, its two boosting rows).
QUICK_TASKS = ("ner",)
QUICK_MODE = (
    "quick (small slices, each row run to its criterion: not comparable to the paper; "
    "NER alone unless `--tasks ner,pos`)"
)
LBFGS_STOP = optimizers.relative_improvement_below(1e-5, 10)
# The pointwise losses read the gold marginals in log space since lossfns
# 0.2 (`losses.gold_log_marginals`): units trained on the earlier float32
# marginals (which underflowed, and stopped NER S1's pointwise log-loss on
# failed line searches) are recomputed.
POINTWISE_MARGINALS = "log space"
LBFGS_CRITERION = "objective improved < 1e-5 (relative) over 10 steps"
# Sequence boosting (Altun et al. 2002, the paper's "boosting" row) on the
# full training sets, cut into pieces of 8 tokens (experiments.altun2002).
# Its exp-loss keeps falling long after the tagger stops improving (at the
# earlier 10,000-round cap NER's log exp-loss still fell 0.08-0.19 nats per
# 1,000 rounds), so a row stops on a development plateau: the development
# score (NER esp.testa, POS the treebank sample) every `eval_every` rounds,
# no better one in `patience` evaluations; the best evaluation's model is
# scored on test. The exp-loss rule (tol over `window`) stays; `max_rounds`
# is a safety cap.
BOOSTING = {
    "ner": dict(piece_length=8, max_rounds=100000, tol=1e-3, window=1000, eval_every=1000, patience=5),
    "pos": dict(piece_length=8, max_rounds=100000, tol=1e-3, window=1000, eval_every=1000, patience=5),
}
# Quick boosting: the full runs' rules, with development scores every 50
# rounds (a slice plateaus within a few hundred), and every round a full
# pass over the pieces: compiling the incremental rounds' branches took
# longer (42 s against 17 s on 2 shared cores) than the full passes they
# save on a few hundred pieces.
BOOSTING_QUICK = {task: dict(config, eval_every=50, full_passes=True) for task, config in BOOSTING.items()}
L2_WEIGHT = 0.1  # Gaussian prior sigma^2 = 10, for every loss and task
SEED = 0


def slice_settings(data) -> dict:
    """The unit settings of a slice of short sentences (`tagging.TaskData.max_length`):
    none for the full runs' whole corpora, whose units were saved without it."""
    return {} if data.max_length is None else {"max_length": data.max_length}


def loss_max_steps(config: dict, loss: str) -> int:
    """The safety cap of `loss`'s L-BFGS run: `max_steps`, or the loss's own
    (`max_steps_by_loss`)."""
    return config.get("max_steps_by_loss", {}).get(loss, config["max_steps"])


def train_unit(
    run: RunDirectory,
    name: str,
    data,
    encoded,
    set_name: str,
    loss: str,
    config: dict,
    progress: bool,
    piece_length: int | None = None,
) -> dict:
    """`loss` trained by L-BFGS on the training set (with `piece_length`:
    on the pieces boosting trains on, `boosting_pieces`) until `LBFGS_STOP`
    or its cap; the test score and token error of the final model."""
    max_steps = loss_max_steps(config, loss)

    def compute():
        params = tagging.init_params(encoded.num_features, len(data.labels))
        buckets = encoded.train[set_name]
        if piece_length is not None:
            buckets = [tagging.Bucket(*map(jnp.asarray, boosting_pieces(buckets, piece_length)))]
        weights = [np.ones(bucket.lengths.shape[0]) for bucket in buckets]
        result = tagging.train(
            params,
            buckets,
            weights,
            loss,
            l2_weight=L2_WEIGHT,
            max_steps=max_steps,
            stop=LBFGS_STOP,
            checkpoint_dir=os.path.join(run.root, "checkpoints", name),
            progress=progress,
            # One compiled loop for the four losses on sentences; the pieces are altun2002's one loss.
            compiled_with=LOSSES if piece_length is None else None,
        )
        score, token_error = tagging.decode_scores(result.params, encoded.test[set_name], encoded.test_order, data)
        print(f"  {name}: {score:.2f} ({result.num_steps} steps, {result.train_seconds:.0f} s)", flush=True)
        return {
            "task": data.name,
            "features": set_name,
            "loss": loss,
            "metric": data.metric,
            "score": score,
            "token_error": token_error,
            "piece_length": piece_length,
            "train_seconds": result.train_seconds,
            "compile_seconds": result.compile_seconds,
            "steps": result.num_steps,
            "nonzero_parameters": result.params.num_nonzero(),
            "num_train_sentences": len(data.train),
            "objective_trace": [float(v) for v in result.trace],
            "status": result.status,
            "restarts": result.restarts,
        }

    settings = {
        "max_steps": max_steps,
        "stop": repr(LBFGS_STOP),
        "l2_weight": L2_WEIGHT,
        "num_train": config["num_train"],
        "num_test": config["num_test"],
    }
    if loss.startswith("pointwise"):
        settings["marginals"] = POINTWISE_MARGINALS
    if piece_length is not None:
        settings["piece_length"] = piece_length
    return run.unit(name, compute, settings | slice_settings(data))


def _perceptron_unit(run: RunDirectory, name: str, data, encoded, set_name: str, config: dict, progress: bool) -> dict:
    def compute():
        params = tagging.init_params(encoded.num_features, len(data.labels))
        dev_score = lambda params: tagging.evaluate(params, encoded.dev[set_name], encoded.dev_order, data, "dev")
        fit = tagging.train_perceptron(
            params,
            encoded.train[set_name],
            max_epochs=config["perceptron_epochs"],
            patience=config["perceptron_patience"],
            seed=SEED,
            dev_score=dev_score,
            progress=progress,
        )
        score = tagging.evaluate(fit.params, encoded.test[set_name], encoded.test_order, data)
        print(
            f"  {name}: {score:.2f} (best of {len(fit.mistakes)} epochs: {fit.best_epoch}, {fit.stopped_by}, "
            f"{fit.seconds:.0f} s)",
            flush=True,
        )
        return {
            "task": data.name,
            "features": set_name,
            "loss": "perceptron",
            "metric": data.metric,
            "score": score,
            "train_seconds": fit.seconds,
            "steps": len(fit.mistakes),
            "nonzero_parameters": fit.params.num_nonzero(),
            "num_train_sentences": len(data.train),
            "mistakes_per_epoch": fit.mistakes,
            "dev_scores": fit.dev_scores,
            "best_epoch": fit.best_epoch,
            "stopped_by": fit.stopped_by,
            "num_dev_sentences": len(data.dev),
        }

    settings = {
        "max_epochs": config["perceptron_epochs"],
        "patience": config["perceptron_patience"],
        "shuffle_seed": SEED,
        "num_train": config["num_train"],
        "num_dev": config["num_dev"],
    }
    return run.unit(name, compute, settings | slice_settings(data))


def boosting_pieces(buckets, piece_length: int):
    """`(ids, labels, lengths)` numpy: the sentences of `buckets`
    (`tagging.Bucket`s) cut into pieces (`lossfns.training.sequence_pieces`)."""
    return sequence_pieces(
        [np.asarray(b.ids) for b in buckets],
        [np.asarray(b.labels) for b in buckets],
        [np.asarray(b.lengths) for b in buckets],
        piece_length,
    )


def boosting_unit(run: RunDirectory, name: str, data, encoded, set_name: str, config: dict, progress: bool) -> dict:
    """The library's sequence boosting on pieces of the training set until
    its development plateau, exp-loss rule or cap (development scores every
    `eval_every` rounds); the best evaluation's model is scored on test;
    resumable from the checkpoints of its chunks."""

    def compute():
        pieces = boosting_pieces(encoded.train[set_name], config["piece_length"])
        sparse = chain_boosting_data(
            *pieces, encoded.num_features, len(data.labels), **boosting_tiers(config, len(pieces[2]))
        )
        directory = os.path.join(run.root, "checkpoints", name)
        dev_score = lambda theta, _: tagging.evaluate(
            chain_boosting_model(theta, sparse), encoded.dev[set_name], encoded.dev_order, data, "dev"
        )
        result = boost(
            sparse,
            max_steps=config["max_rounds"],
            tol=config["tol"],
            window=config["window"],
            evaluate=dev_score,
            eval_every=config["eval_every"],
            patience=config["patience"],
            chunk_rounds=config["eval_every"],
            checkpoint_dir=directory,
            progress=progress,
        )
        rounds, evaluations, stopped_by = (
            int(result.num_steps),
            result.records["evaluations"],
            boosting_stopped_by(result),
        )
        best_round = int(evaluations[int(np.argmax(evaluations[:, 1])), 0])
        final, token_error = tagging.decode_scores(
            chain_boosting_model(result.params, sparse), encoded.test[set_name], encoded.test_order, data
        )
        print(
            f"  {name}: {final:.2f} (model of round {best_round} of {rounds}, {stopped_by}, "
            f"{result.run_seconds:.0f} s)",
            flush=True,
        )
        shutil.rmtree(directory, ignore_errors=True)
        return {
            "task": data.name,
            "features": set_name,
            "loss": "boosting",
            "metric": data.metric,
            "score": final,
            "token_error": token_error,
            "train_seconds": result.run_seconds,
            "setup_seconds": result.compile_seconds,
            "steps": rounds,
            "best_round": best_round,
            "rounds_per_second": rounds / max(result.run_seconds, 1e-9),
            "stopped_by": stopped_by,
            "converged": int(result.status) == optimizers.Status.CONVERGED,
            "nonzero_parameters": int(np.count_nonzero(np.asarray(result.params))),
            "num_weak_learners": num_weak_learners(encoded, set_name, len(data.labels)),
            "num_train_sentences": len(data.train),
            "num_dev_sentences": len(data.dev),
            "num_pieces": int(sparse.lengths.shape[0]),
            "config": config,
            "curve": [[int(r), float(v)] for r, v in evaluations],
            "curve_split": "dev",
            "log_exp_loss": [float(v) for v in result.trace[: rounds : max(1, rounds // 200)]],
            "chosen_features": [int(v) for v in result.state.history.feature[:rounds]],
        }

    settings = config | {"num_train": len(data.train), "num_dev": len(data.dev)} | slice_settings(data)
    result = run.unit(name, compute, settings)
    # Units saved before this field was per feature set recorded the size of
    # the index all feature sets share.
    return (
        None
        if result is None
        else result | {"num_weak_learners": num_weak_learners(encoded, set_name, len(data.labels))}
    )


def boosting_tiers(config: dict, num_pieces: int) -> dict:
    """`chain_boosting_data`'s `tiers` for `config`: the library's default,
    or with `full_passes` a single tier of all `num_pieces` pieces, which it
    drops as no cheaper than a full pass (so every round makes one). The
    full configurations have no `full_passes`: their units' settings stay
    those they were run with."""
    return {"tiers": (num_pieces,)} if config.get("full_passes") else {}


def num_weak_learners(encoded, set_name: str, num_labels: int) -> int:
    """Weak learners of a feature set: its observation features x labels, plus
    the transitions and starts (ids are indexed on training, so all occur)."""
    observed = max(int(np.asarray(bucket.ids).max()) for bucket in encoded.train[set_name]) + 1
    return observed * num_labels + num_labels * num_labels + num_labels


def load_and_encode(task: str, config: dict) -> tuple:
    """`(data, encoded)`: the task's corpus as this experiment's units train
    and test on it (`experiments.altun2002` reads the same)."""
    data = tagging.load_task(
        task, config["num_train"], config["num_test"], SEED, num_dev=config["num_dev"], max_length=config["max_length"]
    )
    print(
        f"[{task}] {data.source}: {len(data.train)} train / {len(data.test)} test sentences, {len(data.labels)} labels",
        flush=True,
    )
    return data, tagging.encode_task(data, config["feature_sets"], config["num_buckets"])


def _sequential_rows(run: RunDirectory, task: str, data, encoded, config: dict, progress: bool) -> list:
    """The L-BFGS rows of every (feature set, loss), then the perceptron's."""
    rows = [
        train_unit(run, f"{task}-{set_name}-{loss}".replace(" ", "_"), data, encoded, set_name, loss, config, progress)
        for set_name in config["feature_sets"]
        for loss in LOSSES
    ]
    return rows + [
        _perceptron_unit(run, f"{task}-{set_name}-perceptron", data, encoded, set_name, config, progress)
        for set_name in config["feature_sets"]
    ]


def _run_task(
    run: RunDirectory, task: str, config: dict, progress: bool, boosting: dict | None = None, concurrent=False
) -> dict:
    """`concurrent`: the boosting units in a second thread beside the others
    (a quick run, which is mostly compiling: XLA compiles one program per
    core, and the units share no state); their rows come last either way."""
    data, encoded = load_and_encode(task, config)
    boosting_rows = lambda: [
        boosting_unit(run, f"{task}-{set_name}-boosting", data, encoded, set_name, boosting, progress)
        for set_name in config["feature_sets"]
    ]
    concurrent = concurrent and boosting is not None and run.compute_missing and run.only is None
    with futures.ThreadPoolExecutor(max_workers=1) as pool:
        boosting_future = pool.submit(boosting_rows) if concurrent else None
        rows = _sequential_rows(run, task, data, encoded, config, progress)
    if boosting_future is not None:
        rows += boosting_future.result()
    elif boosting is not None:
        rows += boosting_rows()
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
        curve += [
            row
            for row in (
                train_unit(
                    run,
                    f"{task}-curve{size}-{loss}".replace(" ", "_"),
                    subset,
                    subset_encoded,
                    curve_set,
                    loss,
                    config,
                    progress,
                )
                for loss in config["curve_losses"]
            )
            if row is not None
        ]
    curve += [row for row in rows if row["features"] == curve_set and row["loss"] in config["curve_losses"]]
    return {
        "source": data.source,
        "synthetic": data.source.startswith("synthetic"),
        "metric": data.metric,
        "num_train": len(data.train),
        "num_test": len(data.test),
        "max_length": data.max_length,
        "num_labels": len(data.labels),
        "num_features_K": encoded.num_features,
        "rows": rows,
        "learning_curve": curve,
        "curve_set": curve_set,
    }


def _score(rows, set_name, loss):
    return next((row["score"] for row in rows if row["features"] == set_name and row["loss"] == loss), None)


def row_convergence(row: dict, config: dict) -> dict:
    """Whether a row met its criterion (`harness.trace_convergence` /
    `plateau_convergence`), read from what its unit stored."""
    if row["loss"] in LOSSES:
        return trace_convergence(
            row["objective_trace"], LBFGS_STOP, loss_max_steps(config, row["loss"]), LBFGS_CRITERION, lbfgs_failure(row)
        )
    if row["loss"] == "perceptron":
        patience, cap = config["perceptron_patience"], config["perceptron_epochs"]
        if row.get("stopped_by") == "no mistakes":
            return {"met": True, "criterion": "an epoch without mistakes", "step": row["steps"], "cap": cap}
        scores = row.get("dev_scores", [])
        return plateau_convergence(
            range(1, len(scores) + 1),
            scores,
            patience,
            row["steps"] if not scores else cap,
            f"no better development score for {patience} epochs",
            lower_is_better=False,
        )
    settings = row["config"]
    exp_loss_rule = f"log exp-loss fell < log(1 + {settings['tol']:g}) over {settings['window']} rounds"
    plateau = (
        f"no better development score in {settings.get('patience')} evaluations {settings['eval_every']} rounds apart"
    )
    return {
        "met": row["converged"],
        "step": row["steps"] if row["converged"] else None,
        "cap": settings["max_rounds"],
        "criterion": plateau if row["stopped_by"] == "development plateau" else exp_loss_rule,
    }


def _spread_and_gain(scores, feature_sets, losses) -> tuple:
    """`(largest spread across `losses` within a feature set, smallest gain
    of the last feature set over the first for a loss)`; `scores(set, loss)`."""
    spreads = [
        max(values) - min(values)
        for values in ([scores(s, loss) for loss in losses if scores(s, loss) is not None] for s in feature_sets)
        if values
    ]
    gains = [
        scores(feature_sets[-1], loss) - scores(feature_sets[0], loss)
        for loss in losses
        if None not in (scores(feature_sets[-1], loss), scores(feature_sets[0], loss))
    ]
    return max(spreads, default=None), min(gains, default=None)


def _check_conclusions(task: str, task_result: dict, feature_sets) -> list[dict]:
    """The paper's claims on one task, each `{"claim", "ours", "paper",
    "holds", "converged", "complete"}`, judged from the rows' scores;
    `converged`: every row the claim reads met its criterion."""
    rows = task_result["rows"]
    ours = lambda s, loss: _score(rows, s, loss)
    paper = lambda s, loss: PAPER_NER_F1[loss][("S1", "S2", "S3").index(s)] if task == "ner" else None
    used = lambda losses: [r for r in rows if r["loss"] in losses]
    claims = []
    spread, gain = _spread_and_gain(ours, feature_sets, LOSSES)
    paper_spread, paper_gain = _spread_and_gain(paper, feature_sets, LOSSES) if task == "ner" else (None, None)
    complete = len(used(LOSSES)) == len(LOSSES) * len(feature_sets)
    claims.append(
        {
            "claim": "the four losses differ little while the feature sets matter much (largest spread "
            f"across losses < smallest gain from {feature_sets[0]} to {feature_sets[-1]})",
            "ours": None if not complete else f"spread {spread:.2f}, gain {gain:.2f}",
            "paper": "accuracy 94.6-95.7 across losses and S1/S2 (Table 1)"
            if task == "pos"
            else f"spread {paper_spread:.2f}, gain {paper_gain:.2f}",
            "holds": spread < gain if complete else None,
            "complete": complete,
            "converged": all(r["convergence"]["met"] for r in used(LOSSES)),
        }
    )
    if task == "ner":
        # Perceptron "comparable": within the losses' range, give or take a point, at every feature set.
        def within(scores):
            return all(
                min(scores(s, loss) for loss in LOSSES) - 1
                <= scores(s, "perceptron")
                <= max(scores(s, loss) for loss in LOSSES) + 1
                for s in feature_sets
            )

        losses_complete = complete
        complete = complete and len(used(("perceptron",))) == len(feature_sets)
        claims.append(
            {
                "claim": "the averaged perceptron is comparable to the losses (within their range +- 1 point "
                "at every feature set)",
                "ours": None if not complete else ", ".join(f"{s} {ours(s, 'perceptron'):.2f}" for s in feature_sets),
                "paper": ", ".join(f"{s} {paper(s, 'perceptron'):.2f}" for s in feature_sets),
                "holds": within(ours) if complete else None,
                "complete": complete,
                "converged": all(r["convergence"]["met"] for r in used(LOSSES + ("perceptron",))),
            }
        )
        boosted = len(used(("boosting",))) == len(feature_sets)
        gaps = lambda scores: [min(scores(s, loss) for loss in LOSSES) - scores(s, "boosting") for s in feature_sets]
        claims.append(
            {
                "claim": "sequence boosting trails the losses, most with the poorest features (below every "
                f"loss at every feature set, the gap largest at {feature_sets[0]})",
                "ours": None
                if not (boosted and losses_complete)
                else ", ".join(f"{s} {ours(s, 'boosting'):.2f}" for s in feature_sets),
                "paper": ", ".join(f"{s} {paper(s, 'boosting'):.2f}" for s in feature_sets),
                "holds": (min(gaps(ours)) > 0 and max(gaps(ours)) == gaps(ours)[0])
                if boosted and losses_complete
                else None,
                "complete": boosted and losses_complete,
                "converged": all(r["convergence"]["met"] for r in used(LOSSES + ("boosting",))),
            }
        )
    return claims


def _conclusions_text(task: str, claims: list, quick: bool) -> list[str]:
    lines = [f"Conclusions on {task.upper()} (judged only from rows that met their convergence criterion):", ""]
    for claim in claims:
        judged = verdict(claim["holds"], quick=quick, converged=claim["converged"])
        if not claim["complete"] and not quick:
            judged = "not tested (rows missing)"
        lines.append(f"- {claim['claim']}: {judged}; ours {claim['ours'] or '-'}, paper {claim['paper']}.")
    return lines + [""]


def _convergence_line(rows) -> str:
    """A Markdown line: how many of a table's rows met their criterion, and which did not."""
    missed = [f"{row['features']} {row['loss']}" for row in rows if not row["convergence"]["met"]]
    line = f"Converged: {len(rows) - len(missed)} of {len(rows)} rows, each by the criterion its `converged` cell names"
    return line + (f"; not converged: {', '.join(missed)}.\n" if missed else ".\n")


def _boosting_note(results: dict, quick: bool) -> str:
    """How each boosting row stopped (converged or the round cap), its rounds and wall time."""
    rows = [r for result in results.values() for r in result["rows"] if r["loss"] == "boosting"]
    if not rows:
        return "Boosting (Altun et al. 2002): not run yet.\n"
    parts = [
        f"{r['task']} {r['features']}: {r['steps']} rounds (model of round {r.get('best_round', r['steps'])}), "
        f"{'converged' if r['converged'] else 'not converged'} ({r['stopped_by']}), {r['train_seconds']:.0f} s "
        f"({r['rounds_per_second']:.1f} rounds/s; {r['setup_seconds']:.0f} s to the first round), "
        f"{r['nonzero_parameters']} of {r['num_weak_learners']} weak learners used"
        for r in rows
    ]
    return (
        "Boosting rows: the library's sequence boosting (`lossfns.training.boost` on "
        "`chain_boosting_data`, line-search bound, no prior) on the "
        f"{'training slice (every round a full pass)' if quick else 'full training set'} cut into pieces of "
        f"{rows[0]['config']['piece_length']} tokens, stopped when the development score (every `eval_every` "
        "rounds) had not improved in `patience` evaluations, when the log exp-loss fell by less than "
        "log(1 + tol) over `window` rounds, or at the round cap (configuration in the JSON); the score is "
        "that of the best development evaluation's model (rows of an earlier configuration: the final "
        "model's). " + "; ".join(parts) + ".\n"
    )


def _table(task: str, result: dict, feature_sets) -> str:
    metric = "entity F1 (esp.testb)" if result["metric"] == "entity_f1" else "token accuracy"
    header = ["loss"] + [f"{s} ours" for s in feature_sets]
    header += [f"{s} paper" for s in feature_sets] if task == "ner" else ["paper (S1/S2)"]
    header += [f"{s} converged" for s in feature_sets]
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
        row += [converged_cell(found[s]["convergence"]) if s in found else None for s in feature_sets]
        row += [found[s]["train_seconds"] if s in found else None for s in feature_sets]
        row += [found[s]["nonzero_parameters"] if s in found else None for s in feature_sets]
        rows.append(row)
    short = "" if result["max_length"] is None else f" of at most {result['max_length']} tokens"
    lines = [
        f"### {task.upper()}: {metric}, {result['source']}",
        "",
        f"{result['num_train']} training / {result['num_test']} test sentences{short}, {result['num_labels']} labels.",
        "",
        markdown_table(header, rows),
    ]
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
    """Run the experiment (`tasks`: a subset of ("ner", "pos"); default
    both, or `QUICK_TASKS` in a quick run)."""
    base = QUICK if quick else FULL
    chosen = QUICK_TASKS if quick and tasks is None else tasks
    configs = {task: base[task] for task in select_tasks("altun2003", chosen, tuple(base))}
    boosting = BOOSTING_QUICK if quick else BOOSTING
    results = {
        task: _run_task(run, task, config, progress, boosting.get(task), concurrent=quick)
        for task, config in configs.items()
    }
    for task, result in results.items():
        for row in result["rows"] + result["learning_curve"]:
            row["convergence"] = row_convergence(row, configs[task])
    conclusions = {
        task: _check_conclusions(task, result, configs[task]["feature_sets"]) for task, result in results.items()
    }
    floors = {}
    for (task, set_name, loss), floor in FLOORS.items():
        if task not in results:
            continue
        score = _score(results[task]["rows"], set_name, loss)
        floors[f"{task} {set_name} {loss}"] = {
            "floor": floor,
            "ours": score,
            "applies": not results[task]["synthetic"] and not quick,
            "met": score is not None and score >= floor,
        }
    caps = ", ".join(
        f"{task}: {config['max_steps']} steps ({loss_max_steps(config, 'pointwise exp')} for the pointwise exp-loss), "
        f"{config['perceptron_epochs']} epochs"
        for task, config in configs.items()
    )
    document = [
        "# Altun, Johnson & Hofmann (2003): four losses x feature sets",
        "",
        f"Mode: {QUICK_MODE if quick else 'full'}. "
        f"L-BFGS (optax.lbfgs), Gaussian prior sigma^2 = {1 / L2_WEIGHT:g}, until the "
        f"{LBFGS_CRITERION}; averaged perceptron shuffled each epoch (seed {SEED}) until its development "
        f"score has not improved for {configs[next(iter(configs))]['perceptron_patience']} epochs (the best "
        f"epoch's model is scored; development set: NER esp.testa, POS the NLTK treebank sample); caps "
        f"({caps}): safety limits far beyond convergence. The `converged` columns say "
        f"which criterion each row met and at which step, or why not. L-BFGS seconds exclude compilation (in the JSON); "
        f"averaged-perceptron seconds include it.",
        "",
    ]
    for task, result in results.items():
        document.append(_table(task, result, configs[task]["feature_sets"]))
        document.append(_convergence_line(result["rows"]))
        document += stale_note(result["rows"] + result["learning_curve"])
        document += _conclusions_text(task, conclusions[task], quick)
        if len({r["num_train_sentences"] for r in result["learning_curve"]}) > 1:
            document.append(f"![learning curve]({os.path.basename(_plot_curves(run, task, result))})\n")
    document.append(f"![losses by feature set]({os.path.basename(_plot_feature_sets(run, results))})\n")
    document.append(_boosting_note(results, quick))
    document += floors_section(floors, "issue 7; real corpora, full runs only", "row missing")
    run.write_text("results.md", "\n".join(document) + "\n")
    summary = {
        "quick": quick,
        "l2_weight": L2_WEIGHT,
        "stop": LBFGS_CRITERION,
        "seed": SEED,
        "configs": configs,
        "tasks": results,
        "conclusions": conclusions,
        "floors": floors,
    }
    run.write_json("results.json", summary)
    return summary
