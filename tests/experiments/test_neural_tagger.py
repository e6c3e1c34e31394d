"""The neural tagger example (`experiments.neural_tagger`): its quick run
writes the table and every number, and a run killed after an epoch resumes
from its checkpoint to exactly the result of an uninterrupted run."""

import json
import math

import pytest

from experiments import neural_tagger
from experiments.harness import RunDirectory


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("neural-tagger-quick")
    return out, neural_tagger.run(RunDirectory(str(out)), quick=True, progress=False)


def test_quick_run_writes_both_heads_and_the_tagger_row(uninterrupted):
    out, summary = uninterrupted
    assert set(summary["heads"]) == {"crf", "softmax"}
    for result in summary["heads"].values():
        assert len(result["loss"]) == neural_tagger.QUICK["epochs"] and all(map(math.isfinite, result["loss"]))
        assert result["loss"][-1] < result["loss"][0]
        assert 0.0 <= result["test_f1_at_best_dev"] <= 100.0
        assert result["train_tokens_per_second"] > 0 and result["decode_tokens_per_second"] > 0
    table = (out / "results.md").read_text()
    assert "| crf head |" in table and "| softmax head |" in table
    assert json.loads((out / "results.json").read_text())["quick"] is True


def test_an_interrupted_run_resumes_and_loses_nothing(uninterrupted, tmp_path, monkeypatch):
    save = neural_tagger.checkpoint.save

    def save_then_die(path, tree):
        save(path, tree)
        raise KeyboardInterrupt  # killed right after the first epoch's checkpoint

    monkeypatch.setattr(neural_tagger.checkpoint, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        neural_tagger.run(RunDirectory(str(tmp_path)), quick=True, progress=False, tasks=("crf",))
    saved = []
    monkeypatch.setattr(neural_tagger.checkpoint, "save", lambda path, tree: saved.append(save(path, tree)))
    resumed = neural_tagger.run(RunDirectory(str(tmp_path)), quick=True, progress=False, tasks=("crf",))
    assert len(saved) == neural_tagger.QUICK["epochs"] - 1  # only the epochs left were trained
    expected = uninterrupted[1]["heads"]["crf"]
    for key in ("loss", "dev_f1", "test_f1", "test_f1_last"):
        assert resumed["heads"]["crf"][key] == expected[key]
