"""The parallel algorithm over a chain: its forward sum as a balanced tree of
matrix products, `O(T L^3)` work and `O(log T)` depth.

The sequential scan (`kernel.scan`) does `O(T L^2)` work in `T` dependent steps;
this does more work in `ceil(log2 T)` levels of independent batched products,
which is what an accelerator runs fastest for long chains with few labels
(`kernel.Tuning.prefers_parallel`; never the default on CPU). Every semiring
works: its own `matmul`, or a faster exact one (`kernel.log_matmul` for `log Z`).
Padded steps are identity matrices, so the product over all `T` steps equals the
product up to the length; each level's products are renormalised.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import kernel


def _flat_normalize(semiring, value, ndim):
    """`semiring.normalize` over the last `ndim` logical axes at once."""
    core = jax.tree_util.tree_leaves(value)[0]
    core_shape = core.shape[core.ndim - ndim :]
    flat = jax.tree_util.tree_map(lambda x: x.reshape(x.shape[: x.ndim - ndim] + (-1,)), value)
    flat, scale = semiring.normalize(flat, -1)
    return jax.tree_util.tree_map(lambda x: x.reshape(x.shape[:-1] + core_shape), flat), scale


def _time_major(value, time_axis):
    """Move the logical time axis of every leaf of a semiring value to the front."""
    return jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, time_axis, 0), value)


def forward(semiring, potentials, length, matmul=None):
    """The semiring's output for one chain (as `kernel.scan` without starts);
    `matmul(left, right)`: the product of semiring matrices `[..., L, L]`
    (default `semiring.matmul`). `T >= 1`."""
    matmul = semiring.matmul if matmul is None else matmul
    T = potentials.num_steps
    valid = jnp.arange(T) < length
    potentials = potentials.masked(valid)
    alpha, first_scale = semiring.convert_scaled(potentials.first_scores()[0], (-1,))
    alpha, first_norm = semiring.normalize(alpha, -1)
    scores = potentials.edge_scores()[1:]
    L = scores.shape[-1]
    matrices, scales = semiring.convert_scaled(scores, (-2, -1))
    identity = semiring.select(
        jnp.eye(L, dtype=bool), semiring.one((L, L), scores.dtype), semiring.zero((L, L), scores.dtype)
    )
    step_valid = valid[1:]
    matrices = semiring.select(step_valid[:, None, None], matrices, semiring.expand_dims(identity, -3))
    scales = jnp.where(step_valid, scales, 0.0)
    matrices = _time_major(matrices, -3)
    identity_block = lambda n: jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), identity)
    while scales.shape[0] > 1:
        if scales.shape[0] % 2:
            matrices = jax.tree_util.tree_map(lambda m, e: jnp.concatenate([m, e]), matrices, identity_block(1))
            scales = jnp.concatenate([scales, jnp.zeros((1,), scales.dtype)])
        left = jax.tree_util.tree_map(lambda m: jnp.moveaxis(m[0::2], 0, -3), matrices)
        right = jax.tree_util.tree_map(lambda m: jnp.moveaxis(m[1::2], 0, -3), matrices)
        product, norm = _flat_normalize(semiring, matmul(left, right), 2)
        matrices = _time_major(product, -3)
        scales = scales[0::2] + scales[1::2] + norm
    if scales.shape[0] == 1:
        total = jax.tree_util.tree_map(lambda m: m[0], matrices)
        alpha = semiring.vecmat(alpha, total)
        log_scale = first_scale + first_norm + scales[0]
    else:
        log_scale = first_scale + first_norm
    return kernel.finish(semiring, alpha, log_scale, length)
