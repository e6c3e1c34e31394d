"""The spellings that 0.2 kept for one release (moved names in
`lossfns.optimizers` and `lossfns.features`, renamed arguments and attributes
in `lossfns.training` and `losses.hamming_loss`) are gone in 0.3: each is a
plain `AttributeError` or `TypeError` naming it, and the public names are
found without a warning."""

import importlib
import warnings

import numpy as np
import pytest

from lossfns import features, losses, optimizers, training


@pytest.mark.parametrize("name", ["advance", "train_linear_chain", "reranking_data", "BoostingRun", "MinimizeResult"])
def test_names_that_moved_are_no_longer_found_in_optimizers(name):
    with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
        getattr(optimizers, name)


def test_renamed_arguments_and_attributes_are_gone():
    features, reference = np.zeros((2, 3, 2)), np.array([0, 1])
    with pytest.raises(TypeError, match="valid"):
        training.reranking_data(features, reference, valid=np.ones((2, 3)))
    assert not hasattr(training.reranking_data(features, reference), "valid")
    for function, old in ((training.boost, "max_rounds"), (training.sequence_boosting, "num_rounds")):
        with pytest.raises(TypeError, match=old):
            function(None, **{old: 1})


@pytest.mark.parametrize("name", ["check_sentences", "extractor_spec", "extractor_from_spec", "ragged_rows"])
def test_names_that_moved_are_no_longer_found_in_features(name):
    with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
        getattr(features, name)


def test_hamming_loss_takes_labels_not_gold():
    with pytest.raises(TypeError, match="gold"):
        losses.hamming_loss(np.zeros((1, 2), int), gold=np.zeros((1, 2), int))


@pytest.mark.parametrize("package", ["optimizers", "training"])
def test_the_public_names_are_found_without_a_warning(package):
    found_in = importlib.import_module(f"lossfns.{package}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in found_in.__all__:
            getattr(found_in, name)
