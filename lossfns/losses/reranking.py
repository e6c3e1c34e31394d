"""Candidate-list (reranking) objectives: the ExpLoss of boosting for
reranking (Collins & Koo 2005; Gao, Suzuki & Yu 2006, eq. 6) and its
log-loss (softmax) counterpart.

scores `[..., N]`: model scores of the N candidates of each example (e.g.
`features @ weights`, with the baseline log-probability as feature 0);
reference `[...]` ints: index of the reference (oracle-best) candidate;
mask `[..., N]` bool: which candidates exist (default all), for ragged lists.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..semirings import logsumexp
from ..validation import as_float_array, as_integer_array, check_finite_or_neg_inf, concrete


def _candidate_inputs(scores, reference, mask):
    scores = as_float_array("scores", scores, 1, "[..., N]")
    check_finite_or_neg_inf("scores", scores)
    if scores.shape[-1] == 0:
        raise ValueError(f"scores needs at least one candidate (shape [..., N] with N >= 1), got shape {scores.shape}")
    batch_shape = scores.shape[:-1]
    reference = as_integer_array("reference", reference, f"an integer array of shape {batch_shape}")
    if reference.shape != batch_shape:
        raise ValueError(
            f"reference must have shape {batch_shape} (scores' [..., N] without N), got shape {reference.shape}"
        )
    mask = jnp.ones(scores.shape, bool) if mask is None else jnp.asarray(mask)
    if mask.dtype != jnp.bool_ or mask.shape != scores.shape:
        raise ValueError(
            f"mask must be a bool array of shape {scores.shape} (like scores), got {mask.dtype} of shape {mask.shape}"
        )
    value, mask_value = concrete(reference), concrete(mask)
    if value is not None and mask_value is not None and value.size:
        if value.min() < 0 or value.max() >= scores.shape[-1]:
            raise ValueError(f"reference must lie in [0, {scores.shape[-1]}) (N candidates)")
        if not np.take_along_axis(mask_value, value[..., None], axis=-1).all():
            raise ValueError("reference must index a candidate that mask marks as present")
    reference_score = jnp.take_along_axis(scores, reference[..., None], axis=-1)[..., 0]
    return jnp.where(mask, scores, -jnp.inf), reference_score


def reranking_exp_loss(scores, reference, mask=None, *, include_reference: bool = True):
    """`sum_W exp(-(score(W^R) - score(W)))` over the candidates W.

    The gradient does not depend on `include_reference`:
    `sum_W exp(-M(W^R, W)) (d score(W) - d score(W^R))`. Computed through
    a log-sum-exp, so only the total (never a single term) can overflow.

    Args:
      scores: `[..., N]` model scores of the N candidates of each example.
      reference: `[...]` ints in `[0, N)`, the index of the reference
        (oracle-best) candidate.
      mask: `[..., N]` bool, which candidates exist (default all).
      include_reference: include the reference's own term `exp(0) = 1`
        (Gao et al.'s eq. 6); without it (Collins & Koo) the sum runs over the
        other candidates.

    Returns:
      `[...]`, the loss per example.
    """
    masked, reference_score = _candidate_inputs(scores, reference, mask)
    if not include_reference:
        reference = jnp.asarray(reference)
        is_reference = jnp.arange(masked.shape[-1]) == reference[..., None]
        masked = jnp.where(is_reference, -jnp.inf, masked)
    # A reference at -inf loses to every candidate: infinite loss, not NaN.
    excess = jnp.where(jnp.isfinite(reference_score), logsumexp(masked, -1) - reference_score, jnp.inf)
    return jnp.exp(excess)


def reranking_log_loss(scores, reference, mask=None):
    """`-log softmax(scores)[reference]` over the present candidates.

    Gradient: `E_softmax[d score] - d score(W^R)`.

    Args:
      scores: `[..., N]` model scores of the N candidates of each example.
      reference: `[...]` ints in `[0, N)`, the index of the reference
        (oracle-best) candidate.
      mask: `[..., N]` bool, which candidates exist (default all).

    Returns:
      `[...]`, the loss per example.
    """
    masked, reference_score = _candidate_inputs(scores, reference, mask)
    log_normaliser = logsumexp(masked, -1)
    return jnp.where(jnp.isfinite(reference_score), log_normaliser - reference_score, jnp.inf)
