"""Position-level objectives of Altun, Johnson & Hofmann (2003), built on the
node marginals `P(y_t = j | x)`, and the expected Hamming loss.

Inputs and outputs as in `lossfns.losses.sequence`; each loss sums over the
positions inside each length. The gold labels' marginals are taken in log space
(`lattices.prefix.log_node_marginals`), so a marginal far below the float range
still gives a finite, exact loss and gradient. A gold path through a forbidden
transition makes a loss infinite only where a gold label's marginal is exactly 0
(then +inf with a zero gradient, as for an exp-loss that overflows).
Design notes: docs/internals.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..lattices import prefix
from .chain_inputs import chain_inputs, gold_label_scores


def gold_log_marginals(potentials, labels, lengths=None, *, algorithm: str = "auto"):
    """The gold labels' node marginals `log P(y_t = labels_t | x)`, exact in log space.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `chain.log_partition`.

    Returns:
      log_marginals: `[..., T]`, 0 outside each length.
      inside: `[..., T]` bool, True at the positions inside each length.
    """
    labels, lengths, inside, _ = chain_inputs(potentials, labels, lengths)
    node = prefix.log_node_marginals(potentials, lengths, algorithm=algorithm)
    return jnp.where(inside, gold_label_scores(node, labels, inside), 0.0), inside


def _sum_positions(per_position_loss, log_probability, inside):
    """Sum a loss of the gold log marginal over the positions inside each length.

    A sequence whose sum is not finite (a zero marginal, or a sum beyond the
    float range) is +inf with a zero gradient: `per_position_loss` is
    differentiated only where the whole sum is finite, so no inf reaches
    autodiff (a NaN sum, from NaN input, stays NaN in value and gradient).
    """

    def total(log_p):
        return jnp.sum(jnp.where(inside, per_position_loss(log_p), 0.0), axis=-1)

    checked = total(jax.lax.stop_gradient(log_probability))
    # Only an infinite sum is cut off: a NaN one (a NaN score, a label outside
    # [0, L) under jit) is differentiated, so that its gradient is NaN too.
    kept = ~jnp.isinf(checked)
    return jnp.where(kept, total(jnp.where(kept[..., None], log_probability, 0.0)), jnp.inf)


def pointwise_log_loss(potentials, labels, lengths=None, *, algorithm: str = "auto"):
    """`-sum_t log P(y_t = labels_t | x)`.

    Gradient: `sum_t (E_P[S | x] - E_P[S | x, y_t = labels_t])`.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `chain.log_partition`.

    Returns:
      `[...]`, the loss per chain.
    """
    log_probability, inside = gold_log_marginals(potentials, labels, lengths, algorithm=algorithm)
    return _sum_positions(lambda log_p: -log_p, log_probability, inside)


def pointwise_exp_loss(potentials, labels, lengths=None, *, algorithm: str = "auto"):
    """`sum_t (1 / P(y_t = labels_t | x) - 1)`.

    Its values grow as `1 / P`: in float32 a sequence's loss beyond about
    1e25 can overflow its gradient's intermediates (train such models in
    float64, or with `pointwise_log_loss`).

    Gradient: `sum_t (1 / P(labels_t | x)) (E_P[S | x] - E_P[S | x, y_t = labels_t])`.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `chain.log_partition`.

    Returns:
      `[...]`, the loss per chain.
    """
    log_probability, inside = gold_log_marginals(potentials, labels, lengths, algorithm=algorithm)
    # expm1(-log p) = 1/p - 1, exact near p = 1.
    return _sum_positions(lambda log_p: jnp.expm1(-log_p), log_probability, inside)


def expected_hamming_loss(potentials, labels, lengths=None, *, algorithm: str = "auto"):
    """Expected number of wrong labels under the model, `sum_t (1 - P(y_t = labels_t | x))`.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `chain.log_partition`.

    Returns:
      `[...]`, in `[0, length]`; never infinite.
    """
    log_probability, inside = gold_log_marginals(potentials, labels, lengths, algorithm=algorithm)
    return jnp.sum(jnp.where(inside, -jnp.expm1(log_probability), 0.0), axis=-1)
