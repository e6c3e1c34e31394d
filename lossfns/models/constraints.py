"""Label-scheme constraints: which label moves keep a chunk encoding valid.

A chunk scheme marks each label `PREFIX-TYPE` (or the outside label `O`):

* IOB2: `B-` begins a chunk, `I-` continues it;
* IOBES: `B-` begins, `I-` continues, `E-` ends a chunk, `S-` is a single-token chunk;
* BILOU: the same as IOBES with `L-` (last) and `U-` (unit).

`allowed_moves(labels, scheme)` gives the moves that keep a sequence valid
as `AllowedMoves(transitions [L, L], start [L], end [L])` bool masks, and
`constrain(potentials, moves, lengths)` sets the forbidden ones to `-inf` in
any potential form (factored, sparse, per-position), so that Viterbi,
k-best and marginals only see valid sequences. A new scheme is one more
entry of `SCHEMES`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..lattices.chain import FactoredPotentials
from ..lattices.sparse_chain import SparsePotentials


class Scheme(NamedTuple):
    """The prefixes of a chunk scheme: `begin` and `inside` (continue a chunk),
    `last` (ends one), `unit` (a whole chunk); None when the scheme has none."""

    begin: str
    inside: str
    last: Optional[str] = None
    unit: Optional[str] = None


SCHEMES = {"IOB2": Scheme("B-", "I-"), "IOBES": Scheme("B-", "I-", "E-", "S-"),
           "BILOU": Scheme("B-", "I-", "L-", "U-")}


class AllowedMoves(NamedTuple):
    """transitions `[L, L]` (`[i, j]`: label j may follow label i), start
    `[L]` (may begin a sequence), end `[L]` (may end one); bool."""

    transitions: np.ndarray
    start: np.ndarray
    end: np.ndarray


def _parts(label: str, scheme: Scheme):
    """`(prefix, type)` of a label; `(None, None)` for `O` and any label outside the scheme."""
    for prefix in (scheme.begin, scheme.inside, scheme.last, scheme.unit):
        if prefix is not None and label.startswith(prefix):
            return prefix, label[len(prefix):]
    return None, None


def scheme_of(labels: Sequence[str]) -> Optional[str]:
    """The narrowest scheme of `SCHEMES` every label fits (`O` or a known
    prefix), preferring IOB2; None when none does (e.g. POS tags)."""
    for name, scheme in SCHEMES.items():
        if all(label == "O" or _parts(label, scheme)[0] is not None for label in labels):
            return name
    return None


def allowed_moves(labels: Sequence[str], scheme: str = "IOB2") -> AllowedMoves:
    """The moves that keep a sequence of `labels` valid under `scheme`.

    A chunk that is open (its last label is `begin` or `inside` in a scheme
    with a `last` prefix) must continue with `inside` or `last` of its type;
    `inside` and `last` only continue a chunk of their type; without a
    `last` prefix (IOB2) a chunk may stop anywhere. Labels outside the scheme
    (and `O`) are free, like `O`.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r}")
    rules = SCHEMES[scheme]
    parts = [_parts(label, rules) for label in labels]
    closing = rules.last is not None

    def is_open(prefix):  # the chunk must go on
        return closing and prefix in (rules.begin, rules.inside)

    def continues(prefix):  # the label only continues a chunk
        return prefix in (rules.inside, rules.last) and prefix is not None

    def may_follow(previous, current) -> bool:
        if previous is None:
            return not continues(current[0])
        if is_open(previous[0]):
            return continues(current[0]) and current[1] == previous[1]
        if continues(current[0]):
            return previous[0] in (rules.begin, rules.inside) and previous[1] == current[1]
        return True

    transitions = np.array([[may_follow(a, b) for b in parts] for a in parts], dtype=bool)
    start = np.array([may_follow(None, b) for b in parts], dtype=bool)
    end = np.array([not is_open(prefix) for prefix, _ in parts], dtype=bool)
    return AllowedMoves(transitions, start, end)


def constrain(potentials, moves: AllowedMoves, lengths):
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
        return potentials._replace(unary=unary, transitions=jnp.where(transitions, shared, -jnp.inf),
                                   start=jnp.where(start, potentials.start, -jnp.inf))
    first = jnp.where(start, potentials[..., :1, :, :], -jnp.inf)
    rest = jnp.where(transitions, potentials[..., 1:, :, :], -jnp.inf)
    edges = jnp.concatenate([first, rest], axis=-3)
    last = jnp.arange(edges.shape[-3]) == jnp.asarray(lengths)[..., None] - 1  # [..., T]
    return jnp.where(last[..., None, None] & ~end, -jnp.inf, edges)


def _constrain_end(unary: jax.Array, end: jax.Array, lengths) -> jax.Array:
    """`unary [..., T, L]` with the labels that may not end a sequence at `-inf` at `lengths - 1`."""
    last = jnp.arange(unary.shape[-2]) == jnp.asarray(lengths)[..., None] - 1
    return jnp.where(last[..., None] & ~end, -jnp.inf, unary)
