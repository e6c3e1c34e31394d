"""Bad input to lossfns.lattices.chain (dense, factored and sparse potentials)
and lossfns.lattices.constraints: each case raises the stated exception type
with a message naming the offending argument; inside jit, the opt-in checked
mode (lossfns.debug) sees what plain jit cannot.

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import debug
from lossfns.lattices import chain, constraints
from lossfns.lattices.sparse_chain import SparsePotentials
from tests.bad_inputs import GOOD, INF, NAN, WIDE, L, T, assert_raises_a_named_error, case_ids, factored, x32


def _sparse(**changes):
    fields = dict(
        unary=jnp.zeros((2, T, L)),
        pair_weights=jnp.zeros((2, T, 2)),
        pair_previous=jnp.array([0, 1]),
        pair_next=jnp.array([1, 0]),
    )
    fields.update(changes)
    return SparsePotentials(**fields)


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    # --- potentials ---
    (
        "potentials-rank",
        "potentials of rank 2",
        lambda _: chain.log_partition(jnp.zeros((T, L))),
        ValueError,
        ["potentials", "[..., T, L, L]", "(3, 2)"],
    ),
    (
        "potentials-not-square",
        "potentials [..., T, L, M] with L != M",
        lambda _: chain.log_partition(jnp.zeros((T, 2, 3))),
        ValueError,
        ["potentials", "square"],
    ),
    (
        "potentials-int",
        "integer potentials",
        lambda _: chain.log_partition(jnp.zeros((T, L, L), jnp.int32)),
        TypeError,
        ["potentials", "floating", "int32"],
    ),
    (
        "potentials-complex",
        "complex potentials",
        lambda _: chain.viterbi(jnp.zeros((T, L, L), jnp.complex64)),
        TypeError,
        ["potentials", "complex64"],
    ),
    (
        "potentials-nan",
        "NaN in potentials",
        lambda _: chain.marginals(GOOD(i011=NAN)),
        ValueError,
        ["potentials", "NaN", "(0, 1, 1"],
    ),
    (
        "potentials-posinf",
        "+inf in potentials",
        lambda _: chain.viterbi(GOOD(i100=INF)),
        ValueError,
        ["potentials", "+inf"],
    ),
    (
        "potentials-no-labels",
        "zero labels (L = 0)",
        lambda _: chain.log_partition(jnp.zeros((T, 0, 0))),
        ValueError,
        ["potentials", "L >= 1"],
    ),
    ("potentials-string", "a string as potentials", lambda _: chain.log_partition("scores"), TypeError, ["potentials"]),
    (
        "potentials-ragged",
        "a ragged nested list as potentials",
        lambda _: chain.log_partition([[[0.0, 1.0], [1.0]], [[0.0, 0.0], [0.0, 0.0]]]),
        ValueError,
        ["potentials", "ragged", "[..., T, L, L]"],
    ),
    (
        "sample-key-shape",
        "chain.sample with an old-style PRNG key of the wrong shape",
        lambda _: chain.sample(jnp.arange(3, dtype=jnp.uint32), GOOD()),
        TypeError,
        ["key", "PRNG key", "jax.random.key(seed)", "shape (3,)"],
    ),
    (
        "sample-keys",
        "chain.sample with an array of keys for one",
        lambda _: chain.sample(jax.random.split(jax.random.key(0), 2), GOOD()),
        ValueError,
        ["key", "one PRNG key", "shape (2,)"],
    ),
    # --- lengths ---
    (
        "lengths-shape",
        "lengths not of the batch shape",
        lambda _: chain.log_partition(GOOD(), jnp.array([1, 2, 3])),
        ValueError,
        ["lengths", "(2,)", "(3,)"],
    ),
    (
        "lengths-float",
        "float lengths",
        lambda _: chain.entropy(GOOD(), jnp.array([1.0, 2.0])),
        TypeError,
        ["lengths", "integer"],
    ),
    (
        "lengths-negative",
        "a negative length",
        lambda _: chain.viterbi(GOOD(), jnp.array([-1, 2])),
        ValueError,
        ["lengths", "[0, 3]", "-1"],
    ),
    (
        "lengths-too-long",
        "a length above T",
        lambda _: chain.sample(jax.random.key(0), GOOD(), jnp.array([1, 4])),
        ValueError,
        ["lengths", "[0, 3]", "4"],
    ),
    (
        "lengths-too-long-kbest",
        "a length above T (kbest)",
        lambda _: chain.kbest(GOOD(), jnp.array([9, 1]), 2),
        ValueError,
        ["lengths", "9"],
    ),
    (
        "lengths-wrap",
        "an int64 length 2**32 + 2 (int32 would read 2)",
        lambda _: x32(lambda: chain.log_partition(GOOD(), np.array([WIDE, 3]))),
        ValueError,
        ["lengths", "[0, 3]", "4294967298"],
    ),
    (
        "lengths-fractional",
        "a fractional length 2.5",
        lambda _: chain.log_partition(GOOD(), np.array([2.5, 3.0])),
        TypeError,
        ["lengths", "integer", "2.5", "(0,)"],
    ),
    # --- labels ---
    (
        "labels-shape",
        "labels not [..., T]",
        lambda _: chain.score(GOOD(), jnp.zeros((2, T + 1), jnp.int32)),
        ValueError,
        ["labels", "(2, 3)", "(2, 4)"],
    ),
    (
        "labels-float",
        "float labels",
        lambda _: chain.score(GOOD(), jnp.zeros((2, T))),
        TypeError,
        ["labels", "integer"],
    ),
    (
        "labels-too-large",
        "a label >= L inside the length",
        lambda _: chain.score(GOOD(), jnp.array([[0, 1, 2], [0, 0, 0]])),
        ValueError,
        ["labels", "[0, 2)", "2"],
    ),
    (
        "labels-negative",
        "a label -1 inside the length",
        lambda _: chain.score(GOOD(), jnp.array([[0, -1, -1], [0, 0, 0]]), jnp.array([2, 3])),
        ValueError,
        ["labels", "-1", "(0, 1)"],
    ),
    (
        "labels-wrap",
        "an int64 label 2**32 + 1 (int32 would read 1)",
        lambda _: x32(lambda: chain.score(GOOD(), np.array([[0, 2**32 + 1, 0], [0, 0, 0]]))),
        ValueError,
        ["labels", "[0, 2)", "4294967297", "(0, 1)"],
    ),
    (
        "labels-padding-wrap",
        "an int64 label beyond int32 in the padding outside the length",
        lambda _: x32(lambda: chain.score(GOOD(), np.array([[0, 0, WIDE], [0, 0, 0]]), np.array([2, 3]))),
        ValueError,
        ["labels", "int32", "4294967298", "(0, 2)"],
    ),
    (
        "labels-fractional",
        "a fractional label 0.5",
        lambda _: chain.score(GOOD(), np.array([[0, 0.5, 0], [0, 0, 0]])),
        TypeError,
        ["labels", "integer", "0.5"],
    ),
    # --- factored potentials ---
    (
        "unary-rank",
        "unary of rank 1",
        lambda _: chain.log_partition(factored(unary=jnp.zeros(L))),
        ValueError,
        ["unary", "[..., T, L]"],
    ),
    (
        "unary-int",
        "integer unary scores",
        lambda _: chain.log_partition(factored(unary=jnp.zeros((T, L), int))),
        TypeError,
        ["unary"],
    ),
    (
        "unary-nan",
        "NaN in unary",
        lambda _: chain.marginals(factored(unary=jnp.full((2, T, L), NAN))),
        ValueError,
        ["unary", "NaN"],
    ),
    (
        "transitions-shape",
        "transitions not [L, L]",
        lambda _: chain.log_partition(factored(transitions=jnp.zeros((L, L + 1)))),
        ValueError,
        ["transitions", "[..., 2, 2]"],
    ),
    (
        "transitions-batch",
        "transitions batch not broadcastable to unary's",
        lambda _: chain.log_partition(factored(transitions=jnp.zeros((5, L, L)))),
        ValueError,
        ["transitions", "(5,)", "(2,)"],
    ),
    (
        "transitions-posinf",
        "+inf in transitions",
        lambda _: chain.viterbi(factored(transitions=jnp.full((L, L), INF))),
        ValueError,
        ["transitions", "+inf"],
    ),
    (
        "start-shape",
        "start not [L]",
        lambda _: chain.log_partition(factored(start=jnp.zeros(L + 1))),
        ValueError,
        ["start", "[..., 2]"],
    ),
    (
        "start-nan",
        "NaN in start",
        lambda _: chain.entropy(factored(start=jnp.full(L, NAN))),
        ValueError,
        ["start", "NaN"],
    ),
    # --- options and semirings ---
    (
        "algorithm",
        "unknown algorithm",
        lambda _: chain.log_partition(GOOD(), algorithm="fast"),
        ValueError,
        ["algorithm", "'fast'", "sequential"],
    ),
    ("kbest-k", "k = 0 for kbest", lambda _: chain.kbest(GOOD(), None, 0), ValueError, ["k", "0"]),
    (
        "forward-semiring",
        "a string instead of a semiring",
        lambda _: chain.forward("log", GOOD()),
        TypeError,
        ["semiring", "Semiring"],
    ),
    ("sample-key", "an int instead of a PRNG key", lambda _: chain.sample(0, GOOD()), TypeError, ["PRNG key"]),
    # --- lossfns.lattices.sparse_chain ---
    (
        "sparse-pair-label",
        "a sparse pair support label outside [0, L)",
        lambda _: chain.log_partition(_sparse(pair_previous=jnp.array([0, 2]))),
        ValueError,
        ["pair_previous", "[0, 2)"],
    ),
    (
        "sparse-pair-weights-shape",
        "pair weights whose T differs from unary's",
        lambda _: chain.log_partition(_sparse(pair_weights=jnp.zeros((2, T + 1, 2)))),
        ValueError,
        ["pair_weights", "T"],
    ),
    (
        "sparse-transitions-shape",
        "sparse transitions of the wrong shape",
        lambda _: chain.log_partition(_sparse(transitions=jnp.zeros((L, L + 1)))),
        ValueError,
        ["transitions", "[..., 2, 2]"],
    ),
    (
        "sparse-nan-inside",
        "NaN in sparse unary scores inside the lengths",
        lambda _: chain.log_partition(_sparse(unary=jnp.zeros((2, T, L)).at[1, 0, 1].set(NAN))),
        ValueError,
        ["unary", "NaN", "(1, 0, 1)"],
    ),
    # --- lossfns.lattices.constraints ---
    (
        "constraints-scheme",
        "an unknown tagging scheme",
        lambda _: constraints.allowed_transitions(["O"], "IOB3"),
        ValueError,
        ["scheme", "IOB2", "IOB3"],
    ),
    (
        "constraints-label",
        "a label outside the scheme",
        lambda _: constraints.allowed_transitions(["O", "E-PER"], "IOB2"),
        ValueError,
        ["labels", "'E-PER'", "IOB2"],
    ),
    (
        "label-scheme",
        "an unknown label scheme",
        lambda _: constraints.allowed_transitions(("O", "B-X"), "BIO"),
        ValueError,
        ["scheme", "IOB2", "'BIO'"],
    ),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)


# ---------------------------------------------------------------------------
# Inside jit: values are traced, so only the opt-in checkify mode sees them
# ---------------------------------------------------------------------------

_checked_log_partition = debug.checked(chain.log_partition, validate=debug.check_chain_inputs)
_checked_score = debug.checked(chain.score, validate=lambda p, y, n=None: debug.check_chain_inputs(p, n, y))
_FORBIDDEN = jnp.zeros((2, T, L, L)).at[:, :, 1, 0].set(-jnp.inf)

INSIDE_JIT_CASES = [
    (
        "nan-potentials",
        lambda: _checked_log_partition(_FORBIDDEN.at[0, 1, 1, 1].set(NAN), jnp.array([1, 3])),
        ["potentials", "NaN"],
    ),
    (
        "posinf-potentials",
        lambda: _checked_log_partition(_FORBIDDEN.at[1, 0, 0, 1].set(INF), None),
        ["potentials", "+inf"],
    ),
    ("nan-unary", lambda: _checked_log_partition(factored(unary=jnp.full((2, T, L), NAN)), None), ["unary", "NaN"]),
    ("length-above-T", lambda: _checked_log_partition(_FORBIDDEN, jnp.array([0, 4])), ["lengths", "[0, 3]", "4"]),
    ("length-negative", lambda: _checked_log_partition(_FORBIDDEN, jnp.array([-2, 1])), ["lengths", "-2"]),
    (
        "label-out-of-range",
        lambda: _checked_score(_FORBIDDEN, jnp.array([[0, 5, 0], [0, 0, 0]]), jnp.array([3, 3])),
        ["labels", "[0, 2)", "5"],
    ),
    ("nan-made-inside", lambda: debug.checked(lambda x: jnp.log(x) * 0.0)(jnp.array([-1.0])), ["nan", "log"]),
]


@pytest.mark.parametrize("case_id, call, words", INSIDE_JIT_CASES, ids=[c[0] for c in INSIDE_JIT_CASES])
def test_checked_mode_catches_bad_values_inside_jit(case_id, call, words):
    with pytest.raises(ValueError) as raised:  # noqa: PT011  (its words are checked below)
        call()
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_checked_mode_passes_valid_inputs_unchanged():
    lengths = jnp.array([0, 3])
    np.testing.assert_array_equal(_checked_log_partition(_FORBIDDEN, lengths), chain.log_partition(_FORBIDDEN, lengths))
    # Labels outside the length are never read, so -1 padding is fine there.
    labels = jnp.array([[0, 5, -1], [0, 1, 1]])
    np.testing.assert_array_equal(
        _checked_score(_FORBIDDEN, labels, jnp.array([1, 3])), chain.score(_FORBIDDEN, labels, jnp.array([1, 3]))
    )
    # No false NaN alarms from -inf structure, chains with no path, or derivatives.
    marginals = debug.checked(chain.marginals)(jnp.full((2, T, L, L), -jnp.inf), lengths)
    assert np.asarray(marginals).sum() == 0.0


def test_plain_jit_does_not_see_nan_values():
    """Why the debug mode exists: under plain jit the value check is skipped
    and a NaN potential gives a NaN log Z without any error saying where."""
    bad = _FORBIDDEN.at[0, 1, 1, 1].set(NAN)
    jax.block_until_ready(jax.jit(chain.log_partition)(bad, jnp.array([3, 3])))
    with pytest.raises(ValueError, match="potentials contains NaN"):
        _checked_log_partition(bad, jnp.array([3, 3]))


# ---------------------------------------------------------------------------
# Checked ids and lengths are the ones used
# ---------------------------------------------------------------------------


def test_lengths_and_labels_in_range_pass_the_int32_cast_unchanged():
    """The pre-cast check refuses only what would change: int64 values that
    fit in int32 run as before, with x64 off."""
    with jax.enable_x64(False):
        lengths, labels = np.array([1, 3], np.int64), np.array([[1, 0, 2**31 - 1], [0, 1, 1]], np.int64)
        np.testing.assert_array_equal(
            chain.score(GOOD(), labels, lengths), chain.score(GOOD(), labels.astype(np.int32), lengths.astype(np.int32))
        )
