"""Semirings: the algebra that specialises every forward algorithm.

Use the instances (`Log`, `Max`, `Real`, `Entropy`, `Counting`, or
`KMax(k)`) as the `semiring` argument of `lossfns.lattices` functions.
"""

from .base import LogDomainSemiring, Semiring, finite_max, logsumexp, pairwise_sum
from .counting import CountingSemiring
from .entropy import EntropySemiring, EntropyValue
from .kmax import KMaxSemiring
from .log import LogSemiring
from .max import MaxSemiring
from .real import RealSemiring

Log = LogSemiring()
Max = MaxSemiring()
Real = RealSemiring()
Entropy = EntropySemiring()
Counting = CountingSemiring()
KMax = KMaxSemiring

__all__ = [
    "Semiring", "LogDomainSemiring", "logsumexp", "finite_max", "pairwise_sum",
    "LogSemiring", "MaxSemiring", "RealSemiring", "EntropySemiring", "EntropyValue",
    "KMaxSemiring", "CountingSemiring",
    "Log", "Max", "Real", "Entropy", "Counting", "KMax",
]
