"""Label-scheme constraints applied to a model's potentials.

`lattices.constraints.allowed_transitions(labels, scheme)` says which moves
keep a chunk encoding (IOB2, IOBES, BILOU) valid, as bool masks;
`constrain(potentials, moves, lengths)` sets the forbidden ones to `-inf` in
any potential form (factored, sparse, per-position), so that Viterbi,
k-best and marginals only see valid sequences.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..lattices import chain
from ..lattices.constraints import AllowedTransitions


def constrain(potentials, moves: AllowedTransitions, lengths):
    """`potentials` with the moves `moves` excludes set to `-inf`.

    potentials: `FactoredPotentials`, `SparsePotentials` or `[..., T, L, L]`
    (returned in the form given); lengths: `[...]` int (the end constraint
    applies at `lengths - 1`).
    """
    transitions, start, end = (jnp.asarray(x) for x in moves)
    form = chain.as_form(potentials)
    constrained = form.forbidding(transitions, start, end, lengths)
    return constrained if form is potentials else constrained.dense_scores()  # per-position scores in, out
