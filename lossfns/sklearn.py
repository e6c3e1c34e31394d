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
import inspect
import itertools
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import crfsuite_model, metrics, model_file
from .crfsuite_tagger import CrfsuiteTagger
from .features.corpus import in_corpus_order
from .features.dicts import flatten_corpus
from .models import packed
from .tagger import Tagger
from .validation import check_int, check_scalar

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


class _Estimator:
    """scikit-learn's estimator protocol (`get_params`, `set_params`, tags, a
    repr of the changed settings) without importing scikit-learn: its imports
    take about 1.5 s of every process, one that only fits or predicts included.
    `clone`, the searches and pipelines find what they need here; the tags are
    `BaseEstimator`'s own, asked for only by scikit-learn's code."""

    @classmethod
    def _get_param_names(cls) -> list:
        """The constructor's setting names, sorted (as scikit-learn lists them)."""
        return sorted(name for name in inspect.signature(cls.__init__).parameters if name != "self")

    def get_params(self, deep=True) -> dict:
        """`{setting: value}` of the constructor's settings (`deep` is moot: none is an estimator)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params):
        """Set constructor settings by name; returns `self`."""
        names = self._get_param_names()
        for name, value in params.items():
            if name not in names:
                raise ValueError(f"Invalid parameter {name!r} for estimator {self}. Valid parameters are: {names!r}.")
            setattr(self, name, value)
        return self

    def __sklearn_tags__(self):
        from sklearn.base import BaseEstimator

        return BaseEstimator.__sklearn_tags__(self)  # pyright: ignore[reportArgumentType]  # it reads nothing of self

    def __repr__(self) -> str:
        defaults = inspect.signature(type(self).__init__).parameters
        changed = (
            f"{name}={value!r}"
            for name, value in self.get_params().items()
            if not (
                value is defaults[name].default
                or (type(value) is type(defaults[name].default) and value == defaults[name].default)
            )
        )
        return f"{type(self).__name__}({', '.join(changed)})"


class CRF(_Estimator):
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
        from .optimizers import crfsuite_elastic_net  # optax: imported by fit, not by predict

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
            min_count=1,  # min_freq filters (attribute, label) features, as CRFsuite: `crfsuite_training.zero_model`
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
        from . import crfsuite_training  # optax and the trainers: imported by fit, not by predict

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
        model = crfsuite_training.zero_model(tagger, corpus, index, ids, len(labels), self._min_freq())
        featgen_seconds = time.perf_counter() - start
        crfsuite_training.train(
            tagger,
            algorithm,
            corpus,
            index,
            labels,
            ids,
            model,
            epsilon=self._setting("epsilon") if algorithm == "lbfgs" else None,
            settings={} if algorithm == "lbfgs" else self._calibration(algorithm),
            show=self._report if self.verbose else None,
        )
        crfsuite_training.check_trained(tagger, corpus, algorithm)
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
        state = dict(self.__dict__)
        if state.get("_crfsuite_tagger") is not None:
            state["_crfsuite_tagger"] = model_file.to_bytes(state["_crfsuite_tagger"].tagger.saved())
        return state

    def __setstate__(self, state):
        if isinstance(state.get("_crfsuite_tagger"), bytes):
            tagger = CrfsuiteTagger()
            tagger.open_inmemory(state["_crfsuite_tagger"])
            state = dict(state, _crfsuite_tagger=tagger)
        self.__dict__.update(state)
