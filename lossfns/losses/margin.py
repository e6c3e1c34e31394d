"""Margin objectives decoded with Viterbi: the perceptron loss (Collins 2002)
and the Hamming-cost-augmented structured hinge (Crammer & Singer style).

Inputs and outputs as in `lossfns.losses.sequence`. Both are piecewise
linear in the potentials; their gradient is the subgradient
`S(x, y_hat) - S(x, y)` for the decoded `y_hat` (ties go to the lowest label
index, as in `chain.viterbi`), so a gradient step on the perceptron loss
with step size 1 is exactly Collins' perceptron update. A gold path through
a forbidden (-inf) potential gives +inf with that same finite subgradient.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..lattices import chain
from .chain_inputs import add_to_label_scores, chain_inputs, excess_over_gold


def _decoded_score(potentials, lengths):
    """Score of the Viterbi sequence, differentiated through `chain.score` at
    the decoded labels (one path, not the tie-averaged derivative of a max)."""
    best, decoded = chain.viterbi(potentials, lengths)
    # When nothing is allowed Viterbi returns -1 labels; any labels will do
    # then, as `excess_over_gold` turns the -inf best score into +inf loss.
    path_score = chain.score(potentials, jnp.maximum(decoded, 0), lengths)
    return jnp.where(jnp.isfinite(best), path_score, best)


def perceptron_loss(potentials, labels, lengths=None):
    """`max_y' s(x, y') - s(x, y)`, the perceptron loss.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.

    Returns:
      `[...]`, `>= 0`; zero iff the gold sequence is a best one.
    """
    chain_inputs(potentials, labels, lengths)
    return excess_over_gold(_decoded_score(potentials, lengths), chain.score(potentials, labels, lengths))


def structured_hinge_loss(potentials, labels, lengths=None, *, cost_weight: float = 1.0):
    """`max_y' [s(x, y') + cost_weight * Hamming(y', y)] - s(x, y)`.

    The Hamming cost is added to the label scores of every wrong label inside
    each length (loss-augmented decoding), then decoded with Viterbi.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      cost_weight: the cost of each wrong label.

    Returns:
      `[...]`, `>= 0`; zero iff the gold sequence beats every other by a
        margin of `cost_weight` per wrong label.
    """
    labels, lengths, inside, L = chain_inputs(potentials, labels, lengths)
    wrong = jnp.arange(L) != jnp.where(inside, labels, -1)[..., None]
    cost = jnp.where(inside[..., None] & wrong, cost_weight, 0.0)
    augmented = add_to_label_scores(potentials, cost)
    return excess_over_gold(_decoded_score(augmented, lengths), chain.score(potentials, labels, lengths))
