"""Block coordinate descent for L1 CRFs (Sokolovska et al. 2010; Lavergne,
Cappe & Yvon 2010; MATH.md section 6).

Model (self-contained, so it needs only the per-token observation tests):
each token `t` of a sequence has a set of active observation tests
`active [T, A]` (ids in `[0, X)`, padded with -1); test `x` carries unigram
weights `emission[x, y]` (`f_{y,x}`) and bigram weights `pairs[x, y', y]`
(`f_{y',y,x}`), so `psi_t(y', y) = sum_{x active at t} pairs[x, y', y] +
emission[x, y]`. A test active on every token plays the role of plain
transition weights.

One block per observation test `x`: its `L + L^2` weights. A block update
builds the quadratic model of the loss with the exact diagonal second
derivative `h_k` (Hessian-vector products) and solves it with the L1 and L2
terms in closed form, `theta_k = soft(h_k theta_k - g_k, l1) / (h_k + l2)`
with `soft(z, r) = sign(z) max(|z| - r, 0)`; a backtracking search on the
block's exact objective keeps every update a decrease (the diagonal model
ignores the coupling inside the block). Only the sequences where `x` occurs
enter the update: their indices are precomputed as padded lists
(`occurrences [X, M]`), so a block costs forward-backward on at most `M`
sequences. One loop step is one sweep over all blocks.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import jax
import jax.numpy as jnp

from ..lattices import chain
from ..validation import concrete, integer_values
from .minimize import check_int, init_loop, relative_change_below, run_loop
from .owlqn import check_penalties


class BcdData(NamedTuple):
    """active: `[N, T, A]` int32 observation tests per token (-1: none);
    labels: `[N, T]`; lengths: `[N]`; occurrences: `[X, M]` int32 indices of
    the sequences where each test occurs (-1: padding)."""

    active: jax.Array
    labels: jax.Array
    lengths: jax.Array
    occurrences: jax.Array


def bcd_data(active, labels, lengths, num_observations: int) -> BcdData:
    """Validate the arrays and precompute each test's padded occurrence list (needs concrete `active`)."""
    check_int("num_observations", num_observations)
    active_value = concrete(active)
    if active_value is None:
        raise ValueError("active must be concrete (not traced): the occurrence lists are built in numpy")
    if active_value.ndim != 3 or not np.issubdtype(active_value.dtype, np.integer):
        raise ValueError(f"active must be an int array of shape [N, T, A], got {active_value.dtype} {active_value.shape}")
    if active_value.size and (active_value.min() < -1 or active_value.max() >= num_observations):
        raise ValueError(f"active must hold ids in [0, {num_observations}) or -1 for padding")
    # Checked in their own dtype before the int32 cast (no truncated 2.7, no wrapped 2**32 + 2).
    label_value = integer_values("labels", labels, f"an integer array of shape [N, T] = {active_value.shape[:2]}")
    length_value = integer_values("lengths", lengths, f"an integer array of shape [N] = {active_value.shape[:1]}")
    if label_value is None or length_value is None:
        raise ValueError("labels and lengths must be concrete (not traced): the occurrence lists are built in numpy")
    if label_value.shape != active_value.shape[:2] or length_value.shape != active_value.shape[:1]:
        raise ValueError(f"labels must have shape [N, T] = {active_value.shape[:2]} and lengths [N] = "
                         f"{active_value.shape[:1]}, got {label_value.shape} and {length_value.shape}")
    outside = (length_value < 0) | (length_value > active_value.shape[1])
    if outside.any():
        raise ValueError(f"lengths must lie in [0, {active_value.shape[1]}] (the number of positions T of active), "
                         f"got {int(length_value[outside][0])} at index {int(np.argmax(outside))}")
    wide = (label_value < np.iinfo(np.int32).min) | (label_value > np.iinfo(np.int32).max)
    if wide.any():
        where = tuple(int(i) for i in np.argwhere(wide)[0])
        raise ValueError(f"labels must fit in int32, got {label_value[where].item()} at index {where}")
    labels, lengths = jnp.asarray(label_value, jnp.int32), jnp.asarray(length_value, jnp.int32)
    inside = np.arange(active_value.shape[1])[None, :, None] < np.asarray(lengths)[:, None, None]
    present = np.zeros((num_observations, active_value.shape[0]), bool)
    sequence, _, _ = np.nonzero(inside & (active_value >= 0))
    present[active_value[inside & (active_value >= 0)], sequence] = True
    width = max(1, int(present.sum(axis=1).max(initial=0)))
    occurrences = np.full((num_observations, width), -1, np.int32)
    for x in range(num_observations):
        where = np.nonzero(present[x])[0]
        occurrences[x, :len(where)] = where
    return BcdData(jnp.asarray(active_value, jnp.int32), labels, lengths, jnp.asarray(occurrences))


def bcd_init(num_observations: int, num_labels: int, dtype=jnp.float64):
    """Zero parameters `{"emission": [X, L], "pairs": [X, L, L]}`."""
    check_int("num_observations", num_observations)
    check_int("num_labels", num_labels)
    return {"emission": jnp.zeros((num_observations, num_labels), dtype),
            "pairs": jnp.zeros((num_observations, num_labels, num_labels), dtype)}


def sparse_potentials(params, active) -> jax.Array:
    """Edge potentials `[..., T, L, L]` from the active tests `[..., T, A]`."""
    valid = (active >= 0)[..., None]
    ids = jnp.where(active >= 0, active, 0)
    emission = jnp.sum(jnp.where(valid, params["emission"][ids], 0.0), axis=-2)
    pairs = jnp.sum(jnp.where(valid[..., None], params["pairs"][ids], 0.0), axis=-3)
    return pairs + emission[..., None, :]


def _sequence_losses(params, active, labels, lengths):
    potentials = sparse_potentials(params, active)
    return chain.log_partition(potentials, lengths) - chain.score(potentials, labels, lengths)


def bcd_loss(params, data: BcdData) -> jax.Array:
    """Summed CRF negative log-likelihood of the model, `[]`."""
    return jnp.sum(_sequence_losses(params, data.active, data.labels, data.lengths))


def _with_block(params, x, block):
    num_labels = params["emission"].shape[-1]
    return {"emission": params["emission"].at[x].set(block[:num_labels]),
            "pairs": params["pairs"].at[x].set(block[num_labels:].reshape(num_labels, num_labels))}


def _block(params, x):
    return jnp.concatenate([params["emission"][x], params["pairs"][x].ravel()])


def block_update(params, data: BcdData, x, l1, l2, max_backtracking: int = 20):
    """Parameters after the update of block `x` (see the module docstring)."""
    rows = data.occurrences[x]
    used = rows >= 0
    rows = jnp.where(used, rows, 0)
    active, labels, lengths = data.active[rows], data.labels[rows], data.lengths[rows]

    def block_loss(block):
        losses = _sequence_losses(_with_block(params, x, block), active, labels, lengths)
        return jnp.sum(jnp.where(used, losses, 0.0))

    def block_objective(block, loss):
        return loss + l1 * jnp.sum(jnp.abs(block)) + 0.5 * l2 * jnp.sum(block ** 2)

    current = _block(params, x)
    loss, gradient = jax.value_and_grad(block_loss)(current)
    basis = jnp.eye(current.shape[0], dtype=current.dtype)
    curvature = jax.vmap(lambda e: jax.jvp(jax.grad(block_loss), (current,), (e,))[1] @ e)(basis)
    curvature = jnp.maximum(curvature, jnp.finfo(current.dtype).eps)
    z = curvature * current - gradient
    proposal = jnp.sign(z) * jnp.maximum(jnp.abs(z) - l1, 0.0) / (curvature + l2)
    start = block_objective(current, loss)

    def cond(carry):
        count, _, accepted = carry
        return (count < max_backtracking) & ~accepted

    def body(carry):
        count, step, _ = carry
        trial = current + step * (proposal - current)
        accepted = block_objective(trial, block_loss(trial)) <= start
        return count + 1, jnp.where(accepted, step, 0.5 * step), accepted

    _, step, accepted = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), jnp.ones((), current.dtype),
                                                        jnp.zeros((), bool)))
    new_block = jnp.where(accepted, current + step * (proposal - current), current)
    # A step of 1 lands exactly on the soft-thresholded zeros; keep them exact.
    new_block = jnp.where(accepted & (step == 1.0), proposal, new_block)
    return _with_block(params, x, new_block)


def _check_bcd_data(data) -> None:
    if not isinstance(data, BcdData):
        raise TypeError(f"data must be a BcdData (from bcd_data(active, labels, lengths, num_observations)), "
                        f"got {type(data).__name__}")


def bcd_sweep_fn(data: BcdData, l1, l2=0.0):
    """The `step_fn` of one sweep over all blocks; objective: the full penalised loss."""
    _check_bcd_data(data)
    check_penalties(l1, l2)
    num_observations = data.occurrences.shape[0]

    def step_fn(params, step):
        params = jax.lax.fori_loop(0, num_observations, lambda x, p: block_update(p, data, x, l1, l2), params)
        flat = jnp.concatenate([params["emission"].ravel(), params["pairs"].ravel()])
        return params, bcd_loss(params, data) + l1 * jnp.sum(jnp.abs(flat)) + 0.5 * l2 * jnp.sum(flat ** 2)

    return step_fn


def bcd(data: BcdData, params, l1, l2=0.0, *, num_sweeps: int, tol: float = 1e-10):
    """Run up to `num_sweeps` sweeps from `params`; returns the final `LoopState`
    (`.inner` the parameters, `.trace` the objective per sweep). Jit-able."""
    _check_bcd_data(data)
    check_int("num_sweeps", num_sweeps)
    loop = init_loop(params, num_sweeps, params["emission"].dtype)
    return run_loop(bcd_sweep_fn(data, l1, l2), loop, num_sweeps, relative_change_below(tol))
