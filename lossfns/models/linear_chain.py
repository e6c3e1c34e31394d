"""A linear-chain CRF over sparse observation features.

`LinearChainModel` maps featurised sentences (`features.FeatureBatch`) to chain
potentials, so that every loss in `lossfns.losses` applies: `psi_t(i, j) =
transitions[i, j] + sum_k value_{t,k} emission[k, j] + sum_k pair_emission[k, i, j]`
over the features `k` active at `t`. It picks the potential form from its weights
(factored, sparse or per-position: the same losses and gradients), and owns its
parameterisation: `weights()` are the optimisation variables (only the weights that
`emission_mask` and `pair_mask` let exist), `structure()` the masks, passed as data.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..features.design import SparseDesign, bucket_slices, design_matmul, scatter_rows
from ..features.index import FeatureBatch, observed_label_pairs, observed_label_triples
from ..lattices.chain import FactoredPotentials
from ..lattices.sparse_chain import SparsePotentials
from ..validation import as_integer_array, check_allocation, concrete, on_device


@jax.custom_vjp
def _gather_sum(table: jax.Array, ids: jax.Array, values) -> jax.Array:
    """`sum_f values[:, f] * table[ids[:, f]]`, `[N, ...]`, for `ids [N, F]`
    in `[0, K]` and `values [N, F]` (None: all 1); id K (padding) reads
    zeros."""
    total = jnp.zeros((ids.shape[0],) + table.shape[1:], table.dtype)
    # One gather per feature column: XLA's CPU gather and scatter are several
    # times faster with a vector of row indices than with one [N, F] index
    # array (0.2 s vs 0.5 s for a gradient over CoNLL-2002's 265k tokens x 18
    # features). Index K (padding) is out of bounds: `fill` reads 0 there,
    # without copying the table to append a zero row.
    for column in range(ids.shape[1]):
        rows = table.at[ids[:, column]].get(mode="fill", fill_value=0)
        if values is not None:
            rows = rows * values[:, column].astype(table.dtype).reshape((-1,) + (1,) * (table.ndim - 1))
        total = total + rows
    return total


def _gather_sum_forward(table, ids, values):
    return _gather_sum(table, ids, values), (table, ids, values)


def _gather_sum_backward(residuals, cotangent):
    table, ids, values = residuals
    return scatter_rows(table.shape[0], ids, cotangent.astype(table.dtype), values), None, None


_gather_sum.defvjp(_gather_sum_forward, _gather_sum_backward)


def _sum_rows(table: jax.Array, ids: jax.Array, values=None) -> jax.Array:
    """`sum_f values[..., f] * table[ids[..., f]]` over the last axis of
    `ids`, skipping ids < 0.

    table: `[K, ...]`; ids: `[..., F]` int; values: `[..., F]` or None (all
    1); returns `[..., *table.shape[1:]]`. Its gradient with respect to the
    table is a scatter-add into the rows that occur, never a dense one-hot
    product (a custom VJP: reverse mode to any order works, forward mode
    through the weight tables does not; the values are data, not
    differentiated).
    """
    size = table.shape[0]
    flat = jnp.where(ids < 0, size, ids).reshape(-1, ids.shape[-1]).astype(jnp.int32)
    if values is not None:
        values = jnp.reshape(values, (-1, ids.shape[-1]))
    return _gather_sum(table, flat, values).reshape(ids.shape[:-1] + table.shape[1:])


class ChainWeights(NamedTuple):
    """The optimisation variables of a `LinearChainModel`: emission `[P]`,
    the weights of the P (feature, label) pairs of its emission mask
    (row-major order), or the whole `[K, L]` table without a mask;
    transitions `[L, L]`; start `[L]`; pair_emission `[K2, L, L]`."""

    emission: jax.Array
    transitions: jax.Array
    start: jax.Array
    pair_emission: jax.Array


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _zero_tables(num_features: int, num_labels: int, num_pair_features: int, dtype) -> tuple:
    """`[K, L]`, `[L, L]`, `[L]` and `[K2, L, L]` zeros in one program (one
    compilation, or cache load, per model shape instead of one per table)."""
    K, L = num_features, num_labels
    return tuple(jnp.zeros(shape, dtype) for shape in ((K, L), (L, L), (L,), (num_pair_features, L, L)))


@jax.jit  # one program: indexing by arrays outside `jit` runs five
def _existing(emission: jax.Array, rows, columns) -> jax.Array:
    """`emission[rows, columns]`, `[P]`."""
    return emission[rows, columns]


@jax.jit  # one program where the steps outside `jit` would run one each
def _dense_tables(weights, structure) -> tuple:
    """`(emission [K, L], transitions [L, L], start [L])` of `weights` (`ChainWeights`)
    and `structure` (`ChainStructure`): weights that do not exist read 0."""
    emission, transitions = weights.emission, weights.transitions
    if structure.emission_pairs is not None:
        rows, columns = structure.emission_pairs
        emission = jnp.zeros(structure.emission_mask.shape, emission.dtype).at[rows, columns].set(emission)
    if structure.transition_mask is not None:
        # A transition that does not exist reads 0, so its gradient is 0.
        transitions = jnp.where(structure.transition_mask, transitions, 0.0)
    start = weights.start if structure.start_mask is None else jnp.where(structure.start_mask, weights.start, 0.0)
    return emission, transitions, start


class ChainStructure(NamedTuple):
    """What `LinearChainModel.with_weights` needs besides the weights:
    emission_pairs: `(rows [P], columns [P])` int32 of the emission
    weights that exist, or None (all); emission_mask `[K, L]`, pair_mask
    `[K2, L, L]`, transition_mask `[L, L]` and start_mask `[L]` bool, or
    None; pair_slots `[K2, S]` int32 or None (`LinearChainModel.pair_slots`)."""

    emission_pairs: tuple | None
    emission_mask: jax.Array | None
    pair_mask: jax.Array | None
    transition_mask: jax.Array | None = None
    pair_slots: jax.Array | None = None
    start_mask: jax.Array | None = None


class LinearChainModel(eqx.Module):
    """Weights of a sparse-feature linear-chain CRF.

    emission: `[K, L]`; transitions: `[L, L]` (`[i, j]`: label j after i);
    start: `[L]`; pair_emission: `[K2, L, L]` (K2 may be 0);
    emission_mask: `[K, L]` bool or None (True: the weight exists);
    pair_mask: `[K2, L, L]` bool or None (likewise; transitions then exist
    only on its label pairs, as CRFsuite's seen transitions); pair_support: the label
    pairs `(previous, next)` that any pair weight may use when they are few
    enough for the sparse form, else None (derived from `pair_mask` by
    `with_pair_mask`; static); transition_mask: `[L, L]` bool or None (True:
    the transition weight exists; CRFsuite's transitions seen in training);
    pair_slots: `[K2, S]` int32 or None, each pair test's label pairs on its
    mask as flat indices `previous * L + next`, padded with -1, when no test
    has more than the sparse fraction of the `L^2` (the support per position
    of the sparse form; derived from `pair_mask` by `with_pair_mask`);
    start_mask: `[L]` bool or None (True: the start weight exists; CRFsuite
    has none).
    """

    emission: jax.Array
    transitions: jax.Array
    start: jax.Array
    pair_emission: jax.Array
    emission_mask: jax.Array | None = None
    pair_mask: jax.Array | None = None
    pair_support: tuple | None = eqx.field(default=None, static=True)
    transition_mask: jax.Array | None = None
    pair_slots: jax.Array | None = None
    start_mask: jax.Array | None = None

    def with_pair_mask(self, pair_mask, *, max_sparse_fraction: float | None = None) -> LinearChainModel:
        """The model with the pair weights outside `pair_mask [K2, L, L]` fixed
        at 0, and the sparse forms where their label pairs are at most
        `max_sparse_fraction` (default `SPARSE_MAX_FRACTION`; 0 keeps the
        dense form) of the `L^2`: a support per position when every pair
        test's own label pairs are (`pair_slots`, for one pair test per
        position), one support when their union is (`pair_support`). The
        mask must be concrete (it decides static shapes)."""
        max_sparse_fraction = SPARSE_MAX_FRACTION if max_sparse_fraction is None else max_sparse_fraction
        K2, L = self.pair_emission.shape[0], self.num_labels
        mask = np.asarray(pair_mask, dtype=bool)
        if mask.shape != (K2, L, L):
            raise ValueError(f"pair_mask must have shape [K2, L, L] = {(K2, L, L)}, got shape {mask.shape}")
        previous, following = np.nonzero(mask.any(axis=0))
        sparse = 0 < previous.size <= max_sparse_fraction * L * L
        support = (tuple(previous.tolist()), tuple(following.tolist())) if sparse else None
        flat = mask.reshape(K2, L * L)
        counts = flat.sum(axis=1)
        widest = int(counts.max()) if K2 else 0
        slots = None
        if 0 < widest <= max_sparse_fraction * L * L:
            # Row-major order keeps each test's pairs in ascending flat index.
            tests, flat_pairs = np.nonzero(flat)
            rank = np.arange(tests.size) - np.repeat(np.cumsum(counts) - counts, counts)
            table = np.full((K2, widest), -1, np.int32)
            table[tests, rank] = flat_pairs
            slots = jax.device_put(table)  # not jnp.asarray: that compiles a copy program per shape
        return dataclasses.replace(self, pair_mask=jax.device_put(mask), pair_support=support, pair_slots=slots)

    def with_transition_mask(self, transition_mask) -> LinearChainModel:
        """The model with the transition weights outside `transition_mask
        [L, L]` (bool) fixed at 0 (CRFsuite without `possible_transitions`
        creates transition features only for the label pairs seen in training)."""
        L = self.num_labels
        mask = jax.device_put(np.asarray(transition_mask, dtype=bool))
        if mask.shape != (L, L):
            raise ValueError(f"transition_mask must have shape [L, L] = {(L, L)}, got shape {mask.shape}")
        return dataclasses.replace(self, transitions=jnp.where(mask, self.transitions, 0.0), transition_mask=mask)

    def with_start_mask(self, start_mask) -> LinearChainModel:
        """The model with the start weights outside `start_mask [L]` (bool) fixed
        at 0 (all False: CRFsuite's model, which has no start weights)."""
        L = self.num_labels
        mask = jax.device_put(np.broadcast_to(np.asarray(start_mask, dtype=bool), (L,)))
        return dataclasses.replace(self, start=jnp.where(mask, self.start, 0.0), start_mask=mask)

    def with_num_features(self, count: int) -> LinearChainModel:
        """The model over `count` unigram features (`emission [count, L]`): its
        first `count` rows, or its rows then zero ones (masked off when it has a
        mask): the rows a training run or a decoder pads on (`features.ladder`)."""
        extra = max(count - self.emission.shape[0], 0)
        # On the host, then `device_put`: a device op (`jnp.pad`, even `jnp.asarray`) would compile
        # a program per table size, and every fit's vocabulary differs.
        grow = lambda table, fill: jax.device_put(
            np.pad(np.asarray(table)[:count], ((0, extra), (0, 0)), constant_values=fill)
        )
        mask = None if self.emission_mask is None else grow(self.emission_mask, False)
        return dataclasses.replace(self, emission=grow(self.emission, 0), emission_mask=mask)

    @staticmethod
    def zeros(
        num_features: int, num_labels: int, num_pair_features: int = 0, *, emission_mask=None, dtype=jnp.float32
    ) -> LinearChainModel:
        """All-zero weights (the usual starting point of convex training)."""
        if num_features < 0 or num_labels < 1 or num_pair_features < 0:
            raise ValueError(
                f"need num_features >= 0, num_labels >= 1, num_pair_features >= 0, got "
                f"{num_features}, {num_labels}, {num_pair_features}"
            )
        if emission_mask is not None:
            emission_mask = (
                emission_mask.astype(bool)
                if isinstance(emission_mask, jax.Array)
                else on_device(np.asarray(emission_mask, dtype=bool))
            )
            if emission_mask.shape != (num_features, num_labels):
                raise ValueError(
                    f"emission_mask must have shape [K, L] = {(num_features, num_labels)}, "
                    f"got shape {emission_mask.shape}"
                )
        check_allocation("emission weights W", (num_features, num_labels), dtype)
        check_allocation("label-pair-observation weights", (num_pair_features, num_labels, num_labels), dtype)
        emission, transitions, start, pair_emission = _zero_tables(
            num_features, num_labels, num_pair_features, jnp.dtype(dtype)
        )
        return LinearChainModel(emission, transitions, start, pair_emission, emission_mask)

    @staticmethod
    def observed(
        batches, num_features: int, num_labels: int, num_pair_features: int = 0, *, dtype=jnp.float32
    ) -> LinearChainModel:
        """All-zero weights on only the (feature, label) pairs and (pair
        feature, previous label, label) triples seen in the labelled `batches`
        (`features.FeatureBatch`es), as CRFsuite creates features; on few
        label pairs the pair weights take the sparse form (Lavergne 4.1)."""
        batches = list(batches)
        mask = observed_label_pairs(batches, num_features, num_labels)
        model = LinearChainModel.zeros(num_features, num_labels, num_pair_features, emission_mask=mask, dtype=dtype)
        if num_pair_features:
            model = model.with_pair_mask(observed_label_triples(batches, num_pair_features, num_labels))
        return model

    @property
    def num_labels(self) -> int:
        return self.transitions.shape[-1]

    def unary(self, unigram_ids, unigram_values=None) -> jax.Array:
        """Emission scores `[..., T, L]` from `unigram_ids [..., T, F]` and
        their values `unigram_values [..., T, F]` (None: all 1)."""
        unigram_ids = _check_ids("unigram_ids", unigram_ids, self.emission.shape[0])
        if unigram_values is not None:
            unigram_values = jnp.asarray(unigram_values)
            if unigram_values.shape != unigram_ids.shape or not jnp.issubdtype(unigram_values.dtype, jnp.floating):
                raise ValueError(
                    f"unigram_values must be a float array of the shape of unigram_ids "
                    f"{unigram_ids.shape}, got {unigram_values.dtype} {unigram_values.shape}"
                )
        return _sum_rows(self._masked_emission(), unigram_ids, unigram_values)

    def _masked_emission(self) -> jax.Array:
        if self.emission_mask is None:
            return self.emission
        # A weight that does not exist is read as 0, so its gradient is 0
        # and no optimizer ever moves it from its initial 0.
        return jnp.where(self.emission_mask, self.emission, 0.0)

    def __call__(self, unigram_ids, pair_ids=None, unigram_values=None):
        """Potentials of featurised sentences.

        unigram_ids: `[..., T, F]` int; pair_ids: `[..., T, F2]` int or None;
        unigram_values: `[..., T, F]` float values of `unigram_ids`, or None
        (all 1).
        Returns `FactoredPotentials(unary [..., T, L], transitions [L, L],
        start [L])` when the model has no pair features (K2 = 0), else edge
        potentials `[..., T, L, L]`.
        """
        unary = self.unary(unigram_ids, unigram_values)
        if self.pair_emission.shape[0] == 0:
            return FactoredPotentials(unary, self.transitions, self.start)
        if pair_ids is None:
            raise ValueError("pair_ids [..., T, F2] is required: the model has label-pair-observation features")
        pair_ids = _check_ids("pair_ids", pair_ids, self.pair_emission.shape[0])
        if pair_ids.shape[:-1] != unary.shape[:-1]:
            raise ValueError(
                f"pair_ids must have shape [..., T, F2] with [..., T] = {unary.shape[:-1]} "
                f"(from unigram_ids), got shape {pair_ids.shape}"
            )
        table, slots = self._pair_rows(pair_ids)
        return self._pair_potentials(unary, _sum_rows(table, pair_ids), slots)

    def _pair_rows(self, pair_ids) -> tuple:
        """`(table, slots)`: the pair tests' weights in the form the model
        takes for `pair_ids [..., F2]` (each test's own label pairs `[K2, S]`,
        the one support's `[K2, K]` or `[K2, L, L]`), and for the first, each
        token's label pairs `[..., S]` (else None)."""
        if self.pair_slots is not None and pair_ids.shape[-1] == 1:
            table, slots = self._slot_table()
            return table, _token_slots(slots, pair_ids[..., 0])
        if self.pair_support is not None:
            return self._pair_table(), None
        return self._masked_pair_emission(), None

    def _pair_potentials(self, unary, pair, slots, starts=None):
        """The potentials of unary `[..., T, L]` and pair scores from `_pair_rows`' table."""
        if slots is not None:
            return self._per_position(unary, pair, slots, starts)
        if self.pair_support is not None:
            return self._sparse(unary, pair, starts)
        return self._edges(unary, pair, starts)

    def _masked_transitions(self) -> jax.Array:
        """With a pair mask, transition weights exist only on its label pairs
        (CRFsuite's default: transitions seen in training)."""
        if self.pair_mask is None:
            return self.transitions
        return jnp.where(jnp.any(self.pair_mask, axis=0), self.transitions, 0.0)

    def _masked_pair_emission(self) -> jax.Array:
        if self.pair_mask is None:
            return self.pair_emission
        return jnp.where(self.pair_mask, self.pair_emission, 0.0)

    def _pair_table(self) -> jax.Array:
        """Each pair feature's weights on the sparse support, `[K2, K]`."""
        previous, following = (np.asarray(side, np.int32) for side in self.pair_support)
        return self._masked_pair_emission()[:, previous, following]

    def _slot_table(self) -> tuple:
        """`(table [K2, S], slots [K2, S])`: each pair test's weights on its own
        label pairs (0 at padding), and those pairs (`pair_slots`)."""
        assert self.pair_slots is not None
        K2, L = self.pair_emission.shape[0], self.num_labels
        slots = self.pair_slots
        flat = self._masked_pair_emission().reshape(K2, L * L)
        table = jnp.take_along_axis(flat, jnp.maximum(slots, 0), axis=1)
        # A padding slot reads pair 0 of its test: zeroed, so it is a
        # weight-0 listing (and gets no gradient).
        return jnp.where(slots >= 0, table, 0.0), slots

    def _per_position(self, unary, pair, slots, starts=None):
        """`SparsePotentials` with a support per position from unary
        `[..., T, L]`, pair weights `[..., T, S]` and their flat label pairs
        `slots [..., T, S]` (padding: pair (0, 0) at weight 0); the pair
        weights do not apply at t = 0 (nor at `starts`), the transitions are
        the dense part of each step."""
        previous, following = jnp.divmod(slots, self.num_labels)
        return SparsePotentials(
            unary, _off_chain_starts(pair, starts), previous, following, self.start, self._masked_transitions()
        )

    def _sparse(self, unary, pair, starts=None):
        """`SparsePotentials` from unary `[..., T, L]` and pair weights on the
        support `[..., T, K]`, which do not apply at t = 0 (nor at `starts`).
        The transitions live on the support too, so the dense part of each
        step is Lavergne's rank-one sum."""
        previous, following = (jnp.asarray(side, jnp.int32) for side in self.pair_support)
        pair = pair + self.transitions[previous, following]
        return SparsePotentials(unary, _off_chain_starts(pair, starts), previous, following, self.start)

    def packed_potentials(self, design: SparseDesign, pair_ids, positions, starts=None) -> tuple:
        """Potentials of every bucket of a packed corpus (`features.PackedCorpus`).

        design: `features.design.bucket_design(packed, K)`, the unigram
        features (and their values, if the corpus has them) with one row
        per bucket cell; pair_ids: `[N, F2]` over all
        tokens; positions: a tuple of `[B_b, T_b]` token rows (-1 = padding);
        starts: None (a sentence per row), or a tuple of `[B_b, T_b]` bool
        marking each sentence's first position in rows of several sentences
        (`features.pack_rows`), where only the start scores apply.
        Emission scores are one sparse product (`design_matmul`) sliced into
        the buckets; pair scores are computed once over the N real tokens,
        then placed into the buckets.
        Returns a tuple of potentials as `__call__` does, one per bucket.
        """
        unaries = bucket_slices(design_matmul(design, self._masked_emission()), [p.shape for p in positions])
        pair = slots = None
        if self.pair_emission.shape[0]:
            pair_ids = _check_ids("pair_ids", pair_ids, self.pair_emission.shape[0])
            table, slots = self._pair_rows(pair_ids)
            pair = _sum_rows(table, pair_ids)
        out = []
        for b, (bucket, bucket_unary) in enumerate(zip(positions, unaries)):
            bucket_starts = None if starts is None else starts[b]
            if pair is None:
                out.append(FactoredPotentials(bucket_unary, self.transitions, self.start))
            else:
                bucket_slots = None if slots is None else _token_slots(slots, bucket)
                bucket_pair = _sum_rows(pair, bucket[..., None])
                out.append(self._pair_potentials(bucket_unary, bucket_pair, bucket_slots, bucket_starts))
        return tuple(out)

    def _edges(self, unary, pair, starts=None):
        """Edge potentials `[..., T, L, L]` from unary `[..., T, L]` and pair scores
        `[..., T, L, L]`; at t = 0 (and where `starts [..., T]`) only the start
        scores and the unary apply."""
        edges = self._masked_transitions() + pair + unary[..., None, :]
        if edges.shape[-3] == 0:
            return edges
        first = jnp.broadcast_to((self.start + unary[..., :1, :])[..., None, :], edges[..., :1, :, :].shape)
        edges = jnp.concatenate([first, edges[..., 1:, :, :]], axis=-3)
        if starts is None:
            return edges
        return jnp.where(starts[..., None, None], (self.start + unary)[..., None, :], edges)

    def potentials(self, batch: FeatureBatch):
        """`self(batch.unigram_ids, batch.pair_ids, batch.unigram_values)`."""
        return self(batch.unigram_ids, batch.pair_ids, batch.unigram_values)

    def weights(self) -> ChainWeights:
        """The optimisation variables (`ChainWeights`)."""
        emission = self.emission
        if self.emission_mask is not None:
            emission = _existing(emission, *np.nonzero(np.asarray(self.emission_mask)))
        return ChainWeights(emission, self.transitions, self.start, self.pair_emission)

    def weight_masks(self) -> ChainWeights:
        """Which weights of the dense tables exist (can be non-zero), as
        `ChainWeights` of bool arrays `[K, L]`, `[L, L]`, `[L]`, `[K2, L, L]`,
        each None where all do: the emission and pair masks, and the
        transitions kept by `transition_mask` and, with a pair mask, on its
        label pairs (`_masked_transitions`)."""
        transitions = self.transition_mask
        if self.pair_mask is not None:
            used = jnp.any(self.pair_mask, axis=0)
            transitions = used if transitions is None else transitions & used
        return ChainWeights(self.emission_mask, transitions, self.start_mask, self.pair_mask)  # pyright: ignore[reportArgumentType]

    def structure(self) -> ChainStructure:
        """The masks and the emission pairs of `weights()` (`ChainStructure`)."""
        pairs = None
        if self.emission_mask is not None:
            pairs = tuple(np.asarray(i, np.int32) for i in np.nonzero(np.asarray(self.emission_mask)))
        return ChainStructure(
            pairs, self.emission_mask, self.pair_mask, self.transition_mask, self.pair_slots, self.start_mask
        )

    def with_weights(self, weights: ChainWeights, structure: ChainStructure) -> LinearChainModel:
        """This model with `weights` (from `weights()`, or an optimizer) and
        `structure` (from `structure()`); jit-able in both: every array of the
        result comes from them, none from `self` (only shapes and the static
        sparse support do)."""
        return LinearChainModel.from_weights(weights, structure, self.pair_support)

    @staticmethod
    def from_weights(
        weights: ChainWeights, structure: ChainStructure, pair_support: tuple | None = None
    ) -> LinearChainModel:
        """The model of `weights` and `structure` (`weights()`, `structure()`)
        with the static sparse `pair_support` (`with_pair_mask`): nothing
        else is needed, so a training objective is a function of shapes and
        settings only, equal across models of equal shapes (compiled once)."""
        emission, transitions, start = _dense_tables(weights, structure)
        return LinearChainModel(
            emission,
            transitions,
            start,
            weights.pair_emission,
            structure.emission_mask,
            structure.pair_mask,
            pair_support,
            structure.transition_mask,
            structure.pair_slots,
            structure.start_mask,
        )

    def trainable(self):
        """`(params, static)`: the floating-point weights and the rest (the mask),
        as `equinox.partition`; `equinox.combine(params, static)` rebuilds the model."""
        return eqx.partition(self, eqx.is_inexact_array)

    def flat(self):
        """The trainable weights as one vector `[n]` and the inverse map
        `vector -> LinearChainModel` (for L1 optimizers and counting)."""
        params, static = self.trainable()
        vector, unravel = ravel_pytree(params)
        return vector, lambda v: eqx.combine(unravel(v), static)

    def num_nonzero(self) -> int:
        """Number of non-zero trainable weights."""
        params, _ = self.trainable()
        return int(sum(np.count_nonzero(np.asarray(leaf)) for leaf in jax.tree_util.tree_leaves(params)))

    def num_parameters(self) -> int:
        """Number of weights that can be non-zero (`weight_masks`: masked
        weights excluded, transitions off a pair mask's label pairs too)."""
        tables = (self.emission, self.transitions, self.start, self.pair_emission)
        return sum(
            int(np.size(table)) if mask is None else int(np.count_nonzero(np.asarray(mask)))
            for table, mask in zip(tables, self.weight_masks())
        )


#: The sparse form is chosen when the label pairs that pair weights may use
#: are at most this fraction of all `L^2` (beyond, its per-pair work costs
#: more than the dense blocks it saves).
SPARSE_MAX_FRACTION = 0.5


def _off_chain_starts(pair, starts):
    """Pair weights `[..., T, K]` set to 0 at t = 0 and where `starts [..., T]`
    (None: none), where a chain starts and only the start scores apply."""
    first = jnp.arange(pair.shape[-2])[:, None] == 0
    if starts is not None:
        first = first | starts[..., None]
    return jnp.where(first, 0.0, pair)


def _token_slots(slots: jax.Array, ids: jax.Array) -> jax.Array:
    """The label pairs `[..., S]` of each token's pair test `ids [...]` (-1:
    none) from a test's `slots [K2', S]` (K2' tests or tokens), padding at
    pair 0 (its weight is 0)."""
    rows = slots.at[jnp.where(ids >= 0, ids, slots.shape[0])].get(mode="fill", fill_value=0)
    return jnp.maximum(rows, 0)


def _check_ids(name: str, ids, size: int) -> jax.Array:
    ids = as_integer_array(name, ids, "an integer array [..., T, F]")
    if ids.ndim < 2:
        raise ValueError(f"{name} must have shape [..., T, F] (rank >= 2), got shape {ids.shape}")
    value = concrete(ids)
    if value is not None and value.size and value.max() >= size:
        raise ValueError(f"{name} must hold ids in [-1, {size}) (-1 = padding; {size} features), got {value.max()}")
    return ids
