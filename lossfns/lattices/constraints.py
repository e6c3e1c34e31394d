"""Which label transitions a tagging scheme allows: boolean masks built from
label strings, for constrained training and decoding of chains.

A chunk tagging scheme (IOB2, IOBES, BILOU) makes some moves invalid (`O -> I-PER`
in IOB2), and a chain forbids them by scoring them `-inf`. This module only says
*which* are allowed, as numpy bool arrays `AllowedTransitions(transitions [L, L],
start [L], end [L])`; applying them (`jnp.where(allowed, scores, -inf)`) is the
caller's, so that the masks travel as data. Labels are `"O"` or `PREFIX-TYPE`
(`"B-PER"`); a label that does not fit the scheme is refused rather than silently
allowed everywhere: for any other label set, build the masks by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

#: Per scheme: the prefix opening a multi-token chunk, continuing it, closing
#: it, and the prefix of a single-token chunk (None where the scheme has none).
_SCHEMES = {
    "IOB2": {"begin": "B", "inside": "I", "end": None, "single": None},
    "IOBES": {"begin": "B", "inside": "I", "end": "E", "single": "S"},
    "BILOU": {"begin": "B", "inside": "I", "end": "L", "single": "U"},
}
SCHEMES = tuple(_SCHEMES)
"""The chunk schemes `allowed_transitions` knows: IOB2, IOBES, BILOU."""


class AllowedTransitions(NamedTuple):
    """Allowed moves of a chain over `L` labels (bool arrays).

    transitions: `[L, L]`, `transitions[i, j]`: label `j` may follow label `i`;
    start: `[L]`, a sequence may begin with label `j`;
    end: `[L]`, a sequence may end with label `j`.
    """

    transitions: np.ndarray
    start: np.ndarray
    end: np.ndarray


def _split(label: str, scheme: str, prefixes: dict) -> tuple[str | None, str]:
    """`"B-PER"` -> `("B", "PER")`, `"O"` -> `(None, "")`; refuses other labels."""
    if label == "O":
        return None, ""
    allowed = sorted(p for p in prefixes.values() if p is not None)
    prefix, dash, kind = label.partition("-")
    if not dash or not kind or prefix not in allowed:
        raise ValueError(
            f"labels: {label!r} is not a {scheme} label (expected 'O' or one of "
            f"{', '.join(p + '-TYPE' for p in allowed)}); for another label set, build the "
            "allowed-transition masks by hand"
        )
    return prefix, kind


def _fits(labels: Sequence[str], prefixes: dict) -> bool:
    allowed = {p for p in prefixes.values() if p is not None}
    return all(
        label == "O" or (label.partition("-")[0] in allowed and label.partition("-")[2] != "") for label in labels
    )


def scheme_of(labels: Sequence[str]) -> str | None:
    """The narrowest of `SCHEMES` that every label fits (`O` or `PREFIX-TYPE`),
    in the order IOB2, IOBES, BILOU; None when none does (e.g. POS tags)."""
    return next((name for name, prefixes in _SCHEMES.items() if _fits(labels, prefixes)), None)


def allowed_transitions(labels: Sequence[str], scheme: str = "IOB2") -> AllowedTransitions:
    """The moves that keep a label sequence valid in `scheme`.

    Args:
      labels: `[L]` label strings, e.g. `("O", "B-PER", "I-PER")`, in the
        order of the model's label indices.
      scheme: "IOB2" (an `I-X` only after `B-X` or `I-X`), "IOBES" (a chunk
        is `S-X` or `B-X I-X* E-X`) or "BILOU" (`U-X` or `B-X I-X* L-X`).

    Returns:
      `AllowedTransitions(transitions [L, L], start [L], end [L])`, numpy bool.
    """
    if scheme not in _SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if isinstance(labels, str) or not all(isinstance(label, str) for label in labels):
        raise TypeError(f"labels must be a sequence of label strings, got {labels!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be distinct, got {list(labels)}")
    prefixes = _SCHEMES[scheme]
    split = [_split(label, scheme, prefixes) for label in labels]
    # A chunk is open after `begin` or `inside`: only `inside` or `end` of the
    # same type may follow (IOB2, which has no `end`, may also close it).
    opens = {prefixes["begin"], prefixes["inside"]}
    continues = {prefixes["inside"], prefixes["end"]} - {None}
    closes_silently = prefixes["end"] is None

    def may_follow(previous, current) -> bool:
        (before, before_kind), (now, now_kind) = previous, current
        if before in opens and not closes_silently:
            return now in continues and now_kind == before_kind
        if now in continues:
            return before in opens and now_kind == before_kind
        return True

    transitions = np.array([[may_follow(a, b) for b in split] for a in split], dtype=bool).reshape(
        len(split), len(split)
    )
    start = np.array([prefix not in continues for prefix, _ in split], dtype=bool)
    end = np.array([closes_silently or prefix not in opens for prefix, _ in split], dtype=bool)
    return AllowedTransitions(transitions, start, end)
