"""Sparse chains with L1-sparse label-pair weights (Lavergne, Cappe & Yvon 2010,
section 4.1): `SparsePotentials`, which every `chain` function takes (its exact
`O(K)` step and closed-form derivative live with it in `lattices.forms.sparse`),
its dense equivalent (`to_dense`, for tests and the dense baseline) and random
pair supports (`random_support`).
"""

from __future__ import annotations

import jax
import numpy as np

from .forms.sparse import SparsePotentials


def to_dense(potentials: SparsePotentials) -> jax.Array:
    """The per-position potentials of `chain` equal to a sparse form.

    `transitions[i, j] + unary[t, j] + pair_t(i, j)`, and in row 0 at `t = 0`
    the first scores `start[j] + unary[0, j] + pair_0(0, j)`. Materialises
    `T L^2` scores: for tests and for the dense baseline.

    Args:
      potentials: a `SparsePotentials`.

    Returns:
      `[..., T, L, L]`.
    """
    return potentials.checked().dense_scores()


def random_support(key, num_labels: int, density: float) -> tuple[np.ndarray, np.ndarray]:
    """A random pair support of `K = round(density * L^2)` distinct pairs,
    sorted by `pair_next`.

    Args:
      key: a `jax.random` key.
      num_labels: `L`.
      density: the fraction of the `L^2` label pairs listed, in `[0, 1]`.

    Returns:
      pair_previous: `[K]` int32 (numpy).
      pair_next: `[K]` int32 (numpy), sorted.
    """
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must lie in [0, 1], got {density}")
    K = int(round(density * num_labels * num_labels))  # noqa: RUF046  (numpy 1 rounds a numpy scalar to a float)
    flat = np.sort(np.asarray(jax.random.choice(key, num_labels * num_labels, (K,), replace=False)))
    previous, following = np.divmod(flat, num_labels)
    order = np.argsort(following, kind="stable")
    return previous[order].astype(np.int32), following[order].astype(np.int32)
