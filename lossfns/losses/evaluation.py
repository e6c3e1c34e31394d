"""Evaluation losses (counts, not for gradients): Hamming loss of decoded
labels, posterior (max-marginal) decoding, and the rank loss by brute force."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from ..lattices import chain
from ..validation import as_integer_array, as_lengths
from .chain_inputs import chain_inputs


def hamming_loss(predicted, labels, lengths=None):
    """Number of positions inside each length where `predicted != labels`.

    Args:
      predicted: `[..., T]` integer labels.
      labels: `[..., T]` the gold labels (second, as in every loss); values
        of both past each length are ignored.
      lengths: `[...]` ints in `[0, T]`, default `T`.

    Returns:
      `[...]` int32.
    """
    predicted = as_integer_array("predicted", predicted, "an integer array [..., T]")
    labels = as_integer_array("labels", labels, "an integer array [..., T]")
    for name, array in (("predicted", predicted), ("labels", labels)):
        if array.ndim < 1:
            raise ValueError(f"{name} must have shape [..., T] (rank >= 1), got shape {array.shape}")
    if predicted.shape != labels.shape:
        raise ValueError(
            f"predicted must have the shape of labels {labels.shape} ([..., T]), got shape {predicted.shape}"
        )
    lengths = as_lengths(lengths, labels.shape[:-1], labels.shape[-1])
    inside = jnp.arange(labels.shape[-1]) < lengths[..., None]
    return jnp.sum(inside & (predicted != labels), axis=-1).astype(jnp.int32)


def posterior_decode(potentials, lengths=None, *, algorithm: str = "auto"):
    """The most probable label at each position (argmax of the node marginals).

    Minimises the expected Hamming loss; the result need not be an allowed
    sequence.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `chain.log_partition`.

    Returns:
      `[..., T]` int32, -1 past each length.
    """
    node = chain.node_marginals(potentials, lengths, algorithm=algorithm)
    T = node.shape[-2]
    lengths = as_lengths(lengths, node.shape[:-2], T)
    inside = jnp.arange(T) < lengths[..., None]
    return jnp.where(inside, jnp.argmax(node, axis=-1), -1).astype(jnp.int32)


def rank_loss(potentials, labels, lengths=None, *, max_sequences: int = 100_000):
    """Number of sequences `y' != y` with `s(x, y') >= s(x, y)`.

    Brute force: scores all `L ** T` label sequences, so it is for small
    problems only (tests, toy evaluations). A gold sequence of score -inf
    ranks below every sequence.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      max_sequences: the most sequences `L ** T` it enumerates; beyond, a
        ValueError.

    Returns:
      `[...]` int32.
    """
    labels, lengths, inside, L = chain_inputs(potentials, labels, lengths)
    T = labels.shape[-1]
    if L**T > max_sequences:
        raise ValueError(
            f"rank_loss enumerates L ** T = {L} ** {T} sequences, more than max_sequences = "
            f"{max_sequences}; it is a brute-force evaluation for small problems"
        )
    candidates = jnp.asarray(np.array(list(itertools.product(range(L), repeat=T)), np.int32).reshape(-1, T))
    broadcast = lambda y: jnp.broadcast_to(y, labels.shape)
    scores = jax.vmap(lambda y: chain.score(potentials, broadcast(y), lengths))(candidates)  # [N, ...]
    gold = chain.score(potentials, labels, lengths)
    # Sequences that differ only past the length are the same sequence: count
    # the one whose padding is all label 0.
    candidates = candidates.reshape((-1,) + (1,) * (labels.ndim - 1) + (T,))
    canonical = jnp.all(inside | (candidates == 0), axis=-1)
    different = jnp.any(inside & (candidates != labels), axis=-1)
    return jnp.sum(canonical & different & (scores >= gold), axis=0).astype(jnp.int32)
