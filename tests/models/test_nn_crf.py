"""`lossfns.nn.CRF` against pytorch-crf (same parameters, masked batches) and
against brute-force enumeration of every tag sequence (with start and end
scores and forbidden moves), and `lattices.constraints` against the schemes'
rules written out by hand."""

from __future__ import annotations

import itertools
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lossfns import testing
from lossfns.lattices import constraints
from lossfns.nn import CRF, possible_tags

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

# Brute-force size: 3 tags, 4 positions (81 sequences); most tests share this
# one shape [6, T, L] (or [2, 3, T, L]), so that they share compilations.
L, T = 3, 4
LENGTHS = np.array([4, 2, 1, 0, 3, 4])
IOB2 = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")


def torchcrf():
    """pytorch-crf and torch, imported lazily: a test extra, required in CI."""
    try:
        import torch
        import torchcrf as module
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("pytorch-crf is not installed in CI (it is in the test extra)")
        pytest.skip("pytorch-crf is not installed")
    return torch, module


def random_crf(num_tags, seed, scale=1.0, allowed=None):
    rng = np.random.default_rng(seed)
    return CRF.from_parameters(
        scale * rng.normal(size=(num_tags, num_tags)),
        scale * rng.normal(size=num_tags),
        scale * rng.normal(size=num_tags),
        allowed=allowed,
    )


def random_emissions(shape, seed, scale=1.0):
    return jnp.asarray(scale * np.random.default_rng(seed).normal(size=shape))


def prefix_mask(lengths, T):
    return np.arange(T) < np.asarray(lengths)[..., None]


# ---------------------------------------------------------------------------
# The oracle: every tag sequence of one sentence, scored term by term
# ---------------------------------------------------------------------------


def enumerate_paths(crf: CRF, emissions, length):
    """`(paths [L^n, n], scores [L^n])` in float64, -inf through a forbidden move."""
    transitions, start, end = (
        np.asarray(x, np.float64) for x in (crf.transitions, crf.start_transitions, crf.end_transitions)
    )
    if crf.allowed is not None:
        allowed = [np.asarray(a) for a in crf.allowed]
        transitions, start, end = (np.where(a, x, -np.inf) for a, x in zip(allowed, (transitions, start, end)))
    emissions = np.asarray(emissions, np.float64)
    if length == 0:
        return np.zeros((1, 0), int), np.zeros(1)
    paths = np.array(list(itertools.product(range(crf.num_tags), repeat=length)), int)
    scores = start[paths[:, 0]] + end[paths[:, -1]] + emissions[np.arange(length), paths].sum(1)
    scores = scores + transitions[paths[:, :-1], paths[:, 1:]].sum(1)
    return paths, scores


def log_sum_exp(scores):
    top = np.max(scores) if np.isfinite(scores).any() else 0.0
    with np.errstate(divide="ignore"):
        return top + np.log(np.sum(np.exp(scores - top)))


def assert_close(actual, expected, rtol=1e-7, atol=1e-8):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def problem():
    """A float64 CRF with IOB-like constraints over 3 tags (O, B, I), a batch of
    emissions with lengths 4, 2, 1, 0, and gold tags valid under them."""
    allowed = constraints.allowed_transitions(("O", "B-X", "I-X"))
    crf = random_crf(L, 0, allowed=allowed)
    emissions = random_emissions((len(LENGTHS), T, L), 1)
    tags = np.array([[1, 2, 0, 1], [0, 1, -1, -1], [1, -1, -1, -1], [-1, -1, -1, -1], [0, 0, 1, -1], [0, 1, 2, 2]])
    return crf, emissions, tags, prefix_mask(LENGTHS, T)


# ---------------------------------------------------------------------------
# Against pytorch-crf
# ---------------------------------------------------------------------------


def test_log_likelihood_gradients_and_paths_equal_pytorch_crf():
    torch, torchcrf_module = torchcrf()
    shape = B, T_, L_ = (5, 9, 6)
    torch.manual_seed(0)
    peer = torchcrf_module.CRF(L_, batch_first=True).double()
    with torch.no_grad():  # larger than its initialisation, so that paths differ from the emissions' argmax
        for parameter in peer.parameters():
            parameter.mul_(20.0)
    crf = CRF.from_parameters(
        *(p.detach().numpy() for p in (peer.transitions, peer.start_transitions, peer.end_transitions))
    )
    rng = np.random.default_rng(1)
    emissions = rng.normal(size=shape)
    tags = rng.integers(0, L_, size=(B, T_))
    lengths = np.concatenate([[T_, 1], rng.integers(1, T_ + 1, size=B - 2)])
    mask = prefix_mask(lengths, T_)

    torch_emissions = torch.tensor(emissions, requires_grad=True)
    expected = peer(torch_emissions, torch.tensor(tags), torch.tensor(mask), reduction="none")
    expected.sum().backward()
    actual = crf.log_likelihood(emissions, tags, mask)
    assert_close(actual, expected.detach().numpy(), rtol=1e-5, atol=0)
    for reduction in ("sum", "mean", "token_mean"):  # pytorch-crf's reductions
        reduced = peer(torch.tensor(emissions), torch.tensor(tags), torch.tensor(mask), reduction=reduction)
        assert_close(crf.log_likelihood(emissions, tags, mask, reduction=reduction), reduced.item(), rtol=1e-5, atol=0)
    with pytest.raises(ValueError, match="reduction must be one of"):
        crf.log_likelihood(emissions, tags, mask, reduction="average")

    def total(crf, emissions):
        return jnp.sum(crf.log_likelihood(emissions, tags, mask))

    crf_gradient, emissions_gradient = eqx.filter_grad(total)(crf, emissions), jax.grad(total, 1)(crf, emissions)
    assert_close(emissions_gradient, torch_emissions.grad.numpy(), rtol=1e-5, atol=1e-9)
    for name in ("transitions", "start_transitions", "end_transitions"):
        assert_close(getattr(crf_gradient, name), getattr(peer, name).grad.numpy(), rtol=1e-5, atol=1e-9)

    _, paths = crf.decode(emissions, mask)
    expected_paths = peer.decode(torch.tensor(emissions), torch.tensor(mask))
    assert [list(row[:n]) for row, n in zip(np.asarray(paths), lengths)] == expected_paths
    assert np.all(np.asarray(paths)[~mask] == -1)
    assert not all(list(np.argmax(e[:n], -1)) == p for e, n, p in zip(emissions, lengths, expected_paths))


def test_float32_log_likelihood_equals_pytorch_crf():
    torch, torchcrf_module = torchcrf()
    torch.manual_seed(1)
    peer = torchcrf_module.CRF(9, batch_first=True)
    crf = CRF.from_parameters(
        *(p.detach().numpy() for p in (peer.transitions, peer.start_transitions, peer.end_transitions))
    )
    assert crf.transitions.dtype == jnp.float32
    rng = np.random.default_rng(2)
    emissions = (3.0 * rng.normal(size=(6, 20, 9))).astype(np.float32)
    tags = rng.integers(0, 9, size=(6, 20))
    mask = prefix_mask(rng.integers(1, 21, size=6), 20)
    expected = peer(torch.tensor(emissions), torch.tensor(tags), torch.tensor(mask), reduction="none")
    actual = crf.log_likelihood(emissions, tags, mask)
    assert actual.dtype == jnp.float32
    assert_close(actual, expected.detach().numpy(), rtol=1e-5, atol=0)


def test_initialisation_is_pytorch_crfs():
    crf = CRF(50, key=jax.random.key(0))
    for name in ("transitions", "start_transitions", "end_transitions"):
        value = np.asarray(getattr(crf, name))
        assert value.dtype == np.float32 and value.min() >= -0.1 and value.max() <= 0.1 and value.std() > 0.04
    assert crf.transitions.shape == (50, 50) and crf.allowed is None


# ---------------------------------------------------------------------------
# Against brute force
# ---------------------------------------------------------------------------


def test_every_quantity_matches_enumeration(problem):
    crf, emissions, tags, mask = problem
    log_z = crf.log_partition(emissions, mask)
    log_likelihood = crf.log_likelihood(emissions, tags, mask)
    best, decoded = crf.decode(emissions, mask)
    top, top_tags = crf.kbest(emissions, 3, mask)
    nodes = crf.marginals(emissions, mask)
    entropy = crf.entropy(emissions, mask)
    for b, n in enumerate(LENGTHS):
        paths, scores = enumerate_paths(crf, emissions[b], n)
        assert_close(log_z[b], log_sum_exp(scores))
        gold = np.flatnonzero((paths == tags[b, :n]).all(1))[0]
        assert_close(log_likelihood[b], scores[gold] - log_sum_exp(scores))
        order = np.argsort(-scores, kind="stable")
        assert_close(best[b], scores[order[0]])
        assert list(decoded[b, :n]) == list(paths[order[0]]) and np.all(np.asarray(decoded[b, n:]) == -1)
        finite = min(3, int(np.isfinite(scores).sum()))
        assert_close(top[b, :finite], scores[order[:finite]])
        for rank in range(finite):
            assert_close(scores[(paths == np.asarray(top_tags[b, rank, :n])).all(1)][0], top[b, rank])
        probabilities = np.exp(scores - log_sum_exp(scores))
        expected_nodes = np.zeros((T, L))
        for t in range(n):
            np.add.at(expected_nodes[t], paths[:, t], probabilities)
        assert_close(nodes[b], expected_nodes)
        positive = probabilities[probabilities > 0]
        assert_close(entropy[b], -np.sum(positive * np.log(positive)))


def test_samples_follow_the_distribution():
    crf = random_crf(2, 3)
    emissions = random_emissions((3, 2), 4)
    draws = np.asarray(crf.sample(jnp.broadcast_to(emissions, (4000, 3, 2)), key=jax.random.key(0)))
    paths, scores = enumerate_paths(crf, emissions, 3)
    frequencies = [(draws == path).all(1).mean() for path in paths]
    total_variation = 0.5 * np.abs(np.array(frequencies) - np.exp(scores - log_sum_exp(scores))).sum()
    assert total_variation < 0.04


def test_partial_labels_sum_over_the_compatible_sequences(problem):
    crf, emissions, tags, mask = problem
    rng = np.random.default_rng(5)
    possible = rng.random((len(LENGTHS), T, L)) < 0.6
    possible[..., 0] |= ~possible.any(-1)  # some tag everywhere
    actual = crf.partial_log_likelihood(emissions, possible, mask)
    for b, n in enumerate(LENGTHS):
        paths, scores = enumerate_paths(crf, emissions[b], n)
        compatible = possible[b, np.arange(n), paths].all(1) if n else np.ones(1, bool)
        assert_close(actual[b], log_sum_exp(scores[compatible]) - log_sum_exp(scores))
    # Tags with holes (-1: unlabelled); fully labelled is the log-likelihood, unlabelled is 0.
    holes = np.where(rng.random(tags.shape) < 0.5, -1, tags)
    assert np.all(np.asarray(possible_tags(holes, L)).sum(-1) == np.where(holes < 0, L, 1))
    assert_close(
        crf.partial_log_likelihood(emissions, possible_tags(np.maximum(tags, 0), L), mask),
        crf.log_likelihood(emissions, tags, mask),
    )
    assert_close(
        crf.partial_log_likelihood(emissions, np.ones((len(LENGTHS), T, L), bool), mask), np.zeros(len(LENGTHS))
    )


@pytest.mark.parametrize(
    "cost", [1.5, np.array([0.5, 2.0, 3.0]), np.array([[0.0, 1.0, 4.0], [2.0, 0.0, 1.0], [0.5, 3.0, 0.0]])]
)
def test_softmax_margin_matches_enumeration(problem, cost):
    crf, emissions, tags, mask = problem
    actual = crf.softmax_margin_loss(emissions, tags, mask, cost=cost)
    matrix = np.asarray(cost) * (1 - np.eye(L)) if np.ndim(cost) < 2 else cost
    matrix = matrix if np.ndim(cost) != 1 else np.asarray(cost)[:, None] * (1 - np.eye(L))
    for b, n in enumerate(LENGTHS):
        paths, scores = enumerate_paths(crf, emissions[b], n)
        gold = (paths == tags[b, :n]).all(1)
        costs = matrix[tags[b, :n], paths].sum(1) if n else np.zeros(1)
        assert_close(actual[b], log_sum_exp(scores + costs) - scores[gold][0])
    assert np.all(np.asarray(actual) >= -np.asarray(crf.log_likelihood(emissions, tags, mask)) - 1e-12)
    assert_close(crf.softmax_margin_loss(emissions, tags, mask, cost=0.0), -crf.log_likelihood(emissions, tags, mask))


def test_gradients_match_finite_differences(problem):
    crf, emissions, tags, mask = problem
    possible = np.asarray(possible_tags(np.where(np.arange(T) % 2, -1, np.maximum(tags, 0)), L))

    def objective(transitions, start, end, emissions):
        model = eqx.tree_at(
            lambda c: (c.transitions, c.start_transitions, c.end_transitions), crf, (transitions, start, end)
        )
        return (
            jnp.sum(model.log_likelihood(emissions, tags, mask))
            + 0.5 * jnp.sum(model.partial_log_likelihood(emissions, possible, mask))
            + 0.25 * jnp.sum(model.softmax_margin_loss(emissions, tags, mask, cost=jnp.array([0.5, 1.0, 2.0])))
        )

    testing.check_gradients(
        objective, (crf.transitions, crf.start_transitions, crf.end_transitions, emissions), order=1, modes=("rev",)
    )


# ---------------------------------------------------------------------------
# Constraints
# ---------------------------------------------------------------------------


def test_scheme_masks_written_out():
    iob2 = constraints.allowed_transitions(("O", "B-A", "I-A", "B-B", "I-B"), "IOB2")
    #                                 to:  O  B-A I-A B-B I-B
    assert iob2.transitions.astype(int).tolist() == [
        [1, 1, 0, 1, 0],  # from O
        [1, 1, 1, 1, 0],  # from B-A
        [1, 1, 1, 1, 0],  # from I-A
        [1, 1, 0, 1, 1],  # from B-B
        [1, 1, 0, 1, 1],
    ]  # from I-B
    assert iob2.start.tolist() == [True, True, False, True, False] and iob2.end.all()
    iobes = constraints.allowed_transitions(("O", "B-A", "I-A", "E-A", "S-A", "S-B"), "IOBES")
    #                                  to:  O  B-A I-A E-A S-A S-B
    assert iobes.transitions.astype(int).tolist() == [
        [1, 1, 0, 0, 1, 1],  # from O
        [0, 0, 1, 1, 0, 0],  # from B-A
        [0, 0, 1, 1, 0, 0],  # from I-A
        [1, 1, 0, 0, 1, 1],  # from E-A
        [1, 1, 0, 0, 1, 1],  # from S-A
        [1, 1, 0, 0, 1, 1],
    ]  # from S-B
    assert iobes.start.tolist() == [True, True, False, False, True, True]
    assert iobes.end.tolist() == [True, False, False, True, True, True]
    bilou = constraints.allowed_transitions(("O", "B-A", "I-A", "L-A", "U-A", "U-B"), "BILOU")
    assert (bilou.transitions == iobes.transitions).all() and (bilou.start == iobes.start).all()
    assert (bilou.end == iobes.end).all()


def valid_chunks(tags, scheme):
    """Whether a label sequence is well formed, by reading its chunks left to right."""
    open_kind = None
    _single, last = {"IOB2": (None, None), "IOBES": ("S", "E"), "BILOU": ("U", "L")}[scheme]
    for tag in tags:
        prefix, _, kind = tag.partition("-")
        if prefix in ("I", last):
            if open_kind != kind:
                return False
            open_kind = kind if prefix == "I" else None
            continue
        if open_kind is not None and scheme != "IOB2":
            return False
        open_kind = kind if prefix == "B" else None
    return open_kind is None or scheme == "IOB2"


@pytest.mark.parametrize(
    "scheme, labels",
    [
        ("IOB2", IOB2),
        ("IOBES", ("O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC")),
        ("BILOU", ("O", "B-PER", "I-PER", "L-PER", "U-PER", "B-LOC", "I-LOC", "L-LOC", "U-LOC")),
    ],
)
def test_constrained_decoding_and_sampling_give_valid_sequences(scheme, labels):
    crf = CRF.from_labels(labels, scheme, key=jax.random.key(0))
    # Emissions that favour invalid sequences: the inside tags score highest.
    bias = np.array([3.0 if label[0] in "IEL" else 0.0 for label in labels])
    emissions = random_emissions((64, 6, len(labels)), 6, scale=3.0) + bias
    lengths = np.random.default_rng(7).integers(0, 7, size=64)
    mask = prefix_mask(lengths, 6)
    unconstrained = CRF.from_parameters(crf.transitions, crf.start_transitions, crf.end_transitions)
    _, free = unconstrained.decode(emissions, mask)
    assert not all(valid_chunks([labels[i] for i in row[:n]], scheme) for row, n in zip(np.asarray(free), lengths))
    scores, decoded = crf.decode(emissions, mask)
    _, kbest = crf.kbest(emissions, 3, mask)
    samples = crf.sample(emissions, mask, key=jax.random.key(1))
    assert np.isfinite(np.asarray(scores)).all()
    for rows in (decoded[:, None], kbest, samples[:, None]):
        for row_set, n in zip(np.asarray(rows), lengths):
            for row in row_set:
                assert valid_chunks([labels[i] for i in row[:n]], scheme), [labels[i] for i in row[:n]]


def test_forbidden_moves_are_frozen_and_nan_free():
    crf = CRF.from_labels(IOB2, key=jax.random.key(0))
    emissions = random_emissions((4, 6, 5), 8, scale=50.0).astype(jnp.float32)
    tags = np.array([[1, 2, 0, 3, 4, 4], [0, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0], [3, 4, 0, 1, 0, 0]])  # row 2 invalid
    mask = prefix_mask([6, 3, 1, 0], 6)
    fitted = np.array([True, True, False, True])  # leave the invalid example out
    loss = lambda model: -jnp.sum(jnp.where(fitted, model.log_likelihood(emissions, tags, mask), 0.0))
    value, gradient = eqx.filter_value_and_grad(loss)(crf)
    assert np.isfinite(value)
    assert np.asarray(crf.log_likelihood(emissions, tags, mask))[2] == -np.inf
    for name, allowed in zip(("transitions", "start_transitions", "end_transitions"), crf.allowed):
        g = np.asarray(getattr(gradient, name))
        assert np.isfinite(g).all() and np.all(g[~np.asarray(allowed)] == 0.0) and np.any(g != 0)
    # The invalid gold sequence alone: -inf, with a finite gradient.
    invalid = eqx.filter_grad(lambda m: -m.log_likelihood(emissions, tags, mask)[2])(crf)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree_util.tree_leaves(invalid))

    # Trained with optax on the inexact leaves: the masks are not parameters and
    # the forbidden entries never move.
    parameters, static = eqx.partition(crf, eqx.is_inexact_array)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(parameters))
    optimizer = optax.adam(0.1)
    state = optimizer.init(parameters)
    step = eqx.filter_jit(lambda p, s: _adam_step(p, s, static, optimizer, loss))
    for _ in range(3):
        parameters, state = step(parameters, state)
    trained = eqx.combine(parameters, static)
    for name, allowed in zip(("transitions", "start_transitions", "end_transitions"), crf.allowed):
        before, after, forbidden = (
            np.asarray(getattr(crf, name)),
            np.asarray(getattr(trained, name)),
            ~np.asarray(allowed),
        )
        assert np.array_equal(before[forbidden], after[forbidden])
    assert not np.array_equal(np.asarray(crf.transitions), np.asarray(trained.transitions))


def _adam_step(parameters, state, static, optimizer, loss):
    gradient = jax.grad(lambda p: loss(eqx.combine(p, static)))(parameters)
    updates, state = optimizer.update(gradient, state, parameters)
    return optax.apply_updates(parameters, updates), state


def test_a_bare_allowed_mask_forbids_only_transitions():
    allowed = np.ones((L, L), bool)
    allowed[0, 1] = False
    crf = random_crf(L, 9, allowed=allowed)
    assert crf.allowed.start.all() and crf.allowed.end.all()
    emissions = random_emissions((len(LENGTHS), T, L), 10)
    paths, scores = enumerate_paths(crf, emissions[0], T)
    assert np.array_equal(np.isfinite(scores), ~((paths[:, :-1] == 0) & (paths[:, 1:] == 1)).any(1))
    assert_close(crf.log_partition(emissions)[0], log_sum_exp(scores))


# ---------------------------------------------------------------------------
# Batching, transforms, masks
# ---------------------------------------------------------------------------


def test_leading_batch_shapes_equal_a_loop(problem):
    crf, emissions, tags, _ = problem
    emissions, tags, lengths = emissions.reshape(2, 3, T, L), tags.reshape(2, 3, T), LENGTHS.reshape(2, 3)
    value = crf.log_likelihood(emissions, tags, prefix_mask(lengths, T))
    scores, paths = crf.decode(emissions, lengths=lengths)
    assert value.shape == (2, 3) and paths.shape == (2, 3, T)
    assert crf.marginals(emissions, lengths=lengths).shape == (2, 3, T, L)
    assert crf.kbest(emissions, 2, lengths=lengths)[1].shape == (2, 3, 2, T)
    for i, j in itertools.product(range(2), range(3)):
        n = lengths[i, j]
        assert_close(value[i, j], crf.log_likelihood(emissions[i, j], tags[i, j], lengths=n))
        single_score, single_path = crf.decode(emissions[i, j], lengths=n)
        assert_close(scores[i, j], single_score)
        assert np.array_equal(np.asarray(paths[i, j]), np.asarray(single_path))


def test_filter_jit_and_vmap_equal_eager(problem):
    crf, emissions, tags, mask = problem
    eager = crf.log_likelihood(emissions, tags, mask)
    filtered = eqx.filter_jit(CRF.log_likelihood)(crf, emissions, tags, mask)
    mapped = jax.vmap(crf.log_likelihood)(emissions, tags, mask)
    for other in (filtered, mapped):
        assert_close(other, eager)
    decoded = jax.vmap(lambda e, m: crf.decode(e, m)[1])(emissions, mask)
    assert np.array_equal(np.asarray(decoded), np.asarray(crf.decode(emissions, mask)[1]))
    # An ensemble of heads, mapped over their parameters.
    heads = eqx.filter_vmap(lambda seed: CRF(L, key=jax.random.key(seed), dtype=jnp.float64))(jnp.arange(2))
    both = eqx.filter_vmap(lambda head: head.log_partition(emissions, mask))(heads)
    assert_close(
        both[1], eqx.filter_jit(CRF.log_partition)(CRF(L, key=jax.random.key(1), dtype=jnp.float64), emissions, mask)
    )


def test_masks_and_lengths(problem):
    crf, emissions, _, mask = problem
    assert_close(crf.log_partition(emissions, mask), crf.log_partition(emissions, lengths=LENGTHS))
    assert_close(crf.log_partition(emissions, mask)[3], 0.0)  # length 0: one empty path
    # Padding may hold anything.
    padded = emissions.at[1, 2].set(jnp.nan).at[3].set(jnp.inf)
    assert_close(crf.log_partition(padded, mask), crf.log_partition(emissions, mask))
    gradient = np.asarray(jax.grad(lambda e: jnp.sum(crf.log_partition(e, mask)))(padded))
    assert np.isfinite(gradient).all() and np.all(gradient[~mask] == 0.0)
    holes = mask.copy()
    holes[1, 3] = True  # [True, True, False, True]
    with pytest.raises(ValueError, match=r"mask must be a prefix mask.*index \(1, 3\)"):
        crf.log_likelihood(emissions, np.zeros((len(LENGTHS), T), int), holes)
    # Under jit the mask is not known: that sequence's values are NaN, its tags -1.
    value = jax.jit(lambda e, m: crf.log_partition(e, m))(emissions, holes)
    assert np.isnan(value[1]) and np.isfinite(np.delete(np.asarray(value), 1)).all()
    _, tags = eqx.filter_jit(CRF.decode)(crf, emissions, holes)
    assert np.all(np.asarray(tags[1]) == -1) and np.all(np.asarray(tags[0]) >= 0)


def test_float32_is_nan_free_at_wide_scores_and_long_sequences():
    crf = CRF.from_labels(IOB2, key=jax.random.key(2))
    emissions = random_emissions((2, 1000, 5), 16, scale=100.0).astype(jnp.float32)
    mask = prefix_mask([1000, 1], 1000)
    tags = np.asarray(crf.decode(emissions, mask)[1])
    loss = lambda model, e: -jnp.sum(model.log_likelihood(e, tags, mask))
    value, (gradient, emissions_gradient) = eqx.filter_value_and_grad(lambda args: loss(*args))((crf, emissions))
    assert np.isfinite(value) and value >= -1e-2  # the decoded path: nearly all the mass
    leaves = jax.tree_util.tree_leaves(eqx.filter((gradient, emissions_gradient), eqx.is_inexact_array))
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in leaves)
    nodes = crf.marginals(emissions, mask)
    assert_close(np.asarray(nodes).sum(-1), mask.astype(float), atol=1e-4)


# ---------------------------------------------------------------------------
# Under jit: bad tags and NaN emissions inside a sequence give NaN, padding nothing
# ---------------------------------------------------------------------------

_LOSSES = {
    "log_likelihood": lambda crf, e, tags, mask: crf.log_likelihood(e, tags, mask),
    "softmax_margin_loss": lambda crf, e, tags, mask: crf.softmax_margin_loss(e, tags, mask),
}


def _value_and_emission_grad(loss, emissions, tags, mask):
    crf = random_crf(L, 0)
    per_sequence = lambda e: loss(crf, e, tags, mask)
    return jax.jit(lambda e: (per_sequence(e), jax.grad(lambda e: jnp.sum(per_sequence(e)))(e)))(emissions)


@pytest.mark.parametrize("loss", list(_LOSSES), ids=list(_LOSSES))
@pytest.mark.parametrize("bad", ["tag L", "tag -1", "NaN gold emission", "NaN other emission"])
def test_bad_input_inside_a_sequence_under_jit_is_nan_in_value_and_gradient(loss, bad):
    """Under jit nothing can raise: a tag outside [0, L) was clamped (the
    value of tag L - 1, its gradient without the gold term) and a NaN
    emission gave a finite gradient; both now give NaN for that sequence
    only, in the value and in the gradient of its emissions."""
    tags = jnp.array([[0, 1, 2, 0], [2, 1, 0, 0]])
    emissions = random_emissions((2, T, L), 1)
    mask = prefix_mask([4, 3], T)
    tags, emissions = {
        "tag L": (tags.at[0, 2].set(L), emissions),
        "tag -1": (tags.at[0, 0].set(-1), emissions),
        "NaN gold emission": (tags, emissions.at[0, 1, 1].set(jnp.nan)),
        "NaN other emission": (tags, emissions.at[0, 1, 0].set(jnp.nan)),
    }[bad]
    values, gradients = _value_and_emission_grad(_LOSSES[loss], emissions, tags, mask)
    assert np.isnan(values[0]) and np.isnan(gradients[0]).any()
    assert np.isfinite(values[1]) and np.isfinite(gradients[1]).all()


@pytest.mark.parametrize("loss", list(_LOSSES), ids=list(_LOSSES))
def test_padding_may_hold_any_tag_and_nan_emissions_under_jit(loss):
    """Past each length nothing is read: -1 or L tags and NaN emissions
    there leave values and gradients finite, as with clean padding."""
    tags = jnp.array([[0, 1, 2, 0], [2, 1, 0, 0]])
    emissions = random_emissions((2, T, L), 1)
    mask = prefix_mask([4, 2], T)
    clean = _value_and_emission_grad(_LOSSES[loss], emissions, tags, mask)
    padded = _value_and_emission_grad(
        _LOSSES[loss], emissions.at[1, 2:].set(jnp.nan), tags.at[1, 2].set(L).at[1, 3].set(-1), mask
    )
    np.testing.assert_array_equal(padded[0], clean[0])
    np.testing.assert_array_equal(padded[1], clean[1])
