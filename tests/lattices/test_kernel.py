"""The exact fast chain kernel (`lattices.kernel` and the exact log steps of
the factored and dense forms, `lattices.forms`, with their closed-form
derivatives; the exact dot product of the parallel algorithm) against
`testing.reference_row_log_partition`, a plain log-space scan whose
derivatives are autodiff: values, gradients under uneven cotangents,
Hessian-vector products, chains with no allowed path, empty rows,
batching; every tuning branch, the log-space recovery and the backend's
choice of algorithm forced on CPU; one recovery decision per batch under a
user's `jax.vmap` (the `cond` stays a branch); and adversarial scores
(prefixes hundreds of nats behind that win later, scale-100 scores, `-inf`
transitions) in float32 and float64 against the float64 oracle.
Enumeration checks are in test_chain.py and test_chain_rows.py."""

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import losses, semirings, testing
from lossfns.lattices import FactoredPotentials, chain, kernel

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

B, T, L = 4, 7, 3


@contextlib.contextmanager
def variant(recover=False, **tuning):
    """Run the kernel with CPU tuning replaced (`Tuning` fields) and, with
    `recover`, every step redone in log space (threshold above any sum).
    Compiled programs are dropped on the way in and out: tuning is read at
    trace time."""
    saved_tuning, saved_threshold = kernel.TUNING["cpu"], kernel.recovery_threshold
    kernel.TUNING["cpu"] = saved_tuning._replace(**tuning)
    if recover:
        kernel.recovery_threshold = lambda dtype, labels: float("inf")
    jax.clear_caches()
    try:
        yield
    finally:
        kernel.TUNING["cpu"], kernel.recovery_threshold = saved_tuning, saved_threshold
        jax.clear_caches()


ALWAYS, NEVER = 2**62, 0
ROW_VARIANTS = {
    "fused-in-scan": dict(fused_matmul_max_size=ALWAYS, edge_sums_in_scan_max_size=ALWAYS),
    "dot-after-scan": dict(fused_matmul_max_size=NEVER, edge_sums_in_scan_max_size=NEVER),
    "recovered-in-scan": dict(recover=True, edge_sums_in_scan_max_size=ALWAYS),
    "recovered-after-scan": dict(recover=True, edge_sums_in_scan_max_size=NEVER),
    # 3 labels padded to 8 forbidden ones (`FactoredPotentials.padded`)
    "padded-labels": dict(label_multiple=8, label_multiple_min_labels=0),
}


def problem(seed, forbid=True):
    """Rows of several chains with forbidden transitions; row 2 is empty,
    row 3 one chain of length 1 followed by a chain with no allowed path."""
    rng = np.random.default_rng(seed)
    transitions = rng.normal(size=(L, L))
    if forbid:
        transitions[0, 1] = transitions[2, 2] = -np.inf
    unary = rng.normal(size=(B, T, L))
    unary[3, 3] = -np.inf  # every label forbidden at one position of the second chain in row 3
    starts = np.zeros((B, T), bool)
    starts[0, [3, 5]] = starts[1, 2] = starts[3, 1] = True
    lengths = np.array([T, 5, 0, 4], np.int32)
    potentials = FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions), jnp.asarray(rng.normal(size=L)))
    return potentials, jnp.asarray(starts), jnp.asarray(lengths)


def kernel_rows(potentials, starts, lengths):
    return chain.row_log_partition(potentials, starts, lengths)


def weighted(log_partition):
    """`sum_b w_b log Z_b` over the rows with a finite log Z."""

    def total(potentials, weights):
        log_z = log_partition(potentials)
        return jnp.sum(jnp.where(jnp.isfinite(log_z), weights * log_z, 0.0))

    return total


def derivatives(log_partition, potentials, weights):
    """Values, gradients of `weighted` and Hessian-vector products (forward
    over reverse mode, along a direction that is zero at -inf scores), in
    one jitted program."""
    gradient = jax.grad(weighted(log_partition))
    direction = jax.tree_util.tree_map(lambda x: jnp.where(jnp.isfinite(x), 0.1, 0.0), potentials)
    hessian_vector = lambda p, d: jax.jvp(lambda q: gradient(q, weights), (p,), (d,))[1]
    return jax.jit(lambda p, d: (log_partition(p), gradient(p, weights), hessian_vector(p, d)))(potentials, direction)


def assert_matches_reference(fast, expected, potentials, weights, atol=1e-12):
    """`fast`'s `derivatives` against the reference's (`expected`, computed
    once outside any `variant`: the reference does not read the tuning)."""
    (value, got, hessian_vector), (want_value, want, want_hessian_vector) = (
        derivatives(fast, potentials, weights),
        expected,
    )
    np.testing.assert_allclose(value, want_value, rtol=1e-12)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, atol=atol)
    for g, w in zip(jax.tree_util.tree_leaves(hessian_vector), jax.tree_util.tree_leaves(want_hessian_vector)):
        np.testing.assert_allclose(g, w, atol=1e-10)
    return got


ROW_WEIGHTS = jnp.asarray([0.5, -2.0, 3.0, 1.5])
PER_POSITION_WEIGHTS = jnp.asarray([0.5, -2.0, 3.0, 1.5, 1.0])


@functools.cache
def row_reference():
    potentials, starts, lengths = problem(0)
    return derivatives(lambda p: testing.reference_row_log_partition(p, starts, lengths), potentials, ROW_WEIGHTS)


@pytest.mark.parametrize("name", ROW_VARIANTS)
def test_rows_match_the_reference(name):
    potentials, starts, lengths = problem(0)
    expected = row_reference()
    with variant(**ROW_VARIANTS[name]):
        fast = lambda p: kernel_rows(p, starts, lengths)
        got = assert_matches_reference(fast, expected, potentials, ROW_WEIGHTS)
        values = fast(potentials)
    assert values[2] == 0.0 and values[3] == -np.inf
    # The chain with no allowed path contributes nothing; the chain before it does.
    assert np.all(got.unary[3, 1:4] == 0) and np.any(got.unary[0] != 0)


def test_rows_with_many_labels_match_the_reference():
    """Many labels and rows (edge sums after the scan by default)."""
    rng = np.random.default_rng(4)
    rows, labels = 90, 20
    assert labels * labels * rows > kernel.TUNING["cpu"].edge_sums_in_scan_max_size
    transitions = rng.normal(size=(labels, labels))
    transitions[3, :5] = -np.inf
    potentials = FactoredPotentials(
        jnp.asarray(rng.normal(size=(rows, 5, labels))), jnp.asarray(transitions), jnp.asarray(rng.normal(size=labels))
    )
    starts = jnp.asarray(rng.random((rows, 5)) < 0.3)
    lengths = jnp.asarray(rng.integers(0, 6, size=rows), jnp.int32)
    weights = jnp.asarray(rng.normal(size=rows))
    reference = lambda p: testing.reference_row_log_partition(p, starts, lengths)
    assert_matches_reference(
        lambda p: kernel_rows(p, starts, lengths), derivatives(reference, potentials, weights), potentials, weights
    )


def test_hessian_of_the_default_call():
    """`jax.hessian` (forward over reverse) of `chain.log_partition` itself."""
    potentials, _, _ = problem(1, forbid=False)
    hessian = lambda log_z: jax.jit(jax.hessian(lambda u: log_z(potentials._replace(unary=u))))(potentials.unary[0, :4])
    np.testing.assert_allclose(
        hessian(lambda p: chain.log_partition(p, 3)),
        hessian(lambda p: testing.reference_row_log_partition(p, None, 3)),
        atol=1e-12,
    )


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_batching_jit_and_loop_agree(jit):
    potentials, starts, lengths = problem(3)
    stacked = FactoredPotentials(
        jnp.stack([potentials.unary, 2 * potentials.unary]), potentials.transitions, potentials.start
    )
    run = lambda u: chain.row_log_partition(
        FactoredPotentials(u, potentials.transitions, potentials.start), starts, lengths
    )
    run = jax.jit(run) if jit else run
    mapped = jax.vmap(run)(stacked.unary)
    looped = jnp.stack([run(u) for u in stacked.unary])
    both = chain.row_forward(semirings.Real, stacked, jnp.stack([starts] * 2), jnp.stack([lengths] * 2))
    np.testing.assert_allclose(mapped, looped, rtol=1e-12)
    np.testing.assert_allclose(both, looped, rtol=1e-12)


def test_no_positions():
    potentials = FactoredPotentials(jnp.zeros((2, 0, L)), jnp.zeros((L, L)), jnp.zeros(L))
    value, gradient = jax.value_and_grad(lambda u: jnp.sum(chain.log_partition(potentials._replace(unary=u))))(
        potentials.unary
    )
    assert value == 0.0 and gradient.shape == (2, 0, L)


@pytest.mark.parametrize("recover", [False, True], ids=["ordinary", "recovered"])
def test_user_vmap_equals_the_batched_call_and_keeps_one_decision(recover):
    """`jax.vmap` around the public functions (values, `vmap(grad)`) gives the
    batched call's results, and the recovery check stays a `cond` (one
    decision for the mapped batch, not a `select` running both branches)."""
    potentials, _, lengths = problem(9)
    log_z = lambda u, n: chain.log_partition(potentials._replace(unary=u), n)
    per_position = chain.materialize(potentials)
    with variant(recover=recover):
        np.testing.assert_allclose(
            jax.vmap(log_z)(potentials.unary, lengths), log_z(potentials.unary, lengths), rtol=1e-12
        )
        grad = lambda f: jax.grad(lambda x, n: jnp.sum(jnp.where(jnp.isfinite(v := f(x, n)), v, 0.0)))
        np.testing.assert_allclose(
            jax.jit(jax.vmap(grad(log_z)))(potentials.unary, lengths),
            grad(log_z)(potentials.unary, lengths),
            atol=1e-12,
        )
        np.testing.assert_allclose(
            jax.vmap(grad(chain.log_partition))(per_position, lengths),
            grad(chain.log_partition)(per_position, lengths),
            atol=1e-12,
        )
        for program, argument in [
            (jax.vmap(log_z), potentials.unary),
            (jax.vmap(grad(log_z)), potentials.unary),
            (jax.vmap(grad(chain.log_partition)), per_position),
        ]:
            assert "cond[" in str(jax.make_jaxpr(program)(argument, lengths))


def test_backend_choice_of_the_parallel_algorithm():
    """The accelerators' branch forced on CPU: `algorithm="auto"` runs the
    parallel algorithm (no sequential loop) for long chains with few
    labels, exact (`kernel.log_matmul`, recovered at `-inf` and wide scores)
    with finite gradients; too many labels keep the scan."""
    potentials, lengths = per_position_problem(10)
    potentials = potentials * jnp.asarray([100.0, 1.0, 1.0, 1.0, 1.0])[:, None, None, None]
    expected = derivatives(
        lambda p: testing.reference_row_log_partition(p, None, lengths), potentials, PER_POSITION_WEIGHTS
    )
    with variant(parallel_min_steps=T, parallel_max_labels=L):
        program = str(jax.make_jaxpr(chain.log_partition)(potentials, lengths))
        assert "scan[" not in program and "while[" not in program
        got = assert_matches_reference(
            lambda p: chain.log_partition(p, lengths), expected, potentials, PER_POSITION_WEIGHTS, atol=1e-9
        )
        assert np.all(got[4] == 0)
    with variant(parallel_min_steps=T, parallel_max_labels=L - 1):
        assert "scan[" in str(jax.make_jaxpr(chain.log_partition)(potentials, lengths))


# ---------------------------------------------------------------------------
# Per-position potentials `[B, T, L, L]`
# ---------------------------------------------------------------------------


def per_position_problem(seed):
    """Per-position chains with forbidden transitions at some positions;
    lengths T, 4, 0, 1 and T; chain 4 has no allowed path (every edge into
    position 2 forbidden)."""
    rng = np.random.default_rng(seed)
    potentials = rng.normal(size=(5, T, L, L))
    potentials[0, 2, 0, 1] = potentials[1, 3, :, 2] = -np.inf
    potentials[4, 2] = -np.inf
    potentials[0, 5:, 1] = -np.inf  # rows past the length may hold anything
    return jnp.asarray(potentials), jnp.asarray([T, 4, 0, 1, T], jnp.int32)


PER_POSITION_VARIANTS = {
    "kept-fused": dict(keep_factors_max_bytes=ALWAYS, fused_products_max_labels=ALWAYS),
    "recomputed-dot": dict(keep_factors_max_bytes=NEVER, fused_products_max_labels=NEVER),
    "recovered-kept": dict(recover=True, keep_factors_max_bytes=ALWAYS),
    "recovered-recomputed": dict(recover=True, keep_factors_max_bytes=NEVER),
}


@functools.cache
def per_position_reference():
    potentials, lengths = per_position_problem(5)
    return derivatives(
        lambda p: testing.reference_row_log_partition(p, None, lengths), potentials, PER_POSITION_WEIGHTS
    )


@pytest.mark.parametrize("name", PER_POSITION_VARIANTS)
def test_per_position_matches_the_reference(name):
    potentials, lengths = per_position_problem(5)
    expected = per_position_reference()
    with variant(**PER_POSITION_VARIANTS[name]):
        fast = lambda p: chain.log_partition(p, lengths)
        got = assert_matches_reference(fast, expected, potentials, PER_POSITION_WEIGHTS)
        values = fast(potentials)
    assert values[2] == 0.0 and values[4] == -np.inf
    assert np.all(got[4] == 0) and np.all(got[1, 4:] == 0) and np.all(got[:, 0, 1:] == 0)


def test_per_position_dispatch_batching_and_no_positions():
    """`chain.log_partition` runs this path for any batch shape, as vmap, jit
    and a loop do; T = 0 gives log Z = 0 and an empty gradient."""
    potentials, lengths = per_position_problem(6)
    stacked = jnp.stack([potentials, 2 * potentials])
    looped = jnp.stack([testing.reference_row_log_partition(p, None, lengths) for p in stacked])
    np.testing.assert_allclose(chain.log_partition(stacked, jnp.stack([lengths] * 2)), looped, rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(jax.jit(chain.log_partition), (0, None))(stacked, lengths), looped, rtol=1e-12)
    real = lambda p, n: chain.forward(semirings.Real, p, n)
    np.testing.assert_allclose(looped, jnp.stack([real(p, lengths) for p in stacked]), rtol=1e-12)
    empty = jnp.zeros((2, 0, L, L))
    value, gradient = jax.value_and_grad(lambda p: jnp.sum(chain.log_partition(p)))(empty)
    assert value == 0.0 and gradient.shape == (2, 0, L, L)


# ---------------------------------------------------------------------------
# Adversarial scores: exact where the unchecked real-space recursion underflows
# ---------------------------------------------------------------------------


def adversarial_chains():
    """Factored float64 chains `(name, potentials, lengths)` on which per-step
    rescaling in probability space loses the winning path."""
    rng = np.random.default_rng(7)
    cases = [
        (
            "a prefix 200 nats behind wins",
            FactoredPotentials(
                np.array([[[0.0, -200.0], [0.0, 0.0], [0.0, 0.0]]]), np.array([[0.0, 0.0], [0.0, 300.0]]), np.zeros(2)
            ),
            np.array([3]),
        )
    ]
    unary = np.zeros((1, 6, 3))
    unary[0, 0] = [0.0, -900.0, -np.inf]  # 900 nats behind: past float64's range of one step too
    transitions = np.array([[0.0, -np.inf, 0.0], [0.0, 500.0, -np.inf], [0.0, 0.0, 0.0]])
    cases.append(
        ("900 nats behind, -inf transitions", FactoredPotentials(unary, transitions, np.zeros(3)), np.array([6]))
    )
    for scale in (60.0, 100.0):
        transitions = rng.normal(size=(5, 5)) * scale
        transitions[1, 2] = transitions[4, 0] = -np.inf
        cases.append(
            (
                f"random, scale {scale:g}",
                FactoredPotentials(rng.normal(size=(3, 40, 5)) * scale, transitions, rng.normal(size=5) * scale),
                np.array([40, 17, 1]),
            )
        )
    return cases


@functools.cache
def adversarial_references():
    """`(name, potentials64, lengths, log Z [B], node marginals [B, T, L])` per
    adversarial chain, from the float64 reference (its gradient gives the
    node marginals), computed once for every dtype and form."""

    def reference(unary, transitions, start, lengths):
        log_z = lambda u: testing.reference_row_log_partition(FactoredPotentials(u, transitions, start), None, lengths)
        return log_z(unary), jax.grad(lambda u: jnp.sum(log_z(u)))(unary)

    return [
        (name, potentials64, lengths)
        + tuple(np.asarray(x) for x in jax.jit(reference)(*(jnp.asarray(x) for x in (*potentials64, lengths))))
        for name, potentials64, lengths in adversarial_chains()
    ]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("form", ["factored", "per-position"])
def test_adversarial_chains_are_exact(dtype, form):
    for name, potentials64, lengths, reference, want in adversarial_references():
        potentials = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), potentials64)
        if form == "per-position":
            potentials = chain.materialize(potentials)
        for semiring in (semirings.Log, semirings.Real):
            log_z = chain.forward(semiring, potentials, lengths)
            assert np.all(np.isfinite(log_z)), name
            np.testing.assert_allclose(np.asarray(log_z, np.float64), reference, rtol=1e-5, err_msg=name)
        nodes = chain.node_marginals(potentials, lengths)
        np.testing.assert_allclose(np.asarray(nodes, np.float64), want, atol=1e-5, err_msg=name)
        # The log-loss of every sequence is >= 0 up to rounding, and of the best one near 0.
        _, best = chain.viterbi(potentials, lengths)
        loss = losses.sequence_log_loss(potentials, jnp.maximum(best, 0), lengths)
        assert np.all(np.asarray(loss) >= -1e-5 * np.abs(reference)), name


def test_long_float32_chains_with_wide_scores_match_float64():
    """T = 2,000, scale-60 scores: every step checked, the recovered ones in log space."""
    rng = np.random.default_rng(8)
    potentials = FactoredPotentials(
        rng.normal(size=(2, 2000, 9)) * 60, rng.normal(size=(9, 9)) * 60, rng.normal(size=9)
    )
    reference = np.asarray(testing.reference_row_log_partition(jax.tree_util.tree_map(jnp.asarray, potentials)))
    got = chain.log_partition(jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), potentials))
    np.testing.assert_allclose(np.asarray(got, np.float64), reference, rtol=1e-5)
