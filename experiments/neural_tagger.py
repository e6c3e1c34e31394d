"""A small neural tagger with a CRF head (`lossfns.nn.CRF`) against the same
network with a softmax head and against the sparse-feature Tagger, on
CoNLL-2002 Spanish NER (esp.train -> esp.testb, epochs chosen on esp.testa).

    NLTK_DATA=/path/to/nltk_data python -m experiments neural_tagger           # full run
    python -m experiments neural_tagger --quick                                # a small slice, tiny network

The network (equinox, written out here in a few lines so that it is plain
what is compared): word embeddings (lowercased, digits mapped to 0; words
seen once share the unknown vector), a casing feature, a character
convolution max-pooled over each word, dropout, a bidirectional LSTM,
dropout, and a linear layer to one score per tag. The two heads read the
same scores: the CRF head (`CRF.from_labels(labels, "IOB2")`: invalid IOB2
moves forbidden in training and decoding) trains on `-log_likelihood` and
decodes with Viterbi; the softmax head trains on the tokens' cross-entropy
and decodes by the argmax. Same encoder, initialisation, batches, optimiser
(optax Adam, gradient clipping) and number of epochs.

Batches hold about `tokens_per_batch` tokens of sentences of similar length
(`corpora.length_buckets`, so that a few shapes compile); the last batch of
a bucket is filled with empty sentences (length 0, which the CRF head
takes as one empty path). A training sentence whose gold tags are invalid
IOB2 (esp.train has one) gets log-likelihood -inf under the constrained
head and is left out of its loss (`jnp.where`, NaN-free gradients).

Each head is one resumable unit: a checkpoint after every epoch (model,
optimiser state, history), so an interrupted run started again with the
same command loses at most the epoch in progress. Reported: entity F1
(conlleval, `lossfns.metrics`) on esp.testb at the epoch with the best
esp.testa F1 and after the last epoch, training tokens per second (median
epoch; compilation reported apart) and decoding tokens per second. The
sparse Tagger's numbers are read from `experiments/results/crfsuite_comparison/ner.txt`.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import statistics
import time
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from lossfns import checkpoint, corpora, metrics
from lossfns.nn import CRF

from . import synthetic
from .harness import RunDirectory, markdown_table, select_tasks

HEADS = ("crf", "softmax")
SEED = 0
FULL = {
    "num_train": None,
    "num_eval": None,
    "epochs": 25,
    "word_dim": 100,
    "char_dim": 25,
    "char_filters": 50,
    "case_dim": 5,
    "hidden": 100,
    "dropout": 0.5,
    "learning_rate": 2e-3,
    "clip": 5.0,
    "tokens_per_batch": 640,
    "num_buckets": 6,
    "max_chars": 16,
}
QUICK = {
    **FULL,
    "num_train": 200,
    "num_eval": 60,
    "epochs": 2,
    "word_dim": 8,
    "char_dim": 4,
    "char_filters": 4,
    "case_dim": 2,
    "hidden": 8,
    "tokens_per_batch": 400,
    "num_buckets": 1,
}
TAGGER_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "crfsuite_comparison", "ner.txt")


# ---------------------------------------------------------------------------
# Data: sentences -> padded integer arrays in length buckets
# ---------------------------------------------------------------------------


class Splits(NamedTuple):
    train: list
    dev: list
    test: list
    labels: tuple
    source: str


def load(num_train: int | None, num_eval: int | None) -> Splits:
    """CoNLL-2002 Spanish (esp.train, esp.testa, esp.testb), or without it a
    planted IOB corpus (`experiments.synthetic`); `num_*` keep fixed random subsets."""
    try:
        train, dev, test = (corpora.conll2002(split) for split in ("esp.train", "esp.testa", "esp.testb"))
        source = "CoNLL-2002 Spanish (esp.train -> esp.testb, epochs chosen on esp.testa)"
    except FileNotFoundError:
        pairs_train, pairs_test, _ = synthetic.synthetic_corpus(SEED, "iob", num_train or 3000, 2 * (num_eval or 500))
        as_sentences = lambda pairs: [
            corpora.Sentence(tuple((w,) for w in words), tuple(tags)) for words, tags in pairs
        ]
        train, held_out = as_sentences(pairs_train), as_sentences(pairs_test)
        dev, test = held_out[: len(held_out) // 2], held_out[len(held_out) // 2 :]
        source = f"synthetic planted IOB model (seed {SEED}): no CoNLL-2002 under NLTK_DATA"
    subset = lambda sentences, n, seed: (
        sentences
        if n is None or n >= len(sentences)
        else [sentences[i] for i in np.sort(corpora.shuffled(len(sentences), seed)[:n])]
    )
    train, dev, test = subset(train, num_train, SEED), subset(dev, num_eval, SEED + 1), subset(test, num_eval, SEED + 2)
    labels = tuple(sorted({label for sentence in train for label in sentence.labels}))
    return Splits(train, dev, test, labels, source)


def _normalise(word: str) -> str:
    return re.sub(r"\d", "0", word.lower())


def _casing(word: str) -> int:
    """0 lower, 1 capitalised, 2 all capitals, 3 has a digit, 4 other."""
    if any(c.isdigit() for c in word):
        return 3
    if word.isupper():
        return 2
    if word[:1].isupper():
        return 1
    return 0 if word.islower() else 4


NUM_CASINGS = 5


class Vocabulary(NamedTuple):
    words: dict  # normalised word -> id (0 padding, 1 unknown)
    chars: dict  # char -> id (0 padding, 1 unknown)
    labels: tuple


def vocabulary(train, labels) -> Vocabulary:
    counts = collections.Counter(_normalise(w) for sentence in train for w in sentence.words)
    words = {w: i + 2 for i, w in enumerate(sorted(w for w, c in counts.items() if c >= 2))}
    chars = {c: i + 2 for i, c in enumerate(sorted({c for sentence in train for w in sentence.words for c in w}))}
    return Vocabulary(words, chars, labels)


class Batch(NamedTuple):
    """words, cases, tags: `[B, T]` int32 (tags -1 past each sentence);
    chars: `[B, T, C]` int32 (0 padding); lengths: `[B]` int32."""

    words: np.ndarray
    cases: np.ndarray
    chars: np.ndarray
    tags: np.ndarray
    lengths: np.ndarray


class Bucketed(NamedTuple):
    """Sentences in batches of one shape per bucket; `members[i]` are the
    sentence indices of `batches[i]`'s rows (-1 for filler rows)."""

    batches: list
    members: list
    num_tokens: int


def bucketise(sentences, vocab: Vocabulary, config: dict) -> Bucketed:
    C = config["max_chars"]
    label_ids = {label: i for i, label in enumerate(vocab.labels)}
    batches, members = [], []
    for indices, T in corpora.length_buckets([len(s.labels) for s in sentences], config["num_buckets"], 8):
        size = max(1, config["tokens_per_batch"] // T)
        for start in range(0, len(indices), size):
            rows = indices[start : start + size]
            words, cases, tags = (np.zeros((size, T), np.int32) for _ in range(3))
            tags[:] = -1
            chars, lengths = np.zeros((size, T, C), np.int32), np.zeros(size, np.int32)
            for row, index in enumerate(rows):
                sentence = sentences[index]
                lengths[row] = len(sentence.labels)
                for t, (word, label) in enumerate(zip(sentence.words, sentence.labels)):
                    words[row, t] = vocab.words.get(_normalise(word), 1)
                    cases[row, t] = _casing(word)
                    tags[row, t] = label_ids.get(label, -1)
                    chars[row, t, : min(len(word), C)] = [vocab.chars.get(c, 1) for c in word[:C]]
            batches.append(Batch(words, cases, chars, tags, lengths))
            members.append(np.concatenate([rows, np.full(size - len(rows), -1)]))
    return Bucketed(batches, members, sum(len(s.labels) for s in sentences))


# ---------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------


def _uniform(key, shape, scale):
    return jax.random.uniform(key, shape, jnp.float32, -scale, scale)


class LSTM(eqx.Module):
    """One direction of an LSTM over `[B, T, D]`; the input projection of
    every position is one product before the scan."""

    input_weights: jax.Array  # [D, 4H]
    hidden_weights: jax.Array  # [H, 4H]
    bias: jax.Array  # [4H]

    def __init__(self, input_size: int, hidden: int, *, key):
        scale = 1.0 / np.sqrt(hidden)
        k1, k2 = jax.random.split(key)
        self.input_weights = _uniform(k1, (input_size, 4 * hidden), scale)
        self.hidden_weights = _uniform(k2, (hidden, 4 * hidden), scale)
        self.bias = jnp.zeros(4 * hidden).at[hidden : 2 * hidden].set(1.0)  # forget gates open at first

    def __call__(self, inputs):
        B, H = inputs.shape[0], self.hidden_weights.shape[0]
        projected = jnp.moveaxis(inputs @ self.input_weights + self.bias, 1, 0)  # [T, B, 4H]

        def step(state, projected_t):
            hidden, cell = state
            i, f, g, o = jnp.split(projected_t + hidden @ self.hidden_weights, 4, -1)
            cell = jax.nn.sigmoid(f) * cell + jax.nn.sigmoid(i) * jnp.tanh(g)
            hidden = jax.nn.sigmoid(o) * jnp.tanh(cell)
            return (hidden, cell), hidden

        zeros = jnp.zeros((B, H), inputs.dtype)
        _, hidden = jax.lax.scan(step, (zeros, zeros), projected)
        return jnp.moveaxis(hidden, 0, 1)


def _reverse_within(x, lengths):
    """Each row's first `length` positions reversed (padding stays in place):
    its own inverse, so the backward LSTM reads each sentence from its end."""
    T = x.shape[1]
    t = jnp.arange(T)
    index = jnp.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return jnp.take_along_axis(x, index[:, :, None], 1)


def _dropout(x, rate, key):
    if key is None or rate == 0.0:
        return x
    return jnp.where(jax.random.bernoulli(key, 1.0 - rate, x.shape), x / (1.0 - rate), 0.0)


class Encoder(eqx.Module):
    """Sentences `Batch` -> emission scores `[B, T, L]`."""

    word_embedding: jax.Array
    case_embedding: jax.Array
    char_embedding: jax.Array
    char_filters: jax.Array  # [3 * char_dim, filters]: a width-3 convolution over each word's characters
    char_bias: jax.Array
    forward_lstm: LSTM
    backward_lstm: LSTM
    output: eqx.nn.Linear
    dropout: float = eqx.field(static=True)

    def __init__(self, vocab: Vocabulary, config: dict, *, key):
        keys = jax.random.split(key, 7)
        dim = config["word_dim"] + config["case_dim"] + config["char_filters"]
        self.word_embedding = _uniform(
            keys[0], (len(vocab.words) + 2, config["word_dim"]), np.sqrt(3 / config["word_dim"])
        )
        self.case_embedding = _uniform(keys[1], (NUM_CASINGS, config["case_dim"]), np.sqrt(3 / config["case_dim"]))
        self.char_embedding = _uniform(
            keys[2], (len(vocab.chars) + 2, config["char_dim"]), np.sqrt(3 / config["char_dim"])
        )
        self.char_filters = _uniform(
            keys[3], (3 * config["char_dim"], config["char_filters"]), 1 / np.sqrt(3 * config["char_dim"])
        )
        self.char_bias = jnp.zeros(config["char_filters"])
        self.forward_lstm = LSTM(dim, config["hidden"], key=keys[4])
        self.backward_lstm = LSTM(dim, config["hidden"], key=keys[5])
        self.output = eqx.nn.Linear(2 * config["hidden"], len(vocab.labels), key=keys[6])
        self.dropout = config["dropout"]

    def _char_features(self, chars):
        present = chars > 0  # [B, T, C]
        embedded = jnp.where(present[..., None], self.char_embedding[chars], 0.0)
        padded = jnp.pad(embedded, ((0, 0), (0, 0), (1, 1), (0, 0)))
        windows = jnp.concatenate([padded[:, :, :-2], padded[:, :, 1:-1], padded[:, :, 2:]], -1)
        convolved = windows @ self.char_filters + self.char_bias  # [B, T, C, F]
        pooled = jnp.max(jnp.where(present[..., None], convolved, -jnp.inf), 2)
        return jnp.where(jnp.any(present, -1)[..., None], pooled, 0.0)

    def __call__(self, batch: Batch, key=None):
        keys = (None, None) if key is None else tuple(jax.random.split(key))
        inputs = jnp.concatenate(
            [self.word_embedding[batch.words], self.case_embedding[batch.cases], self._char_features(batch.chars)], -1
        )
        inputs = _dropout(inputs, self.dropout, keys[0])
        forward = self.forward_lstm(inputs)
        backward = _reverse_within(self.backward_lstm(_reverse_within(inputs, batch.lengths)), batch.lengths)
        hidden = _dropout(jnp.concatenate([forward, backward], -1), self.dropout, keys[1])
        return hidden @ self.output.weight.T + self.output.bias


class Model(eqx.Module):
    """The encoder and its head: a `CRF`, or None for the softmax head."""

    encoder: Encoder
    crf: CRF | None


def loss(model: Model, batch: Batch, key):
    """Mean over the batch's sentences of the head's negative log-likelihood
    (filler rows of length 0 add 0); and the number of sentences left out."""
    emissions = model.encoder(batch, key)
    if model.crf is None:
        log_probabilities = jax.nn.log_softmax(emissions, -1)
        inside = batch.tags >= 0
        gold = jnp.take_along_axis(log_probabilities, jnp.maximum(batch.tags, 0)[..., None], -1)[..., 0]
        per_sentence = -jnp.sum(jnp.where(inside, gold, 0.0), -1)
        return jnp.mean(per_sentence), jnp.zeros((), jnp.int32)
    log_likelihood = model.crf.log_likelihood(emissions, batch.tags, lengths=batch.lengths)
    fitted = jnp.isfinite(log_likelihood)  # gold tags invalid in IOB2: -inf, left out
    return -jnp.mean(jnp.where(fitted, log_likelihood, 0.0)), jnp.sum(~fitted)


@eqx.filter_jit
def decode(model: Model, batch: Batch):
    emissions = model.encoder(batch)
    if model.crf is None:
        return jnp.argmax(emissions, -1)  # positions past each length are not read
    return model.crf.decode(emissions, lengths=batch.lengths)[1]


@functools.cache
def adam(learning_rate: float, clip: float):
    """One optimizer object per setting, so that `train_step` compiles once per shape."""
    return optax.chain(optax.clip_by_global_norm(clip), optax.adam(learning_rate))


@eqx.filter_jit
def train_step(parameters, static, state, batch: Batch, key, optimizer):
    (value, left_out), gradient = jax.value_and_grad(lambda p: loss(eqx.combine(p, static), batch, key), has_aux=True)(
        parameters
    )
    updates, state = optimizer.update(gradient, state, parameters)
    return optax.apply_updates(parameters, updates), state, value, left_out


# ---------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------


def predict(model: Model, data: Bucketed, sentences, labels):
    """Label strings per sentence, and the decoding seconds (results on the host)."""
    out = [None] * len(sentences)
    start = time.perf_counter()
    decoded = [np.asarray(decode(model, batch)) for batch in data.batches]
    seconds = time.perf_counter() - start
    for batch, members, tags in zip(data.batches, data.members, decoded):
        for row, index in enumerate(members):
            if index >= 0:
                out[index] = tuple(labels[j] for j in tags[row, : batch.lengths[row]])
    return out, seconds


def entity_f1(model, data: Bucketed, sentences, labels) -> tuple[float, float]:
    """(F1 in percent, decoding seconds)."""
    predicted, seconds = predict(model, data, sentences, labels)
    return 100 * metrics.entity_scores([s.labels for s in sentences], predicted).f1, seconds


def train_head(
    run: RunDirectory, head: str, splits: Splits, vocab: Vocabulary, data: dict, config: dict, progress: bool
) -> dict:
    """Train one head for `config["epochs"]` epochs, a checkpoint after each."""
    encoder_key, head_key, order_key, dropout_key = jax.random.split(jax.random.key(SEED), 4)
    crf = CRF.from_labels(vocab.labels, "IOB2", key=head_key) if head == "crf" else None
    model = Model(Encoder(vocab, config, key=encoder_key), crf)
    parameters, static = eqx.partition(model, eqx.is_inexact_array)
    optimizer = adam(config["learning_rate"], config["clip"])
    epochs = config["epochs"]
    state = optimizer.init(parameters)
    history = {
        "done": np.zeros((), np.int32),
        "loss": np.zeros(epochs),
        "seconds": np.zeros(epochs),
        "dev_f1": np.zeros(epochs),
        "test_f1": np.zeros(epochs),
        "left_out": np.zeros(epochs, np.int32),
    }
    directory = os.path.join(run.root, "checkpoints", head)
    latest = checkpoint.latest_checkpoint(directory)
    if latest is not None:
        parameters, state, history = checkpoint.load(latest, (parameters, state, history))
    train = data["train"]
    for epoch in range(int(history["done"]), epochs):
        order = np.asarray(jax.random.permutation(jax.random.fold_in(order_key, epoch), len(train.batches)))
        total, left_out = 0.0, 0
        start = time.perf_counter()
        for i in tqdm.tqdm(order, disable=not progress, leave=False, desc=f"{head} epoch {epoch + 1}"):
            key = jax.random.fold_in(dropout_key, epoch * len(order) + int(i))
            parameters, state, value, dropped = train_step(parameters, static, state, train.batches[i], key, optimizer)
            total, left_out = total + float(value), left_out + int(dropped)
        history["seconds"][epoch] = time.perf_counter() - start
        history["loss"][epoch], history["left_out"][epoch] = total / len(order), left_out
        trained = eqx.combine(parameters, static)
        history["dev_f1"][epoch] = entity_f1(trained, data["dev"], splits.dev, vocab.labels)[0]
        history["test_f1"][epoch] = entity_f1(trained, data["test"], splits.test, vocab.labels)[0]
        history["done"] = np.asarray(epoch + 1, np.int32)
        os.makedirs(directory, exist_ok=True)
        checkpoint.save(checkpoint.checkpoint_path(directory, epoch + 1), (parameters, state, history))
        checkpoint.prune_checkpoints(directory, 1)
        print(
            f"  {head} epoch {epoch + 1}: loss {history['loss'][epoch]:.3f}, esp.testa F1 "
            f"{history['dev_f1'][epoch]:.2f}, esp.testb F1 {history['test_f1'][epoch]:.2f} "
            f"({history['seconds'][epoch]:.0f} s)",
            flush=True,
        )
    trained = eqx.combine(parameters, static)
    entity_f1(trained, data["test"], splits.test, vocab.labels)  # compiled: the timing below is decoding only
    test_f1, decode_seconds = entity_f1(trained, data["test"], splits.test, vocab.labels)
    best = int(np.argmax(history["dev_f1"]))
    seconds = [float(s) for s in history["seconds"]]
    steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
    return {
        "head": head,
        "epochs": epochs,
        "best_dev_epoch": best + 1,
        "test_f1_at_best_dev": float(history["test_f1"][best]),
        "test_f1_last": test_f1,
        "dev_f1": [float(v) for v in history["dev_f1"]],
        "test_f1": [float(v) for v in history["test_f1"]],
        "loss": [float(v) for v in history["loss"]],
        "epoch_seconds": seconds,
        "train_tokens_per_second": train.num_tokens / steady,
        "first_epoch_extra_seconds": max(seconds[0] - steady, 0.0),
        "decode_tokens_per_second": data["test"].num_tokens / decode_seconds,
        "training_sentences_left_out": int(history["left_out"][-1]),
        "parameters": int(sum(x.size for x in jax.tree_util.tree_leaves(parameters))),
    }


def sparse_tagger_results(path: str = TAGGER_RESULTS) -> dict | None:
    """The sparse-feature Tagger's stored esp.testb F1 and training time."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError:
        return None
    f1 = re.search(r"esp\.testb: f1 crfsuite ([\d.]+)\s+lossfns ([\d.]+)", text)
    seconds = re.search(r"training seconds: crfsuite ([\d.]+)\s+lossfns ([\d.]+)", text)
    if f1 is None:
        return None
    return {
        "test_f1": 100 * float(f1.group(2)),
        "crfsuite_test_f1": 100 * float(f1.group(1)),
        "train_seconds": float(seconds.group(2)) if seconds else None,
        "source": os.path.relpath(path),
    }


def run(run: RunDirectory, *, quick: bool = False, progress: bool = True, tasks=None) -> dict:
    """Train both heads (`tasks`: a subset of `HEADS`), write the table."""
    config = QUICK if quick else FULL
    heads = select_tasks("neural_tagger", tasks, HEADS)
    splits = load(config["num_train"], config["num_eval"])
    vocab = vocabulary(splits.train, splits.labels)
    data = {name: bucketise(getattr(splits, name), vocab, config) for name in ("train", "dev", "test")}
    print(
        f"{splits.source}: {len(splits.train)} training sentences ({data['train'].num_tokens} tokens), "
        f"{len(vocab.words) + 2} words, {len(vocab.chars) + 2} characters, {len(vocab.labels)} tags",
        flush=True,
    )
    results = {}
    for head in heads:
        result = run.unit(head, lambda head=head: train_head(run, head, splits, vocab, data, config, progress))
        if result is not None:
            results[head] = result
    tagger = sparse_tagger_results()
    rows = [
        [
            f"{head} head",
            r["test_f1_at_best_dev"],
            r["test_f1_last"],
            r["best_dev_epoch"],
            f"{r['train_tokens_per_second']:,.0f}",
            f"{r['decode_tokens_per_second']:,.0f}",
            f"{sum(r['epoch_seconds']):.0f}",
        ]
        for head, r in results.items()
    ]
    if tagger is not None:
        rows.append(
            [
                "sparse-feature Tagger (stored, crfsuite_ner features, OWL-QN)",
                tagger["test_f1"],
                None,
                None,
                None,
                None,
                tagger["train_seconds"],
            ]
        )
    lines = [
        f"# A neural tagger with a CRF head ({'quick' if quick else 'full'} run)",
        "",
        f"Data: {splits.source}; {len(splits.train)} training sentences ({data['train'].num_tokens} tokens), "
        f"{len(splits.test)} test sentences ({data['test'].num_tokens} tokens).",
        "",
        f"Network: {config['word_dim']}-dim word embeddings, {config['case_dim']}-dim casing, "
        f"{config['char_filters']} character filters (width 3, {config['char_dim']}-dim characters), BiLSTM "
        f"{config['hidden']} per direction, dropout {config['dropout']}; Adam {config['learning_rate']}, "
        f"clipping {config['clip']}, about {config['tokens_per_batch']} tokens a batch, {config['epochs']} epochs.",
        "",
        markdown_table(
            [
                "model",
                "esp.testb F1 (best esp.testa epoch)",
                "esp.testb F1 (last epoch)",
                "best epoch",
                "training tokens/s",
                "decoding tokens/s",
                "training s",
            ],
            rows,
        ),
    ]
    if tagger is not None:
        lines += [
            f"The sparse Tagger's row is read from `{tagger['source']}` (CRFsuite: "
            f"{tagger['crfsuite_test_f1']:.2f}); its time includes feature extraction.",
            "",
        ]
    if "crf" in results and "softmax" in results:
        crf, softmax = results["crf"], results["softmax"]
        gain = crf["test_f1_at_best_dev"] - softmax["test_f1_at_best_dev"]
        late = {head: np.asarray(r["test_f1"][-(len(r["test_f1"]) + 1) // 2 :]) for head, r in results.items()}
        lines += [
            f"CRF head over softmax head: {gain:+.2f} F1 (best esp.testa epoch); over the last "
            f"{len(late['crf'])} epochs esp.testb F1 {late['crf'].mean():.2f} +- {late['crf'].std():.2f} "
            f"against {late['softmax'].mean():.2f} +- {late['softmax'].std():.2f} (one seed: the spread "
            f"between epochs is the noise to compare the gap with). Training speed ratio (CRF / softmax) "
            f"{crf['train_tokens_per_second'] / softmax['train_tokens_per_second']:.2f}, decoding "
            f"{crf['decode_tokens_per_second'] / softmax['decode_tokens_per_second']:.2f}; training "
            f"sentences left out of the CRF head's loss (gold tags invalid in IOB2): "
            f"{crf['training_sentences_left_out']}.",
            "",
        ]
    run.write_text("results.md", "\n".join(lines) + "\n")
    summary = {"quick": quick, "config": config, "source": splits.source, "heads": results, "sparse_tagger": tagger}
    run.write_json("results.json", summary)
    return summary
