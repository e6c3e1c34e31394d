"""Potential forms: how a chain's scores are stored, and the questions that the
one scan (`kernel.scan`), the one decoder (`decode`) and the chain functions ask
of them (`PotentialForm`).

One module per form holds its class, its exact log-semiring step and that step's
closed-form derivative: `dense` (`[..., T, L, L]`), `factored` (unary,
transitions, start) and `sparse` (Lavergne et al. 2010, section 4.1). Nothing
asks which form it has: a new form adds a module, not branches.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from ...validation import check_finite_or_neg_inf, concrete

__all__ = ["PotentialForm", "is_form", "flatten_batch", "reversed_in_time", "check_scores_inside"]


class PotentialForm(Protocol):
    """What a potential form answers. Per chain (unbatched, inside the batch's
    `vmap`): its sizes, its masked copy, the first step's scores, each step's
    block, column and semiring step (`lift`) with the exact step's derivative
    (`log_tangent`), and the score of a labelling. Per batch (`[...]` leading
    axes, as given): validation, batching, the gradient's shape, the label
    scores, forbidden moves, the reversed chain and the dense equivalent."""

    @property
    def num_steps(self) -> int:
        """`T`."""
        ...

    @property
    def num_labels(self) -> int:
        """`L`."""
        ...

    @property
    def dtype(self) -> Any:
        """The scores' dtype."""
        ...

    @property
    def batch_shape(self) -> tuple:
        """The leading batch shape `[...]`."""
        ...

    def checked(self) -> PotentialForm:
        """The form validated (a `ValueError` or `TypeError` naming the
        argument), in one dtype, its optional fields filled."""
        ...

    def check_inside(self, lengths) -> None:
        """Refuse NaN or +inf scores inside `lengths [...]` (concrete inputs only)."""
        ...

    def masked(self, valid) -> PotentialForm:
        """One chain with the positions outside `valid [T]` scoring 0."""
        ...

    def first_scores(self) -> jax.Array:
        """`[T, L]`: the score of label `j` where a chain starts at `t`."""
        ...

    def time_inputs(self) -> Any:
        """The per-position arrays (pytree, time-leading) that `block` and `column` read."""
        ...

    def block(self, inputs_t) -> jax.Array:
        """`[L, L]`: step `t`'s edge scores, from slice `t` of `time_inputs`."""
        ...

    def column(self, inputs_t, label) -> jax.Array:
        """`[L]`: the scores of the edges into `label` at step `t`."""
        ...

    def lift(self, semiring) -> tuple[Any, Any]:
        """`(inputs, step)` of `kernel.scan` for `semiring`: the exact log
        step for `semirings.Log`, a semiring vector-matrix product otherwise."""
        ...

    def log_tangent(self, length, starts, forward, tangent) -> jax.Array:
        """`[]`: the closed-form JVP of `log Z` of one row in the direction
        `tangent` (a form of this structure), from the `kernel.Forward` of
        `lift(semirings.Log)`'s scan."""
        ...

    def padded(self, num_labels: int) -> PotentialForm:
        """The chains over `num_labels` labels, the extra ones forbidden, where
        the log scan runs faster so (`kernel.Tuning.padded_labels`); else itself."""
        ...

    def edge_scores(self) -> jax.Array:
        """`[..., T, L, L]`: every step's edge scores (row 0 at a start unread)."""
        ...

    def dense_scores(self) -> jax.Array:
        """`[..., T, L, L]`: the equal dense form's scores (start scores in row 0 at t = 0)."""
        ...

    def score_terms(self, labels, previous, starts) -> jax.Array:
        """`[T]`: each position's score of `labels [T]` after `previous [T]` (chain starts `starts [T]`)."""
        ...

    def batched(self, batch_shape: tuple) -> tuple[PotentialForm, PotentialForm]:
        """`(flat form, in_axes)`: the batch flattened to one axis, shared fields unbatched."""
        ...

    def from_gradient(self, gradient) -> Any:
        """The marginals, as `chain.marginals` returns them, from the gradient (a form)."""
        ...

    def label_marginals(self, gradient) -> jax.Array:
        """`[..., T, L]`: the node marginals, from the gradient of summed `log Z`."""
        ...

    def with_label_scores(self, extra) -> PotentialForm:
        """The form with `extra [..., T, L]` added to each position's label scores."""
        ...

    def forbidding(self, transitions, start, end, lengths) -> PotentialForm:
        """The form with `-inf` at the moves outside the bool masks `transitions
        [L, L]`, `start [L]` and `end [L]` (at `lengths - 1`)."""
        ...

    def reversed(self, lengths) -> tuple[PotentialForm, jax.Array]:
        """`(the chains read from their ends, own [..., T, L])`: `own` is the part of
        position `t`'s score that depends on its label alone (see `prefix`)."""
        ...

    def named_scores(self) -> tuple:
        """`((argument name, scores), ...)`: the float arrays given, for checks."""
        ...


def is_form(potentials) -> bool:
    """Whether `potentials` is a potential form (its class answers
    `PotentialForm`) rather than bare per-position scores.

    Args:
      potentials: anything a chain function takes.

    Returns:
      True for a form; False for `[..., T, L, L]` scores.
    """
    return callable(getattr(type(potentials), "lift", None))


def flatten_batch(x, batch_shape: tuple, core: int):
    """`x [*batch_shape, *core dims] -> [prod(batch_shape), *core dims]`.

    Args:
      x: an array with `batch_shape` (or a broadcast of it) and `core` trailing axes.
      batch_shape: the batch shape.
      core: the number of trailing axes kept.

    Returns:
      `[prod(batch_shape), *core dims]`.
    """
    return x.reshape((math.prod(batch_shape),) + x.shape[x.ndim - core :])


def reversed_in_time(x, lengths, batch_ndim: int, offset: int):
    """`out[..., s, ...] = x[..., n - 1 - s + offset, ...]` where that index
    lies in `[offset, n)` (`n` each chain's length), else 0.

    Args:
      x: `[..., T, ...]`, time at axis `batch_ndim`.
      lengths: `[...]` ints.
      batch_ndim: the number of batch axes.
      offset: 0 for what belongs to a position (its own scores); 1 for what
        belongs to the edge into it, which the reversed chain reads one
        position later (and never at its start).

    Returns:
      `[..., T, ...]`, the shape of `x`.
    """
    T = x.shape[batch_ndim]
    s = jnp.arange(T)
    n = lengths[..., None]
    index = n - 1 - s + offset
    valid = (s < n) & (index >= offset) & (index < n)
    trailing = (1,) * (x.ndim - batch_ndim - 1)
    gathered = jnp.take_along_axis(
        x, jnp.clip(index, 0, max(T - 1, 0)).reshape(index.shape + trailing), axis=batch_ndim
    )
    return jnp.where(valid.reshape(valid.shape + trailing), gathered, jnp.zeros((), x.dtype))


def check_scores_inside(name: str, scores, lengths) -> None:
    """Refuse NaN or +inf scores at positions inside the lengths (a
    `ValueError` naming `name`); padding past them is never read, so it may
    hold anything. Checked when both are concrete.

    Args:
      name: the argument's name.
      scores: `[..., T, ...]`, time after the batch axes of `lengths`.
      lengths: `[...]` ints.

    Returns:
      None.
    """
    values, lengths = concrete(scores), concrete(lengths)
    if values is None or lengths is None:
        return
    lengths = np.asarray(lengths)
    T = values.shape[lengths.ndim]
    inside = np.arange(T) < lengths[..., None]
    inside = inside.reshape(inside.shape + (1,) * (values.ndim - inside.ndim))
    check_finite_or_neg_inf(name, np.where(inside, values, 0.0))
