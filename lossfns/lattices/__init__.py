"""Forward algorithms over chains and acyclic lattices, specialised by semirings."""

from . import chain
from .chain import FactoredPotentials

__all__ = ["chain", "FactoredPotentials"]
