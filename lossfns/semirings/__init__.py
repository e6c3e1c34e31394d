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
"""The log semiring: `log Z`, marginals by differentiation."""
Max = MaxSemiring()
"""The max-plus semiring: the Viterbi score."""
Real = RealSemiring()
"""The real semiring; for chains and lattices it returns `log Z`, computed exactly as `Log`."""
Entropy = EntropySemiring()
"""The entropy semiring: values are `EntropyValue(log_mass, entropy)`."""
Counting = CountingSemiring()
"""The counting semiring: the number of paths."""
KMax = KMaxSemiring
"""`KMax(k)`: the k best path scores."""

__all__ = [
    "Semiring",
    "LogDomainSemiring",
    "logsumexp",
    "finite_max",
    "pairwise_sum",
    "LogSemiring",
    "MaxSemiring",
    "RealSemiring",
    "EntropySemiring",
    "EntropyValue",
    "KMaxSemiring",
    "CountingSemiring",
    "Log",
    "Max",
    "Real",
    "Entropy",
    "Counting",
    "KMax",
]
