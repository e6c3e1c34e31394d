"""Bad input to lossfns.losses: each case raises the stated exception type
with a message naming the offending argument; under plain jit, what no check
can see gives NaN in the value and the gradient of its sequence only.

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import losses
from lossfns.lattices import chain
from lossfns.lattices.chain import FactoredPotentials
from tests.bad_inputs import (
    CRF_MODEL,
    EMISSIONS,
    GOOD,
    NAN,
    TAGS,
    WIDE,
    L,
    T,
    assert_nan_in_sequence_0_only,
    assert_raises_a_named_error,
    case_ids,
    under_jit,
    x32,
)

_CHAIN_CRF = lambda e: FactoredPotentials(e, CRF_MODEL.transitions)


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    (
        "loss-labels",
        "a gold label >= L",
        lambda _: losses.sequence_log_loss(GOOD(), jnp.full((2, T), 5)),
        ValueError,
        ["labels", "5"],
    ),
    (
        "loss-lengths",
        "loss lengths above T",
        lambda _: losses.structured_hinge_loss(GOOD(), jnp.zeros((2, T), int), jnp.array([4, 1])),
        ValueError,
        ["lengths", "4"],
    ),
    (
        "reranking-reference",
        "a reference outside the candidate list",
        lambda _: losses.reranking_log_loss(jnp.zeros((2, 3)), jnp.array([0, 3])),
        ValueError,
        ["reference", "[0, 3)"],
    ),
    (
        "reranking-absent",
        "a reference marked absent by mask",
        lambda _: losses.reranking_log_loss(jnp.zeros((1, 3)), jnp.array([1]), jnp.array([[True, False, True]])),
        ValueError,
        ["reference", "mask"],
    ),
    (
        "reranking-empty",
        "an empty candidate list (N = 0)",
        lambda _: losses.reranking_log_loss(jnp.zeros((2, 0)), jnp.array([0, 0])),
        ValueError,
        ["scores", "candidate"],
    ),
    (
        "hamming-shape",
        "predicted and gold of different shapes",
        lambda _: losses.hamming_loss(jnp.zeros((2, 3), int), jnp.zeros((2, 4), int)),
        ValueError,
        ["predicted", "labels"],
    ),
    (
        "l1-mask-not-bool",
        "a penalty mask of numbers, not bools",
        lambda _: losses.l1({"a": jnp.ones(2)}, 0.1, mask={"a": 0.5}),
        TypeError,
        ["mask", "bools", "0.5"],
    ),
    # --- label and id arrays checked before any cast ---
    (
        "hamming-float",
        "float predicted labels for hamming_loss",
        lambda _: losses.hamming_loss(np.array([[0.0, 1.5]]), np.array([[0, 1]])),
        TypeError,
        ["predicted", "integer"],
    ),
    (
        "hamming-wide",
        "an int64 gold label int32 would wrap",
        lambda _: x32(lambda: losses.hamming_loss(np.array([[0, 1]]), np.array([[WIDE, 1]]))),
        ValueError,
        ["labels", "int32", str(WIDE)],
    ),
    (
        "rerank-reference-wide",
        "an int64 reranking reference int32 would wrap",
        lambda _: x32(lambda: losses.reranking_exp_loss(jnp.zeros((2, 3)), np.array([WIDE, 0]))),
        ValueError,
        ["reference", str(WIDE)],
    ),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)


# (id, description of the bad input inside sequence 0's length, call -> (values, gradients))
UNDER_JIT_CASES = [
    (
        "sequence-log-loss-label",
        "losses.sequence_log_loss with a label >= L",
        lambda: under_jit(lambda e, t: losses.sequence_log_loss(_CHAIN_CRF(e), t), tags=TAGS.at[0, 0].set(L)),
    ),
    (
        "sequence-exp-loss-nan",
        "losses.sequence_exp_loss with a NaN score",
        lambda: under_jit(
            lambda e, t: losses.sequence_exp_loss(_CHAIN_CRF(e), t), emissions=EMISSIONS.at[0, 2, 1].set(NAN)
        ),
    ),
    (
        "pointwise-log-loss-label",
        "losses.pointwise_log_loss with a label >= L",
        lambda: under_jit(lambda e, t: losses.pointwise_log_loss(_CHAIN_CRF(e), t), tags=TAGS.at[0, 1].set(L)),
    ),
    (
        "pointwise-log-loss-nan",
        "losses.pointwise_log_loss with a NaN score (was +inf with a zero gradient)",
        lambda: under_jit(
            lambda e, t: losses.pointwise_log_loss(_CHAIN_CRF(e), t), emissions=EMISSIONS.at[0, 0, 1].set(NAN)
        ),
    ),
    (
        "hinge-label",
        "losses.structured_hinge_loss with a label >= L (dense potentials)",
        lambda: under_jit(
            lambda e, t: losses.structured_hinge_loss(chain.materialize(_CHAIN_CRF(e)), t), tags=TAGS.at[0, 1].set(L)
        ),
    ),
]


@pytest.mark.parametrize("case_id, description, call", UNDER_JIT_CASES, ids=case_ids(UNDER_JIT_CASES))
def test_bad_values_under_jit_give_nan_values_and_gradients(case_id, description, call):
    assert_nan_in_sequence_0_only(description, call)
