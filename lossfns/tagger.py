"""`Tagger`: train, apply, evaluate, save and load a sparse-feature CRF tagger.

    tagger = Tagger("crfsuite_ner", **crfsuite_elastic_net(c1=0.1, c2=0.1), max_iterations=100)
    tagger.fit(corpora.conll2002("esp.train"))
    tagger.evaluate(corpora.conll2002("esp.testb"))   # {"token_accuracy": ..., "f1": ...}

A facade: `features` extract, index and pack, `training.train_linear_chain`
trains, `models.packed` decodes and `model_file` saves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from . import compilation_cache, features, metrics, model_file
from .corpora import Sentence
from .features.corpus import Extractor, check_sentences, extractor_spec
from .features.index import FeatureIndex, PackedCorpus
from .lattices.constraints import allowed_transitions, scheme_of
from .models import packed
from .models.linear_chain import LinearChainModel
from .models.packed import TrainingData, weights_objective
from .parallel import num_shards
from .validation import check_int, check_scalar

if TYPE_CHECKING:  # imported where training needs them: optax and the trainers cost labelling 0.1-0.3 s
    import optax

    from .optimizers import Status, crfsuite_elastic_net

__all__ = ["Tagger", "TrainingData", "crfsuite_elastic_net"]

# Constructor fields that do not change the trained weights, or enter a
# checkpoint's settings in another form (the extractor's spec, the dtype's name).
_NOT_SETTINGS = ("features", "dtype", "progress", "iob_constraints")
# Constructor fields that `train_linear_chain` takes by the same name (`max_iterations` is its `max_steps`).
_TRAINING_FIELDS = (  # noqa: SIM905 (a list literal would take ten lines)
    "loss l1 l2 regularizer optimizer memory_size observed_pairs_only observed_transitions_only dtype"
).split()


@dataclasses.dataclass(eq=False)
class Tagger:
    """A linear-chain CRF tagger over sparse observation features.

    Args:
      features: a preset name (`features.presets.PRESETS`), CRF++/Wapiti template text, or a `Preset` / `Templates`.
      loss: `(potentials, labels [B, T], lengths [B]) -> [B]`; default the CRF log-loss on rows of sentences.
      l1, l2: elastic-net weights (`crfsuite_elastic_net(c1, c2)` converts CRFsuite's).
      regularizer: an extra smooth penalty `ChainWeights -> scalar`, or None.
      optimizer: None (OWL-QN when `l1 > 0`, else `optax.lbfgs`) or an optax transformation
        (e.g. `optimizers.sgd_l1`, full batch) of the smooth objective, `l2` included; needs `l1 == 0`.
      max_iterations, tol, period: stop after `max_iterations`, or when the objective improved
        by less than `tol` (relative) over the last `period` iterations (CRFsuite's rule).
      memory_size: L-BFGS / OWL-QN history (CRFsuite's default is 6).
      min_count, hash_size: the feature index (`features.build_index`).
      observed_pairs_only, observed_transitions_only: weights only on the (feature, label) pairs
        and pair triples / the label transitions seen in training, as CRFsuite (`train_linear_chain`).
      num_buckets: padded length buckets (compiled shapes) for custom losses.
      dtype: float dtype of the weights (float64 needs `jax_enable_x64`).
      progress: a tqdm bar while training (default: above 20 iterations).
      iob_constraints: decode only sequences valid under the labels' chunk scheme (IOB2,
        IOBES or BILOU; None: when the labels fit one); training is unconstrained.

    After `fit` (or `load`): `model`, `labels`, `index`, and of the last fit
    `history` (the objective after each iteration), `training_seconds` (the
    driver's compilation and iterations, those of resumed runs included), `status` (why it stopped),
    `iteration_records` ({name: [steps]}: `objective`, `seconds`, what `record=` recorded).
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
    iteration_records: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    status: Status | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self):
        defaults = {f.name: f.default for f in dataclasses.fields(Tagger)}  # they pass: a loaded tagger skips
        if any(getattr(self, name) is not defaults[name] for name in _TRAINING_FIELDS):  # the trainers' import
            from .training.linear_chain import check_training

            check_training(**{name: getattr(self, name) for name in _TRAINING_FIELDS})
        check_int("max_iterations", self.max_iterations)
        check_scalar("tol", self.tol, 0)
        for name in ("period", "min_count", "hash_size", "num_buckets"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name))
        self.extractor = features.extractor(self.features)
        self.l1, self.l2 = float(self.l1), float(self.l2)
        compilation_cache.enable()  # a new process re-uses the programs of earlier ones

    def fit(self, sentences: Sequence[Sentence], *, mesh: jax.sharding.Mesh | None = None, **options) -> Tagger:
        """Index features, build a zero model and train it on `sentences`.

        mesh: a `jax.sharding.Mesh`: the corpus is split into one block per
          device of its data axis (`features.pack_shards`), each device sums
          its block's loss (`parallel`); the weights match one device's.
        options: `checkpoint_dir`, `checkpoint_every`, `callback` (`fit_packed`).
        """
        check_sentences(sentences)
        labels = tuple(sorted({label for s in sentences for label in s.labels}))
        index, encoded, ids = features.index_corpus(
            self.extractor, sentences, labels, min_count=self.min_count, hash_size=self.hash_size
        )
        shards = None if mesh is None else features.pack_shards(encoded, ids, index.num_unigram, num_shards(mesh))
        return self.fit_packed(self._pack(encoded, ids), labels, index, shards=shards, mesh=mesh, **options)

    def fit_packed(self, packed_corpus: PackedCorpus, labels: Sequence[str], index: FeatureIndex, **options) -> Tagger:
        """Train on a labelled corpus indexed and packed by the caller (e.g.
        `features.dicts.AttributeCorpus.pack_rows`; rows for the default
        log-loss, buckets for a custom `loss`), its label ids indexing
        `labels`, its feature ids `index`.

        options (`training.train_linear_chain`):
          checkpoint_dir: save the training state there every `checkpoint_every`
            (default 10) iterations and at the end; a later fit with the same
            directory, corpus and settings resumes and ends bit-identical to an
            uninterrupted run; one of another corpus or settings is refused.
          callback: `optimizers.Report -> bool | None` after each iteration; True stops.
          record: per-iteration values computed in the loop (`optimizers.drive`), into `iteration_records`.
          shards, mesh: data-parallel training over `mesh`'s data axis.
        """
        if packed_corpus.labels is None:
            raise ValueError("packed_corpus must be labelled (packed with labels)")
        self.labels, self.index = tuple(labels), index
        options.setdefault("checkpoint_every", 10)
        from .optimizers import Status, relative_improvement_below
        from .training import train_linear_chain

        result = train_linear_chain(
            packed_corpus,
            len(self.labels),
            index.num_unigram,
            index.num_pair,
            **{name: getattr(self, name) for name in _TRAINING_FIELDS},
            max_steps=self.max_iterations,
            stop=relative_improvement_below(self.tol, self.period),
            settings=self._settings(),
            description="Tagger.fit",
            progress=self.max_iterations > 20 if self.progress is None else self.progress,
            **options,
        )
        self.model, trace = result.params, np.asarray(result.trace)[: int(result.num_steps)]
        self.history = [float(value) for value in trace if np.isfinite(value)]
        self.status, self.training_seconds = Status(int(result.status)), result.compile_seconds + result.run_seconds
        self.iteration_records = {"objective": trace, "seconds": result.step_seconds, **(result.records or {})}
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

    def _require_model(self) -> tuple[LinearChainModel, FeatureIndex]:
        """`(model, index)` of a fitted or loaded tagger."""
        if self.model is None or self.index is None:
            raise ValueError("the tagger has no model yet: call fit() or Tagger.load() first")
        return self.model, self.index

    def _decode(self, sentences, decode: Callable, *arguments):
        """`(packed corpus, per-bucket results)` of `decode_packed` for unlabelled `sentences`."""
        check_sentences(sentences, labelled=False)
        _, index = self._require_model()
        corpus = features.pack_sentences(index, self.extractor, sentences, None, None)
        return corpus, self.decode_packed(corpus, decode, *arguments)

    def decode_packed(self, corpus: PackedCorpus, decode: Callable, *arguments) -> tuple:
        """`decode(model, arrays, *arguments, moves)` (e.g. `models.packed.viterbi`) per length bucket of a
        corpus packed with this tagger's index (`features.pack`, `AttributeCorpus.pack`) by
        `models.packed.decode_by_bucket`; `moves`: see `iob_constraints`."""
        model, _ = self._require_model()
        scheme = scheme_of(self.labels)
        constrained = scheme is not None if self.iob_constraints is None else self.iob_constraints
        moves = allowed_transitions(self.labels, scheme or "IOB2") if constrained else None
        return packed.decode_by_bucket(decode, model, corpus, *arguments, moves=moves)

    def predict(self, sentences: Sequence[Sentence]) -> list[tuple[str, ...]]:
        """Viterbi label sequences, one tuple of label strings per sentence."""
        corpus, buckets = self._decode(sentences, packed.viterbi)
        return [tuple(self.labels[j] for j in row) for row in features.in_corpus_order(corpus, buckets)]

    def predict_kbest(self, sentences: Sequence[Sentence], k: int) -> list[list[tuple[tuple[str, ...], float]]]:
        """Per sentence, up to `k` `(labels, log-probability)`, best first."""
        corpus, buckets = self._decode(sentences, packed.kbest, check_int("k", k))
        paths = features.in_corpus_order(corpus, [labels for _, labels in buckets], time_axis=2)
        scores = features.in_corpus_order(corpus, [scores for scores, _ in buckets], time_axis=None)
        named = [[(tuple(self.labels[j] for j in p), float(v)) for p, v in zip(*best)] for best in zip(paths, scores)]
        return [[(path, score) for path, score in best if np.isfinite(score)] for best in named]

    def predict_marginals(self, sentences: Sequence[Sentence]) -> list[np.ndarray]:
        """Per sentence, `P(y_t = labels[j] | x)` as `[T, L]` (`self.labels` order)."""
        return features.in_corpus_order(*self._decode(sentences, packed.marginals))

    def evaluate(self, sentences: Sequence[Sentence]) -> dict:
        """Token accuracy and (for IOB labels) conlleval entity precision, recall and F1."""
        return metrics.tagging_scores([s.labels for s in sentences], self.predict(sentences))

    def save(self, path) -> None:
        """Write the tagger to `path` atomically (`lossfns.model_file`)."""
        model_file.save(path, self.saved())

    @classmethod
    def load(cls, path) -> Tagger:
        """A tagger written by `save`, bit-identical; a damaged or foreign file raises `checkpoint.ModelFileError`."""
        return cls.from_saved(model_file.load(path))

    @classmethod
    def from_saved(cls, saved: model_file.SavedModel, **settings) -> Tagger:
        """A tagger of a `model_file.SavedModel` (`model_file.load`, `from_bytes`) with other constructor `settings`."""
        tagger = cls(saved.features, num_buckets=saved.num_buckets, **settings)
        tagger.labels, tagger.index, tagger.model = saved.labels, saved.index, saved.model
        return tagger

    def saved(self) -> model_file.SavedModel:
        """What `save` writes (`model_file.to_bytes` gives its bytes)."""
        model, index = self._require_model()
        return model_file.SavedModel(self.labels, self.extractor, index, model, self.num_buckets)


def __getattr__(name: str):
    """`crfsuite_elastic_net`, from the optimizers when first read (they import optax)."""
    if name != "crfsuite_elastic_net":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .optimizers import crfsuite_elastic_net

    return crfsuite_elastic_net
