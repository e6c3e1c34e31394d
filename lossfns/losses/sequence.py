"""Sequence-level objectives of Altun, Johnson & Hofmann (2003): the CRF
log-loss and the sequential exp-loss.

All take chain potentials `[..., T, L, L]` or `FactoredPotentials`, gold `labels
[..., T]` (values past each length are ignored, e.g. -1 padding) and `lengths
[...]`, and return one loss per chain, `[...]`. A gold sequence through a forbidden
(-inf) potential (a labelling against the constraints, e.g. O -> I-PER in IOB2) has
probability 0, so its losses are +inf; the log-losses keep their finite gradient
there (`E_P[S] - S(y)`, the limit), `sequence_exp_loss` returns a zero gradient, so
that masking such examples out with `jnp.where` keeps the batch gradient NaN-free.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..lattices import chain
from .chain_inputs import excess_over_gold


def sequence_log_loss(potentials, labels, lengths=None, *, algorithm: str = "auto"):
    """`log Z(x) - s(x, y) = -log P(y | x)`, the CRF objective.

    Gradient: `E_P[S | x] - S(x, y)`.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `chain.log_partition`.

    Returns:
      `[...]`, the loss per chain.
    """
    log_z = chain.log_partition(potentials, lengths, algorithm=algorithm)
    return excess_over_gold(log_z, chain.score(potentials, labels, lengths))


def row_sequence_log_loss(potentials, labels, starts, lengths=None):
    """`sequence_log_loss` summed over the chains of each row, for rows of
    back-to-back chains (`lattices.chain.row_forward`).

    A corpus packed into such rows trains with one compiled scan and no
    padding inside rows.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`
        over each row's positions.
      labels: `[..., T]` gold label ints in `[0, L)` of the row's chains;
        values past each length are ignored.
      starts: `[..., T]` bool, True at each chain's first position.
      lengths: `[...]` positions used in each row (default `T`).

    Returns:
      `[...]`, per row the sum of its chains' losses.
    """
    log_z = chain.row_log_partition(potentials, starts, lengths)
    return excess_over_gold(log_z, chain.row_score(potentials, labels, starts, lengths))


def sequence_exp_loss(potentials, labels, lengths=None, *, algorithm: str = "auto"):
    """`sum_{y' != y} exp(s(x, y') - s(x, y)) = 1 / P(y | x) - 1`.

    Computed as `expm1(log Z - s)`, exact for small losses. Gradient:
    `(1 / P(y | x)) (E_P[S | x] - S(x, y))`. Upper-bounds the rank loss.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `chain.log_partition`.

    Returns:
      `[...]`, the loss per chain; +inf once `log Z - s` exceeds about 709
        (88 in float32), where `log_sequence_exp_loss` stays finite.
    """
    log_loss = sequence_log_loss(potentials, labels, lengths, algorithm=algorithm)
    # Rounding can make log Z - s a hair negative when the gold sequence holds
    # all the mass; the exact loss there is 0 and its gradient is 0 too.
    # The second `where` gives an infinite loss a zero (not NaN) gradient; a
    # NaN one (NaN input) stays NaN in value and gradient.
    kept = ((log_loss > 0) & jnp.isfinite(log_loss)) | jnp.isnan(log_loss)
    loss = jnp.expm1(jnp.where(kept, log_loss, 0.0))
    return jnp.where(jnp.isinf(log_loss), jnp.inf, loss)


def log_sequence_exp_loss(potentials, labels, lengths=None, *, algorithm: str = "auto"):
    """`log(1 / P(y | x) - 1) = log(1 - P(y | x)) - log P(y | x)`.

    The log of `sequence_exp_loss`, finite for very wrong models where the
    exp-loss overflows. Gradient: `(1 / (1 - P(y | x))) (E_P[S | x] - S(x, y))`.

    Args:
      potentials: `[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`.
      labels: `[..., T]` gold label ints in `[0, L)`; values past each length
        are ignored (e.g. -1 padding).
      lengths: `[...]` ints in `[0, T]`, default `T`.
      algorithm: "sequential", "parallel" or "auto", as in `chain.log_partition`.

    Returns:
      `[...]`, the loss per chain; -inf (with a zero gradient) where the gold
        sequence holds all the mass (e.g. length 0, or one label).
    """
    log_loss = sequence_log_loss(potentials, labels, lengths, algorithm=algorithm)
    positive = (log_loss > 0) | jnp.isnan(log_loss)  # NaN input stays NaN, in the gradient too
    safe = jnp.where(positive, log_loss, 1.0)
    # log(expm1(d)) = d + log(1 - exp(-d)): no overflow for large d, and the
    # correction's derivative goes to 0 (not NaN) as d -> +inf.
    return jnp.where(positive, safe + jnp.log(-jnp.expm1(-safe)), -jnp.inf)
