"""Train a sparse-feature linear-chain CRF on a packed corpus, end to end.

`train_linear_chain` builds the zero `models.LinearChainModel` (on the
features the corpus uses, or on all), its masks as the objective's data, the
elastic-net training (`elastic_net_training`: OWL-QN, L-BFGS or a given
optimizer) and runs the driver (`train`) on one device or a mesh. `Tagger`,
`sklearn.CRF` and the command line train through it; research code that
packs its own corpus (`features.pack_rows`, `features.dicts`) can too.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import DTypeLike

from .. import features, parallel
from ..features.index import PackedCorpus
from ..models.linear_chain import LinearChainModel
from ..models.packed import TrainingData, weights_objective
from ..optimizers.driver import train, train_steps
from ..optimizers.elastic_net import ElasticNetSteps, check_elastic_net, elastic_net_training
from ..optimizers.minimize import Result, float_dtype
from ..validation import check_callable, check_float_dtype, check_int


def check_training(
    loss=None, l1=0.0, l2=0.0, regularizer=None, optimizer=None, memory_size=6, max_steps=100, dtype=jnp.float32, **_
) -> None:
    """A ValueError naming the first bad setting of `train_linear_chain`
    (the others, `**_`, are checked where they are used)."""
    check_elastic_net(l1, l2, optimizer, regularizer)
    if loss is not None:
        check_callable("loss", loss)
    check_int("memory_size", memory_size)
    check_int("max_steps", max_steps)
    check_float_dtype("dtype", dtype)


def initial_chain_model(
    packed_corpus: PackedCorpus,
    num_labels: int,
    num_features: int,
    num_pair_features: int = 0,
    *,
    observed_pairs_only: bool = True,
    observed_transitions_only: bool = False,
    dtype: DTypeLike = jnp.float32,
) -> LinearChainModel:
    """The zero model `train_linear_chain` starts from: weights `[K, L]`,
    `[L, L]`, `[L]`, `[K2, L, L]`, masked to the (feature, label) pairs and
    (pair feature, previous label, label) triples `packed_corpus` has
    (`observed_pairs_only`, CRFsuite's parameter set; the pair weights in the
    sparse form when their label pairs are few) and to its transitions
    (`observed_transitions_only`). Research code builds it to train the
    same model with other optimizers (`lazy_sgd_l1`, `bcd`), or to force a
    form (`with_pair_mask(model.pair_mask, max_sparse_fraction=0)`: dense)
    and pass it back as `train_linear_chain(model=)`."""
    model = (
        LinearChainModel.observed(
            features.padded_buckets(packed_corpus), num_features, num_labels, num_pair_features, dtype=dtype
        )
        if observed_pairs_only
        else LinearChainModel.zeros(num_features, num_labels, num_pair_features, dtype=dtype)
    )
    if observed_transitions_only:
        model = model.with_transition_mask(features.observed_transitions(packed_corpus, num_labels))
    return model


def _check_model(model, num_labels: int, num_features: int, num_pair_features: int) -> None:
    if not isinstance(model, LinearChainModel):
        raise TypeError(f"model must be a models.LinearChainModel or None, got {type(model).__name__}")
    expected = (num_features, num_labels), (num_pair_features, num_labels, num_labels)
    found = tuple(model.emission.shape), tuple(model.pair_emission.shape)
    if found != expected:
        raise ValueError(
            f"model must have emission [K, L] = {expected[0]} and pair_emission [K2, L, L] = {expected[1]} "
            f"(num_features, num_labels, num_pair_features), got {found[0]} and {found[1]}"
        )


def train_linear_chain(
    packed_corpus: PackedCorpus,
    num_labels: int,
    num_features: int,
    num_pair_features: int = 0,
    *,
    loss: Callable | None = None,
    l1: float = 0.0,
    l2: float = 0.0,
    regularizer: Callable | None = None,
    optimizer: optax.GradientTransformation | None = None,
    memory_size: int = 6,
    max_steps: int = 100,
    stop=None,
    observed_pairs_only: bool = True,
    observed_transitions_only: bool = False,
    dtype: DTypeLike = jnp.float32,
    model: LinearChainModel | None = None,
    shards=None,
    mesh: jax.sharding.Mesh | None = None,
    **drive_options,
) -> Result:
    """Minimise `sum_i loss_i + l1 ||w||_1 + l2 / 2 ||w||^2 (+ regularizer)`
    over a zero CRF on a labelled packed corpus.

    packed_corpus: `features.pack_rows` (the default log-loss) or
      `features.pack` (any `loss`), label ids in `[0, num_labels)`, feature
      ids in `[0, num_features)` (pair features `[0, num_pair_features)`).
    loss: `(potentials, labels [B, T], lengths [B]) -> [B]`; None: the CRF log-loss.
    observed_pairs_only: weights only on the (feature, label) pairs and
      (pair feature, previous label, label) triples the corpus has (CRFsuite);
      observed_transitions_only: only on the transitions it has.
    model: the model to start from, its weights, masks and potential form
      (e.g. `initial_chain_model(...)` forced onto the dense form); None:
      `initial_chain_model(packed_corpus, ..., observed_pairs_only,
      observed_transitions_only, dtype)`. Its tables must be `[K, L]`,
      `[L, L]`, `[L]`, `[K2, L, L]` for the given counts.
    shards, mesh: `shards` is the corpus as equally shaped blocks
      (`features.pack_shards`, default log-loss only): with a `mesh`,
      data-parallel training, one block per device of its data axis;
      without, the blocks' losses summed one at a time on one device
      (`models.blockwise_corpus_loss`: the memory of one block, for a
      forward pass more per evaluation). `packed_corpus` still decides the
      model's masks.
    stop: a stop rule (`relative_improvement_below`, ...), `max_steps` the cap.
    drive_options: `checkpoint_dir`, `checkpoint_every`, `settings`,
      `callback`, `progress`, `description`, `record`, `time_limit` (`drive`).
    Returns `train`'s `Result`, its `params` the trained model (off the mesh).
    """
    check_training(loss, l1, l2, regularizer, optimizer, memory_size, max_steps, dtype)
    if mesh is not None and shards is None:
        raise ValueError("shards, mesh: data-parallel training needs both (features.pack_shards over the mesh)")
    if shards is not None and loss is not None:
        raise ValueError(
            "shards, mesh: training on blocks (over a mesh, or one at a time) takes the default log-loss (loss=None)"
        )
    if model is None:
        model = initial_chain_model(
            packed_corpus,
            num_labels,
            num_features,
            num_pair_features,
            observed_pairs_only=observed_pairs_only,
            observed_transitions_only=observed_transitions_only,
            dtype=dtype,
        )
    else:
        _check_model(model, num_labels, num_features, num_pair_features)
    if shards is None:
        # The corpus and the feature rows padded to the shape ladder (rows no corpus feature reads
        # stay 0): fits on corpora of similar sizes (cross-validation folds) share compiled programs.
        model = model.with_num_features(features.ladder(num_features))
    structure = model.structure()
    if shards is None:
        data = TrainingData(features.ladder_arrays(packed_corpus, features.ladder(num_features)), structure)
    elif mesh is None:  # blocks one after another: one copy of the masks
        data = TrainingData(shards, structure)
    else:  # one copy of the masks per block
        count = jax.tree_util.tree_leaves(shards)[0].shape[0]
        copies = jax.tree_util.tree_map(lambda x: np.broadcast_to(np.asarray(x), (count,) + np.shape(x)), structure)
        data = TrainingData(shards, copies)
    objective = weights_objective(model, loss, blockwise=shards is not None and mesh is None)
    if mesh is not None:
        objective = parallel.single_block(objective)
    weights = model.weights()
    if optimizer is None:  # the penalty weights are data: fits differing only in them share one program
        check_elastic_net(l1, l2, optimizer, regularizer)
        summed = objective if mesh is None else parallel.sum_over_shards(objective, mesh)
        make_step = ElasticNetSteps(summed, memory_size, l1 > 0, regularizer)
        penalties = np.asarray([l1, l2], float_dtype(weights))
        if mesh is not None:
            penalties = np.broadcast_to(penalties, (jax.tree_util.tree_leaves(shards)[0].shape[0], 2))
        inner = (weights, make_step.optimizer(l1, l2).init(weights))
        result = train_steps(
            make_step, inner, (data, penalties), max_steps=max_steps, stop=stop, mesh=mesh, **drive_options
        )
    else:
        training = elastic_net_training(l1, l2, optimizer, memory_size=memory_size, regularizer=regularizer)
        result = train(
            objective,
            weights,
            data=data,
            **training._asdict(),
            max_steps=max_steps,
            stop=stop,
            mesh=mesh,
            **drive_options,
        )
    weights = jax.device_put(jax.tree_util.tree_map(np.asarray, result.params))  # off the mesh
    return result._replace(params=model.with_weights(weights, structure).with_num_features(num_features))
