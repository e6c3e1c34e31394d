"""Models mapping featurised sentences to chain potentials: the linear-chain
CRF over sparse features (which owns its masked parameterisation), its loss
and decoding over a packed corpus, and label-scheme constraints applied to potentials."""

from . import constraints, packed
from .constraints import constrain
from .linear_chain import ChainStructure, ChainWeights, LinearChainModel
from .packed import TrainingData, batch_loss, blockwise_corpus_loss, corpus_loss, weights_objective

__all__ = [
    "constraints",
    "packed",
    "constrain",
    "ChainStructure",
    "ChainWeights",
    "LinearChainModel",
    "TrainingData",
    "batch_loss",
    "blockwise_corpus_loss",
    "corpus_loss",
    "weights_objective",
]
