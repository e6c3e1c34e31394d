"""Tagged corpora sampled from a planted model, so that every experiment runs
on a fresh machine without any corpus.

The planted model is an HMM over labels whose emissions are word strings with
label-dependent spelling: each label has its own Zipf-distributed lexicon,
and a lexicon word carries one of the label's suffixes and its capitalisation
habit most of the time. Some lexicon entries are borrowed from other labels
(ambiguous words), and most of the lexicon is rare, so that, as on real text:
word identity alone (S1) leaves unseen and ambiguous words to the
transitions, spelling of the current word (S2) recovers many of them, and the
neighbours' spelling (S3) adds context. `scheme="iob"` gives IOB2 entity
labels (`I-X` only after `B-X` or `I-X`), `scheme="pos"` twelve free tags.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

ENTITY_TYPES = ("PER", "LOC", "ORG")
NUM_POS_TAGS = 12
LETTERS = "bcdfghjklmnprstvz"
VOWELS = "aeiou"


class PlantedModel(NamedTuple):
    """labels `[L]`; start `[L]` and transitions `[L, L]` probabilities;
    lexicons: per label, its words (most frequent first) and their
    probabilities."""

    labels: tuple[str, ...]
    start: np.ndarray
    transitions: np.ndarray
    lexicons: tuple[tuple[str, ...], ...]
    word_probabilities: tuple[np.ndarray, ...]


def _labels(scheme: str) -> tuple[str, ...]:
    if scheme == "iob":
        return ("O",) + tuple(f"{prefix}-{kind}" for kind in ENTITY_TYPES for prefix in ("B", "I"))
    if scheme == "pos":
        return tuple(f"T{index}" for index in range(NUM_POS_TAGS))
    raise ValueError(f"scheme must be 'iob' or 'pos', got {scheme!r}")


def _allowed_transitions(labels: tuple[str, ...]) -> np.ndarray:
    """`[L, L]` booleans: IOB2 forbids `I-X` except after `B-X` or `I-X`."""
    allowed = np.ones((len(labels), len(labels)), bool)
    for j, label in enumerate(labels):
        if label.startswith("I-"):
            allowed[:, j] = [previous[2:] == label[2:] and previous != "O" for previous in labels]
    return allowed


def _stem(rng: np.random.Generator) -> str:
    syllables = rng.integers(1, 3)
    return "".join(rng.choice(list(LETTERS)) + rng.choice(list(VOWELS)) for _ in range(syllables))


def _lexicon(rng, label_index: int, num_words: int, suffixes, capital_probability: float) -> list[str]:
    words = []
    for _ in range(num_words):
        suffix = rng.choice(suffixes) if rng.random() < 0.8 else _stem(rng)[:2]
        word = _stem(rng) + suffix
        if rng.random() < capital_probability:
            word = word.capitalize()
        if label_index % 5 == 4 and rng.random() < 0.5:
            word = word + str(rng.integers(10))
        words.append(word)
    return words


def planted_model(seed: int, scheme: str, words_per_label: int = 400, ambiguity: float = 0.15) -> PlantedModel:
    """A random planted model (deterministic in `seed`)."""
    rng = np.random.default_rng(seed)
    labels = _labels(scheme)
    L = len(labels)
    allowed = _allowed_transitions(labels)
    transitions = rng.dirichlet(np.full(L, 0.5), size=L) * allowed
    if scheme == "iob":
        transitions[:, 0] += 2.0  # entities are rare: most tokens are O
    transitions /= transitions.sum(1, keepdims=True)
    start = rng.dirichlet(np.full(L, 0.5)) * allowed[0] * np.array([not label.startswith("I-") for label in labels])
    start /= start.sum()
    suffix_pool = [_stem(rng)[:2] + rng.choice(list(LETTERS)) for _ in range(4 * L)]
    lexicons = []
    for index, label in enumerate(labels):
        suffixes = suffix_pool[3 * index : 3 * index + 3]
        capital = (0.9 if label != "O" else 0.1) if scheme == "iob" else float(rng.choice([0.02, 0.1, 0.6]))
        lexicons.append(_lexicon(rng, index, words_per_label, suffixes, capital))
    for index in range(L):  # borrow words from other labels: ambiguous types
        for position in np.flatnonzero(rng.random(words_per_label) < ambiguity):
            other = rng.integers(L)
            lexicons[index][position] = lexicons[other][rng.integers(words_per_label // 4)]
    zipf = 1.0 / np.arange(1, words_per_label + 1) ** 1.1
    zipf /= zipf.sum()
    return PlantedModel(labels, start, transitions, tuple(map(tuple, lexicons)), tuple(zipf for _ in labels))


def sample_sentences(
    model: PlantedModel, rng: np.random.Generator, count: int, mean_length: float = 14.0
) -> list[tuple[list[str], list[str]]]:
    """`count` sentences `(tokens, tags)` sampled from the planted model."""
    sentences = []
    for _ in range(count):
        length = max(1, int(rng.poisson(mean_length)))
        label = rng.choice(len(model.labels), p=model.start)
        tokens, tags = [], []
        for _ in range(length):
            word = model.lexicons[label][rng.choice(len(model.lexicons[label]), p=model.word_probabilities[label])]
            tokens.append(word)
            tags.append(model.labels[label])
            label = rng.choice(len(model.labels), p=model.transitions[label])
        sentences.append((tokens, tags))
    return sentences


def synthetic_corpus(seed: int, scheme: str, num_train: int, num_test: int):
    """`(train, test, labels)` from one planted model; train and test are
    independent samples (different generator streams)."""
    model = planted_model(seed, scheme)
    train = sample_sentences(model, np.random.default_rng([seed, 1]), num_train)
    test = sample_sentences(model, np.random.default_rng([seed, 2]), num_test)
    return train, test, model.labels
