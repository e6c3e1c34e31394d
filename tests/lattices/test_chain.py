"""Chain algorithms against brute-force enumeration, for every semiring and
both algorithms, over small random problems (hypothesis)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lossfns import losses, semirings, testing
from lossfns.lattices import FactoredPotentials, chain, decode

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

ALGORITHMS = ("sequential", "parallel")
# (L, T, batch shape): every L in 1..4, every T in {0, 1, 2, 5} and every batch
# shape appear; a fixed list keeps the number of compiled shapes small.
SHAPES = ((1, 5, (3,)), (2, 0, (3,)), (3, 2, ()), (4, 5, (2, 3)), (2, 1, (2, 3)), (3, 5, (3,)), (4, 1, ()))


@functools.cache
def jitted(name, *args, **kwargs):
    """One compiled `chain.<name>` per static configuration, shared by all tests."""
    return jax.jit(functools.partial(getattr(chain, name), *args, **kwargs))


@st.composite
def problems(draw, factored=None, forbidden=False):
    """Random potentials over SHAPES with mixed lengths (and -inf entries)."""
    L, T, batch_shape = draw(st.sampled_from(SHAPES))
    seed = draw(st.integers(0, 2**31 - 1))
    is_factored = draw(st.booleans()) if factored is None else factored
    rng = np.random.default_rng(seed)
    lengths = jnp.asarray(rng.integers(0, T + 1, size=batch_shape), jnp.int32)
    scale = draw(st.sampled_from((0.5, 2.0)))

    def forbid(x):
        # Some forbidden (-inf) entries, as IOB constraints would give.
        return np.where(rng.random(x.shape) < 0.2, -np.inf, x) if forbidden else x

    if is_factored:
        potentials = FactoredPotentials(
            jnp.asarray(rng.normal(size=batch_shape + (T, L)) * scale),
            jnp.asarray(forbid(rng.normal(size=(L, L)) * scale)),
            jnp.asarray(rng.normal(size=(L,)) * scale),
        )
    else:
        potentials = jnp.asarray(forbid(rng.normal(size=batch_shape + (T, L, L)) * scale))
    return potentials, lengths


def assert_close(actual, expected, atol=1e-8):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=1e-7, atol=atol)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(problem=problems(forbidden=True))
def test_log_partition_log_and_real_match_enumeration(algorithm, problem):
    potentials, lengths = problem
    assert_close(
        jitted("log_partition", algorithm=algorithm)(potentials, lengths), testing.log_partition(potentials, lengths)
    )


def test_real_traces_to_the_program_of_log():
    """`forward(Real)` runs the very computation `Log` runs (`chain._log_semiring`):
    the same program, values and derivatives (traced, not compiled), so
    the enumeration and gradient checks of `Log` hold for it to the bit."""
    rng = np.random.default_rng(10)
    dense = jnp.asarray(rng.normal(size=(2, 4, 3, 3)))
    factored = FactoredPotentials(
        jnp.asarray(rng.normal(size=(2, 4, 3))),
        jnp.asarray(rng.normal(size=(3, 3))).at[0, 2].set(-jnp.inf),
        jnp.asarray([0.0, 0.0, -jnp.inf]),
    )
    lengths = jnp.asarray([4, 2], jnp.int32)
    for algorithm in ALGORITHMS:
        for potentials in (dense, factored):

            def program(semiring):
                log_z = lambda p: jnp.sum(chain.forward(semiring, p, lengths, algorithm=algorithm))
                return str(jax.make_jaxpr(jax.value_and_grad(log_z))(potentials))

            assert program(semirings.Real) == program(semirings.Log), algorithm


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(problem=problems(forbidden=True))
def test_max_kmax_entropy_counting_match_enumeration(algorithm, problem):
    potentials, lengths = problem
    assert_close(
        jitted("forward", semirings.Max, algorithm=algorithm)(potentials, lengths),
        testing.viterbi(potentials, lengths)[0],
    )
    assert_close(
        jitted("forward", semirings.KMax(3), algorithm=algorithm)(potentials, lengths),
        testing.kbest_scores(potentials, lengths, 3),
    )
    assert_close(jitted("entropy", algorithm=algorithm)(potentials, lengths), testing.entropy(potentials, lengths))
    assert_close(
        jitted("forward", semirings.Counting, algorithm=algorithm)(potentials, lengths),
        testing.count_paths(potentials, lengths),
    )


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(problem=problems(forbidden=True))
def test_marginals_match_enumeration_and_sum_to_one(algorithm, problem):
    potentials, lengths = problem
    nodes = jitted("node_marginals", algorithm=algorithm)(potentials, lengths)
    assert_close(nodes, testing.node_marginals(potentials, lengths))
    T = nodes.shape[-2]
    inside = np.arange(T) < np.asarray(lengths)[..., None]
    reachable = np.isfinite(testing.log_partition(potentials, lengths))[..., None]
    sums = np.asarray(nodes).sum(-1)
    assert_close(sums, np.where(inside & reachable, 1.0, 0.0))
    if not isinstance(potentials, FactoredPotentials):
        assert_close(
            jitted("marginals", algorithm=algorithm)(potentials, lengths), testing.marginals(potentials, lengths)
        )


@given(problem=problems(forbidden=True))
def test_log_partition_and_marginals_match_enumeration(problem):
    potentials, lengths = problem
    log_z, marginals = jitted("log_partition_and_marginals")(potentials, lengths)
    assert_close(log_z, testing.log_partition(potentials, lengths))
    if isinstance(potentials, FactoredPotentials):
        assert_close(marginals.unary, testing.node_marginals(potentials, lengths))
    else:
        assert_close(marginals, testing.marginals(potentials, lengths))


@given(problem=problems(factored=True))
def test_factored_equals_materialized(problem):
    potentials, lengths = problem
    dense = chain.materialize(potentials)
    log_partition, marginals = jitted("log_partition"), jitted("marginals")
    assert_close(log_partition(potentials, lengths), log_partition(dense, lengths))
    edge = marginals(dense, lengths)
    factored = marginals(potentials, lengths)
    assert_close(factored.unary, edge.sum(-2))
    assert_close(factored.transitions, edge[..., 1:, :, :].sum(-3))
    start = edge[..., 0, 0, :] if edge.shape[-3] else np.zeros(factored.start.shape)
    assert_close(factored.start, start)


@given(problem=problems(forbidden=True))
def test_viterbi_matches_enumeration_and_own_score(problem):
    potentials, lengths = problem
    best, labels = jitted("viterbi")(potentials, lengths)
    expected_best, _ = testing.viterbi(potentials, lengths)
    assert_close(best, expected_best)
    reachable = np.isfinite(np.asarray(best))
    T = labels.shape[-1]
    past = np.arange(T) >= np.asarray(lengths)[..., None]
    assert np.all(np.asarray(labels)[past] == -1)
    rescored = jitted("score")(potentials, jnp.maximum(labels, 0), lengths)
    assert_close(np.where(reachable, rescored, 0.0), np.where(reachable, best, 0.0))
    assert_close(
        testing.sequence_score(potentials, np.maximum(labels, 0), lengths)[reachable], np.asarray(best)[reachable]
    )


@given(problem=problems())
def test_kbest_paths_are_distinct_and_scored(problem):
    potentials, lengths = problem
    scores, labels = jitted("kbest", k=3)(potentials, lengths)
    assert_close(scores, testing.kbest_scores(potentials, lengths, 3))
    flat_scores = np.asarray(scores).reshape(-1, 3)
    batch = flat_scores.shape[0]  # not -1 in the reshapes below: at T = 0 they hold no element
    flat_labels = np.asarray(labels).reshape(batch, 3, labels.shape[-1])
    flat_lengths = np.asarray(lengths).reshape(-1)
    psi = testing._per_position(potentials).reshape((batch,) + testing._per_position(potentials).shape[-3:])
    for b in range(flat_scores.shape[0]):
        seen = set()
        for j in range(3):
            if np.isfinite(flat_scores[b, j]):
                path = tuple(flat_labels[b, j, : flat_lengths[b]])
                assert path not in seen
                seen.add(path)
                assert_close(
                    testing.sequence_score(
                        psi[b], np.asarray(path + (0,) * (psi.shape[1] - len(path))), flat_lengths[b]
                    ),
                    flat_scores[b, j],
                )


@pytest.mark.parametrize("k", [1, 3])
def test_best_paths_looping_over_the_length_equal_those_over_all_positions(k):
    """`decode.best_paths(stop_at_length=True)` (a chain decoded alone, as in
    the online epochs) against the loop over all `T`, at every length,
    with forbidden (-inf) transitions and ties."""
    rng = np.random.default_rng(3)
    scores = np.round(rng.normal(size=(6, 4, 4)), 1)  # rounded: ties
    scores[2:, 1, 2] = -np.inf
    form = chain.prepare_inputs(jnp.asarray(scores), None)[0]
    decoders = {
        stop: jax.jit(lambda length, stop=stop: decode.best_paths(k, form, length, stop_at_length=stop))
        for stop in (False, True)
    }
    for length in range(7):
        (full_scores, full_labels), (short_scores, short_labels) = (
            decoders[stop](jnp.int32(length)) for stop in (False, True)
        )
        np.testing.assert_array_equal(np.asarray(short_scores), np.asarray(full_scores))
        np.testing.assert_array_equal(np.asarray(short_labels), np.asarray(full_labels))


def test_score_matches_direct_sum():
    rng = np.random.default_rng(1)
    potentials = jnp.asarray(rng.normal(size=(2, 3, 5, 4, 4)))
    lengths = jnp.asarray([[5, 3, 0], [1, 2, 4]], jnp.int32)
    labels = jnp.asarray(rng.integers(0, 4, size=(2, 3, 5)), jnp.int32)
    labels = jnp.where(jnp.arange(5) < lengths[..., None], labels, -1)
    assert_close(
        chain.score(potentials, labels, lengths), testing.sequence_score(potentials, np.maximum(labels, 0), lengths)
    )


def test_samples_follow_the_distribution():
    rng = np.random.default_rng(2)
    potentials = jnp.asarray(rng.normal(size=(3, 3, 3)))
    lengths = jnp.asarray(3, jnp.int32)
    draws = jax.jit(jax.vmap(lambda k: chain.sample(k, potentials, lengths)))(
        jax.random.split(jax.random.PRNGKey(0), 20000)
    )
    codes = np.asarray(draws) @ np.array([9, 3, 1])
    frequencies = np.bincount(codes, minlength=27) / codes.size
    labels, scores = testing.enumerate_sequences(potentials, 3)
    probabilities = np.exp(scores - testing.log_partition(potentials, lengths))
    np.testing.assert_allclose(frequencies[labels @ np.array([9, 3, 1])], probabilities, atol=0.015)
    short = chain.sample(jax.random.PRNGKey(1), jnp.stack([potentials] * 2), jnp.asarray([0, 2], jnp.int32))
    assert (
        np.all(np.asarray(short)[0] == -1)
        and np.all(np.asarray(short)[1, 2:] == -1)
        and np.all(np.asarray(short)[1, :2] >= 0)
    )


# ---------------------------------------------------------------------------
# jit, vmap and looped variants agree
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_batched_vmapped_and_looped_agree(algorithm):
    rng = np.random.default_rng(3)
    potentials = jnp.asarray(rng.normal(size=(4, 5, 3, 3)))
    lengths = jnp.asarray([5, 0, 1, 3], jnp.int32)
    run = lambda p, n: chain.log_partition(p, n, algorithm=algorithm)
    looped = jnp.stack([run(potentials[b], lengths[b]) for b in range(4)])
    assert_close(run(potentials, lengths), looped)
    assert_close(jax.vmap(run)(potentials, lengths), looped)
    assert_close(jax.jit(jax.vmap(run))(potentials, lengths), looped)


class JitVariants(chex.TestCase):
    """chex variants: the same call with and without jit."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_every_function_under_variants(self):
        rng = np.random.default_rng(4)
        potentials = jnp.asarray(rng.normal(size=(3, 4, 3, 3)))
        lengths = jnp.asarray([4, 2, 0], jnp.int32)
        functions = {
            "log_partition": lambda p, n: chain.log_partition(p, n),
            "parallel": lambda p, n: chain.log_partition(p, n, algorithm="parallel"),
            "real": lambda p, n: chain.forward(semirings.Real, p, n),
            "node_marginals": lambda p, n: chain.node_marginals(p, n),
            "entropy": lambda p, n: chain.entropy(p, n),
            "viterbi": lambda p, n: chain.viterbi(p, n),
            "kbest": lambda p, n: chain.kbest(p, n, 2),
        }
        for name, fn in functions.items():
            eager = fn(potentials, lengths)
            varied = self.variant(fn)(potentials, lengths)
            looped = [fn(potentials[b], lengths[b]) for b in range(3)]
            for leaf_eager, leaf_varied, *leaf_looped in zip(
                jax.tree_util.tree_leaves(eager),
                jax.tree_util.tree_leaves(varied),
                *[jax.tree_util.tree_leaves(x) for x in looped],
            ):
                np.testing.assert_allclose(leaf_varied, leaf_eager, rtol=1e-9, err_msg=name)
                np.testing.assert_allclose(np.stack(leaf_looped), leaf_eager, rtol=1e-9, err_msg=name)


# ---------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_log_partition_gradients_order_two(algorithm):
    rng = np.random.default_rng(5)
    potentials = jnp.asarray(rng.normal(size=(2, 4, 3, 3)))
    lengths = jnp.asarray([4, 2], jnp.int32)
    log_z = lambda p: jnp.sum(chain.log_partition(p, lengths, algorithm=algorithm))
    testing.check_gradients(jax.jit(log_z), (potentials,), order=2)  # `Real`: test_real_traces_to_the_program_of_log


def test_marginals_entropy_and_factored_gradients_order_two():
    rng = np.random.default_rng(6)
    potentials = jnp.asarray(rng.normal(size=(3, 3, 3)))
    lengths = jnp.asarray(3, jnp.int32)
    weights = jnp.asarray(rng.normal(size=(3, 3)))
    # Functions of the same arguments are checked together (a tuple of outputs):
    # each check compiles its derivatives once.
    testing.check_gradients(
        jax.jit(lambda p: (jnp.sum(chain.node_marginals(p, lengths) * weights), chain.entropy(p, lengths))),
        (potentials,),
        order=2,
    )
    unary, transitions = jnp.asarray(rng.normal(size=(4, 3))), jnp.asarray(rng.normal(size=(3, 3)))
    testing.check_gradients(
        jax.jit(lambda u, a: chain.forward(semirings.Real, FactoredPotentials(u, a), jnp.asarray(3, jnp.int32))),
        (unary, transitions),
        order=2,
    )
    # Per-chain marginals of a shared transition matrix (each chain differentiated
    # inside the batch's map) and the unary-only node marginals differentiate again.
    unary, lengths = jnp.asarray(rng.normal(size=(2, 4, 3))), jnp.asarray([4, 2], jnp.int32)
    count_weights, node_weights = jnp.asarray(rng.normal(size=(2, 3, 3))), jnp.asarray(rng.normal(size=(2, 4, 3)))
    testing.check_gradients(
        jax.jit(
            lambda u, a: (
                jnp.sum(chain.marginals(FactoredPotentials(u, a), lengths).transitions * count_weights),
                jnp.sum(chain.node_marginals(FactoredPotentials(u, a), lengths) * node_weights),
            )
        ),
        (unary, transitions),
    )


def test_forbidden_transitions_give_finite_values_and_gradients():
    rng = np.random.default_rng(7)
    # IOB2 over O, B-PER, I-PER: O -> I-PER and start -> I-PER are forbidden.
    transitions = jnp.asarray(rng.normal(size=(3, 3))).at[0, 2].set(-jnp.inf)
    start = jnp.asarray([0.0, 0.0, -jnp.inf])
    unary = jnp.asarray(rng.normal(size=(2, 6, 3)))
    lengths = jnp.asarray([6, 3], jnp.int32)
    for algorithm in ALGORITHMS:  # (`Real` runs the same program: test_real_traces_to_the_program_of_log)
        fn = lambda u, a, s: jnp.sum(chain.log_partition(FactoredPotentials(u, a, s), lengths, algorithm=algorithm))
        value, grads = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))(unary, transitions, start)
        assert np.isfinite(value)
        for g in grads:
            assert np.all(np.isfinite(np.asarray(g)))
        second = jax.jit(jax.grad(lambda u: jnp.sum(jax.grad(fn)(u, transitions, start) ** 2)))(unary)
        assert np.all(np.isfinite(np.asarray(second)))
    dense = chain.materialize(FactoredPotentials(unary, transitions, start))
    assert_close(
        chain.log_partition(FactoredPotentials(unary, transitions, start), lengths),
        testing.log_partition(dense, lengths),
    )


def test_everything_forbidden_gives_minus_inf_and_zero_gradients():
    potentials = jnp.full((2, 3, 3), -jnp.inf)
    lengths = jnp.asarray(2, jnp.int32)
    for semiring in (semirings.Log, semirings.Real):
        value, grad = jax.jit(jax.value_and_grad(lambda p: chain.forward(semiring, p, lengths)))(potentials)
        assert value == -np.inf
        assert np.all(np.asarray(grad) == 0.0)
    best, labels = chain.viterbi(potentials, lengths)
    assert best == -np.inf and np.all(np.asarray(labels) == -1)


def test_padding_with_nan_and_inf_does_not_leak():
    rng = np.random.default_rng(8)
    potentials = jnp.asarray(rng.normal(size=(2, 4, 3, 3)))
    lengths = jnp.asarray([2, 0], jnp.int32)
    clean = chain.log_partition(potentials, lengths)
    padded = potentials.at[0, 2:].set(-jnp.inf).at[1].set(-jnp.inf)
    value, grad = jax.jit(jax.value_and_grad(lambda p: jnp.sum(chain.log_partition(p, lengths))))(padded)
    assert_close(value, jnp.sum(clean))
    assert np.all(np.isfinite(np.asarray(grad))) and np.all(np.asarray(grad)[0, 2:] == 0)


# ---------------------------------------------------------------------------
# float32 accuracy on long sequences
# ---------------------------------------------------------------------------


@functools.cache
def _long_problem(T=10_000, L=9):
    rng = np.random.default_rng(9)
    return rng.normal(size=(T, L)) * 2.0, rng.normal(size=(L, L))


@pytest.mark.slow
def test_float32_long_sequence_matches_float64():  # (Real runs the same computation: see above)
    unary, transitions = _long_problem()
    run = jax.jit(
        lambda u, a: (chain.log_partition(FactoredPotentials(u, a)), chain.node_marginals(FactoredPotentials(u, a)))
    )
    log_z64, marginals64 = run(jnp.asarray(unary, jnp.float64), jnp.asarray(transitions, jnp.float64))
    log_z32, marginals32 = run(jnp.asarray(unary, jnp.float32), jnp.asarray(transitions, jnp.float32))
    assert log_z32.dtype == jnp.float32
    assert abs(float(log_z32) - float(log_z64)) <= 1e-6 * abs(float(log_z64))
    assert np.max(np.abs(np.asarray(marginals32, np.float64) - np.asarray(marginals64))) <= 1e-5
    dense32 = jnp.asarray(
        chain.materialize(FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions))), jnp.float32
    )
    log_z_dense = jax.jit(lambda p: chain.log_partition(p))(dense32)
    assert abs(float(log_z_dense) - float(log_z64)) <= 1e-6 * abs(float(log_z64))


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: chain.log_partition(jnp.zeros((3, 3))), "potentials must have shape"),
        (lambda: chain.log_partition(jnp.zeros((2, 3, 4))), "potentials must have shape"),
        (
            lambda: chain.log_partition(jnp.zeros((2, 5, 3, 3)), jnp.asarray([1, 2, 3], jnp.int32)),
            "lengths must have shape",
        ),
        (
            lambda: chain.log_partition(jnp.zeros((2, 5, 3, 3)), jnp.asarray([1, 6], jnp.int32)),
            r"lengths must lie in \[0, 5\]",
        ),
        (
            lambda: chain.log_partition(jnp.zeros((2, 5, 3, 3)), jnp.asarray([-1, 2], jnp.int32)),
            r"lengths must lie in \[0, 5\]",
        ),
        (
            lambda: chain.log_partition(FactoredPotentials(jnp.zeros((5, 3)), jnp.zeros((4, 4)))),
            "transitions must have shape",
        ),
        (
            lambda: chain.log_partition(FactoredPotentials(jnp.zeros((5, 3)), jnp.zeros((3, 3)), jnp.zeros(2))),
            "start must have shape",
        ),
        (lambda: chain.log_partition(jnp.full((2, 3, 3), jnp.nan)), "potentials contains NaN"),
        (lambda: chain.log_partition(jnp.full((2, 3, 3), jnp.inf)), r"potentials contains \+inf"),
        (
            lambda: chain.score(jnp.zeros((5, 3, 3)), jnp.asarray([0, 1, 3, 0, 0], jnp.int32)),
            r"labels must lie in \[0, 3\)",
        ),
        (lambda: chain.score(jnp.zeros((5, 3, 3)), jnp.asarray([0, 1], jnp.int32)), "labels must have shape"),
        (lambda: chain.log_partition(jnp.zeros((5, 3, 3)), algorithm="fast"), "algorithm must be one of"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: chain.log_partition(jnp.zeros((5, 3, 3), jnp.int32)), "potentials must be a floating-point array"),
        (lambda: chain.log_partition(jnp.zeros((5, 3, 3)), jnp.asarray(2.0)), "lengths must be an integer array"),
        (lambda: chain.score(jnp.zeros((5, 3, 3)), jnp.zeros(5)), "labels must be an integer array"),
    ],
)
def test_bad_types_raise_type_error(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_labels_outside_the_length_may_be_anything():
    potentials = jnp.zeros((4, 3, 3))
    assert float(chain.score(potentials, jnp.asarray([1, 2, -1, 7], jnp.int32), jnp.asarray(2, jnp.int32))) == 0.0


def test_padding_may_hold_anything_inside_the_lengths_nothing_but_scores():
    """Positions past a length are never read: NaN and +inf there give the
    values and finite gradients of the same chains with zeros there, while
    NaN inside a length is refused (dense and factored)."""
    lengths = jnp.array([2, 3])
    labels = jnp.array([[0, 1, -1], [1, 1, 0]])
    clean = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 2, 2)))
    for potentials, padded in (
        (clean, clean.at[0, 2].set(jnp.nan).at[0, 2, 0, 1].set(jnp.inf)),
        (
            FactoredPotentials(clean[..., 0, :], clean[0, 0]),
            FactoredPotentials(clean[..., 0, :].at[0, 2].set(jnp.nan), clean[0, 0]),
        ),
    ):
        loss = lambda p: jnp.sum(losses.sequence_log_loss(p, labels, lengths))
        np.testing.assert_allclose(loss(padded), loss(potentials), rtol=1e-12)
        gradient = jax.grad(loss)(padded)
        assert all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(gradient))
        np.testing.assert_array_equal(chain.viterbi(padded, lengths)[1], chain.viterbi(potentials, lengths)[1])
        with pytest.raises(ValueError, match="contains NaN at index"):
            chain.log_partition(padded, jnp.array([3, 3]))
