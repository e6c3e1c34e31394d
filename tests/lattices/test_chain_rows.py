"""Rows of back-to-back chains (`chain.row_forward`, `row_score`,
`losses.row_sequence_log_loss`, `features.pack_rows`) against the same
chains one by one: brute-force enumeration, autodiff marginals, finite
differences, and the Tagger's objective on length buckets."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossfns import losses, semirings, testing
from lossfns.corpora import Sentence
from lossfns.features import corpus_arrays, encode, label_ids, pack, pack_rows
from lossfns.lattices import FactoredPotentials, chain
from lossfns.tagger import Tagger, TrainingData

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

L = 3
WIDTH = 8
ROWS = 3


@functools.cache
def jitted(name, *args, **kwargs):
    """One compiled `chain.<name>` per static configuration, shared by all tests."""
    return jax.jit(functools.partial(getattr(chain, name), *args, **kwargs))


@st.composite
def rows_of_chains(draw, factored):
    """`ROWS` rows of `WIDTH` positions, each holding random chains (lengths
    0..4, so rows may be empty, full or partly used) with forbidden (-inf)
    entries, plus the chains themselves for the one-by-one reference."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    transitions = np.where(rng.random((L, L)) < 0.2, -np.inf, rng.normal(size=(L, L)))
    start = rng.normal(size=L)
    unary = rng.normal(size=(ROWS, WIDTH, L))
    edges = np.where(rng.random((ROWS, WIDTH, L, L)) < 0.2, -np.inf, rng.normal(size=(ROWS, WIDTH, L, L)))
    labels = rng.integers(0, L, size=(ROWS, WIDTH))
    starts = np.zeros((ROWS, WIDTH), bool)
    lengths = np.zeros(ROWS, np.int32)
    chains = []  # (row, first position, length)
    for row in range(ROWS):
        used = 0
        while True:
            length = int(rng.integers(1, 5))
            if used + length > WIDTH or rng.random() < 0.15:
                break
            starts[row, used] = True
            chains.append((row, used, length))
            used += length
        lengths[row] = used
    if factored:
        potentials = FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions), jnp.asarray(start))
    else:
        potentials = jnp.asarray(edges)
    return potentials, jnp.asarray(starts), jnp.asarray(lengths), jnp.asarray(labels), chains


def chain_potentials(potentials, row, first, length):
    """The potentials of one chain of a row, as `chain` functions take them."""
    if isinstance(potentials, FactoredPotentials):
        return FactoredPotentials(
            potentials.unary[row, first : first + length], potentials.transitions, potentials.start
        )
    return potentials[row, first : first + length]


def per_row(chains, value):
    """Sum `value(row, first, length)` over each row's chains."""
    out = np.zeros(ROWS)
    for row, first, length in chains:
        out[row] += value(row, first, length)
    return out


@pytest.mark.parametrize("factored", [True, False], ids=["factored", "per-position"])
@given(data=st.data())
def test_row_values_match_enumeration_chain_by_chain(factored, data):
    potentials, starts, lengths, labels, chains = data.draw(rows_of_chains(factored))
    one = lambda row, first, length: chain_potentials(potentials, row, first, length)
    expected_log_z = per_row(chains, lambda *c: testing.log_partition(one(*c)))
    expected_best = per_row(chains, lambda *c: testing.viterbi(one(*c))[0])
    expected_score = per_row(chains, lambda r, f, n: testing.sequence_score(one(r, f, n), labels[r, f : f + n]))
    for semiring in (semirings.Log, semirings.Real):
        np.testing.assert_allclose(
            jitted("row_forward", semiring)(potentials, starts, lengths), expected_log_z, rtol=1e-9, atol=1e-9
        )
    np.testing.assert_allclose(
        jitted("row_forward", semirings.Max)(potentials, starts, lengths), expected_best, rtol=1e-9, atol=1e-9
    )
    np.testing.assert_allclose(
        jitted("row_score")(potentials, labels, starts, lengths), expected_score, rtol=1e-9, atol=1e-9
    )
    loss = jax.jit(losses.row_sequence_log_loss)(potentials, labels, starts, lengths)
    # A row with no allowed path has log Z = -inf: the loss is +inf (`excess_over_gold`).
    expected_loss = np.where(np.isfinite(expected_log_z), expected_log_z, 0.0) - expected_score
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-9, atol=1e-9)


@functools.cache
def row_marginals_fn(semiring):
    """Compiled derivative of the summed row log Z with respect to the potentials."""
    return jax.jit(jax.grad(lambda p, s, n: jnp.sum(chain.row_forward(semiring, p, s, n))))


@pytest.mark.parametrize("factored", [True, False], ids=["factored", "per-position"])
@given(data=st.data())
def test_row_marginals_match_enumeration_chain_by_chain(factored, data):
    """The gradient of a row's log Z holds each chain's own marginals at its positions."""
    potentials, starts, lengths, _, chains = data.draw(rows_of_chains(factored))
    for semiring in (semirings.Log, semirings.Real):
        row_marginals = row_marginals_fn(semiring)(potentials, starts, lengths)
        transitions, start = np.zeros((L, L)), np.zeros(L)
        for row, first, length in chains:
            edges = testing.marginals(chain_potentials(potentials, row, first, length))
            if factored:
                np.testing.assert_allclose(
                    row_marginals.unary[row, first : first + length], edges.sum(axis=-2), atol=1e-9
                )
                transitions += edges[1:].sum(axis=0)
                start += edges[0, 0]
            else:
                np.testing.assert_allclose(row_marginals[row, first : first + length], edges, atol=1e-9)
        used = np.arange(WIDTH)[None, :] < np.asarray(lengths)[:, None]
        unused = np.asarray(row_marginals.unary if factored else row_marginals)[~used]
        assert np.all(unused == 0)
        if factored:
            np.testing.assert_allclose(row_marginals.transitions, transitions, atol=1e-9)
            np.testing.assert_allclose(row_marginals.start, start, atol=1e-9)


@settings(max_examples=5)  # each example runs uncompiled second-order checks; enumeration covers the rest
@given(data=st.data())
def test_row_log_partition_finite_differences(data):
    potentials, starts, lengths, _, _ = data.draw(rows_of_chains(True))
    finite = FactoredPotentials(
        potentials.unary,
        jnp.where(jnp.isfinite(potentials.transitions), potentials.transitions, -3.0),
        potentials.start,
    )
    for semiring in (semirings.Log, semirings.Real):
        testing.check_gradients(
            lambda u, t, s: chain.row_forward(semiring, FactoredPotentials(u, t, s), starts, lengths),
            tuple(finite),
            order=2,
            modes=("rev",),
        )


@given(data=st.data())
def test_rows_vmapped_jitted_and_looped_agree(data):
    potentials, starts, lengths, _, _ = data.draw(rows_of_chains(True))
    batched = chain.row_forward(semirings.Real, potentials, starts, lengths)
    looped = [
        chain.row_forward(
            semirings.Real,
            FactoredPotentials(potentials.unary[r], potentials.transitions, potentials.start),
            starts[r],
            lengths[r],
        )
        for r in range(ROWS)
    ]
    np.testing.assert_allclose(batched, np.stack(looped), rtol=1e-12)
    np.testing.assert_allclose(jitted("row_forward", semirings.Real)(potentials, starts, lengths), batched, rtol=1e-12)


def test_rows_give_no_nan_where_everything_is_forbidden():
    unary = jnp.zeros((2, WIDTH, L), jnp.float32)
    transitions = jnp.full((L, L), -jnp.inf, jnp.float32)
    starts = jnp.zeros((2, WIDTH), bool).at[:, 4].set(True)
    lengths = jnp.asarray([WIDTH, 1], jnp.int32)
    potentials = FactoredPotentials(unary, transitions, jnp.zeros((L,), jnp.float32))
    value, grad = jax.value_and_grad(
        lambda p: jnp.sum(jnp.where(jnp.isfinite(v := chain.row_log_partition(p, starts, lengths)), v, 0.0))
    )(potentials)
    assert np.isfinite(value)
    assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(grad))
    # Row 1 holds one chain of length 1: log Z = log L; row 0 has no allowed path.
    np.testing.assert_allclose(chain.row_log_partition(potentials, starts, lengths), [-np.inf, np.log(L)], rtol=1e-6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: chain.row_log_partition(p, jnp.zeros((ROWS, WIDTH), jnp.int32)), "starts must be a bool array"),
        (lambda p: chain.row_log_partition(p, jnp.zeros((ROWS, WIDTH + 1), bool)), r"starts must .* shape \(3, 8\)"),
        (lambda p: chain.row_forward(semirings.Entropy, p, jnp.zeros((ROWS, WIDTH), bool)), "semiring must be"),
        (
            lambda p: chain.row_log_partition(p, jnp.zeros((ROWS, WIDTH), bool), jnp.full((ROWS,), WIDTH + 1)),
            "lengths must lie in",
        ),
    ],
)
def test_row_bad_inputs_name_the_argument(call, message):
    potentials = FactoredPotentials(jnp.zeros((ROWS, WIDTH, L)), jnp.zeros((L, L)))
    with pytest.raises(ValueError, match=message):
        call(potentials)


def test_pack_rows_places_every_sentence_once_contiguously():
    rng = np.random.default_rng(0)
    sentence_lengths = [int(n) for n in rng.integers(0, 12, size=40)] + [16]
    encoded = [([[i, t] for t in range(n)], [[] for _ in range(n)]) for i, n in enumerate(sentence_lengths)]
    labels = [[(i + t) % 3 for t in range(n)] for i, n in enumerate(sentence_lengths)]
    packed = pack_rows(encoded, labels)
    (positions,), (row_lengths,), (row_labels,), (starts,) = (
        packed.positions,
        packed.lengths,
        packed.labels,
        packed.starts,
    )
    width = positions.shape[1]
    assert width == 16 and np.all(row_lengths <= width)
    # Greedy rows are nearly as few as the tokens allow.
    assert positions.shape[0] <= -(-sum(sentence_lengths) // width) + 1
    seen = []
    for r in range(positions.shape[0]):
        used = row_lengths[r]
        assert np.all(positions[r, used:] == -1) and np.all(row_labels[r, used:] == -1)
        assert not np.any(starts[r, used:]) and (used == 0 or starts[r, 0])
        bounds = list(np.flatnonzero(starts[r, :used])) + [used]
        for a, b in itertools.pairwise(bounds):
            sentence = int(packed.unigram_ids[positions[r, a], 0])
            seen.append(sentence)
            assert b - a == sentence_lengths[sentence]
            np.testing.assert_array_equal(packed.unigram_ids[positions[r, a:b], 1], np.arange(b - a))
            np.testing.assert_array_equal(row_labels[r, a:b], labels[sentence])
    assert sorted(seen) == [i for i, n in enumerate(sentence_lengths) if n > 0]
    assert sorted(packed.members[0].tolist()) == sorted(seen)
    # Narrower rows: the sentences longer than `width` go into a second bucket, as wide as the longest.
    narrow = pack_rows(encoded, labels, width=8)
    assert [p.shape[1] for p in narrow.positions] == [8, 16]
    for positions, row_lengths, row_labels, members, starts in zip(
        narrow.positions, narrow.lengths, narrow.labels, narrow.members, narrow.starts
    ):
        assert np.all(row_lengths <= positions.shape[1]) and starts.sum() == members.size
        np.testing.assert_array_equal(np.sort(packed.unigram_ids[positions[starts], 0]), np.sort(members))
        assert all((sentence_lengths[i] > 8) == (positions.shape[1] == 16) for i in members.tolist())
        tokens = positions[positions >= 0]
        np.testing.assert_array_equal(
            row_labels[positions >= 0], [labels[int(i)][int(t)] for i, t in narrow.unigram_ids[tokens]]
        )
    assert sorted(np.concatenate(narrow.members).tolist()) == sorted(seen)
    with pytest.raises(ValueError, match="width must be a positive int"):
        pack_rows(encoded, labels, width=0)


# Unigram features, and label-pair-observation features (per-position potentials).
FEATURE_SETS = {"crfsuite_ner": "crfsuite_ner", "pair-templates": "U00:%x[0,0]\nU01:%x[0,1]\nB\nB10:%x[0,1]\n"}


@pytest.mark.parametrize("features", FEATURE_SETS.values(), ids=FEATURE_SETS.keys())
def test_tagger_objective_on_rows_equals_buckets(features):
    """The Tagger's default training data (rows) gives the objective and
    gradient of the same sentences in length buckets."""
    rng = np.random.default_rng(1)
    words, tags = ["a", "b", "c", "d", "e"], ["B-X", "I-X", "O"]
    sentences = [
        Sentence(
            tuple((words[w], "NC") for w in rng.integers(0, 5, size=n)),
            tuple(tags[t] for t in rng.integers(0, 3, size=n)),
        )
        for n in rng.integers(1, 9, size=30)
    ]
    tagger = Tagger(features, l1=0.1, l2=0.1, max_iterations=1, dtype=jnp.float64, progress=False)
    tagger.fit(sentences)
    assert (tagger.index.num_pair > 0) == (features != "crfsuite_ner")
    params = jax.tree_util.tree_map(lambda x: x + 0.3 * jnp.asarray(rng.normal(size=x.shape)), tagger.model.weights())
    rows = tagger.training_data(sentences)
    encoded = encode(tagger.index, tagger.extractor, sentences)
    buckets = TrainingData(
        corpus_arrays(pack(encoded, label_ids(sentences, tagger.labels), 3), tagger.index.num_unigram),
        tagger.model.structure(),
    )
    assert rows.arrays.starts is not None and buckets.arrays.starts is None
    objective = jax.jit(jax.value_and_grad(tagger.objective()))
    (row_value, row_grad), (bucket_value, bucket_grad) = objective(params, rows), objective(params, buckets)
    np.testing.assert_allclose(row_value, bucket_value, rtol=1e-12)
    for a, b in zip(jax.tree_util.tree_leaves(row_grad), jax.tree_util.tree_leaves(bucket_grad)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
