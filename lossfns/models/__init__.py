"""Models mapping featurised sentences to chain potentials: the linear-chain
CRF over sparse features (which owns its masked parameterisation), its loss
and decoding over a packed corpus, and label-scheme constraints."""

from . import constraints, packed
from .constraints import SCHEMES, AllowedMoves, allowed_moves, constrain, scheme_of
from .linear_chain import ChainStructure, ChainWeights, LinearChainModel
from .packed import TrainingData, corpus_loss, corpus_potentials, weights_objective

__all__ = ["constraints", "packed", "SCHEMES", "AllowedMoves", "allowed_moves", "constrain", "scheme_of",
           "ChainStructure", "ChainWeights", "LinearChainModel", "TrainingData", "corpus_loss", "corpus_potentials", "weights_objective"]
