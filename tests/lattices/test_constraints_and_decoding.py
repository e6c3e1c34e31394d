"""Label-scheme constraints and the Tagger's decoding.

Oracle for the schemes: a regular expression per scheme over the label
strings (an independent restatement of which chunk sequences are valid),
checked against `allowed_transitions` on every sequence up to length 4; for
`constrain`, brute-force enumeration (`lossfns.testing`) of the constrained
potentials in each form. Oracle for `Tagger.predict`, `predict_kbest` and
`predict_marginals`: enumeration of every label sequence of the model's own
potentials, keeping the valid ones."""

import itertools
import re

import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import testing
from lossfns.corpora import Sentence
from lossfns.features import pad_batch
from lossfns.lattices import chain
from lossfns.lattices.constraints import allowed_transitions, scheme_of
from lossfns.lattices.sparse_chain import SparsePotentials, to_dense
from lossfns.models import constrain
from lossfns.tagger import Tagger

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

LABELS = {
    "IOB2": ("O", "B-A", "I-A", "B-B", "I-B"),
    "IOBES": ("O", "B-A", "I-A", "E-A", "S-A", "S-B"),
    "BILOU": ("O", "B-A", "I-A", "L-A", "U-A", "U-B"),
}
PATTERNS = {
    "IOB2": r"(?:O |B-(\w+) (?:I-\1 )*)*",
    "IOBES": r"(?:O |S-\w+ |B-(\w+) (?:I-\1 )*E-\1 )*",
    "BILOU": r"(?:O |U-\w+ |B-(\w+) (?:I-\1 )*L-\1 )*",
}


def valid(scheme: str, sequence) -> bool:
    return re.fullmatch(PATTERNS[scheme], "".join(label + " " for label in sequence)) is not None


def moves_accept(moves, sequence) -> bool:
    return not sequence or (
        moves.start[sequence[0]]
        and moves.end[sequence[-1]]
        and all(moves.transitions[a, b] for a, b in itertools.pairwise(sequence))
    )


@pytest.mark.parametrize("scheme", sorted(LABELS))
def test_allowed_transitions_accept_exactly_the_valid_sequences(scheme):
    labels = LABELS[scheme]
    moves = allowed_transitions(labels, scheme)
    assert scheme_of(labels) == scheme
    for length in range(5):
        for sequence in itertools.product(range(len(labels)), repeat=length):
            assert moves_accept(moves, sequence) == valid(scheme, [labels[i] for i in sequence]), sequence


def test_scheme_of_and_bad_schemes():
    assert scheme_of(("NN", "VB", "DT")) is None and scheme_of(("O",)) == "IOB2"
    with pytest.raises(ValueError, match="scheme must be one of"):
        allowed_transitions(LABELS["IOB2"], "BIO")


def test_constrain_reads_a_missing_start_as_zeros():
    """`start=None` means zero start scores (as `FactoredPotentials` documents)."""
    labels = LABELS["IOB2"]
    L, lengths = len(labels), np.array([3, 2])
    unary, transitions = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, L))), jnp.zeros((L, L))
    moves = allowed_transitions(labels, "IOB2")
    without = constrain(chain.FactoredPotentials(unary, transitions), moves, lengths)
    zeros = constrain(chain.FactoredPotentials(unary, transitions, jnp.zeros(L)), moves, lengths)
    np.testing.assert_array_equal(chain.materialize(without), chain.materialize(zeros))


@pytest.mark.parametrize("form", ["factored", "sparse", "dense"])
def test_constrain_sets_exactly_the_invalid_sequences_to_minus_inf(form):
    scheme, labels = "IOBES", LABELS["IOBES"]
    L, T, lengths = len(labels), 4, np.array([4, 3, 1, 0])
    rng = np.random.default_rng(0)
    unary, transitions, start = rng.normal(size=(4, T, L)), rng.normal(size=(L, L)), rng.normal(size=L)
    if form == "factored":
        potentials = chain.FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions), jnp.asarray(start))
        dense = lambda p: np.asarray(chain.materialize(p))
    elif form == "sparse":
        previous, following = np.nonzero(rng.random((L, L)) < 0.5)
        pairs = rng.normal(size=(4, T, previous.size))
        potentials = SparsePotentials(
            jnp.asarray(unary), jnp.asarray(pairs), jnp.asarray(previous), jnp.asarray(following), jnp.asarray(start)
        )
        dense = lambda p: np.asarray(to_dense(p))
    else:
        potentials = jnp.asarray(rng.normal(size=(4, T, L, L)))
        dense = np.asarray
    moves = allowed_transitions(labels, scheme)
    before, after = dense(potentials), dense(constrain(potentials, moves, jnp.asarray(lengths)))
    for b, n in enumerate(lengths):
        sequences, free = testing.enumerate_sequences(before[b], int(n))
        _, bound = testing.enumerate_sequences(after[b], int(n))
        keep = np.array([valid(scheme, [labels[i] for i in s]) for s in sequences])
        np.testing.assert_allclose(bound[keep], free[keep], rtol=1e-12)
        assert np.all(bound[~keep] == -np.inf) and keep.any()


def _corpus(size=40, seed=0):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(10)]
    sentences = []
    for _ in range(size):
        ws = [words[int(i)] for i in rng.integers(0, 10, size=rng.integers(1, 7))]
        tags = [
            "B-X" if w in ("w1", "w2") else "I-X" if i and ws[i - 1] in ("w1", "w2") else "O" for i, w in enumerate(ws)
        ]
        sentences.append(Sentence(tuple((w,) for w in ws), tuple(tags)))
    return sentences


@pytest.fixture(scope="module")
def tagger():
    # Pair features (the sparse form) and few iterations: a model that is
    # unsure, so k-best and marginals are far from one-hot.
    return Tagger(
        "U00:%x[0,0]\nU01:%x[-1,0]\nB\nB01:%x[0,0]\n", l2=1.0, max_iterations=6, tol=0.0, num_buckets=2, progress=False
    ).fit(_corpus())


def _enumerated(tagger, sentence):
    """`(valid sequences [N, T], their log-probabilities among the valid ones [N])` by enumeration."""
    batch = pad_batch([tagger.index.encode(tagger.extractor(sentence.tokens))])
    potentials = tagger.model(jnp.asarray(batch.unigram_ids), jnp.asarray(batch.pair_ids))
    dense = to_dense(potentials) if isinstance(potentials, SparsePotentials) else potentials
    sequences, scores = testing.enumerate_sequences(np.asarray(dense)[0], len(sentence.tokens))
    keep = np.array([valid("IOB2", [tagger.labels[i] for i in s]) for s in sequences])
    scores = scores[keep] - np.logaddexp.reduce(scores[keep])
    return sequences[keep], scores


def test_predict_kbest_and_marginals_match_enumeration_of_valid_sequences(tagger):
    sentences = _corpus(8, seed=5) + [Sentence((), ())]
    best, kbest, marginals = (
        tagger.predict(sentences),
        tagger.predict_kbest(sentences, 4),
        tagger.predict_marginals(sentences),
    )
    assert len(best) == len(kbest) == len(marginals) == len(sentences)
    for sentence, top, candidates, probabilities in zip(sentences, best, kbest, marginals):
        if not sentence.tokens:
            assert top == () and candidates == [((), 0.0)] and probabilities.shape == (0, len(tagger.labels))
            continue
        sequences, scores = _enumerated(tagger, sentence)
        order = np.argsort(-scores, kind="stable")[:4]
        np.testing.assert_allclose([score for _, score in candidates], scores[order], rtol=1e-4, atol=1e-4)
        assert candidates[0][0] == top == tuple(tagger.labels[i] for i in sequences[order[0]])
        expected = np.zeros((len(sentence.tokens), len(tagger.labels)))
        for sequence, p in zip(sequences, np.exp(scores)):
            expected[np.arange(len(sequence)), sequence] += p
        np.testing.assert_allclose(probabilities, expected, atol=1e-5)
    assert max(abs(p.max() - 1) for p in marginals if p.size) > 0.05  # not one-hot: the check can fail
