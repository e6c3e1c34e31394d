"""Models mapping featurised sentences to chain potentials."""

from .linear_chain import LinearChainModel

__all__ = ["LinearChainModel"]
