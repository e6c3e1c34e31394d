"""Sparse design matrices: the observation features of a corpus as a CSR
matrix `A [rows, K]` (counts of feature k at row r), multiplied with weight
tables.

Emission scores of every token are `A @ W` for `W [K, L]`, computed by
`jax.experimental.sparse.BCSR`'s product, which on CPU is a native CSR
sparse-dense kernel (other backends lower it their own way). The equivalent sum of row gathers is
several times slower inside a training objective: XLA materialises one
gather per feature column when their sum feeds more than one consumer
(CoNLL-2002, 265k tokens x 18 features x 9 labels: about 150 ms of
gathers against 31 ms for the product). The gradient with respect to `W`,
`A^T @ cotangent`, is a scatter-add of the rows (`scatter_rows`), which is
faster than the transposed CSR product.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse

from .index import PackedCorpus


class SparseDesign(NamedTuple):
    """A CSR matrix `A [R, K]` of feature counts, plus the same features as
    padded per-row ids for the transposed product.

    indptr: `[R + 1]` int32; indices: `[nnz]` int32 column ids; values:
    `[nnz]` float32 counts; row_ids: `[R, F]` int32, the ids of each row
    (K = none; a repeated id counts once per occurrence, as in `values`).
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    row_ids: np.ndarray


def _csr(rows: np.ndarray, columns: np.ndarray, num_rows: int):
    """CSR `(indptr, indices, values)` of the (row, column) pairs, duplicates summed."""
    unique, counts = np.unique(rows.astype(np.int64) * np.int64(2 ** 31) + columns, return_counts=True)
    unique_rows, unique_columns = unique // np.int64(2 ** 31), unique % np.int64(2 ** 31)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(unique_rows, minlength=num_rows))])
    return indptr.astype(np.int32), unique_columns.astype(np.int32), counts.astype(np.float32)


def design_from_ids(ids, num_features: int) -> SparseDesign:
    """The design matrix of per-row feature ids `ids [R, F]` (-1 = none) over
    `num_features` features (ids must lie in `[-1, num_features)`)."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be an integer array [R, F], got dtype {ids.dtype} and shape {ids.shape}")
    if ids.size and (ids.min() < -1 or ids.max() >= num_features):
        raise ValueError(f"ids must lie in [-1, {num_features}) (num_features = {num_features}), "
                         f"got values in [{ids.min()}, {ids.max()}]")
    rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], ids.shape)
    keep = ids >= 0
    indptr, indices, values = _csr(rows[keep], ids[keep].astype(np.int64), ids.shape[0])
    return SparseDesign(indptr, indices, values, np.where(keep, ids, num_features).astype(np.int32))


def bucket_design(packed: PackedCorpus, num_features: int) -> SparseDesign:
    """The design of a packed corpus's unigram features with one row per
    bucket cell: bucket after bucket, each `[B_b, T_b]` in row-major order,
    padding cells empty. Bucket b's scores are then a slice and a reshape of
    `design_matmul(design, W)` (`bucket_slices`), never a gather."""
    # Position -1 (padding) reads an appended row of -1 (also when the corpus has no tokens).
    stack = np.concatenate([packed.unigram_ids, np.full((1, packed.unigram_ids.shape[1]), -1, np.int32)])
    cells = [stack[positions].reshape(positions.size, stack.shape[1]) for positions in packed.positions]
    ids = np.concatenate(cells) if cells else np.zeros((0, packed.unigram_ids.shape[1]), np.int32)
    return design_from_ids(ids, num_features)


def bucket_slices(rows: jax.Array, bucket_shapes) -> tuple:
    """Split `rows [sum_b B_b T_b, ...]` (from a `bucket_design`) into the
    buckets `[B_b, T_b, ...]`, given `bucket_shapes = ((B_b, T_b), ...)`."""
    out, start = [], 0
    for size, steps in bucket_shapes:
        out.append(rows[start: start + size * steps].reshape((size, steps) + rows.shape[1:]))
        start += size * steps
    return tuple(out)


def scatter_rows(num_features: int, ids: jax.Array, cotangent: jax.Array) -> jax.Array:
    """`grad [K, ...]` with `grad[k] = sum over (r, f) with ids[r, f] = k of
    cotangent[r]`, for `ids [R, F]` (ids outside `[0, K)` are dropped) and
    `cotangent [R, ...]`: the transpose of summing table rows.

    One scatter-add per id column into a single buffer: XLA's CPU scatter
    is several times faster with a vector of row indices than with an
    `[R, F]` index array, and faster than a CSR product with `A^T` (whose
    kernel walks all K output rows: 0.6 s at K = 2^20 against 0.08 s here).
    """
    grad = jnp.zeros((num_features,) + cotangent.shape[1:], cotangent.dtype)
    for column in range(ids.shape[1]):
        grad = grad.at[ids[:, column]].add(cotangent, mode="drop")
    return grad


def _product(design: SparseDesign, table):
    """CSR `[R, K]` times `table [K, ...]` -> `[R, ...]` on the backend's sparse kernel."""
    num_rows, flat = design.indptr.shape[0] - 1, table.reshape(table.shape[0], -1)
    if design.indices.shape[0] == 0 or flat.shape[1] == 0:
        return jnp.zeros((num_rows,) + table.shape[1:], table.dtype)
    matrix = sparse.BCSR((design.values.astype(table.dtype), design.indices, design.indptr),
                         shape=(num_rows, table.shape[0]))
    # The CPU kernel is several times faster when the table's width is a
    # multiple of 8 (CoNLL-2002, 3.2M non-zeros: 35 ms at 9 labels, 9 ms at
    # 8 and 10 ms at 16), so the table gets zero columns and the product is cut back.
    columns = flat.shape[1]
    flat = jnp.pad(flat, ((0, 0), (0, -columns % 8)))
    return (matrix @ flat)[:, :columns].reshape((num_rows,) + table.shape[1:])


@jax.custom_vjp
def design_matmul(design: SparseDesign, table: jax.Array) -> jax.Array:
    """`A @ table`: `[R, ...]` for `table [K, ...]`; differentiable in `table`
    (reverse mode, any order), not in the design."""
    return _product(design, table)


def _design_matmul_forward(design, table):
    return design_matmul(design, table), (design, table.shape[0])


def _design_matmul_backward(residuals, cotangent):
    design, num_features = residuals
    return None, scatter_rows(num_features, design.row_ids, cotangent)


design_matmul.defvjp(_design_matmul_forward, _design_matmul_backward)
