"""Supervised tagging experiments: corpus (or planted synthetic data) ->
features -> padded buckets -> potentials -> one of the Altun losses ->
L-BFGS -> Viterbi -> accuracy or entity F1.

Every feature set of a task is encoded at one shape (the weight table has
the row count `K` of the largest feature set; rows a feature set never uses
get no gradient from the loss and stay exactly 0 under the L2 prior), so
that each (task, loss) pair compiles once. Models are
`lossfns.models.linear_chain.LinearChainModel`s; metrics come from
`lossfns.metrics`.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from typing import NamedTuple

import numpy as np

import jax
import jax.numpy as jnp
import optax
import tqdm

from lossfns import checkpoint, corpora, metrics, semirings
from lossfns.features import index as feature_index
from lossfns.features import presets
from lossfns.lattices import chain
from lossfns.losses import pointwise, regularisers, sequence
from lossfns.models.linear_chain import LinearChainModel
from lossfns import optimizers

from . import synthetic

FEATURE_SETS = {"S1": "altun_s1", "S2": "altun_s2", "S3": "altun_s3"}
LOSSES = ("sequential log", "sequential exp", "pointwise log", "pointwise exp")


class TaskData(NamedTuple):
    """A tagging task: sentences (`corpora.Sentence`), the label inventory,
    the metric ("entity_f1" or "accuracy") and where the data came from."""

    name: str
    train: list
    test: list
    labels: tuple[str, ...]
    metric: str
    source: str


def _as_sentences(pairs) -> list:
    return [corpora.Sentence(tuple((word,) for word in words), tuple(tags)) for words, tags in pairs]


def load_task(task: str, num_train: int | None, num_test: int | None, seed: int = 0) -> TaskData:
    """NER (CoNLL-2002 Spanish, train -> esp.testb) or POS (conll2000 WSJ,
    train.txt -> test.txt) from `NLTK_DATA`; without the corpus, sentences
    from a planted model of the same kind (`experiments.synthetic`).
    `num_train`/`num_test` keep a fixed random subset (None: all)."""
    try:
        if task == "ner":
            train, test, metric = corpora.conll2002("esp.train"), corpora.conll2002("esp.testb"), "entity_f1"
            source = "CoNLL-2002 Spanish (esp.train -> esp.testb)"
        elif task == "pos":
            train, test = corpora.conll2000("train.txt", task="pos"), corpora.conll2000("test.txt", task="pos")
            metric = "accuracy"
            source = "conll2000 WSJ POS (train.txt -> test.txt)"
        else:
            raise ValueError(f"task must be 'ner' or 'pos', got {task!r}")
    except FileNotFoundError:
        scheme, metric = ("iob", "entity_f1") if task == "ner" else ("pos", "accuracy")
        pairs_train, pairs_test, _ = synthetic.synthetic_corpus(seed, scheme, num_train or 3000, num_test or 1000)
        train, test = _as_sentences(pairs_train), _as_sentences(pairs_test)
        source = f"synthetic planted model ({scheme}, seed {seed}): no corpus under NLTK_DATA"
    if num_train is not None and num_train < len(train):
        train = [train[i] for i in np.sort(corpora.shuffled(len(train), seed)[:num_train])]
    if num_test is not None and num_test < len(test):
        test = [test[i] for i in np.sort(corpora.shuffled(len(test), seed + 1)[:num_test])]
    labels = tuple(sorted({label for sentence in train for label in sentence.labels}))
    return TaskData(task, train, test, labels, metric, source)


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

    train/test: feature set name -> list of `Bucket`;
    test_order: `[N_test]` the test-sentence index behind each bucket row, in order;
    num_features: K, the common weight-table row count.
    """

    train: dict
    test: dict
    test_order: np.ndarray
    num_features: int


def _bucketise(encoded, label_ids, buckets, width) -> list[Bucket]:
    out = []
    for members, padded_length in buckets:
        batch = feature_index.pad_batch([encoded[i] for i in members], [label_ids[i] for i in members], padded_length)
        ids = np.full(batch.unigram_ids.shape[:2] + (width,), feature_index.PADDING_ID, np.int32)
        ids[..., : batch.unigram_ids.shape[-1]] = batch.unigram_ids
        out.append(Bucket(jnp.asarray(ids), jnp.asarray(batch.labels), jnp.asarray(batch.lengths)))
    return out


def encode_task(data: TaskData, feature_sets, num_buckets: int) -> EncodedTask:
    """Featurise train and test with each feature set (index built on the
    training set) into buckets of one shape per split across feature sets."""
    label_of = {label: i for i, label in enumerate(data.labels)}
    splits = {"train": data.train, "test": data.test}
    labels = {name: [[label_of.get(label, -1) for label in s.labels] for s in sentences]
              for name, sentences in splits.items()}
    encoded, num_features = {}, 1
    for set_name in feature_sets:
        extractor = presets.preset(FEATURE_SETS[set_name])
        train_features = [extractor(sentence.tokens) for sentence in data.train]
        index = feature_index.FeatureIndex.build(train_features)
        num_features = max(num_features, index.num_unigram)
        encoded[set_name] = {"train": [index.encode(f) for f in train_features],
                             "test": [index.encode(extractor(s.tokens)) for s in data.test]}
    out = {}
    for split, sentences in splits.items():
        buckets = corpora.length_buckets([len(s.labels) for s in sentences], num_buckets)
        width = max(len(token) for set_name in feature_sets for unigram, _ in encoded[set_name][split]
                    for token in unigram)
        out[split] = {set_name: _bucketise(encoded[set_name][split], labels[split], buckets, width)
                      for set_name in feature_sets}
        if split == "test":
            test_order = np.concatenate([members for members, _ in buckets])
    return EncodedTask(out["train"], out["test"], test_order, num_features)


# ---------------------------------------------------------------------------
# Model and objective
# ---------------------------------------------------------------------------


def init_params(num_features: int, num_labels: int, dtype=jnp.float32) -> LinearChainModel:
    """An all-zero CRF: emission `[K, L]`, transitions `[L, L]`, start `[L]`."""
    return LinearChainModel.zeros(num_features, num_labels, dtype=dtype)


def _per_sentence_loss(loss: str, scores, bucket: Bucket) -> jax.Array:
    # The real semiring is the fast CPU path; marginals from it are
    # differentiable again, which the pointwise losses need.
    function = {"sequential log": sequence.sequence_log_loss,
                "sequential exp": sequence.log_sequence_exp_loss,
                "pointwise log": pointwise.pointwise_log_loss,
                "pointwise exp": pointwise.pointwise_exp_loss}[loss]
    return function(scores, bucket.labels, bucket.lengths, semiring=semirings.Real)


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
    return data_term + regularisers.l2(params, l2_weight)


class TrainResult(NamedTuple):
    """params: trained parameters; trace: objective after each step;
    compile_seconds: compilation (0 when reused); train_seconds: the steps."""

    params: LinearChainModel
    trace: np.ndarray
    num_steps: int
    compile_seconds: float
    train_seconds: float


def _run_steps(loop, until, data, *, loss: str, l2_weight: float, tol: float):
    """Advance an L-BFGS `optimizers.LoopState` to step `until` (jit-able)."""
    fun = lambda p: objective(p, data[0], data[1], loss, l2_weight)
    step_fn = optimizers.gradient_step_fn(fun, optax.lbfgs())
    return optimizers.run_loop(step_fn, loop, until, optimizers.relative_change_below(tol))


_COMPILED: dict = {}


def _compiled_steps(loop, data, loss: str, l2_weight: float, tol: float):
    """`_run_steps` compiled once per (loss, prior, tolerance, shapes) and
    reused across feature sets and learning-curve subsets. The data is an
    argument, not a closure: jit would bake closed-over arrays into the
    program as constants (seconds of compilation per 100 MB)."""
    signature = jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), (loop, data))
    key = (loss, l2_weight, tol, str(signature))
    if key not in _COMPILED:
        until = jnp.zeros((), jnp.int32)
        _COMPILED[key] = jax.jit(functools.partial(_run_steps, loss=loss, l2_weight=l2_weight, tol=tol)).lower(
            loop, until, data).compile()
    return _COMPILED[key]


def train(params: LinearChainModel, buckets: list, weights: list, loss: str, *, l2_weight: float, max_steps: int,
          tol: float, checkpoint_dir: str | None, progress: bool, chunks: int = 5) -> TrainResult:
    """Minimise `objective` with `optax.lbfgs` in the loop of
    `lossfns.optimizers.minimize`, in `chunks` jitted pieces with a progress
    bar and a checkpoint (`lossfns.checkpoint`) after each, so that an
    interrupted run resumes from its last chunk. The checkpoints are removed
    once the run is done."""
    data = (tuple(buckets), tuple(jnp.asarray(w, params.emission.dtype) for w in weights))
    loop = optimizers.init_loop((params, optax.lbfgs().init(params)), max_steps, params.emission.dtype)
    start = time.perf_counter()
    run_steps = _compiled_steps(loop, data, loss, l2_weight, tol)
    compile_seconds = time.perf_counter() - start
    if checkpoint_dir is not None:
        os.makedirs(checkpoint_dir, exist_ok=True)
        latest = checkpoint.latest_checkpoint(checkpoint_dir)
        if latest is not None:
            loop = checkpoint.load(latest, loop)
    bar = tqdm.tqdm(total=max_steps, initial=int(loop.step), disable=not progress, leave=False,
                    desc=loss, unit="step")
    start = time.perf_counter()
    while int(loop.step) < max_steps and not bool(loop.done):
        before = int(loop.step)
        loop = run_steps(loop, jnp.asarray(before + -(-max_steps // chunks), jnp.int32), data)
        bar.update(int(loop.step) - before)
        bar.set_postfix(objective=float(loop.value))
        if checkpoint_dir is not None:
            checkpoint.save(checkpoint.checkpoint_path(checkpoint_dir, int(loop.step)), loop)
            checkpoint.prune_checkpoints(checkpoint_dir, 1)
    jax.block_until_ready(loop.inner[0])
    train_seconds = time.perf_counter() - start
    bar.close()
    if checkpoint_dir is not None:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    trace = np.asarray(loop.trace)
    return TrainResult(loop.inner[0], trace[: int(loop.step)], int(loop.step), compile_seconds, train_seconds)


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


def evaluate(params: LinearChainModel, buckets: list, order: np.ndarray, data: TaskData) -> float:
    """Entity F1 (conlleval) or token accuracy on the test set, in percent."""
    predicted = predict(params, buckets, order, data.labels)
    gold = [sentence.labels for sentence in data.test]
    if data.metric == "entity_f1":
        return 100.0 * metrics.entity_scores(gold, predicted).f1
    return 100.0 * metrics.token_accuracy(gold, predicted)


# ---------------------------------------------------------------------------
# The averaged perceptron (Collins 2002) over the same buckets
# ---------------------------------------------------------------------------


@jax.jit
def _perceptron_epoch(state, bucket: Bucket):
    """One pass of `lossfns.optimizers.perceptron` over one bucket (data as
    an argument, not a closure, for the reason given in `_compiled_steps`)."""
    data = optimizers.SequenceData(bucket.ids, bucket.labels, bucket.lengths)
    return optimizers.perceptron_epoch_fn(lambda model, ids: model(ids), data)(state, 0)


def train_perceptron(params: LinearChainModel, buckets: list, *, num_epochs: int, progress: bool):
    """Averaged perceptron for up to `num_epochs` epochs (buckets in a fixed
    order; stops after an epoch without mistakes). Returns `(params,
    mistakes per epoch, seconds)`."""
    state = optimizers.perceptron_init(params)
    history = []
    start = time.perf_counter()
    for _ in tqdm.trange(num_epochs, disable=not progress, leave=False, desc="perceptron", unit="epoch"):
        mistakes = 0
        for bucket in buckets:
            state, bucket_mistakes = _perceptron_epoch(state, bucket)
            mistakes += int(bucket_mistakes)
        history.append(mistakes)
        if mistakes == 0:
            break
    params = optimizers.averaged_params(state)
    jax.block_until_ready(params)
    return params, history, time.perf_counter() - start
