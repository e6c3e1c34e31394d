"""The experiments harness: the quick CLI run (and altun2002's on its units), resumption, the planted-model
generator, the training objective against brute force, and decoding order.

Uses the real corpora when NLTK_DATA has them (CI), else synthetic data.
"""

import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import corpus_or_fail, quick_experiment

from lossfns import checkpoint, optimizers, testing, training
from lossfns.lattices import chain
from lossfns.losses import sequence
from lossfns.training import chain_boosting_data

from experiments import __main__ as experiments_main
from experiments import altun2002, altun2003, synthetic, tagging
from experiments.harness import (
    RunDirectory,
    converged_cell,
    lbfgs_failure,
    markdown_table,
    missing_note,
    plateau_convergence,
    trace_convergence,
    verdict,
)

pytestmark = pytest.mark.float64  # float64 models and oracles (tests/conftest.py)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The README's `python -m experiments altun2003 --quick` (its NER slice), once."""
    out = tmp_path_factory.mktemp("altun2003-quick")
    quick_experiment("altun2003", out, optimised=True)  # its L-BFGS loops run longer than they compile
    return out


@pytest.mark.slow  # about 2 minutes on 2 shared cores, mostly compiling (one L-BFGS loop, three boosting rounds)
def test_quick_run_writes_table_json_plots_and_command(quick_run):
    table = (quick_run / "results.md").read_text()
    for loss in tagging.LOSSES + ("perceptron",):
        assert f"| {loss} |" in table
    assert "73.62" in table  # the paper's S3 sequential log-loss F1 sits beside ours
    # A quick run judges no claim; every row ran to its own criterion, and its cell says which.
    assert "not judged (quick run)" in table and "HOLD" not in table and "| S1 converged |" in table
    assert "Converged: 18 of 18 rows" in table and "not converged" not in table
    summary = json.loads((quick_run / "results.json").read_text())
    assert tuple(summary["tasks"]) == altun2003.QUICK_TASKS == ("ner",)
    assert summary["tasks"]["ner"]["max_length"] == 40 and "of at most 40 tokens" in table
    rows = summary["tasks"]["ner"]["rows"]
    assert {(row["features"], row["loss"]) for row in rows} == {
        (s, loss) for s in ("S1", "S2", "S3") for loss in tagging.LOSSES + ("perceptron", "boosting")
    }
    for row in rows:
        assert 0.0 <= row["score"] <= 100.0 and math.isfinite(row["train_seconds"])
        assert row["nonzero_parameters"] > 0
        # The full runs' stop rule, well inside the full runs' safety cap.
        assert row["convergence"]["met"] and row["steps"] < row["convergence"]["cap"], (row["loss"], row["features"])
        assert row["convergence"]["step"] == row["steps"]
        assert converged_cell(row["convergence"]).startswith("yes: ")
        if row["loss"] == "boosting":  # the library's sequence boosting, to its development plateau
            assert row["log_exp_loss"][-1] < row["log_exp_loss"][0] and row["stopped_by"] == "development plateau"
            assert row["converged"] and row["config"] == altun2003.BOOSTING_QUICK["ner"]
            # Stopped on development scores; the model scored on test is the best evaluation's.
            assert row["curve_split"] == "dev" and row["num_dev_sentences"] > 0
            assert row["best_round"] == max(row["curve"], key=lambda point: point[1])[0] <= row["steps"]
        elif row["loss"] == "perceptron":  # shuffled epochs, the best development epoch kept
            assert len(row["dev_scores"]) == row["steps"] and 1 <= row["best_epoch"] <= row["steps"]
            assert row["dev_scores"][row["best_epoch"] - 1] == max(row["dev_scores"])
        else:
            trace = row["objective_trace"]
            assert all(map(math.isfinite, trace)) and trace[-1] < trace[0]
            # CRFsuite's rule also fires on a rise of the objective: the cell says when it did.
            assert ("on a rise of the objective" in converged_cell(row["convergence"])) == (trace[-1] > trace[-2])
    # A boosting row counts the weak learners of its own feature set, all of
    # which the L2-trained sequential log-loss model of that set makes non-zero.
    for set_name in ("S1", "S2", "S3"):
        by_loss = {row["loss"]: row for row in rows if row["features"] == set_name}
        assert by_loss["boosting"]["num_weak_learners"] == by_loss["sequential log"]["nonzero_parameters"]
    # Richer features must help even on the quick slice (the paper's main finding).
    s1 = np.mean([r["score"] for r in rows if r["features"] == "S1" and r["loss"] in tagging.LOSSES])
    s3 = np.mean([r["score"] for r in rows if r["features"] == "S3" and r["loss"] in tagging.LOSSES])
    assert s3 > s1
    assert (quick_run / "losses_by_feature_set.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    command = (quick_run / "COMMAND.txt").read_text()
    assert "-m experiments altun2003 --quick" in command


def test_altun2002_quick_run_reads_altun2003s_units_and_writes_table_json_plot(quick_run, tmp_path):
    """altun2002's whole-sentence and boosting rows are altun2003's units, read
    from the altun2003 run beside it (here the quick run's, copied), not
    computed again; only its pieces row is its own."""
    corpus_or_fail(("corpora", "conll2002"))
    shared_units = tmp_path / "altun2003-quick" / "units"
    shared_units.mkdir(parents=True)
    names = ["ner-S2-boosting.json", "ner-S2-sequential_exp.json", "ner-S2-sequential_log.json"]
    for name in names:
        shutil.copy(quick_run / "units" / name, shared_units / name)
    before = {name: (shared_units / name).read_bytes() for name in names}
    out = tmp_path / "altun2002"
    quick_experiment("altun2002", out, "--tasks", "ner-S2", optimised=True)
    assert sorted(path.name for path in shared_units.iterdir()) == names
    assert {name: (shared_units / name).read_bytes() for name in names} == before  # read back, not recomputed
    assert [path.name for path in (out / "units").iterdir()] == ["ner-S2-sequential_exp_pieces.json"]
    table = (out / "results.md").read_text()
    assert "66.11" in table and "69.75" in table  # the paper's S2 boosting and log-loss F1 beside ours
    assert "not judged (quick run)" in table and "| S2 converged |" in table
    summary = json.loads((out / "results.json").read_text())
    result = summary["results"]["ner"]
    assert result["source"].startswith("CoNLL-2002")
    rows = {row["method"]: row for row in result["rows"]}
    assert set(rows) == set(altun2002.METHODS)
    for row in rows.values():
        assert 0.0 <= row["score"] <= 100.0 and 0.0 <= row["token_error"] <= 100.0
    boost = rows["boosting"]
    assert 0 < boost["features_used"] <= boost["best_round"] <= boost["steps"] < rows["sequential log"]["features_used"]
    # The model scored is the best development evaluation's: the weak learners chosen up to its round.
    used = altun2002.features_used_by_round(boost["chosen_features"], [boost["best_round"]])[0]
    assert boost["features_used"] == used and boost["curve_split"] == "dev"
    assert boost["convergence"]["cap"] == altun2002.configs(True)["ner"]["boosting"]["max_rounds"]
    pieces = json.loads((out / "units" / "ner-S2-sequential_exp_pieces.json").read_text())
    assert pieces["unit_settings"]["piece_length"] == 8 and pieces["loss"] == "sequential exp"
    assert (out / "boosting_rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "-m experiments altun2002 --quick" in (out / "COMMAND.txt").read_text()


def test_unit_is_computed_once_and_read_back(tmp_path):
    run = RunDirectory(str(tmp_path), ["python", "-m", "experiments", "x"])
    assert run.unit("a", lambda: {"value": 1.5}) == {"value": 1.5}

    def must_not_run():
        raise AssertionError("a finished unit was computed again")

    assert run.unit("a", must_not_run) == {"value": 1.5}
    assert not [name for name in os.listdir(tmp_path / "units") if name.endswith(".tmp")]
    report = RunDirectory(str(tmp_path), ["python"], compute_missing=False)  # --report-only
    assert report.unit("a", must_not_run) == {"value": 1.5}
    assert report.unit("b", must_not_run) is None
    assert report.missing == ["b"] and missing_note(report)[0].endswith("computes them): b.")


def test_a_run_split_by_unit_patterns_computes_only_its_own_units(tmp_path):
    """`--units`: a process computes the units its patterns match; the others
    are read back (stale ones marked) or left missing, as in a report; the
    command written is the whole run's."""

    def must_not_run():
        raise AssertionError("a unit outside the patterns was computed")

    RunDirectory(str(tmp_path)).unit("ner-S1-boosting", lambda: {"value": 0}, {"cap": 1})
    part = RunDirectory(str(tmp_path), ["python"], only=("ner-*-boosting", "pos-S2-*"))
    assert part.unit("ner-S2-boosting", lambda: {"value": 2})["value"] == 2
    assert part.unit("pos-S2-perceptron", lambda: {"value": 3})["value"] == 3
    assert part.unit("ner-S1-boosting", lambda: {"value": 1}, {"cap": 2})["value"] == 1  # stale, recomputed
    assert part.unit("pos-S1-boosting", must_not_run) is None
    stale = RunDirectory(str(tmp_path), ["python"], only=("x",)).unit("ner-S2-boosting", must_not_run, {"cap": 9})
    assert stale["stale"] and stale["value"] == 2
    assert part.missing == ["pos-S1-boosting"]
    assert experiments_main._without_partial_flags(
        ["altun2003", "--units", "ner-*", "--tasks", "ner", "--units=pos-*", "--report-only", "--no-progress"]
    ) == ["altun2003", "--tasks", "ner", "--no-progress"]


def test_unit_settings_decide_whether_a_finished_unit_stands(tmp_path):
    """A unit is recomputed when its settings change; one saved before
    settings were recorded stands only if `legacy` accepts it; a report
    shows a unit of other settings marked stale."""
    run = RunDirectory(str(tmp_path), ["python"])
    first = run.unit("a", lambda: {"value": 1}, {"cap": 10, "rule": (1e-5, 10)})
    assert first == {"value": 1, "unit_settings": {"cap": 10, "rule": [1e-5, 10]}}
    assert run.unit("a", lambda: {"value": 2}, {"cap": 10, "rule": (1e-5, 10)})["value"] == 1  # tuples read back
    report = RunDirectory(str(tmp_path), ["python"], compute_missing=False)
    assert report.unit("a", lambda: {"value": 3}, {"cap": 99}) == first | {"stale": True, "unit": "a"}
    assert run.unit("a", lambda: {"value": 3}, {"cap": 99})["value"] == 3
    run.unit("old", lambda: {"steps": 5})  # no settings: an earlier run
    assert run.unit("old", lambda: {"steps": 7}, {"cap": 99}, legacy=lambda row: row["steps"] < 6)["steps"] == 5
    assert run.unit("old2", lambda: {"steps": 50})["steps"] == 50
    assert run.unit("old2", lambda: {"steps": 7}, {"cap": 99}, legacy=lambda row: row["steps"] < 6)["steps"] == 7


@pytest.mark.parametrize(
    "rule", [optimizers.relative_change_below(1e-3), optimizers.relative_improvement_below(1e-2, 3)]
)
def test_trace_convergence_fires_where_the_training_loop_stops(rule):
    """Oracle: the library's loop run with the same rule over the same
    objective values stops at the step the stored trace says it met it."""
    values = np.array([10.0, 6.0, 4.0, 3.5, 3.3, 3.29, 3.2899, 3.28989, 3.289889, 3.2898889])
    loop = optimizers.run_loop(
        lambda inner, step: (inner, jnp.asarray(values)[step]),
        optimizers.init_loop(jnp.zeros(()), values.size, jnp.float64),
        values.size,
        rule,
    )
    convergence = trace_convergence(values, rule, 100, "rule")
    assert convergence["met"] and convergence["step"] == int(loop.step) < values.size
    capped = trace_convergence(values[:4], rule, 4, "rule")
    assert not capped["met"] and capped["step"] is None
    assert capped["last_relative_change"] == pytest.approx(0.5 / 3.5)
    assert converged_cell(capped) == "not converged (cap 4 reached, last relative change 1.4e-01)"
    assert converged_cell(convergence) == f"yes: rule at step {int(loop.step)}"
    # A row run under an earlier, smaller cap reports that cap.
    assert trace_convergence(values[:4], rule, 2000, "rule")["cap"] == 4
    # A run stopped by a failed line search says so instead of a cap.
    row = {"objective_trace": list(values[:4]), "status": "LINE_SEARCH_FAILED", "restarts": 3}
    failed = trace_convergence(values[:4], rule, 2000, "rule", lbfgs_failure(row))
    assert converged_cell(failed) == (
        "not converged (line search failed at step 4 after 3 restarts, last relative change 1.4e-01)"
    )
    assert lbfgs_failure(row | {"status": "CONVERGED"}) is None
    assert trace_convergence(values, rule, 100, "rule", "ignored when met")["failure"] is None


def test_a_rule_that_fires_on_a_rise_says_so():
    """CRFsuite's rule fires on any rise of the objective (a step the line
    search should have refused): the row is converged by its rule, and its
    cell says the objective rose, by how much."""
    values = [10.0, 6.0, 4.0, 3.5, 3.6]
    rising = trace_convergence(values, optimizers.relative_improvement_below(1e-2, 1), 100, "rule")
    assert rising["met"] and rising["step"] == 5 and rising["rise"] == pytest.approx(0.1 / 3.5)
    assert converged_cell(rising) == "yes: rule at step 5, on a rise of the objective (2.9e-02 relative)"
    assert trace_convergence(values[:4], optimizers.relative_improvement_below(0.2, 1), 100, "rule")["rise"] is None


def test_train_restarts_lbfgs_after_a_failed_line_search(monkeypatch, tmp_path):
    """`tagging.train` retries a run that stopped on a failed line search
    from the point it reached, with a fresh L-BFGS memory, up to
    `MAX_RESTARTS` times, within one step budget; its trace is the runs'
    traces end to end, each restart checkpointing in a directory of its own."""
    calls = []
    real_train = optimizers.train

    def failing_train(objective, params, optimizer, data, **options):
        calls.append((params, options["max_steps"], options["checkpoint_dir"]))
        result = real_train(objective, params, optimizer, data, **(options | {"max_steps": 2, "chunk_steps": 2}))
        return result._replace(status=jnp.int32(optimizers.Status.LINE_SEARCH_FAILED))

    monkeypatch.setattr(tagging.optimizers, "train", failing_train)
    ids = jnp.asarray([[[0], [1], [2]], [[1], [2], [-1]]], jnp.int32)
    bucket = tagging.Bucket(ids, jnp.asarray([[0, 1, 0], [1, 0, -1]], jnp.int32), jnp.asarray([3, 2], jnp.int32))
    result = tagging.train(
        tagging.init_params(3, 2),
        [bucket],
        [np.ones(2)],
        "sequential log",
        l2_weight=0.1,
        max_steps=100,
        stop=optimizers.relative_change_below(0.0),
        checkpoint_dir=str(tmp_path / "run"),
        progress=False,
    )
    assert result.restarts == tagging.MAX_RESTARTS and len(calls) == tagging.MAX_RESTARTS + 1
    assert result.status == "LINE_SEARCH_FAILED" and result.num_steps == result.trace.size == 2 * len(calls)
    assert [budget for _, budget, _ in calls] == [100, 98, 96, 94]
    assert [os.path.basename(directory) for _, _, directory in calls] == [f"restart{k}" for k in range(4)]
    assert np.all(np.diff(result.trace) < 0)  # each restart starts where the last one stopped
    assert not os.path.exists(tmp_path / "run")


def test_plateau_convergence():
    steps, errors = [0, 25, 50, 75, 100, 125, 150], [9.0, 8.0, 8.5, 7.0, 7.5, 7.2, 7.1]
    met = plateau_convergence(steps, errors, 50, 1000, "plateau", lower_is_better=True)
    assert met["met"] and met["step"] == 125 and met["best_step"] == 75  # 50 steps after the best, 75
    # Patience of at least the best step: the best lies in the first half.
    late = plateau_convergence(steps, errors, 50, 1000, "plateau", lower_is_better=True, relative_patience=1.0)
    assert late["met"] and late["step"] == 150  # 75 steps after the best
    late = plateau_convergence(
        steps[:-1], errors[:-1], 50, 1000, "plateau", lower_is_better=True, relative_patience=1.0
    )
    assert not late["met"] and late["best_step"] == 75 and late["cap"] == 125
    assert "cap 125 reached, best development score at step 75" in converged_cell(late)
    scores = [50.0, 60.0, 61.0, 60.5, 60.9, 59.0]  # higher is better, epochs 1..6
    assert plateau_convergence(range(1, 7), scores, 3, 100, "p", lower_is_better=False)["step"] == 6
    assert plateau_convergence(range(1, 6), scores[:5], 3, 100, "p", lower_is_better=False)["met"] is False


def test_verdicts_are_judged_only_from_full_converged_runs():
    assert verdict(True, quick=False, converged=True) == "HOLDS"
    assert verdict(False, quick=False, converged=True) == "DOES NOT HOLD"
    assert verdict(False, quick=False, converged=False) == "not judged (not converged)"
    assert verdict(True, quick=True, converged=True) == "not judged (quick run)"
    assert verdict(None, quick=False, converged=True) == "not tested"
    assert verdict(True, quick=False, converged=True, current=False) == "not judged (rows of an earlier configuration)"


def test_markdown_table():
    assert markdown_table(["a", "b"], [[1.234, None]]) == "| a | b |\n|---|---|\n| 1.23 | - |\n"


# ---------------------------------------------------------------------------
# Planted-model data
# ---------------------------------------------------------------------------


def test_synthetic_corpus_is_deterministic_and_valid_iob2():
    train, test, labels = synthetic.synthetic_corpus(3, "iob", 60, 20)
    again, _, _ = synthetic.synthetic_corpus(3, "iob", 60, 20)
    other, _, _ = synthetic.synthetic_corpus(4, "iob", 60, 20)
    assert train == again and train != other
    assert len(train) == 60 and len(test) == 20 and train != test[:60]
    for words, tags in train + test:
        assert len(words) == len(tags) >= 1 and set(tags) <= set(labels)
        for previous, tag in zip(["O"] + tags[:-1], tags):
            if tag.startswith("I-"):
                assert previous in ("B-" + tag[2:], tag), (previous, tag)
    assert sum(tag != "O" for _, tags in train for tag in tags) > 0


def test_synthetic_spelling_carries_the_label():
    """S2 can only help if spelling predicts labels: the most common label of
    each 3-letter suffix is right far more often than the majority label."""
    train, _, _ = synthetic.synthetic_corpus(0, "pos", 400, 1)
    pairs = [(word[-3:].lower(), tag) for words, tags in train for word, tag in zip(words, tags)]
    by_suffix = {}
    for suffix, tag in pairs:
        by_suffix.setdefault(suffix, []).append(tag)
    suffix_rule = sum(max(map(tags.count, set(tags))) for tags in by_suffix.values()) / len(pairs)
    majority = max(map([t for _, t in pairs].count, {t for _, t in pairs})) / len(pairs)
    assert suffix_rule > majority + 0.3


def test_load_task_falls_back_to_synthetic_without_corpus(no_corpora):
    data = tagging.load_task("ner", 30, 10)
    assert data.source.startswith("synthetic") and data.metric == "entity_f1"
    assert len(data.train) == 30 and len(data.test) == 10 and "O" in data.labels
    with pytest.raises(ValueError, match="task"):
        tagging.load_task("chunking", 3, 3)


# ---------------------------------------------------------------------------
# Objective, training, decoding
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_task():
    pairs, test_pairs, _ = synthetic.synthetic_corpus(1, "iob", 12, 3)
    data = tagging.TaskData(
        "ner",
        tagging._as_sentences(pairs),
        tagging._as_sentences(test_pairs),
        synthetic.planted_model(1, "iob").labels,
        "entity_f1",
        "synthetic",
    )
    return data, tagging.encode_task(data, ("S1", "S2"), num_buckets=2)


def _random_model(encoded, num_labels, seed):
    model = tagging.init_params(encoded.num_features, num_labels, jnp.float64)
    keys = jax.random.split(jax.random.key(seed), 3)
    return model.__class__(
        jax.random.normal(keys[0], model.emission.shape, jnp.float64) * 0.3,
        jax.random.normal(keys[1], model.transitions.shape, jnp.float64),
        jax.random.normal(keys[2], model.start.shape, jnp.float64),
        model.pair_emission,
    )


def test_sequential_exp_objective_equals_brute_force():
    """`N log(mean_i exp-loss_i)` with exp-loss_i = sum over y != gold of
    exp(s(y) - s(gold)), enumerated; zero-weight sentences are left out."""
    L, _T, K = 3, 4, 5
    key = jax.random.key(7)
    model = tagging.init_params(K, L, jnp.float64)
    model = model.__class__(
        jax.random.normal(key, (K, L), jnp.float64), jnp.eye(L) - 0.5, jnp.arange(L) * 0.1, model.pair_emission
    )
    ids = jnp.array(
        [
            [[0, 1], [2, -1], [3, 4], [1, -1]],
            [[4, -1], [0, 2], [-1, -1], [-1, -1]],
            [[1, 3], [-1, -1], [-1, -1], [-1, -1]],
        ],
        jnp.int32,
    )
    bucket = tagging.Bucket(
        ids, jnp.array([[0, 2, 1, 1], [2, 0, -1, -1], [1, -1, -1, -1]], jnp.int32), jnp.array([4, 2, 1], jnp.int32)
    )
    weights = jnp.array([1.0, 1.0, 0.0])
    exp_losses = []
    for b in range(2):
        potentials = model(ids[b])
        assert isinstance(potentials, chain.FactoredPotentials)
        labels, scores = testing.enumerate_sequences(potentials, int(bucket.lengths[b]))
        gold = np.all(labels == np.asarray(bucket.labels[b, : bucket.lengths[b]]), axis=1)
        exp_losses.append(np.sum(np.exp(scores[~gold] - scores[gold][0])))
    expected = 2 * np.log(np.mean(exp_losses))
    objective = jax.jit(tagging.objective, static_argnames=("loss", "l2_weight"))
    value = objective(model, (bucket,), (weights,), loss="sequential exp", l2_weight=0.0)
    np.testing.assert_allclose(value, expected, rtol=1e-10)
    # The log-loss objective is the plain weighted sum plus the prior.
    log_losses = sequence.sequence_log_loss(model(ids), bucket.labels, bucket.lengths)
    prior = 0.5 * 0.3 * sum(float(jnp.sum(x**2)) for x in (model.emission, model.transitions, model.start))
    np.testing.assert_allclose(
        objective(model, (bucket,), (weights,), loss="sequential log", l2_weight=0.3),
        float(jnp.sum(log_losses[:2])) + prior,
        rtol=1e-10,
    )
    gradient = jax.jit(jax.grad(tagging.objective), static_argnums=(3, 4))(
        model, (bucket,), (weights,), "sequential exp", 0.0
    )
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree_util.tree_leaves(gradient))


def test_one_compiled_loop_gives_each_loss_its_own_objective(tiny_task):
    """The objective that `train(..., compiled_with=LOSSES)` compiles once
    (a switch on the loss's index) is, for each index, that loss's own."""
    data, encoded = tiny_task
    buckets = tuple(encoded.train["S2"])
    weights = tuple(jnp.ones(bucket.lengths.shape[0], jnp.float64) for bucket in buckets)
    model = _random_model(encoded, len(data.labels), 5)
    shared = jax.jit(tagging._objective_of(tagging.LOSSES, 0.1))
    own = jax.jit(tagging.objective, static_argnames=("loss", "l2_weight"))
    for index, loss in enumerate(tagging.LOSSES):
        np.testing.assert_allclose(
            shared(model, (buckets, weights, jnp.int32(index))),
            own(model, buckets, weights, loss=loss, l2_weight=0.1),
            rtol=1e-12,
        )


def test_quick_boosting_makes_a_full_pass_every_round():
    """A quick run's boosting data has no incremental tier (its rounds
    compile to one full pass); the full runs keep the library's tiers."""
    rng = np.random.default_rng(0)
    ids, labels, lengths = rng.integers(0, 5, (40, 3, 1)), rng.integers(0, 2, (40, 3)), np.full(40, 3)

    def tiers(config):
        return chain_boosting_data(ids, labels, lengths, 5, 2, **altun2003.boosting_tiers(config, 40)).tiers

    assert tiers(altun2003.BOOSTING_QUICK["ner"]) == ()
    assert tiers(altun2003.BOOSTING["ner"]) == (16,)  # the library's (16, 128, 1024) below 40 pieces


def test_predict_restores_corpus_order(tiny_task):
    """Decoding in length buckets and decoding each sentence alone agree,
    sentence by sentence, in corpus order."""
    data, encoded = tiny_task
    model = _random_model(encoded, len(data.labels), 3)
    together = tagging.predict(model, encoded.test["S2"], encoded.test_order, data.labels)
    alone = []
    for sentence in data.test:
        single = tagging.encode_task(data._replace(test=[sentence]), ("S1", "S2"), num_buckets=1)
        # Same training set, so the feature index and K are those of `encoded`.
        assert single.num_features == encoded.num_features
        alone += tagging.predict(model, single.test["S2"], single.test_order, data.labels)
    assert together == alone
    assert [len(labels) for labels in together] == [len(s.labels) for s in data.test]


def test_training_resumes_from_checkpoint_bit_identical(tiny_task, tmp_path, monkeypatch):
    data, encoded = tiny_task
    buckets = encoded.train["S1"]
    weights = [np.ones(bucket.lengths.shape[0]) for bucket in buckets]
    options = dict(
        l2_weight=0.1, max_steps=6, stop=optimizers.relative_change_below(0.0), progress=False, chunk_steps=2
    )
    start = tagging.init_params(encoded.num_features, len(data.labels))
    reference = tagging.train(start, buckets, weights, "sequential log", checkpoint_dir=None, **options)

    real_save, saves = checkpoint.save, []

    def save_then_crash(path, tree):
        real_save(path, tree)
        saves.append(path)
        if len(saves) == 1:
            raise KeyboardInterrupt("simulated interruption after the first chunk")

    monkeypatch.setattr(checkpoint, "save", save_then_crash)
    directory = str(tmp_path / "checkpoints")
    with pytest.raises(KeyboardInterrupt):
        tagging.train(start, buckets, weights, "sequential log", checkpoint_dir=directory, **options)
    resumed = tagging.train(start, buckets, weights, "sequential log", checkpoint_dir=directory, **options)
    assert len(saves) == 3  # one before the crash, two after resuming (not three)
    assert resumed.num_steps == reference.num_steps == 6
    np.testing.assert_array_equal(resumed.trace, reference.trace)
    for got, want in zip(jax.tree_util.tree_leaves(resumed.params), jax.tree_util.tree_leaves(reference.params)):
        np.testing.assert_array_equal(got, want)
    assert not os.path.exists(directory)


def test_shuffled_perceptron_visits_every_sentence_once_per_epoch(tiny_task):
    """One epoch sees every training sentence once, in an order drawn from
    (seed, epoch): the same seed repeats it, another seed changes it."""
    data, encoded = tiny_task
    buckets = tuple(encoded.train["S1"])
    start = training.perceptron_init(tagging.init_params(encoded.num_features, len(data.labels)))
    epoch = jax.jit(lambda state, seed, step: tagging.shuffled_perceptron_epochs((buckets, seed))(state, step))
    state, mistakes = epoch(start, jnp.uint32(0), 0)
    assert int(state.num_seen) == len(data.train) and 0 < int(mistakes) <= len(data.train)
    again, _ = epoch(start, jnp.uint32(0), 0)
    other, _ = epoch(start, jnp.uint32(1), 0)
    np.testing.assert_array_equal(again.summed_params.emission, state.summed_params.emission)
    assert not np.array_equal(other.summed_params.emission, state.summed_params.emission)


def test_perceptron_stops_on_its_development_plateau(tiny_task):
    data, encoded = tiny_task
    scores = iter([50.0, 60.0, 55.0, 59.0, 58.0, 70.0])  # no better score for 3 epochs after epoch 2

    def dev_score(params):
        dev_score.models.append(params)
        return next(scores)

    dev_score.models = []
    fit = tagging.train_perceptron(
        tagging.init_params(encoded.num_features, len(data.labels)),
        encoded.train["S1"],
        max_epochs=20,
        patience=3,
        seed=0,
        dev_score=dev_score,
        progress=False,
    )
    assert fit.dev_scores == [50.0, 60.0, 55.0, 59.0, 58.0] and fit.best_epoch == 2
    assert fit.stopped_by == "patience" and len(fit.mistakes) == 5
    assert fit.params is dev_score.models[1]
