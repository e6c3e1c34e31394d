"""The lavergne2010 experiment: its quick CLI run (tables, JSON, plot and
command, with the expected rows), resuming a unit from its checkpoint,
convergence from the stored objective traces, the conclusions' verdicts, the
joint POS+chunk label set and the BCD cost count.

The quick run uses the corpora when NLTK_DATA has them (CI), else the planted
synthetic data; the corpus checks fail, not skip, in CI without the corpus.
"""

import functools
import itertools
import json
import math
import os

import jax
import numpy as np
import pytest
from conftest import corpus_or_fail, quick_experiment

from lossfns import corpora, features, models

from experiments import harness, lavergne2010
from experiments.harness import RunDirectory

# The full quick mode also runs `pairs` (the rows of `pos` with pair
# features) and `joint` (another label set, and the BCD probe): each adds
# 30-60 s of compilation.
QUICK_TASKS = ("pos", "sparse")
POS_ROWS = {f"{o}{s}" for o in lavergne2010.OPTIMIZERS for s in ("", " + fine-tuning")} | set(
    lavergne2010.CRFSUITE_ROWS.values()
)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """`python -m experiments lavergne2010 --quick` on QUICK_TASKS, once."""
    out = tmp_path_factory.mktemp("lavergne2010-quick")
    quick_experiment("lavergne2010", out, "--tasks", ",".join(QUICK_TASKS))
    return out


@pytest.mark.slow  # about 40 s of CPU, mostly compiling the optimisation loops
def test_quick_run_writes_tables_json_plot_and_command(quick_run):
    table = (quick_run / "results.md").read_text()
    for name in POS_ROWS:
        assert f"| {name} |" in table
    assert "about 1 hour" in table and "7.89%" in table  # the paper's numbers beside ours
    assert "| sparse |" in table and "| dense |" in table and "16 min" in table  # Table 2, ours and the paper's
    assert "| converged |" in table and "not judged (quick run)" in table and "HOLD" not in table
    summary = json.loads((quick_run / "results.json").read_text())
    tasks = summary["tasks"]
    assert set(tasks) == set(QUICK_TASKS)
    rows = tasks["pos"]["rows"]
    assert {row["optimizer"] for row in rows} == POS_ROWS
    for row in rows + tasks["sparse"]["rows"]:
        assert 0.0 <= row["error"] <= 100.0 and math.isfinite(row["train_seconds"])
        assert row["nonzero"] > 0 and row["iterations"] == len(row["trace"]) >= 1
        assert all(map(math.isfinite, row["trace"])) and "met" in row["convergence"]
    by_name = {row["optimizer"]: row for row in rows}
    for optimizer in lavergne2010.OPTIMIZERS:
        assert by_name[optimizer]["nonzero"] <= tasks["pos"]["num_parameters"]
        # Fine-tuning keeps the support: never more active features than before.
        assert by_name[f"{optimizer} + fine-tuning"]["nonzero"] <= by_name[optimizer]["nonzero"]
        # The curve's last objective is the trace's last (one loop, recorded twice).
        assert by_name[optimizer]["curve"][-1]["objective"] == pytest.approx(by_name[optimizer]["trace"][-1])
    forms = {row["form"]: row for row in tasks["sparse"]["rows"]}
    assert set(forms) == {"sparse", "dense"}
    # The same model and optimizer on two forms of the same forward-backward: the same objectives.
    np.testing.assert_allclose(forms["sparse"]["trace"], forms["dense"]["trace"], rtol=1e-4)
    assert set(summary["conclusions"]) == {"pos", "sparse_fb"}
    assert not os.listdir(quick_run / "checkpoints") or all(
        not (quick_run / "checkpoints" / name).is_dir() for name in os.listdir(quick_run / "checkpoints")
    )  # a finished unit's checkpoints are removed
    assert (quick_run / "error_and_sparsity_vs_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "-m experiments lavergne2010 --quick" in (quick_run / "COMMAND.txt").read_text()


@pytest.fixture(scope="module")
def tiny_task():
    data = lavergne2010.load("pos", dict(num_train=6, num_test=3))
    return data, lavergne2010.encode(data, lavergne2010.Extractor("altun_s1"), 1)


def test_an_interrupted_unit_resumes_from_its_checkpoint(tiny_task, tmp_path):
    """OWL-QN killed after its first chunk, started again: it resumes at that
    chunk's checkpoint and ends where an uninterrupted run ends, with the
    whole curve."""
    data, encoded = tiny_task
    config = dict(lavergne2010.QUICK["pos"], owlqn_steps=6, chunk=3, stop=(0.0, 1))  # never stops early
    model = lavergne2010.chain_model(encoded, len(data.labels))
    calls = []

    def evaluate(model, fail_at=None):
        calls.append(1)
        if len(calls) == fail_at:
            raise KeyboardInterrupt
        return {"error": 0.0, "nonzero": 0}

    fit = functools.partial(lavergne2010.fit, name="u", optimizer="OWL-QN", model=model, train=encoded)
    fit = functools.partial(fit, config=config, progress=False)
    whole, _ = fit(RunDirectory(str(tmp_path / "whole")), evaluate=evaluate)
    interrupted = RunDirectory(str(tmp_path / "interrupted"))
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        fit(interrupted, evaluate=functools.partial(evaluate, fail_at=2))
    assert [p["step"] for p in interrupted.read_json("checkpoints/u.curve.json")] == [3]
    calls.clear()
    resumed, _ = fit(interrupted, evaluate=evaluate)
    assert len(calls) == 1  # only the second chunk ran
    assert resumed.steps == whole.steps == 6 and [p["step"] for p in resumed.curve] == [3, 6]
    np.testing.assert_allclose(resumed.trace, whole.trace, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(resumed.params.emission), np.asarray(whole.params.emission), atol=1e-6)
    # Each process names its machine at its first point, and the report lists the steps each ran.
    assert ["machine" in p for p in whole.curve] == [True, False]
    assert ["machine" in p for p in resumed.curve] == [True, True]
    here = harness.machine()
    row = {"optimizer": "OWL-QN", "machine": here, "curve": resumed.curve}
    (line,) = [line for line in lavergne2010._machines({"pos": {"rows": [row]}}) if line.startswith("- ")]
    assert line.endswith(
        f"run in 2 processes (resumed from checkpoints): steps 1-3 on {here['cpu']}, "
        f"{here['logical_cores']} logical cores, {here['memory_gib']:.0f} GiB; steps 4-6 on "
        f"{here['cpu']}, {here['logical_cores']} logical cores, {here['memory_gib']:.0f} GiB"
    )
    (line,) = [
        line
        for line in lavergne2010._machines({"pos": {"rows": [row | {"curve": whole.curve}]}})
        if line.startswith("- ")
    ]
    assert "resumed" not in line and "of its last process" not in line
    older = [{k: v for k, v in p.items() if k != "machine"} if p["step"] == 3 else p for p in resumed.curve]
    assert [(first, last) for first, last, _ in lavergne2010._processes(older)] == [(1, 3), (4, 6)]
    assert lavergne2010._processes(older)[0][2] is None
    assert lavergne2010._processes([{k: v for k, v in p.items() if k != "machine"} for p in resumed.curve]) == []


def test_a_unit_past_its_time_box_is_reported_time_boxed_and_judged_on_nothing(tiny_task, tmp_path, monkeypatch):
    """OWL-QN stopped by the time box after its first chunk: its row says
    so (not converged, the box and the last relative change), fine-tuning
    is not run, and no claim is judged on it."""
    data, encoded = tiny_task
    config = dict(lavergne2010.QUICK["pos"], owlqn_steps=6, chunk=3, stop=(0.0, 1))  # never stops early
    model = lavergne2010.chain_model(encoded, len(data.labels))
    monkeypatch.setattr(lavergne2010, "TIME_BOX_SECONDS", 1e-9)  # any chunk takes longer
    unit = lavergne2010.chain_unit(RunDirectory(str(tmp_path)), "pos", "OWL-QN", data, encoded, model, config, False)
    (row,) = unit["rows"]  # no fine-tuning row
    assert row["time_boxed"] and row["time_box_seconds"] == 1e-9 and row["iterations"] == 3
    row["convergence"] = lavergne2010.row_convergence(row, config)
    assert not row["convergence"]["met"]
    table = lavergne2010._table4("pos", {"rows": [row]})
    assert "not converged (time-boxed at 0 s, last relative change" in table
    assert "| OWL-QN + fine-tuning | not run (its optimizer was time-boxed) |" in table
    results = _results({"OWL-QN": 3.0, "SGD-L1": 3.0})
    results["pos"]["rows"][1]["time_boxed"] = True
    lines = "\n".join(lavergne2010._conclusion_lines(lavergne2010._check_conclusions(results), quick=False))
    assert "- pos: error against OWL-QN's" in lines and "similar error: not judged (time-boxed)" in lines


def test_crfsuite_is_capped_at_the_iterations_its_time_box_leaves_after_a_probe(tiny_task, tmp_path, monkeypatch):
    """CRFsuite cannot stop on time: a probe's seconds per iteration set its
    cap. A box that leaves nothing after the probe caps it at one
    iteration, reported time-boxed; the cap is the box left after the probe
    and the data, over the probe's later iterations' mean."""
    data, _ = tiny_task
    config = dict(lavergne2010.QUICK["joint"], crfsuite_iterations=10, epoch_stop=(0.0, 1))
    monkeypatch.setattr(lavergne2010, "TIME_BOX_SECONDS", 1e-9)
    unit = lavergne2010.crfsuite_unit(RunDirectory(str(tmp_path)), "pos", "l2sgd", data, config)
    (row,) = unit["rows"]
    assert row["crfsuite_probe"]["iterations"] == 2 and row["crfsuite_probe"]["time_box_cap"] == 1
    assert row["iterations"] == row["crfsuite_params"]["max_iterations"] == 1 and row["time_boxed"]
    monkeypatch.setattr(lavergne2010, "TIME_BOX_SECONDS", 100.0)
    probe = {"seconds": 12.0, "iteration_seconds": [4.0, 3.0, 3.0], "seconds_per_iteration": 3.0}
    assert lavergne2010._crfsuite_time_box_cap(probe, spent=20.0) == (100 - 20 - 2) // 3


def _row(name, trace):
    return {"optimizer": name, "iterations": len(trace), "trace": trace}


def test_convergence_is_read_from_the_trace_by_each_rows_rule():
    config = dict(lavergne2010.FULL["pos"], stop=(1e-3, 2), epoch_stop=(1e-2, 1), finetune_tol=1e-4)
    flat = [100.0, 50.0, 49.99, 49.98, 49.97]  # improves by < 1e-3 over 2 steps from step 4 on
    assert lavergne2010.row_convergence(_row("OWL-QN", flat), config)["step"] == 4
    assert lavergne2010.row_convergence(_row("CRFsuite L-BFGS", flat), config)["step"] == 4
    # The epochs' rule (1e-2 over 1): met at step 3 already.
    assert lavergne2010.row_convergence(_row("SGD-L1", flat), config)["step"] == 3
    assert lavergne2010.row_convergence(_row("BCD", flat), config)["step"] == 3
    falling = [100.0, 90.0, 80.0, 70.0]
    capped = lavergne2010.row_convergence(_row("OWL-QN", falling), config)
    assert not capped["met"] and capped["cap"] == 4 and capped["last_relative_change"] == pytest.approx(10 / 70)
    tuned = lavergne2010.row_convergence(_row("OWL-QN + fine-tuning", [10.0, 9.0, 8.9995]), config)
    assert tuned["met"] and tuned["step"] == 3
    assert not lavergne2010.row_convergence({"optimizer": "BCD", "iterations": 5}, config)["met"]  # no trace


def _results(errors, converged=True, pairs_errors=None, seconds=(10.0, 20.0)):
    """A results dict as `run` builds it: the pos rows with `errors` per
    optimizer, `pairs` rows with `pairs_errors`, and the Table 2 rows."""

    def rows(task, errs):
        return [
            {"optimizer": o, "error": e, "nonzero": 5, "train_seconds": 1.0, "convergence": {"met": converged}}
            for o, e in errs.items()
        ]

    results = {"pos": {"rows": rows("pos", errors), "num_parameters": 1000}}
    if pairs_errors:
        results["pairs"] = {"rows": rows("pairs", pairs_errors), "num_parameters": 5000}
    results["sparse"] = {
        "rows": [
            {"form": form, "train_seconds": s, "convergence": {"met": converged}}
            for form, s in zip(("sparse", "dense"), seconds)
        ]
    }
    return results


def test_conclusions_hold_only_within_the_issues_margins_and_from_converged_rows():
    close = _results({"OWL-QN": 3.0, "SGD-L1": 3.08, "BCD": 2.95}, pairs_errors={"OWL-QN": 2.9, "SGD-L1": 3.0})
    checks = lavergne2010._check_conclusions(close)
    assert checks["pos"]["similar_error"] and checks["pos"]["few_active"] and checks["pair_features"]["holds"]
    assert checks["sparse_fb"]["holds"] and checks["sparse_fb"]["speedup"] == pytest.approx(2.0)
    assert (
        checks["pos"]["best_error"] == pytest.approx(2.95) and checks["pos"]["best_error"] > lavergne2010.TARGET_ERROR
    )
    lines = "\n".join(lavergne2010._conclusion_lines(checks, quick=False))
    assert "similar error: HOLDS" in lines and "they help: HOLDS" in lines and "speeds up training: HOLDS" in lines
    assert "target: at most 2.0%): DOES NOT HOLD" in lines
    far = _results({"OWL-QN": 3.0, "SGD-L1": 3.15, "BCD": 3.0}, pairs_errors={"OWL-QN": 3.1}, seconds=(30.0, 20.0))
    checks = lavergne2010._check_conclusions(far)
    lines = "\n".join(lavergne2010._conclusion_lines(checks, quick=False))
    assert "similar error: DOES NOT HOLD" in lines and "they help: DOES NOT HOLD" in lines
    assert "speeds up training: DOES NOT HOLD" in lines
    unconverged = lavergne2010._check_conclusions(_results({"OWL-QN": 3.0, "SGD-L1": 3.0}, converged=False))
    lines = "\n".join(lavergne2010._conclusion_lines(unconverged, quick=False))
    assert "HOLD" not in lines and "not judged (not converged)" in lines
    assert "HOLD" not in "\n".join(lavergne2010._conclusion_lines(checks, quick=True))


def test_joint_labels_join_pos_and_chunk():
    sentence = corpora.Sentence((("He", "PRP"), ("ran", "VBD")), ("B-NP", "B-VP"))
    joined = lavergne2010.joint_labels(sentence)
    assert joined.tokens == (("He",), ("ran",)) and joined.labels == ("PRP|B-NP", "VBD|B-VP")
    data = lavergne2010.load_joint(20, 5)
    pos = lavergne2010.pos_part(data)
    assert all(label.split("|")[0] in pos.labels for label in data.labels) and len(pos.train) == 20
    assert pos.train[0].labels == tuple(label.split("|")[0] for label in data.train[0].labels)


def test_token_errors_count_the_pos_part_of_joint_labels():
    gold = [("NN|B-NP", "VB|B-VP"), ("DT|B-NP",)]
    predicted = [("NN|I-NP", "VB|B-VP"), ("NN|B-NP",)]
    errors = lavergne2010.token_errors(gold, predicted, joint=True)
    assert errors["error"] == pytest.approx(200 / 3) and errors["pos_error"] == pytest.approx(100 / 3)
    assert lavergne2010.token_errors(gold, gold, joint=False) == {"error": 0.0}


def test_conll2000_joint_label_set():
    corpus_or_fail(("corpora", "conll2000", "train.txt"))
    data = lavergne2010.load_joint(None, 50)
    assert not data.source.startswith("synthetic")
    assert 300 <= len(data.labels) <= 340  # 319 joint labels in train.txt
    assert all(len(label.split("|")) == 2 for label in data.labels)
    assert len(data.test) == 50 and all(len(row) == 1 for s in data.test for row in s.tokens)


def test_synthetic_fallback_without_corpus(no_corpora):
    data = lavergne2010.load_joint(30, 10)
    assert data.source.startswith("synthetic") and len(data.train) == 30 and len(data.test) == 10
    for sentence in data.train:
        tags = [label.split("|") for label in sentence.labels]
        assert tags[0][1] == "B"
        for (previous, _), (tag, part) in itertools.pairwise(tags):
            assert part == ("I" if tag == previous else "B")


def test_bcd_cost_counts_blocks_visits_and_truncated_cells():
    # Oracle: a plain loop over sentences and the tests active in each.
    data = lavergne2010.load("pos", dict(num_train=8, num_test=4))
    encoded = lavergne2010.encode(data, lavergne2010.Extractor("altun_s1", lavergne2010.PAIR_TEMPLATES), 1)
    cost = lavergne2010.bcd_cost(encoded, num_labels=3)
    blocks, visits, cells = set(), 0, 0
    stacked = encoded.stacked
    for ids, kind in ((stacked.unigram_ids, "unigram"), (stacked.pair_ids, "pair"), (None, "transitions")):
        for sentence, length in enumerate(np.asarray(stacked.lengths)):
            positions = {}
            for t in range(length):
                active = ["all"] if ids is None else [k for k in np.asarray(ids[sentence, t]) if k >= 0]
                if kind == "pair" and t == 0:
                    active = []  # pair weights do not apply at a chain's first position
                for k in active:
                    positions.setdefault(k, []).append(t)
            for k, at in positions.items():
                blocks.add((kind, k))
                visits += 1
                cells += length + max(at) - min(at) + 1
    assert cost["blocks"] == len(blocks) and cost["visits"] == visits and cost["truncated_cells"] == cells
    assert cost["multiply_adds_per_sweep"] == cells * 9


def test_pair_features_enter_the_model_and_the_loss(tiny_task):
    """With `B01:%x[0,0]` every token gets one label-pair-observation id (its
    word), the model gets `[K2, L, L]` pair weights, and at zero weights both
    models give the loss of the uniform distribution, `log L` per token."""
    data, without = tiny_task
    with_pairs = lavergne2010.encode(data, lavergne2010.Extractor("altun_s1", lavergne2010.PAIR_TEMPLATES), 1)
    assert without.num_pair == 0 and with_pairs.num_pair > 0
    batch = with_pairs.stacked
    inside = np.arange(batch.labels.shape[1])[None, :] < np.asarray(batch.lengths)[:, None]
    assert np.all((np.asarray(batch.pair_ids)[..., 0] >= 0) == inside)
    tokens = sum(len(s.labels) for s in data.train)
    L = len(data.labels)
    for encoded in (with_pairs, without):
        model = lavergne2010.chain_model(encoded, L)
        uniform = pytest.approx(tokens * np.log(L), rel=1e-5)
        assert float(models.batch_loss(model, encoded.stacked)) == uniform
        # The library's packed path (OWL-QN's and fine-tuning's) reads the same corpus.
        arrays = features.corpus_arrays(encoded.rows, encoded.num_unigram)
        assert float(models.corpus_loss(model, arrays)) == uniform


def test_the_model_is_the_observed_one_and_the_report_counts_both(tiny_task):
    """All three optimizers train `chain_model`: weights on the (test,
    label) pairs and (word, y', y) triples seen in training only; the report
    gives that count and the paper's (every combination), never 'None'."""
    data, _ = tiny_task
    encoded = lavergne2010.encode(data, lavergne2010.Extractor("altun_s1", lavergne2010.PAIR_TEMPLATES), 1)
    L, K, K2 = len(data.labels), encoded.num_unigram, encoded.num_pair
    model = lavergne2010.chain_model(encoded, L)
    emission, pairs = np.asarray(model.emission_mask), np.asarray(model.pair_mask)
    # Oracle: the (test, label) pairs and (word, y', y) triples counted from the sentences.
    seen, triples = set(), set()
    stacked = jax.tree_util.tree_map(np.asarray, encoded.stacked)
    for sentence, length in enumerate(stacked.lengths):
        for t in range(length):
            y = stacked.labels[sentence, t]
            seen |= {(k, y) for k in stacked.unigram_ids[sentence, t] if k >= 0}
            if t:
                triples |= {(k, stacked.labels[sentence, t - 1], y) for k in stacked.pair_ids[sentence, t] if k >= 0}
    assert emission.sum() == len(seen) and pairs.sum() == len(triples)
    transitions = np.asarray(model.weight_masks().transitions).sum()
    assert model.num_parameters() == len(seen) + len(triples) + transitions + L
    assert lavergne2010.possible_features(encoded, L) == K * L + K2 * L * L + L * L + L
    info = lavergne2010._describe(data, encoded, model)
    cell = lavergne2010._features_cell(info)
    assert f"{K * L + K2 * L * L + L * L + L} possible" in cell and f"{model.num_parameters()} in the model" in cell
    assert "None" not in lavergne2010._feature_counts(info) and lavergne2010._feature_counts(None) == "-"


@pytest.mark.slow  # four BCD plans and compilations, about 20 s
def test_bcd_probe_measures_memory_and_extrapolates_the_sweep(tmp_path):
    data = lavergne2010.load_joint(12, 2)
    config = dict(lavergne2010.QUICK["joint"], bcd_probe_sentences=6)
    probe = lavergne2010.bcd_probe(
        RunDirectory(str(tmp_path)), "joint", data, lavergne2010.Extractor("altun_s1"), config
    )
    assert (
        probe["sentences"] == 6 and probe["whole"]["labels"] == len(data.labels) > probe["whole_pos_labels"]["labels"]
    )
    assert probe["whole"]["sweep_seconds"] is None and probe["whole"]["temporary_bytes"] > 0
    assert probe["full_sweep_seconds"] == pytest.approx(probe["whole_pos_labels"]["sweep_seconds"] * probe["ratio"])
    assert probe["ratio"] == pytest.approx(
        probe["subset"]["sweep_seconds"] / probe["subset_pos_labels"]["sweep_seconds"]
    )
    assert probe["fits"]  # a few sentences fit the budget


def test_probe_estimates_add_the_fixed_time_to_the_iterations():
    probe = dict(task="pos", optimizer="SGD-L1", labels=44, possible_features=100, weights_in_model=10)
    probe |= dict(setup_s=10.0, compile_s=5.0, calibration_s=15.0, plan_s=None, first_iteration_s=11.0)
    probe |= dict(per_iteration_s=10.0, peak_gib=2.0)
    failed = {"task": "joint", "optimizer": "BCD", "failed": "over the memory limit"}
    lines = lavergne2010.probe_estimates({"probes": [probe, failed], "limit_gib": 12}, lavergne2010.FULL)
    table = "\n".join(lines)
    # 30 s fixed + 28.5 epochs x 10 s = 315 s; at the cap of 200 epochs: 2030 s.
    assert (
        "| pos | SGD-L1 | 44 | 100 | 10 | 10.00 s | 41 s | 2.0 GiB | 5.2 min (28.5 it.) | 33.8 min (200 it.) |" in table
    )
    assert "not measured: over the memory limit" in table
