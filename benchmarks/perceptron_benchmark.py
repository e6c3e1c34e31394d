"""The averaged perceptron at 333 labels: lossfns against CRFsuite (issue 8).

Task: conll2000 with joint `POS|chunk` labels (`experiments.lavergne2010.joint_labels`;
the 333 labels of train.txt and test.txt; 319 of them occur in train.txt),
the whole of train.txt (8,936 sentences, 211,727 tokens), `lavergne_pos`
observation features (word, lower-cased word, shape, prefixes and suffixes
up to 4 letters, words and word pairs in a window of 5: 548,385 strings).

* CRFsuite: python-crfsuite's trainer with algorithm 'ap' (averaged
  perceptron) on exactly the same feature strings and labels, with
  `max_iterations = 1` for an epoch (its own per-epoch time is read from its
  log; the wall time of `train()` also holds its feature generation and the
  model file) and `max_iterations = max(epochs)` for accuracy.
* lossfns: `sparse_perceptron_epoch` (`lossfns.training.sparse_perceptron`), one
  jitted epoch in corpus order; compile time is measured apart (`lower` +
  `compile`), then each repeat runs a first epoch from zero weights.

Both run in the same process, interleaved, medians over `repeats`; the ratio
is CRFsuite's epoch over lossfns's. Token accuracy on test.txt after each of
`epochs` epochs, averaged weights (lossfns decodes the test set with
`lossfns.lattices.chain.viterbi`). Needs NLTK_DATA and python-crfsuite.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from lossfns import corpora
from lossfns.features import FeatureIndex, preset
from lossfns.lattices import chain
from lossfns.training.sparse_perceptron import (
    sparse_averaged_params,
    sparse_perceptron_epoch,
    sparse_perceptron_init,
    sparse_scores,
    sparse_sequence_data,
)

FEATURES = "lavergne_pos"


def joint_labels(sentence: corpora.Sentence) -> corpora.Sentence:
    """Tokens `(word,)`, labels `POS|chunk` (as `experiments.lavergne2010.joint_labels`)."""
    return corpora.Sentence(
        tuple((row[0],) for row in sentence.tokens),
        tuple(f"{row[1]}|{label}" for row, label in zip(sentence.tokens, sentence.labels)),
    )


def _crfsuite_trainer(features, train):
    import pycrfsuite

    trainer = pycrfsuite.Trainer(algorithm="ap", verbose=False)
    for observations, sentence in zip(features, train):
        trainer.append(observations, list(sentence.labels))
    return trainer


def _crfsuite_train(trainer, epochs: int, test_features=None, test=None):
    """Train `epochs` epochs; `(wall seconds of train(), CRFsuite's per-epoch
    seconds, test token accuracy or None)`."""
    import pycrfsuite

    trainer.set_params({"max_iterations": epochs})
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.crfsuite")
        start = time.perf_counter()
        trainer.train(path)
        wall = time.perf_counter() - start
        per_epoch = [float(it["time"]) for it in trainer.logparser.iterations]
        accuracy = None
        if test is not None:
            tagger = pycrfsuite.Tagger()
            tagger.open(path)
            predicted = [tagger.tag(observations) for observations in test_features]
            tagger.close()
            accuracy = _token_accuracy(test, predicted)
    return wall, per_epoch, accuracy


def _token_accuracy(sentences, predicted) -> float:
    right = sum(p == g for s, labels in zip(sentences, predicted) for p, g in zip(labels, s.labels))
    return right / sum(len(s.labels) for s in sentences)


def _padded_ids(encoded, num_features, length, width):
    out = np.full((len(encoded), length, width), num_features, np.int32)
    for b, sentence in enumerate(encoded):
        for t, token in enumerate(sentence):
            out[b, t, : len(token)] = token
    return out


def make_decoder(test_ids, num_features, batch: int = 64):
    """`decode(emission, transitions) -> [N, T]` Viterbi labels of the test
    sentences (dense `chain.viterbi`, float weights), in fixed-size batches."""
    lengths = np.asarray([len(s) for s in test_ids], np.int32)
    length = int(lengths.max())
    width = max(len(token) for s in test_ids for token in s)
    count = -(-len(test_ids) // batch) * batch
    ids = np.full((count, length, width), num_features, np.int32)
    ids[: len(test_ids)] = _padded_ids(test_ids, num_features, length, width)
    padded_lengths = np.zeros(count, np.int32)
    padded_lengths[: len(test_ids)] = lengths

    @jax.jit
    def decode_batch(emission, transitions, ids, lengths):
        return chain.viterbi(chain.FactoredPotentials(sparse_scores(emission, ids), transitions), lengths)[1]

    def decode(emission, transitions):
        out = [
            np.asarray(
                decode_batch(
                    emission, transitions, jnp.asarray(ids[i : i + batch]), jnp.asarray(padded_lengths[i : i + batch])
                )
            )
            for i in range(0, count, batch)
        ]
        return np.concatenate(out)[: len(test_ids)]

    return decode


def run(quick: bool = False, epochs=(1, 5), repeats: int = 3, log=print):
    """Returns a JSON-able record (or `{"skipped": reason}`)."""
    try:
        import pycrfsuite  # noqa: F401
    except ImportError:
        return {"skipped": "python-crfsuite is not installed"}
    try:
        train = [joint_labels(s) for s in corpora.conll2000("train.txt", task="chunk")]
        test = [joint_labels(s) for s in corpora.conll2000("test.txt", task="chunk")]
    except (LookupError, OSError, ValueError) as error:
        return {"skipped": f"conll2000 not found under NLTK_DATA: {error}"}
    epochs = tuple(sorted({int(e) for e in epochs}))
    if quick:
        train, test, epochs, repeats = train[:300], test[:100], (1, 2), 1
    labels = sorted({label for s in train + test for label in s.labels})
    lookup = {label: i for i, label in enumerate(labels)}
    extractor = preset(FEATURES)
    start = time.perf_counter()
    train_extracted = [extractor(s.tokens) for s in train]
    test_extracted = [extractor(s.tokens) for s in test]
    train_features = [f.unigram for f in train_extracted]
    test_features = [f.unigram for f in test_extracted]
    index = FeatureIndex.build(train_extracted)
    train_ids = [index.encode(f)[0] for f in train_extracted]
    test_ids = [index.encode(f)[0] for f in test_extracted]
    data = sparse_sequence_data(train_ids, [[lookup[label] for label in s.labels] for s in train], index.num_unigram)
    max_length = int(max(len(s.labels) for s in train))
    tokens = int(sum(len(s.labels) for s in train))
    featurise_seconds = time.perf_counter() - start
    num_features, num_labels = index.num_unigram, len(labels)
    log(
        f"perceptron benchmark: {len(train)} sentences, {tokens} tokens, {num_labels} labels "
        f"({len({l for s in train for l in s.labels})} in train), {num_features} {FEATURES} features; "
        f"epochs {epochs}, {repeats} repeats"
    )

    epoch = jax.jit(sparse_perceptron_epoch, static_argnames=("max_length",), donate_argnums=0)
    start = time.perf_counter()
    compiled = epoch.lower(sparse_perceptron_init(num_features, num_labels), data, max_length=max_length).compile()
    compile_seconds = time.perf_counter() - start
    log(f"  lossfns compile {compile_seconds:.1f} s")

    trainer = _crfsuite_trainer(train_features, train)
    crfsuite_wall, crfsuite_epoch, lossfns_epoch, mistakes = [], [], [], []
    for _ in range(repeats):
        wall, per_epoch, _ = _crfsuite_train(trainer, 1)
        crfsuite_wall.append(wall)
        crfsuite_epoch.append(per_epoch[0])
        state = jax.block_until_ready(sparse_perceptron_init(num_features, num_labels))
        start = time.perf_counter()
        state, (mistaken, branches) = jax.block_until_ready(compiled(state, data))
        lossfns_epoch.append(time.perf_counter() - start)
        mistakes.append(int(mistaken))
        del state
        log(f"  epoch 1: crfsuite {per_epoch[0]:.2f} s (train() wall {wall:.2f} s), lossfns {lossfns_epoch[-1]:.3f} s")

    # Accuracy after each of `epochs`, both trainers from scratch.
    lossfns_accuracy, lossfns_epoch_seconds, lossfns_mistakes, decoder_counts = {}, [], [], []
    decode = make_decoder(test_ids, num_features)
    gold = test
    state = sparse_perceptron_init(num_features, num_labels)
    for e in range(1, max(epochs) + 1):
        start = time.perf_counter()
        state, (mistaken, branches) = jax.block_until_ready(compiled(state, data))
        lossfns_epoch_seconds.append(time.perf_counter() - start)
        lossfns_mistakes.append(int(mistaken))
        decoder_counts.append(np.asarray(branches).tolist())
        if e in epochs:
            emission, transitions = sparse_averaged_params(state)
            predicted = decode(emission, transitions)
            lossfns_accuracy[e] = _token_accuracy(
                gold, [[labels[i] for i in row[: len(s.labels)]] for row, s in zip(predicted, test)]
            )
            del emission, transitions
    del state
    crfsuite_accuracy, crfsuite_epoch_seconds = {}, None
    for e in epochs:
        wall, per_epoch, accuracy = _crfsuite_train(trainer, e, test_features, test)
        crfsuite_accuracy[e] = accuracy
        if e == max(epochs):
            crfsuite_epoch_seconds = per_epoch
    for e in epochs:
        log(
            f"  after {e} epoch(s): test token accuracy crfsuite {crfsuite_accuracy[e]:.4f}, "
            f"lossfns {lossfns_accuracy[e]:.4f}"
        )

    crfsuite_median, crfsuite_wall_median = statistics.median(crfsuite_epoch), statistics.median(crfsuite_wall)
    lossfns_median = statistics.median(lossfns_epoch)
    ratios = {
        "crfsuite_epoch_over_lossfns_epoch": crfsuite_median / lossfns_median,
        "crfsuite_train_wall_over_lossfns_epoch": crfsuite_wall_median / lossfns_median,
        "crfsuite_epoch_over_lossfns_epoch_plus_compile": crfsuite_median / (lossfns_median + compile_seconds),
    }
    log(
        f"  epoch 1 medians: crfsuite {crfsuite_median:.2f} s, lossfns {lossfns_median:.3f} s "
        f"(+ compile {compile_seconds:.1f} s once): {ratios['crfsuite_epoch_over_lossfns_epoch']:.1f}x faster"
    )
    return {
        "task": "conll2000 train.txt -> test.txt, joint POS|chunk labels, averaged perceptron",
        "features": FEATURES,
        "sentences": len(train),
        "tokens": tokens,
        "labels": num_labels,
        "labels_in_train": len({label for s in train for label in s.labels}),
        "num_features": num_features,
        "feature_occurrences": int(sum(len(t) for s in train_ids for t in s)),
        "repeats": repeats,
        "featurise_seconds": featurise_seconds,
        "crfsuite": {
            "epoch_seconds": crfsuite_epoch,
            "median_epoch_seconds": crfsuite_median,
            "train_wall_seconds_one_epoch": crfsuite_wall,
            "median_train_wall_seconds": crfsuite_wall_median,
            "epoch_seconds_in_accuracy_run": crfsuite_epoch_seconds,
            "test_token_accuracy": crfsuite_accuracy,
            "note": "epoch_seconds: CRFsuite's own log (clock(), processor time, single thread); "
            "train wall adds its feature generation and model writing",
        },
        "lossfns": {
            "compile_seconds": compile_seconds,
            "epoch_seconds": lossfns_epoch,
            "median_epoch_seconds": lossfns_median,
            "mistaken_sentences_epoch_1": mistakes,
            "epoch_seconds_in_accuracy_run": lossfns_epoch_seconds,
            "mistaken_sentences_per_epoch": lossfns_mistakes,
            "decoder_counts_per_epoch (dense int16, dense int32)": decoder_counts,
            "test_token_accuracy": lossfns_accuracy,
            "note": "wall time of one jitted epoch (block_until_ready), from zero weights",
        },
        "ratios": ratios,
    }
