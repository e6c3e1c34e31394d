"""The one back-pointer decoder: the k best label sequences of a chain
(Viterbi is k = 1), for `chain.viterbi`, `chain.kbest` and the sparse
perceptron's exact integer decoders (`training.sparse_perceptron`).

The forward pass keeps the k best scores per position and label (`history [T, L,
k]`), not pointers; the backtrace recomputes each pointer from the history and
the column of edge scores into the chosen label, from the same numbers, so it
makes the same choice (ties: the lowest (label, rank) index, as `lax.top_k`).
What varies is passed in: the first scores, the forward `step` and the `column`.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def first_best(values):
    """`jnp.argmax` of `values` (the lowest index among ties) as a max and a
    min reduction, which XLA's CPU backend runs faster than its variadic
    argmax.

    Args:
      values: `[M]`.

    Returns:
      `[]` int32, the index.
    """
    best = jnp.max(values)
    return jnp.min(jnp.where(values == best, jnp.arange(values.shape[0], dtype=jnp.int32), values.shape[0]))


def _nth_best(candidates, rank, k: int):
    """The index of the `rank`-th best of `candidates [M]` (the k best kept)."""
    if k == 1:
        return first_best(candidates)
    return jax.lax.top_k(candidates, k)[1][rank].astype(jnp.int32)


def forward(first, step, length, num_steps: int, *, stop_at_length: bool = False):
    """The forward pass: the k best scores per position and label.

    Args:
      first: `[L, k]`, the scores at position 0.
      step: `step(alpha [L, k], t) -> [L, k]`, the scores at `t` from those
        at `t - 1`.
      length: `[]` int, the positions used.
      num_steps: `T`.
      stop_at_length: stop at `length` rather than at `T` (later positions
        keep `first`).

    Returns:
      `history [T, L, k]`: `first` at position 0, then `step(alpha, t)`.
    """
    history = jnp.broadcast_to(first, (num_steps,) + first.shape)

    def body(t, carry):
        alpha, history = carry
        alpha = step(alpha, t)
        return alpha, history.at[t].set(alpha)

    _, history = jax.lax.fori_loop(1, length if stop_at_length else num_steps, body, (first, history))
    return history


def backtrace(history, column, length, final, *, stop_at_length: bool = False):
    """The labels of one sequence, from the history and its final entry.

    Args:
      history: `[T, L, k]`, from `forward`.
      column: `column(t, label) -> [L]`, the scores of the edges into
        `label` at `t`.
      length: `[]` int, the positions used.
      final: `[]` int, the sequence's flat index (`label * k + rank`) at
        position `length - 1`.
      stop_at_length: step back `length` times rather than `T`.

    Returns:
      `[T]` int32, -1 at and past the length.
    """
    T, _, k = history.shape
    labels = jnp.full((T,), -1, jnp.int32)

    def body(i, carry):
        labels, state = carry
        t = length - 1 - i  # the position of `state`; below 0 once a mapped chain is done
        label = state // k
        labels = labels.at[jnp.where(t >= 0, t, T)].set(label, mode="drop")
        candidates = (
            jax.lax.dynamic_index_in_dim(history, jnp.maximum(t - 1, 0), 0, False)
            + column(jnp.maximum(t, 0), label)[:, None]
        )
        previous = _nth_best(candidates.reshape(-1), state % k, k)
        return labels, jnp.where(t > 0, previous, state)

    labels, _ = jax.lax.fori_loop(0, length if stop_at_length else T, body, (labels, final.astype(jnp.int32)))
    return labels


def best_final(history, length, k: int):
    """The k best entries of `history[length - 1]`.

    Args:
      history: `[T, L, k]`, from `forward`.
      length: `[]` int, at least 1.
      k: the number of entries.

    Returns:
      scores: `[k]`, best first.
      indices: `[k]` int32, flat indices `label * k + rank`.
    """
    last = jax.lax.dynamic_index_in_dim(history, jnp.maximum(length - 1, 0), 0, False).reshape(-1)
    if k == 1:
        return jnp.max(last)[None], first_best(last)[None]
    scores, index = jax.lax.top_k(last, k)
    return scores, index.astype(jnp.int32)


def best_paths(k: int, potentials, length, *, stop_at_length: bool = False):
    """The k best label sequences of one chain (any potential form).

    A length-0 chain has one empty sequence of score 0.

    Args:
      k: the number of sequences.
      potentials: one chain's form (`lattices.forms`, unbatched: `T`
        positions, `L` labels).
      length: `[]` int, the positions used.
      stop_at_length: loop over the `length` positions, not all `T` (the
        same result): for a chain decoded alone, as each sentence of an
        online epoch; mapped over chains, a loop whose trip count differs
        per chain would carry its whole history through selects.

    Returns:
      scores: `[k]`, best first; -inf for sequences that do not exist (fewer
        than `k` with a finite score).
      labels: `[k, T]` int32, -1 at and past the length and for sequences
        that do not exist.
    """
    T, L, dtype = potentials.num_steps, potentials.num_labels, potentials.dtype
    if T == 0:
        return jnp.zeros((k,), dtype).at[1:].set(-jnp.inf), jnp.zeros((k, 0), jnp.int32)
    valid = jnp.arange(T) < length
    potentials = potentials.masked(valid)
    inputs = potentials.time_inputs()
    at = lambda t: jax.tree_util.tree_map(lambda x: jax.lax.dynamic_index_in_dim(x, t, 0, False), inputs)
    first = jnp.full((L, k), -jnp.inf, dtype).at[:, 0].set(potentials.first_scores()[0])

    def step(alpha, t):
        scores_t = potentials.block(at(t))
        if k == 1:
            return jnp.max(alpha[:, 0][:, None] + scores_t, 0)[:, None]
        # candidates[j, i * k + r] = alpha[i, r] + scores_t[i, j]
        candidates = (alpha[:, None, :] + scores_t[:, :, None]).transpose(1, 0, 2).reshape(L, L * k)
        return jax.lax.top_k(candidates, k)[0]

    history = forward(first, step, length, T, stop_at_length=stop_at_length)
    scores, final = best_final(history, length, k)
    column = lambda t, label: potentials.column(at(t), label)
    labels = jax.vmap(lambda f: backtrace(history, column, length, f, stop_at_length=stop_at_length))(final)
    present = valid[None, :] & (scores > -jnp.inf)[:, None]
    empty = jnp.zeros((k,), dtype).at[1:].set(-jnp.inf)  # length 0: one empty sequence of score 0
    return jnp.where(length == 0, empty, scores), jnp.where(present, labels, -1)
