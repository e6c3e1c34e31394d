"""Sparse design matrices: the observation features of a corpus as a CSR
matrix `A [rows, K]` (counts of feature k at row r), multiplied with weight
tables.

Emission scores of every token are `A @ W` for `W [K, L]`, by
`jax.experimental.sparse.BCSR`'s product (on CPU a native CSR kernel), rather
than a sum of row gathers, which XLA materialises once per feature column inside
a training objective; the gradient, `A^T @ cotangent`, is a scatter-add of rows
(`scatter_rows`). Observations with real values put their values in `A`.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# At import, not where the product is traced: importing it registers the CSR kernel (an FFI
# handler) that a compiled program loaded from the cache calls without tracing this module.
from jax.experimental import sparse

from .index import PackedCorpus


class SparseDesign(NamedTuple):
    """A CSR matrix `A [R, K]` of feature counts (or summed values), plus the
    same features as padded per-row ids for the transposed product.

    indptr: `[R + 1]` int32; indices: `[nnz]` int32 column ids; values:
    `[nnz]` float32 counts, or float64 summed values; row_ids: `[R, F]`
    int32, the ids of each row (K = none; a repeated id counts once per
    occurrence, as in `values`); row_values: `[R, F]` float64, the value of
    each of `row_ids` (0 for none), or None: every value 1.
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    row_ids: np.ndarray
    row_values: np.ndarray | None = None


def _csr(ids: np.ndarray, num_features: int, weights: np.ndarray | None = None):
    """CSR `(indptr, indices, values)` of per-row ids `ids [R, F]` (-1 =
    none), repeated ids of a row summed: counts (float32), or the sums of
    `weights [R, F]` (float64). Each row is sorted on its own (F is small),
    never the whole matrix: rows come in order already."""
    order = np.argsort(np.where(ids >= 0, ids, num_features), axis=1, kind="stable")
    columns = np.take_along_axis(ids, order, axis=1)
    present = columns >= 0
    new = present.copy()
    new[:, 1:] &= columns[:, 1:] != columns[:, :-1]
    group = np.cumsum(new[present]) - 1
    if weights is None:
        sums = np.bincount(group, minlength=int(new.sum())).astype(np.float32)
    else:
        sums = np.bincount(group, np.take_along_axis(weights, order, axis=1)[present], int(new.sum()))
    indptr = np.concatenate([[0], np.cumsum(new.sum(axis=1))])
    return indptr.astype(np.int32), columns[new].astype(np.int32), sums


def design_from_ids(ids, num_features: int, values=None) -> SparseDesign:
    """The design matrix of per-row feature ids `ids [R, F]` (-1 = none) over
    `num_features` features (ids must lie in `[-1, num_features)`), with the
    features' values `values [R, F]` (finite; default all 1: counts).
    Entries of value 0 are left out; when the others are all 1 the design
    is binary (`row_values` None)."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be an integer array [R, F], got dtype {ids.dtype} and shape {ids.shape}")
    if ids.size and (ids.min() < -1 or ids.max() >= num_features):
        raise ValueError(
            f"ids must lie in [-1, {num_features}) (num_features = {num_features}), "
            f"got values in [{ids.min()}, {ids.max()}]"
        )
    keep = ids >= 0
    row_values = None
    if values is not None:
        values = np.asarray(values, dtype=np.float64)
        if values.shape != ids.shape:
            raise ValueError(f"values must have the shape of ids {ids.shape}, got {values.shape}")
        if not np.all(np.isfinite(values[keep])):
            bad = tuple(int(i) for i in np.argwhere(keep & ~np.isfinite(values))[0])
            raise ValueError(f"values must be finite, got {values[bad]} at {bad}")
        # A value of 0 (a False flag) adds nothing to the product: left out, so that features whose
        # other values are all 1 take the binary path (no per-entry products; CoNLL-2002 with the
        # sklearn-crfsuite tutorial's flags: a third fewer entries, each gradient about 30% faster).
        keep &= values != 0
        row_values = None if np.all(values[keep] == 1.0) else np.where(keep, values, 0.0)
    ids = np.where(keep, ids, -1)
    indptr, indices, sums = _csr(ids, num_features, row_values)
    return SparseDesign(indptr, indices, sums, np.where(keep, ids, num_features).astype(np.int32), row_values)


def bucket_design(packed: PackedCorpus, num_features: int) -> SparseDesign:
    """The design of a packed corpus's unigram features with one row per
    bucket cell: bucket after bucket, each `[B_b, T_b]` in row-major order,
    padding cells empty. Bucket b's scores are then a slice and a reshape of
    `design_matmul(design, W)` (`bucket_slices`), never a gather."""
    # Position -1 (padding) reads an appended row of -1 ids and 0 values (also when the corpus has no tokens).
    width = packed.unigram_ids.shape[1]
    stack = np.concatenate([packed.unigram_ids, np.full((1, width), -1, np.int32)])
    ids = [stack[positions].reshape(positions.size, width) for positions in packed.positions]
    ids = np.concatenate(ids) if ids else np.zeros((0, width), np.int32)
    values = None
    if packed.unigram_values is not None:
        stack = np.concatenate([packed.unigram_values, np.zeros((1, width), packed.unigram_values.dtype)])
        values = [stack[positions].reshape(positions.size, width) for positions in packed.positions]
        values = np.concatenate(values) if values else np.zeros((0, width))
    return design_from_ids(ids, num_features, values)


def bucket_slices(rows: jax.Array, bucket_shapes) -> tuple:
    """Split `rows [sum_b B_b T_b, ...]` (from a `bucket_design`) into the
    buckets `[B_b, T_b, ...]`, given `bucket_shapes = ((B_b, T_b), ...)`."""
    out, start = [], 0
    for size, steps in bucket_shapes:
        out.append(rows[start : start + size * steps].reshape((size, steps) + rows.shape[1:]))
        start += size * steps
    return tuple(out)


def scatter_rows(num_features: int, ids: jax.Array, cotangent: jax.Array, values=None) -> jax.Array:
    """`grad [K, ...]` with `grad[k] = sum over (r, f) with ids[r, f] = k of
    values[r, f] * cotangent[r]`, for `ids [R, F]` (ids outside `[0, K)` are
    dropped), `cotangent [R, ...]` and `values [R, F]` (None: all 1): the
    transpose of summing (value-scaled) table rows.

    One scatter-add per id column into a single buffer: XLA's CPU scatter
    is several times faster with a vector of row indices than with an
    `[R, F]` index array, and faster than a CSR product with `A^T` (whose
    kernel walks all K output rows: 0.6 s at K = 2^20 against 0.08 s here).
    """
    grad = jnp.zeros((num_features,) + cotangent.shape[1:], cotangent.dtype)
    for column in range(ids.shape[1]):
        rows = cotangent
        if values is not None:
            rows = cotangent * values[:, column].astype(cotangent.dtype).reshape((-1,) + (1,) * (cotangent.ndim - 1))
        grad = grad.at[ids[:, column]].add(rows, mode="drop")
    return grad


def _product(design: SparseDesign, table):
    """CSR `[R, K]` times `table [K, ...]` -> `[R, ...]` on the backend's sparse kernel."""
    # The width spelled out: `reshape(K, -1)` cannot infer it when K = 0 (no features at all).
    num_rows, flat = design.indptr.shape[0] - 1, table.reshape(table.shape[0], math.prod(table.shape[1:]))
    if design.indices.shape[0] == 0 or flat.shape[1] == 0:
        return jnp.zeros((num_rows,) + table.shape[1:], table.dtype)
    buffers = (design.values.astype(table.dtype), design.indices, design.indptr)  # numpy, moved by BCSR
    matrix = sparse.BCSR(buffers, shape=(num_rows, table.shape[0]))  # pyright: ignore[reportArgumentType]  # stubs: jax.Array
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
    return None, scatter_rows(num_features, design.row_ids, cotangent, design.row_values)


design_matmul.defvjp(_design_matmul_forward, _design_matmul_backward)
