"""The log semiring: sum-product in log space (log-partition, marginals)."""

from .base import LogDomainSemiring, logsumexp


class LogSemiring(LogDomainSemiring):
    """`plus = logaddexp`, `times = +`, zero `-inf`, one `0`.

    `unconvert` gives the log of the semiring sum, e.g. `log Z`.
    """

    name = "log"

    def sum(self, a, axis):
        return logsumexp(a, axis)
