"""Renamed public spellings keep working for one release: each old spelling
warns (a `DeprecationWarning` naming the lossfns function and the new name)
and gives the new spelling's result. Everywhere else pyproject's
`filterwarnings` turns these warnings into errors, so no caller in the
repository still uses an old spelling."""

import importlib
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import tomllib

from lossfns import losses, optimizers, training
from lossfns.deprecation import renamed_arguments


def _old_and_new(old, new, message):
    with pytest.warns(DeprecationWarning, match=message) as record:
        before = old()
    assert record[0].filename == __file__  # attributed to the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        after = new()
    return before, after


def test_hamming_loss_gold_is_labels():
    predicted, gold = np.array([[0, 2, 2, 5]]), np.array([[0, 1, 2, -1]])
    before, after = _old_and_new(
        lambda: losses.hamming_loss(predicted, gold=gold, lengths=np.array([3])),
        lambda: losses.hamming_loss(predicted, labels=gold, lengths=np.array([3])),
        r"^lossfns\.losses\..*hamming_loss: 'gold' is deprecated .* use 'labels'",
    )
    np.testing.assert_array_equal(before, after)
    np.testing.assert_array_equal(after, [1])


def _reranking_inputs():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(3, 4, 2))
    mask = np.ones((3, 4))
    mask[1, 3] = mask[2, 2] = 0
    return features, np.array([0, 1, 3]), mask


def test_reranking_data_valid_is_mask():
    features, reference, mask = _reranking_inputs()
    before, after = _old_and_new(
        lambda: training.reranking_data(features, reference, valid=mask),
        lambda: training.reranking_data(features, reference, mask=mask),
        r"^lossfns\.training\..*reranking_data: 'valid' .* use 'mask'",
    )
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)
    np.testing.assert_array_equal(after.mask, mask)
    with pytest.warns(DeprecationWarning, match=r"RerankingData: 'valid' .* use 'mask'"):
        np.testing.assert_array_equal(after.valid, after.mask)


def test_sparse_reranking_data_valid_is_mask():
    _, _, mask = _reranking_inputs()
    baseline = np.arange(12.0).reshape(3, 4)
    entries = (np.array([0, 1, 2]), np.array([1, 3, 0]), np.array([1, 1, 2]), np.array([0.5, 2.0, -1.0]))
    before, after = _old_and_new(
        lambda: training.sparse_reranking_data(baseline, entries, valid=mask),
        lambda: training.sparse_reranking_data(baseline, entries, mask=mask),
        r"sparse_reranking_data: 'valid' .* use 'mask'",
    )
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)
    assert after.entry_value.shape == (2,)  # the entry of the missing candidate (1, 3) is dropped
    with pytest.warns(DeprecationWarning, match=r"SparseRerankingData: 'valid' .* use 'mask'"):
        np.testing.assert_array_equal(after.valid, mask)


def test_passing_both_spellings_is_refused():
    with pytest.raises(TypeError, match="'labels' and its deprecated name 'gold'"):
        losses.hamming_loss(jnp.zeros((1, 2), int), labels=jnp.zeros((1, 2), int), gold=jnp.zeros((1, 2), int))


def test_the_error_filter_catches_old_spellings_and_nothing_else():
    """pyproject's filter, applied here, makes a lossfns deprecation an error, and no other warning."""
    config = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    [rule] = config["tool"]["pytest"]["ini_options"]["filterwarnings"]
    action, message, category = rule.split(":")
    assert (action, category) == ("error", "DeprecationWarning")

    def function(new):
        return new

    function.__module__, function.__qualname__ = "lossfns.probe", "function"
    function = renamed_arguments(old="new")(function)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings(action, message, DeprecationWarning)
        with pytest.raises(DeprecationWarning, match=r"^lossfns\.probe\.function: 'old'"):
            function(old=1)
        warnings.warn("another library's deprecation", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another library's deprecation"]


@pytest.mark.parametrize(
    "package, name, module",
    [
        ("optimizers", "advance", "optimizers.minimize"),
        ("optimizers", "CONVERGED", "optimizers.minimize"),
        ("optimizers", "sequence_exp_loss", "training.sequence_boosting"),
        ("optimizers", "bcd_loss", "training.bcd"),
        ("optimizers", "SgdL1State", "optimizers.sgd_l1"),
        # the trainers for particular models, moved to lossfns.training
        ("optimizers", "train_linear_chain", "training"),
        ("optimizers", "lazy_epoch_step_fn", "training"),
        ("optimizers", "SequenceData", "training"),
        ("optimizers", "reranking_data", "training"),
        ("features", "check_sentences", "features.corpus"),
        ("features", "ragged_rows", "features.index"),
    ],
)
def test_moved_names_are_still_found_with_a_warning(package, name, module):
    found_in = importlib.import_module(f"lossfns.{package}")
    with pytest.warns(
        DeprecationWarning,
        match=rf"^lossfns\.{package}: '{name}' .* use 'lossfns\.{module.replace('.', '[.]')}\.{name}'",
    ):
        found = getattr(found_in, name)
    assert found is getattr(importlib.import_module(f"lossfns.{module}"), name)
    assert name not in found_in.__all__
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = found_in.no_such_name


@pytest.mark.parametrize("package", ["optimizers", "training", "features"])
def test_the_public_names_are_found_without_a_warning(package):
    found_in = importlib.import_module(f"lossfns.{package}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in found_in.__all__:
            getattr(found_in, name)


def test_run_reranker_num_steps_is_max_steps():
    features, reference, mask = _reranking_inputs()
    data = training.reranking_data(features, reference, mask=mask)
    step_fn = training.fslr_step_fn(data, 0.1)
    before, after = _old_and_new(
        lambda: training.run_reranker(step_fn, data, num_steps=3),
        lambda: training.run_reranker(step_fn, data, max_steps=3),
        r"run_reranker: 'num_steps' .* use 'max_steps'",
    )
    np.testing.assert_array_equal(before.inner.weights, after.inner.weights)
    assert int(after.step) == 3


def test_sequence_boosting_num_rounds_is_max_rounds():
    """The old keyword reaches the new argument (its check names `max_rounds`);
    no run, to spare a compilation (run_reranker above checks a renamed cap's result)."""
    data = training.SequenceData(jnp.zeros((1, 2, 3)), jnp.zeros((1, 2), jnp.int32), jnp.array([2]))
    with (
        pytest.warns(DeprecationWarning, match=r"sequence_boosting: 'num_rounds' .* use 'max_rounds'"),
        pytest.raises(ValueError, match="max_rounds must be"),
    ):
        training.sequence_boosting(lambda theta, x: x, data, 4, num_rounds=0)


def test_boosting_data_sequences_is_data():
    """The old keyword reaches `data` (its check names it); no run, to spare a compilation."""
    with (
        pytest.warns(DeprecationWarning, match=r"boosting_data: 'sequences' .* use 'data'"),
        pytest.raises(TypeError, match="data must be a SequenceData"),
    ):
        training.boosting_data(lambda theta, x: x, sequences=(1, 2), num_features=3)


# Public names of `lossfns.training` added after the split, never exported by `lossfns.optimizers`.
ADDED_TO_TRAINING = {"token_stack", "TokenStack", "sparse_pa_epoch_fn", "sparse_arow_epoch_fn"}


def test_every_trainer_moved_to_training_is_found_in_optimizers():
    """Each public name of `lossfns.training` that `lossfns.optimizers` exported
    before the split is still found there (one release), as the same object."""
    assert ADDED_TO_TRAINING <= set(training.__all__)
    for name in sorted(set(training.__all__) - ADDED_TO_TRAINING):
        with pytest.warns(
            DeprecationWarning, match=rf"^lossfns\.optimizers: '{name}' .* use 'lossfns\.training\.{name}'"
        ):
            assert getattr(optimizers, name) is getattr(training, name)
