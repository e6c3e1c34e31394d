"""Lazy SGD-L1 on a linear-chain CRF: the step over a `LinearChainModel`,
its minibatch layout, and the choice of a learning rate.

`lazy_epoch_step_fn` runs `optimizers.lazy_sgd_l1` (Tsuruoka et al.'s cumulative
L1 penalty, applied to the rows a step touches) over a `models.LinearChainModel`
and a stacked `features.FeatureBatch`, the batches of `minimize.epoch_step_fn`:
`chain_batch_rows` finds the rows a minibatch reads, `max_rows_per_batch` bounds
them. A model with masks keeps its dense tables; a weight outside its mask stays
exactly 0, is never penalised and adds nothing to `q`. `calibrate_learning_rate`
picks a constant rate for `sgd_l1` or `lazy_sgd_l1` on a sample of the data.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..features.index import FeatureBatch
from ..models.linear_chain import LinearChainModel
from ..optimizers.minimize import epoch_step_fn, num_examples
from ..optimizers.owlqn import check_penalties, elastic_net_penalty
from ..optimizers.sgd_l1 import LazySgdL1, lazy_sgd_l1, sgd_l1, take_rows
from ..validation import check_float_params, check_int, concrete


def max_rows_per_batch(data: FeatureBatch, batch_size: int) -> tuple[int, int]:
    """Bounds `(unigram rows, pair rows)` on the distinct observation ids of
    any `batch_size` sentences of `data` (concrete `FeatureBatch [N, T, F]`):
    the sum of the `batch_size` largest per-sentence counts. They size the
    gathers of `lazy_epoch_step_fn` (static shapes)."""
    check_int("batch_size", batch_size)

    def bound(ids):
        ids = concrete(ids)
        if ids is None:
            raise ValueError("max_rows_per_batch needs concrete data (call it outside jit)")
        ids = np.asarray(ids).reshape(ids.shape[0], -1)
        counts = np.array([np.unique(row[row >= 0]).size for row in ids], np.int64)
        return int(np.sort(counts)[::-1][:batch_size].sum())

    return bound(data.unigram_ids), bound(data.pair_ids)


def _local_rows(ids, num_rows: int, size: int):
    """The distinct ids `[num_rows + 1]` of `ids` (ascending, padded with
    `size`, out of range) and `ids` renumbered into them (-1 stays -1)."""
    if size == 0:  # no such features: no rows (a local table of 0 rows, as the model's)
        return jnp.zeros((0,), jnp.int32), ids
    flat = jnp.where(ids < 0, size, ids).reshape(-1)
    rows = jnp.unique(flat, size=num_rows + 1, fill_value=size)
    local = jnp.searchsorted(rows, ids).astype(ids.dtype)
    return rows.astype(jnp.int32), jnp.where(ids < 0, -1, local)


def chain_batch_rows(model: LinearChainModel, batch: FeatureBatch, max_rows: tuple[int, int]):
    """The rows of `model` that `batch` reads: `(rows, local_batch)`.

    rows: shaped like `model`, the `[max_rows[0] + 1]` emission and
    `[max_rows[1] + 1]` pair rows the batch uses (ascending, padded with
    out-of-range indices) and `arange(L)` for the transitions and start
    weights, which every sentence uses; the masks' (and `pair_slots`') rows
    are their tables' (absent masks stay absent); local_batch: the batch with its ids
    renumbered into those rows. The loss of `take_rows(model, rows)` (masks
    included) on `local_batch` is the loss of `model` on `batch`, and its
    gradient is the gradient's rows `rows`.
    """
    K, K2, L = model.emission.shape[0], model.pair_emission.shape[0], model.num_labels
    unigram_rows, unigram_ids = _local_rows(batch.unigram_ids, min(max_rows[0], K), K)
    pair_rows, pair_ids = _local_rows(batch.pair_ids, min(max_rows[1], K2), K2)
    every = jnp.arange(L, dtype=jnp.int32)
    rows = dataclasses.replace(
        model,
        emission=unigram_rows,
        transitions=every,
        start=every,
        pair_emission=pair_rows,
        emission_mask=None if model.emission_mask is None else unigram_rows,
        pair_mask=None if model.pair_mask is None else pair_rows,
        transition_mask=None if model.transition_mask is None else every,
        pair_slots=None if model.pair_slots is None else pair_rows,
        start_mask=None if model.start_mask is None else every,
    )
    return rows, batch._replace(unigram_ids=unigram_ids, pair_ids=pair_ids)


def _split_rows(rows: LinearChainModel) -> tuple:
    """`chain_batch_rows`' rows as `(rows of the weights, rows of the
    masks)`, shaped like `eqx.partition(model, eqx.is_inexact_array)`."""
    masks = dict(emission_mask=None, pair_mask=None, transition_mask=None, pair_slots=None, start_mask=None)
    weights = dict(emission=None, transitions=None, start=None, pair_emission=None)
    return dataclasses.replace(rows, **masks), dataclasses.replace(rows, **weights)


def _weight_masks(model: LinearChainModel):
    """`model.weight_masks()` shaped like the model's weights
    (`eqx.filter(model, eqx.is_inexact_array)`), for `lazy_sgd_l1`."""
    masks = model.weight_masks()
    return dataclasses.replace(
        eqx.filter(model, eqx.is_inexact_array),
        emission=masks.emission,
        transitions=masks.transitions,
        start=masks.start,
        pair_emission=masks.pair_emission,
    )


def lazy_epoch_step_fn(
    fun: Callable,
    optimizer: LazySgdL1,
    data: FeatureBatch,
    *,
    batch_size: int,
    max_rows: tuple[int, int],
    segments_per_epoch: int = 1,
    penalty: Callable | None = None,
    objective: Callable | None = None,
    length_tiers: Sequence[int] | None = (),
) -> Callable:
    """The `run_loop` step function of lazy SGD-L1 on a `LinearChainModel`.

    fun: `(model, batch) -> loss summed over the batch`; data: the training
    set as one `FeatureBatch [N, T, ...]`; max_rows: `max_rows_per_batch(data,
    batch_size)`. inner: `(model, opt_state, key)`, `opt_state =
    optimizer.init(model)`; a model with masks (`emission_mask`, `pair_mask`,
    `transition_mask`) trains only the weights they keep (the others stay
    0, `LinearChainModel.weight_masks`), and `penalty` reads only its
    floating-point weights. The minibatches are those
    of `minimize.epoch_step_fn` (`permutation(fold_in(key, epoch))`, the last
    `N mod batch_size` examples skipped, gradients scaled by `N /
    batch_size`). One loop step runs `1 / segments_per_epoch` of an epoch
    (so a checkpoint can fall inside an epoch), then flushes the penalties
    (which changes nothing of the trajectory, see the module docstring) and
    records `objective(model) + penalty(model)`; objective: `model -> []`,
    default `fun(model, data)` (the corpus loss on the padded `data`; the
    same loss on a packed corpus, `models.corpus_loss`, takes a fraction of
    its memory and time).

    length_tiers: the widths a minibatch's gradient is compiled for: each
    minibatch runs on its first `w` positions, `w` the smallest tier (or
    `T`) that holds its longest sentence, so a per-sentence step on a
    23-token sentence does not pay for a corpus padded to 78 (1.17x
    faster per epoch on conll2000 POS). Default `()`: always `T`; None: `16,
    32, 64, ...` below `T`. Exact: positions past every length are padding,
    which `fun` must ignore (as the library's losses do), so only the
    rounding of the scan's sums can differ.
    """
    total = num_examples(data)
    check_int("batch_size", batch_size)
    if not 1 <= batch_size <= total:
        raise ValueError(f"batch_size must lie in [1, {total}] (the number of examples), got {batch_size}")
    check_int("segments_per_epoch", segments_per_epoch)
    steps_per_epoch = total // batch_size
    widths = _tier_widths(data.unigram_ids.shape[1], length_tiers)
    if segments_per_epoch > steps_per_epoch:
        raise ValueError(
            f"segments_per_epoch must lie in [1, {steps_per_epoch}] (the minibatches of an epoch), "
            f"got {segments_per_epoch}"
        )

    def step_fn(inner, step):
        model, opt_state, key = inner
        _check_chain_model(model)
        # The optimizer sees the float weights; the bool masks ride along as data.
        weights, fixed = eqx.partition(model, eqx.is_inexact_array)
        masks = _weight_masks(model)
        epoch, segment = step // segments_per_epoch, step % segments_per_epoch
        order = jax.random.permutation(jax.random.fold_in(key, epoch), total)

        def local_gradient(width, local, local_fixed, local_batch):
            local_batch = _first_positions(local_batch, width)
            return jax.grad(lambda local: fun(eqx.combine(local, local_fixed), local_batch))(local)

        def minibatch(index, carry):
            weights, opt_state = carry
            examples = jax.lax.dynamic_slice_in_dim(order, index * batch_size, batch_size)
            batch = jax.tree_util.tree_map(lambda x: x[examples], data)
            rows, local_batch = chain_batch_rows(model, batch, max_rows)
            weight_rows, mask_rows = _split_rows(rows)
            # The gradient is taken where dense clipping would have left the rows.
            weights, opt_state = optimizer.catch_up(opt_state, weights, weight_rows, masks)
            operands = (take_rows(weights, weight_rows), take_rows(fixed, mask_rows), local_batch)
            # Only the gathered rows enter the branches: a conditional over the
            # whole tables would copy them at every step.
            branches = [functools.partial(local_gradient, width) for width in widths]
            if len(branches) == 1:
                grads = branches[0](*operands)
            else:
                tier = jnp.sum(jnp.max(batch.lengths) > jnp.asarray(widths[:-1]))
                grads = jax.lax.switch(tier, branches, *operands)
            grads = jax.tree_util.tree_map(lambda g: g * (total / batch_size), grads)
            return optimizer.update(grads, opt_state, weights, weight_rows, masks)

        begin = segment * steps_per_epoch // segments_per_epoch
        end = (segment + 1) * steps_per_epoch // segments_per_epoch
        weights, opt_state = jax.lax.fori_loop(begin, end, minibatch, (weights, opt_state))
        weights, opt_state = optimizer.flush(opt_state, weights, masks)
        model = eqx.combine(weights, fixed)
        value = fun(model, data) if objective is None else objective(model)
        if penalty is not None:
            value = value + penalty(weights)
        return (model, opt_state, key), value

    return step_fn


def _tier_widths(num_positions: int, length_tiers: Sequence[int] | None) -> tuple[int, ...]:
    """The ascending widths `lazy_epoch_step_fn` compiles a step for, the
    last `num_positions` (T)."""
    if length_tiers is None:
        length_tiers = [2**k for k in range(4, max(num_positions.bit_length(), 4))]
    tiers = sorted({check_int("length_tiers", width) for width in length_tiers})
    return tuple(width for width in tiers if width < num_positions) + (num_positions,)


def _first_positions(batch: FeatureBatch, width: int) -> FeatureBatch:
    """`batch [B, T, ...]` cut to its first `width` positions (its lengths kept)."""
    cut = lambda x: None if x is None else x[:, :width]
    return batch._replace(
        unigram_ids=cut(batch.unigram_ids),
        pair_ids=cut(batch.pair_ids),
        labels=cut(batch.labels),
        unigram_values=cut(batch.unigram_values),
    )


def _check_chain_model(model) -> None:
    if not isinstance(model, LinearChainModel):
        raise TypeError(f"lazy SGD-L1 trains a models.LinearChainModel, got {type(model).__name__}")


def calibrate_learning_rate(
    fun: Callable,
    params,
    data,
    l1: float,
    *,
    key,
    l2: float = 0.0,
    mask=None,
    batch_size: int = 1,
    sample_size: int = 500,
    candidates: Sequence[float] = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001, 3e-4, 1e-4),
    max_rows: tuple[int, int] | None = None,
) -> jax.Array:
    """A constant learning rate for `sgd_l1` (or `lazy_sgd_l1`), chosen on a sample of the data.

    Runs one epoch of SGD-L1 from `params` on `sample_size` random
    examples for each candidate (per-example rates, divided by the number
    of examples because `fun` sums over the corpus) and returns the one with
    the lowest sample objective (non-finite objectives, i.e. divergence,
    lose).

    fun: `(params, batch) -> summed loss over the batch`; data: pytree with a
    leading example axis `N`. Returns `[]`, the chosen rate.
    max_rows: None: dense `sgd_l1`, all candidates in one `vmap`. Given
      (`max_rows_per_batch(data, batch_size)`, data a `FeatureBatch`, params a
      `LinearChainModel`, masked or not): `lazy_epoch_step_fn` (with `l2 = 0` its epoch is
      the dense one, so is the choice), one candidate after another, so that
      memory holds one model and its state (a model of millions of weights
      over hundreds of labels would not fit nine times).
    """
    check_penalties(l1, l2)
    weights = params if max_rows is None else eqx.filter(params, eqx.is_inexact_array)  # a model's masks are data
    check_float_params(weights)
    check_int("batch_size", batch_size)
    check_int("sample_size", sample_size)
    _check_candidates(candidates)
    total = num_examples(data)
    size = min(sample_size, total)
    sample_key, epoch_key = jax.random.split(key)
    sample = jax.tree_util.tree_map(lambda x: x[jax.random.permutation(sample_key, total)[:size]], data)
    penalty = elastic_net_penalty(l1 * size / total, l2 * size / total, mask)
    rates = jnp.asarray(candidates, ravel_pytree(weights)[0].dtype) / total

    def sample_objective(rate):
        if max_rows is None:
            optimizer = sgd_l1(rate, l1 * size / total, l2 * size / total, mask=mask)
            step = epoch_step_fn(fun, optimizer, sample, batch_size=batch_size, penalty=penalty)
        else:
            optimizer = lazy_sgd_l1(rate, l1 * size / total, l2 * size / total)
            step = lazy_epoch_step_fn(fun, optimizer, sample, batch_size=batch_size, max_rows=max_rows, penalty=penalty)
        _, value = step((params, optimizer.init(params), epoch_key), jnp.zeros((), jnp.int32))
        return value

    if max_rows is not None and mask is not None:
        raise ValueError("mask: lazy calibration (max_rows given) penalises every weight; pass mask=None")
    values = jax.vmap(sample_objective)(rates) if max_rows is None else jax.lax.map(sample_objective, rates)
    values = jnp.where(jnp.isfinite(values), values, jnp.inf)
    return rates[jnp.argmin(values)]


def _check_candidates(candidates) -> None:
    """The candidate learning rates: a non-empty 1-D list of numbers > 0 (when concrete)."""
    values = concrete(candidates)
    if values is None:
        return
    if values.dtype.kind not in "iuf":
        raise TypeError(f"candidates must be a sequence of learning rates > 0, got {candidates!r}")
    if values.ndim != 1 or values.size == 0:
        raise ValueError(
            f"candidates must be a non-empty sequence of learning rates > 0 (at least one), got {candidates!r}"
        )
    if not (values > 0).all():
        raise ValueError(f"candidates must all be learning rates > 0, got {float(values[~(values > 0)][0])!r}")
