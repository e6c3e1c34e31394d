"""models.packed: the loss of a padded batch (`batch_loss`) is the loss of
the same sentences packed in buckets (`corpus_loss`) and the summed
log-loss of the model's potentials."""

import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import features, losses, models

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

K, K2, L = 6, 3, 3


def _sentences(seed):
    rng = np.random.default_rng(seed)
    lengths = [4, 1, 5, 2, 3]
    encoded = [
        (
            [[int(x) for x in rng.integers(0, K, size=rng.integers(0, 3))] for _ in range(n)],
            [[int(x) for x in rng.integers(0, K2, size=rng.integers(0, 2))] for _ in range(n)],
        )
        for n in lengths
    ]
    return encoded, [[int(y) for y in rng.integers(0, L, size=n)] for n in lengths]


def _model(seed):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape))
    return models.LinearChainModel(normal(K, L), normal(L, L), normal(L), normal(K2, L, L))


def test_batch_loss_is_the_packed_corpus_loss():
    encoded, labels = _sentences(0)
    model = _model(1)
    batch = features.pad_batch(encoded, labels)
    value = models.batch_loss(model, batch)
    arrays = features.corpus_arrays(features.pack(encoded, labels, num_buckets=2), K)
    np.testing.assert_allclose(value, models.corpus_loss(model, arrays), rtol=1e-6)
    summed = jnp.sum(losses.sequence_log_loss(model.potentials(batch), batch.labels, batch.lengths))
    np.testing.assert_allclose(value, summed, rtol=1e-6)
    hinge = losses.structured_hinge_loss
    np.testing.assert_allclose(
        models.batch_loss(model, batch, hinge),
        jnp.sum(hinge(model.potentials(batch), batch.labels, batch.lengths)),
        rtol=1e-6,
    )


def test_batch_loss_needs_labels():
    encoded, _ = _sentences(2)
    with pytest.raises(ValueError, match="batch: the loss needs labels"):
        models.batch_loss(_model(3), features.pad_batch(encoded))
