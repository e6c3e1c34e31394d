"""The fast averaged perceptron over sparse observation features.

For the usual CRF (`emission [K, L]` rows summed over a token's observation ids,
plus `transitions [L, L]`) this runs the algorithm of `training.perceptron`
(Collins 2002) with integer weights, sparse updates (only the rows and label pairs
a sentence touches), lazy averaging (no per-example pass) and an exact Viterbi
(int16 max-plus while the weights allow; optional label pruning). Scores are int32
sums of integer weights, so all of it is exact, and the tests check it against a
plain-loop averaged perceptron; `dtype=jnp.int64` (with `jax_enable_x64`) for more.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..lattices import decode
from ..validation import check_int, integer_values

# Rows per max-plus group and the int16 range of the narrow decoder (see above).
_GROUP = 8
_NARROW_WEIGHT = 4096
_NARROW_FLOOR = 12288


class SparseSequenceData(NamedTuple):
    """A corpus as one stack of tokens (from `sparse_sequence_data`).

    feature_ids: `[N_tokens + pad, F]` int32 observation ids, `num_features`
      (out of range) for padding; labels: `[N_tokens + pad]` int32 gold labels;
    offsets, lengths: `[N]` int32 first token and length of each sentence.
    """

    feature_ids: jax.Array
    labels: jax.Array
    offsets: jax.Array
    lengths: jax.Array


class SparsePerceptronState(NamedTuple):
    """emission `[K, L]`, transitions `[L, L]`: the current integer weights;
    weighted_emission, weighted_transitions: sums of `c * update` (lazy
    averaging); num_seen: `[]` examples seen; bounds: `(in_max, in_min,
    out_max, out_min)` `[L]` bounds on the columns (`in`) and rows (`out`) of
    `transitions` (valid bounds, not necessarily tight: see `refresh_bounds`);
    transposed: `transitions.T`, kept for the backtrace's column reads;
    narrow: `transitions` as int16, padded with `-_NARROW_FLOOR` to
    `[_GROUP, 32]` multiples (read only while all weights lie in
    `[-_NARROW_WEIGHT, _NARROW_WEIGHT]`)."""

    emission: jax.Array
    transitions: jax.Array
    weighted_emission: jax.Array
    weighted_transitions: jax.Array
    num_seen: jax.Array
    bounds: tuple
    transposed: jax.Array
    narrow: jax.Array


def sparse_sequence_data(feature_ids, labels, num_features: int, pad_to: int | None = None) -> SparseSequenceData:
    """Pack sentences for `sparse_perceptron_epoch`.

    feature_ids: per sentence, per token, a list of observation ids in
      `[0, num_features)` (e.g. `FeatureIndex.encode(...)[0]`);
    labels: per sentence, the gold label ids (one per token).
    pad_to: pad the stack with this many extra rows (default: the longest
      sentence), so that any sentence's window can be sliced.
    """
    lengths = np.asarray([len(sentence) for sentence in feature_ids], np.int32)
    if len(lengths) == 0 or np.any(lengths == 0):
        raise ValueError("sparse_sequence_data needs at least one sentence and no empty sentence")
    if [len(y) for y in labels] != lengths.tolist():
        raise ValueError("labels must hold one label per token of each sentence")
    num_features = check_int("num_features", num_features)
    width = max(len(token) for sentence in feature_ids for token in sentence)
    total = int(lengths.sum())
    pad = int(lengths.max() if pad_to is None else pad_to)
    # Filled as int64 from checked integer arrays, range-checked, then cast:
    # no float id truncated, no int64 id wrapped by the int32 cast.
    ids = np.full((total + pad, max(width, 1)), num_features, np.int64)
    row = 0
    for i, sentence in enumerate(feature_ids):
        for t, token in enumerate(sentence):
            if len(token):
                values = integer_values(f"feature_ids[{i}][{t}]", token, "a list of integer ids")
                assert values is not None  # host lists are never traced
                ids[row, : len(token)] = values
            row += 1
    real = np.arange(ids.shape[1]) < np.array([len(token) for sentence in feature_ids for token in sentence])[:, None]
    bad = real & ((ids[:total] < 0) | (ids[:total] >= num_features))
    if bad.any():
        raise ValueError(f"feature ids must lie in [0, {num_features}), got {ids[:total][bad][0]}")
    flat_labels = np.zeros(total + pad, np.int64)
    flat_labels[:total] = np.concatenate(
        [
            np.asarray(integer_values(f"labels[{i}]", y, "a list of integer label ids")).reshape(-1)
            for i, y in enumerate(labels)
        ]
    )  # asarray: typed (never None here)
    wide = (flat_labels < 0) | (flat_labels > np.iinfo(np.int32).max)
    if wide.any():
        raise ValueError(f"labels must be label ids in [0, 2**31), got {flat_labels[wide][0]}")
    ids, flat_labels = ids.astype(np.int32), flat_labels.astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    return SparseSequenceData(jnp.asarray(ids), jnp.asarray(flat_labels), jnp.asarray(offsets), jnp.asarray(lengths))


def transition_bounds(transitions) -> tuple:
    """Exact `(in_max, in_min, out_max, out_min)` of a transition matrix."""
    return (jnp.max(transitions, 0), jnp.min(transitions, 0), jnp.max(transitions, 1), jnp.min(transitions, 1))


def sparse_perceptron_init(
    num_features: int, num_labels: int, dtype=jnp.int32, *, emission=None, transitions=None
) -> SparsePerceptronState:
    """Integer weights (`dtype` int32, or int64 with `jax_enable_x64`): zero,
    or the given starting `emission [K, L]` / `transitions [L, L]` (the
    average then counts them as the weights before the first example, whose
    lazy sum `weighted` starts at them: `sum_{n <= C} w_n = (C + 1) w - weighted`)."""
    emission = jnp.zeros((num_features, num_labels), dtype) if emission is None else jnp.asarray(emission, dtype)
    transitions = jnp.zeros((num_labels, num_labels), dtype) if transitions is None else jnp.asarray(transitions, dtype)
    if emission.shape != (num_features, num_labels) or transitions.shape != (num_labels, num_labels):
        raise ValueError(
            f"emission must be [{num_features}, {num_labels}] and transitions [{num_labels}, "
            f"{num_labels}], got {emission.shape} and {transitions.shape}"
        )
    return SparsePerceptronState(
        emission,
        transitions,
        emission.copy(),
        transitions.copy(),
        jnp.zeros((), jnp.int32),
        transition_bounds(transitions),
        transitions.T,
        _narrow(transitions),
    )


def _narrow(transitions):
    num_labels = transitions.shape[0]
    rows, columns = -(-num_labels // _GROUP) * _GROUP, -(-num_labels // 32) * 32
    clipped = jnp.clip(transitions, -_NARROW_WEIGHT - 1, _NARROW_WEIGHT + 1).astype(jnp.int16)
    return jnp.full((rows, columns), -_NARROW_FLOOR, jnp.int16).at[:num_labels, :num_labels].set(clipped)


def refresh_bounds(state: SparsePerceptronState) -> SparsePerceptronState:
    """Tighten the transition bounds and rebuild the transition copies (`[L, L]` passes)."""
    return state._replace(
        bounds=transition_bounds(state.transitions), transposed=state.transitions.T, narrow=_narrow(state.transitions)
    )


def sparse_averaged_params(state: SparsePerceptronState, dtype=jnp.float32):
    """`(emission, transitions)` of the averaged perceptron: the mean of the
    weights after every example seen, `w + (w - weighted) / C` (the current
    weights before any example)."""
    count = jnp.maximum(state.num_seen, 1).astype(dtype)
    average = lambda w, weighted: w.astype(dtype) + (w - weighted).astype(dtype) / count
    return (average(state.emission, state.weighted_emission), average(state.transitions, state.weighted_transitions))


def _window_sizes(max_length: int, windows) -> tuple:
    sizes = sorted({int(w) for w in windows if 0 < int(w) < max_length} | {int(max_length)})
    return tuple(sizes)


def _viterbi_window(emission, transitions, transposed, narrow_transitions, bounds, ids, length, *, widths: tuple):
    """Exact Viterbi labels `[window]` (-1 past `length`) of one sentence
    whose observation ids are `ids [window, F]`, and the decoder used.

    Every variant is `lattices.decode`'s decoder (forward max scores, then a
    backtrace that recomputes each pointer) on one chain, its loops stopping
    at the length; they differ in the forward step and the label set: the
    pruned ones decode a few label slots per position (`keep`), the dense
    ones every label, in int16 or int32.
    """
    window = ids.shape[0]
    num_labels = transitions.shape[0]
    dtype = emission.dtype
    very_low = jnp.asarray(-(2 ** (8 * jnp.dtype(dtype).itemsize - 3)), dtype)
    positions = jnp.arange(window)
    valid = positions < length
    # (dtype: with x64 enabled, jnp.sum would widen int32 to int64)
    scores = jnp.sum(emission.at[ids].get(mode="fill", fill_value=0), axis=1, dtype=dtype)  # [window, L]
    in_max, in_min, out_max, out_min = bounds
    if widths:
        has_in = (positions > 0)[:, None]
        has_out = (positions < length - 1)[:, None]
        zero = jnp.zeros((), dtype)
        low = scores + jnp.where(has_in, in_min, zero) + jnp.where(has_out, out_min, zero)
        high = scores + jnp.where(has_in, in_max, zero) + jnp.where(has_out, out_max, zero)
        feasible = high >= jnp.max(low, axis=1, keepdims=True)
        counts = jnp.sum(feasible, axis=1, dtype=jnp.int32)
        needed = jnp.max(jnp.where(valid, counts, 0))
        branch = jnp.searchsorted(jnp.asarray(widths, jnp.int32), needed).astype(jnp.int32)
    else:
        branch = jnp.zeros((), jnp.int32)

    def best_slots(first, step, column):
        """The decoder on one chain of `[window, slots]` forward scores."""
        history = decode.forward(
            first[:, None], lambda alpha, t: step(alpha[:, 0], t)[:, None], length, window, stop_at_length=True
        )
        _, final = decode.best_final(history, length, 1)
        return decode.backtrace(history, column, length, final[0], stop_at_length=True)

    def dense(narrow: bool):
        # The [L, L] max-plus as maxima of `_GROUP` rows at a time and one
        # short reduction (XLA's CPU code for this form is several times
        # faster than a reduction over the leading axis), on label vectors
        # padded with very low scores. `narrow`: in int16 (twice the SIMD
        # lanes), exact because every transition weight lies in
        # [-_NARROW_WEIGHT, _NARROW_WEIGHT] and the forward scores are shifted
        # to a maximum of 0 and clamped at -_NARROW_FLOOR, far enough below
        # that a clamped label can never be the best predecessor (nor picked
        # by the backtrace, which is shift-invariant).
        rows = -(-num_labels // _GROUP) * _GROUP
        columns = -(-num_labels // 32) * 32
        work = jnp.int16 if narrow else dtype
        if narrow:
            padded = narrow_transitions
        else:
            padded = jnp.full((rows, columns), very_low, work).at[:num_labels, :num_labels].set(transitions)
        padded = padded.reshape(rows // _GROUP, _GROUP, columns)
        unary = jnp.full((window, columns), very_low, dtype).at[:, :num_labels].set(scores)

        def normalise(alpha):
            return jnp.maximum(alpha - jnp.max(alpha), -_NARROW_FLOOR) if narrow else alpha

        def step(alpha, t):
            candidates = alpha[:rows].astype(work).reshape(rows // _GROUP, _GROUP)[:, :, None] + padded
            best = candidates[:, 0]
            for j in range(1, _GROUP):
                best = jnp.maximum(best, candidates[:, j])
            return normalise(jnp.max(best, axis=0).astype(dtype) + unary[t])

        # (the padded label columns never win: their scores are very low)
        return best_slots(
            normalise(unary[0]),
            step,
            lambda t, label: jnp.full((columns,), very_low, dtype).at[:num_labels].set(transposed[label]),
        )

    def pruned(width):
        rank = jnp.cumsum(feasible, axis=1, dtype=jnp.int32) - 1
        slot = jnp.where(feasible & (rank < width), rank, width)
        keep = (
            jnp.zeros((window, width), jnp.int32)
            .at[positions[:, None], slot]
            .set(jnp.broadcast_to(jnp.arange(num_labels, dtype=jnp.int32), (window, num_labels)), mode="drop")
        )
        live = jnp.arange(width)[None, :] < counts[:, None]
        unary = jnp.where(live, jnp.take_along_axis(scores, keep, axis=1), very_low)

        def step(alpha, t):
            return jnp.max(alpha[:, None] + transitions[keep[t - 1]][:, keep[t]], axis=0) + unary[t]

        slots = best_slots(unary[0], step, lambda t, slot: transitions[keep[t - 1], keep[t, slot]])
        return jnp.where(slots >= 0, keep[positions, jnp.maximum(slots, 0)], -1)

    largest = jnp.maximum(jnp.max(in_max), -jnp.min(in_min))
    branch = jnp.where((branch == len(widths)) & (largest > _NARROW_WEIGHT), branch + 1, branch)
    labels = jax.lax.switch(
        branch,
        [functools.partial(pruned, width) for width in widths]
        + [functools.partial(dense, True), functools.partial(dense, False)],
    )
    return jnp.where(valid, labels, -1), branch


_CHUNK = 8


def _update(state: SparsePerceptronState, ids, gold, predicted, length) -> tuple[SparsePerceptronState, jax.Array]:
    """The perceptron update of one sentence, a scatter of its mistakes only,
    with the lazy-average sums and the transition bounds kept up to date.

    ids `[T, F]`, gold and predicted `[T]` (-1 past `length`). The wrong
    positions are gathered to the front and scattered `_CHUNK` at a time, so a
    sentence without mistakes costs no scatter at all.
    """
    num_features, num_labels = state.emission.shape
    window = ids.shape[0]
    valid = jnp.arange(window) < length
    wrong = valid & (predicted != gold)
    dtype = state.emission.dtype
    count = (state.num_seen + 1).astype(dtype)
    sign = jnp.asarray([1, -1], dtype)[:, None, None]

    # +1 on (observation, gold label), -1 on (observation, predicted label) at
    # the wrong positions, in chunks of `_CHUNK` positions.
    order = jnp.nonzero(wrong, size=window + _CHUNK, fill_value=window)[0]
    ids = jnp.concatenate([ids, jnp.full((1, ids.shape[1]), num_features, ids.dtype)])
    labels = jnp.stack(
        [
            jnp.concatenate([gold, jnp.zeros((1,), gold.dtype)]),
            jnp.concatenate([jnp.where(wrong, predicted, 0), jnp.zeros((1,), gold.dtype)]),
        ]
    )

    def chunk(c, tables):
        emission, weighted = tables
        positions = jax.lax.dynamic_slice_in_dim(order, c * _CHUNK, _CHUNK)
        rows = jnp.broadcast_to(ids[positions], (2, _CHUNK, ids.shape[1]))
        columns = labels[:, positions][:, :, None]
        emission = emission.at[rows, columns].add(jnp.broadcast_to(sign, rows.shape), mode="drop")
        weighted = weighted.at[rows, columns].add(jnp.broadcast_to(sign * count, rows.shape), mode="drop")
        return emission, weighted

    num_chunks = (jnp.sum(wrong, dtype=jnp.int32) + _CHUNK - 1) // _CHUNK
    emission, weighted_emission = jax.lax.fori_loop(0, num_chunks, chunk, (state.emission, state.weighted_emission))

    # The label pairs (t - 1, t) that differ.
    pair = valid[1:] & (wrong[1:] | wrong[:-1])
    pair_rows = jnp.where(pair[None], jnp.stack([gold[:-1], predicted[:-1]]), num_labels)
    pair_columns = jnp.where(pair[None], jnp.stack([gold[1:], predicted[1:]]), 0)
    pair_sign = sign[:, :, 0]
    transitions = state.transitions.at[pair_rows, pair_columns].add(
        jnp.broadcast_to(pair_sign, pair_rows.shape), mode="drop"
    )
    transposed = state.transposed.at[pair_columns, pair_rows].add(
        jnp.broadcast_to(pair_sign, pair_rows.shape), mode="drop"
    )
    # (wraps only far past _NARROW_WEIGHT, when the int16 decoder is not used)
    narrow = state.narrow.at[jnp.where(pair_rows < num_labels, pair_rows, state.narrow.shape[0]), pair_columns].add(
        jnp.broadcast_to(pair_sign, pair_rows.shape).astype(jnp.int16), mode="drop"
    )
    weighted_transitions = state.weighted_transitions.at[pair_rows, pair_columns].add(
        jnp.broadcast_to(pair_sign * count, pair_rows.shape), mode="drop"
    )

    # Keep the transition bounds valid: widen them by the changed cells' new values.
    new_values = transitions.at[pair_rows, pair_columns].get(mode="fill", fill_value=0)
    kept_columns = jnp.where(pair_rows < num_labels, pair_columns, num_labels)
    in_max, in_min, out_max, out_min = state.bounds
    bounds = (
        in_max.at[kept_columns].max(new_values, mode="drop"),
        in_min.at[kept_columns].min(new_values, mode="drop"),
        out_max.at[pair_rows].max(new_values, mode="drop"),
        out_min.at[pair_rows].min(new_values, mode="drop"),
    )
    return SparsePerceptronState(
        emission, transitions, weighted_emission, weighted_transitions, state.num_seen + 1, bounds, transposed, narrow
    ), jnp.any(wrong)


def _sentence_step(state: SparsePerceptronState, data: SparseSequenceData, index, *, windows: tuple, widths: tuple):
    """One example of the averaged perceptron: decode (in the smallest
    window that holds the sentence), then the sparse update."""
    offset, length = data.offsets[index], data.lengths[index]
    max_length = windows[-1]

    def in_window(size, emission, transitions, transposed, narrow, bounds):
        ids = jax.lax.dynamic_slice_in_dim(data.feature_ids, offset, size)
        predicted, branch = _viterbi_window(
            emission, transitions, transposed, narrow, bounds, ids, length, widths=widths
        )
        return jnp.full((max_length,), -1, jnp.int32).at[:size].set(predicted), branch

    window = jnp.searchsorted(jnp.asarray(windows, jnp.int32), length).astype(jnp.int32)
    predicted, branch = jax.lax.switch(
        window,
        [functools.partial(in_window, size) for size in windows],
        state.emission,
        state.transitions,
        state.transposed,
        state.narrow,
        state.bounds,
    )
    ids = jax.lax.dynamic_slice_in_dim(data.feature_ids, offset, max_length)
    gold = jax.lax.dynamic_slice_in_dim(data.labels, offset, max_length)
    state, mistake = _update(state, ids, gold, predicted, length)
    return state, mistake, branch


def sparse_perceptron_epoch(
    state: SparsePerceptronState,
    data: SparseSequenceData,
    *,
    max_length: int,
    windows=(8, 16, 24, 32, 48, 64),
    widths=(),
):
    """One epoch of the averaged perceptron (Collins 2002) over `data` in
    corpus order, one update per sentence. Jit-able with `max_length`,
    `windows` and `widths` static.

    Model: `score(x, y) = sum_t sum_{f in x_t} emission[f, y_t] + sum_{t > 0}
    transitions[y_{t-1}, y_t]` (no start or end scores). Decoding is exact
    Viterbi (pruned, see the comment above); ties go to the lowest label index.

    max_length: at least the longest sentence (`data` must be padded with at
      least that many rows, as `sparse_sequence_data` does by default);
    windows: sentence-length buckets (compiled shapes); widths: pruned label
      widths tried before the dense decoder (default none: at 333 joint
      labels the bound almost never prunes a whole sentence, see above).
    Returns `(state, (mistakes, branch_counts))`: sentences with a mistake, and
    how many sentences used each decoder (`widths`, dense int16, dense).
    """
    windows = _window_sizes(max_length, windows)
    num_labels = state.transitions.shape[0]
    widths = tuple(sorted({int(w) for w in widths if 0 < int(w) < num_labels}))
    state = refresh_bounds(state)

    def example(index, carry):
        state, mistakes, branches = carry
        state, mistake, branch = _sentence_step(state, data, index, windows=windows, widths=widths)
        return state, mistakes + mistake, branches.at[branch].add(1)

    state, mistakes, branches = jax.lax.fori_loop(
        0, data.lengths.shape[0], example, (state, jnp.zeros((), jnp.int32), jnp.zeros((len(widths) + 2,), jnp.int32))
    )
    return state, (mistakes, branches)


def sparse_scores(emission, ids):
    """Emission scores `[..., L]` of observation ids `[..., F]` (padding: out of range)."""
    return jnp.sum(emission.at[ids].get(mode="fill", fill_value=0), axis=-2, dtype=emission.dtype)
