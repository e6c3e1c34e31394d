"""Lattice objectives: contrastive estimation (Smith & Eisner 2005, eq. 5-7) and the EM marginal likelihood as its special case.

A lattice here is a `lossfns.lattices.dag.Lattice` whose paths are the
(string, analysis) pairs being summed, e.g. a sentence intersected with a
tagging model (arcs carry (word, tag) pairs), with log-space `arc_scores
[..., A]` from the model. Both objectives are log-likelihoods, to be
*maximised*; use their negatives as losses.
"""

from __future__ import annotations

import jax.numpy as jnp

from .. import semirings
from ..lattices import dag
from ..semirings import Semiring


def contrastive_log_likelihood(
    numerator_lattice, numerator_scores, denominator_lattice, denominator_scores, *, semiring: Semiring = semirings.Log
):
    """`log sum_y u(x, y) - log sum_{(x', y) in N(x) x Y} u(x', y)`, to maximise.

    Gradient: `E[f | x] - E[f | N(x)]` (forward-backward on both lattices).

    Args:
      numerator_lattice: a `dag.Lattice`, the observed string x with all its
        analyses (unbatched, or with the batch shape of its scores).
      numerator_scores: `[..., A]` its log-space arc scores.
      denominator_lattice: a `dag.Lattice`, the neighbourhood N(x) (which
        contains x) with all its analyses.
      denominator_scores: `[..., A']` its log-space arc scores.
      semiring: `semirings.Log` or `Real` (as `dag.log_partition`).

    Returns:
      `[...]`; at most 0 when the numerator's paths are among the
        denominator's; `-inf` when x has no allowed analysis (also when N(x)
        has none).
    """
    numerator = dag.log_partition(numerator_lattice, numerator_scores, semiring=semiring)
    denominator = dag.log_partition(denominator_lattice, denominator_scores, semiring=semiring)
    # An empty denominator means an empty numerator: -inf, not -inf + inf = NaN.
    return numerator - jnp.where(jnp.isfinite(denominator), denominator, 0.0)


def marginal_log_likelihood(lattice, arc_scores, log_normaliser=0.0, *, semiring: Semiring = semirings.Log):
    """`log sum_y u(x, y) - log_normaliser`: the objective EM climbs.

    Contrastive estimation with the neighbourhood "all strings" (Sigma*),
    whose denominator is the global log normaliser. For a locally normalised
    (generative, e.g. HMM) model whose arc scores are log-probabilities that
    is 0, and this is `log p(x)`; its gradient in the arc scores is the arc
    posteriors (the E-step's expected counts).

    Args:
      lattice: a `dag.Lattice` (unbatched, or with the batch shape of the scores).
      arc_scores: `[..., A]` log-space arc scores.
      log_normaliser: the global log normaliser, a scalar or `[...]` (0 for
        a locally normalised model).
      semiring: `semirings.Log` or `Real` (as `dag.log_partition`).

    Returns:
      `[...]`, the log-likelihood per lattice.
    """
    return dag.log_partition(lattice, arc_scores, semiring=semiring) - log_normaliser
