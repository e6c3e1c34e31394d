"""Acyclic lattices (weighted DAG acceptors): `build` makes them (from arcs
or strings; union, padding, stacking, packing), `algorithms` runs the level
scans over them (forward for every semiring, log Z, arc marginals, Viterbi,
and the packed variants). Used as one namespace: `dag.from_arcs(...)`,
`dag.log_partition(...)`."""

from .algorithms import (
    PACKABLE_SEMIRINGS,
    arc_marginals,
    forward,
    log_partition,
    packed_forward,
    packed_log_partition,
    packed_viterbi,
    viterbi,
)
from .build import (
    Lattice,
    PackedLattices,
    enumerate_paths,
    enumerate_strings,
    from_arcs,
    from_arcs_numpy,
    from_string,
    from_strings,
    pack,
    packed_sizes,
    pad,
    stack,
    to_jax,
    union,
)

__all__ = [
    "Lattice",
    "PackedLattices",
    "PACKABLE_SEMIRINGS",
    "arc_marginals",
    "enumerate_paths",
    "enumerate_strings",
    "forward",
    "from_arcs",
    "from_arcs_numpy",
    "from_string",
    "from_strings",
    "log_partition",
    "pack",
    "packed_forward",
    "packed_log_partition",
    "packed_sizes",
    "packed_viterbi",
    "pad",
    "stack",
    "to_jax",
    "union",
    "viterbi",
]
