"""A `LinearChainModel` over a packed corpus (`features.CorpusArrays`): the
summed training loss (also as a function of the model's optimisation
variables, `weights_objective`), and decoding (Viterbi, k-best, marginals).

A corpus is packed once (`features.index.pack` into length buckets, or `pack_rows`
into rows of back-to-back sentences) and read bucket by bucket; every function here
takes the arrays as an argument, so jitted it compiles one program per set of
bucket shapes, and the data stays out of it. Decoding takes optional label-scheme
constraints (`lattices.constraints.allowed_transitions`). Results are per bucket;
`features.in_corpus_order` puts them back in corpus order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import compilation_cache
from ..features.corpus import CorpusArrays, bucket_corpora, ladder
from ..features.index import FeatureBatch, PackedCorpus
from ..lattices import chain
from ..lattices.constraints import AllowedTransitions
from ..losses.sequence import row_sequence_log_loss, sequence_log_loss
from .constraints import constrain
from .linear_chain import ChainStructure, ChainWeights, LinearChainModel


def corpus_potentials(model: LinearChainModel, arrays: CorpusArrays) -> tuple:
    """The potentials of every bucket (`LinearChainModel.packed_potentials`).

    Args:
      model: a `LinearChainModel`.
      arrays: the packed corpus (`CorpusArrays`).

    Returns:
      a tuple of potentials, one per bucket, over its `[B_b, T_b]` positions.
    """
    return model.packed_potentials(arrays.design, arrays.pair_ids, arrays.positions, arrays.starts)


def corpus_loss(model: LinearChainModel, arrays: CorpusArrays, loss: Callable | None = None) -> jax.Array:
    """The loss summed over the corpus's sentences.

    Args:
      model: a `LinearChainModel`.
      arrays: the packed corpus (`CorpusArrays`), with labels.
      loss: `(potentials, labels [B, T], lengths [B]) -> [B]`, default the CRF
        log-loss (`losses.sequence_log_loss`); rows of
        several sentences (`arrays.starts`, from `pack_rows`) take only the
        default, as `losses.row_sequence_log_loss`.

    Returns:
      `[]`, the summed loss.
    """
    buckets = corpus_potentials(model, arrays)
    all_labels, all_starts = arrays.labels, arrays.starts
    if all_labels is None:
        raise ValueError("arrays: the loss needs labels; pack the corpus with its labels")
    if all_starts is not None:
        if loss is not None:
            raise ValueError(
                "loss: rows of several sentences (pack_rows) take only the default log-loss; "
                "pack a custom loss's corpus into length buckets (features.pack)"
            )
        row_loss = row_sequence_log_loss
        return sum(
            jnp.sum(row_loss(p, labels, starts, lengths))  # pyright: ignore[reportReturnType]  # a sum of arrays
            for p, labels, starts, lengths in zip(buckets, all_labels, all_starts, arrays.lengths)
        )
    loss = sequence_log_loss if loss is None else loss
    return sum(
        jnp.sum(loss(p, labels, lengths))  # pyright: ignore[reportReturnType]  # a sum of arrays
        for p, labels, lengths in zip(buckets, all_labels, arrays.lengths)
    )


def batch_loss(model: LinearChainModel, batch: FeatureBatch, loss: Callable | None = None) -> jax.Array:
    """`corpus_loss` of a padded batch of sentences (`features.pad_batch`),
    e.g. the `fun(model, batch)` of `training.lazy_epoch_step_fn`, whose
    minibatches are drawn from one leading axis.

    Args:
      model: a `LinearChainModel`.
      batch: a `FeatureBatch` `[B, T, ...]` with labels.
      loss: as in `corpus_loss`.

    Returns:
      `[]`, the summed loss.
    """
    if batch.labels is None:
        raise ValueError("batch: the loss needs labels; pad the batch with its labels")
    loss = sequence_log_loss if loss is None else loss
    return jnp.sum(loss(model.potentials(batch), batch.labels, batch.lengths))


def blockwise_corpus_loss(model: LinearChainModel, blocks: CorpusArrays, loss: Callable | None = None) -> jax.Array:
    """`corpus_loss` of a corpus split into equally shaped blocks, summed one
    block at a time.

    Each block's loss is rematerialised in the gradient (`jax.checkpoint`),
    so the peak memory is one block's temporaries, for one more forward
    pass: the whole corpus at once needs `[N, L, L]` edge potentials (1.6 GB
    for conll2000 POS with label-pair features), several times over in the
    gradient.

    Args:
      model: a `LinearChainModel`.
      blocks: `CorpusArrays` of `S` blocks (`features.pack_shards`: every
        leaf `[S, ...]`), with labels.
      loss: as in `corpus_loss`.

    Returns:
      `[]`, the summed loss.
    """
    one = jax.checkpoint(lambda model, arrays: corpus_loss(model, arrays, loss))
    return jnp.sum(jax.lax.map(lambda arrays: one(model, arrays), blocks))


class TrainingData(NamedTuple):
    """What `weights_objective` reads: the packed labelled corpus and the
    model's masks (`ChainStructure`), both arguments of the compiled
    program, never constants in it. For data-parallel training every leaf
    has a leading shard axis `[shards, ...]` (`features.pack_shards`); for a
    blockwise objective the arrays have a leading block axis, the
    structure not."""

    arrays: CorpusArrays
    structure: ChainStructure


class WeightsObjective(NamedTuple):
    """`(ChainWeights, TrainingData) -> []`: `corpus_loss` of the model of
    those weights and the data's structure (`LinearChainModel.from_weights`).
    A value (equal settings give equal objectives), so the training driver's
    compiled programs are shared by every fit of equal shapes: a
    `GridSearchCV` compiles once per shape, not once per fit. blockwise:
    the data's arrays are blocks `[S, ...]`, summed one at a time
    (`blockwise_corpus_loss`)."""

    pair_support: tuple | None = None
    loss: Callable | None = None
    blockwise: bool = False

    def __call__(self, weights: ChainWeights, data: TrainingData) -> jax.Array:
        model = LinearChainModel.from_weights(weights, data.structure, self.pair_support)
        if self.blockwise:
            return blockwise_corpus_loss(model, data.arrays, self.loss)
        return corpus_loss(model, data.arrays, self.loss)


def weights_objective(
    model: LinearChainModel, loss: Callable | None = None, *, blockwise: bool = False
) -> WeightsObjective:
    """The `WeightsObjective` of `model`'s kind (its static sparse support),
    `loss` and `blockwise`.

    Nothing of `model` but its static support enters the result.

    Args:
      model: a `LinearChainModel`.
      loss: as in `corpus_loss`.
      blockwise: whether the data's arrays are blocks `[S, ...]`
        (`blockwise_corpus_loss`).

    Returns:
      a `WeightsObjective`, `(ChainWeights, TrainingData) -> []`; its
        optimisation variables are `model.weights()`.
    """
    return WeightsObjective(model.pair_support, loss, blockwise)


def _constrained(model, arrays, moves: AllowedTransitions | None) -> tuple:
    buckets = corpus_potentials(model, arrays)
    if moves is None:
        return buckets
    return tuple(constrain(p, moves, lengths) for p, lengths in zip(buckets, arrays.lengths))


def decode_by_bucket(decode: Callable, model: LinearChainModel, corpus: PackedCorpus, *arguments, moves=None) -> tuple:
    """`decode(model, arrays, *arguments, moves)` per bucket of `corpus`.

    Each bucket's arrays are on the shape ladder (`features.bucket_corpora`,
    the model's feature rows padded likewise) and its program compiled once
    per shape and kept (`compilation_cache.compiled`): other sentence sets,
    and later processes, re-use the compiled decoders.

    Args:
      decode: `viterbi`, `kbest`, `marginals` or a function like them.
      model: a `LinearChainModel`.
      corpus: a `PackedCorpus` packed with the model's feature ids.
      *arguments: `decode`'s other arguments (hashable, e.g. `k`).
      moves: label-scheme constraints (`lattices.constraints.allowed_transitions`),
        or None.

    Returns:
      a tuple with `decode`'s result per bucket (rows and length padded to
        the ladder: `features.in_corpus_order` cuts them).
    """
    num_features = ladder(model.emission.shape[0])
    model = model.with_num_features(num_features)
    out = []
    for arrays in bucket_corpora(corpus, num_features):
        inputs = (model, jax.device_put(arrays), moves)  # device_put: jnp.asarray compiles a copy per shape
        program = lambda model, arrays, moves: decode(model, arrays, *arguments, moves)
        executable, _ = compilation_cache.compiled((decode, arguments), inputs, program)
        out.append(executable(*inputs)[0])
    return tuple(out)


@jax.jit
def viterbi(model: LinearChainModel, arrays: CorpusArrays, moves: AllowedTransitions | None = None) -> tuple:
    """The best label sequences, per bucket.

    Args:
      model: a `LinearChainModel`.
      arrays: the packed corpus (`CorpusArrays`; labels are not read).
      moves: label-scheme constraints (`lattices.constraints.allowed_transitions`),
        or None.

    Returns:
      a tuple with the labels `[B_b, T_b]` int32 of each bucket (-1 past each
        length).
    """
    return tuple(chain.viterbi(p, lengths)[1] for p, lengths in zip(_constrained(model, arrays, moves), arrays.lengths))


@functools.partial(jax.jit, static_argnames="k")
def kbest(model: LinearChainModel, arrays: CorpusArrays, k: int, moves: AllowedTransitions | None = None) -> tuple:
    """The k best label sequences, best first, per bucket.

    Args:
      model: a `LinearChainModel`.
      arrays: the packed corpus (`CorpusArrays`; labels are not read).
      k: the number of sequences (static).
      moves: label-scheme constraints (`lattices.constraints.allowed_transitions`),
        or None.

    Returns:
      a tuple with `(log-probabilities [B_b, k], labels [B_b, k, T_b])` of
        each bucket (`-inf` and -1 where a sentence has fewer than k).
    """
    out = []
    for p, lengths in zip(_constrained(model, arrays, moves), arrays.lengths):
        scores, labels = chain.kbest(p, lengths, k)
        out.append((scores - chain.log_partition(p, lengths)[:, None], labels))
    return tuple(out)


@jax.jit
def marginals(model: LinearChainModel, arrays: CorpusArrays, moves: AllowedTransitions | None = None) -> tuple:
    """The label marginals `P(y_t = j | x)`, per bucket.

    Args:
      model: a `LinearChainModel`.
      arrays: the packed corpus (`CorpusArrays`; labels are not read).
      moves: label-scheme constraints (`lattices.constraints.allowed_transitions`),
        or None.

    Returns:
      a tuple with the marginals `[B_b, T_b, L]` of each bucket (0 past each
        length).
    """
    return tuple(
        chain.node_marginals(p, lengths) for p, lengths in zip(_constrained(model, arrays, moves), arrays.lengths)
    )
