"""Supervised tagging experiments: corpus (or planted synthetic data) ->
features -> padded buckets -> potentials -> one of the Altun losses ->
L-BFGS -> Viterbi -> accuracy or entity F1.

Everything but the experiment's own objective (which composes the library's
losses) is the library's: the corpus is batched by `features.pack` into
length buckets and read as padded `FeatureBatch`es (`features.padded_buckets`),
training runs through the one driver (`optimizers.train`, `optimizers.drive`:
progress, checkpoints, resume), decoding is `chain.viterbi` on the model's
potentials. Every feature set of a task is encoded at one shape (the weight
table has the row count `K` of the largest feature set; rows a feature set
never uses get no gradient from the loss and stay exactly 0 under the L2
prior), so that each (task, loss) pair compiles once, or each task once for
all its losses (`train`'s `compiled_with`): the driver caches the compiled
loop by its step function and shapes. Models are
`lossfns.models.LinearChainModel`s; metrics come from `lossfns.metrics`.
"""

from __future__ import annotations

import functools
import os
import shutil
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lossfns import corpora, features, metrics, optimizers, semirings, training
from lossfns.features import presets
from lossfns.lattices import chain
from lossfns.losses import l2, log_sequence_exp_loss, pointwise_exp_loss, pointwise_log_loss, sequence_log_loss
from lossfns.models import LinearChainModel

from . import synthetic

FEATURE_SETS = {"S1": "altun_s1", "S2": "altun_s2", "S3": "altun_s3"}
LOSSES = ("sequential log", "sequential exp", "pointwise log", "pointwise exp")


class TaskData(NamedTuple):
    """A tagging task: sentences (`corpora.Sentence`), the label inventory,
    the metric ("entity_f1" or "accuracy"), where the data came from,
    development sentences (for stopping rules that read a held-out score),
    and the longest sentence a slice kept (None: every sentence)."""

    name: str
    train: list
    test: list
    labels: tuple[str, ...]
    metric: str
    source: str
    dev: tuple | list = ()
    max_length: int | None = None


def _as_sentences(pairs) -> list:
    return [corpora.Sentence(tuple((word,) for word in words), tuple(tags)) for words, tags in pairs]


def load_task(
    task: str,
    num_train: int | None,
    num_test: int | None,
    seed: int = 0,
    *,
    num_dev: int | None = 0,
    max_length: int | None = None,
) -> TaskData:
    """NER (CoNLL-2002 Spanish, train -> esp.testb, development esp.testa)
    or POS (conll2000 WSJ, train.txt -> test.txt, development the NLTK
    treebank sample: WSJ sections 00-01, disjoint from conll2000's 15-18 and
    20) from `NLTK_DATA`; without the corpus, sentences from a planted model
    of the same kind (`experiments.synthetic`). `num_train`/`num_test`/
    `num_dev` keep a fixed random subset (None: all; no development
    sentences with `num_dev=0`), drawn from the sentences of at most
    `max_length` tokens (None: of any length)."""
    try:
        if task == "ner":
            train, test, metric = corpora.conll2002("esp.train"), corpora.conll2002("esp.testb"), "entity_f1"
            dev = corpora.conll2002("esp.testa") if num_dev != 0 else []
            source = "CoNLL-2002 Spanish (esp.train -> esp.testb)"
        elif task == "pos":
            train, test = corpora.conll2000("train.txt", task="pos"), corpora.conll2000("test.txt", task="pos")
            dev = corpora.treebank() if num_dev != 0 else []
            metric = "accuracy"
            source = "conll2000 WSJ POS (train.txt -> test.txt)"
        else:
            raise ValueError(f"task must be 'ner' or 'pos', got {task!r}")
    except FileNotFoundError:
        scheme, metric = ("iob", "entity_f1") if task == "ner" else ("pos", "accuracy")
        pairs_train, pairs_test, _ = synthetic.synthetic_corpus(seed, scheme, num_train or 3000, num_test or 1000)
        train, test = _as_sentences(pairs_train), _as_sentences(pairs_test)
        # Development sentences: the same planted model, a third generator stream.
        dev = (
            _as_sentences(
                synthetic.sample_sentences(
                    synthetic.planted_model(seed, scheme), np.random.default_rng([seed, 3]), num_dev or 1000
                )
            )
            if num_dev != 0
            else []
        )
        source = f"synthetic planted model ({scheme}, seed {seed}): no corpus under NLTK_DATA"
    if max_length is not None:
        train, test, dev = ([s for s in split if len(s.labels) <= max_length] for split in (train, test, dev))
    if num_train is not None and num_train < len(train):
        train = [train[i] for i in np.sort(corpora.shuffled(len(train), seed)[:num_train])]
    if num_test is not None and num_test < len(test):
        test = [test[i] for i in np.sort(corpora.shuffled(len(test), seed + 1)[:num_test])]
    if num_dev is not None and num_dev < len(dev):
        dev = [dev[i] for i in np.sort(corpora.shuffled(len(dev), seed + 2)[:num_dev])]
    labels = tuple(sorted({label for sentence in train for label in sentence.labels}))
    return TaskData(task, train, test, labels, metric, source, dev, max_length)


class Bucket(NamedTuple):
    """Padded sentences of similar length.

    ids: `[B, T, F]` int32 emission feature ids (-1 = padding);
    labels: `[B, T]` int32 (-1 past each length and for unknown labels);
    lengths: `[B]` int32.
    """

    ids: jax.Array
    labels: jax.Array
    lengths: jax.Array


class EncodedTask(NamedTuple):
    """A task featurised with every feature set at one common shape.

    train/test/dev: feature set name -> list of `Bucket` (dev: empty dict
    when the task has no development sentences);
    test_order/dev_order: `[N]` the sentence index behind each bucket row, in order;
    num_features: K, the common weight-table row count.
    """

    train: dict
    test: dict
    test_order: np.ndarray
    num_features: int
    dev: dict
    dev_order: np.ndarray | None


def _buckets(packed: features.PackedCorpus, width: int) -> list[Bucket]:
    """The padded buckets of a packed corpus, ids widened to `width` columns."""
    out = []
    for batch in features.padded_buckets(packed):
        ids = np.full(batch.unigram_ids.shape[:2] + (width,), features.index.PADDING_ID, np.int32)
        ids[..., : batch.unigram_ids.shape[-1]] = batch.unigram_ids
        out.append(Bucket(jnp.asarray(ids), jnp.asarray(batch.labels), jnp.asarray(batch.lengths)))
    return out


def encode_task(data: TaskData, feature_sets, num_buckets: int) -> EncodedTask:
    """Featurise train and test with each feature set (index built on the
    training set) into length buckets (`features.pack`) of one shape per
    split across feature sets."""
    splits = {"train": data.train, "test": data.test} | ({"dev": data.dev} if data.dev else {})
    labels = {name: features.label_ids(sentences, data.labels) for name, sentences in splits.items()}
    packed, num_features = {}, 1
    for set_name in feature_sets:
        extractor = presets.preset(FEATURE_SETS[set_name])
        index = features.build_index([extractor(sentence.tokens) for sentence in data.train])
        num_features = max(num_features, index.num_unigram)
        packed[set_name] = {
            split: features.pack(features.encode(index, extractor, sentences), labels[split], num_buckets)
            for split, sentences in splits.items()
        }
    out = {}
    for split in splits:
        # Bucketing depends on the lengths only: every feature set has the same buckets.
        width = max(packed[set_name][split].unigram_ids.shape[1] for set_name in feature_sets)
        out[split] = {set_name: _buckets(packed[set_name][split], width) for set_name in feature_sets}
    order = {split: np.concatenate(packed[feature_sets[0]][split].members) for split in splits if split != "train"}
    return EncodedTask(out["train"], out["test"], order["test"], num_features, out.get("dev", {}), order.get("dev"))


# ---------------------------------------------------------------------------
# Model and objective
# ---------------------------------------------------------------------------


def init_params(num_features: int, num_labels: int, dtype=jnp.float32) -> LinearChainModel:
    """An all-zero CRF: emission `[K, L]`, transitions `[L, L]`, start `[L]`."""
    return LinearChainModel.zeros(num_features, num_labels, dtype=dtype)


def _per_sentence_loss(loss: str, scores, bucket: Bucket) -> jax.Array:
    function = {
        "sequential log": sequence_log_loss,
        "sequential exp": log_sequence_exp_loss,
        "pointwise log": pointwise_log_loss,
        "pointwise exp": pointwise_exp_loss,
    }[loss]
    return function(scores, bucket.labels, bucket.lengths)


def objective(params: LinearChainModel, buckets: tuple, weights: tuple, loss: str, l2_weight: float) -> jax.Array:
    """Training objective: the weighted sum over sentences of `loss` plus
    `l2_weight / 2 ||params||^2` (a Gaussian prior, sigma^2 = 1 / l2_weight).

    The sequential exp-loss `sum_i (1 / P(y_i | x_i) - 1)` overflows at the
    zero initialisation (`T log L` per sentence), so it is minimised as
    `N log(mean_i exp-loss_i)`: the same minimiser without the prior, and
    with the prior on the scale of a sum over N sentences.
    """
    per_bucket = [_per_sentence_loss(loss, params(bucket.ids), bucket) for bucket in buckets]
    values, weight = jnp.concatenate(per_bucket), jnp.concatenate(weights)
    if loss == "sequential exp":
        count = jnp.sum(weight)
        log_weight = jnp.where(weight > 0, jnp.log(jnp.where(weight > 0, weight, 1.0)), -jnp.inf)
        data_term = count * (semirings.logsumexp(values + log_weight, -1) - jnp.log(count))
    else:
        data_term = jnp.sum(jnp.where(weight > 0, weight * values, 0.0))
    return data_term + l2(params, l2_weight)


class TrainResult(NamedTuple):
    """params: trained parameters; trace: objective after each step;
    compile_seconds: compilation (0 when reused); train_seconds: the steps;
    status: how the last run stopped (`optimizers.status_name`); restarts:
    fresh L-BFGS memories after failed line searches."""

    params: LinearChainModel
    trace: np.ndarray
    num_steps: int
    compile_seconds: float
    train_seconds: float
    status: str = "CONVERGED"
    restarts: int = 0


@functools.cache
def _objective_of(losses: tuple[str, ...], l2_weight: float):
    """`(params, (buckets, weights, index)) -> objective` of the loss
    `losses[index]`, one function per (losses, prior), so the driver compiles
    one loop for all of `losses` (a `lax.switch` on the traced index) and
    re-uses it across them and across feature sets. Compiling is most of a
    small run's time, and one loop of the four losses compiled in two thirds
    of the time of four loops of one (47 s against 71 s, 2 shared cores)."""

    def of(params, data):
        buckets, weights, index = data
        branches = [
            functools.partial(objective, buckets=buckets, weights=weights, loss=loss, l2_weight=l2_weight)
            for loss in losses
        ]
        return jax.lax.switch(index, branches, params)

    return of


_LBFGS = optax.lbfgs()
# A failed line search (optax.lbfgs's zoom search found no step; seen in
# float32 on the pointwise log-loss of all of esp.train, step 79 of a run
# still falling 0.3% a step) is retried from the same point with an empty
# L-BFGS memory, a steepest-descent step; a run that fails this often stops.
MAX_RESTARTS = 3


def train(
    params: LinearChainModel,
    buckets: list,
    weights: list,
    loss: str,
    *,
    l2_weight: float,
    max_steps: int,
    stop: optimizers.StopRule,
    checkpoint_dir: str | None,
    progress: bool,
    chunk_steps: int = 50,
    compiled_with: tuple[str, ...] | None = None,
) -> TrainResult:
    """Minimise `objective` with `optax.lbfgs` through the driver
    (`optimizers.train`) until the stop rule `stop` (a relative change of
    the objective, `optimizers.relative_change_below` or
    `relative_improvement_below`) or `max_steps` (a safety cap, over all
    restarts), in jitted chunks of `chunk_steps` steps with a progress bar
    and a checkpoint after each, so that an interrupted run resumes from its
    last chunk; after a failed line search, up to `MAX_RESTARTS` times from
    the same point with a fresh L-BFGS memory (each restart checkpoints in a
    directory of its own). The checkpoints are removed once the run is done.
    `compiled_with`: the losses (`loss` among them) whose runs share one
    compiled loop (`_objective_of`); None: `loss`'s own."""
    losses = compiled_with or (loss,)
    index = jnp.asarray(losses.index(loss), jnp.int32)
    data = (tuple(buckets), tuple(jnp.asarray(w, params.emission.dtype) for w in weights), index)
    traces, compile_seconds, train_seconds = [], 0.0, 0.0
    for restart in range(MAX_RESTARTS + 1):
        remaining = max_steps - sum(t.size for t in traces)
        directory = None if checkpoint_dir is None else os.path.join(checkpoint_dir, f"restart{restart}")
        result = optimizers.train(
            _objective_of(losses, l2_weight),
            params,
            _LBFGS,
            data,
            max_steps=remaining,
            stop=stop,
            chunk_steps=min(chunk_steps, remaining),
            checkpoint_dir=directory,
            progress=progress,
            description=loss if restart == 0 else f"{loss} (restart {restart})",
            settings=["altun2003", loss, l2_weight, repr(stop), restart],
        )
        params, status = result.params, optimizers.status_name(result.status)
        traces.append(np.asarray(result.trace)[: int(result.num_steps)])
        compile_seconds, train_seconds = compile_seconds + result.compile_seconds, train_seconds + result.run_seconds
        if status != "LINE_SEARCH_FAILED" or sum(t.size for t in traces) >= max_steps:
            break
    if checkpoint_dir is not None:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    trace = np.concatenate(traces)
    return TrainResult(params, trace, int(trace.size), compile_seconds, train_seconds, status, len(traces) - 1)


@jax.jit
def _decode(params: LinearChainModel, bucket: Bucket) -> jax.Array:
    _, labels = chain.viterbi(params(bucket.ids), bucket.lengths)
    return labels


def predict(params: LinearChainModel, buckets: list, order: np.ndarray, labels: tuple[str, ...]) -> list:
    """Viterbi label strings per sentence, in corpus order (`order`: the
    sentence behind each bucket row)."""
    rows = []
    for bucket in buckets:
        decoded, lengths = np.asarray(_decode(params, bucket)), np.asarray(bucket.lengths)
        rows += [tuple(labels[i] for i in sentence[:length]) for sentence, length in zip(decoded, lengths)]
    predicted = [None] * len(rows)
    for row, sentence in zip(rows, order):
        predicted[sentence] = row
    return predicted


def evaluate(params: LinearChainModel, buckets: list, order: np.ndarray, data: TaskData, split: str = "test") -> float:
    """Entity F1 (conlleval) or token accuracy on the test (or "dev") set, in percent."""
    return decode_scores(params, buckets, order, data, split)[0]


def decode_scores(
    params: LinearChainModel, buckets: list, order: np.ndarray, data: TaskData, split: str = "test"
) -> tuple[float, float]:
    """`(score, token error)` in percent of one decoding of the test (or
    "dev") set: the score is `evaluate`'s (entity F1 or token accuracy)."""
    predicted = predict(params, buckets, order, data.labels)
    gold = [sentence.labels for sentence in (data.test if split == "test" else data.dev)]
    accuracy = 100.0 * metrics.token_accuracy(gold, predicted)
    score = 100.0 * metrics.entity_scores(gold, predicted).f1 if data.metric == "entity_f1" else accuracy
    return score, 100.0 - accuracy


# ---------------------------------------------------------------------------
# The averaged perceptron (Collins 2002) over the same buckets
# ---------------------------------------------------------------------------


def shuffled_perceptron_epochs(data):
    """`make_step` of one averaged-perceptron epoch (`training.perceptron_epoch_fn`)
    over every bucket, `data = (buckets, seed)`: the buckets and the sentences
    within each are visited in an order drawn from `(seed, epoch)`, so no
    sentence is always seen after the same others (a fixed order biases the
    averaged weights towards the last buckets). The objective is the mistakes."""
    buckets, seed = data

    def visit(bucket, key):
        def epoch(state, step):
            rows = jax.random.permutation(key, bucket.lengths.shape[0])
            shuffled = training.SequenceData(bucket.ids[rows], bucket.labels[rows], bucket.lengths[rows])
            return training.perceptron_epoch_fn(lambda model, ids: model(ids), shuffled)(state, step)

        return epoch

    def step_fn(state, step):
        keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), step), len(buckets) + 1)
        order = jax.random.permutation(keys[0], len(buckets))
        branches = [lambda state, b=b: visit(buckets[b], keys[b + 1])(state, step) for b in range(len(buckets))]

        def body(i, carry):
            state, mistakes = carry
            state, bucket_mistakes = jax.lax.switch(order[i], branches, state)
            return state, mistakes + bucket_mistakes

        return jax.lax.fori_loop(0, len(buckets), body, (state, jnp.zeros((), jnp.int32)))

    return step_fn


class PerceptronRun(NamedTuple):
    """params: the averaged weights of the epoch with the best development
    score; mistakes: per epoch; dev_scores: per epoch; best_epoch: 1-based;
    stopped_by: "patience" (no better development score for `patience`
    epochs), "no mistakes" or "epoch cap"; seconds: compilation included."""

    params: LinearChainModel
    mistakes: list
    dev_scores: list
    best_epoch: int
    stopped_by: str
    seconds: float


def train_perceptron(
    params: LinearChainModel, buckets: list, *, max_epochs: int, patience: int, seed: int, dev_score, progress: bool
) -> PerceptronRun:
    """Averaged perceptron, shuffled each epoch (`seed`), through the driver
    until its development score (`dev_score(params) -> float`, higher is
    better) has not improved for `patience` epochs (or an epoch without
    mistakes, or `max_epochs`, a safety cap); the model of the best epoch."""
    loop = optimizers.init_loop(training.perceptron_init(params), max_epochs, params.emission.dtype)
    scores, best = [], {}

    def after_epoch(report) -> bool:
        averaged = training.averaged_params(report.inner)
        scores.append(float(dev_score(averaged)))
        if scores[-1] > max(scores[:-1], default=-np.inf):
            best.update(params=averaged, epoch=len(scores))
        return len(scores) - best["epoch"] >= patience

    run = optimizers.drive(
        shuffled_perceptron_epochs,
        loop,
        (tuple(buckets), jnp.asarray(seed, jnp.uint32)),
        stop=training.no_mistakes,
        progress=progress,
        description="perceptron",
        callback=after_epoch,
    )
    steps = int(run.num_steps)
    mistakes = [int(m) for m in np.asarray(run.trace)[:steps]]
    stopped_by = (
        "patience" if len(scores) - best["epoch"] >= patience else "no mistakes" if mistakes[-1] == 0 else "epoch cap"
    )
    return PerceptronRun(
        best["params"], mistakes, scores, best["epoch"], stopped_by, run.compile_seconds + run.run_seconds
    )
