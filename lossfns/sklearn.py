"""`CRF`: sklearn-crfsuite's estimator, trained and applied by lossfns.

    from lossfns.sklearn import CRF          # was: from sklearn_crfsuite import CRF
    crf = CRF(algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=100, all_possible_transitions=True)
    crf.fit(X_train, y_train).predict(X_test)

The constructor, methods and attributes are `sklearn_crfsuite.CRF`'s, so changing
the import is the migration; the estimator is a thin composition of public pieces
(`features.flatten_corpus`, a `Tagger` with preset `feature_dicts`, `model_file`).
How CRFsuite's settings map, and where lossfns differs: docs/internals.md.
"""

from __future__ import annotations

import fractions
import functools
import itertools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from sklearn.base import BaseEstimator

from . import crfsuite_model, losses, metrics, model_file
from .crfsuite_tagger import CrfsuiteTagger
from .features.corpus import in_corpus_order
from .features.dicts import flatten_corpus
from .features.index import ragged_rows
from .models import ChainWeights, LinearChainModel, packed
from .optimizers import (
    Status,
    crfsuite_elastic_net,
    drive,
    elastic_net_penalty,
    epoch_step_fn,
    init_loop,
    relative_improvement_below,
    sgd_l1,
)
from .optimizers.elastic_net import elastic_net_record
from .optimizers.minimize import float_dtype
from .optimizers.owlqn import OwlqnState, pseudo_gradient
from .tagger import Tagger
from .training import (
    MeanLossBelow,
    SequenceData,
    arow_init,
    arow_params,
    averaged_params,
    calibrate_learning_rate,
    pa_init,
    pa_params,
    perceptron_epoch_fn,
    perceptron_init,
    sparse_arow_epoch_fn,
    sparse_pa_epoch_fn,
    token_stack,
)
from .validation import check_allocation, check_int, check_scalar

__all__ = ["CRF", "LabelScore", "TrainingLog"]

#: What CRFsuite's trainers run when a setting is None (its `-p` defaults), per algorithm.
DEFAULTS = {
    "lbfgs": {
        "c1": 0.0,
        "c2": 1.0,
        "num_memories": 6,
        "epsilon": 1e-5,
        "period": 10,
        "delta": 1e-5,
        "max_iterations": 1000,
    },
    "l2sgd": {
        "c2": 1.0,
        "max_iterations": 1000,
        "period": 10,
        "delta": 1e-6,
        "calibration_eta": 0.1,
        "calibration_rate": 2.0,
        "calibration_samples": 1000,
        "calibration_candidates": 10,
        "calibration_max_trials": 20,
    },
    "ap": {"max_iterations": 100, "epsilon": 0.0},
    "pa": {"pa_type": 1, "c": 1.0, "error_sensitive": True, "averaging": True, "max_iterations": 100, "epsilon": 0.0},
    "arow": {"variance": 1.0, "gamma": 1.0, "max_iterations": 100, "epsilon": 0.0},
}
#: Numeric settings `(name, lower bound, open bound)`, checked in these names before any work.
_NUMBER_SETTINGS = (
    ("c1", 0, False),
    ("c2", 0, False),
    ("delta", 0, False),
    ("epsilon", 0, False),
    ("calibration_eta", 0, True),
    ("calibration_rate", 1, True),
    ("c", 0, True),
    ("variance", 0, True),
    ("gamma", 0, True),
)
#: Integer settings (>= 1), likewise.
_INTEGER_SETTINGS = (
    "max_iterations",
    "num_memories",
    "period",
    "calibration_samples",
    "calibration_candidates",
    "calibration_max_trials",
)
#: Every setting of CRFsuite's trainers; each algorithm takes those of `DEFAULTS` and refuses the others unless None.
TRAINER_SETTINGS = (
    "c1",
    "c2",
    "num_memories",
    "epsilon",
    "period",
    "delta",
    "linesearch",
    "max_linesearch",
    "calibration_eta",
    "calibration_rate",
    "calibration_samples",
    "calibration_candidates",
    "calibration_max_trials",
    "pa_type",
    "c",
    "error_sensitive",
    "averaging",
    "variance",
    "gamma",
    "trainer_cls",
)
#: Accepted by lbfgs and not applied (CRFsuite's line search choice).
LBFGS_ACCEPTED = ("linesearch", "max_linesearch")
#: lbfgs trains on rows of this many positions, longer sentences in a second bucket (`features.pack_rows`): the
#: scan over a row is sequential, so short rows train faster (CoNLL-2002 Spanish, whose longest sentence has 1238
#: tokens: 0.13 s per gradient against 0.19 s with every row that wide).
ROW_WIDTH = 128


class LabelScore(NamedTuple):
    """One label's scores on the development set, as pycrfsuite's log
    parser gives them: `match` (tokens of the label predicted right),
    `model` (tokens predicted as it), `ref` (tokens of it in `y_dev`),
    `precision`, `recall`, `f1` (None for a label neither in `y_dev` nor
    predicted)."""

    match: int
    model: int
    ref: int
    precision: float | None
    recall: float | None
    f1: float | None


class TrainingLog(NamedTuple):
    """What `CRF.training_log_` holds: the fields of sklearn-crfsuite's
    (pycrfsuite's `TrainLogParser`, which reads CRFsuite's log) that lossfns
    computes, with the same names and meanings, recorded in the compiled
    training loop (no extra pass over the data).

    iterations: one dict per iteration with CRFsuite's keys: `num` (1, 2,
      ...); `loss` (lbfgs, l2sgd: the objective after it, penalties
      included; pa, arow: the epoch's summed cost, as CRFsuite; ap: the
      sentences decoded with a mistake in the epoch, where CRFsuite sums
      each sentence's fraction of wrong labels); `feature_norm` (`||w||`
      after it, of the model's weights: the averaged ones for ap; for pa,
      as CRFsuite, of the current weights, not the averaged ones);
      `error_norm` (lbfgs: the norm of the objective's gradient, with `c1 >
      0` OWL-QN's pseudo-gradient, as liblbfgs; None for the others);
      `active_features` (the model's non-zero weights); `linesearch_trials`,
      `linesearch_step` (lbfgs: the objective evaluations of its line
      search and the step it accepted along the search direction; L-BFGS,
      `c1 = 0`, is optax's, whose first direction has unit length, so its
      first step reads 1 where CRFsuite's reads `1 / ||g||`; None for the
      others); `time` (the iteration's seconds, compilation apart); and
      `scores` ({} except as below). With `X_dev`, every iteration also has
      `avg_precision`, `avg_recall`, `avg_f1`, `item_accuracy`,
      `item_accuracy_float`, `instance_accuracy`, `instance_accuracy_float`:
      CRFsuite's evaluation (`scores` {label: `LabelScore`}, macro averages
      over the model's labels, token and sentence accuracies as Fractions
      and floats, unrounded) of the final model, at the last iteration
      only; the earlier iterations have None there (CRFsuite decodes the
      development set after every iteration; lossfns decodes it once).
    status: why training stopped (a `optimizers.Status` name).
    seconds: compilation and iterations (also `training_seconds`).
    dev: the token accuracy on `X_dev` (`item_accuracy_float`), or None.
    featgen_num_features: the weights the model may use, CRFsuite's
      "Number of features" ((attribute, label) pairs and transitions).
    featgen_seconds: reading `X` and building them.
    storing_seconds: writing `model_filename`, or None.
    featgen_percent: 100 (pycrfsuite's progress counter, at its end).
    last_iteration: the last of `iterations` ({} when there is none).
    """

    iterations: list
    status: str
    seconds: float
    dev: float | None = None
    featgen_num_features: int | None = None
    featgen_seconds: float | None = None
    storing_seconds: float | None = None

    @property
    def last_iteration(self) -> dict:
        return self.iterations[-1] if self.iterations else {}

    @property
    def training_seconds(self) -> float:
        return self.seconds

    @property
    def featgen_percent(self) -> int:
        return 100


#: Per-iteration values recorded in the training loop, in CRFsuite's log order (None where an algorithm has none).
_RECORDED = ("feature_norm", "error_norm", "active_features", "linesearch_trials", "linesearch_step")
#: The development-set keys of an iteration (CRFsuite's evaluation).
_DEV_KEYS = (
    "avg_precision",
    "avg_recall",
    "avg_f1",
    "item_accuracy",
    "item_accuracy_float",
    "instance_accuracy",
    "instance_accuracy_float",
)


def _iterations(records: dict, dev: dict | None) -> list[dict]:
    """`TrainingLog.iterations` from a Tagger's `iteration_records` (the
    steps with a finite objective) and the development set's evaluation."""
    objective, seconds = records["objective"], records["seconds"]
    steps = np.flatnonzero(np.isfinite(objective))
    iterations = []
    for step in steps.tolist():
        iteration = {"num": step + 1, "scores": {}, "loss": float(objective[step])}
        for name in _RECORDED:
            iteration[name] = records[name][step].item() if name in records else None
        iteration["time"] = float(seconds[step]) if seconds is not None and np.isfinite(seconds[step]) else None
        if dev is not None:
            iteration.update(dict.fromkeys(_DEV_KEYS))
        iterations.append(iteration)
    if dev is not None and iterations:
        iterations[-1].update(dev)
    return iterations


def _dev_evaluation(labels: Sequence[str], gold: list, predicted: list) -> dict:
    """CRFsuite's evaluation of `predicted` against `gold` (label sequences)
    over the model's `labels` (crfsuite.c, `crfsuite_evaluation_*`), as
    pycrfsuite's log parser reads it: per label `LabelScore` (a label not in
    `gold` is `(0, 0, 0, None, None, None)` when never predicted, and left
    out when predicted, as the parser reads CRFsuite's line for it); macro
    precision, recall and F1 summed over the labels in `gold`, divided by
    all labels; token and sentence accuracies."""
    lookup = {label: i for i, label in enumerate(labels)}
    unknown = len(labels)  # gold labels the model does not know
    reference = np.fromiter((lookup.get(a, unknown) for a in itertools.chain.from_iterable(gold)), np.int64)
    model = np.fromiter((lookup[a] for a in itertools.chain.from_iterable(predicted)), np.int64, len(reference))
    right = reference == model
    match = np.bincount(reference[right], minlength=unknown + 1)
    made = np.bincount(model, minlength=unknown + 1)
    ref = np.bincount(reference, minlength=unknown + 1)
    scores, sums = {}, np.zeros(3)
    for i, label in enumerate(labels):
        if ref[i] == 0:
            if made[i] == 0:
                scores[label] = LabelScore(0, 0, 0, None, None, None)
            continue
        precision = match[i] / made[i] if made[i] else 0.0
        recall = match[i] / ref[i]
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        scores[label] = LabelScore(int(match[i]), int(made[i]), int(ref[i]), float(precision), float(recall), float(f1))
        sums += (precision, recall, f1)
    macro = sums / max(len(labels), 1)
    whole = sum(list(a) == list(b) for a, b in zip(gold, predicted))
    item = fractions.Fraction(int(right.sum()), max(len(reference), 1))
    instance = fractions.Fraction(int(whole), max(len(gold), 1))
    return {
        "scores": scores,
        "avg_precision": float(macro[0]),
        "avg_recall": float(macro[1]),
        "avg_f1": float(macro[2]),
        "item_accuracy": item,
        "item_accuracy_float": float(item),
        "instance_accuracy": instance,
        "instance_accuracy_float": float(instance),
    }


def _listed(value) -> Any:
    """An iterator (a generator of sentences) as a list; anything else as it is."""
    iterable = isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict))
    return list(value) if iterable and not isinstance(value, Sequence) else value


def _label_sequences(y, lengths: np.ndarray, name: str) -> list:
    """`y` as lists of strings, one per token of `lengths` (of `X`, or of
    `X_dev` for `y_dev`), else a clear error."""
    x_name = "X_dev" if name == "y_dev" else "X"
    if isinstance(y, (str, bytes)) or not hasattr(y, "__len__"):
        raise TypeError(f"{name} must be a list of label sequences, got {type(y).__name__}")
    if len(y) != len(lengths):
        raise ValueError(
            f"{name} must hold one label sequence per sentence of {x_name}: {len(lengths)} sentences, "
            f"got {len(y)} label sequences"
        )
    out = []
    for s, (labels, length) in enumerate(zip(y, lengths.tolist())):
        if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
            raise TypeError(f"{name}[{s}] must be a sequence of label strings, got {type(labels).__name__}")
        if len(labels) != length:
            raise ValueError(
                f"{name}[{s}] must have one label per token: {x_name}[{s}] has {length} tokens, "
                f"{name}[{s}] has {len(labels)} labels"
            )
        if not all(isinstance(label, str) for label in labels):
            raise TypeError(f"{name}[{s}] must hold label strings, got {list(labels)!r:.60}")
        out.append(list(labels))
    return out


class CRF(BaseEstimator):
    """sklearn-crfsuite's `CRF` (same constructor, methods and attributes).

    algorithm: "lbfgs" (None: the same), "l2sgd", "ap", "pa" or "arow".
    c1, c2: L1 and L2 weights as CRFsuite defines them (objective
      `-sum log p + c1 ||w||_1 + c2 ||w||^2`); defaults 0 and 1 (l2sgd: c2 only).
    max_iterations: default 1000 (ap: 100); iterations, or epochs for
      l2sgd and ap.
    num_memories, period, delta: L-BFGS history and the stop rule
      (relative improvement below `delta` over `period` iterations; l2sgd
      too, epochs, default delta 1e-6).
    epsilon: lbfgs: stop when `||g|| / max(||w||, 1) <= epsilon` (default
      1e-5); ap: stop when the fraction of sentences with a mistake in an
      epoch is below it (default 0: never).
    calibration_eta, calibration_rate, calibration_samples,
      calibration_candidates, calibration_max_trials: l2sgd's initial
      learning rate search (defaults 0.1, 2, 1000, 10, 20).
    linesearch, max_linesearch: accepted, not applied (see the module docstring).
    min_freq: drop attributes occurring fewer than `min_freq` times.
    all_possible_states: weights for every (attribute, label) pair, not
      only those seen in training.
    all_possible_transitions: weights for every label transition, not only
      those seen in training.
    verbose: print the objective after each iteration.
    model_filename: also write the model file there; an unfitted CRF
      given one predicts with the model it holds.
    keep_tempfiles: accepted (no temporary files are written).
    Settings of another algorithm than the one chosen (`pa_type`, `c`,
    `error_sensitive`, `averaging`, `variance`, `gamma`, `trainer_cls`
    always) must be None.

    Fitted: `classes_` (labels in order of first appearance in `y`),
    `state_features_` {(attribute, label): weight} and
    `transition_features_` {(label_from, label_to): weight} (non-zero
    weights), `size_` (bytes of the model file), `training_log_`
    (`TrainingLog`), `tagger_` (a `crfsuite_tagger.CrfsuiteTagger`: pycrfsuite's `Tagger`
    interface; its `.tagger` is the lossfns `Tagger`), `attributes_`, `num_attributes_`;
    all None before `fit`.
    """

    def __init__(
        self,
        algorithm=None,
        min_freq=None,
        all_possible_states=None,
        all_possible_transitions=None,
        c1=None,
        c2=None,
        max_iterations=None,
        num_memories=None,
        epsilon=None,
        period=None,
        delta=None,
        linesearch=None,
        max_linesearch=None,
        calibration_eta=None,
        calibration_rate=None,
        calibration_samples=None,
        calibration_candidates=None,
        calibration_max_trials=None,
        pa_type=None,
        c=None,
        error_sensitive=None,
        averaging=None,
        variance=None,
        gamma=None,
        verbose=False,
        model_filename=None,
        keep_tempfiles=False,
        trainer_cls=None,
    ):
        self.algorithm = algorithm
        self.min_freq = min_freq
        self.all_possible_states = all_possible_states
        self.all_possible_transitions = all_possible_transitions
        self.c1 = c1
        self.c2 = c2
        self.max_iterations = max_iterations
        self.num_memories = num_memories
        self.epsilon = epsilon
        self.period = period
        self.delta = delta
        self.linesearch = linesearch
        self.max_linesearch = max_linesearch
        self.calibration_eta = calibration_eta
        self.calibration_rate = calibration_rate
        self.calibration_samples = calibration_samples
        self.calibration_candidates = calibration_candidates
        self.calibration_max_trials = calibration_max_trials
        self.pa_type = pa_type
        self.c = c
        self.error_sensitive = error_sensitive
        self.averaging = averaging
        self.variance = variance
        self.gamma = gamma
        self.verbose = verbose
        self.model_filename = model_filename
        self.keep_tempfiles = keep_tempfiles
        self.trainer_cls = trainer_cls

    # -- training -----------------------------------------------------------

    def _algorithm(self) -> str:
        """The training algorithm, or a ValueError naming a refused one or a setting it does not take."""
        algorithm = "lbfgs" if self.algorithm is None else self.algorithm
        if algorithm not in DEFAULTS:
            raise ValueError(f"algorithm must be 'lbfgs' (or None), 'l2sgd', 'ap', 'pa' or 'arow', got {algorithm!r}")
        taken = set(DEFAULTS[algorithm]) | (set(LBFGS_ACCEPTED) if algorithm == "lbfgs" else set())
        for name in TRAINER_SETTINGS:
            if name not in taken and getattr(self, name) is not None:
                raise ValueError(
                    f"{name} is not a setting of algorithm={algorithm!r} (CRFsuite's other trainers "
                    f"take it); it must be None, got {getattr(self, name)!r}"
                )
        return algorithm

    def _setting(self, name: str):
        value = getattr(self, name)
        return DEFAULTS[self._algorithm()][name] if value is None else value

    def _min_freq(self) -> float:
        """`min_freq` (default 0), else a ValueError naming it."""
        min_freq = 0 if self.min_freq is None else self.min_freq
        check_scalar("min_freq", min_freq, 0)
        return float(min_freq)

    def _check_settings(self, algorithm: str) -> None:
        """Each numeric setting of `algorithm` in the estimator's own names
        (CRFsuite's), before the Tagger renames them (`c2` -> `l2`, ...)."""
        for name, low, low_open in _NUMBER_SETTINGS:
            if name in DEFAULTS[algorithm] and getattr(self, name) is not None:
                check_scalar(name, getattr(self, name), low, low_open=low_open)
        for name in _INTEGER_SETTINGS:
            if name in DEFAULTS[algorithm] and getattr(self, name) is not None:
                check_int(name, getattr(self, name))
        self._min_freq()

    def _tagger(self) -> Tagger:
        """A Tagger with these settings, or a ValueError naming the bad one."""
        algorithm = self._algorithm()
        self._check_settings(algorithm)
        if algorithm == "lbfgs":
            penalty = crfsuite_elastic_net(self._setting("c1"), self._setting("c2"))
            check_scalar("epsilon", self._setting("epsilon"), 0)
            training = dict(
                **penalty,
                tol=self._setting("delta"),
                period=self._setting("period"),
                memory_size=self._setting("num_memories"),
            )
        elif algorithm == "l2sgd":
            training = dict(
                l2=crfsuite_elastic_net(0.0, self._setting("c2"))["l2"],
                tol=self._setting("delta"),
                period=self._setting("period"),
            )
        else:
            check_scalar("epsilon", self._setting("epsilon"), 0)
            training = {}
        return Tagger(
            "feature_dicts",
            **training,
            max_iterations=self._setting("max_iterations"),
            min_count=1,  # min_freq filters (attribute, label) features, as CRFsuite: `_crfsuite_model`
            observed_pairs_only=not self.all_possible_states,
            observed_transitions_only=not self.all_possible_transitions,
            progress=False,
            iob_constraints=False,
        )

    def fit(self, X, y, X_dev=None, y_dev=None) -> CRF:
        """Train on `X` (sentences of token feature dicts) and `y` (label
        sequences); `X_dev`, `y_dev`: a held-out set, evaluated after
        training into `training_log_` (its last iteration's `scores`, ...,
        and `dev`, the token accuracy)."""
        start = time.perf_counter()
        tagger = self._tagger()
        X, y, X_dev, y_dev = (_listed(value) for value in (X, y, X_dev, y_dev))  # generators are read once
        corpus = flatten_corpus(X)
        y = _label_sequences(y, corpus.sentence_lengths, "y")
        if (X_dev is None) != (y_dev is None):
            raise ValueError("X_dev and y_dev must be given together")
        if X_dev is not None:  # checked before training, not after it
            y_dev = _label_sequences(y_dev, flatten_corpus(X_dev).sentence_lengths, "y_dev")
        if not y:
            raise ValueError("X must hold at least one sentence, got 0")
        labels = tuple(dict.fromkeys(itertools.chain.from_iterable(y)))
        lookup = {label: i for i, label in enumerate(labels)}
        index = corpus.index(tagger.min_count)
        ids = [[lookup[label] for label in sequence] for sequence in y]
        algorithm = self._algorithm()
        model = _crfsuite_model(tagger, corpus, index, ids, len(labels), self._min_freq())
        featgen_seconds = time.perf_counter() - start
        if algorithm == "lbfgs":
            stop = GradientNormBelow(self._setting("epsilon"), tagger.l1, tagger.l2)
            callback = functools.partial(_after_iteration, self.verbose, stop) if stop.epsilon or self.verbose else None
            tagger.fit_packed(
                corpus.pack_rows(index, ids, width=ROW_WIDTH),
                labels,
                index,
                callback=callback,
                model=model,
                record=elastic_net_record,
            )
        else:
            _fit_sentences(
                tagger,
                algorithm,
                corpus,
                index,
                labels,
                ids,
                self._calibration(algorithm),
                self._report if self.verbose else None,
                model,
            )
        _check_trained(tagger, corpus, algorithm)
        self._crfsuite_tagger = CrfsuiteTagger(tagger)
        storing_seconds = None
        if self.model_filename is not None:  # CRFsuite's format, as sklearn-crfsuite writes it
            start = time.perf_counter()
            crfsuite_model.write(self.model_filename, crfsuite_model.from_saved_model(tagger.saved()))
            storing_seconds = time.perf_counter() - start
        dev = None if X_dev is None else _dev_evaluation(labels, y_dev, self.predict(X_dev))
        self.training_log_ = TrainingLog(
            _iterations(tagger.iteration_records, dev),
            tagger.status.name,
            tagger.training_seconds,
            None if dev is None else dev["item_accuracy_float"],
            model.num_parameters(),
            featgen_seconds,
            storing_seconds,
        )
        return self

    def _calibration(self, algorithm: str) -> dict:
        """The l2sgd learning-rate calibration settings; the other per-sentence
        algorithms' settings (`epsilon`, pa's and arow's own)."""
        if algorithm in ("ap", "pa", "arow"):
            return {name: self._setting(name) for name in DEFAULTS[algorithm]}
        names = (
            "calibration_eta",
            "calibration_rate",
            "calibration_samples",
            "calibration_candidates",
            "calibration_max_trials",
        )
        settings = {name: self._setting(name) for name in names}
        check_scalar("calibration_eta", settings["calibration_eta"], 0, low_open=True)
        check_scalar("calibration_rate", settings["calibration_rate"], 1, low_open=True)
        for name in names[2:]:
            check_int(name, settings[name])
        return settings

    @staticmethod
    def _report(report) -> None:
        print(f"Iteration {report.step}: loss = {report.value:.6f}", flush=True)

    # -- prediction ---------------------------------------------------------

    @property
    def tagger_(self) -> CrfsuiteTagger | None:
        """The model as a `pycrfsuite.Tagger`-like `CrfsuiteTagger` (`.tagger`:
        the lossfns `Tagger`); before `fit`, None, unless `model_filename` names
        a model file (CRFsuite's or lossfns'), which it then opens, as sklearn-crfsuite does."""
        tagger = self.__dict__.get("_crfsuite_tagger")
        if tagger is None and self.model_filename is not None and os.path.exists(self.model_filename):
            tagger = CrfsuiteTagger()
            tagger.open(self.model_filename)
            self._crfsuite_tagger = tagger
        return tagger

    def _fitted(self) -> Tagger:
        """The trained lossfns tagger, else a ValueError."""
        tagger = self.tagger_
        if tagger is None or tagger.tagger is None:
            raise ValueError("this CRF is not fitted yet: call fit() first (or give model_filename, a model file)")
        return tagger.tagger

    @property
    def size_(self) -> int | None:
        """Bytes of the model in CRFsuite's format (`crfsuite_model`); None before `fit`."""
        if self.tagger_ is None:
            return None
        return len(crfsuite_model.to_bytes(crfsuite_model.from_saved_model(self._fitted().saved())))

    @property
    def classes_(self) -> list | None:
        """The labels, in order of first appearance in the training `y`; None before `fit`."""
        return None if self.tagger_ is None else list(self._fitted().labels)

    @property
    def attributes_(self) -> list | None:
        """The attributes the model knows (CRFsuite's attribute dictionary), by id; None before `fit`."""
        tagger = self.tagger_
        return None if tagger is None else list(tagger.info().attributes)

    @property
    def num_attributes_(self) -> int | None:
        """`len(attributes_)`; None before `fit`."""
        attributes = self.attributes_
        return None if attributes is None else len(attributes)

    def _decode(self, X, decode):
        tagger = self._fitted()
        corpus = flatten_corpus(X).pack(tagger.index, None, None)  # pyright: ignore[reportArgumentType]  # fitted
        return in_corpus_order(corpus, tagger.decode_packed(corpus, decode))

    def predict(self, X) -> list:
        """The most likely label sequence of each sentence of `X`, as lists of label strings."""
        labels = self._fitted().labels
        return [[labels[j] for j in path] for path in self._decode(X, packed.viterbi)]

    def predict_single(self, xseq) -> list:
        """`predict([xseq])[0]`."""
        return self.predict([xseq])[0]

    def predict_marginals(self, X) -> list:
        """Per sentence, per token, `{label: P(y_t = label | x)}`."""
        labels = self._fitted().labels
        return [
            [dict(zip(labels, row.tolist())) for row in np.asarray(sentence, np.float64)]
            for sentence in self._decode(X, packed.marginals)
        ]

    def predict_marginals_single(self, xseq) -> list:
        """`predict_marginals([xseq])[0]`."""
        return self.predict_marginals([xseq])[0]

    def score(self, X, y) -> float:
        """Token accuracy over all tokens (sklearn-crfsuite's `flat_accuracy_score`)."""
        predicted = self.predict(X)
        lengths = np.fromiter(map(len, predicted), np.int64, len(predicted))
        return metrics.token_accuracy(_label_sequences(y, lengths, "y"), predicted)

    # -- the model's weights ------------------------------------------------

    @property
    def state_features_(self) -> dict | None:
        """`{(attribute, label): weight}` of the non-zero emission weights; None before `fit`."""
        tagger = self.tagger_
        return None if tagger is None else tagger.info().state_features

    @property
    def transition_features_(self) -> dict | None:
        """`{(label_from, label_to): weight}` of the non-zero transition weights; None before `fit`."""
        tagger = self.tagger_
        return None if tagger is None else tagger.info().transitions

    # -- pickling -----------------------------------------------------------

    def __getstate__(self):
        # The model travels as its model file's bytes (jax arrays and the
        # Tagger's optimizer closures do not pickle).
        state = dict(super().__getstate__())  # a copy: the base may return __dict__ itself
        if state.get("_crfsuite_tagger") is not None:
            state["_crfsuite_tagger"] = model_file.to_bytes(state["_crfsuite_tagger"].tagger.saved())
        return state

    def __setstate__(self, state):
        if isinstance(state.get("_crfsuite_tagger"), bytes):
            tagger = CrfsuiteTagger()
            tagger.open_inmemory(state["_crfsuite_tagger"])
            state = dict(state, _crfsuite_tagger=tagger)
        super().__setstate__(state)


# -- CRFsuite's stop rules and its per-sentence trainers ------------------------


class GradientNormBelow(NamedTuple):
    """CRFsuite's (liblbfgs') `epsilon` test for lbfgs: stop when `||g|| /
    max(||w||, 1) <= epsilon`, `g` the objective's gradient at the current
    weights `w` (with L1, OWL-QN's pseudo-gradient), read from the
    optimizer's state (no extra evaluation); `epsilon = 0` never stops."""

    epsilon: float
    l1: float
    l2: float

    def __call__(self, params, opt_state) -> bool:
        return bool(self.epsilon) and float(_gradient_norm_ratio(params, opt_state, self.l1, self.l2)) <= self.epsilon


@jax.jit  # the penalties traced: a refit with other c1, c2 re-uses it
def _gradient_norm_ratio(params, opt_state, l1, l2) -> jax.Array:
    theta = ravel_pytree(params)[0]
    if isinstance(opt_state, OwlqnState):  # its gradient is the loss's, the elastic net apart
        gradient = pseudo_gradient(theta, ravel_pytree(opt_state.grad)[0] + l2 * theta, l1, jnp.ones_like(theta))
    else:  # optax.lbfgs: the gradient of the whole smooth objective
        gradient = ravel_pytree(optax.tree.get(opt_state, "grad"))[0]
    return jnp.linalg.norm(gradient) / jnp.maximum(jnp.linalg.norm(theta), 1.0)


def _after_iteration(verbose: bool, stop: GradientNormBelow, report) -> bool:
    """The lbfgs driver's callback: print the objective, then CRFsuite's `epsilon` test."""
    if verbose:
        CRF._report(report)
    return stop(*report.inner)


class MistakesBelow(NamedTuple):
    """CRFsuite's averaged-perceptron stop rule, on the trace of mistakes per
    epoch: the fraction of sentences decoded wrongly in the last epoch is
    below `epsilon` (CRFsuite: the mean fraction of wrong labels per
    sentence); `epsilon = 0` never stops, as in CRFsuite."""

    epsilon: float
    num_sentences: int

    def __call__(self, trace, step):
        return trace[step - 1] < self.epsilon * self.num_sentences


def _sentence_loss(structure, pair_support, loss, params, batch) -> jax.Array:
    """`loss` of the model of `params` on sentences `batch` (`SequenceData`), summed."""
    ids, values = batch.inputs
    model = LinearChainModel.from_weights(params, structure, pair_support)
    return jnp.sum(loss(model(ids, None, values), batch.labels, batch.lengths))


class PerceptronEpochs(NamedTuple):
    """`drive`'s `make_step` for the averaged perceptron: one epoch over
    `data = (SequenceData, ChainStructure)` (`training.perceptron_epoch_fn`)."""

    pair_support: tuple | None = None

    def __call__(self, data):
        sentences, structure = data

        def potentials(params, inputs):
            ids, values = inputs
            return LinearChainModel.from_weights(params, structure, self.pair_support)(ids, None, values)

        return perceptron_epoch_fn(potentials, sentences)


_MARGIN = ("pa_type", "c", "error_sensitive", "gamma")  # pa's and arow's settings of their epoch


class OnlineMarginEpochs(NamedTuple):
    """`drive`'s `make_step` for CRFsuite's passive-aggressive (`algorithm`
    "pa": `pa_type`, `c`, `error_sensitive`) and AROW ("arow": `gamma`): one
    shuffled epoch over `data = (TokenStack, weight masks)` on the model's
    dense tables (`training.sparse_pa_epoch_fn`, `sparse_arow_epoch_fn`)."""

    algorithm: str
    max_length: int
    pa_type: int = 1
    c: float = 1.0
    error_sensitive: bool = True
    gamma: float = 1.0

    def __call__(self, data):
        stack, masks = data
        if self.algorithm == "pa":
            return sparse_pa_epoch_fn(
                stack,
                masks,
                max_length=self.max_length,
                pa_type=self.pa_type,
                c=self.c,
                error_sensitive=bool(self.error_sensitive),
            )
        return sparse_arow_epoch_fn(stack, masks, max_length=self.max_length, gamma=self.gamma)


class SgdEpochs(NamedTuple):
    """`drive`'s `make_step` for CRFsuite's l2sgd: one shuffled epoch of
    single-sentence `optimizer` steps over `data = (SequenceData,
    ChainStructure)` (`optimizers.epoch_step_fn`); the recorded objective is
    the log-loss over the corpus plus `penalty`."""

    optimizer: optax.GradientTransformation
    penalty: Callable
    pair_support: tuple | None = None

    def __call__(self, data):
        sentences, structure = data
        fun = functools.partial(_sentence_loss, structure, self.pair_support, losses.sequence_log_loss)
        return epoch_step_fn(fun, self.optimizer, sentences, batch_size=1, penalty=self.penalty)


class SentenceRecord(NamedTuple):
    """`drive`'s `record` for the per-sentence algorithms, after each epoch:
    `active_features`, the non-zero weights of the model it would give (ap:
    the averaged weights; pa: averaged with `averaging`; arow: the mean;
    l2sgd: the current weights), and `feature_norm`, their norm `||w||`, as
    CRFsuite logs it (so for pa the current weights', not the averaged ones')."""

    algorithm: str
    averaging: bool = True

    def __call__(self, inner, data) -> dict:
        if self.algorithm == "ap":
            params = averaged_params(inner)
        elif self.algorithm == "pa":
            params = pa_params(inner, averaging=self.averaging)
        elif self.algorithm == "arow":
            params = arow_params(inner)
        else:  # l2sgd: (params, opt_state, key)
            params = inner[0]
        theta = ravel_pytree(params)[0]
        logged = ravel_pytree(inner.params)[0] if self.algorithm == "pa" else theta  # train_passive_aggressive.c
        return {"feature_norm": jnp.linalg.norm(logged), "active_features": jnp.count_nonzero(theta).astype(jnp.int32)}


def _sentence_data(corpus, index, ids: list) -> SequenceData:
    """The labelled corpus one padded sentence per row: inputs `(ids [S, T, F],
    values [S, T, F] or None)`, labels `[S, T]` (-1 past each length), lengths `[S]`."""
    unigram_ids, values = corpus.token_arrays(index)
    lengths = corpus.sentence_lengths
    # Every sentence is padded to the longest (one example per row, as the loops index them).
    check_allocation(
        "the per-sentence training arrays (sentences, longest sentence, features)",
        (lengths.size, int(lengths.max(initial=0)), unigram_ids.shape[1]),
        np.int32,
        copies=1 if values is None else 3,
    )
    positions = ragged_rows(np.arange(int(lengths.sum())), lengths, -1)
    real = positions[..., None] >= 0
    sentence_ids = np.where(real, unigram_ids[positions], -1).astype(np.int32)
    sentence_values = None if values is None else np.where(real, values[positions], 0.0)
    labels = ragged_rows(np.fromiter(itertools.chain.from_iterable(ids), np.int32), lengths, np.int32(-1))
    inputs = (sentence_ids, sentence_values)
    sentences = SequenceData(inputs, labels, lengths.astype(np.int32))  # pyright: ignore[reportArgumentType]  # numpy until put
    return jax.device_put(sentences)  # device_put: jnp.asarray would compile a copy program per shape


def _crfsuite_model(tagger: Tagger, corpus, index, ids: list, num_labels: int, min_freq: float) -> LinearChainModel:
    """The zero model CRFsuite trains: weights on the (attribute, label) pairs
    whose summed attribute value over the training tokens of that label is at
    least `min_freq` (CRFsuite's feature frequency; every pair when
    `all_possible_states`), on the label transitions seen (unless
    `all_possible_transitions`), and no start weights (CRFsuite has none)."""
    num_features = index.num_unigram
    mask = None
    if tagger.observed_pairs_only:
        token_ids, values = corpus.token_arrays(index)
        labels = np.repeat(np.fromiter(itertools.chain.from_iterable(ids), np.int64), token_ids.shape[1])
        present = token_ids.reshape(-1) >= 0
        cells = token_ids.reshape(-1)[present].astype(np.int64) * num_labels + labels[present]
        weights = None if values is None else values.reshape(-1)[present]
        frequency = np.bincount(cells, weights, minlength=num_features * num_labels)
        seen = np.bincount(cells, minlength=num_features * num_labels) > 0
        mask = (seen & (frequency >= min_freq)).reshape(num_features, num_labels)
    model = LinearChainModel.zeros(num_features, num_labels, emission_mask=mask, dtype=tagger.dtype)
    if tagger.observed_transitions_only:
        moves = np.zeros((num_labels, num_labels), bool)
        for sequence in ids:
            moves[sequence[:-1], sequence[1:]] = True
        model = model.with_transition_mask(moves)
    return model.with_start_mask(False)


def _check_trained(tagger: Tagger, corpus, algorithm: str) -> None:
    """A ValueError (not a model returned as fitted) when training stopped on
    a non-finite objective or a failed line search, or did not move from its
    zero start with feature values of a range that float32 cannot resolve;
    it names the largest feature value, the likely cause."""
    failed = tagger.status in (Status.NON_FINITE_OBJECTIVE, Status.LINE_SEARCH_FAILED)
    largest = int(np.argmax(np.abs(corpus.values))) if corpus.values.size else None
    value = 0.0 if largest is None else float(corpus.values[largest])
    model = tagger.model
    assert model is not None  # trained
    stuck = algorithm != "ap" and model.num_nonzero() == 0 and abs(value) > 1e6
    if not (failed or stuck) or largest is None:
        return
    name = corpus.names[int(corpus.attributes[largest])]
    reason = f"stopped with status {tagger.status.name}" if failed else "did not move from its zero start"
    raise ValueError(
        f"training {reason} after {len(tagger.history)} iterations: the model is untrained. The likely cause "
        f"is a feature value out of float32's reach: attribute {name!r} has value {value:g}, the largest; "
        "scale such values (or drop the attribute) and fit again"
    )


def _fit_sentences(
    tagger: Tagger, algorithm: str, corpus, index, labels: tuple, ids: list, settings: dict, callback, model
) -> None:
    """Train `tagger` by CRFsuite's per-sentence algorithms (`"ap"`, `"pa"`,
    `"arow"`, `"l2sgd"`) on the library's loops (`training.perceptron_epoch_fn`,
    `pa_epoch_fn`, `arow_epoch_fn`, `epoch_step_fn` with `sgd_l1`), run by `optimizers.drive`."""
    total = len(ids)
    if algorithm in ("pa", "arow"):  # sparse updates of the dense tables: only a sentence's wrong positions
        unigram_ids, values = corpus.token_arrays(index)
        values = None if values is None else values.astype(jnp.dtype(tagger.dtype))
        labels_flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32)
        data = (token_stack(unigram_ids, values, labels_flat, corpus.sentence_lengths), model.weight_masks())
        weights = ChainWeights(model.emission, model.transitions, model.start, model.pair_emission)
    else:
        data, weights = (_sentence_data(corpus, index, ids), model.structure()), model.weights()
    if algorithm == "ap":
        make_step, stop = PerceptronEpochs(model.pair_support), MistakesBelow(settings["epsilon"], total)
        inner = perceptron_init(weights)
    elif algorithm in ("pa", "arow"):
        if settings.get("pa_type", 1) not in (0, 1, 2):
            raise ValueError(
                f"pa_type must be 0, 1 or 2 (CRFsuite's passive-aggressive variants), got {settings['pa_type']!r}"
            )
        longest = int(corpus.sentence_lengths.max())
        make_step = OnlineMarginEpochs(algorithm, longest, **{k: v for k, v in settings.items() if k in _MARGIN})
        # CRFsuite's stop rules: pa's mean loss below epsilon, arow's at most epsilon (an epoch without mistakes).
        stop = MeanLossBelow(float(settings["epsilon"]), total, inclusive=algorithm == "arow")
        key = jax.random.PRNGKey(0)  # CRFsuite shuffles every epoch
        inner = pa_init(weights, key) if algorithm == "pa" else arow_init(weights, settings["variance"], key)
    else:
        if not tagger.l2 > 0:
            raise ValueError(
                f"c2 must be > 0 for algorithm='l2sgd' (its learning rate is 1 / (c2 t)), got {tagger.l2 / 2}"
            )
        rate = _calibrated_rate(tagger.l2, weights, data, settings, model.pair_support)
        # CRFsuite's eta_t = 1 / (lambda (t0 + t)), lambda = 2 c2 / N, t0 = 1 / (lambda eta_0), for the
        # per-sentence loss; sgd_l1 steps on N times it (the corpus sum), so its rate is eta_t / N.
        t0 = total / (tagger.l2 * rate)
        optimizer = sgd_l1(lambda count: 1.0 / (tagger.l2 * (t0 + count)), 0.0, tagger.l2)
        make_step = SgdEpochs(optimizer, elastic_net_penalty(0.0, tagger.l2), model.pair_support)
        stop, inner = (
            relative_improvement_below(tagger.tol, tagger.period),
            (weights, optimizer.init(weights), jax.random.PRNGKey(0)),
        )
    loop = init_loop(inner, tagger.max_iterations, float_dtype(weights))
    record = SentenceRecord(algorithm, bool(settings.get("averaging", True)))
    result = drive(make_step, loop, data, stop=stop, callback=callback, progress=False, record=record)
    final = result.loop
    if algorithm == "ap":
        params = averaged_params(final.inner)
    elif algorithm == "pa":
        params = pa_params(final.inner, averaging=bool(settings["averaging"]))
    elif algorithm == "arow":
        params = arow_params(final.inner)
    else:
        params = final.inner[0]
    trace = np.asarray(final.trace)[: int(final.step)]
    structure = model.structure()
    if algorithm in ("pa", "arow"):  # whole tables: the emission weights off the mask are 0
        structure = structure._replace(emission_pairs=None)
    tagger.labels, tagger.index = labels, index
    tagger.model = model.with_weights(params, structure)
    tagger.history = [float(value) for value in trace if np.isfinite(value)]
    tagger.status, tagger.training_seconds = Status(int(final.status)), result.compile_seconds + result.run_seconds
    tagger.iteration_records = {"objective": trace, "seconds": result.step_seconds, **(result.records or {})}


def _calibrated_rate(l2: float, weights, data, settings: dict, pair_support) -> float:
    """CRFsuite's l2sgd calibration by `training.calibrate_learning_rate`:
    the initial rate `eta_0` among `calibration_eta` times powers of
    `calibration_rate` (up `calibration_candidates`, then down, at most
    `calibration_max_trials` in all) that does best over one epoch of
    `calibration_samples` sentences."""
    sentences, structure = data
    eta, factor = settings["calibration_eta"], settings["calibration_rate"]
    up = min(settings["calibration_candidates"], settings["calibration_max_trials"])
    down = max(settings["calibration_max_trials"] - up, 0)
    candidates = [eta * factor**k for k in range(up)] + [eta / factor**k for k in range(1, down + 1)]
    fun = functools.partial(_sentence_loss, structure, pair_support, losses.sequence_log_loss)
    total = len(sentences.lengths)
    rate = calibrate_learning_rate(
        fun,
        weights,
        sentences,
        0.0,
        key=jax.random.PRNGKey(1),
        l2=l2,
        sample_size=settings["calibration_samples"],
        candidates=candidates,
    )
    return float(rate) * total
