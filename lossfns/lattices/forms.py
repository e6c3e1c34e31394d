"""Potential forms: how a chain's scores are stored, and the few questions
that the one scan and the one decoder of `chain` ask of them.

* `DensePotentials(scores [..., T, L, L])`: per-position edge scores;
  `scores[..., t, i, j]` scores label `j` at position `t` after label `i`,
  and at a chain's first position only row 0 (the start scores) is read.
  Public functions take the bare array; `chain` wraps it.
* `FactoredPotentials(unary [..., T, L], transitions [L, L] or [..., L, L],
  start [L] or [..., L] or None)`: the classic CRF, `psi_t(i, j) =
  transitions[i, j] + unary[t, j]` and `psi(start, j) = start[j] +
  unary[t, j]` at a chain's first position; `[T, L, L]` is never built
  (the transitions are converted once).

The protocol (methods of an *unbatched* form, `T` positions, `L` labels):

* `num_steps`, `num_labels`, `dtype`;
* `masked(valid [T])`: the form with positions outside `valid` scored 0 (the
  log-space one, so `-inf` or NaN padding cannot leak into gradients);
* `first_scores()`: `[T, L]`, the scores of each label if a chain starts
  at position `t`;
* `time_inputs()` and `block(x_t)`: a pytree with a leading time axis, and
  the `[L, L]` edge scores of one step from its slice (the decoder and the
  sampler materialise one block at a time);
* `lift(semiring)`: `(inputs, step)` with `step(value, inputs_t) ->
  (value', log_scale)` the transition action on a carried semiring vector
  (the factored form converts its transitions once);
* `edge_scores()`: `[T, L, L]`, every block (the parallel algorithm's
  matrices);
* `score_terms(labels, previous, starts)`: `[T]`, the score of each
  position's label given the previous one (or the start at `starts`);
* `batched(batch_shape)`: `(flat, in_axes)`, the form with its batch
  flattened into one axis and the `jax.vmap` axes of its fields (shared
  transitions stay shared); `unshared(batch_shape)`: every field per
  example; `as_argument()` and `from_gradient(gradient)`: what public
  functions take and return.

`lattices.sparse_chain.SparsePotentials` (Lavergne's sparse label pairs) is
the third form; it lives beside its sparse step.

Adding a form (for example semi-Markov segments) adds a class here, not
branches in the algorithms.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

#: The name of the batch axis that `chain` maps an unbatched form's
#: algorithms over (`jax.vmap(..., axis_name=BATCH_AXIS)`): a step may take
#: one decision for the whole batch with a collective over it.
BATCH_AXIS = "chains"


def _time_major(value, time_axis):
    """Move the logical time axis of every leaf of a semiring value to the front."""
    return jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, time_axis, 0), value)


def _flatten(x, batch_shape, core: int):
    """`x [*batch_shape, *core dims] -> [prod(batch_shape), *core dims]`."""
    return x.reshape((math.prod(batch_shape),) + x.shape[x.ndim - core:])


class DensePotentials(NamedTuple):
    """Per-position edge scores `[..., T, L, L]` (see the module docstring)."""

    scores: jax.Array

    @property
    def num_steps(self) -> int:
        return self.scores.shape[-3]

    @property
    def num_labels(self) -> int:
        return self.scores.shape[-1]

    @property
    def dtype(self):
        return self.scores.dtype

    def masked(self, valid):
        return DensePotentials(jnp.where(valid[:, None, None], self.scores, 0.0))

    def first_scores(self):
        return self.scores[:, 0, :]

    def time_inputs(self):
        return self.scores

    def block(self, scores_t):
        return scores_t

    def lift(self, semiring):
        matrices, scales = semiring.convert_scaled(self.scores, (-2, -1))

        def step(value, inputs_t):
            matrix_t, scale_t = inputs_t
            return semiring.vecmat(value, matrix_t), scale_t

        return (_time_major(matrices, -3), scales), step

    def edge_scores(self):
        return self.scores

    def score_terms(self, labels, previous, starts):
        return self.scores[jnp.arange(labels.shape[0]), previous, labels]

    def batched(self, batch_shape):
        return DensePotentials(_flatten(self.scores, batch_shape, 3)), DensePotentials(0)

    def unshared(self, batch_shape):
        return self

    def as_argument(self):
        """What public functions take and return for this form: the bare array."""
        return self.scores

    def from_gradient(self, gradient):
        """The marginals of `chain.marginals` from the gradient of log Z with
        respect to `as_argument()`."""
        return gradient


class FactoredPotentials(NamedTuple):
    """Unary scores plus a shared transition matrix (see the module docstring).

    unary: `[..., T, L]`; transitions: `[L, L]` or `[..., L, L]`;
    start: `[L]`, `[..., L]` or `None` (zeros).
    """

    unary: jax.Array
    transitions: jax.Array
    start: Optional[jax.Array] = None

    @property
    def num_steps(self) -> int:
        return self.unary.shape[-2]

    @property
    def num_labels(self) -> int:
        return self.unary.shape[-1]

    @property
    def dtype(self):
        return self.unary.dtype

    @property
    def shares_transitions(self) -> bool:
        """Whether one transition matrix and start serve the whole batch."""
        return self.transitions.ndim == 2 and self.start.ndim == 1

    def masked(self, valid):
        return self._replace(unary=jnp.where(valid[:, None], self.unary, 0.0))

    def first_scores(self):
        return self.start + self.unary

    def time_inputs(self):
        return self.unary

    def block(self, unary_t):
        return self.transitions + unary_t[None, :]

    def lift(self, semiring):
        transitions, transition_scale = semiring.convert_scaled(self.transitions, (-2, -1))
        unary, unary_scale = semiring.convert_scaled(self.unary, (-1,))

        def step(value, inputs_t):
            unary_t, unary_scale_t = inputs_t
            return (semiring.times(semiring.vecmat(value, transitions), unary_t),
                    unary_scale_t + transition_scale)

        return (_time_major(unary, -2), unary_scale), step

    def edge_scores(self):
        return self.transitions[..., None, :, :] + self.unary[..., :, None, :]

    def score_terms(self, labels, previous, starts):
        edge = jnp.where(starts, self.start[labels], self.transitions[previous, labels])
        return self.unary[jnp.arange(labels.shape[0]), labels] + edge

    def batched(self, batch_shape):
        transitions, start = self.transitions, self.start
        transitions_axis = None if transitions.ndim == 2 else 0
        start_axis = None if start.ndim == 1 else 0
        if transitions_axis == 0:
            transitions = _flatten(jnp.broadcast_to(transitions, batch_shape + transitions.shape[-2:]), batch_shape, 2)
        if start_axis == 0:
            start = _flatten(jnp.broadcast_to(start, batch_shape + start.shape[-1:]), batch_shape, 1)
        flat = FactoredPotentials(_flatten(self.unary, batch_shape, 2), transitions, start)
        return flat, FactoredPotentials(0, transitions_axis, start_axis)

    def unshared(self, batch_shape):
        """Per-example transitions and start, so that their derivatives are
        per-example expected counts rather than batch sums."""
        L = self.num_labels
        return FactoredPotentials(self.unary, jnp.broadcast_to(self.transitions, batch_shape + (L, L)),
                                  jnp.broadcast_to(self.start, batch_shape + (L,)))

    def as_argument(self):
        return self

    def from_gradient(self, gradient):
        return gradient


def materialize(potentials: FactoredPotentials) -> jax.Array:
    """Per-position potentials `[..., T, L, L]` equal to a factored form
    (row 0 at t = 0 holds the start scores; other rows there are unread)."""
    unary, transitions = jnp.asarray(potentials.unary), jnp.asarray(potentials.transitions)
    start = potentials.start
    L = unary.shape[-1]
    start = jnp.zeros((L,), unary.dtype) if start is None else start
    edges = transitions[..., None, :, :] + unary[..., :, None, :]
    if unary.shape[-2] == 0:
        return edges
    first_row = jnp.broadcast_to(start[..., None, :] + unary[..., :1, :], edges.shape[:-3] + (1, L))
    return edges.at[..., :1, 0, :].set(first_row)
