"""`Tagger`: train, apply, evaluate, save and load a sparse-feature CRF tagger.

    tagger = Tagger("crfsuite_ner", **crfsuite_elastic_net(c1=0.1, c2=0.1), max_iterations=100)
    tagger.fit(corpora.conll2002("esp.train"))
    tagger.evaluate(corpora.conll2002("esp.testb"))   # {"token_accuracy": ..., "f1": ...}

The objective is `sum_i loss_i + l1 ||w||_1 + l2 / 2 ||w||^2 (+ regularizer(w))`,
a sum over sentences (as CRFsuite, CRF++ and Wapiti define it, so their
penalty weights carry over; see `crfsuite_elastic_net`). Full-batch
training: with `l1 > 0` the default optimizer is OWL-QN
(`lossfns.optimizers.owlqn`), else `optax.lbfgs`; any optax transformation
can be passed instead. The loop is optax's documented one
(`update(..., value=, grad=, value_fn=)` through `optimizers.update_and_value`;
OWL-QN evaluates the objective itself, inside its line search only),
one jitted step per iteration with the corpus as an argument (never baked
into the compiled program), and it stops like CRFsuite: after
`max_iterations`, or when the objective improved by less than `tol`
(relative) over the last `period` iterations.

Saved models are one file: a JSON header (format version, labels, feature
extractor, feature vocabulary, shapes, and a SHA-256 over header and
weights) followed by the weights written with `equinox.tree_serialise_leaves`,
framed and written atomically as `lossfns.checkpoint` writes checkpoints.
Loading gives bit-identical weights, and refuses (`checkpoint.ModelFileError`,
naming the file) a file of another format version, a truncated or altered
one, and a header that does not describe its weights.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import checkpoint, metrics, semirings
from .corpora import Sentence
from .features.design import bucket_design
from .features.index import (FeatureBatch, FeatureIndex, PackedCorpus, observed_label_pairs, observed_label_triples,
                             pack, pack_rows)
from .features.presets import PRESETS, Preset, preset
from .features.templates import Templates, parse_templates
from .lattices import chain
from .lattices.sparse_chain import SparsePotentials
from .losses.sequence import row_sequence_log_loss, sequence_log_loss
from .models.linear_chain import LinearChainModel
from .optimizers.minimize import Status, check_callable, check_int, check_optimizer, check_scalar, update_and_value
from .optimizers.owlqn import elastic_net_penalty, owlqn

MAGIC = b"LOSSFNS-TAGGER\n"
MODEL_FORMAT = 2  # 1: no checksum, no payload size (refused)
MODEL_FILE = checkpoint.FileKind(MAGIC, "model file", "a lossfns tagger file", "format", MODEL_FORMAT,
                                 checkpoint.ModelFileError)


def crfsuite_elastic_net(c1: float, c2: float) -> dict:
    """CRFsuite's `c1`, `c2` as this module's `l1`, `l2`.

    CRFsuite's L-BFGS trainer minimises `-sum_i log p(y_i | x_i) + c1 ||w||_1
    + c2 ||w||^2` (train_lbfgs.c adds `c2 * ||w||^2` to the objective and
    `2 c2 w` to the gradient), so `l1 = c1` and `l2 = 2 c2`.
    """
    if c1 < 0 or c2 < 0:
        raise ValueError(f"c1 and c2 must be >= 0, got c1={c1}, c2={c2}")
    return {"l1": float(c1), "l2": 2.0 * float(c2)}


def _extractor(features):
    """A feature extractor from a preset name, a `Preset` or `Templates`."""
    if isinstance(features, str):
        return preset(features) if features in PRESETS else parse_templates(features)
    if isinstance(features, (Preset, Templates)):
        return features
    raise TypeError("features must be a preset name, template text, a features.Preset or features.Templates, "
                    f"got {type(features).__name__}")


def _checked_extractor(features):
    """`_extractor(features)`, with a string that is neither a preset nor valid
    template text reported as a bad `features` argument."""
    try:
        return _extractor(features)
    except ValueError as error:
        if isinstance(features, str) and re.fullmatch(r"[A-Za-z_][\w.-]*", features.strip()):
            raise ValueError(f"features: unknown feature preset {features!r}; expected one of "
                             f"{sorted(PRESETS)} or CRF++/Wapiti template text") from error
        raise ValueError(f"features: not a preset name and not valid template text: {error}") from error


def _check_tagger_arguments(*, loss, l1, l2, regularizer, optimizer, max_iterations, tol, period, memory_size,
                            min_count, hash_size, num_buckets, dtype) -> None:
    """`Tagger.__init__`'s argument checks (static Python values only)."""
    check_scalar("l1", l1, 0)
    check_scalar("l2", l2, 0)
    if loss is not None:
        check_callable("loss", loss)
    if regularizer is not None:
        check_callable("regularizer", regularizer)
    if optimizer is not None:
        check_optimizer(optimizer)
        if l1 > 0:
            raise ValueError("l1 > 0 needs optimizer=None (OWL-QN); a custom optimizer only sees the smooth objective")
    check_int("max_iterations", max_iterations)
    check_scalar("tol", tol, 0)
    check_int("period", period)
    check_int("memory_size", memory_size)
    check_int("min_count", min_count)
    if hash_size is not None:
        check_int("hash_size", hash_size)
    check_int("num_buckets", num_buckets)
    try:
        given = jnp.dtype(dtype)
    except TypeError:
        given = None
    if given is None or not jnp.issubdtype(given, jnp.floating):
        raise TypeError("dtype must be a floating-point dtype (jnp.float32 or jnp.float64), "
                        f"got {given.name if given is not None else repr(dtype)}")


def _check_sentences(sentences, labelled: bool = True) -> None:
    """Reject a corpus that is not a list/tuple of `corpora.Sentence` (token rows,
    and one label per token when `labelled`), naming the first bad sentence.

    `Tagger.predict` calls it with `labelled=False`; `Tagger.fit` should call
    it at its top with `labelled=True`."""
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, Sequence):
        raise TypeError(f"sentences must be a list or tuple of corpora.Sentence, got {type(sentences).__name__}")
    if labelled and len(sentences) == 0:
        raise ValueError("sentences must hold at least one sentence, got 0")
    for i, sentence in enumerate(sentences):
        if not hasattr(sentence, "tokens") or (labelled and not hasattr(sentence, "labels")):
            raise TypeError(f"sentences[{i}] must be a corpora.Sentence(tokens, labels), "
                            f"got {type(sentence).__name__} {sentence!r:.60}")
        for t, row in enumerate(sentence.tokens):
            if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) == 0:
                raise TypeError(f"sentences[{i}].tokens[{t}] must be a row of columns (a tuple of strings, word "
                                f"first), got {type(row).__name__} {row!r:.60}")
        if labelled and len(sentence.labels) != len(sentence.tokens):
            raise ValueError(f"sentences[{i}] must have one label per token, got {len(sentence.tokens)} tokens "
                             f"and {len(sentence.labels)} labels")


def _extractor_spec(extractor) -> dict:
    if isinstance(extractor, Preset):
        return {"preset": extractor.name}
    return {"templates": extractor.text}


def _extractor_from_spec(spec: dict):
    return preset(spec["preset"]) if "preset" in spec else parse_templates(spec["templates"])


class Tagger:
    """A linear-chain CRF tagger over sparse observation features.

    Args:
      features: a preset name (`features.presets.PRESETS`), CRF++/Wapiti
        template text, or a `Preset` / `Templates`.
      loss: `(potentials, labels [B, T], lengths [B]) -> [B]` per-sentence
        losses, summed over the corpus; default the CRF log-loss
        (`losses.sequence_log_loss` on the fast real semiring).
      l1, l2: elastic-net weights, `l1 ||w||_1 + l2 / 2 ||w||^2` over all
        weights (`crfsuite_elastic_net(c1, c2)` converts CRFsuite's).
      regularizer: an extra smooth penalty `params -> scalar` (e.g.
        `functools.partial(losses.regularisers.l2, weight=1.0)`), or None.
      optimizer: None (OWL-QN when `l1 > 0`, else `optax.lbfgs`) or an optax
        transformation; a custom one gets the smooth objective including the
        `l2` term and requires `l1 == 0` (OWL-QN is the L1 optimizer).
      max_iterations, tol, period: stopping rule (see the module docstring).
      memory_size: L-BFGS / OWL-QN history (CRFsuite's default is 6).
      min_count: keep observation strings seen at least this often.
      hash_size: if set, hash observation strings into this many ids
        instead of indexing them (`FeatureIndex.hashed_index`).
      observed_pairs_only: give weights only to the (feature, label) pairs
        seen in training, as CRFsuite does by default.
      num_buckets: number of padded length buckets (compiled shapes) for decoding,
        and for training with a custom `loss` (the default trains on packed rows).
      dtype: float dtype of the weights (float64 needs `jax_enable_x64`).
      progress: show a tqdm progress bar while training (default: when more
        than 20 iterations are asked for).
      iob_constraints: decode only valid IOB2 sequences (no `I-X` at the
        start or after anything but `B-X`/`I-X`); None: when every label is
        `O`, `B-...` or `I-...`. Training is unconstrained either way.
    """

    def __init__(self, features: Union[str, Preset, Templates] = "crfsuite_ner", *, loss: Optional[Callable] = None,
                 l1: float = 0.0, l2: float = 0.0, regularizer: Optional[Callable] = None,
                 optimizer: Optional[optax.GradientTransformation] = None, max_iterations: int = 100,
                 tol: float = 1e-5, period: int = 10, memory_size: int = 6, min_count: int = 1,
                 hash_size: Optional[int] = None, observed_pairs_only: bool = True, num_buckets: int = 6,
                 dtype=jnp.float32, progress: Optional[bool] = None, iob_constraints: Optional[bool] = None):
        _check_tagger_arguments(loss=loss, l1=l1, l2=l2, regularizer=regularizer, optimizer=optimizer,
                                max_iterations=max_iterations, tol=tol, period=period, memory_size=memory_size,
                                min_count=min_count, hash_size=hash_size, num_buckets=num_buckets, dtype=dtype)
        self.extractor = _checked_extractor(features)
        self.loss = loss if loss is not None else functools.partial(sequence_log_loss, semiring=semirings.Real)
        # The default log-loss trains on rows of back-to-back sentences
        # (`features.pack_rows`): one compiled scan, no padding inside rows.
        self.row_loss = (functools.partial(row_sequence_log_loss, semiring=semirings.Real) if loss is None
                         else None)
        self.l1, self.l2, self.regularizer, self.optimizer = float(l1), float(l2), regularizer, optimizer
        self.max_iterations, self.tol, self.period, self.memory_size = max_iterations, tol, period, memory_size
        self.min_count, self.hash_size, self.observed_pairs_only = min_count, hash_size, observed_pairs_only
        self.num_buckets, self.dtype, self.progress = num_buckets, dtype, progress
        self.iob_constraints = iob_constraints
        self.model: Optional[LinearChainModel] = None
        self.labels: tuple[str, ...] = ()
        self.index: Optional[FeatureIndex] = None
        self.history: list[float] = []
        self.training_seconds = 0.0
        self.status: Optional[Status] = None  # why the last fit stopped (`optimizers.Status`)

    # -- data ---------------------------------------------------------------

    def _pack(self, sentences: Sequence[Sentence]) -> PackedCorpus:
        """Featurise and pack unlabelled sentences for decoding."""
        return pack([self.index.encode(self.extractor(s.tokens)) for s in sentences], None, self.num_buckets)

    def _device_data(self, packed: PackedCorpus, with_labels: bool):
        data = {"design": bucket_design(packed, self.index.num_unigram), "pair_ids": packed.pair_ids,
                "positions": packed.positions, "lengths": packed.lengths}
        if with_labels:
            data["labels"] = packed.labels
        if packed.starts is not None:
            data["starts"] = packed.starts
        return jax.tree_util.tree_map(jnp.asarray, data)

    # -- training -----------------------------------------------------------

    def _objective(self):
        """Smooth objective `(params, data) -> scalar` (the loss summed over
        sentences, plus the penalties the optimizer does not handle).

        `params` are `_Weights` (`_weights_of`). The emission pairs travel in
        `data`, not in a closure: closed-over arrays would be compile-time
        constants, and XLA's constant folding of a `[K, L]` mask took minutes
        for the POS feature set."""
        # OWL-QN handles the whole elastic net itself; other optimizers see the L2 term here.
        smooth_l2 = 0.0 if self._uses_owlqn() else self.l2

        def objective(params, data):
            model = self._model_of(params, data["emission_pairs"], data["masks"])
            buckets = model.packed_potentials(data["design"], data["pair_ids"], data["positions"],
                                              data.get("starts"))
            if "starts" in data:
                total = sum(jnp.sum(self.row_loss(p, labels, starts, lengths)) for p, labels, starts, lengths
                            in zip(buckets, data["labels"], data["starts"], data["lengths"]))
            else:
                total = sum(jnp.sum(self.loss(p, labels, lengths))
                            for p, labels, lengths in zip(buckets, data["labels"], data["lengths"]))
            if smooth_l2:
                total = total + 0.5 * smooth_l2 * sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(params))
            if self.regularizer is not None:
                total = total + self.regularizer(params)
            return total

        return objective

    def _uses_owlqn(self) -> bool:
        return self.optimizer is None and self.l1 > 0

    def _make_optimizer(self):
        if self.optimizer is not None:
            return self.optimizer
        if self._uses_owlqn():
            return owlqn(self.l1, self.l2, memory_size=self.memory_size)
        return optax.lbfgs(memory_size=self.memory_size)

    def fit(self, sentences: Sequence[Sentence], *, checkpoint_dir=None, checkpoint_every: int = 10) -> "Tagger":
        """Index features, build a zero model and train it on `sentences`.

        With `checkpoint_dir`, the parameters, optimizer state and objective
        trace are saved there atomically (`lossfns.checkpoint`) every
        `checkpoint_every` iterations and at the end; a later `fit` with the
        same directory, corpus and settings resumes from the newest
        checkpoint and ends bit-identical to an uninterrupted run. A
        checkpoint written for another corpus or other settings is refused.
        """
        _check_sentences(sentences)
        check_int("checkpoint_every", checkpoint_every)
        self.labels = tuple(sorted({label for s in sentences for label in s.labels}))
        extracted = [self.extractor(s.tokens) for s in sentences]
        if self.hash_size is not None:
            has_pairs = any(token for sentence in extracted for token in sentence.pair)
            self.index = FeatureIndex.hashed_index(self.hash_size, self.hash_size if has_pairs else 0)
        else:
            self.index = FeatureIndex.build(extracted, self.min_count)
        packed = self._pack_labelled([self.index.encode(f) for f in extracted], sentences)
        mask = None
        if self.observed_pairs_only:
            mask = observed_label_pairs(_unpacked_batches(packed), self.index.num_unigram, len(self.labels))
        self.model = LinearChainModel.zeros(self.index.num_unigram, len(self.labels), self.index.num_pair,
                                            emission_mask=mask, dtype=self.dtype)
        if self.observed_pairs_only and self.index.num_pair:
            # Label-pair-observation weights only for the triples seen: on few
            # label pairs the model trains on the sparse form (Lavergne 4.1).
            self.model = self.model.with_pair_mask(
                observed_label_triples(_unpacked_batches(packed), self.index.num_pair, len(self.labels)))
        self._train(self._training_data(packed), checkpoint_dir, checkpoint_every, _fingerprint(self, sentences))
        return self

    def _pack_labelled(self, encoded, sentences: Sequence[Sentence]) -> PackedCorpus:
        """Pack encoded labelled sentences as training reads them: rows of
        back-to-back sentences for the default loss, else length buckets."""
        lookup = {label: i for i, label in enumerate(self.labels)}
        label_ids = [[lookup[label] for label in s.labels] for s in sentences]
        if self.row_loss is not None:
            return pack_rows(encoded, label_ids)
        return pack(encoded, label_ids, self.num_buckets)

    def _training_data(self, packed: PackedCorpus):
        """The device data of the objective: the packed corpus with labels and
        the `(rows [P], cols [P])` of the emission weights that exist (None: all)."""
        mask = self.model.emission_mask
        pairs = None if mask is None else tuple(jnp.asarray(i, jnp.int32) for i in np.nonzero(np.asarray(mask)))
        # The masks travel as data, never baked into the compiled objective as constants.
        masks = (mask, self.model.pair_mask)
        return dict(self._device_data(packed, True), emission_pairs=pairs, masks=masks)

    def _model_of(self, weights: "_Weights", emission_pairs, masks) -> LinearChainModel:
        """The model of optimisation variables `weights`: the emission table
        `[K, L]` is zero except at the `emission_pairs`, which hold
        `weights.emission`; `masks` are the model's `(emission_mask, pair_mask)`."""
        emission = weights.emission
        if emission_pairs is not None:
            emission = jnp.zeros(self.model.emission.shape, emission.dtype).at[emission_pairs].set(emission)
        return dataclasses.replace(self.model, emission=emission, transitions=weights.transitions,
                                   start=weights.start, pair_emission=weights.pair_emission,
                                   emission_mask=masks[0], pair_mask=masks[1])

    def _train(self, data, checkpoint_dir, checkpoint_every: int, fingerprint: np.ndarray):
        # One writer per checkpoint directory: a second run on it gets a CheckpointError.
        with checkpoint.locked(checkpoint_dir):
            self._train_unlocked(data, checkpoint_dir, checkpoint_every, fingerprint)

    def _train_unlocked(self, data, checkpoint_dir, checkpoint_every: int, fingerprint: np.ndarray):
        params = _weights_of(self.model)
        objective = self._objective()
        optimizer = self._make_optimizer()
        # The recorded objective includes the penalties OWL-QN applies itself.
        optimizer_penalty = elastic_net_penalty(self.l1, self.l2) if self._uses_owlqn() else (lambda params: 0.0)

        @jax.jit
        def step(params, state, data):
            fun = functools.partial(objective, data=data)
            params, state, value = update_and_value(optimizer, fun, params, state)
            return params, state, value + optimizer_penalty(params)

        state = optimizer.init(params)
        # The objective after each iteration; NaN past the iterations done.
        trace = np.full(self.max_iterations, np.nan)
        if checkpoint_dir is not None:
            params, state, trace = _resume(checkpoint_dir, fingerprint, params, state, trace)
        self.history = [float(value) for value in trace[~np.isnan(trace)]]
        show = self.progress if self.progress is not None else self.max_iterations > 20
        bar = _progress_bar(self.max_iterations) if show else None
        if bar is not None:
            bar.update(len(self.history))
        start = time.perf_counter()
        self.status = Status.ITERATION_LIMIT
        while len(self.history) < self.max_iterations:
            if _converged(self.history, self.tol, self.period):
                self.status = Status.CONVERGED
                break
            previous = params
            params, state, value = step(params, state, data)
            failed = _step_failure(value, state)
            if failed is not None:  # never train on: keep the last parameters that had a finite objective
                params, self.status = previous, failed
                warnings.warn(f"Tagger.fit stopped after {len(self.history)} iterations: {failed.name}",
                              RuntimeWarning, stacklevel=3)
                break
            # `value` is the objective at the point the step reached.
            self.history.append(float(value))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(objective=self.history[-1])
            if checkpoint_dir is not None and len(self.history) % checkpoint_every == 0:
                _save_checkpoint(checkpoint_dir, fingerprint, params, state, self.history, trace)
        else:
            if _converged(self.history, self.tol, self.period):
                self.status = Status.CONVERGED
        if checkpoint_dir is not None:
            _save_checkpoint(checkpoint_dir, fingerprint, params, state, self.history, trace)
        self.training_seconds = time.perf_counter() - start
        if bar is not None:
            bar.close()
        self.model = self._model_of(params, data["emission_pairs"], data["masks"])

    # -- inference ----------------------------------------------------------

    def _require_model(self):
        if self.model is None:
            raise ValueError("the tagger has no model yet: call fit() or Tagger.load() first")

    def predict(self, sentences: Sequence[Sentence]) -> list[tuple[str, ...]]:
        """Viterbi label sequences, one tuple of label strings per sentence."""
        _check_sentences(sentences, labelled=False)
        self._require_model()
        if not sentences:
            return []
        packed = self._pack(sentences)
        use_constraints = self.iob_constraints
        if use_constraints is None:
            use_constraints = all(label == "O" or label[:2] in ("B-", "I-") for label in self.labels)
        allowed = _iob_allowed(self.labels) if use_constraints else None
        decoded = _decode(self.model, self._device_data(packed, False), allowed)
        out: list = [None] * len(sentences)
        for members, lengths, labels in zip(packed.members, packed.lengths, decoded):
            labels = np.asarray(labels)
            for row, index in enumerate(members):
                out[index] = tuple(self.labels[j] for j in labels[row, : lengths[row]])
        return out

    def evaluate(self, sentences: Sequence[Sentence]) -> dict:
        """Token accuracy and (for IOB labels) conlleval entity precision, recall and F1."""
        predicted = self.predict(sentences)
        gold = [s.labels for s in sentences]
        scores = metrics.entity_scores(gold, predicted)
        return {"token_accuracy": metrics.token_accuracy(gold, predicted), "precision": scores.precision,
                "recall": scores.recall, "f1": scores.f1}

    # -- persistence --------------------------------------------------------

    def save(self, path) -> None:
        """Write the tagger (header + `equinox.tree_serialise_leaves` weights,
        with a SHA-256 over both) to `path` atomically: a save that fails or
        is killed leaves the previous file at `path` as it was."""
        self._require_model()
        vocabulary = None
        if not self.index.hashed:
            vocabulary = {"unigram": sorted(self.index.unigram, key=self.index.unigram.get),
                          "pair": sorted(self.index.pair, key=self.index.pair.get)}
        header = {"labels": list(self.labels), "features": _extractor_spec(self.extractor),
                  "num_unigram": self.index.num_unigram, "num_pair": self.index.num_pair,
                  "hashed": self.index.hashed, "vocabulary": vocabulary,
                  "dtype": str(jnp.dtype(self.model.emission.dtype)),
                  "masked": self.model.emission_mask is not None, "pair_masked": self.model.pair_mask is not None,
                  "num_buckets": self.num_buckets}
        checkpoint.write_atomically(path, checkpoint.pack_file(MODEL_FILE, header, _serialised(self.model)))

    @classmethod
    def load(cls, path) -> "Tagger":
        """Read a tagger written by `save` (weights bit-identical).

        Raises `checkpoint.ModelFileError` (a ValueError) naming the file and
        the fault when it is missing, of another format version, truncated,
        altered (SHA-256 mismatch), or when its header does not describe its
        weights; nothing is loaded as garbage.
        """
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise checkpoint.ModelFileError(f"model file {path} does not exist") from None
        header, payload = checkpoint.unpack_file(Path(path), data, MODEL_FILE)
        try:
            _check_model_header(header)
            tagger = cls(_extractor_from_spec(header["features"]), num_buckets=header["num_buckets"])
        except (KeyError, TypeError, ValueError) as error:
            raise checkpoint.ModelFileError(f"model file {path} has an invalid header: "
                                            f"{type(error).__name__}: {error}") from None
        tagger.labels = tuple(header["labels"])
        if header["hashed"]:
            tagger.index = FeatureIndex.hashed_index(header["num_unigram"], header["num_pair"])
        else:
            vocabulary = header["vocabulary"]
            tagger.index = FeatureIndex({name: i for i, name in enumerate(vocabulary["unigram"])},
                                        {name: i for i, name in enumerate(vocabulary["pair"])},
                                        header["num_unigram"], header["num_pair"])
        K, L = header["num_unigram"], len(tagger.labels)
        like = LinearChainModel.zeros(K, L, header["num_pair"], dtype=jnp.dtype(header["dtype"]),
                                      emission_mask=np.zeros((K, L), bool) if header["masked"] else None)
        if header.get("pair_masked", False):
            like = like.with_pair_mask(np.zeros((header["num_pair"], L, L), bool))
        described = (f"the header describes {K} features x {L} labels, {header['num_pair']} pair features, "
                     f"{header['dtype']}{', masked' if header['masked'] else ''}")
        expected = len(_serialised(like))
        if len(payload) != expected:
            raise checkpoint.ModelFileError(f"model file {path}: header does not match its weights: {described} "
                                            f"({expected} bytes of weights), the file holds {len(payload)} bytes")
        try:
            tagger.model = eqx.tree_deserialise_leaves(io.BytesIO(payload), like)
            matches = _serialised(tagger.model) == payload
        except Exception as error:  # numpy / equinox errors on weights that are not what the header says
            raise checkpoint.ModelFileError(f"model file {path}: header does not match its weights: {described}; "
                                            f"reading them failed ({type(error).__name__}: {error})") from None
        if not matches:
            raise checkpoint.ModelFileError(f"model file {path}: header does not match its weights: {described}, "
                                            "but the stored arrays have other shapes, dtypes or memory order")
        if tagger.model.pair_mask is not None:  # the sparse support is derived from the mask
            tagger.model = tagger.model.with_pair_mask(np.asarray(tagger.model.pair_mask))
        return tagger


def _serialised(model) -> bytes:
    """`equinox.tree_serialise_leaves` of `model`, as bytes."""
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, model)
    return buffer.getvalue()


def _check_model_header(header: dict) -> None:
    """Raise ValueError/TypeError/KeyError when a model file's header is not
    self-consistent (checked beyond the checksum: the header is also what
    builds the feature index the weights are read against)."""
    def count(name):
        value = header[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        return value

    labels = header["labels"]
    if not isinstance(labels, list) or not labels or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"labels must be a non-empty list of strings, got {labels!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels repeat a label: {labels!r}")
    num_unigram, num_pair = count("num_unigram"), count("num_pair")
    count("num_buckets")
    if not all(isinstance(header.get(flag, False), bool) for flag in ("hashed", "masked", "pair_masked")):
        raise ValueError(f"hashed, masked and pair_masked must be true or false, got {header['hashed']!r}, "
                         f"{header['masked']!r}, {header.get('pair_masked')!r}")
    if not jnp.issubdtype(jnp.dtype(header["dtype"]), jnp.floating):
        raise ValueError(f"dtype must be a floating-point dtype, got {header['dtype']!r}")
    if not isinstance(header["features"], dict):
        raise ValueError(f"features must be a preset or templates, got {header['features']!r}")
    if header["hashed"]:
        return
    vocabulary = header["vocabulary"]
    for name, size in (("unigram", num_unigram), ("pair", num_pair)):
        names = vocabulary[name]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"the {name} vocabulary must be a list of strings")
        if len(names) != size or len(set(names)) != size:
            raise ValueError(f"the {name} vocabulary has {len(names)} entries ({len(set(names))} distinct) "
                             f"for num_{name} = {size}")


class _Weights(NamedTuple):
    """The Tagger's optimisation variables. emission: `[P]`, the weights of the
    P (feature, label) pairs of the emission mask (row-major order), or the
    whole `[K, L]` table without a mask; transitions `[L, L]`; start `[L]`;
    pair_emission `[K2, L, L]`.

    Optimising only the weights that exist (CRFsuite's parameter set, 3% of
    `[K, L]` for the POS features) makes every optimizer step and the L1
    penalty proportional to P rather than K L; the objective is the same."""

    emission: jax.Array
    transitions: jax.Array
    start: jax.Array
    pair_emission: jax.Array


def _weights_of(model: LinearChainModel) -> _Weights:
    """The optimisation variables of a model (see `_Weights`)."""
    emission = model.emission if model.emission_mask is None else model.emission[np.asarray(model.emission_mask)]
    return _Weights(emission, model.transitions, model.start, model.pair_emission)


def _unpacked_batches(packed: PackedCorpus):
    """Per-bucket `FeatureBatch` views of a packed corpus, for
    `observed_label_pairs` and `observed_label_triples` (pair ids are -1 at
    each sentence's first position, where pair features do not apply)."""
    # Position -1 (padding) reads the appended last row, whose ids are all -1.
    padded_ids = np.concatenate([packed.unigram_ids, np.full((1, packed.unigram_ids.shape[1]), -1, np.int32)])
    padded_pairs = np.concatenate([packed.pair_ids, np.full((1, packed.pair_ids.shape[1]), -1, np.int32)])
    starts = packed.starts if packed.starts is not None else (None,) * len(packed.positions)
    for positions, lengths, labels, first in zip(packed.positions, packed.lengths, packed.labels, starts):
        pair_ids = padded_pairs[positions]
        if first is not None:
            pair_ids = np.where(np.asarray(first)[..., None], -1, pair_ids)
        yield FeatureBatch(padded_ids[positions], pair_ids, lengths, labels)


def _iob_allowed(labels: Sequence[str]):
    """`(transitions [L, L], start [L])` bool: which moves keep an IOB2 sequence valid."""
    def continues(previous: Optional[str], label: str) -> bool:
        if not label.startswith("I-"):
            return True
        return previous is not None and previous[2:] == label[2:] and previous[:2] in ("B-", "I-")

    transitions = np.array([[continues(a, b) for b in labels] for a in labels], dtype=bool)
    start = np.array([continues(None, b) for b in labels], dtype=bool)
    return jnp.asarray(transitions), jnp.asarray(start)


def _constrain(potentials, allowed):
    """Forbid (-inf) the moves that `allowed = (transitions, start)` excludes."""
    transitions, start = allowed
    if isinstance(potentials, chain.FactoredPotentials):
        return potentials._replace(transitions=jnp.where(transitions, potentials.transitions, -jnp.inf),
                                   start=jnp.where(start, potentials.start, -jnp.inf))
    if isinstance(potentials, SparsePotentials):  # the forbidden moves join as a shared transition matrix
        shared = jnp.zeros((), potentials.unary.dtype) if potentials.transitions is None else potentials.transitions
        return potentials._replace(transitions=jnp.where(transitions, shared, -jnp.inf),
                                   start=jnp.where(start, potentials.start, -jnp.inf))
    first = jnp.where(start, potentials[..., :1, :, :], -jnp.inf)
    rest = jnp.where(transitions, potentials[..., 1:, :, :], -jnp.inf)
    return jnp.concatenate([first, rest], axis=-3)


@jax.jit
def _decode(model, data, allowed):
    buckets = model.packed_potentials(data["design"], data["pair_ids"], data["positions"])
    if allowed is not None:
        buckets = tuple(_constrain(p, allowed) for p in buckets)
    return tuple(chain.viterbi(p, lengths)[1] for p, lengths in zip(buckets, data["lengths"]))


def _fingerprint(tagger: Tagger, sentences: Sequence[Sentence]) -> np.ndarray:
    """SHA-256 `[32]` uint8 of what a checkpoint must match: the corpus, the
    features, the labels and the training settings (callables by name)."""
    digest = hashlib.sha256()
    settings = [tagger.labels, _extractor_spec(tagger.extractor), tagger.index.num_unigram, tagger.index.num_pair,
                tagger.l1, tagger.l2, tagger.max_iterations, tagger.tol, tagger.period, tagger.memory_size,
                tagger.min_count, tagger.hash_size, tagger.observed_pairs_only, tagger.num_buckets,
                str(jnp.dtype(tagger.dtype)), _describe(tagger.loss), _describe(tagger.optimizer),
                _describe(tagger.regularizer)]
    digest.update(json.dumps(settings, default=str).encode("utf-8"))
    for sentence in sentences:
        digest.update(json.dumps([sentence.tokens, sentence.labels]).encode("utf-8"))
    return np.frombuffer(digest.digest(), dtype=np.uint8).copy()


def _describe(value):
    """A description of a setting that is the same in every process: callables
    by name (a closure's captured values are not seen), never by address."""
    if isinstance(value, functools.partial):
        return [_describe(value.func), [_describe(a) for a in value.args],
                {k: _describe(v) for k, v in sorted(value.keywords.items())}]
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    text = repr(value)
    return type(value).__qualname__ if " at 0x" in text else text


def _save_checkpoint(directory, fingerprint, params, state, history, trace) -> None:
    """Atomically write the training state after `len(history)` iterations;
    keep only the newest checkpoint."""
    trace = trace.copy()
    trace[: len(history)] = history
    tree = {"fingerprint": fingerprint, "params": params, "state": state, "trace": trace}
    checkpoint.save(checkpoint.checkpoint_path(directory, len(history)), tree)
    checkpoint.prune_checkpoints(directory, 1)


def _resume(directory, fingerprint, params, state, trace):
    """`(params, state, trace)` from the newest checkpoint in `directory`, or
    the given ones when there is none."""
    os.makedirs(directory, exist_ok=True)
    latest = checkpoint.latest_checkpoint(directory)
    if latest is None:
        return params, state, trace
    like = {"fingerprint": fingerprint, "params": params, "state": state, "trace": trace}
    refusal = (f"checkpoint_dir {directory}: {latest.name} was written for another corpus or other training "
               "settings; use a new directory (or delete this one) to start afresh")
    try:
        # `latest_checkpoint` skipped damaged files, so a failure here is a structure mismatch.
        restored = checkpoint.load(latest, like)
    except checkpoint.CheckpointError as error:
        raise checkpoint.CheckpointError(f"{refusal} ({error})") from None
    if not np.array_equal(np.asarray(restored["fingerprint"]), fingerprint):
        raise checkpoint.CheckpointError(refusal)
    return restored["params"], restored["state"], np.asarray(restored["trace"])


def _step_failure(value, state):
    """`Status.NON_FINITE_OBJECTIVE` or `LINE_SEARCH_FAILED` when a training
    step failed (the objective it reached, or OWL-QN's own status), else None."""
    if not np.isfinite(float(value)):
        return Status.NON_FINITE_OBJECTIVE
    code = getattr(state, "status", None)
    if code is not None and int(code) in (Status.NON_FINITE_OBJECTIVE, Status.LINE_SEARCH_FAILED):
        return Status(int(code))
    return None


def _converged(history: list, tol: float, period: int) -> bool:
    """CRFsuite's test: relative improvement over the last `period` iterations below `tol`."""
    if tol <= 0 or len(history) <= period:
        return False
    before, now = history[-1 - period], history[-1]
    return (before - now) / max(abs(now), 1e-300) < tol


def _progress_bar(total: int):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is an optional extra: train silently without it
        return None
    return tqdm(total=total, unit="iteration")
