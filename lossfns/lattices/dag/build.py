"""Acyclic lattices (weighted DAG acceptors) as static-shape arrays: their
construction, union, padding, stacking and packing, on concrete (numpy)
arrays; the level scans over them are in `dag.algorithms`.

A `Lattice` holds states in topological order (0 the start state, `final [S]`),
padded arcs (`src`, `dst`, `symbol`, `arc_valid`) and a level layout for the
forward scan. Lattices padded to the same sizes (`pad`, `stack`) share one
compiled kernel; many small ones batch better with `pack` (`PackedLattices`).
Construction runs in numpy: jax would compile a small program per shape.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.core
import numpy as np

from ...validation import check_int, integer_values


class Lattice(NamedTuple):
    """An acyclic lattice (see the module docstring). All fields are int32
    or bool arrays; a batch of lattices carries leading batch dimensions.

    src, dst, symbol: `[..., A]`; arc_valid: `[..., A]` bool;
    final: `[..., S]` bool; state_slot: `[..., S]`;
    level_arcs: `[..., N, W, D]`.
    """

    # numpy while built (from_arcs_numpy), device arrays after `to_jax`.
    src: jax.Array | np.ndarray
    dst: jax.Array | np.ndarray
    symbol: jax.Array | np.ndarray
    arc_valid: jax.Array | np.ndarray
    final: jax.Array | np.ndarray
    state_slot: jax.Array | np.ndarray
    level_arcs: jax.Array | np.ndarray

    @property
    def num_states(self) -> int:
        return self.final.shape[-1]

    @property
    def num_arcs(self) -> int:
        return self.src.shape[-1]


# ---------------------------------------------------------------------------
# Construction (numpy, on concrete arrays)
# ---------------------------------------------------------------------------


def _build(src, dst, symbol, final, num_states: int) -> Lattice:
    """Check topological order and compute the level layout of valid arcs
    (a `Lattice` of jax arrays)."""
    return to_jax(_build_numpy(src, dst, symbol, final, num_states))


def to_jax(lattice: Lattice) -> Lattice:
    """A lattice with numpy fields (`from_arcs_numpy`) as device arrays.

    Args:
      lattice: a `Lattice` with numpy fields.

    Returns:
      the `Lattice` with the same fields as jax arrays.
    """
    # device_put of finished numpy arrays: no per-shape compilation (jnp.ones
    # and friends compile one small program per new shape).
    return Lattice(*jax.device_put(tuple(np.asarray(field) for field in lattice)))


def _build_numpy(src, dst, symbol, final, num_states: int) -> Lattice:
    """`_build` with numpy fields (int32 / bool), for bulk construction."""
    src, dst, symbol = (np.asarray(a, np.int64).reshape(-1) for a in (src, dst, symbol))
    final = np.asarray(final, bool).reshape(-1)
    if num_states < 1:
        raise ValueError(f"a lattice needs at least one state (the start state 0), got num_states={num_states}")
    if final.shape != (num_states,):
        raise ValueError(f"final must have shape [num_states] = [{num_states}], got {final.shape}")
    out_of_range = (src < 0) | (dst < 0) | (src >= num_states) | (dst >= num_states)
    if out_of_range.any():
        i = int(np.argmax(out_of_range))
        raise ValueError(f"arc {i} ({src[i]} -> {dst[i]}) refers to a state outside [0, {num_states})")
    backward = src >= dst
    if backward.any():
        i = int(np.argmax(backward))
        raise ValueError(
            f"arc {i} ({src[i]} -> {dst[i]}) is not in topological order: number the states so that "
            "every arc goes from a lower to a higher state (a cycle or self-loop cannot be numbered so)"
        )
    level = _levels(src, dst, num_states)
    num_levels = int(level.max()) if level.size else 0
    width = max(int(np.bincount(level[level > 0]).max(initial=0)) if num_levels else 0, 1)
    depth = max(int(np.bincount(dst).max(initial=0)) if dst.size else 0, 1)
    # Slots: states of one level in increasing id order; arcs of one state in id order.
    state_slot = np.full(num_states, (num_levels + 1) * width, np.int64)
    state_slot[0] = 0
    inner = np.flatnonzero(level > 0)
    inner = inner[np.argsort(level[inner], kind="stable")]
    rank = np.arange(inner.size) - np.searchsorted(level[inner], level[inner])
    state_slot[inner] = level[inner] * width + rank
    by_dst = np.argsort(dst, kind="stable")
    rank = np.arange(by_dst.size) - np.searchsorted(dst[by_dst], dst[by_dst])
    level_arcs = np.full((num_levels, width, depth), src.size, np.int64)
    level_arcs[level[dst[by_dst]] - 1, state_slot[dst[by_dst]] % width, rank] = by_dst
    as32 = lambda a: np.asarray(a, np.int32)
    return Lattice(
        as32(src), as32(dst), as32(symbol), np.ones(src.shape, bool), final, as32(state_slot), as32(level_arcs)
    )


def _levels(src, dst, num_states: int) -> np.ndarray:
    """Longest-path level of every state (arcs go from lower to higher ids)."""
    level = np.zeros(num_states, np.int64)
    if not src.size:
        return level
    # Arcs grouped by destination in increasing order: when a destination's
    # group is reached, every arc into its sources has been processed. The
    # groups are vectorised: one maximum per destination state.
    order = np.argsort(dst, kind="stable")
    sorted_dst, sorted_src = dst[order], src[order]
    starts = np.flatnonzero(np.r_[True, sorted_dst[1:] != sorted_dst[:-1]])
    ends = np.r_[starts[1:], sorted_dst.size]
    for start, end in zip(starts.tolist(), ends.tolist()):
        level[sorted_dst[start]] = level[sorted_src[start:end]].max() + 1
    return level


def from_arcs(arcs, final, num_states: int | None = None) -> Lattice:
    """A lattice from its arcs.

    Ids must be integers (floats are refused, not truncated). States must be
    numbered in topological order with 0 the start state (`src < dst` for
    every arc); anything else, a cycle included, raises `ValueError`.

    Args:
      arcs: a sequence of `(src, dst, symbol)` triples (or an int array
        `[A, 3]`), in the order their scores will be given.
      final: a sequence of final state ids, or a boolean mask with one entry
        per state (`[num_states]`).
      num_states: `S`; default one more than the largest state id used.

    Returns:
      an unbatched `Lattice` (`src [A]`, `final [S]`, ...).
    """
    return to_jax(from_arcs_numpy(arcs, final, num_states))


def _integer_ids(name: str, x, expected: str, *, allow_bool: bool = False) -> np.ndarray:
    """Concrete integer ids as int64, checked before any cast: floats (1.7
    would be truncated to 1), bools (unless `allow_bool`), values beyond int64
    and traced arrays (a lattice is built with numpy, outside `jit`) are
    refused naming `name`."""
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            f"{name} must be {expected}, known when the lattice is built, got a traced array (inside "
            "jit/vmap): build the lattice outside the traced function and pass the Lattice in (a pytree)"
        )
    try:
        value = np.asarray(x)
    except ValueError as error:  # ragged nested sequences
        raise ValueError(f"{name} must be {expected}, got ragged input: {error}") from None
    if value.size == 0:
        return value.astype(np.int64)
    if allow_bool and value.dtype == bool:
        return value
    value = integer_values(name, value, expected)
    assert value is not None  # None only for traced arrays, refused above
    if value.dtype.kind == "u" and value.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must be {expected}, got {value.max()} (beyond int64)")
    return value.astype(np.int64)


def from_arcs_numpy(arcs, final, num_states: int | None = None) -> Lattice:
    """`from_arcs` with numpy fields (bulk construction: no device arrays).

    Args:
      arcs: a sequence of `(src, dst, symbol)` triples (or an int array
        `[A, 3]`), as in `from_arcs`.
      final: a sequence of final state ids, or a boolean mask `[num_states]`.
      num_states: `S`; default one more than the largest state id used.

    Returns:
      an unbatched `Lattice` of numpy arrays (`to_jax` moves the finished
        lattice to the device).
    """
    arcs = _integer_ids("arcs", arcs, "(src, dst, symbol) integer triples, shape [A, 3]")
    if arcs.size == 0:
        arcs = np.zeros((0, 3), np.int64)
    if arcs.ndim != 2 or arcs.shape[1] != 3:
        raise ValueError(f"arcs must be (src, dst, symbol) triples, shape [A, 3], got shape {arcs.shape}")
    if num_states is not None:
        num_states = check_int("num_states", num_states, 1)
    final = _integer_ids(
        "final", final, "a sequence of final state ids or a boolean mask [num_states]", allow_bool=True
    ).reshape(-1)
    if final.dtype == bool:  # a mask over the states, not the ids 0 and 1
        if num_states is None:
            num_states = max(final.size, int(arcs[:, :2].max(initial=-1)) + 1)
        if final.shape != (num_states,):
            raise ValueError(
                f"final as a boolean mask must have one entry per state, shape [num_states] = "
                f"[{num_states}], got shape {final.shape}"
            )
        return _build_numpy(arcs[:, 0], arcs[:, 1], arcs[:, 2], final, num_states)
    if num_states is None:
        num_states = int(max([0] + list(arcs[:, :2].reshape(-1)) + list(final))) + 1
    if ((final < 0) | (final >= num_states)).any():
        raise ValueError(f"final must list state ids in [0, {num_states}), got {final.tolist()}")
    final_mask = np.zeros(num_states, bool)
    final_mask[final] = True
    return _build_numpy(arcs[:, 0], arcs[:, 1], arcs[:, 2], final_mask, num_states)


def from_string(symbols: Sequence[int]) -> Lattice:
    """The chain accepting exactly `symbols`.

    Args:
      symbols: a sequence of `m` integer symbol ids.

    Returns:
      a `Lattice` with states `0..m`, arc `i` reading `symbols[i]`.
    """
    ids = _integer_ids("symbols", symbols, "a sequence of integer symbol ids").reshape(-1)
    m = len(ids)
    return from_arcs([(i, i + 1, int(s)) for i, s in enumerate(ids)], final=[m], num_states=m + 1)


def from_strings(strings: Sequence[Sequence[int]], *, deterministic: bool = False) -> Lattice:
    """A lattice accepting a list of strings (e.g. an N-best candidate list).

    Args:
      strings: a sequence of integer symbol sequences.
      deterministic: with False, candidate `i` is its own path (shared start
        and final states) and its arcs are contiguous and in order, so a
        duplicated candidate is two paths. With True, the minimal
        deterministic acceptor of the *set* of strings: every string on
        exactly one path, shared prefixes and suffixes merged.

    Returns:
      an unbatched `Lattice`.
    """
    strings = [
        tuple(int(s) for s in _integer_ids(f"strings[{i}]", string, "a sequence of integer symbol ids").reshape(-1))
        for i, string in enumerate(strings)
    ]
    if deterministic:
        return _minimal_acceptor(strings)
    internal = sum(max(len(s) - 1, 0) for s in strings)
    last = internal + 1
    arcs, next_state, accepts_empty = [], 1, False
    for string in strings:
        if not string:
            accepts_empty = True
            continue
        previous = 0
        for position, symbol in enumerate(string):
            target = last if position == len(string) - 1 else next_state
            if target != last:
                next_state += 1
            arcs.append((previous, target, symbol))
            previous = target
    final = [last] + ([0] if accepts_empty else [])
    return from_arcs(arcs, final=final, num_states=last + 1)


def _minimal_acceptor(strings) -> Lattice:
    """Minimal acyclic DFA of a finite set: a trie whose states with equal
    right languages are merged (bottom-up signature hashing)."""
    children, accepting = [{}], [False]
    for string in strings:
        node = 0
        for symbol in string:
            if symbol not in children[node]:
                children[node][symbol] = len(children)
                children.append({})
                accepting.append(False)
            node = children[node][symbol]
        accepting[node] = True
    if not any(accepting):
        return from_arcs([], final=[], num_states=1)
    # Trie children have larger ids than parents, so a reverse sweep sees every
    # child's class first; classes are registered leaves-first.
    register, class_of = {}, [0] * len(children)
    for node in reversed(range(len(children))):
        signature = (accepting[node], tuple(sorted((s, class_of[c]) for s, c in children[node].items())))
        class_of[node] = register.setdefault(signature, len(register))
    num_classes = len(register)
    # A child's class is registered before its parent's: reversing the
    # registration order numbers the states topologically, the root first.
    state = lambda node: num_classes - 1 - class_of[node]
    arcs, final, seen = [], set(), set()
    for node in range(len(children)):
        if accepting[node]:
            final.add(state(node))
        if state(node) in seen:
            continue
        seen.add(state(node))
        arcs.extend((state(node), state(child), symbol) for symbol, child in sorted(children[node].items()))
    return from_arcs(arcs, final=sorted(final), num_states=num_classes)


def _numpy_lattice(lattice: Lattice) -> Lattice:
    if lattice.src.ndim != 1:
        raise ValueError(f"expected one lattice (src of shape [A]), got a batch of shape {lattice.src.shape[:-1]}")
    return Lattice(*(np.asarray(field) for field in lattice))


def union(*lattices: Lattice) -> Lattice:
    """A lattice accepting every path of every argument: the start states are
    merged (arcs out of each start leave the new start 0).

    Not deterministic when the arguments share strings.

    Args:
      *lattices: unbatched `Lattice`s.

    Returns:
      an unbatched `Lattice`.
    """
    src, dst, symbol, start_final, offset = [], [], [], False, 1
    finals = []
    for lattice in lattices:
        lattice = _numpy_lattice(lattice)
        valid = lattice.arc_valid
        # Old start state 0 disappears; its other states shift by offset - 1.
        renumber = lambda s: np.where(s == 0, 0, s + offset - 1)
        src.append(renumber(lattice.src[valid]))
        dst.append(renumber(lattice.dst[valid]))
        symbol.append(lattice.symbol[valid])
        start_final |= bool(lattice.final[0])
        finals.append(np.flatnonzero(lattice.final[1:]) + offset)
        offset += lattice.num_states - 1
    final = np.zeros(offset, bool)
    final[np.concatenate(finals + [np.zeros(0, np.int64)])] = True
    final[0] = start_final
    cat = lambda parts: np.concatenate(parts + [np.zeros(0, np.int64)])
    return _build(cat(src), cat(dst), cat(symbol), final, offset)


def pad(lattice: Lattice, num_states: int, num_arcs: int, num_levels: int, width: int, in_degree: int) -> Lattice:
    """Pad one lattice to larger static sizes, so lattices can be stacked.

    Padding states are unreachable and not final; padding arcs are invalid.

    Args:
      lattice: an unbatched `Lattice`.
      num_states: `S`, at least the lattice's.
      num_arcs: `A`, at least the lattice's.
      num_levels: `N`, at least the lattice's.
      width: `W`, at least the lattice's.
      in_degree: `D`, at least the lattice's.

    Returns:
      the padded `Lattice`: `src [A]`, `final [S]`, `level_arcs [N, W, D]`, ...
    """
    return to_jax(_pad_numpy(lattice, num_states, num_arcs, num_levels, width, in_degree))


def _pad_numpy(lattice, num_states, num_arcs, num_levels, width, in_degree) -> Lattice:
    lattice = _numpy_lattice(lattice)
    S, A = lattice.num_states, lattice.num_arcs
    N, W, D = lattice.level_arcs.shape
    if num_states < S or num_arcs < A or num_levels < N or width < W or in_degree < D:
        raise ValueError(
            f"pad sizes (num_states={num_states}, num_arcs={num_arcs}, num_levels={num_levels}, "
            f"width={width}, in_degree={in_degree}) must be at least the lattice's ({S}, {A}, {N}, {W}, {D})"
        )
    grow = lambda a, size, value: np.concatenate([a, np.full(size - a.shape[0], value, a.dtype)])
    # Sentinels move with the sizes; slots move to the wider rows.
    level_arcs = np.where(lattice.level_arcs == A, num_arcs, lattice.level_arcs)
    old_slot = lattice.state_slot.astype(np.int64)
    state_slot = np.where(old_slot == (N + 1) * W, (num_levels + 1) * width, old_slot // W * width + old_slot % W)
    state_slot = grow(state_slot, num_states, (num_levels + 1) * width)
    level_arcs = np.pad(level_arcs, ((0, num_levels - N), (0, width - W), (0, in_degree - D)), constant_values=num_arcs)
    return Lattice(
        grow(lattice.src, num_arcs, 0),
        grow(lattice.dst, num_arcs, 0),
        grow(lattice.symbol, num_arcs, -1),
        grow(lattice.arc_valid, num_arcs, False),
        grow(lattice.final, num_states, False),
        state_slot.astype(np.int32),
        level_arcs.astype(np.int32),
    )


def stack(lattices: Sequence[Lattice]) -> Lattice:
    """Pad lattices to common sizes and stack them into a batch.

    Args:
      lattices: a non-empty sequence of `B` unbatched `Lattice`s.

    Returns:
      a `Lattice` whose fields are `[B, ...]`.
    """
    lattices = [_numpy_lattice(lattice) for lattice in lattices]
    if not lattices:
        raise ValueError("stack needs at least one lattice")
    sizes = dict(
        num_states=max(l.num_states for l in lattices),
        num_arcs=max(l.num_arcs for l in lattices),
        num_levels=max(l.level_arcs.shape[0] for l in lattices),
        width=max(l.level_arcs.shape[1] for l in lattices),
        in_degree=max(l.level_arcs.shape[2] for l in lattices),
    )
    padded = [_pad_numpy(lattice, **sizes) for lattice in lattices]
    return to_jax(Lattice(*(np.stack(fields) for fields in zip(*padded))))


# ---------------------------------------------------------------------------
# Packed batches: many lattices in one level layout
# ---------------------------------------------------------------------------


class PackedLattices(NamedTuple):
    """`B` lattices sharing one level layout (`pack`): far less padding than
    `stack`, which pads every lattice to the batch's largest
    `[levels, width, in-degree]`. Here the states of level `n` of *every*
    lattice share row `n` of one table, and within a row the states are
    grouped into blocks by in-degree (a block of in-degree `D_k` holds the
    states with at most `D_k` incoming arcs), so a batch costs about its
    number of arcs, over the longest lattice's levels.

    States are numbered globally (lattice `b`'s states follow lattice
    `b - 1`'s); slot `b` (row 0) is the start state of lattice `b`.
    src, dst, symbol, arc_valid: `[A]` (lattice 0's arcs first; padding
    arcs invalid); state_slot: `[S]`; level_arcs: a tuple of `[N, W_k, D_k]`
    blocks (row width `W = sum_k W_k`; sentinel arc id `A`; sentinel slot
    `(N + 1) W`); final_slots: `[B, F]` the slots of each lattice's final
    states (padded with the sentinel slot). Results are per lattice, `[B]`.
    """

    # numpy while built (`pack`), device arrays after `to_jax`.
    src: jax.Array | np.ndarray
    dst: jax.Array | np.ndarray
    symbol: jax.Array | np.ndarray
    arc_valid: jax.Array | np.ndarray
    state_slot: jax.Array | np.ndarray
    level_arcs: tuple
    final_slots: jax.Array | np.ndarray

    @property
    def num_arcs(self) -> int:
        return self.src.shape[-1]

    @property
    def num_lattices(self) -> int:
        return self.final_slots.shape[-2]

    @property
    def num_levels(self) -> int:
        return self.level_arcs[0].shape[0]

    @property
    def width(self) -> int:
        return sum(block.shape[1] for block in self.level_arcs)


def _degree_blocks(level, degree, num_levels, max_blocks: int = 3):
    """In-degree bounds (ascending, the last the largest in-degree) of at most
    `max_blocks` blocks minimising the padded cells `sum_k N W_k D_k` (plus a
    per-block overhead)."""
    top = max(int(degree.max(initial=0)), 1)
    candidates = sorted({2**i for i in range(top.bit_length()) if 2**i < top} | {top})
    best = None
    for size in range(1, max_blocks + 1):
        for bounds in itertools.combinations(candidates[:-1], size - 1):
            bounds = bounds + (top,)
            block = np.searchsorted(np.array(bounds), degree)
            cells = 0
            for k, bound in enumerate(bounds):
                counts = np.bincount(level[block == k], minlength=num_levels + 1)
                cells += num_levels * (int(counts.max(initial=0)) * bound + 256)
            if best is None or cells < best[0]:
                best = (cells, bounds)
    assert best is not None  # max_blocks >= 1: at least one candidate
    return best[1]


def pack(
    lattices: Sequence[Lattice],
    *,
    num_lattices: int | None = None,
    num_arcs: int | None = None,
    num_levels: int | None = None,
    width: Sequence[int] | None = None,
    in_degree: Sequence[int] | None = None,
    num_finals: int | None = None,
    num_states: int | None = None,
) -> PackedLattices:
    """Pack unbatched lattices into one `PackedLattices` (numpy fields).

    The optional sizes pad the result, so that packs of different data share
    one compiled program (`packed_sizes`); each must be at least what the
    lattices need. Arc `j` of lattice `b` is arc `offset_b + j` with
    `offset_b` the arc count of the lattices before `b`.

    Args:
      lattices: a sequence of `B` unbatched `Lattice`s.
      num_lattices: rows (default `B`); more rows are empty-string lattices
        with log Z = 0.
      num_arcs: arcs `A` (padding arcs are invalid).
      num_levels: levels `N`.
      width: block widths `W_k`, one per block.
      in_degree: the blocks' in-degree bounds (ascending; default: chosen to
        minimise padding, at most 3 blocks).
      num_finals: final slots per lattice `F`.
      num_states: states `S`.

    Returns:
      a `PackedLattices` with numpy fields.
    """
    lattices = [_numpy_lattice(lattice) for lattice in lattices]
    B = len(lattices)
    src, dst, symbol, valid, level, finals = [], [], [], [], [], []
    state_offset = 0
    for lattice in lattices:
        N, W, _ = lattice.level_arcs.shape
        slots = lattice.state_slot.astype(np.int64)
        own_level = np.where(slots == (N + 1) * W, -1, slots // W)  # -1: unreachable
        own_level[0] = 0
        level.append(own_level)
        src.append(lattice.src.astype(np.int64) + state_offset)
        dst.append(lattice.dst.astype(np.int64) + state_offset)
        symbol.append(lattice.symbol)
        valid.append(lattice.arc_valid)
        finals.append(np.flatnonzero(lattice.final) + state_offset)
        state_offset += lattice.num_states
    cat = lambda parts, dtype: np.concatenate(parts + [np.zeros(0, dtype)]).astype(dtype)
    src, dst, symbol, valid = cat(src, np.int64), cat(dst, np.int64), cat(symbol, np.int64), cat(valid, bool)
    level = cat(level, np.int64)
    starts = np.cumsum([0] + [lattice.num_states for lattice in lattices])[:-1].astype(np.int64)
    is_start = np.zeros(level.size, bool)
    is_start[starts] = True
    rows = B if num_lattices is None else num_lattices
    if rows < B:
        raise ValueError(f"num_lattices={num_lattices} is less than the {B} lattices given")
    inner = np.flatnonzero((level > 0) & ~is_start)
    arcs_into = valid & (level[dst] > 0) & ~is_start[dst]
    degree = np.bincount(dst[arcs_into], minlength=level.size)
    N = int(level[inner].max()) if inner.size else 0
    if num_levels is not None:
        if num_levels < N:
            raise ValueError(f"pack: num_levels={num_levels} is less than the {N} these lattices need")
        N = num_levels
    bounds = (
        tuple(int(d) for d in in_degree) if in_degree is not None else _degree_blocks(level[inner], degree[inner], N)
    )
    if list(bounds) != sorted(set(bounds)) or bounds[0] < 1 or bounds[-1] < int(degree.max(initial=0)):
        raise ValueError(
            f"pack: in_degree={bounds} must be increasing, positive and at least the largest "
            f"in-degree {int(degree.max(initial=0))}"
        )
    block = np.searchsorted(np.array(bounds), degree)
    widths = [
        int(np.bincount(level[inner][block[inner] == k], minlength=N + 1)[1:].max(initial=0))
        for k in range(len(bounds))
    ]
    widths[0] = max(widths[0], rows - sum(widths[1:]), 1)  # row 0 holds every start slot
    if width is not None:
        width = tuple(int(w) for w in width)
        if len(width) != len(bounds) or any(w < need for w, need in zip(width, widths)):
            raise ValueError(f"pack: width={width} must give each of the {len(bounds)} blocks at least {widths}")
        widths = list(width)
    W = sum(widths)
    if W < rows:
        raise ValueError(f"pack: the row width {W} must hold the {rows} start slots")
    A = src.size if num_arcs is None else num_arcs
    F = max(max((f.size for f in finals), default=0), 1)
    for name, given, needed in (
        ("num_arcs", num_arcs, src.size),
        ("num_finals", num_finals, F),
        ("num_states", num_states, level.size),
    ):
        if given is not None and given < needed:
            raise ValueError(f"pack: {name}={given} is less than the {needed} these lattices need")
    F = F if num_finals is None else num_finals
    sentinel = (N + 1) * W
    offsets = np.cumsum([0] + widths)[:-1]
    # (padding states sit at the sentinel slot, like unreachable ones; no arc names them)
    state_slot = np.full(level.size if num_states is None else num_states, sentinel, np.int64)
    state_slot[starts] = np.arange(B)
    key = level[inner] * len(bounds) + block[inner]  # (level, block) groups, in state order within
    order = inner[np.argsort(key, kind="stable")]
    sorted_key = key[np.argsort(key, kind="stable")]
    rank = np.arange(order.size) - np.searchsorted(sorted_key, sorted_key)
    state_slot[order] = level[order] * W + offsets[block[order]] + rank
    into = np.flatnonzero(arcs_into)
    into = into[np.argsort(dst[into], kind="stable")]
    rank = np.arange(into.size) - np.searchsorted(dst[into], dst[into])
    level_arcs = []
    for k, bound in enumerate(bounds):
        arcs = np.full((N, widths[k], bound), A, np.int64)
        mine = into[block[dst[into]] == k]
        mine_rank = rank[block[dst[into]] == k]
        arcs[level[dst[mine]] - 1, state_slot[dst[mine]] % W - offsets[k], mine_rank] = mine
        level_arcs.append(arcs.astype(np.int32))
    final_slots = np.full((rows, F), sentinel, np.int64)
    for b, f in enumerate(finals):
        final_slots[b, : f.size] = state_slot[f]
    final_slots[B:, 0] = np.arange(B, rows)  # padding rows: the empty string (start slot, final)
    grow = lambda a, value: np.concatenate([a, np.full(A - a.size, value, a.dtype)])
    as32 = lambda a: np.asarray(a, np.int32)
    return PackedLattices(
        as32(grow(src, 0)),
        as32(grow(dst, 0)),
        as32(grow(symbol, -1)),
        grow(valid, False),
        as32(state_slot),
        tuple(level_arcs),
        as32(final_slots),
    )


def packed_sizes(packed: PackedLattices) -> dict:
    """`pack`'s size arguments that reproduce `packed`'s shapes.

    Args:
      packed: a `PackedLattices`.

    Returns:
      a dict of `pack`'s keyword arguments (`num_lattices`, `num_arcs`, ...).
    """
    return dict(
        num_lattices=packed.final_slots.shape[0],
        num_arcs=packed.src.shape[0],
        num_levels=packed.num_levels,
        width=tuple(block.shape[1] for block in packed.level_arcs),
        in_degree=tuple(block.shape[2] for block in packed.level_arcs),
        num_finals=packed.final_slots.shape[1],
        num_states=packed.state_slot.shape[0],
    )


def enumerate_paths(lattice: Lattice) -> list[tuple[int, ...]]:
    """Every accepting path of one small lattice. For tests and debugging.

    Args:
      lattice: an unbatched `Lattice`.

    Returns:
      a list with one tuple of arc ids per accepting path (depth first, arcs
        in id order).
    """
    lattice = _numpy_lattice(lattice)
    outgoing = [[] for _ in range(lattice.num_states)]
    for arc in np.flatnonzero(lattice.arc_valid):
        outgoing[lattice.src[arc]].append(int(arc))
    paths = []

    def visit(state, prefix):
        if lattice.final[state]:
            paths.append(tuple(prefix))
        for arc in outgoing[state]:
            visit(int(lattice.dst[arc]), prefix + [arc])

    visit(0, [])
    return paths


def enumerate_strings(lattice: Lattice) -> list[tuple[int, ...]]:
    """The symbol string of every accepting path.

    Args:
      lattice: an unbatched `Lattice`.

    Returns:
      a list with one tuple of symbol ids per path (as `enumerate_paths`).
    """
    symbol = np.asarray(lattice.symbol)
    return [tuple(int(symbol[arc]) for arc in path) for path in enumerate_paths(lattice)]
