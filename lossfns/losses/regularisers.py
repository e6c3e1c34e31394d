"""Penalties on parameter pytrees: L2 (Gaussian prior),
L1 and the elastic net, with a mask to exclude leaves.

`mask`, as in `optax.masked`: a pytree of bools with the structure of
`params` (or a prefix of it, one bool per subtree), or a callable
`params -> such a pytree`; True means penalised. Bool arrays mask single
entries. Default: every leaf is penalised. Example (Gao et al.: the
baseline weight lambda_0 is not penalised):
`l1({"base": w0, "features": w}, 0.1, mask={"base": False, "features": True})`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..validation import as_mask


def _penalised_leaves(params, mask):
    """The leaves of `params` with excluded entries set to 0."""
    if mask is None:
        return jax.tree_util.tree_leaves(params)
    mask = as_mask(mask, params)
    selected = jax.tree_util.tree_map(
        lambda keep, subtree: jax.tree_util.tree_map(lambda x: jnp.where(keep, x, 0.0), subtree), mask, params
    )
    return jax.tree_util.tree_leaves(selected)


def _total(leaves, fn):
    # A Python 0.0 start keeps the leaves' dtype (a float32 model stays float32).
    return jnp.asarray(sum((jnp.sum(fn(jnp.asarray(x))) for x in leaves), 0.0))


def _abs_zero_subgradient(x):
    """`|x|` whose derivative at 0 is 0 (jnp.abs gives 1 there): the
    minimum-norm subgradient, so an unused weight is not pushed off 0."""
    return x * jax.lax.stop_gradient(jnp.sign(x))


def l2(params, weight=1.0, *, mask=None):
    """`weight / 2 * ||params||^2`, a Gaussian prior with `weight = 1 / sigma^2`.

    Args:
      params: a pytree of arrays.
      weight: the penalty's weight.
      mask: which entries are penalised (see the module docstring); default all.

    Returns:
      `[]`, the penalty.
    """
    return weight / 2 * _total(_penalised_leaves(params, mask), jnp.square)


def l1(params, weight=1.0, *, mask=None):
    """`weight * ||params||_1`.

    Its gradient is `weight * sign(params)` (0 at 0); plain gradient steps do
    not produce exact zeros, use an L1-aware optimiser (OWL-QN,
    cumulative-penalty SGD) for sparsity.

    Args:
      params: a pytree of arrays.
      weight: the penalty's weight.
      mask: which entries are penalised (see the module docstring); default all.

    Returns:
      `[]`, the penalty.
    """
    return weight * _total(_penalised_leaves(params, mask), _abs_zero_subgradient)


def elastic_net(params, l1_weight, l2_weight, *, mask=None):
    """`l1_weight * ||params||_1 + l2_weight / 2 * ||params||^2`.

    Args:
      params: a pytree of arrays.
      l1_weight: the L1 weight (Lavergne et al.'s rho_1).
      l2_weight: the L2 weight (rho_2).
      mask: which entries are penalised (see the module docstring); default all.

    Returns:
      `[]`, the penalty.
    """
    return l1(params, l1_weight, mask=mask) + l2(params, l2_weight, mask=mask)
