"""Sequence boosting's sparse layout (`lossfns.training.chain_boosting`)
against its oracles: the closed-form ranges against enumeration of every
label sequence, every weak learner's bound against the true round objective
`Z_k(delta)` (enumeration), the whole run against the dense layout
(`sequence_boosting.boosting_data`: ranges from Viterbi runs, statistics recomputed every
round), the stop rules of `boost`, and resumption from its checkpoints."""

from __future__ import annotations

import functools
import importlib
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import training
from lossfns.models.linear_chain import LinearChainModel
from lossfns.optimizers import Status
from lossfns.training import SequenceData

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

# The package re-exports a function named like the module.
sequence_boosting = importlib.import_module("lossfns.training.sequence_boosting")

K_OBS, L, T, F = 6, 3, 5, 3


def _random_sequences(seed, N=7):
    rng = np.random.default_rng(seed)
    ids = rng.integers(-1, K_OBS, (N, T, F)).astype(np.int32)
    lengths = rng.integers(1, T + 1, N).astype(np.int32)
    labels = rng.integers(0, L, (N, T)).astype(np.int32)
    outside = np.arange(T)[None, :] >= lengths[:, None]
    labels[outside], ids[outside] = -1, -1
    return ids, labels, lengths


def _statistics_of(ids, labels, length):
    """`S(x, y)` `[K_OBS L + L^2 + L]` of one sequence, counted directly (the
    order of `LinearChainModel.flat()`)."""
    emission, transitions, start = np.zeros((K_OBS, L)), np.zeros((L, L)), np.zeros(L)
    for t in range(length):
        for feature in ids[t]:
            if feature >= 0:
                emission[feature, labels[t]] += 1
        if t:
            transitions[labels[t - 1], labels[t]] += 1
    if length:
        start[labels[0]] = 1
    return np.concatenate([emission.ravel(), transitions.ravel(), start])


def _enumerated(ids, labels, length):
    """`(S [L^T, K], gold index)`: the statistics of every label sequence of one sequence."""
    return _enumerated_cached(ids.tobytes(), ids.shape, labels.tobytes(), int(length))


@functools.cache
def _enumerated_cached(ids, shape, labels, length):
    ids, labels = np.frombuffer(ids, np.int32).reshape(shape), np.frombuffer(labels, np.int32)
    sequences = list(itertools.product(range(L), repeat=int(length)))
    table = np.stack([_statistics_of(ids, np.asarray(y, np.int64), length) for y in sequences])
    return table, sequences.index(tuple(labels[:length]))


@functools.cache
def _problem(seed):
    ids, labels, lengths = _random_sequences(seed)
    sparse = training.chain_boosting_data(ids, labels, lengths, K_OBS, L, tiers=(2, 4), dtype=jnp.float64)
    theta, unravel = LinearChainModel.zeros(K_OBS, L, dtype=jnp.float64).flat()
    potentials_fn = lambda weights, inputs: unravel(weights)(inputs)
    dense = sequence_boosting.boosting_data(
        potentials_fn, SequenceData(jnp.asarray(ids), jnp.asarray(labels), jnp.asarray(lengths)), theta.shape[0]
    )
    return (ids, labels, lengths), sparse, dense, potentials_fn


def test_closed_form_ranges_equal_enumeration():
    """Per sequence (one-sequence corpora, lengths 0 to 6, repeated labels
    and features included) and over a corpus: `[min_y u, max_y u]` of every
    weak learner, `u = S(x, y) - S(x, y_gold)` over all label sequences."""
    rng = np.random.default_rng(7)
    lowest, highest = [], []
    for length in range(7):
        ids = np.full((1, 6, F), -1, np.int32)
        ids[0, :length] = rng.integers(0, 2, (length, F))  # few distinct features: counts above 1
        labels = np.full((1, 6), -1, np.int32)
        labels[0, :length] = rng.integers(0, 2, length)  # few distinct labels: gold transitions repeat
        data = training.chain_boosting_data(ids, labels, [length], K_OBS, L, dtype=jnp.float64)
        if length:
            table, gold = _enumerated(ids[0], labels[0], length)
            u = table - table[gold]
            expected_low, expected_high = u.min(axis=0), u.max(axis=0)
        else:
            expected_low = expected_high = np.zeros(data.num_weak_learners)
        np.testing.assert_array_equal(data.lowest, expected_low)
        np.testing.assert_array_equal(data.highest, expected_high)
        lowest.append(expected_low)
        highest.append(expected_high)
    (ids, labels, lengths), sparse, dense, _ = _problem(0)
    # The dense layout's Viterbi ranges per sequence, and the corpus ranges of both.
    for index in range(len(lengths)):
        table, gold = _enumerated(ids[index], labels[index], lengths[index])
        np.testing.assert_array_equal(dense.lowest[index], (table - table[gold]).min(axis=0))
        np.testing.assert_array_equal(dense.highest[index], (table - table[gold]).max(axis=0))
    np.testing.assert_array_equal(sparse.lowest, np.min(dense.lowest, axis=0))
    np.testing.assert_array_equal(sparse.highest, np.max(dense.highest, axis=0))


def _true_round_objectives(theta, delta, problem):
    """`Z_k(delta_k) = sum_i D(i) sum_{y != y_i} pi_i(y) e^(delta_k u_ik(y))` `[K]`, by enumeration."""
    ids, labels, lengths = problem
    weights, terms = [], []
    for index in range(len(lengths)):
        table, gold = _enumerated(ids[index], labels[index], lengths[index])
        scores = table @ theta
        probabilities = np.exp(scores - np.logaddexp.reduce(scores))
        others = np.arange(len(scores)) != gold
        weights.append(1.0 / probabilities[gold] - 1.0)
        pi = probabilities[others] / (1.0 - probabilities[gold])
        terms.append(pi @ np.exp(delta[None, :] * (table[others] - table[gold])))
    weights = np.asarray(weights)
    return (weights / weights.sum()) @ np.stack(terms)


@functools.partial(jax.jit, static_argnames=("potentials_fn", "step"))
def _round_bounds(data, potentials_fn, theta, step):
    state = sequence_boosting.boosting_init(data, potentials_fn, max_steps=1, theta=theta)
    return sequence_boosting.round_bounds(data, state.statistics, state.log_exp_loss, step)


def test_every_bound_is_above_the_true_round_objective():
    """At the start and after 3 rounds, for every weak learner, both step
    rules, in both layouts (equal to each other)."""
    problem, sparse, dense, potentials_fn = _problem(0)
    run = sequence_boosting.boost(sparse, max_steps=3, tol=0.0)
    assert np.all(np.diff(np.asarray(run.trace)) < 0)
    for theta in (np.zeros(sparse.num_weak_learners), np.asarray(run.params)):
        for step in sequence_boosting.STEPS:
            bounds = {
                "sparse": _round_bounds(sparse, None, theta, step),
                "dense": _round_bounds(dense, potentials_fn, theta, step),
            }
            np.testing.assert_allclose(bounds["sparse"][0], bounds["dense"][0], atol=1e-12)
            np.testing.assert_allclose(bounds["sparse"][1], bounds["dense"][1], atol=1e-12)
            delta, bound = map(np.asarray, bounds["sparse"])
            true = _true_round_objectives(theta, delta, problem)
            assert np.all(bound >= true - 1e-12), step
            assert np.any(bound < 1.0 - 1e-3)  # some weak learner lowers the loss: not a vacuous check


def test_sparse_layout_equals_dense_layout():
    """Round by round: the chosen weak learners, steps, bounds and exp-loss
    trace of the sparse layout (incremental rounds, and full passes every 4
    rounds and after transition or start rounds) equal the dense layout's."""
    _, sparse, dense, potentials_fn = _problem(1)
    ours = sequence_boosting.boost(sparse, max_steps=15, tol=0.0, refresh_every=4)
    reference = sequence_boosting.boost(dense, potentials_fn, max_steps=15, tol=0.0)
    assert int(ours.num_steps) == int(reference.num_steps) == 15
    np.testing.assert_array_equal(ours.state.history.feature, reference.state.history.feature)
    np.testing.assert_allclose(ours.state.history.step, reference.state.history.step, atol=1e-12)
    np.testing.assert_allclose(ours.state.history.bound, reference.state.history.bound, atol=1e-12)
    np.testing.assert_allclose(ours.trace, reference.trace, atol=1e-12)
    np.testing.assert_allclose(ours.params, reference.params, atol=1e-12)
    # The exp-loss shrinks by at most each round's bound.
    trace = np.concatenate(
        [[float(sequence_boosting.boosting_init(sparse, max_steps=1).log_exp_loss)], np.asarray(ours.trace)]
    )
    assert np.all(np.diff(trace) <= np.log(np.asarray(ours.state.history.bound)) + 1e-12)


def test_the_loop_stops_when_the_exp_loss_levels_off():
    """`tol`: stops at the first round whose log exp-loss is within
    `log(1 + tol)` of the one `window` rounds before; never before it."""
    _, sparse, _, _ = _problem(0)
    tol, window = 0.05, 3
    run = sequence_boosting.boost(sparse, max_steps=300, tol=tol, window=window)
    steps = int(run.num_steps)
    assert sequence_boosting.boosting_stopped_by(run) == "exp-loss converged" and window < steps < 300
    assert int(run.status) == Status.CONVERGED
    trace = np.asarray(run.trace[:steps])
    fall = trace[:-window] - trace[window:]  # over `window` rounds, ending at round index window..steps-1
    assert fall[-1] <= np.log1p(tol) and np.all(fall[:-1] > np.log1p(tol))


def test_the_loop_stops_on_a_development_plateau():
    _, sparse, _, _ = _problem(0)
    calls = []

    def evaluate(theta, round_index):
        calls.append(round_index)
        return 1.0 if round_index < 4 else 0.5  # best at round 2, then no improvement

    run = sequence_boosting.boost(
        sparse, max_steps=300, tol=0.05, window=3, evaluate=evaluate, eval_every=2, patience=2
    )
    assert sequence_boosting.boosting_stopped_by(run) == "development plateau"
    assert int(run.status) == Status.CONVERGED
    # Rounds 2 and 4 did not improve on round 0: two evaluations in a row.
    assert calls == [0, 2, 4] and int(run.num_steps) == 4
    np.testing.assert_array_equal(run.records["evaluations"], [[0, 1.0], [2, 1.0], [4, 0.5]])
    np.testing.assert_array_equal(run.params, np.zeros(sparse.num_weak_learners))  # round 0's weights


def test_boost_resumes_bit_identically(tmp_path):
    """Paused after 5 rounds (checkpoints every 2), continued from the
    checkpoint: every array equals the uninterrupted run's."""
    _, sparse, _, _ = _problem(1)
    straight = sequence_boosting.boost(sparse, max_steps=15, tol=0.0, refresh_every=4, chunk_rounds=2)
    paused = sequence_boosting.boost(
        sparse, max_steps=15, tol=0.0, refresh_every=4, chunk_rounds=2, until=5, checkpoint_dir=tmp_path
    )
    assert sequence_boosting.boosting_stopped_by(paused) == "paused" and int(paused.num_steps) == 5
    assert int(paused.status) == Status.ITERATION_LIMIT
    resumed = sequence_boosting.boost(
        sparse, max_steps=15, tol=0.0, refresh_every=4, chunk_rounds=2, checkpoint_dir=tmp_path
    )
    assert sequence_boosting.boosting_stopped_by(resumed) == sequence_boosting.boosting_stopped_by(straight)
    assert sequence_boosting.boosting_stopped_by(straight) == "round cap"
    for a, b in zip(jax.tree_util.tree_leaves(straight[:5]), jax.tree_util.tree_leaves(resumed[:5])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sequence_pieces_keep_every_token_in_order():
    ids = np.arange(2 * 11 * 2, dtype=np.int32).reshape(2, 11, 2)
    labels = np.arange(22, dtype=np.int32).reshape(2, 11)
    piece_ids, piece_labels, piece_lengths = training.sequence_pieces(ids, labels, np.array([11, 3]), 4)
    assert piece_lengths.tolist() == [4, 4, 3, 3] and piece_ids.shape == (4, 4, 2)
    kept = np.concatenate([piece_labels[i, :n] for i, n in enumerate(piece_lengths)])
    np.testing.assert_array_equal(kept, np.concatenate([labels[0], labels[1, :3]]))
    np.testing.assert_array_equal(piece_ids[1, :3], ids[0, 4:7])
    assert np.all(piece_labels[2, 3:] == -1) and np.all(piece_ids[2, 3:] == -1)
