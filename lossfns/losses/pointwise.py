"""Position-level objectives of Altun, Johnson & Hofmann (2003), built on the
node marginals `P(y_t = j | x)` (MATH.md section 2, items 3 and 4), and the
expected Hamming loss.

Inputs and outputs as in `lossfns.losses.sequence`. Each loss sums over the
positions inside each length. The marginals come from autodiff of the log
partition, so the gradients below are second derivatives of it and are
differentiable again (`check_grads` to order 2 passes).

Unlike the sequence losses, a gold path through a forbidden transition does
not make these losses infinite: only a gold label whose marginal is exactly
0 at some position does (that position cannot take that label in any
allowed sequence). Such a position contributes +inf with a zero gradient.
Marginals are probabilities, so one below the float range (about 1e-308 in
float64, 1e-38 in float32) also reads as 0.
"""

from __future__ import annotations

import jax.numpy as jnp

from .. import semirings
from ..lattices import chain
from ..semirings import Semiring
from ._chain_inputs import chain_inputs, gold_label_scores


def gold_marginals(potentials, labels, lengths=None, *, semiring: Semiring = semirings.Log, algorithm: str = "auto"):
    """`(P(y_t = labels_t | x) [..., T], inside [..., T] bool)`; the
    probabilities are 0 outside each length."""
    labels, lengths, inside, _ = chain_inputs(potentials, labels, lengths)
    node = chain.node_marginals(potentials, lengths, semiring=semiring, algorithm=algorithm)
    return jnp.where(inside, gold_label_scores(node, labels, inside), 0.0), inside


def _sum_positions(per_position_loss, probability, inside):
    """Sum a loss of the gold marginal over the positions inside each length.

    `per_position_loss` sees only positive probabilities, so no log(0) or
    1/0 reaches autodiff; a zero marginal inside the length gives +inf.
    """
    positive = probability > 0
    terms = per_position_loss(jnp.where(positive, probability, 1.0))
    terms = jnp.where(positive, terms, jnp.inf)
    return jnp.sum(jnp.where(inside, terms, 0.0), axis=-1)


def pointwise_log_loss(
    potentials, labels, lengths=None, *, semiring: Semiring = semirings.Log, algorithm: str = "auto"
):
    """`-sum_t log P(y_t = labels_t | x)`, `[...]`.

    Gradient: `sum_t (E_P[S | x] - E_P[S | x, y_t = labels_t])`.
    """
    probability, inside = gold_marginals(potentials, labels, lengths, semiring=semiring, algorithm=algorithm)
    return _sum_positions(lambda p: -jnp.log(p), probability, inside)


def pointwise_exp_loss(
    potentials, labels, lengths=None, *, semiring: Semiring = semirings.Log, algorithm: str = "auto"
):
    """`sum_t (1 / P(y_t = labels_t | x) - 1)`, `[...]`.

    Gradient: `sum_t (1 / P(labels_t | x)) (E_P[S | x] - E_P[S | x, y_t = labels_t])`.
    """
    probability, inside = gold_marginals(potentials, labels, lengths, semiring=semiring, algorithm=algorithm)
    # (1 - p) / p rather than 1/p - 1: exact near p = 1.
    return _sum_positions(lambda p: (1.0 - p) / p, probability, inside)


def expected_hamming_loss(
    potentials, labels, lengths=None, *, semiring: Semiring = semirings.Log, algorithm: str = "auto"
):
    """Expected number of wrong labels under the model, `sum_t (1 - P(y_t = labels_t | x))`, `[...]`.

    Bounded in `[0, length]`; never infinite.
    """
    probability, inside = gold_marginals(potentials, labels, lengths, semiring=semiring, algorithm=algorithm)
    return jnp.sum(jnp.where(inside, 1.0 - probability, 0.0), axis=-1)
