"""Sequence boosting statistics for the indicator features of a linear chain (Altun,
Hofmann & Johnson 2002): the sparse layout of `lossfns.training.sequence_boosting`,
for corpora with hundreds of thousands of weak learners.

For indicator features each weak learner's range over label sequences is known in
closed form (no Viterbi runs), so one forward-backward per sequence gives every
weak learner's masses, kept in integer-valued slots (`group_features`); a round
redoes the forward-backward only where the chosen feature occurs, with periodic
full passes (`refresh_every`), and `sequence_pieces` cuts long sentences.
Design notes: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..lattices import chain
from ..models.linear_chain import LinearChainModel
from ..validation import check_int, integer_values

#: Full pass once the exp-loss fell by this many nats below the scale of the
#: stored masses (they would drift towards float underflow).
RESCALE_NATS = 30.0


class ChainBoostingData(eqx.Module):
    """A corpus of linear-chain sequences for sparse sequence boosting
    (from `chain_boosting_data`). `N` sequences of `T` positions with `F`
    observation ids per token, `K` observation features, `L` labels; `Q`,
    `G`, `H`: the most distinct features, (feature, gold label) pairs and
    gold transitions in one sequence.

    ids: `[N, T, F]` int32 observation ids (-1: none); labels: `[N, T]`;
    lengths: `[N]`; occurrence_pair: `[N, T, F]` int32 the sequence-local
    index of each id's feature (Q: none); pair_feature, pair_count: `[N, Q]`
    int32 each local feature and its count (0: padding); gold_pair,
    gold_label, gold_count: `[N, G]` int32 (local feature, gold label, how
    many of its occurrences have that gold label; count 0: padding);
    transition_from, transition_to, transition_count: `[N, H]` int32 the gold
    transitions of each sequence and their counts; feature_slot: `[K]` int32
    the slot of `(f, l = 0, u = -c_f)`; feature_range: `[K]` int32 `c_f` (0:
    f never occurs); group_features: one `[K_c]` int32 array per `c = 1, 2, ...`
    (the features with `c_f = c`); feature_piece_start: `[K + 1]` int32 and
    feature_pieces: `[P + max(tiers)]` int32 the sequences of each feature
    (CSR, padded with N); lowest, highest: `[K L + L^2 + L]` each weak
    learner's range of u over all sequences (the closed-form step's).
    """

    ids: jax.Array
    labels: jax.Array
    lengths: jax.Array
    occurrence_pair: jax.Array
    pair_feature: jax.Array
    pair_count: jax.Array
    gold_pair: jax.Array
    gold_label: jax.Array
    gold_count: jax.Array
    transition_from: jax.Array
    transition_to: jax.Array
    transition_count: jax.Array
    feature_slot: jax.Array
    feature_range: jax.Array
    group_features: tuple
    feature_piece_start: jax.Array
    feature_pieces: jax.Array
    lowest: jax.Array
    highest: jax.Array
    num_features: int = eqx.field(static=True)
    num_labels: int = eqx.field(static=True)
    tiers: tuple = eqx.field(static=True)
    block: int = eqx.field(static=True)

    @property
    def num_weak_learners(self) -> int:
        """`K L + L^2 + L`."""
        L = self.num_labels
        return self.num_features * L + L * L + L

    def slot_offsets(self) -> tuple[tuple[int, ...], int, int, int]:
        """`(emission group offsets, transition offset, start offset, number of slots S)`."""
        L, T = self.num_labels, self.ids.shape[1]
        offsets, offset = [], 0
        for c, features in enumerate(self.group_features, start=1):
            offsets.append(offset)
            offset += features.shape[0] * L * (2 * c + 1)
        transition = offset
        start = transition + L * L * (2 * T - 1)
        return tuple(offsets), transition, start, start + 3 * L


class ChainStatistics(NamedTuple):
    """log_losses: `[N]` `-log P(y_i | x_i)`; masses: `[S]` the slot masses
    times `W_scale` (unnormalised `D`: `1 / P_i - 1` over `W_scale`);
    log_scale: `[]` `log W_scale`, the exp-loss at the last full pass;
    since_refresh: `[]` int32 rounds since then."""

    log_losses: jax.Array
    masses: jax.Array
    log_scale: jax.Array
    since_refresh: jax.Array


# ---------------------------------------------------------------------------
# Host-side construction
# ---------------------------------------------------------------------------


def _host_arrays(name: str, value, ndim: int, shape_doc: str) -> np.ndarray:
    array = integer_values(name, value, f"an integer array of shape {shape_doc}")
    if array is None:
        raise ValueError(f"{name} must be concrete (not traced): the boosting layout is built in numpy")
    if array.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {array.shape}")
    return array.astype(np.int64)


def sequence_pieces(ids, labels, lengths, piece_length: int):
    """Cut sequences into consecutive pieces of `piece_length` positions (the
    last piece of each sequence shorter), as Altun et al. do for boosting.

    ids: `[N, T, F]` observation ids (-1: none), labels: `[N, T]`, lengths:
    `[N]`; or lists of such arrays (buckets of different T, same F).
    Returns numpy `(ids [P, piece_length, F], labels [P, piece_length],
    lengths [P])`, padded with -1; sequences of length 0 give no piece.
    """
    piece_length = check_int("piece_length", piece_length)
    if isinstance(ids, (list, tuple)):
        if not (
            isinstance(labels, (list, tuple))
            and isinstance(lengths, (list, tuple))
            and len(ids) == len(labels) == len(lengths)
        ):
            raise ValueError("ids, labels and lengths must be arrays or lists of arrays of the same length")
        parts = [sequence_pieces(*bucket, piece_length) for bucket in zip(ids, labels, lengths)]
        return tuple(np.concatenate(part) for part in zip(*parts))
    ids = _host_arrays("ids", ids, 3, "[N, T, F]")
    labels = _host_arrays("labels", labels, 2, "[N, T]")
    lengths = _host_arrays("lengths", lengths, 1, "[N]")
    N, T, _ = ids.shape
    if labels.shape != (N, T) or lengths.shape != (N,):
        raise ValueError(
            f"labels must have shape [N, T] = {(N, T)} and lengths [N] = {(N,)} (from ids), "
            f"got {labels.shape} and {lengths.shape}"
        )
    if lengths.size and (lengths.min() < 0 or lengths.max() > T):
        raise ValueError(
            f"lengths must lie in [0, {T}] (the positions T of ids), got {int(lengths.max())}"
            if lengths.max() > T
            else f"lengths must lie in [0, {T}], got {int(lengths.min())}"
        )
    counts = -(-lengths // piece_length)
    row = np.repeat(np.arange(N), counts)
    first = (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)) * piece_length
    position = first[:, None] + np.arange(piece_length)[None, :]
    inside = position < lengths[row][:, None]
    clipped = np.minimum(position, T - 1)
    piece_ids = np.where(inside[..., None], ids[row[:, None], clipped], -1)
    piece_labels = np.where(inside, labels[row[:, None], clipped], -1)
    return (
        piece_ids.astype(np.int32),
        piece_labels.astype(np.int32),
        np.minimum(lengths[row] - first, piece_length).astype(np.int32),
    )


def chain_boosting_data(
    ids,
    labels,
    lengths,
    num_features: int,
    num_labels: int,
    *,
    tiers: Sequence[int] = (16, 128, 1024),
    block: int = 1024,
    dtype=jnp.float32,
) -> ChainBoostingData:
    """The sparse boosting layout of a corpus (numpy, outside `jit`).

    ids: `[N, T, F]` observation ids in `[0, num_features)` (-1: none;
    ignored past each length); labels: `[N, T]` in `[0, num_labels)` inside
    each length; lengths: `[N]`. tiers: the batch sizes of incremental
    rounds (a round whose feature occurs in more sequences than the largest
    runs a full pass); block: sequences per block of a full pass (memory);
    dtype: of the ranges (the statistics follow the weights' dtype).
    """
    num_features = check_int("num_features", num_features)
    L = check_int("num_labels", num_labels)
    block = check_int("block", block)
    tiers = tuple(sorted({check_int("tiers", tier) for tier in tiers}))
    ids = _host_arrays("ids", ids, 3, "[N, T, F]")
    N, T, _ = ids.shape
    labels = _host_arrays("labels", labels, 2, "[N, T]")
    lengths = _host_arrays("lengths", lengths, 1, "[N]")
    if labels.shape != (N, T) or lengths.shape != (N,):
        raise ValueError(
            f"labels must have shape [N, T] = {(N, T)} and lengths [N] = {(N,)} (from ids), "
            f"got {labels.shape} and {lengths.shape}"
        )
    if N == 0 or T == 0:
        raise ValueError(f"ids must hold at least one sequence and one position, got shape {ids.shape}")
    if lengths.min() < 0 or lengths.max() > T:
        bad = lengths[(lengths < 0) | (lengths > T)][0]
        raise ValueError(f"lengths must lie in [0, {T}] (the positions T of ids), got {int(bad)}")
    inside = np.arange(T)[None, :] < lengths[:, None]
    bad_labels = inside & ((labels < 0) | (labels >= L))
    if bad_labels.any():
        where = tuple(int(i) for i in np.argwhere(bad_labels)[0])
        raise ValueError(f"labels must lie in [0, {L}) inside each length, got {int(labels[where])} at index {where}")
    bad_ids = inside[..., None] & ((ids < -1) | (ids >= num_features))
    if bad_ids.any():
        where = tuple(int(i) for i in np.argwhere(bad_ids)[0])
        raise ValueError(
            f"ids must lie in [-1, {num_features}) (-1: none; num_features = {num_features}), "
            f"got {int(ids[where])} at index {where}"
        )
    ids = np.where(inside[..., None] & (ids >= 0), ids, -1)
    labels = np.where(inside, labels, -1)

    # Occurrences -> (sequence, feature) pairs, numbered within each sequence.
    occurring = ids >= 0
    piece, position, _ = np.nonzero(occurring)
    feature = ids[occurring]
    gold = labels[piece, position]
    pair_key, occurrence_to_pair, pair_size = np.unique(
        piece * num_features + feature, return_inverse=True, return_counts=True
    )
    pair_piece, pair_feat = pair_key // num_features, pair_key % num_features
    pair_local = np.arange(len(pair_key)) - np.searchsorted(pair_piece, pair_piece)
    Q = int(pair_local.max(initial=0)) + 1
    occurrence_pair = np.full(ids.shape, Q, np.int64)
    occurrence_pair[occurring] = pair_local[occurrence_to_pair]
    pair_feature, pair_count = np.zeros((N, Q), np.int64), np.zeros((N, Q), np.int64)
    pair_feature[pair_piece, pair_local] = pair_feat
    pair_count[pair_piece, pair_local] = pair_size

    # (pair, gold label) entries: g = how many of the pair's occurrences have that gold label.
    gold_key, gold_size = np.unique(occurrence_to_pair * L + gold, return_counts=True)
    gold_of, gold_lab = gold_key // L, gold_key % L
    gold_piece = pair_piece[gold_of]
    gold_local = np.arange(len(gold_key)) - np.searchsorted(gold_piece, gold_piece)
    G = int(gold_local.max(initial=0)) + 1
    gold_pair, gold_label, gold_count = (
        np.full((N, G), Q, np.int64),
        np.zeros((N, G), np.int64),
        np.zeros((N, G), np.int64),
    )
    gold_pair[gold_piece, gold_local] = pair_local[gold_of]
    gold_label[gold_piece, gold_local] = gold_lab
    gold_count[gold_piece, gold_local] = gold_size

    # Gold transitions per sequence, with counts.
    rows, steps = np.nonzero(np.arange(1, T)[None, :] < lengths[:, None])
    transition_key, transition_size = np.unique(
        (rows * L + labels[rows, steps]) * L + labels[rows, steps + 1], return_counts=True
    )
    transition_piece = transition_key // (L * L)
    transition_local = np.arange(len(transition_key)) - np.searchsorted(transition_piece, transition_piece)
    H = int(transition_local.max(initial=0)) + 1
    transition_from, transition_to, transition_count = (np.zeros((N, H), np.int64) for _ in range(3))
    transition_from[transition_piece, transition_local] = transition_key // L % L
    transition_to[transition_piece, transition_local] = transition_key % L
    transition_count[transition_piece, transition_local] = transition_size

    # Slots: features grouped by their most occurrences in one sequence.
    feature_range = np.zeros(num_features, np.int64)
    np.maximum.at(feature_range, pair_feat, pair_size)
    group_features, feature_slot, offset = [], np.zeros(num_features, np.int64), 0
    for c in range(1, int(feature_range.max(initial=0)) + 1):
        members = np.flatnonzero(feature_range == c)
        group_features.append(members)
        feature_slot[members] = offset + np.arange(len(members)) * L * (2 * c + 1)
        offset += len(members) * L * (2 * c + 1)

    # Sequences of each feature (CSR), padded so any tier's window can be sliced.
    by_feature = np.lexsort((pair_piece, pair_feat))
    feature_pieces = np.concatenate([pair_piece[by_feature], np.full(max(tiers), N, np.int64)])
    feature_piece_start = np.searchsorted(pair_feat[by_feature], np.arange(num_features + 1))

    lowest, highest = _global_ranges(
        pair_feat,
        pair_size,
        pair_local,
        pair_piece,
        gold_of,
        gold_lab,
        gold_size,
        transition_key,
        transition_size,
        lengths,
        labels,
        num_features,
        L,
    )
    as_int = lambda a: jnp.asarray(a, jnp.int32)
    return ChainBoostingData(
        as_int(ids),
        as_int(labels),
        as_int(lengths),
        as_int(occurrence_pair),
        as_int(pair_feature),
        as_int(pair_count),
        as_int(gold_pair),
        as_int(gold_label),
        as_int(gold_count),
        as_int(transition_from),
        as_int(transition_to),
        as_int(transition_count),
        as_int(feature_slot),
        as_int(feature_range),
        tuple(as_int(members) for members in group_features),
        as_int(feature_piece_start),
        as_int(feature_pieces),
        jnp.asarray(lowest, dtype),
        jnp.asarray(highest, dtype),
        num_features,
        L,
        tuple(tier for tier in tiers if tier < N),
        block,
    )


def _global_ranges(
    pair_feat,
    pair_size,
    pair_local,
    pair_piece,
    gold_of,
    gold_lab,
    gold_size,
    transition_key,
    transition_size,
    lengths,
    labels,
    num_features: int,
    L: int,
):
    """`(lowest, highest)` `[K L + L^2 + L]`: each weak learner's range of u
    over all sequences (0 where it never varies)."""
    # Emission (f, l): u in [-g, c - g] per sequence where f occurs.
    gold_counts = np.zeros((len(pair_feat), L), np.int64)
    gold_counts[gold_of, gold_lab] = gold_size
    emission_high = np.zeros((num_features, L), np.int64)
    np.maximum.at(emission_high, pair_feat, pair_size[:, None] - gold_counts)
    emission_low = np.zeros((num_features, L), np.int64)
    np.maximum.at(emission_low, pair_feat, gold_counts)
    # Transition (a, b): u in [-g, most - g], most = T - 1 (a == b) or floor(T / 2).
    present = lengths > 0
    values = np.unique(lengths[present])
    diagonal = np.eye(L, dtype=bool)
    most = lambda length: np.where(diagonal, length - 1, length // 2)
    transition_high = np.zeros((L, L), np.int64)
    transition_low = np.zeros((L, L), np.int64)
    piece_of = transition_key // (L * L)
    pair_index = transition_key % (L * L)
    for length in values:
        members = lengths[piece_of] == length
        seen = np.bincount(pair_index[members], minlength=L * L).reshape(L, L)
        # Some sequence of this length lacks (a, b) in its gold: u reaches `most` there.
        lacking = seen < np.count_nonzero(lengths == length)
        transition_high = np.maximum(transition_high, np.where(lacking, most(length), 0))
        high_gold = np.zeros(L * L, np.int64)
        np.maximum.at(
            high_gold, pair_index[members], most(length).reshape(-1)[pair_index[members]] - transition_size[members]
        )
        transition_high = np.maximum(transition_high, high_gold.reshape(L, L))
    np.maximum.at(transition_low.reshape(-1), pair_index, transition_size)
    # Start l: u in [-1, 0] for the gold first label, [0, 1] for the others.
    first = labels[present, 0]
    start_low = np.isin(np.arange(L), first).astype(np.int64)
    start_high = np.array([np.any(first != l) for l in range(L)], np.int64)
    lowest = -np.concatenate([emission_low.reshape(-1), transition_low.reshape(-1), start_low])
    highest = np.concatenate([emission_high.reshape(-1), transition_high.reshape(-1), start_high])
    return lowest, highest


# ---------------------------------------------------------------------------
# Statistics of a batch of sequences
# ---------------------------------------------------------------------------


def _weights(theta, data: ChainBoostingData):
    """`(emission [K, L], transitions [L, L], start [L])` of the flat weights `[K L + L^2 + L]`."""
    K, L = data.num_features, data.num_labels
    return (theta[: K * L].reshape(K, L), theta[K * L : K * L + L * L].reshape(L, L), theta[K * L + L * L :])


def chain_boosting_model(theta, data: ChainBoostingData) -> LinearChainModel:
    """The `LinearChainModel` of flat boosting weights `theta [K L + L^2 + L]`."""
    emission, transitions, start = _weights(theta, data)
    L = data.num_labels
    return LinearChainModel(emission, transitions, start, jnp.zeros((0, L, L), theta.dtype))


def _slots(data: ChainBoostingData, rows):
    """Slot indices `[...]` of every contribution of sequences `rows [B]` (the
    order of `_contributions`); index S (dropped) for padding entries."""
    L, T = data.num_labels, data.ids.shape[1]
    _, transition_offset, start_offset, num_slots = data.slot_offsets()
    B, labels = rows.shape[0], jnp.arange(L)
    feature, count = data.pair_feature[rows], data.pair_count[rows]
    width, centre = 2 * data.feature_range[feature] + 1, data.feature_range[feature]
    emission = jnp.where(
        (count > 0)[..., None],
        data.feature_slot[feature][..., None] + labels * width[..., None] + (centre + count)[..., None],
        num_slots,
    )
    gold_pair = jnp.minimum(data.gold_pair[rows], feature.shape[1] - 1)
    gold_count, gold_label = data.gold_count[rows], data.gold_label[rows]
    g_feature = jnp.take_along_axis(feature, gold_pair, 1)
    g_count = jnp.take_along_axis(count, gold_pair, 1)
    g_base = (
        data.feature_slot[g_feature]
        + gold_label * (2 * data.feature_range[g_feature] + 1)
        + data.feature_range[g_feature]
    )
    live = gold_count > 0
    gold_low = jnp.where(live, g_base - gold_count, num_slots)
    gold_high = jnp.where(live, g_base + g_count - gold_count, num_slots)
    lengths = data.lengths[rows]
    most = _most(lengths, L)
    pairs = (labels[:, None] * L + labels[None, :]) * (2 * T - 1) + T - 1
    most_by_length = _most(jnp.arange(T + 1), L)
    transition = jnp.where(most_by_length > 0, transition_offset + pairs + most_by_length, num_slots)
    t_live = data.transition_count[rows] > 0
    t_pair = data.transition_from[rows] * L + data.transition_to[rows]
    t_base = transition_offset + t_pair * (2 * T - 1) + T - 1
    t_most = jnp.take_along_axis(most.reshape(B, L * L), t_pair, 1)
    t_count = data.transition_count[rows]
    transition_low = jnp.where(t_live, t_base - t_count, num_slots)
    transition_high = jnp.where(t_live, t_base + t_most - t_count, num_slots)
    start = jnp.broadcast_to(start_offset + 3 * labels + 2, (B, L))
    start_low = start_offset + 3 * jnp.maximum(data.labels[rows, 0], 0)
    return jnp.concatenate(
        [
            emission.reshape(-1),
            gold_low.reshape(-1),
            gold_high.reshape(-1),
            transition.reshape(-1),
            transition_low.reshape(-1),
            transition_high.reshape(-1),
            start.reshape(-1),
            start_low,
        ]
    )


def _most(lengths, L: int):
    """`[B, L, L]` the most occurrences of each transition in a sequence of each length."""
    diagonal = jnp.eye(L, dtype=bool)
    return jnp.where(diagonal, jnp.maximum(lengths - 1, 0)[:, None, None], (lengths // 2)[:, None, None])


def _contributions(data: ChainBoostingData, theta, rows, valid, log_scale):
    """`(log_losses [B], values [...])`: `-log P(y_i | x_i)` of sequences
    `rows [B]` (where `valid [B]`) and their masses at the slots of `_slots`,
    times `e^-log_scale`, from one forward-backward."""
    L, K, T = data.num_labels, data.num_features, data.ids.shape[1]
    B = rows.shape[0]
    emission, transitions, start = _weights(theta, data)
    ids, labels = data.ids[rows], data.labels[rows]
    lengths = jnp.where(valid, data.lengths[rows], 0)
    unary = jnp.sum(jnp.take(emission, jnp.where(ids < 0, K, ids), axis=0, mode="fill", fill_value=0), axis=2)

    potentials = chain.FactoredPotentials(unary, transitions, start)
    # Per sequence: node marginals [B, T, L], expected transition counts [B, L, L], first labels [B, L].
    log_z, (node, expected, first) = chain.log_partition_and_marginals(potentials, lengths)
    log_losses = log_z - chain.score(potentials, labels, lengths)
    weight = jnp.where(valid, jnp.exp(log_weights(log_losses) - log_scale), 0.0)  # D(i) W / W_scale
    inverse = jnp.where(valid, jnp.exp(log_losses - log_scale), 0.0)  # (1 / P_i) / W_scale
    dtype = weight.dtype
    batch = jnp.arange(B)

    # Emission: per (sequence, feature) the marginal mass of its occurrences per label.
    Q = data.pair_feature.shape[1]
    occurrence = data.occurrence_pair[rows]
    # Scatter the occurrences (not their L marginals), then one batched matmul.
    at_position = (
        jnp.zeros((B, T, Q + 1), dtype).at[batch[:, None, None], jnp.arange(T)[None, :, None], occurrence].add(1.0)
    )
    # HIGHEST: accelerators' default float32 matmul rounds its inputs (TF32, bfloat16).
    sums = jnp.einsum("btq,btl->bql", at_position[..., :Q], node, precision=jax.lax.Precision.HIGHEST)
    count = data.pair_count[rows].astype(dtype)
    gold_pair, gold_label, gold_count = data.gold_pair[rows], data.gold_label[rows], data.gold_count[rows]
    is_gold = (
        jnp.zeros((B, Q + 1, L), jnp.int32)
        .at[batch[:, None], gold_pair, gold_label]
        .add((gold_count > 0).astype(jnp.int32))[:, :Q]
        > 0
    )
    safe_count = jnp.maximum(count, 1.0)[..., None]
    # A label that is gold at none of the feature's occurrences: u in [0, c],
    # all of the mass of its bound that is not at 0 sits at c: (1 / P) E_P[S] / c.
    emission_values = jnp.where(is_gold, 0.0, inverse[:, None, None] * sums / safe_count)
    g = gold_count.astype(dtype)
    g_count = jnp.take_along_axis(count, jnp.minimum(gold_pair, Q - 1), 1)
    g_sum = sums[batch[:, None], jnp.minimum(gold_pair, Q - 1), gold_label]
    gold_low = _low_mass(weight[:, None], inverse[:, None], g_count, g, g_sum)
    gold_high = weight[:, None] - gold_low

    # Transitions: expected counts, most occurrences, gold counts.
    most = _most(lengths, L).astype(dtype)
    t_count = data.transition_count[rows]
    t_pair = data.transition_from[rows] * L + data.transition_to[rows]
    is_gold_transition = (
        jnp.zeros((B, L * L), jnp.int32)
        .at[batch[:, None], t_pair]
        .add((t_count > 0).astype(jnp.int32))
        .reshape(B, L, L)
        > 0
    )
    transition_values = jnp.where(
        is_gold_transition | (most == 0), 0.0, inverse[:, None, None] * expected / jnp.maximum(most, 1.0)
    )
    # A non-gold transition's slot depends on the sequence only through its
    # length: sum per length ([T + 1, L, L]) before the scatter into slots,
    # which would otherwise take L^2 scattered adds per sequence.
    transition_values = jax.ops.segment_sum(transition_values.reshape(B, L * L), lengths, num_segments=T + 1)
    t_expected = jnp.take_along_axis(expected.reshape(B, L * L), t_pair, 1)
    t_most = jnp.take_along_axis(most.reshape(B, L * L), t_pair, 1)
    transition_low = jnp.where(
        t_count > 0, _low_mass(weight[:, None], inverse[:, None], t_most, t_count.astype(dtype), t_expected), 0.0
    )
    transition_high = jnp.where(t_count > 0, weight[:, None] - transition_low, 0.0)

    # Start: u in [-1, 0] for the gold first label (mass at -1), [0, 1] for the others.
    first_gold = jax.nn.one_hot(labels[:, 0], L, dtype=bool) & (lengths > 0)[:, None]
    start_values = jnp.where(first_gold, 0.0, inverse[:, None] * first)
    start_low = jnp.where(
        lengths > 0, inverse * (1.0 - jnp.take_along_axis(first, jnp.maximum(labels[:, :1], 0), 1)[:, 0]), 0.0
    )
    values = jnp.concatenate(
        [
            emission_values.reshape(-1),
            gold_low.reshape(-1),
            gold_high.reshape(-1),
            transition_values.reshape(-1),
            transition_low.reshape(-1),
            transition_high.reshape(-1),
            start_values.reshape(-1),
            start_low,
        ]
    )
    return jnp.where(valid, log_losses, 0.0), values


def _low_mass(weight, inverse, most, gold, expected):
    """The mass of one sequence's bound at `u_min = -gold` (times `W`):
    `D(i) r_ik` with `r_ik = (u_max - E_pi[u]) / (u_max - u_min)`, `u_max =
    most - gold`, `u_min = -gold`, i.e. `(w (most - gold) - (1 / P) (E_P[S] -
    gold)) / most` for `w = 1 / P - 1` (`E_pi[u] = E_P[u] / (1 - P)`)."""
    return jnp.where(most > 0, (weight * (most - gold) - inverse * (expected - gold)) / jnp.maximum(most, 1.0), 0.0)


# ---------------------------------------------------------------------------
# Full and incremental updates
# ---------------------------------------------------------------------------


def _full_pass(data: ChainBoostingData, theta, log_scale, with_masses: bool = True):
    """`(log_losses [N], masses [S])` of all sequences, in blocks of `data.block`."""
    N = data.lengths.shape[0]
    num_slots = data.slot_offsets()[-1]
    size = min(data.block, N)
    num_blocks = -(-N // size)

    def body(index, carry):
        log_losses, masses = carry
        rows = index * size + jnp.arange(size)
        valid = rows < N
        rows = jnp.where(valid, rows, 0)
        block_losses, values = _contributions(data, theta, rows, valid, log_scale)
        log_losses = log_losses.at[jnp.where(valid, rows, N)].set(block_losses, mode="drop")
        if with_masses:
            masses = masses.at[_slots(data, rows)].add(values, mode="drop")
        return log_losses, masses

    zeros = (jnp.zeros((N,), theta.dtype), jnp.zeros((num_slots if with_masses else 0,), theta.dtype))
    return jax.lax.fori_loop(0, num_blocks, body, zeros)


def log_weights(log_losses) -> jax.Array:
    """`log(1 / P_i - 1)` `[N]` from `log_losses [N]` (`-log P_i`), -inf where
    `P_i = 1`: `e^loss (1 - e^-loss)` in log space (e^loss overflows for long
    sequences)."""
    positive = log_losses > 0
    return jnp.where(positive, log_losses + jnp.log(-jnp.expm1(-jnp.where(positive, log_losses, 1.0))), -jnp.inf)


def log_exp_loss(log_losses) -> jax.Array:
    """`log sum_i (1 / P_i - 1)` from `log_losses [N]` (`-log P_i`), `[]`, without overflow."""
    return jax.nn.logsumexp(log_weights(log_losses))


def chain_statistics(data: ChainBoostingData, theta) -> ChainStatistics:
    """The statistics at `theta [K L + L^2 + L]`: two full passes (the
    first finds the exp-loss that scales the masses)."""
    log_losses, _ = _full_pass(data, theta, jnp.zeros((), theta.dtype), with_masses=False)
    log_scale = log_exp_loss(log_losses)
    log_losses, masses = _full_pass(data, theta, log_scale)
    return ChainStatistics(log_losses, masses, log_scale, jnp.zeros((), jnp.int32))


def update_chain_statistics(
    data: ChainBoostingData, statistics: ChainStatistics, theta, new_theta, feature, refresh_every: int
) -> ChainStatistics:
    """The statistics at `new_theta`, which differs from `theta` in weak
    learner `feature` only (see the module docstring for when a full pass
    runs instead of an incremental one)."""
    L, N = data.num_labels, data.lengths.shape[0]
    emission = feature < data.num_features * L
    observed = jnp.where(emission, feature // L, 0)
    first = data.feature_piece_start[observed]
    occurrences = data.feature_piece_start[observed + 1] - first
    tier = jnp.sum(occurrences > jnp.asarray(data.tiers, jnp.int32)) if data.tiers else 0
    due = (
        ~emission
        | (statistics.since_refresh + 1 >= refresh_every)
        | (log_exp_loss(statistics.log_losses) < statistics.log_scale - RESCALE_NATS)
    )

    def incremental(capacity):
        def run(_):
            rows = jax.lax.dynamic_slice_in_dim(data.feature_pieces, first, capacity)
            valid = jnp.arange(capacity) < occurrences
            rows = jnp.where(valid, rows, 0)
            old_losses, old = _contributions(data, theta, rows, valid, statistics.log_scale)
            new_losses, new = _contributions(data, new_theta, rows, valid, statistics.log_scale)
            del old_losses
            masses = statistics.masses.at[_slots(data, rows)].add(new - old, mode="drop")
            log_losses = statistics.log_losses.at[jnp.where(valid, rows, N)].set(new_losses, mode="drop")
            return ChainStatistics(log_losses, masses, statistics.log_scale, statistics.since_refresh + 1)

        return run

    def full(_):
        log_scale = log_exp_loss(statistics.log_losses)
        log_losses, masses = _full_pass(data, new_theta, log_scale)
        return ChainStatistics(log_losses, masses, log_scale, jnp.zeros((), jnp.int32))

    branch = jnp.where(due, len(data.tiers), tier)
    return jax.lax.switch(branch, [incremental(capacity) for capacity in data.tiers] + [full], None)


def chain_slot_groups(data: ChainBoostingData, masses):
    """The slot masses `[S]` as rectangles `(masses [G, W], values [W])`: one
    per emission group (`c = 1, 2, ...`), then transitions, then starts."""
    L, T = data.num_labels, data.ids.shape[1]
    offsets, transition_offset, start_offset, _ = data.slot_offsets()
    groups = []
    for c, (features, offset) in enumerate(zip(data.group_features, offsets), start=1):
        size = features.shape[0] * L * (2 * c + 1)
        groups.append((masses[offset : offset + size].reshape(-1, 2 * c + 1), jnp.arange(-c, c + 1)))
    groups.append((masses[transition_offset:start_offset].reshape(L * L, 2 * T - 1), jnp.arange(1 - T, T)))
    groups.append((masses[start_offset:].reshape(L, 3), jnp.arange(-1, 2)))
    return groups


def chain_weak_learners(data: ChainBoostingData, per_group) -> jax.Array:
    """Per-group results (`[G]` each, in the order of `chain_slot_groups`) as
    one `[K L + L^2 + L]` vector; features that never occur get 0."""
    L = data.num_labels
    emission = jnp.zeros((data.num_features, L), per_group[-1].dtype)
    for features, values in zip(data.group_features, per_group[:-2]):
        emission = emission.at[features].set(values.reshape(-1, L))
    return jnp.concatenate([emission.reshape(-1), per_group[-2], per_group[-1]])


def chain_weak_learner_row(data: ChainBoostingData, masses, feature):
    """`(masses [W], values [W])`: the slots of one (traced) weak learner
    `feature`, padded with zero masses to the widest row W."""
    L, T, K = data.num_labels, data.ids.shape[1], data.num_features
    _, transition_offset, start_offset, _ = data.slot_offsets()
    width_max = max(2 * len(data.group_features) + 1, 2 * T - 1, 3)
    observed = jnp.minimum(feature // L, K - 1)
    centre = jnp.where(feature < K * L, data.feature_range[observed], jnp.where(feature < K * L + L * L, T - 1, 1))
    first = jnp.where(
        feature < K * L,
        data.feature_slot[observed] + feature % L * (2 * centre + 1),
        jnp.where(
            feature < K * L + L * L,
            transition_offset + (feature - K * L) * (2 * T - 1),
            start_offset + 3 * (feature - K * L - L * L),
        ),
    )
    offsets = jnp.arange(width_max)
    inside = offsets <= 2 * centre
    row = jnp.where(inside, masses.at[first + offsets].get(mode="fill", fill_value=0), 0.0)
    return row, jnp.where(inside, offsets - centre, 0).astype(masses.dtype)


def chain_group_weak_learner(data: ChainBoostingData, group: int, row) -> jax.Array:
    """The weak learner `[]` int32 of (traced) `row` of slot group `group`
    (static; the order of `chain_slot_groups`)."""
    L, K = data.num_labels, data.num_features
    if group < len(data.group_features):
        return (data.group_features[group][row // L] * L + row % L).astype(jnp.int32)
    return (K * L + (group - len(data.group_features)) * L * L + row).astype(jnp.int32)
