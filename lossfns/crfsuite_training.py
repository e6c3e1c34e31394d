"""CRFsuite's trainers on the library's loops, for `sklearn.CRF.fit`: the
zero model CRFsuite trains, lbfgs with its `epsilon` test, and the
per-sentence algorithms (ap, pa, arow, l2sgd) run by `optimizers.drive`.
Apart from `lossfns.sklearn` so that prediction does not import optax and
the trainers."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from . import losses
from .features.index import ragged_rows
from .models import ChainWeights, LinearChainModel
from .optimizers import Status, drive, elastic_net_penalty, epoch_step_fn, init_loop, relative_improvement_below, sgd_l1
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
from .validation import check_allocation

__all__ = ["ROW_WIDTH", "check_trained", "train", "zero_model"]

ROW_WIDTH = 128
"""lbfgs trains on rows of this many positions, longer sentences in a second bucket (`features.pack_rows`):
the scan over a row is sequential, so short rows train faster (CoNLL-2002 Spanish, whose longest sentence has
1238 tokens: 0.13 s per gradient against 0.19 s with every row that wide)."""


def train(
    tagger: Tagger, algorithm: str, corpus, index, labels: tuple, ids: list, model, *, epsilon, settings: dict, show
) -> None:
    """Train `tagger` (a `Tagger` with the estimator's settings) from the zero
    `model` (`zero_model`) by CRFsuite's `algorithm` on the attribute
    `corpus` with label ids `ids`: "lbfgs" (OWL-QN with c1 > 0) through
    `Tagger.fit_packed` with CRFsuite's `epsilon` test, the per-sentence
    algorithms with their `settings` (`_fit_sentences`); `show(report)` (or
    None) after each iteration."""
    if algorithm == "lbfgs":
        stop = GradientNormBelow(epsilon, tagger.l1, tagger.l2)
        callback = functools.partial(_after_iteration, show, stop) if stop.epsilon or show is not None else None
        tagger.fit_packed(
            corpus.pack_rows(index, ids, width=ROW_WIDTH),
            labels,
            index,
            callback=callback,
            model=model,
            record=elastic_net_record,
        )
    else:
        _fit_sentences(tagger, algorithm, corpus, index, labels, ids, settings, show, model)


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


def _after_iteration(show: Callable | None, stop: GradientNormBelow, report) -> bool:
    """The lbfgs driver's callback: `show(report)` (when given), then CRFsuite's `epsilon` test."""
    if show is not None:
        show(report)
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


def zero_model(tagger: Tagger, corpus, index, ids: list, num_labels: int, min_freq: float) -> LinearChainModel:
    """The zero model CRFsuite trains: weights on the (attribute, label) pairs
    whose summed attribute value over the training tokens of that label is at
    least `min_freq` (CRFsuite's feature frequency; every pair when
    `all_possible_states`), on the label transitions seen (unless
    `all_possible_transitions`), and no start weights (CRFsuite has none)."""
    num_features = index.num_unigram
    mask = None
    if tagger.observed_pairs_only:
        # Per attribute occurrence, not through `token_arrays`' padded rows (built again for training).
        attribute_ids = corpus.encode(index)
        labels = np.repeat(np.fromiter(itertools.chain.from_iterable(ids), np.int64), corpus.token_counts)
        present = attribute_ids >= 0
        cells = attribute_ids[present] * num_labels + labels[present]
        frequency = np.bincount(cells, corpus.values[present], minlength=num_features * num_labels)
        seen = np.bincount(cells, minlength=num_features * num_labels) > 0
        mask = (seen & (frequency >= min_freq)).reshape(num_features, num_labels)
    model = LinearChainModel.zeros(num_features, num_labels, emission_mask=mask, dtype=tagger.dtype)
    if tagger.observed_transitions_only:
        moves = np.zeros((num_labels, num_labels), bool)
        for sequence in ids:
            moves[sequence[:-1], sequence[1:]] = True
        model = model.with_transition_mask(moves)
    return model.with_start_mask(False)


def check_trained(tagger: Tagger, corpus, algorithm: str) -> None:
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
    if algorithm == "ap":
        params = averaged_params(result.params)
    elif algorithm == "pa":
        params = pa_params(result.params, averaging=bool(settings["averaging"]))
    elif algorithm == "arow":
        params = arow_params(result.params)
    else:
        params = result.params[0]
    trace = np.asarray(result.trace)[: int(result.num_steps)]
    structure = model.structure()
    if algorithm in ("pa", "arow"):  # whole tables: the emission weights off the mask are 0
        structure = structure._replace(emission_pairs=None)
    tagger.labels, tagger.index = labels, index
    tagger.model = model.with_weights(params, structure)
    tagger.history = [float(value) for value in trace if np.isfinite(value)]
    tagger.status, tagger.training_seconds = Status(int(result.status)), result.compile_seconds + result.run_seconds
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
