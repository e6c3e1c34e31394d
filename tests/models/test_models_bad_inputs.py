"""Bad input to lossfns.models, lossfns.hmm and lossfns.nn.CRF: each case
raises the stated exception type with a message naming the offending
argument; under plain jit, what no check can see gives NaN in the value and
the gradient of its sequence only.

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import hmm
from lossfns.models import LinearChainModel
from lossfns.nn import CRF, possible_tags
from tests.bad_inputs import (
    CRF_MODEL,
    EMISSIONS,
    NAN,
    TAGS,
    L,
    T,
    assert_nan_in_sequence_0_only,
    assert_raises_a_named_error,
    case_ids,
    under_jit,
)

_HMM = hmm.initial_params(2, 4, order=1, key=jax.random.PRNGKey(0), noise=0.5)


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    # --- lossfns.models ---
    (
        "model-values-shape",
        "unigram_values of another shape than unigram_ids",
        lambda _: LinearChainModel.zeros(4, 2).unary(np.zeros((1, 3, 2), np.int32), np.ones((1, 3, 1))),
        ValueError,
        ["unigram_values", "(1, 3, 2)"],
    ),
    (
        "model-ids-float",
        "float feature ids for a model",
        lambda _: LinearChainModel.zeros(4, 2)(np.array([[[0.0, 1.0]]])),
        TypeError,
        ["unigram_ids", "integer", "float"],
    ),
    (
        "model-pair-mask-shape",
        "a pair mask of the wrong shape",
        lambda _: LinearChainModel.zeros(4, 2, 3).with_pair_mask(np.ones((3, 2, 3), bool)),
        ValueError,
        ["pair_mask", "(3, 2, 2)", "(3, 2, 3)"],
    ),
    # --- lossfns.hmm ---
    (
        "hmm-word-range",
        "a word id outside the HMM's vocabulary",
        lambda _: hmm.log_likelihood(_HMM, [[0, 5, 1]]),
        ValueError,
        ["words", "[0, 4)", "5", "(0, 1)"],
    ),
    (
        "hmm-word-float",
        "float word ids",
        lambda _: hmm.log_likelihood(_HMM, [[0.5, 1.0]]),
        TypeError,
        ["words", "integer", "0.5"],
    ),
    (
        "hmm-noise-without-key",
        "a noisy HMM start without a PRNG key",
        lambda _: hmm.initial_params(2, 4, noise=0.5),
        ValueError,
        ["key", "noise"],
    ),
    # --- lossfns.nn.CRF ---
    ("crf-num-tags", "a CRF with 0 tags", lambda _: CRF(0, key=jax.random.key(0)), ValueError, ["num_tags", ">= 1"]),
    (
        "crf-emissions-tags",
        "emissions whose last axis is not the CRF's number of tags",
        lambda _: CRF_MODEL.log_partition(jnp.zeros((2, T, L + 1))),
        ValueError,
        ["emissions", f"[..., T, {L}]"],
    ),
    (
        "crf-emissions-rank",
        "emissions of rank 1",
        lambda _: CRF_MODEL.decode(jnp.zeros(L)),
        ValueError,
        ["emissions", "[..., T, L]"],
    ),
    (
        "crf-emissions-nan",
        "NaN in emissions inside the mask",
        lambda _: CRF_MODEL.log_partition(jnp.zeros((2, T, L)).at[1, 0, 1].set(NAN)),
        ValueError,
        ["emissions", "NaN", "(1, 0, 1)"],
    ),
    (
        "crf-mask-holes",
        "a mask that is not a prefix mask (a hole inside a sequence)",
        lambda _: CRF_MODEL.log_likelihood(
            jnp.zeros((2, T, L)), jnp.zeros((2, T), int), jnp.array([[True, False, True]] * 2)
        ),
        ValueError,
        ["mask", "prefix", "(0, 2)"],
    ),
    (
        "crf-mask-int",
        "an integer mask",
        lambda _: CRF_MODEL.decode(jnp.zeros((2, T, L)), jnp.ones((2, T), jnp.int32)),
        TypeError,
        ["mask", "bool"],
    ),
    (
        "crf-mask-shape",
        "a mask not of shape [..., T]",
        lambda _: CRF_MODEL.decode(jnp.zeros((2, T, L)), jnp.ones((2, T + 1), bool)),
        ValueError,
        ["mask", "(2, 3)"],
    ),
    (
        "crf-mask-and-lengths",
        "both a mask and lengths",
        lambda _: CRF_MODEL.entropy(jnp.zeros((2, T, L)), jnp.ones((2, T), bool), lengths=jnp.array([1, 2])),
        ValueError,
        ["mask", "lengths"],
    ),
    (
        "crf-tags-range",
        "a tag >= L inside the mask",
        lambda _: CRF_MODEL.log_likelihood(jnp.zeros((2, T, L)), jnp.array([[0, 1, 2], [0, 0, 0]])),
        ValueError,
        ["tags", "[0, 2)"],
    ),
    (
        "crf-kbest-k",
        "k = 0 best sequences",
        lambda _: CRF_MODEL.kbest(jnp.zeros((2, T, L)), 0),
        ValueError,
        ["k", ">= 1"],
    ),
    (
        "crf-allowed-shape",
        "an allowed-transition mask of the wrong shape",
        lambda _: CRF(L, key=jax.random.key(0), allowed=jnp.ones((L, L + 1), bool)),
        ValueError,
        ["allowed.transitions", "(2, 2)"],
    ),
    (
        "crf-parameters-inf",
        "a -inf transition given as a parameter (forbid with allowed=)",
        lambda _: CRF.from_parameters(jnp.full((L, L), -jnp.inf), jnp.zeros(L), jnp.zeros(L)),
        ValueError,
        ["transitions", "finite", "allowed"],
    ),
    (
        "crf-cost-diagonal",
        "a softmax-margin cost matrix with a non-zero diagonal",
        lambda _: CRF_MODEL.softmax_margin_loss(jnp.zeros((2, T, L)), jnp.zeros((2, T), int), cost=jnp.ones((L, L))),
        ValueError,
        ["cost", "diagonal"],
    ),
    (
        "crf-possible-empty",
        "partial labels allowing no tag at a position inside the mask",
        lambda _: CRF_MODEL.partial_log_likelihood(jnp.zeros((2, T, L)), jnp.ones((2, T, L), bool).at[0, 1].set(False)),
        ValueError,
        ["possible", "at least one", "(0, 1)"],
    ),
    (
        "crf-possible-tags-range",
        "partial tags below -1",
        lambda _: possible_tags(jnp.array([[0, -2, 1]]), L),
        ValueError,
        ["tags", "[-1, 2)", "-2"],
    ),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)


# (id, description of the bad input inside sequence 0's length, call -> (values, gradients))
UNDER_JIT_CASES = [
    (
        "crf-tag-above-range",
        "nn.CRF.log_likelihood with a tag >= L",
        lambda: under_jit(CRF_MODEL.log_likelihood, tags=TAGS.at[0, 1].set(L)),
    ),
    (
        "crf-tag-negative",
        "nn.CRF.log_likelihood with a tag -1",
        lambda: under_jit(CRF_MODEL.log_likelihood, tags=TAGS.at[0, 1].set(-1)),
    ),
    (
        "crf-nan-emission-gold",
        "nn.CRF.log_likelihood with a NaN emission of the gold tag",
        lambda: under_jit(CRF_MODEL.log_likelihood, emissions=EMISSIONS.at[0, 1, 1].set(NAN)),
    ),
    (
        "crf-nan-emission-other",
        "nn.CRF.log_likelihood with a NaN emission of another tag",
        lambda: under_jit(CRF_MODEL.log_likelihood, emissions=EMISSIONS.at[0, 1, 0].set(NAN)),
    ),
    (
        "crf-softmax-margin-tag",
        "nn.CRF.softmax_margin_loss with a tag >= L",
        lambda: under_jit(CRF_MODEL.softmax_margin_loss, tags=TAGS.at[0, 2].set(L + 3)),
    ),
]


@pytest.mark.parametrize("case_id, description, call", UNDER_JIT_CASES, ids=case_ids(UNDER_JIT_CASES))
def test_bad_values_under_jit_give_nan_values_and_gradients(case_id, description, call):
    assert_nan_in_sequence_0_only(description, call)


def test_a_dense_table_that_cannot_fit_is_refused_before_allocation():
    from lossfns.models import LinearChainModel

    with pytest.raises(MemoryError, match="emission weights W of shape"):
        LinearChainModel.zeros(10**12, 45)
