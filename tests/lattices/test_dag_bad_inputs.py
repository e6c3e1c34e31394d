"""Bad input to lossfns.lattices.dag: each case raises the stated exception
type with a message naming the offending argument; padding and invalid
scores under jit.

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import semirings
from lossfns.lattices import dag
from tests.bad_inputs import GOOD, INF, NAN, assert_raises_a_named_error, case_ids


def _lattice():
    return dag.from_arcs([(0, 1, 0), (0, 1, 1), (1, 2, 0)], final=[2])


_ARCS = [(0, 1, 0), (0, 1, 1), (1, 2, 0)]


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    (
        "dag-cycle",
        "a cyclic lattice",
        lambda _: dag.from_arcs([(0, 1, 0), (1, 2, 0), (2, 1, 0)], final=[2]),
        ValueError,
        ["arc 2", "topological order", "cycle"],
    ),
    (
        "dag-order",
        "states not numbered in topological order",
        lambda _: dag.from_arcs([(0, 2, 0), (2, 1, 0)], final=[1]),
        ValueError,
        ["arc 1", "(2 -> 1)"],
    ),
    (
        "dag-missing-state",
        "an arc to a missing state",
        lambda _: dag.from_arcs([(0, 1, 0), (1, 7, 0)], final=[1], num_states=2),
        ValueError,
        ["arc 1", "7"],
    ),
    (
        "dag-arcs-shape",
        "arcs that are not triples",
        lambda _: dag.from_arcs([(0, 1)], final=[1]),
        ValueError,
        ["arcs", "[A, 3]"],
    ),
    (
        "dag-final",
        "a final state that does not exist",
        lambda _: dag.from_arcs([(0, 1, 0)], final=[3], num_states=2),
        ValueError,
        ["final", "[3]"],
    ),
    (
        "dag-arc-scores-shape",
        "arc_scores of the wrong length",
        lambda _: dag.log_partition(_lattice(), jnp.zeros(4)),
        ValueError,
        ["arc_scores", "[..., 3]"],
    ),
    (
        "dag-arc-scores-nan",
        "NaN in arc_scores",
        lambda _: dag.viterbi(_lattice(), jnp.array([0.0, NAN, 0.0])),
        ValueError,
        ["arc_scores", "NaN"],
    ),
    (
        "dag-float-ids",
        "a fractional state id 1.7 in an arc",
        lambda _: dag.from_arcs([(0, 1.7, 0), (0, 1, 1), (1, 2, 0)], final=[2]),
        TypeError,
        ["arcs", "integer", "1.7", "(0, 1)"],
    ),
    (
        "dag-float-final",
        "a fractional final state id",
        lambda _: dag.from_arcs(_ARCS, final=[2.5]),
        TypeError,
        ["final", "state ids", "2.5"],
    ),
    (
        "dag-final-mask",
        "a boolean final mask not of length num_states",
        lambda _: dag.from_arcs(_ARCS, final=[False, True]),
        ValueError,
        ["final", "boolean mask", "[3]", "(2,)"],
    ),
    (
        "dag-num-states-float",
        "a float num_states",
        lambda _: dag.from_arcs(_ARCS, final=[2], num_states=3.0),
        TypeError,
        ["num_states", "int", "3.0"],
    ),
    (
        "dag-float-symbols",
        "a fractional symbol in from_string",
        lambda _: dag.from_string([1, 1.7]),
        TypeError,
        ["symbols", "integer", "1.7"],
    ),
    (
        "dag-traced-arcs",
        "arcs traced inside jit",
        lambda _: jax.jit(lambda a: dag.from_arcs(a, final=[2]))(jnp.array(_ARCS)),
        TypeError,
        ["arcs", "traced", "outside the traced function"],
    ),
    (
        "dag-lattice-type",
        "potentials instead of a lattice",
        lambda _: dag.log_partition(GOOD(), jnp.zeros(3)),
        TypeError,
        ["lattice", "dag.Lattice"],
    ),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)


# ---------------------------------------------------------------------------
# Boolean final masks, and jit against eager
# ---------------------------------------------------------------------------


def test_a_boolean_final_mask_is_a_mask_not_state_ids():
    by_mask = dag.from_arcs(_ARCS, final=[False, False, True])
    by_ids = dag.from_arcs(_ARCS, final=[2])
    np.testing.assert_array_equal(by_mask.final, [False, False, True])
    for got, expected in zip(by_mask, by_ids):
        np.testing.assert_array_equal(got, expected)
    # a mask may mark states no arc names (num_states from its length)
    assert dag.from_arcs(_ARCS, final=np.array([False, False, True, True])).num_states == 4


def _padded_batch():
    """Two lattices padded to 6 arcs; padding scores are NaN and +inf (ignored)."""
    sizes = dict(num_states=3, num_arcs=6, num_levels=2, width=1, in_degree=2)
    lattices = dag.stack(
        [
            dag.pad(dag.from_arcs([(0, 1, 0), (0, 1, 1), (1, 2, 0), (0, 2, 3)], final=[2]), **sizes),
            dag.pad(dag.from_arcs([(0, 1, 0), (1, 2, 1)], final=[1, 2]), **sizes),
        ]
    )
    assert lattices.arc_valid.tolist() == [[True] * 4 + [False] * 2, [True] * 2 + [False] * 4]
    scores = jnp.array([[0.1, 0.2, -jnp.inf, -0.5, NAN, INF], [0.3, 1.5, NAN, INF, NAN, -jnp.inf]])
    return lattices, scores


@pytest.mark.float64  # a 1e-12 oracle
@pytest.mark.parametrize("semiring", [semirings.Log, semirings.Real], ids=["log", "real"])
def test_jit_and_eager_give_the_same_finite_log_z_and_marginals(semiring):
    lattices, scores = _padded_batch()
    log_z = lambda lat, s: dag.log_partition(lat, s, semiring=semiring)
    marginals = lambda lat, s: dag.arc_marginals(lat, s, semiring=semiring)
    eager_z, eager_m = log_z(lattices, scores), marginals(lattices, scores)
    jit_z, jit_m = jax.jit(log_z)(lattices, scores), jax.jit(marginals)(lattices, scores)
    assert np.isfinite(eager_z).all() and np.isfinite(eager_m).all()
    np.testing.assert_allclose(jit_z, eager_z, rtol=1e-12)
    np.testing.assert_allclose(jit_m, eager_m, rtol=1e-12, atol=1e-15)
    # By hand: lattice 0's only allowed path is arc 3 (arcs 0 and 1 lead to the forbidden arc 2);
    # lattice 1 accepts arc 0 (0.3) and arcs 0, 1 (1.8).
    np.testing.assert_allclose(eager_z, [-0.5, np.logaddexp(0.3, 1.8)], rtol=1e-12)
    np.testing.assert_allclose(eager_m[0], [0, 0, 0, 1, 0, 0], atol=1e-15)


def test_invalid_scores_under_jit_give_nan_marginals_not_zeros():
    """+inf or NaN on a real arc: eager refuses it; under jit (no check) the
    result must not look like a lattice without paths (NaN log Z with zero
    marginals): every derivative is NaN too."""
    lattice = dag.from_arcs([(0, 1, 0), (0, 1, 1), (1, 2, 0), (0, 2, 3)], final=[2])
    for bad in (INF, NAN):
        scores = jnp.array([bad, 0.2, 0.3, -0.5])
        with pytest.raises(ValueError, match="arc_scores contains"):
            dag.log_partition(lattice, scores)
        for semiring in (semirings.Log, semirings.Real):
            assert np.isnan(jax.jit(lambda s: dag.log_partition(lattice, s, semiring=semiring))(scores))
            assert np.isnan(jax.jit(lambda s: dag.arc_marginals(lattice, s, semiring=semiring))(scores)).all()
