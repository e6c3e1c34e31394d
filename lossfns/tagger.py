"""`Tagger`: train, apply, evaluate, save and load a sparse-feature CRF tagger.

    tagger = Tagger("crfsuite_ner", **crfsuite_elastic_net(c1=0.1, c2=0.1), max_iterations=100)
    tagger.fit(corpora.conll2002("esp.train"))
    tagger.evaluate(corpora.conll2002("esp.testb"))   # {"token_accuracy": ..., "f1": ...}

A facade over pieces that each stand alone: features (`features.corpus`:
extraction, indexing, packing) -> model (`models.LinearChainModel`, which
owns its masked parameterisation) -> the training driver
(`optimizers.train`: progress, checkpoint and resume, a stop rule on the
objective trace, a device mesh) -> decoding (`models.packed`: Viterbi,
k-best, marginals, label-scheme constraints) -> a model file (`model_file`).

The objective is `sum_i loss_i + l1 ||w||_1 + l2 / 2 ||w||^2 (+ regularizer(w))`,
a sum over sentences, as in CRFsuite, CRF++ and Wapiti, trained full-batch
by OWL-QN when `l1 > 0`, else `optax.lbfgs` or the optax transformation
given (`optimizers.elastic_net_training`). It stops like CRFsuite: after
`max_iterations`, or when the objective improved by less than `tol`
(relative) over the last `period` iterations.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import metrics, model_file, parallel
from .corpora import Sentence
from .lattices.constraints import allowed_transitions, scheme_of
from .features.corpus import (build_index, check_sentences, corpus_arrays, encode, extractor, extractor_spec,
                              in_corpus_order, label_ids, pack_shards, padded_buckets)
from .features.index import (FeatureIndex, PackedCorpus, observed_label_pairs, observed_label_triples,
                             observed_transitions, pack, pack_rows)
from .models import packed
from .models.linear_chain import LinearChainModel
from .models.packed import TrainingData, weights_objective
from .optimizers import (Status, check_elastic_net, crfsuite_elastic_net, elastic_net_training,
                         relative_improvement_below, train)
from .optimizers.minimize import check_callable, check_scalar
from .validation import check_float_dtype, check_int

__all__ = ["Tagger", "TrainingData", "crfsuite_elastic_net"]


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
    """

    def __init__(self, features="crfsuite_ner", *, loss: Optional[Callable] = None,
                 l1: float = 0.0, l2: float = 0.0, regularizer: Optional[Callable] = None,
                 optimizer: Optional[optax.GradientTransformation] = None, max_iterations: int = 100,
                 tol: float = 1e-5, period: int = 10, memory_size: int = 6, min_count: int = 1,
                 hash_size: Optional[int] = None, observed_pairs_only: bool = True,
                 observed_transitions_only: bool = False, num_buckets: int = 6,
                 dtype=jnp.float32, progress: Optional[bool] = None, iob_constraints: Optional[bool] = None):
        check_elastic_net(l1, l2, optimizer, regularizer)
        check_scalar("tol", tol, 0)
        if loss is not None:
            check_callable("loss", loss)
        for name, value in (("max_iterations", max_iterations), ("period", period), ("memory_size", memory_size),
                            ("min_count", min_count), ("hash_size", hash_size), ("num_buckets", num_buckets)):
            if value is not None:
                check_int(name, value)
        check_float_dtype("dtype", dtype)
        self.extractor = extractor(features)
        self.loss, self.l1, self.l2, self.regularizer, self.optimizer = loss, float(l1), float(l2), regularizer, optimizer
        self.max_iterations, self.tol, self.period, self.memory_size = max_iterations, tol, period, memory_size
        self.min_count, self.hash_size, self.observed_pairs_only = min_count, hash_size, observed_pairs_only
        self.observed_transitions_only = observed_transitions_only
        self.num_buckets, self.dtype, self.progress, self.iob_constraints = num_buckets, dtype, progress, iob_constraints
        self.model: Optional[LinearChainModel] = None
        self.labels: tuple[str, ...] = ()
        self.index: Optional[FeatureIndex] = None
        self.history: list[float] = []  # the objective after each iteration
        self.training_seconds = 0.0  # the driver's compilation and iterations
        self.status: Optional[Status] = None  # why the last fit stopped

    # -- training -----------------------------------------------------------

    def fit(self, sentences: Sequence[Sentence], *, checkpoint_dir=None, checkpoint_every: int = 10,
            callback: Optional[Callable] = None, mesh: Optional[jax.sharding.Mesh] = None) -> "Tagger":
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
        index = build_index(extracted, min_count=self.min_count, hash_size=self.hash_size)
        encoded, ids = [index.encode(f) for f in extracted], label_ids(sentences, labels)
        shards = None if mesh is None else pack_shards(encoded, ids, index.num_unigram, parallel.num_shards(mesh))
        return self._train(self._pack(encoded, ids), labels, index, shards, mesh, checkpoint_dir, checkpoint_every,
                           callback)

    def fit_packed(self, packed_corpus: PackedCorpus, labels: Sequence[str], index: FeatureIndex, *,
                   checkpoint_dir=None, checkpoint_every: int = 10, callback: Optional[Callable] = None) -> "Tagger":
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
        self.model = self._initial_model(padded_buckets(packed_corpus))
        if self.observed_transitions_only:
            self.model = self.model.with_transition_mask(observed_transitions(packed_corpus, len(labels)))
        structure = self.model.structure()
        if shards is None:
            data = TrainingData(corpus_arrays(packed_corpus, self.index.num_unigram), structure)
        else:  # one copy of the masks per block
            count = jax.tree_util.tree_leaves(shards)[0].shape[0]
            data = TrainingData(shards, jax.tree_util.tree_map(
                lambda x: np.broadcast_to(np.asarray(x), (count,) + np.shape(x)), structure))
        training = elastic_net_training(self.l1, self.l2, self.optimizer, memory_size=self.memory_size,
                                        regularizer=self.regularizer)
        objective = self.objective() if mesh is None else parallel.single_block(self.objective())
        result = train(objective, self.model.weights(), training.optimizer, data, max_steps=self.max_iterations,
                       stop=relative_improvement_below(self.tol, self.period), regularizer=training.regularizer,
                       penalty=training.penalty, mesh=mesh, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                       settings=self._settings(), callback=callback, description="Tagger.fit",
                       progress=self.max_iterations > 20 if self.progress is None else self.progress)
        trace = np.asarray(result.trace)[: int(result.num_steps)]
        self.history = [float(value) for value in trace if np.isfinite(value)]
        self.status, self.training_seconds = Status(int(result.status)), result.compile_seconds + result.run_seconds
        weights = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x)), result.params)  # off the mesh
        self.model = self.model.with_weights(weights, self.model.structure())
        return self

    def _initial_model(self, batches) -> LinearChainModel:
        K, K2, L = self.index.num_unigram, self.index.num_pair, len(self.labels)
        mask = observed_label_pairs(batches, K, L) if self.observed_pairs_only else None
        model = LinearChainModel.zeros(K, L, K2, emission_mask=mask, dtype=self.dtype)
        if self.observed_pairs_only and K2:
            # Pair weights only for the triples seen: on few label pairs the
            # model trains on the sparse form (Lavergne 4.1).
            model = model.with_pair_mask(observed_label_triples(batches, K2, L))
        return model

    def training_data(self, sentences: Sequence[Sentence]) -> TrainingData:
        """Labelled `sentences` as `objective()` reads them, through the fitted
        index, labels and masks (e.g. to time a gradient: `benchmarks`)."""
        self._require_model()
        check_sentences(sentences)
        packed_corpus = self._pack(encode(self.index, self.extractor, sentences), label_ids(sentences, self.labels))
        return TrainingData(corpus_arrays(packed_corpus, self.index.num_unigram), self.model.structure())

    def _pack(self, encoded, ids):
        """Rows of back-to-back sentences for the default log-loss, else length buckets."""
        return pack_rows(encoded, ids) if self.loss is None else pack(encoded, ids, self.num_buckets)

    def objective(self) -> Callable:
        """`(ChainWeights, TrainingData) -> []`: the loss summed over the
        sentences, penalties apart (`models.weights_objective`)."""
        return weights_objective(self.model, self.loss)

    def _settings(self) -> list:
        """What a checkpoint must have been written with, besides the data."""
        names = ("labels", "l1", "l2", "max_iterations", "tol", "period", "memory_size", "min_count", "hash_size",
                 "observed_pairs_only", "observed_transitions_only", "num_buckets", "loss", "optimizer", "regularizer")
        return [getattr(self, name) for name in names] + [extractor_spec(self.extractor), str(jnp.dtype(self.dtype))]

    # -- inference ----------------------------------------------------------

    def _require_model(self):
        if self.model is None:
            raise ValueError("the tagger has no model yet: call fit() or Tagger.load() first")

    def _decode(self, sentences, decode: Callable, *arguments):
        """`(packed corpus, per-bucket results)` of `decode_packed` for unlabelled `sentences`."""
        check_sentences(sentences, labelled=False)
        self._require_model()
        corpus = pack(encode(self.index, self.extractor, sentences), None, self.num_buckets)
        return corpus, self.decode_packed(corpus, decode, *arguments)

    def decode_packed(self, corpus: PackedCorpus, decode: Callable, *arguments) -> tuple:
        """`decode(model, arrays, *arguments, moves)` per length bucket of a
        corpus packed by the caller (`features.pack`, or
        `AttributeCorpus.pack`) with this tagger's index (`moves`: the
        label scheme's allowed transitions, or None; see `iob_constraints`),
        e.g. `decode=models.packed.viterbi`; `in_corpus_order` puts the
        results back in corpus order."""
        self._require_model()
        arrays = jax.tree_util.tree_map(jnp.asarray, corpus_arrays(corpus, self.index.num_unigram))
        scheme = scheme_of(self.labels)
        constrained = scheme is not None if self.iob_constraints is None else self.iob_constraints
        moves = allowed_transitions(self.labels, scheme or "IOB2") if constrained else None
        return decode(self.model, arrays, *arguments, moves)

    def predict(self, sentences: Sequence[Sentence]) -> list[tuple[str, ...]]:
        """Viterbi label sequences, one tuple of label strings per sentence."""
        corpus, buckets = self._decode(sentences, packed.viterbi)
        return [tuple(self.labels[j] for j in row) for row in in_corpus_order(corpus, buckets)]

    def predict_kbest(self, sentences: Sequence[Sentence], k: int) -> list[list[tuple[tuple[str, ...], float]]]:
        """Per sentence, up to `k` `(labels, log-probability)`, best first."""
        corpus, buckets = self._decode(sentences, packed.kbest, check_int("k", k))
        paths = in_corpus_order(corpus, [labels for _, labels in buckets], time_axis=2)
        scores = in_corpus_order(corpus, [scores for scores, _ in buckets], time_axis=None)
        return [[(tuple(self.labels[j] for j in path), float(score)) for path, score in zip(rows, values)
                 if np.isfinite(score)] for rows, values in zip(paths, scores)]

    def predict_marginals(self, sentences: Sequence[Sentence]) -> list[np.ndarray]:
        """Per sentence, `P(y_t = labels[j] | x)` as `[T, L]` (`self.labels` order)."""
        return in_corpus_order(*self._decode(sentences, packed.marginals))

    def evaluate(self, sentences: Sequence[Sentence]) -> dict:
        """Token accuracy and (for IOB labels) conlleval entity precision, recall and F1."""
        predicted = self.predict(sentences)
        gold = [s.labels for s in sentences]
        scores = metrics.entity_scores(gold, predicted)
        return {"token_accuracy": metrics.token_accuracy(gold, predicted), "precision": scores.precision,
                "recall": scores.recall, "f1": scores.f1}

    # -- persistence --------------------------------------------------------

    def save(self, path) -> None:
        """Write the tagger to `path` atomically (`lossfns.model_file`)."""
        model_file.save(path, self.saved())

    @classmethod
    def load(cls, path) -> "Tagger":
        """Read a tagger written by `save` (weights bit-identical); a damaged
        or foreign file raises `checkpoint.ModelFileError` naming it."""
        return cls.from_saved(model_file.load(path))

    @classmethod
    def from_saved(cls, saved: model_file.SavedModel, **settings) -> "Tagger":
        """A tagger of a `model_file.SavedModel` (`model_file.load`,
        `model_file.from_bytes`), with the other constructor `settings`."""
        tagger = cls(saved.features, num_buckets=saved.num_buckets, **settings)
        tagger.labels, tagger.index, tagger.model = saved.labels, saved.index, saved.model
        return tagger

    def saved(self) -> model_file.SavedModel:
        """What `save` writes (`model_file.to_bytes` gives its bytes)."""
        self._require_model()
        return model_file.SavedModel(self.labels, self.extractor, self.index, self.model, self.num_buckets)
