"""The altun2002 and gao2006 experiments: gao2006's quick CLI run on the real
corpora (skipped locally without them, failing in CI; altun2002's runs in
tests/experiments/test_altun2003.py, on the altun2003 quick run's units), and gao2006's
methods (the library's rerankers on their sparse layout) against the dense
ones. (altun2002's boosting is the library's: its oracles are in
tests/training/test_chain_boosting.py.)
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import corpus_or_fail, quick_experiment

from lossfns.optimizers.minimize import init_loop, relative_change_below, run_loop
from lossfns.training import reranking

from experiments import altun2002, gao2006

pytestmark = pytest.mark.float64  # float64 models and oracles (tests/conftest.py)

PNG = b"\x89PNG\r\n\x1a\n"


def _quick(name: str, tasks: str, out) -> None:
    quick_experiment(name, out, "--tasks", tasks)


# ---------------------------------------------------------------------------
# altun2002
# ---------------------------------------------------------------------------


def test_altun2002_features_used_counts_distinct_first_choices():
    chosen = [4, 4, 7, 2, 7, 9]
    assert altun2002.features_used_by_round(chosen, [0, 1, 2, 3, 6]) == [0, 1, 1, 2, 4]


# ---------------------------------------------------------------------------
# gao2006
# ---------------------------------------------------------------------------


@pytest.mark.slow  # about 50 s of CPU: the baseline tagger, its k-best lists, four reranker loops
def test_gao2006_quick_run_writes_table_json_figures(tmp_path):
    corpus_or_fail(("corpora", "brown"))
    corpus_or_fail(("corpora", "conll2000"))
    corpus_or_fail(("taggers", "universal_tagset"))
    _quick("gao2006", "news", tmp_path)
    table = (tmp_path / "results.md").read_text()
    assert "| news (60) |" in table and "3.13" in table  # the paper's Y (800) boosting CER beside ours
    assert "not judged (quick run)" in table and "HOLD" not in table
    summary = json.loads((tmp_path / "results.json").read_text())
    baseline = summary["baselines"]["news"]["test"]
    assert 0.0 <= baseline["oracle_error"] < baseline["baseline_error"] < 100.0
    rows = summary["settings"]["news-60"]
    assert set(rows) == {"boosting", "fslr", "blasso", "fboosting"}
    for row in rows.values():
        curve = row["curve"]
        # Each run stops on its held-out plateau or the cap; the curve ends there.
        assert curve["step"][0] == 0 and curve["step"][-1] == row["run_steps"] <= summary["config"]["num_steps"]
        assert row["convergence"]["met"] or row["run_steps"] == summary["config"]["num_steps"]
        assert curve["exp_loss"][-1] < curve["exp_loss"][0]
        # At step 0 only lambda_0 f_0 scores: the baseline's own ranking.
        assert curve["test_error"][0] == pytest.approx(baseline["baseline_error"], abs=1e-3)
        assert baseline["oracle_error"] - 1e-6 <= row["test_error"]
    for name in ("figure3_l1_vs_loss.png", "figure4_test_error.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG


def _dense_reranking_problem(seed, N=12, C=6, K=9):
    rng = np.random.default_rng(seed)
    features = rng.integers(0, 3, (N, C, K)).astype(np.float64) * (rng.random((N, C, K)) < 0.4)
    features[:, :, 0] = -rng.exponential(2.0, (N, C))
    valid = rng.random((N, C)) < 0.85
    valid[:, 0] = True
    reference = np.array([rng.choice(np.flatnonzero(row)) for row in valid])
    dense = reranking.reranking_data(jnp.asarray(features), jnp.asarray(reference), jnp.asarray(valid))
    differences = np.asarray(dense.differences)
    example, candidate, feature = np.nonzero(differences[:, :, 1:] != 0)
    entries = (example, candidate, feature + 1, differences[example, candidate, feature + 1])
    return dense, reranking.sparse_reranking_data(differences[:, :, 0], entries, valid, dtype=jnp.float64)


def _run(step_fn, data, num_steps=60):
    return run_loop(
        step_fn,
        init_loop(reranking.reranking_init(data), num_steps, jnp.float64),
        num_steps,
        relative_change_below(0.0),
    )


def test_sparse_rerankers_equal_the_library():
    """`step_function` runs the library's methods with the experiment's
    constants: on sparse data, step for step as on dense data; on this
    problem BLasso takes backward steps (its path differs from F-Boosting's)."""
    dense, sparse = _dense_reranking_problem(1)
    library = {
        "boosting": reranking.boosting_with_shrinkage_step_fn(dense, gao2006.SHRINKAGE),
        "fslr": reranking.fslr_step_fn(dense, gao2006.EPSILON),
        "blasso": reranking.blasso_step_fn(dense, gao2006.EPSILON),
        "fboosting": reranking.blasso_step_fn(dense, gao2006.EPSILON, backward=False),
    }
    finals = {}
    for method, step_fn in library.items():
        want, got = _run(step_fn, dense), _run(gao2006.step_function(method, sparse, paper=False), sparse)
        np.testing.assert_allclose(got.inner.weights, want.inner.weights, atol=1e-12)
        np.testing.assert_allclose(got.trace, want.trace, rtol=1e-12)
        np.testing.assert_allclose(
            got.inner.alpha, want.inner.alpha, rtol=1e-9, atol=1e-12
        )  # alpha -> 0: losses' rounding
        finals[method] = np.asarray(got.inner.weights)
    assert not np.allclose(finals["blasso"], finals["fboosting"])


def test_capped_fslr_never_raises_exp_loss():
    """Gao et al.'s FSLR (the optimal step when shorter than epsilon) descends
    monotonically; plain FSLR overshoots on this problem."""
    _, sparse = _dense_reranking_problem(1)
    traces = {
        paper: np.asarray(_run(gao2006.step_function("fslr", sparse, paper=paper), sparse).trace)
        for paper in (True, False)
    }
    assert np.all(np.diff(traces[True]) <= 1e-12)
    assert np.any(np.diff(traces[False]) > 0)


def test_oracle_features_and_differences():
    """The reference is the candidate with the fewest errors (best-ranked on
    ties); the sparse differences are reference minus candidate counts."""
    log_probability = np.array([[-0.1, -1.0, -2.0, -np.inf]])
    candidates = gao2006.Candidates(
        [np.array([[0, 1], [0, 0], [1, 0], [-1, -1]])], log_probability, np.array([[1, 0, 0, 0]]), np.array([2])
    )
    reference = gao2006.oracle(candidates)
    assert reference.tolist() == [1]
    sentence = gao2006.Sentence((("The",), ("dog",)), ("A", "A"))
    counts = gao2006.featurize([sentence], candidates, 2, {})
    assert len(counts[0]) == 3 and all(sum(c.values()) == 3 + 3 + 2 for c in counts[0])  # bigrams, trigrams, pairs
    index = gao2006.build_index(counts * 2, np.array([1, 1]))  # two identical examples: every key seen twice
    baseline, entries, _valid = gao2006.reranking_arrays(counts, log_probability[:, :3], reference, index)
    np.testing.assert_allclose(baseline, [[-1.0 + 0.1, 0.0, 1.0]])
    _example, candidate, feature, value = entries
    assert set(candidate.tolist()) == {0, 2}  # the reference differs from nothing
    inverse = {i: key for key, i in index.items()}
    for c, f, v in zip(candidate, feature, value):
        key = inverse[int(f)]
        assert v == counts[0][1].get(key, 0) - counts[0][c].get(key, 0) != 0


def test_brown_universal_tags():
    corpus_or_fail(("corpora", "brown"))
    corpus_or_fail(("taggers", "universal_tagset"))
    sentences = gao2006.brown_universal(["humor"])
    tags = {tag for sentence in sentences for tag in sentence.labels}
    assert tags <= {"NOUN", "VERB", "ADJ", "ADV", "PRON", "DET", "ADP", "NUM", "CONJ", "PRT", ".", "X"}
    assert len(sentences) > 1000 and sentences[0].words[0] == "It"
    share_x = np.mean([tag == "X" for sentence in sentences for tag in sentence.labels])
    assert share_x < 0.01
