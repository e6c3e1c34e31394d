"""`Tagger`: train, apply, evaluate, save and load a sparse-feature CRF tagger.

    tagger = Tagger("crfsuite_ner", **crfsuite_elastic_net(c1=0.1, c2=0.1), max_iterations=100)
    tagger.fit(corpora.conll2002("esp.train"))
    tagger.evaluate(corpora.conll2002("esp.testb"))   # {"token_accuracy": ..., "f1": ...}

A facade over `features.corpus` (extraction, indexing, packing),
`models.LinearChainModel` (which owns its masked parameterisation), the
training driver `optimizers.train`, `models.packed` (decoding) and
`model_file`. It trains `sum_i loss_i + l1 ||w||_1 + l2 / 2 ||w||^2`
(`optimizers.elastic_net_training`) and stops like CRFsuite: after
`max_iterations`, or when the objective improved by less than `tol`
(relative) over the last `period` iterations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import DTypeLike

from . import features, metrics, model_file, parallel
from .corpora import Sentence
from .features.corpus import Extractor, check_sentences, extractor_spec
from .features.index import FeatureIndex, PackedCorpus
from .lattices.constraints import allowed_transitions, scheme_of
from .models import packed
from .models.linear_chain import LinearChainModel
from .models.packed import TrainingData, weights_objective
from .optimizers import Status, crfsuite_elastic_net, elastic_net_training, relative_improvement_below, train
from .optimizers.elastic_net import check_elastic_net
from .optimizers.minimize import check_callable, check_scalar
from .validation import check_float_dtype, check_int

__all__ = ["Tagger", "TrainingData", "crfsuite_elastic_net"]

# Constructor fields that do not change the trained weights, or enter a
# checkpoint's settings in another form (the extractor's spec, the dtype's name).
_NOT_SETTINGS = ("features", "dtype", "progress", "iob_constraints")


@dataclasses.dataclass(eq=False)
class Tagger:
    """A linear-chain CRF tagger over sparse observation features.

    Args:
      features: a preset name (`features.presets.PRESETS`), CRF++/Wapiti
        template text, or a `Preset` / `Templates`.
      loss: `(potentials, labels [B, T], lengths [B]) -> [B]` per-sentence
        losses, summed over the corpus; default the CRF log-loss, trained on
        rows of back-to-back sentences (`features.pack_rows`).
      l1, l2: elastic-net weights (`crfsuite_elastic_net(c1, c2)` converts CRFsuite's).
      regularizer: an extra smooth penalty `ChainWeights -> scalar`, or None.
      optimizer: None (OWL-QN when `l1 > 0`, else `optax.lbfgs`) or an optax
        transformation (e.g. `optimizers.sgd_l1`, full batch); a custom one
        gets the smooth objective including the `l2` term and requires `l1 == 0`.
      max_iterations, tol, period: stopping rule (see the module docstring).
      memory_size: L-BFGS / OWL-QN history (CRFsuite's default is 6).
      min_count, hash_size: the feature index (`features.build_index`).
      observed_pairs_only: give weights only to the (feature, label) pairs and
        (pair feature, previous label, label) triples seen in training, as CRFsuite does.
      observed_transitions_only: give weights only to the label transitions
        seen in training (CRFsuite without `possible_transitions`); others stay 0.
      num_buckets: padded length buckets (compiled shapes) for decoding and custom losses.
      dtype: float dtype of the weights (float64 needs `jax_enable_x64`).
      progress: show a tqdm bar while training (default: above 20 iterations).
      iob_constraints: decode only sequences valid under the labels' chunk
        scheme (`lattices.constraints.scheme_of`: IOB2, IOBES or BILOU); None: when the labels
        fit one. Training is unconstrained either way.

    After `fit` (or `load`): `model`, `labels`, `index`, and of the last fit
    `history` (the objective after each iteration), `training_seconds` (the
    driver's compilation and iterations) and `status` (why it stopped).
    """

    features: str | Extractor = "crfsuite_ner"
    _: dataclasses.KW_ONLY
    loss: Callable | None = None
    l1: float = 0.0
    l2: float = 0.0
    regularizer: Callable | None = None
    optimizer: optax.GradientTransformation | None = None
    max_iterations: int = 100
    tol: float = 1e-5
    period: int = 10
    memory_size: int = 6
    min_count: int = 1
    hash_size: int | None = None
    observed_pairs_only: bool = True
    observed_transitions_only: bool = False
    num_buckets: int = 6
    dtype: DTypeLike = jnp.float32
    progress: bool | None = None
    iob_constraints: bool | None = None
    model: LinearChainModel | None = dataclasses.field(default=None, init=False, repr=False)
    labels: tuple[str, ...] = dataclasses.field(default=(), init=False, repr=False)
    index: FeatureIndex | None = dataclasses.field(default=None, init=False, repr=False)
    history: list[float] = dataclasses.field(default_factory=list, init=False, repr=False)
    training_seconds: float = dataclasses.field(default=0.0, init=False, repr=False)
    status: Status | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self):
        check_elastic_net(self.l1, self.l2, self.optimizer, self.regularizer)
        check_scalar("tol", self.tol, 0)
        if self.loss is not None:
            check_callable("loss", self.loss)
        for name in ("max_iterations", "period", "memory_size", "min_count", "hash_size", "num_buckets"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name))
        check_float_dtype("dtype", self.dtype)
        self.extractor = features.extractor(self.features)
        self.l1, self.l2 = float(self.l1), float(self.l2)

    # -- training -----------------------------------------------------------

    def fit(
        self,
        sentences: Sequence[Sentence],
        *,
        checkpoint_dir=None,
        checkpoint_every: int = 10,
        callback: Callable | None = None,
        mesh: jax.sharding.Mesh | None = None,
    ) -> Tagger:
        """Index features, build a zero model and train it on `sentences`.

        checkpoint_dir: save the training state there every `checkpoint_every`
          iterations and at the end; a later `fit` with the same directory,
          corpus and settings resumes and ends bit-identical to an
          uninterrupted run; a checkpoint of another corpus or other settings
          is refused (`optimizers.drive`).
        callback: `optimizers.Report -> bool | None` after each iteration; True stops.
        mesh: a `jax.sharding.Mesh`: the corpus is split into one block per
          device of its data axis (`features.pack_shards`), each device sums
          its block's loss (`parallel`); the weights match one device's.
        """
        check_sentences(sentences)
        check_int("checkpoint_every", checkpoint_every)
        if mesh is not None and self.loss is not None:
            raise ValueError("mesh: data-parallel training takes the default log-loss (loss=None)")
        extracted = [self.extractor(s.tokens) for s in sentences]
        labels = tuple(sorted({label for s in sentences for label in s.labels}))
        index = features.build_index(extracted, min_count=self.min_count, hash_size=self.hash_size)
        encoded, ids = [index.encode(f) for f in extracted], features.label_ids(sentences, labels)
        shards = (
            None if mesh is None else features.pack_shards(encoded, ids, index.num_unigram, parallel.num_shards(mesh))
        )
        return self._train(
            self._pack(encoded, ids), labels, index, shards, mesh, checkpoint_dir, checkpoint_every, callback
        )

    def fit_packed(
        self,
        packed_corpus: PackedCorpus,
        labels: Sequence[str],
        index: FeatureIndex,
        *,
        checkpoint_dir=None,
        checkpoint_every: int = 10,
        callback: Callable | None = None,
    ) -> Tagger:
        """Train on a labelled corpus already indexed and packed by the
        caller (e.g. `features.dicts.AttributeCorpus.pack_rows`: feature
        dicts; rows for the default log-loss, buckets for a custom `loss`),
        its label ids indexing `labels`, its feature ids `index`; as `fit` otherwise."""
        check_int("checkpoint_every", checkpoint_every)
        if packed_corpus.labels is None:
            raise ValueError("packed_corpus must be labelled (packed with labels)")
        return self._train(packed_corpus, tuple(labels), index, None, None, checkpoint_dir, checkpoint_every, callback)

    def _train(self, packed_corpus, labels, index, shards, mesh, checkpoint_dir, checkpoint_every, callback):
        """The masks from `packed_corpus`, then the driver on it (or on `shards`, one block per device of `mesh`)."""
        self.labels, self.index = labels, index
        K, K2, L = index.num_unigram, index.num_pair, len(labels)
        self.model = (
            LinearChainModel.observed(features.padded_buckets(packed_corpus), K, L, K2, dtype=self.dtype)
            if self.observed_pairs_only
            else LinearChainModel.zeros(K, L, K2, dtype=self.dtype)
        )
        if self.observed_transitions_only:
            self.model = self.model.with_transition_mask(features.observed_transitions(packed_corpus, len(labels)))
        structure = self.model.structure()
        if shards is None:
            data = TrainingData(features.corpus_arrays(packed_corpus, self.index.num_unigram), structure)
        else:  # one copy of the masks per block
            count = jax.tree_util.tree_leaves(shards)[0].shape[0]
            data = TrainingData(
                shards,
                jax.tree_util.tree_map(lambda x: np.broadcast_to(np.asarray(x), (count,) + np.shape(x)), structure),
            )
        training = elastic_net_training(
            self.l1, self.l2, self.optimizer, memory_size=self.memory_size, regularizer=self.regularizer
        )  # optimizer, regularizer and penalty
        objective = self.objective() if mesh is None else parallel.single_block(self.objective())
        result = train(
            objective,
            self.model.weights(),
            data=data,
            **training._asdict(),
            max_steps=self.max_iterations,
            stop=relative_improvement_below(self.tol, self.period),
            mesh=mesh,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            settings=self._settings(),
            callback=callback,
            description="Tagger.fit",
            progress=self.max_iterations > 20 if self.progress is None else self.progress,
        )
        trace = np.asarray(result.trace)[: int(result.num_steps)]
        self.history = [float(value) for value in trace if np.isfinite(value)]
        self.status, self.training_seconds = Status(int(result.status)), result.compile_seconds + result.run_seconds
        weights = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x)), result.params)  # off the mesh
        self.model = self.model.with_weights(weights, self.model.structure())
        return self

    def training_data(self, sentences: Sequence[Sentence]) -> TrainingData:
        """Labelled `sentences` as `objective()` reads them, through the fitted
        index, labels and masks (e.g. to time a gradient: `benchmarks`)."""
        model, index = self._require_model()
        check_sentences(sentences)
        encoded = features.encode(index, self.extractor, sentences)
        packed_corpus = self._pack(encoded, features.label_ids(sentences, self.labels))
        return TrainingData(features.corpus_arrays(packed_corpus, index.num_unigram), model.structure())

    def _pack(self, encoded, ids):
        """Rows of back-to-back sentences for the default log-loss, else length buckets."""
        return features.pack_rows(encoded, ids) if self.loss is None else features.pack(encoded, ids, self.num_buckets)

    def objective(self) -> Callable:
        """`(ChainWeights, TrainingData) -> []`: the loss summed over the
        sentences, penalties apart (`models.weights_objective`)."""
        model, _ = self._require_model()
        return weights_objective(model, self.loss)

    def _settings(self) -> list:
        """What a checkpoint must have been written with, besides the data."""
        fields = [getattr(self, f.name) for f in dataclasses.fields(self) if f.init and f.name not in _NOT_SETTINGS]
        return [self.labels, *fields, extractor_spec(self.extractor), str(jnp.dtype(self.dtype))]

    # -- inference ----------------------------------------------------------

    def _require_model(self) -> tuple[LinearChainModel, FeatureIndex]:
        """`(model, index)` of a fitted or loaded tagger."""
        if self.model is None or self.index is None:
            raise ValueError("the tagger has no model yet: call fit() or Tagger.load() first")
        return self.model, self.index

    def _decode(self, sentences, decode: Callable, *arguments):
        """`(packed corpus, per-bucket results)` of `decode_packed` for unlabelled `sentences`."""
        check_sentences(sentences, labelled=False)
        _, index = self._require_model()
        corpus = features.pack(features.encode(index, self.extractor, sentences), None, self.num_buckets)
        return corpus, self.decode_packed(corpus, decode, *arguments)

    def decode_packed(self, corpus: PackedCorpus, decode: Callable, *arguments) -> tuple:
        """`decode(model, arrays, *arguments, moves)` per length bucket of a
        corpus packed by the caller (`features.pack`, or
        `AttributeCorpus.pack`) with this tagger's index (`moves`: the
        label scheme's allowed transitions, or None; see `iob_constraints`),
        e.g. `decode=models.packed.viterbi`; `in_corpus_order` puts the
        results back in corpus order."""
        model, index = self._require_model()
        arrays = jax.tree_util.tree_map(jnp.asarray, features.corpus_arrays(corpus, index.num_unigram))
        scheme = scheme_of(self.labels)
        constrained = scheme is not None if self.iob_constraints is None else self.iob_constraints
        moves = allowed_transitions(self.labels, scheme or "IOB2") if constrained else None
        return decode(model, arrays, *arguments, moves)

    def predict(self, sentences: Sequence[Sentence]) -> list[tuple[str, ...]]:
        """Viterbi label sequences, one tuple of label strings per sentence."""
        corpus, buckets = self._decode(sentences, packed.viterbi)
        return [tuple(self.labels[j] for j in row) for row in features.in_corpus_order(corpus, buckets)]

    def predict_kbest(self, sentences: Sequence[Sentence], k: int) -> list[list[tuple[tuple[str, ...], float]]]:
        """Per sentence, up to `k` `(labels, log-probability)`, best first."""
        corpus, buckets = self._decode(sentences, packed.kbest, check_int("k", k))
        paths = features.in_corpus_order(corpus, [labels for _, labels in buckets], time_axis=2)
        scores = features.in_corpus_order(corpus, [scores for scores, _ in buckets], time_axis=None)
        return [
            [
                (tuple(self.labels[j] for j in path), float(score))
                for path, score in zip(rows, values)
                if np.isfinite(score)
            ]
            for rows, values in zip(paths, scores)
        ]

    def predict_marginals(self, sentences: Sequence[Sentence]) -> list[np.ndarray]:
        """Per sentence, `P(y_t = labels[j] | x)` as `[T, L]` (`self.labels` order)."""
        return features.in_corpus_order(*self._decode(sentences, packed.marginals))

    def evaluate(self, sentences: Sequence[Sentence]) -> dict:
        """Token accuracy and (for IOB labels) conlleval entity precision, recall and F1."""
        predicted = self.predict(sentences)
        gold = [s.labels for s in sentences]
        scores = metrics.entity_scores(gold, predicted)
        return {
            "token_accuracy": metrics.token_accuracy(gold, predicted),
            "precision": scores.precision,
            "recall": scores.recall,
            "f1": scores.f1,
        }

    # -- persistence --------------------------------------------------------

    def save(self, path) -> None:
        """Write the tagger to `path` atomically (`lossfns.model_file`)."""
        model_file.save(path, self.saved())

    @classmethod
    def load(cls, path) -> Tagger:
        """Read a tagger written by `save` (weights bit-identical); a damaged
        or foreign file raises `checkpoint.ModelFileError` naming it."""
        return cls.from_saved(model_file.load(path))

    @classmethod
    def from_saved(cls, saved: model_file.SavedModel, **settings) -> Tagger:
        """A tagger of a `model_file.SavedModel` (`model_file.load`,
        `model_file.from_bytes`), with the other constructor `settings`."""
        tagger = cls(saved.features, num_buckets=saved.num_buckets, **settings)
        tagger.labels, tagger.index, tagger.model = saved.labels, saved.index, saved.model
        return tagger

    def saved(self) -> model_file.SavedModel:
        """What `save` writes (`model_file.to_bytes` gives its bytes)."""
        model, index = self._require_model()
        return model_file.SavedModel(self.labels, self.extractor, index, model, self.num_buckets)
