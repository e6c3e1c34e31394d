"""Forward algorithms over chains and acyclic lattices, specialised by semirings."""

from . import chain, dag, neighbourhoods, tagging
from .chain import FactoredPotentials
from .dag import Lattice

__all__ = ["chain", "dag", "neighbourhoods", "tagging", "FactoredPotentials", "Lattice"]
