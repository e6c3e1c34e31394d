"""`CRF`: sklearn-crfsuite's estimator, trained and applied by lossfns.

    from lossfns.sklearn import CRF          # was: from sklearn_crfsuite import CRF
    crf = CRF(algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=100, all_possible_transitions=True)
    crf.fit(X_train, y_train).predict(X_test)

The constructor, methods and attributes are `sklearn_crfsuite.CRF`'s, so
changing the import is the migration. `X` is a list of sentences, each a
list of token feature dicts read by python-crfsuite's rules
(`features.dicts`: strings, numbers, bools, nested dicts and lists); `y` a
list of label sequences. The estimator is a thin composition of public
pieces: `features.flatten_corpus` reads `X` vectorised, its `pack_rows`
packs the training rows, and a `Tagger` (preset `feature_dicts`) trains
them (`Tagger.fit_packed`), decodes (`Tagger.decode_packed`) and writes
the model file (`model_file.to_bytes`: `size_`, pickling).

CRFsuite's settings map onto the Tagger's: `c1`, `c2` through
`crfsuite_elastic_net` (OWL-QN when `c1 > 0`, else L-BFGS), `delta` and
`period` are the stop rule, `num_memories` the L-BFGS history,
`all_possible_states=False` keeps only the (attribute, label) weights seen
in training (CRFsuite's default), `min_freq` drops attributes seen fewer
times. Where lossfns differs it says so: `epsilon` (CRFsuite's
gradient-norm test) is accepted and not applied (the driver's stop rules
read the objective); transitions always cover every label pair
(`all_possible_transitions=False` does not fix unseen ones at 0); the
model also has per-label start weights, which CRFsuite lacks; decoding is
unconstrained, as CRFsuite's.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import NamedTuple

import numpy as np
from sklearn.base import BaseEstimator

from . import metrics, model_file
from .features.corpus import in_corpus_order
from .features.dicts import flatten_corpus
from .models import packed
from .optimizers import crfsuite_elastic_net
from .tagger import Tagger

__all__ = ["CRF", "TrainingLog"]

#: What CRFsuite's trainers run when a setting is None (its `-p` defaults).
LBFGS_DEFAULTS = {"c1": 0.0, "c2": 1.0, "num_memories": 6, "epsilon": 1e-5, "period": 10, "delta": 1e-5,
                  "max_iterations": 1000}
#: CRFsuite's other training algorithms, refused by name.
UNSUPPORTED_ALGORITHMS = ("l2sgd", "ap", "pa", "arow")
#: Settings of CRFsuite's other trainers, refused unless None.
OTHER_TRAINERS_SETTINGS = ("calibration_eta", "calibration_rate", "calibration_samples", "calibration_candidates",
                           "calibration_max_trials", "pa_type", "c", "error_sensitive", "averaging", "variance",
                           "gamma", "trainer_cls")


class TrainingLog(NamedTuple):
    """What `CRF.training_log_` holds: `iterations`, one dict per iteration
    (`num`, `loss`: the objective, penalties included, after it); `status`,
    why training stopped; `seconds`, compilation and iterations; `dev`, the
    token accuracy on `X_dev`/`y_dev` after training (or None)."""

    iterations: list
    status: str
    seconds: float
    dev: float | None = None

    @property
    def last_iteration(self) -> dict:
        return self.iterations[-1] if self.iterations else {}


def _label_sequences(y, lengths: np.ndarray, name: str) -> list:
    """`y` as lists of strings, one per token of `lengths`, else a clear error."""
    if isinstance(y, (str, bytes)) or not hasattr(y, "__len__"):
        raise TypeError(f"{name} must be a list of label sequences, got {type(y).__name__}")
    if len(y) != len(lengths):
        raise ValueError(f"{name} must hold one label sequence per sentence of X: {len(lengths)} sentences, "
                         f"got {len(y)} label sequences")
    out = []
    for s, (labels, length) in enumerate(zip(y, lengths.tolist())):
        if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
            raise TypeError(f"{name}[{s}] must be a sequence of label strings, got {type(labels).__name__}")
        if len(labels) != length:
            raise ValueError(f"{name}[{s}] must have one label per token: X[{s}] has {length} tokens, "
                             f"{name}[{s}] has {len(labels)} labels")
        if not all(isinstance(label, str) for label in labels):
            raise TypeError(f"{name}[{s}] must hold label strings, got {list(labels)!r:.60}")
        out.append(list(labels))
    return out


class CRF(BaseEstimator):
    """sklearn-crfsuite's `CRF` (same constructor, methods and attributes).

    algorithm: "lbfgs" (None: the same); CRFsuite's "l2sgd", "ap", "pa"
      and "arow" are refused.
    c1, c2: L1 and L2 weights as CRFsuite defines them (objective
      `-sum log p + c1 ||w||_1 + c2 ||w||^2`); defaults 0 and 1.
    max_iterations: default 1000 (CRFsuite: unbounded; the stop rule ends
      training first in practice).
    num_memories, period, delta: L-BFGS history and the stop rule
      (relative improvement below `delta` over `period` iterations).
    epsilon, linesearch, max_linesearch: accepted, not applied (see the
      module docstring).
    min_freq: drop attributes occurring fewer than `min_freq` times.
    all_possible_states: weights for every (attribute, label) pair, not
      only those seen in training.
    all_possible_transitions: accepted; every transition has a weight either way.
    verbose: print the objective after each iteration.
    model_filename: also write the model file there; an unfitted CRF
      given one predicts with the model it holds.
    keep_tempfiles: accepted (no temporary files are written).
    The other trainers' settings (`calibration_*`, `pa_type`, `c`,
    `error_sensitive`, `averaging`, `variance`, `gamma`, `trainer_cls`)
    must be None.

    Fitted: `classes_` (labels in order of first appearance in `y`),
    `state_features_` {(attribute, label): weight} and
    `transition_features_` {(label_from, label_to): weight} (non-zero
    weights), `size_` (bytes of the model file), `training_log_`
    (`TrainingLog`), `tagger_` (the `Tagger`).
    """

    def __init__(self, algorithm=None, min_freq=None, all_possible_states=None, all_possible_transitions=None,
                 c1=None, c2=None, max_iterations=None, num_memories=None, epsilon=None, period=None, delta=None,
                 linesearch=None, max_linesearch=None, calibration_eta=None, calibration_rate=None,
                 calibration_samples=None, calibration_candidates=None, calibration_max_trials=None, pa_type=None,
                 c=None, error_sensitive=None, averaging=None, variance=None, gamma=None, verbose=False,
                 model_filename=None, keep_tempfiles=False, trainer_cls=None):
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

    def _setting(self, name: str):
        value = getattr(self, name)
        return LBFGS_DEFAULTS[name] if value is None else value

    def _tagger(self) -> Tagger:
        """A Tagger with these settings, or a ValueError naming the bad one."""
        algorithm = "lbfgs" if self.algorithm is None else self.algorithm
        if algorithm in UNSUPPORTED_ALGORITHMS:
            raise ValueError(f"algorithm={algorithm!r} is not supported by lossfns.sklearn.CRF; use 'lbfgs' "
                             "(OWL-QN when c1 > 0)")
        if algorithm != "lbfgs":
            raise ValueError(f"algorithm must be 'lbfgs' (or None), got {algorithm!r}")
        for name in OTHER_TRAINERS_SETTINGS:
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is a setting of CRFsuite's other trainers; with algorithm='lbfgs' "
                                 f"it must be None, got {getattr(self, name)!r}")
        min_freq = 0 if self.min_freq is None else self.min_freq
        if isinstance(min_freq, bool) or not isinstance(min_freq, (int, float)) or not min_freq >= 0:
            raise ValueError(f"min_freq must be a number >= 0, got {min_freq!r}")
        penalty = crfsuite_elastic_net(self._setting("c1"), self._setting("c2"))
        return Tagger("feature_dicts", **penalty, max_iterations=self._setting("max_iterations"),
                      tol=self._setting("delta"), period=self._setting("period"),
                      memory_size=self._setting("num_memories"), min_count=max(1, math.ceil(min_freq)),
                      observed_pairs_only=not self.all_possible_states, progress=False, iob_constraints=False)

    def fit(self, X, y, X_dev=None, y_dev=None) -> CRF:
        """Train on `X` (sentences of token feature dicts) and `y` (label
        sequences); `X_dev`, `y_dev`: a held-out set, scored (token
        accuracy) into `training_log_.dev` after training."""
        tagger = self._tagger()
        corpus = flatten_corpus(X)
        y = _label_sequences(y, corpus.sentence_lengths, "y")
        if (X_dev is None) != (y_dev is None):
            raise ValueError("X_dev and y_dev must be given together")
        if not y:
            raise ValueError("X must hold at least one sentence, got 0")
        labels = tuple(dict.fromkeys(itertools.chain.from_iterable(y)))
        lookup = {label: i for i, label in enumerate(labels)}
        index = corpus.index(tagger.min_count)
        rows = corpus.pack_rows(index, [[lookup[label] for label in sequence] for sequence in y])
        tagger.fit_packed(rows, labels, index, callback=self._report if self.verbose else None)
        self.tagger_ = tagger
        if self.model_filename is not None:
            tagger.save(self.model_filename)
        dev = None if X_dev is None else self.score(X_dev, y_dev)
        self.training_log_ = TrainingLog([{"num": i + 1, "loss": loss} for i, loss in enumerate(tagger.history)],
                                         tagger.status.name, tagger.training_seconds, dev)
        return self

    @staticmethod
    def _report(report) -> None:
        print(f"Iteration {report.step}: loss = {report.value:.6f}", flush=True)

    # -- prediction ---------------------------------------------------------

    def _fitted(self) -> Tagger:
        """The trained tagger; unfitted, the model file `model_filename`
        names (as sklearn-crfsuite opens it), else a ValueError."""
        tagger = getattr(self, "tagger_", None)
        if tagger is None and self.model_filename is not None and os.path.exists(self.model_filename):
            tagger = self.tagger_ = Tagger.from_saved(model_file.load(self.model_filename), iob_constraints=False)
        if tagger is None:
            raise ValueError("this CRF is not fitted yet: call fit() first (or give model_filename, a model file)")
        return tagger

    @property
    def size_(self) -> int:
        """Bytes of the model file (`model_file.to_bytes`)."""
        return len(model_file.to_bytes(self._fitted().saved()))

    @property
    def classes_(self) -> list:
        """The labels, in order of first appearance in the training `y`."""
        return list(self._fitted().labels)

    def _decode(self, X, decode):
        tagger = self._fitted()
        corpus = flatten_corpus(X).pack(tagger.index, None, tagger.num_buckets)  # pyright: ignore[reportArgumentType]  # fitted
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
        return [[dict(zip(labels, row.tolist())) for row in np.asarray(sentence, np.float64)]
                for sentence in self._decode(X, packed.marginals)]

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
    def state_features_(self) -> dict:
        """`{(attribute, label): weight}` of the non-zero emission weights."""
        tagger = self._fitted()
        emission = np.asarray(tagger.model.emission)
        unigram = tagger.index.unigram
        assert unigram is not None  # string tables: sklearn's CRF does not hash
        names = sorted(unigram, key=unigram.__getitem__)
        rows, columns = np.nonzero(emission)
        return {(names[i], tagger.labels[j]): float(emission[i, j]) for i, j in zip(rows.tolist(), columns.tolist())}

    @property
    def transition_features_(self) -> dict:
        """`{(label_from, label_to): weight}` of the non-zero transition weights."""
        tagger = self._fitted()
        transitions = np.asarray(tagger.model.transitions)
        rows, columns = np.nonzero(transitions)
        return {(tagger.labels[i], tagger.labels[j]): float(transitions[i, j])
                for i, j in zip(rows.tolist(), columns.tolist())}

    # -- pickling -----------------------------------------------------------

    def __getstate__(self):
        # The model travels as its model file's bytes (jax arrays and the
        # Tagger's optimizer closures do not pickle).
        state = dict(super().__getstate__())  # a copy: the base may return __dict__ itself
        if state.get("tagger_") is not None:
            state["tagger_"] = model_file.to_bytes(state["tagger_"].saved())
        return state

    def __setstate__(self, state):
        if isinstance(state.get("tagger_"), bytes):
            state = dict(state, tagger_=Tagger.from_saved(model_file.from_bytes(state["tagger_"]),
                                                          iob_constraints=False))
        super().__setstate__(state)
