"""Chain losses against brute-force enumeration (`lossfns.testing`) and the
closed-form gradients of MATH.md section 2, plus their properties: exp-loss
>= rank loss, the T = 1 reduction to multiclass losses, shift invariance,
-inf behaviour, jit / vmap / loop agreement, factored input, errors."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossfns import losses, testing
from lossfns.lattices import chain
from lossfns.lattices.chain import FactoredPotentials

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

LOSSES = {
    "sequence_log": losses.sequence_log_loss,
    "sequence_exp": losses.sequence_exp_loss,
    "log_sequence_exp": losses.log_sequence_exp_loss,
    "pointwise_log": losses.pointwise_log_loss,
    "pointwise_exp": losses.pointwise_exp_loss,
    "expected_hamming": losses.expected_hamming_loss,
    "perceptron": losses.perceptron_loss,
    "hinge": losses.structured_hinge_loss,
}
MARGINAL_LOSSES = (
    "sequence_log",
    "sequence_exp",
    "log_sequence_exp",
    "pointwise_log",
    "pointwise_exp",
    "expected_hamming",
)


@jax.jit
def all_losses(potentials, labels, lengths):
    """`{name: (values [...], gradient of their sum)}` for every loss, in one
    compiled function per input shape (compiling each loss separately made
    this file several times slower)."""
    out = {}
    for name, fn in LOSSES.items():
        values, pullback = jax.vjp(lambda p: fn(p, labels, lengths), potentials)
        out[name] = (values, pullback(jnp.ones_like(values))[0])
    return out


@jax.jit
def all_values(potentials, labels, lengths):
    """`{name: values [...]}` for every loss (cheaper to compile than `all_losses`)."""
    return {name: fn(potentials, labels, lengths) for name, fn in LOSSES.items()}


def random_problem(seed, T, L, batch=4, scale=1.0):
    """Potentials `[batch, T, L, L]`, gold labels (-1 padded) and mixed lengths
    (full, 0, 1 and random)."""
    rng = np.random.default_rng(seed)
    potentials = scale * rng.normal(size=(batch, T, L, L))
    lengths = np.array([T, 0, min(1, T)] + list(rng.integers(0, T + 1, size=batch - 3)))[:batch]
    labels = rng.integers(0, L, size=(batch, T))
    labels = np.where(np.arange(T) < lengths[:, None], labels, -1)
    return potentials, labels, lengths


# ---------------------------------------------------------------------------
# The oracle: enumerate every sequence of one chain
# ---------------------------------------------------------------------------


def path_indicators(sequences, T, L):
    """`S(y)` for each sequence: `[N, T, L, L]` edge counts (start row 0)."""
    out = np.zeros((len(sequences), T, L, L))
    for k, y in enumerate(sequences):
        previous = 0
        for t, label in enumerate(y):
            out[k, t, previous, label] = 1.0
            previous = label
    return out


def brute_force(potentials, length, gold, cost_weight=1.0):
    """Values and closed-form gradients (MATH.md section 2) of every loss for
    one chain `[T, L, L]`, computed by enumerating all label sequences."""
    T, L = potentials.shape[0], potentials.shape[-1]
    sequences, scores = testing.enumerate_sequences(potentials, length)
    gold = np.asarray(gold[:length])
    is_gold = np.all(sequences == gold, axis=1)
    probs = np.exp(scores - testing.log_partition(potentials, length))
    indicators = path_indicators(sequences, T, L)
    expected = np.einsum("n,nabc->abc", probs, indicators)
    gold_stats, gold_score, gold_prob = indicators[is_gold][0], scores[is_gold][0], probs[is_gold][0]
    log_z = testing.log_partition(potentials, length)

    out = {}
    out["sequence_log"] = (log_z - gold_score, expected - gold_stats)
    others = ~is_gold
    out["sequence_exp"] = (np.exp(scores[others] - gold_score).sum(), (expected - gold_stats) / gold_prob)
    if gold_prob < 1:
        out["log_sequence_exp"] = (
            np.log(np.exp(scores[others] - gold_score).sum()),
            (expected - gold_stats) / (1 - gold_prob),
        )
    else:
        out["log_sequence_exp"] = (-np.inf, np.zeros_like(expected))

    point_log, point_exp, hamming = 0.0, 0.0, 0.0
    grad_log, grad_exp, grad_hamming = (np.zeros_like(expected) for _ in range(3))
    for t in range(length):
        agree = sequences[:, t] == gold[t]
        marginal = probs[agree].sum()
        conditional = np.einsum("n,nabc->abc", probs * agree, indicators) / marginal  # E[S | y_t = gold_t]
        point_log += -np.log(marginal)
        point_exp += 1 / marginal - 1
        hamming += 1 - marginal
        grad_log += expected - conditional
        grad_exp += (expected - conditional) / marginal
        grad_hamming += marginal * (expected - conditional)
    out["pointwise_log"] = (point_log, grad_log)
    out["pointwise_exp"] = (point_exp, grad_exp)
    out["expected_hamming"] = (hamming, grad_hamming)

    best = int(np.argmax(scores))
    out["perceptron"] = (scores[best] - gold_score, indicators[best] - gold_stats)
    augmented = scores + cost_weight * np.sum(sequences != gold, axis=1)
    best = int(np.argmax(augmented))
    out["hinge"] = (augmented[best] - gold_score, indicators[best] - gold_stats)
    out["rank"] = (int(np.sum(others & (scores >= gold_score))), None)
    return out


def brute_force_batch(potentials, labels, lengths):
    return [brute_force(p, int(n), y) for p, y, n in zip(potentials, labels, lengths)]


# (T, L): L up to 4, T up to 5, and one label; every test that can reuses
# the (4, 3) shape of `random_problem` so `all_losses` compiles few times.
# The other shapes each compile every loss again, so they run with the slow tests.
SHAPES = [(4, 3)] + [pytest.param(T, L, marks=pytest.mark.slow) for T, L in [(5, 2), (3, 4), (2, 1)]]


@pytest.mark.parametrize("T,L", SHAPES)
def test_values_and_gradients_match_enumeration_and_closed_forms(T, L):
    potentials, labels, lengths = random_problem(T * 10 + L, T, L)
    oracle = brute_force_batch(potentials, labels, lengths)
    results = all_losses(potentials, labels, lengths)
    for name, (values, grad) in results.items():
        np.testing.assert_allclose(values, [o[name][0] for o in oracle], rtol=1e-9, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(grad, [o[name][1] for o in oracle], rtol=1e-7, atol=1e-10, err_msg=name)
        assert np.all(np.isfinite(grad)), name
    np.testing.assert_array_equal(losses.rank_loss(potentials, labels, lengths), [o["rank"][0] for o in oracle])
    if L == 1:  # the gold sequence is the only one: nothing to lose
        for name, (values, grad) in results.items():
            np.testing.assert_array_equal(values, -np.inf if name == "log_sequence_exp" else 0.0, err_msg=name)
            np.testing.assert_array_equal(grad, 0.0, err_msg=name)


@pytest.mark.slow
def test_pointwise_losses_have_second_derivatives():
    potentials, labels, lengths = random_problem(7, 3, 2)
    names = ("pointwise_log", "pointwise_exp", "expected_hamming")
    stacked = jax.jit(lambda p: jnp.stack([LOSSES[name](p, labels, lengths) for name in names]))
    testing.check_gradients(stacked, (potentials,), order=2, modes=("rev",))


def test_perceptron_gradient_is_the_collins_update():
    """A unit gradient step on the perceptron loss is `theta += S(y) - S(y_hat)`."""
    potentials, labels, lengths = random_problem(9, 4, 3)
    grad = all_losses(potentials, labels, lengths)["perceptron"][1]
    _, predicted = testing.viterbi(potentials, lengths)
    stats = lambda ys: np.stack([path_indicators([y[:n]], 4, 3)[0] for y, n in zip(ys, lengths)])
    np.testing.assert_allclose(potentials - grad, potentials + stats(labels) - stats(predicted))


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------


@settings(max_examples=15)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.1, 1.0, 3.0]))
def test_sequence_exp_loss_bounds_rank_loss(seed, scale):
    potentials, labels, lengths = random_problem(seed, 4, 3, scale=scale)
    rank = np.asarray(losses.rank_loss(potentials, labels, lengths))
    results = all_losses(potentials, labels, lengths)
    exp_loss = np.asarray(results["sequence_exp"][0])
    assert np.all(exp_loss >= rank - 1e-12 * exp_loss)
    # The log-space variant agrees where the exp-loss is positive.
    log_exp = np.asarray(results["log_sequence_exp"][0])
    positive = exp_loss > 0
    np.testing.assert_allclose(np.exp(log_exp[positive]), exp_loss[positive], rtol=1e-9)


def test_single_position_reduces_to_multiclass_losses():
    rng = np.random.default_rng(11)
    potentials = rng.normal(size=(4, 1, 4, 4))
    labels = rng.integers(0, 4, size=(4, 1))
    logits, gold = potentials[:, 0, 0, :], labels[:, 0]
    gold_logit = logits[np.arange(4), gold]
    log_loss = np.log(np.exp(logits).sum(-1)) - gold_logit
    others = np.arange(4) != gold[:, None]
    exp_loss = np.sum(np.exp(logits - gold_logit[:, None]) * others, -1)
    results = all_values(potentials, labels, np.ones(4, np.int64))
    for name, expected in [
        ("sequence_log", log_loss),
        ("pointwise_log", log_loss),
        ("sequence_exp", exp_loss),
        ("pointwise_exp", exp_loss),
        ("perceptron", logits.max(-1) - gold_logit),
        ("hinge", (logits + others).max(-1) - gold_logit),
    ]:
        np.testing.assert_allclose(results[name], expected, rtol=1e-10, err_msg=name)


def test_adding_a_constant_at_one_position_changes_no_loss():
    potentials, labels, lengths = random_problem(12, 4, 3)
    shifted = potentials.copy()
    shifted[0, 2] += 3.7  # inside the length
    shifted[1, 3] -= 2.0  # past the length (0)
    shifted[3, 0] += 1.5  # first position
    before, after = all_losses(potentials, labels, lengths), all_losses(shifted, labels, lengths)
    for name in LOSSES:
        np.testing.assert_allclose(after[name][0], before[name][0], rtol=1e-9, atol=1e-11, err_msg=name)
        np.testing.assert_allclose(after[name][1], before[name][1], rtol=1e-7, atol=1e-10, err_msg=name)
    np.testing.assert_array_equal(
        losses.rank_loss(shifted, labels, lengths), losses.rank_loss(potentials, labels, lengths)
    )


def iob_problem():
    """Labels O=0, B=1, I=2 with O -> I and start -> I forbidden (-inf)."""
    rng = np.random.default_rng(13)
    potentials = rng.normal(size=(4, 4, 3, 3))
    potentials[:, 0, 0, 2] = -np.inf
    potentials[:, 1:, 0, 2] = -np.inf
    lengths = np.array([4, 3, 1, 0])
    return potentials, lengths


def test_forbidden_transitions_give_finite_losses_for_allowed_gold_paths():
    potentials, lengths = iob_problem()
    labels = np.array([[1, 2, 0, 1], [0, 1, 2, -1], [1, -1, -1, -1], [-1, -1, -1, -1]])
    oracle = brute_force_batch(potentials, labels, lengths)
    for name, (values, grad) in all_losses(potentials, labels, lengths).items():
        finite = values[:3]  # the empty chain's log_sequence_exp is -inf
        assert np.all(np.isfinite(finite)) and np.all(np.isfinite(grad)), name
        np.testing.assert_allclose(values, [o[name][0] for o in oracle], rtol=1e-9, err_msg=name)
        # Where the potentials are -inf the oracle's gradient is 0 (no path uses them).
        np.testing.assert_allclose(grad, [o[name][1] for o in oracle], rtol=1e-7, atol=1e-10, err_msg=name)


def test_gold_path_through_a_forbidden_transition_has_infinite_loss():
    potentials, lengths = iob_problem()
    labels = np.array([[1, 0, 2, 1], [0, 2, 1, -1], [1, -1, -1, -1], [-1, -1, -1, -1]])  # O -> I twice
    results = all_losses(potentials, labels, lengths)
    for name in ("sequence_log", "sequence_exp", "log_sequence_exp", "perceptron", "hinge"):
        values, grad = results[name]
        assert np.all(np.isposinf(values[:2])) and np.isfinite(values[2]), name
        assert np.all(np.isfinite(grad)), name
    # The log-loss keeps the gradient E[S] - S(y): the limit as the forbidden score -> -inf.
    gold_stats = path_indicators([labels[0]], 4, 3)[0]
    np.testing.assert_allclose(results["sequence_log"][1][0], testing.marginals(potentials[0]) - gold_stats, atol=1e-12)
    # The exp-loss gradient is 0 there, so that `jnp.where` masking stays NaN-free.
    np.testing.assert_array_equal(results["sequence_exp"][1][:2], 0.0)
    # Pointwise losses stay finite: each gold label has a positive marginal.
    for name in ("pointwise_log", "pointwise_exp", "expected_hamming"):
        assert np.all(np.isfinite(results[name][0])), name
    # ... unless a gold label is impossible at its position (I at the start).
    impossible = labels.copy()
    impossible[0, 0] = 2
    results = all_losses(potentials, impossible, lengths)
    for name in ("pointwise_log", "pointwise_exp"):
        values, grad = results[name]
        assert np.isposinf(values[0]) and np.all(np.isfinite(values[1:])) and np.all(np.isfinite(grad)), name


def test_chain_with_no_allowed_sequence_gives_infinite_loss_not_nan():
    potentials = np.full((4, 4, 3, 3), -np.inf)
    labels = np.zeros((4, 4), np.int64)
    results = all_losses(potentials, labels, np.array([4, 2, 1, 1]))
    for name in (
        "sequence_log",
        "sequence_exp",
        "log_sequence_exp",
        "perceptron",
        "hinge",
        "pointwise_log",
        "pointwise_exp",
    ):
        values, grad = results[name]
        assert np.all(np.isposinf(values)) and not np.any(np.isnan(grad)), name


# ---------------------------------------------------------------------------
# Transformations, input forms, semirings
# ---------------------------------------------------------------------------


def test_jit_vmap_and_loop_agree():
    potentials, labels, lengths = random_problem(14, 4, 3)
    batched = all_values(potentials, labels, lengths)
    mapped = jax.jit(jax.vmap(all_values))(potentials, labels, lengths)  # maps unbatched calls
    looped = [all_values(potentials[i], labels[i], lengths[i]) for i in range(4)]
    nested = all_values(potentials.reshape(2, 2, 4, 3, 3), labels.reshape(2, 2, 4), lengths.reshape(2, 2))
    for name in LOSSES:
        np.testing.assert_allclose(mapped[name], batched[name], rtol=1e-12, err_msg=name)
        np.testing.assert_allclose([one[name] for one in looped], batched[name], rtol=1e-12, err_msg=name)
        np.testing.assert_allclose(nested[name].reshape(4), batched[name], rtol=1e-12, err_msg=name)


@pytest.mark.slow
def test_without_jit_equals_jit():
    potentials, labels, lengths = random_problem(14, 4, 3)
    jitted = all_values(potentials, labels, lengths)
    for name, fn in LOSSES.items():
        np.testing.assert_allclose(fn(potentials, labels, lengths), jitted[name], rtol=1e-12, err_msg=name)


def test_factored_potentials_equal_materialised_ones():
    rng = np.random.default_rng(15)
    factored = FactoredPotentials(*(jnp.asarray(rng.normal(size=shape)) for shape in [(4, 4, 3), (3, 3), (3,)]))
    _, labels, lengths = random_problem(15, 4, 3)
    dense = all_losses(chain.materialize(factored), labels, lengths)
    for name, (values, grad) in all_losses(factored, labels, lengths).items():
        dense_values, dense_grad = dense[name]
        np.testing.assert_allclose(values, dense_values, rtol=1e-10, err_msg=name)
        # Chain rule through `materialize`: unary feeds every row, the shared
        # transitions every position after the first, start the first.
        dense_grad = np.asarray(dense_grad)
        np.testing.assert_allclose(grad.unary, dense_grad.sum(-2), rtol=1e-8, atol=1e-11, err_msg=name)
        np.testing.assert_allclose(grad.transitions, dense_grad[:, 1:].sum((0, 1)), rtol=1e-8, atol=1e-11, err_msg=name)
        np.testing.assert_allclose(grad.start, dense_grad[:, 0, 0].sum(0), rtol=1e-8, atol=1e-11, err_msg=name)


def test_parallel_algorithm_agrees_with_the_scan():
    potentials, labels, lengths = random_problem(16, 4, 3)
    reference = all_losses(potentials, labels, lengths)

    @jax.jit
    def variant(p):
        return {
            name: LOSSES[name](p, labels, lengths, algorithm="parallel") for name in ("sequence_log", "pointwise_log")
        }

    for name, values in variant(potentials).items():
        np.testing.assert_allclose(values, reference[name][0], rtol=1e-9, err_msg=name)


@jax.jit
def _pointwise_values_and_grads(unary, transitions, labels, lengths):
    def total(u, tr, fn):
        return jnp.sum(fn(FactoredPotentials(u, tr), labels, lengths))

    names = ("pointwise_log", "pointwise_exp", "expected_hamming")
    return {name: jax.value_and_grad(total, argnums=(0, 1))(unary, transitions, LOSSES[name]) for name in names}


def test_float32_pointwise_losses_are_exact_where_marginals_underflow():
    """Score margins of ~20-100 put gold marginals below float32's 1e-38: the
    log-space marginals keep values finite and gradients equal to float64's
    (log of an underflowed probability gave +inf and NaN gradients)."""
    rng = np.random.default_rng(21)
    unary, transitions = rng.normal(size=(8, 12, 4)) * 20, rng.normal(size=(4, 4)) * 20
    labels, lengths = rng.integers(0, 4, size=(8, 12)), rng.integers(0, 13, size=8)
    exact = _pointwise_values_and_grads(unary, transitions, labels, lengths)
    single = _pointwise_values_and_grads(
        jnp.asarray(unary, jnp.float32), jnp.asarray(transitions, jnp.float32), labels, lengths
    )
    for name in ("pointwise_log", "expected_hamming"):
        value, grads = single[name]
        assert np.isfinite(value), name
        np.testing.assert_allclose(value, exact[name][0], rtol=1e-5, err_msg=name)
        for ours, reference in zip(grads, exact[name][1]):
            reference = np.asarray(reference)
            np.testing.assert_allclose(ours, reference, atol=1e-5 * np.abs(reference).max(), err_msg=name)
    # The exp-loss sums 1/P: beyond float32's range here (float64 reads 7e40), +inf.
    assert exact["pointwise_exp"][0] > np.finfo(np.float32).max and np.isposinf(single["pointwise_exp"][0])


def test_float32_inputs_stay_float32():
    potentials, labels, lengths = random_problem(17, 4, 3)
    reference = all_values(potentials, labels, lengths)
    for name, values in all_values(potentials.astype(np.float32), labels, lengths).items():
        assert values.dtype == jnp.float32, name
        np.testing.assert_allclose(values, reference[name], rtol=2e-5, atol=1e-5, err_msg=name)


# ---------------------------------------------------------------------------
# Evaluation losses
# ---------------------------------------------------------------------------


def test_hamming_loss_counts_wrong_labels_inside_lengths():
    gold = np.array([[0, 1, 2, -1], [1, 1, 1, 1]])
    predicted = np.array([[0, 2, 2, 5], [0, 1, 0, 1]])
    np.testing.assert_array_equal(losses.hamming_loss(predicted, gold, np.array([3, 4])), [1, 2])
    np.testing.assert_array_equal(losses.hamming_loss(predicted, gold, np.array([0, 1])), [0, 1])
    np.testing.assert_array_equal(losses.hamming_loss(predicted, gold), [2, 2])


def test_posterior_decoding_takes_the_most_probable_label_per_position():
    potentials, labels, lengths = random_problem(18, 4, 3)
    decoded = np.asarray(jax.jit(losses.posterior_decode)(potentials, lengths), labels.dtype)
    oracle = testing.node_marginals(potentials, lengths)
    inside = np.arange(4) < lengths[:, None]
    np.testing.assert_array_equal(decoded, np.where(inside, oracle.argmax(-1), -1))
    # It minimises the expected Hamming loss (checked against every labelling).
    candidates = np.array(list(itertools.product(range(3), repeat=4)))
    expected_hamming = np.sum(inside[:, None] * (1 - oracle[:, np.arange(4), candidates]), -1)  # [batch, N]
    best = all_losses(potentials, decoded, lengths)["expected_hamming"][0]
    np.testing.assert_allclose(best, expected_hamming.min(1), rtol=1e-9)


def test_rank_loss_refuses_large_problems():
    potentials, labels, lengths = random_problem(19, 5, 4)
    with pytest.raises(ValueError, match="max_sequences"):
        losses.rank_loss(potentials, labels, lengths, max_sequences=100)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LOSSES))
def test_bad_labels_and_lengths_raise_naming_the_argument(name):
    potentials, labels, lengths = random_problem(20, 3, 2)
    with pytest.raises(ValueError, match="labels"):
        LOSSES[name](potentials, labels[:, :2], lengths)
    with pytest.raises(ValueError, match="labels"):
        LOSSES[name](potentials, np.full_like(labels, 2), lengths)
    with pytest.raises(TypeError, match="labels"):
        LOSSES[name](potentials, labels.astype(float), lengths)
    with pytest.raises(ValueError, match="lengths"):
        LOSSES[name](potentials, labels, lengths + 4)
    with pytest.raises(ValueError, match="potentials"):
        LOSSES[name](potentials[0, 0], labels, lengths)


def test_hamming_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="predicted"):
        losses.hamming_loss(np.zeros((2, 3), int), np.zeros((2, 4), int))
    with pytest.raises(TypeError, match="labels"):
        losses.hamming_loss(np.zeros((2, 3), int), np.zeros((2, 3)))


def test_the_log_loss_is_never_negative_on_separable_float32_data():
    """Issue 47: a gold sequence 40 above every other score holds all the
    mass; float32 rounding put log Z up to 1e-4 below its score, and the
    loss is raised to its exact value 0 (gradient kept, finite)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, (64, 20))
    unary = rng.normal(size=(64, 20, 5)).astype(np.float32) + 40 * np.eye(5, dtype=np.float32)[labels]
    transitions = rng.normal(size=(5, 5)).astype(np.float32)
    loss = lambda u: losses.sequence_log_loss(
        FactoredPotentials(u, jnp.asarray(transitions)), jnp.asarray(labels), jnp.full(64, 20)
    )
    values = loss(jnp.asarray(unary))
    gradient = jax.grad(lambda u: jnp.sum(loss(u)))(jnp.asarray(unary))
    assert values.dtype == jnp.float32 and float(values.min()) >= 0.0
    assert np.all(np.isfinite(np.asarray(gradient))) and float(jnp.abs(gradient).max()) < 1e-3
