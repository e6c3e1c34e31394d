"""Differentiable sequence objectives, each a pure function that composes
by plain arithmetic (a weighted sum of losses is an objective).

Chain losses take potentials (`[..., T, L, L]` or a form of `lattices.forms`), gold
`labels [..., T]` and `lengths [...]`, and return `[...]`: `sequence_log_loss`,
`sequence_exp_loss`, `log_sequence_exp_loss`, `row_sequence_log_loss`, `pointwise_log_loss`,
`pointwise_exp_loss`, `expected_hamming_loss`, `perceptron_loss`, `structured_hinge_loss`.
Evaluation: `hamming_loss`, `posterior_decode`, `rank_loss`. Lattices: `contrastive_log_likelihood`,
`marginal_log_likelihood`. Candidates: `reranking_exp_loss`, `reranking_log_loss`. Penalties: `l2`, `l1`, `elastic_net`.
"""

from .contrastive import contrastive_log_likelihood, corpus_contrastive_log_likelihood, marginal_log_likelihood
from .evaluation import hamming_loss, posterior_decode, rank_loss
from .margin import perceptron_loss, structured_hinge_loss
from .pointwise import expected_hamming_loss, gold_log_marginals, pointwise_exp_loss, pointwise_log_loss
from .regularisers import elastic_net, l1, l2
from .reranking import reranking_exp_loss, reranking_log_loss
from .sequence import log_sequence_exp_loss, row_sequence_log_loss, sequence_exp_loss, sequence_log_loss

__all__ = [
    "sequence_log_loss",
    "sequence_exp_loss",
    "log_sequence_exp_loss",
    "row_sequence_log_loss",
    "pointwise_log_loss",
    "pointwise_exp_loss",
    "expected_hamming_loss",
    "gold_log_marginals",
    "perceptron_loss",
    "structured_hinge_loss",
    "hamming_loss",
    "posterior_decode",
    "rank_loss",
    "contrastive_log_likelihood",
    "corpus_contrastive_log_likelihood",
    "marginal_log_likelihood",
    "reranking_exp_loss",
    "reranking_log_loss",
    "l2",
    "l1",
    "elastic_net",
]
