"""Shape checks shared by the chain losses: the losses gather gold labels
and mask positions themselves, so they need the batch shape, `T` and `L`
(`chain.prepare_inputs`) before calling the chain functions."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..lattices import chain
from ..validation import as_labels, labels_in_range, nan_unless


def chain_inputs(potentials, labels, lengths):
    """Validate; return `(labels [..., T], lengths [...], inside [..., T] bool, L)`.

    `inside[..., t]` is `t < length`; gold labels outside may be anything
    (e.g. -1 padding) and are never read there.
    """
    _, lengths, batch_shape, T, L = chain.prepare_inputs(potentials, lengths)
    labels = as_labels(labels, batch_shape + (T,), L, lengths)
    inside = jnp.arange(T) < lengths[..., None]
    return labels, lengths, inside, L


def gold_label_scores(per_label: jax.Array, labels: jax.Array, inside: jax.Array) -> jax.Array:
    """`per_label[..., t, labels[..., t]]`, `[..., T]` (label 0 read outside
    the length); NaN, in value and derivative, where a label inside is
    outside `[0, L)` or reads a NaN (traced labels are not checked)."""
    in_range = labels_in_range(labels, per_label.shape[-1], inside)
    safe = jnp.where(inside & in_range, labels, 0)
    gold = jnp.take_along_axis(per_label, safe[..., None], axis=-1)[..., 0]
    return nan_unless(in_range & ~jnp.isnan(gold), gold)


def add_to_label_scores(potentials, extra: jax.Array):
    """Add `extra [..., T, L]` to the score of choosing label `j` at `t`,
    for any form of potentials (keeping the potentials' dtype); a form
    (`DensePotentials` for per-position scores)."""
    return chain.as_form(potentials).with_label_scores(extra)


def excess_over_gold(reference: jax.Array, gold: jax.Array) -> jax.Array:
    """`reference - gold`, `[...]`, where `reference >= gold` (log Z or a best score).

    A gold sequence of score -inf gives +inf. When no sequence is allowed at
    all both are -inf: the reference is replaced by 0 (with a zero gradient),
    so the answer is +inf there too rather than NaN. Otherwise the gradient
    is the plain difference of gradients, finite even when the value is +inf.
    A NaN reference (NaN scores) stays NaN. Rounding can leave the reference
    a hair below the gold score where the gold sequence holds all the mass
    (float32, separable data: -1e-4 seen); the value is raised to the exact
    0 there, the gradient kept (the exact one, about 0).
    """
    excess = jnp.where(jnp.isneginf(reference), 0.0, reference) - gold
    return excess + jax.lax.stop_gradient(jnp.where(excess < 0, -excess, 0.0))
