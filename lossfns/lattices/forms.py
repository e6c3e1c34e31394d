"""Potential forms: how a chain's scores are stored, and the few questions
that the one scan and the one decoder of `chain` ask of them.

`DensePotentials(scores [..., T, L, L])`: per-position edge scores (at a chain's
first position only row 0, the start scores, is read). `FactoredPotentials(unary,
transitions, start)`: the classic CRF, `transitions[i, j] + unary[t, j]`, never
built as `[T, L, L]`. `lattices.sparse_chain.SparsePotentials` is the third. Each
answers one protocol (`masked`, `first_scores`, `block`, `column`, `lift`, ...):
a new form adds a class here, not branches in the algorithms.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import semirings
from . import kernel


def generic_lift(semiring, scores):
    """`(inputs, step)` of any semiring over per-position edge scores `[T, L, L]`:
    the blocks converted once, one semiring vector-matrix product a step."""
    matrices, scales = semiring.convert_scaled(scores, (-2, -1))
    time_axis = lambda x: x.ndim - 3  # leading axes of a semiring value (k-max) come first

    def step(value, inputs, t, live):
        matrices, scales = inputs
        matrix_t = jax.tree_util.tree_map(lambda x: jax.lax.dynamic_index_in_dim(x, t, time_axis(x), False), matrices)
        return semiring.vecmat(value, matrix_t), kernel.at_position(scales, t), ()

    return (matrices, scales), step


def _flatten(x, batch_shape, core: int):
    """`x [*batch_shape, *core dims] -> [prod(batch_shape), *core dims]`."""
    return x.reshape((math.prod(batch_shape),) + x.shape[x.ndim - core :])


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

    def column(self, scores_t, label):
        return scores_t[:, label]

    def lift(self, semiring):
        if type(semiring) is semirings.LogSemiring:
            return kernel.dense_log_steps(self.scores)
        return generic_lift(semiring, self.scores)

    def edge_scores(self):
        return self.scores

    def score_terms(self, labels, previous, starts):
        return self.scores[jnp.arange(labels.shape[0]), previous, labels]

    def batched(self, batch_shape):
        return DensePotentials(_flatten(self.scores, batch_shape, 3)), DensePotentials._make(
            (0,)
        )  # in_axes: its leaf is an axis

    def from_gradient(self, gradient):
        """The edge marginals: the bare array."""
        return gradient.scores


class FactoredPotentials(NamedTuple):
    """Unary scores plus a shared transition matrix (see the module docstring).

    unary: `[..., T, L]`; transitions: `[L, L]` or `[..., L, L]`;
    start: `[L]`, `[..., L]` or `None` (zeros).
    """

    unary: jax.Array
    transitions: jax.Array
    start: jax.Array | None = None

    @property
    def num_steps(self) -> int:
        return self.unary.shape[-2]

    @property
    def num_labels(self) -> int:
        return self.unary.shape[-1]

    @property
    def dtype(self):
        return self.unary.dtype

    def masked(self, valid):
        return self._replace(unary=jnp.where(valid[:, None], self.unary, 0.0))

    def first_scores(self):
        return self.start + self.unary

    def time_inputs(self):
        return self.unary

    def block(self, unary_t):
        return self.transitions + unary_t[None, :]

    def column(self, unary_t, label):
        return self.transitions[:, label] + unary_t[label]

    def lift(self, semiring):
        if type(semiring) is semirings.LogSemiring:
            return kernel.factored_log_steps(self.unary, self.transitions)
        transitions, transition_scale = semiring.convert_scaled(self.transitions, (-2, -1))
        unary, unary_scale = semiring.convert_scaled(self.unary, (-1,))

        def step(value, inputs, t, live):
            transitions, unary, unary_scale = inputs
            unary_t = jax.tree_util.tree_map(lambda x: jax.lax.dynamic_index_in_dim(x, t, x.ndim - 2, False), unary)
            return (
                semiring.times(semiring.vecmat(value, transitions), unary_t),
                kernel.at_position(unary_scale, t) + transition_scale,
                (),
            )

        return (transitions, unary, unary_scale), step

    def edge_scores(self):
        return self.transitions[..., None, :, :] + self.unary[..., :, None, :]

    def score_terms(self, labels, previous, starts):
        edge = jnp.where(starts, self.start[labels], self.transitions[previous, labels])
        return self.unary[jnp.arange(labels.shape[0]), labels] + edge

    def batched(self, batch_shape):
        transitions, start = self.transitions, self.start
        assert start is not None  # filled with zeros on entry
        transitions_axis = None if transitions.ndim == 2 else 0
        start_axis = None if start.ndim == 1 else 0
        if transitions_axis == 0:
            transitions = _flatten(jnp.broadcast_to(transitions, batch_shape + transitions.shape[-2:]), batch_shape, 2)
        if start_axis == 0:
            start = _flatten(jnp.broadcast_to(start, batch_shape + start.shape[-1:]), batch_shape, 1)
        flat = FactoredPotentials(_flatten(self.unary, batch_shape, 2), transitions, start)
        return flat, FactoredPotentials._make((0, transitions_axis, start_axis))  # in_axes: its leaves are axes

    def padded(self, num_labels: int):
        """The same chains over `num_labels >= L` labels, the extra ones
        forbidden (`-inf` unary and start scores): the same `log Z`, and zero
        derivatives for the extra labels (`kernel.Tuning.label_multiple`)."""
        extra = num_labels - self.num_labels
        if extra == 0:
            return self
        pad = lambda x, value: jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)], constant_values=value)
        transitions = jnp.pad(self.transitions, [(0, 0)] * (self.transitions.ndim - 2) + [(0, extra), (0, extra)])
        return FactoredPotentials(pad(self.unary, -jnp.inf), transitions, pad(self.start, -jnp.inf))

    def from_gradient(self, gradient):
        """Unary marginals, expected transition counts and start marginals, per chain."""
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
