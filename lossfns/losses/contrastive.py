"""Lattice objectives: contrastive estimation (Smith & Eisner 2005, eq. 5-7) and the EM marginal likelihood as its special case.

A lattice here is a `lossfns.lattices.dag.Lattice` (or lattices packed by
`dag.pack`) whose paths are the (string, analysis) pairs being summed, e.g. a
sentence intersected with a tagging model (arcs carry (word, tag) pairs), with
log-space arc scores from the model. The objectives are log-likelihoods, to
be *maximised*; use their negatives as losses.
"""

from __future__ import annotations

import jax.numpy as jnp

from .. import semirings
from ..lattices import dag
from ..semirings import Semiring


def _log_partition(lattice, arc_scores, semiring: Semiring) -> jnp.ndarray:
    """`log Z` of a `dag.Lattice` (`[...]`) or of each of packed lattices (`[B]`)."""
    if isinstance(lattice, dag.PackedLattices):
        return dag.packed_log_partition(lattice, arc_scores, semiring=semiring)
    return dag.log_partition(lattice, arc_scores, semiring=semiring)


def _finite_denominator(denominator):
    """An empty denominator means an empty numerator: counted as 0, so that
    the difference is -inf, not -inf + inf = NaN."""
    return jnp.where(jnp.isfinite(denominator), denominator, 0.0)


def contrastive_log_likelihood(
    numerator_lattice, numerator_scores, denominator_lattice, denominator_scores, *, semiring: Semiring = semirings.Log
):
    """`log sum_y u(x, y) - log sum_{(x', y) in N(x) x Y} u(x', y)`, to maximise.

    Gradient: `E[f | x] - E[f | N(x)]` (forward-backward on both lattices).

    Args:
      numerator_lattice: a `dag.Lattice`, the observed string x with all its
        analyses (unbatched, or with the batch shape of its scores), or a
        `dag.PackedLattices` of `B` such lattices.
      numerator_scores: `[..., A]` its log-space arc scores (`[A]` packed).
      denominator_lattice: a `dag.Lattice`, the neighbourhood N(x) (which
        contains x) with all its analyses, or a `dag.PackedLattices`, as the
        numerator.
      denominator_scores: `[..., A']` its log-space arc scores.
      semiring: `semirings.Log` or `Real` (as `dag.log_partition`).

    Returns:
      `[...]` (`[B]` packed); at most 0 when the numerator's paths are among
        the denominator's; `-inf` when x has no allowed analysis (also when
        N(x) has none).
    """
    numerator = _log_partition(numerator_lattice, numerator_scores, semiring)
    return numerator - _finite_denominator(_log_partition(denominator_lattice, denominator_scores, semiring))


def corpus_contrastive_log_likelihood(lattices, arc_scores, roles, *, semiring: Semiring = semirings.Log):
    """`sum_i log sum_y u(x_i, y) - log sum_{N(x_i) x Y} u(x', y)` over a
    corpus whose sentences' lattices and neighbourhoods' lattices are in one
    batch: packed together (`dag.pack`), both take one scan, not two.

    Args:
      lattices: a `dag.PackedLattices` of `B` lattices, or a `dag.Lattice`
        batch `[B]` (`dag.stack`): each a sentence x_i or a neighbourhood
        N(x_i), with all their analyses.
      arc_scores: their log-space arc scores, `[A]` packed or `[B, A]`.
      roles: `[B]`: 1 for a sentence, -1 for a neighbourhood, 0 for a
        lattice left out (e.g. padding).
      semiring: `semirings.Log` or `Real` (as `dag.log_partition`).

    Returns:
      `[]`, `contrastive_log_likelihood` summed over the sentences; `-inf`
        when a sentence has no allowed analysis.
    """
    log_z = _log_partition(lattices, arc_scores, semiring)
    log_z = jnp.where(roles < 0, _finite_denominator(log_z), log_z)
    return jnp.sum(jnp.where(roles != 0, roles * log_z, 0.0))


def marginal_log_likelihood(lattice, arc_scores, log_normaliser=0.0, *, semiring: Semiring = semirings.Log):
    """`log sum_y u(x, y) - log_normaliser`: the objective EM climbs.

    Contrastive estimation with the neighbourhood "all strings" (Sigma*),
    whose denominator is the global log normaliser. For a locally normalised
    (generative, e.g. HMM) model whose arc scores are log-probabilities that
    is 0, and this is `log p(x)`; its gradient in the arc scores is the arc
    posteriors (the E-step's expected counts).

    Args:
      lattice: a `dag.Lattice` (unbatched, or with the batch shape of the
        scores), or a `dag.PackedLattices` of `B` lattices.
      arc_scores: `[..., A]` log-space arc scores (`[A]` packed).
      log_normaliser: the global log normaliser, a scalar or `[...]` (0 for
        a locally normalised model).
      semiring: `semirings.Log` or `Real` (as `dag.log_partition`).

    Returns:
      `[...]` (`[B]` packed), the log-likelihood per lattice.
    """
    return _log_partition(lattice, arc_scores, semiring) - log_normaliser
