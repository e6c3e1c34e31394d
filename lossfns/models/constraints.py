"""Label-scheme constraints applied to a model's potentials.

`lattices.constraints.allowed_transitions(labels, scheme)` says which moves
keep a chunk encoding (IOB2, IOBES, BILOU) valid, as bool masks;
`constrain(potentials, moves, lengths)` sets the forbidden ones to `-inf` in
any potential form (factored, sparse, per-position), so that Viterbi,
k-best and marginals only see valid sequences.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..lattices.chain import FactoredPotentials
from ..lattices.constraints import AllowedTransitions
from ..lattices.sparse_chain import SparsePotentials


def constrain(potentials, moves: AllowedTransitions, lengths):
    """`potentials` with the moves `moves` excludes set to `-inf`.

    potentials: `FactoredPotentials`, `SparsePotentials` or `[..., T, L, L]`;
    lengths: `[...]` int (the end constraint applies at `lengths - 1`).
    """
    transitions, start, end = (jnp.asarray(x) for x in moves)
    if isinstance(potentials, (FactoredPotentials, SparsePotentials)):
        unary = _constrain_end(potentials.unary, end, lengths)
        if isinstance(potentials, FactoredPotentials):
            shared = potentials.transitions
        else:  # the forbidden moves join as a shared transition matrix
            shared = jnp.zeros((), unary.dtype) if potentials.transitions is None else potentials.transitions
        start_scores = jnp.zeros((), unary.dtype) if potentials.start is None else potentials.start  # None: zeros
        return potentials._replace(
            unary=unary,
            transitions=jnp.where(transitions, shared, -jnp.inf),
            start=jnp.where(start, start_scores, -jnp.inf),
        )
    first = jnp.where(start, potentials[..., :1, :, :], -jnp.inf)
    rest = jnp.where(transitions, potentials[..., 1:, :, :], -jnp.inf)
    edges = jnp.concatenate([first, rest], axis=-3)
    last = jnp.arange(edges.shape[-3]) == jnp.asarray(lengths)[..., None] - 1  # [..., T]
    return jnp.where(last[..., None, None] & ~end, -jnp.inf, edges)


def _constrain_end(unary: jax.Array, end: jax.Array, lengths) -> jax.Array:
    """`unary [..., T, L]` with the labels that may not end a sequence at `-inf` at `lengths - 1`."""
    last = jnp.arange(unary.shape[-2]) == jnp.asarray(lengths)[..., None] - 1
    return jnp.where(last[..., None] & ~end, -jnp.inf, unary)
