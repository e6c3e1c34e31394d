"""A generative HMM tagger (first or second order) trained by EM with add-lambda
smoothing (Merialdo 1994), the classical baseline of contrastive estimation.

The HMM is a chain model: its log-probabilities become `FactoredPotentials`, `log
P(x)` is `lossfns.lattices.chain`'s log-partition, and the E-step's expected counts
are its gradient with respect to the log-parameters. Tag id `K = num_tags` is the
sentence boundary; a second-order HMM runs as a first-order chain over tag pairs.
There is no end-of-sentence probability: the model is `P(x, y | m)` for the
observed length m.
Design notes: docs/internals.md.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .lattices import chain
from .lattices.chain import FactoredPotentials
from .validation import as_integer_array, as_lengths, concrete


class HMMParams(NamedTuple):
    """Log-probabilities (or, from `expected_counts`, counts of the same shape).

    log_transition: `[K + 1, K]` (first order: `log P(t | previous)`, row K
    at the start) or `[K + 1, K + 1, K]` (second order: `log P(t | u, v)`);
    log_emission: `[K, V]`, `log P(word | tag)`.
    """

    log_transition: jax.Array
    log_emission: jax.Array

    @property
    def order(self) -> int:
        return self.log_transition.ndim - 1


def _check(params: HMMParams):
    K = params.log_emission.shape[0]
    if params.log_transition.shape not in ((K + 1, K), (K + 1, K + 1, K)):
        raise ValueError(
            f"log_transition must have shape [K + 1, K] or [K + 1, K + 1, K] with K = {K} "
            f"(from log_emission [K, V]), got {params.log_transition.shape}"
        )


def potentials(params: HMMParams, words) -> FactoredPotentials:
    """The chain potentials of `words [..., T]` (ids; padding may be any id
    in range or -1): `log P(x, y)` is the score of the state sequence."""
    _check(params)
    K = params.log_emission.shape[0]
    words = jnp.asarray(words)
    emit = jnp.moveaxis(params.log_emission[:, jnp.maximum(words, 0)], 0, -1)  # [..., T, K]
    if params.order == 1:
        return FactoredPotentials(emit, params.log_transition[:K], params.log_transition[K])
    state = jnp.arange((K + 1) * K)
    previous, current = state // K, state % K
    chained = previous[None, :] == current[:, None]
    transitions = jnp.where(
        chained, params.log_transition[previous[:, None], current[:, None], current[None, :]], -jnp.inf
    )
    start = jnp.where(previous == K, params.log_transition[K, K, current], -jnp.inf)
    return FactoredPotentials(emit[..., current], transitions, start)


def _prepare(params, words, lengths):
    """Validate outside `jit` (shapes and concrete values); return `(words, lengths)`."""
    _check(params)
    words = as_integer_array("words", words, "an integer array [..., T] of word ids")
    if words.ndim < 1:
        raise ValueError(f"words must be an integer array [..., T], got shape {words.shape}")
    lengths = as_lengths(lengths, words.shape[:-1], words.shape[-1])
    V = params.log_emission.shape[1]
    values, sizes = concrete(words), concrete(lengths)
    if values is not None and sizes is not None and values.size:
        inside = np.arange(values.shape[-1]) < sizes[..., None]
        bad = inside & ((values < 0) | (values >= V))
        if bad.any():  # a gather would clamp them silently
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"words must lie in [0, {V}) (the vocabulary of log_emission [K, V]) inside each "
                f"length, got {int(values[index])} at index {index}"
            )
    return words, lengths


def log_likelihood(params: HMMParams, words, lengths=None):
    """`log P(x)` per sentence of `words [..., T]`, `[...]` (forward algorithm)."""
    words, lengths = _prepare(params, words, lengths)
    return _log_likelihood(params, words, lengths)


@jax.jit
def _log_likelihood(params, words, lengths):
    return chain.log_partition(potentials(params, words), lengths)


def expected_counts(params: HMMParams, words, lengths=None) -> HMMParams:
    """E-step: expected transition and emission counts summed over the batch,
    as an `HMMParams` of counts (the gradient of the total log-likelihood)."""
    words, lengths = _prepare(params, words, lengths)
    return _total_and_counts(params, words, lengths)[1]


@jax.jit
def _total_and_counts(params, words, lengths):
    return jax.value_and_grad(lambda p: jnp.sum(_log_likelihood(p, words, lengths)))(params)


def supervised_counts(
    words, tags, lengths, num_tags: int, vocabulary_size: int, *, order: int = 1, dtype=jnp.float32
) -> HMMParams:
    """Transition and emission counts of tagged sentences `tags [..., T]`
    (the gradient of the score of the given state sequences)."""
    K = num_tags
    zeros = HMMParams(jnp.zeros((K + 1,) * order + (K,), dtype), jnp.zeros((K, vocabulary_size), dtype))
    words, lengths = _prepare(zeros, words, lengths)
    return _supervised_counts(zeros, words, jnp.asarray(tags), lengths)


@jax.jit
def _supervised_counts(zeros, words, tags, lengths):
    K, states = zeros.log_emission.shape[0], tags
    if zeros.order == 2:
        previous = jnp.concatenate([jnp.full(tags.shape[:-1] + (1,), K, tags.dtype), tags[..., :-1]], axis=-1)
        states = previous * K + tags
    inside = jnp.arange(tags.shape[-1]) < lengths[..., None]
    states = jnp.where(inside, states, -1)
    return jax.grad(lambda p: jnp.sum(chain.score(potentials(p, words), states, lengths)))(zeros)


def _normalize(counts, allowed):
    """Rows of `counts` (last axis) to log-probabilities over the allowed
    entries; a row with no mass becomes uniform over its allowed entries."""
    counts = jnp.where(allowed, counts, 0.0)
    total = jnp.sum(counts, axis=-1, keepdims=True)
    uniform = allowed / jnp.maximum(jnp.sum(allowed, axis=-1, keepdims=True), 1)
    probability = jnp.where(total > 0, counts / jnp.where(total > 0, total, 1.0), uniform)
    return jnp.where(probability > 0, jnp.log(jnp.where(probability > 0, probability, 1.0)), -jnp.inf)


def m_step(counts: HMMParams, smoothing: float = 0.0, tag_dictionary=None) -> HMMParams:
    """M-step with add-lambda smoothing: `P = (count + lambda) / sum(count + lambda)`
    per conditioning context; emissions outside `tag_dictionary [V, K]` stay 0."""
    allowed = (
        jnp.ones(counts.log_emission.shape, bool) if tag_dictionary is None else jnp.asarray(tag_dictionary, bool).T
    )
    if allowed.shape != counts.log_emission.shape:
        raise ValueError(
            f"tag_dictionary must have shape [V, K] = {counts.log_emission.shape[::-1]}, got {allowed.shape[::-1]}"
        )
    return _m_step(counts, smoothing, allowed)


@jax.jit
def _m_step(counts, smoothing, allowed):
    return HMMParams(
        _normalize(counts.log_transition + smoothing, jnp.ones(counts.log_transition.shape, bool)),
        _normalize(counts.log_emission + smoothing, allowed),
    )


def initial_params(
    num_tags: int,
    vocabulary_size: int,
    *,
    order: int = 1,
    tag_dictionary=None,
    key=None,
    noise: float = 0.0,
    dtype=jnp.float32,
) -> HMMParams:
    """Uniform transitions and, per tag, uniform emissions over the words the
    dictionary allows (Merialdo's start); `noise > 0` with a `key` perturbs
    the counts to break the symmetry of a dictionary-free start."""
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order!r}")
    K = num_tags
    counts = HMMParams(jnp.ones((K + 1,) * order + (K,), dtype), jnp.ones((K, vocabulary_size), dtype))
    if noise:
        if key is None:
            raise ValueError("key: noise > 0 perturbs the start with random numbers; pass a PRNG key (jax.random.key)")
        keys = jax.random.split(key, 2)
        counts = HMMParams(*(c * jnp.exp(noise * jax.random.normal(k, c.shape, dtype)) for c, k in zip(counts, keys)))
    return m_step(counts, 0.0, tag_dictionary)


def em(
    params: HMMParams, words, lengths=None, *, iterations: int = 10, smoothing: float = 0.0, tag_dictionary=None
) -> tuple[HMMParams, list[float]]:
    """Run EM; returns the final parameters and the total log-likelihood
    before each iteration's M-step (non-decreasing when `smoothing = 0`)."""
    words, lengths = _prepare(params, words, lengths)
    history = []
    for _ in range(iterations):
        total, counts = _total_and_counts(params, words, lengths)
        params = m_step(counts, smoothing, tag_dictionary)
        history.append(float(total))
    return params, history


def decode(params: HMMParams, words, lengths=None):
    """Most probable tag sequences `[..., T]` (Viterbi), -1 past each length."""
    words, lengths = _prepare(params, words, lengths)
    return _decode(params, words, lengths)


@jax.jit
def _decode(params, words, lengths):
    _, states = chain.viterbi(potentials(params, words), lengths)
    return jnp.where(states >= 0, states % params.log_emission.shape[0], -1)
