"""The lavergne2010 experiment: its quick CLI run (table, JSON, plot and
command, with the expected rows), the joint POS+chunk and coarse POS label
sets, and the BCD cost estimate.

The quick run uses the corpora when NLTK_DATA has them (CI), else the planted
synthetic data; the corpus checks fail, not skip, in CI without the corpus.
"""

import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import corpus_or_fail

from lossfns import corpora
from lossfns.models.linear_chain import LinearChainModel

from experiments import lavergne2010

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The full quick mode also runs `joint` (the rows of `pos` on another label
# set) and `pairs` (OWL-QN with and without pair features; its model is
# checked below): each adds 20-40 s of compilation.
QUICK_TASKS = ("pos", "blocks", "sparse")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """`python -m experiments lavergne2010 --quick` on QUICK_TASKS, once."""
    out = tmp_path_factory.mktemp("lavergne2010-quick")
    command = [
        sys.executable,
        "-m",
        "experiments",
        "lavergne2010",
        "--quick",
        "--tasks",
        ",".join(QUICK_TASKS),
        "--no-progress",
        "--out",
        str(out),
    ]
    finished = subprocess.run(command, cwd=REPOSITORY, capture_output=True, check=False, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return out


@pytest.mark.slow  # about a minute of CPU, mostly compiling the optimisation loops
def test_quick_run_writes_tables_json_plot_and_command(quick_run):
    table = (quick_run / "results.md").read_text()
    for optimizer in ("OWL-QN", "SGD-L1", "BCD"):
        assert f"| {optimizer} |" in table and f"| {optimizer} + fine-tuning |" in table
    assert "7.89%" in table and "about 1 hour" in table  # the paper's numbers beside ours
    assert "speed-up" in table and "16 min" in table  # Table 2, ours and the paper's
    assert "| converged |" in table and "not judged (quick run)" in table and "HOLD" not in table
    summary = json.loads((quick_run / "results.json").read_text())
    tasks = summary["tasks"]
    assert set(tasks) == set(QUICK_TASKS)
    expected = {
        "pos": {"OWL-QN", "OWL-QN + fine-tuning", "SGD-L1", "SGD-L1 + fine-tuning"},
        "blocks": {f"{o}{s}" for o in lavergne2010.OPTIMIZERS for s in ("", " + fine-tuning")},
    }
    for task, optimizers in expected.items():
        rows = tasks[task]["rows"]
        assert {row["optimizer"] for row in rows} == optimizers
        for row in rows:
            assert 0.0 <= row["error"] <= 100.0 and math.isfinite(row["train_seconds"])
            assert 0 < row["nonzero"] <= tasks[task]["num_parameters"] and row["iterations"] >= 1
            if "curve" in row:
                objectives = [point["objective"] for point in row["curve"]]
                assert all(map(math.isfinite, objectives))
    # Fine-tuning keeps the support: never more active features than before.
    by_name = {row["optimizer"]: row for row in tasks["blocks"]["rows"]}
    for optimizer in lavergne2010.OPTIMIZERS:
        assert by_name[f"{optimizer} + fine-tuning"]["nonzero"] <= by_name[optimizer]["nonzero"]
    records = tasks["sparse"]["records"]
    assert records and all(r["log_z_relative_error"] < 1e-4 and r["median_s"]["sparse"] > 0 for r in records)
    assert set(summary["conclusions"]) == {"pos", "blocks"}
    assert (quick_run / "error_and_sparsity_vs_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "-m experiments lavergne2010 --quick" in (quick_run / "COMMAND.txt").read_text()


def test_rows_are_judged_against_the_caps_they_ran_under():
    """A row of the first runs (saved before settings were recorded) that
    stopped at its cap is not converged, though today's cap is higher."""
    row = {
        "optimizer": "OWL-QN",
        "iterations": 80,
        "curve": [{"step": 70, "objective": 101.0}, {"step": 80, "objective": 100.0}],
    }
    first = lavergne2010.FULL["pos"] | lavergne2010.FIRST_RUN_CAPS["pos"]
    capped = lavergne2010.row_convergence(row, first)
    assert not capped["met"] and capped["cap"] == 80 and capped["last_relative_change"] == pytest.approx(1e-3)
    assert lavergne2010.row_convergence(row, lavergne2010.FULL["pos"])["step"] == 80


def test_joint_labels_join_pos_and_chunk():
    sentence = corpora.Sentence((("He", "PRP"), ("ran", "VBD")), ("B-NP", "B-VP"))
    joined = lavergne2010.joint_labels(sentence)
    assert joined.tokens == (("He",), ("ran",)) and joined.labels == ("PRP|B-NP", "VBD|B-VP")


def test_conll2000_joint_label_set():
    corpus_or_fail(("corpora", "conll2000", "train.txt"))
    data = lavergne2010.load_joint(None, 50)
    assert not data.source.startswith("synthetic")
    assert 300 <= len(data.labels) <= 340  # 319 joint labels in train.txt
    assert all(len(label.split("|")) == 2 for label in data.labels)
    assert len(data.test) == 50 and all(len(row) == 1 for s in data.test for row in s.tokens)


def test_conll2000_coarse_pos_has_twelve_classes():
    corpus_or_fail(("corpora", "conll2000", "train.txt"))
    data = lavergne2010.load_coarse(None, 10)
    assert set(data.labels) == set(lavergne2010.COARSE_POS.values()) | {"."}


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
    data = lavergne2010.load_coarse(8, 4)
    encoded = lavergne2010.encode(data, lavergne2010.Extractor(lavergne2010.BLOCK_TEMPLATES, "B01:%x[0,0]"), 1)
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


def test_pair_features_enter_the_model_and_the_loss():
    """With `B01:%x[0,0]` every token gets one label-pair-observation id (its
    word), the model gets `[K2, L, L]` pair weights, and at zero weights both
    models give the loss of the uniform distribution, `log L` per token."""
    data = lavergne2010.load_coarse(6, 3, max_length=12)
    with_pairs = lavergne2010.encode(data, lavergne2010.Extractor("altun_s1", lavergne2010.PAIR_TEMPLATES), 1)
    without = lavergne2010.encode(data, lavergne2010.Extractor("altun_s1"), 1)
    assert without.num_pair == 0 and with_pairs.num_pair == with_pairs.num_unigram  # one word: one test
    (batch,) = with_pairs.train
    inside = np.arange(batch.labels.shape[1])[None, :] < np.asarray(batch.lengths)[:, None]
    assert np.all((np.asarray(batch.pair_ids)[..., 0] >= 0) == inside)
    tokens = sum(len(s.labels) for s in data.train)
    L = len(data.labels)
    for encoded in (with_pairs, without):
        model = LinearChainModel.zeros(encoded.num_unigram, L, encoded.num_pair)
        assert float(lavergne2010.corpus_loss(model, encoded.train)) == pytest.approx(tokens * np.log(L), rel=1e-5)
