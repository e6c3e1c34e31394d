"""Brute-force oracles and a gradient checker, for the test suite and for
users who want to check their own composed objectives the same way.

Every oracle enumerates all `L ** T` label sequences of a small chain in
numpy float64, independently of the algorithms in `lossfns.lattices`; keep
`L ** T` below about 10^5.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads

from .lattices import chain
from .lattices.chain import FactoredPotentials


def _per_position(potentials) -> np.ndarray:
    return np.asarray(chain.as_form(potentials).dense_scores(), dtype=np.float64)


def enumerate_sequences(potentials, length: int):
    """All label sequences of one chain and their scores.

    Args:
      potentials: `[T, L, L]` or an unbatched `FactoredPotentials`.
      length: number of positions used (`0 <= length <= T`).

    Returns:
      `(labels [L ** length, length] int, scores [L ** length] float64)`.
    """
    psi = _per_position(potentials)
    L = psi.shape[-1]
    labels = np.array(list(itertools.product(range(L), repeat=length)), dtype=np.int64).reshape(L**length, length)
    previous = np.concatenate([np.zeros((labels.shape[0], 1), np.int64), labels[:, :-1]], axis=1)
    with np.errstate(invalid="ignore"):
        scores = psi[np.arange(length)[None, :], previous, labels].sum(axis=1)
    return labels, scores


def _batched(fn, potentials, lengths, *, out_shape_fn):
    psi = _per_position(potentials)
    batch_shape = psi.shape[:-3]
    lengths = np.full(batch_shape, psi.shape[-3]) if lengths is None else np.asarray(lengths)
    out = None
    for index in np.ndindex(*batch_shape):
        value = np.asarray(fn(psi[index], int(lengths[index])))
        if out is None:
            out = np.zeros(batch_shape + value.shape, value.dtype)
        out[index] = value
    if out is None:  # empty batch
        out = np.zeros(batch_shape + out_shape_fn(psi.shape[-3], psi.shape[-1]))
    return out


def _log_sum_exp(scores):
    finite = scores[np.isfinite(scores)]
    if finite.size == 0:
        return -np.inf
    peak = finite.max()
    return peak + math.log(np.exp(finite - peak).sum())


def log_partition(potentials, lengths=None) -> np.ndarray:
    """`log Z` per chain by enumeration, `[...]`."""
    return _batched(
        lambda p, n: _log_sum_exp(enumerate_sequences(p, n)[1]), potentials, lengths, out_shape_fn=lambda T, L: ()
    )


def _probabilities(p, n):
    labels, scores = enumerate_sequences(p, n)
    log_z = _log_sum_exp(scores)
    probs = np.where(np.isfinite(scores), np.exp(scores - log_z), 0.0) if np.isfinite(log_z) else np.zeros_like(scores)
    return labels, scores, probs


def marginals(potentials, lengths=None) -> np.ndarray:
    """Edge marginals `[..., T, L, L]` (row 0 at t = 0) by enumeration."""

    def one(p, n):
        T, L = p.shape[0], p.shape[-1]
        out = np.zeros((T, L, L))
        labels, _, probs = _probabilities(p, n)
        for y, prob in zip(labels, probs):
            previous = 0
            for t, label in enumerate(y):
                out[t, previous, label] += prob
                previous = label
        return out

    return _batched(one, potentials, lengths, out_shape_fn=lambda T, L: (T, L, L))


def node_marginals(potentials, lengths=None) -> np.ndarray:
    """`P(y_t = j)` `[..., T, L]` by enumeration."""
    return marginals(potentials, lengths).sum(axis=-2)


def viterbi(potentials, lengths=None):
    """`(best score [...], labels [..., T])` by enumeration, -1 past the length.

    Ties go to the lexicographically smallest sequence... of the enumeration
    order; compare scores, not labels, when ties are possible.
    """

    def one(p, n):
        labels, scores = enumerate_sequences(p, n)
        out = -np.ones(p.shape[0], np.int64)
        best = int(np.argmax(scores))
        if np.isfinite(scores[best]):
            out[:n] = labels[best]
        return np.concatenate([[scores[best]], out])

    both = _batched(one, potentials, lengths, out_shape_fn=lambda T, L: (T + 1,))
    return both[..., 0], both[..., 1:].astype(np.int64)


def kbest_scores(potentials, lengths=None, k: int = 1) -> np.ndarray:
    """The k best sequence scores `[..., k]`, -inf where fewer exist."""

    def one(p, n):
        scores = np.sort(enumerate_sequences(p, n)[1])[::-1][:k]
        return np.concatenate([scores, np.full(k - scores.size, -np.inf)])

    return _batched(one, potentials, lengths, out_shape_fn=lambda T, L: (k,))


def entropy(potentials, lengths=None) -> np.ndarray:
    """Entropy of the sequence distribution `[...]` by enumeration."""

    def one(p, n):
        _, _, probs = _probabilities(p, n)
        positive = probs[probs > 0]
        return -(positive * np.log(positive)).sum()

    return _batched(one, potentials, lengths, out_shape_fn=lambda T, L: ())


def count_paths(potentials, lengths=None) -> np.ndarray:
    """Number of sequences with a finite score `[...]`."""
    return _batched(
        lambda p, n: np.isfinite(enumerate_sequences(p, n)[1]).sum().astype(np.float64),
        potentials,
        lengths,
        out_shape_fn=lambda T, L: (),
    )


def sequence_score(potentials, labels, lengths=None) -> np.ndarray:
    """Score of given sequences `[...]` by direct summation."""
    psi = _per_position(potentials)
    labels = np.asarray(labels)
    lengths = np.full(psi.shape[:-3], psi.shape[-3]) if lengths is None else np.asarray(lengths)
    out = np.zeros(psi.shape[:-3])
    for index in np.ndindex(*psi.shape[:-3]):
        previous, total = 0, 0.0
        for t in range(int(lengths[index])):
            label = int(labels[index][t])
            total += psi[index][t, previous, label]
            previous = label
        out[index] = total
    return out


def reference_row_log_partition(potentials, starts=None, lengths=None) -> jax.Array:
    """`log Z` per row of back-to-back chains (`chain.row_log_partition`'s
    convention; `starts=None`: one chain per row), `[...]`, by the plain
    log-space forward recursion over per-position scores in JAX.

    An oracle for sizes enumeration cannot reach (T = 10,000, 333 labels):
    independent of `lossfns.lattices`' kernels, exact with `-inf`, and
    differentiable by autodiff (`semirings.logsumexp` keeps it NaN-free), so
    its derivatives check the kernels' closed-form ones. Slow: L^2
    exponentials a step.
    """
    from .semirings import logsumexp  # the algebra, not the algorithms under test

    if isinstance(potentials, FactoredPotentials):
        unary = jnp.asarray(potentials.unary)
        L = unary.shape[-1]
        start = jnp.zeros((L,), unary.dtype) if potentials.start is None else jnp.asarray(potentials.start)
        edges = jnp.asarray(potentials.transitions)[..., None, :, :] + unary[..., :, None, :]
        first = start[..., None, :] + unary  # [..., T, L]
    else:
        edges = jnp.asarray(potentials)
        first = edges[..., :, 0, :]
    batch_shape, T = edges.shape[:-3], edges.shape[-3]
    starts = jnp.zeros(batch_shape + (T,), bool) if starts is None else jnp.asarray(starts)
    starts = jnp.broadcast_to(starts, batch_shape + (T,))
    lengths = jnp.full(batch_shape, T) if lengths is None else jnp.broadcast_to(jnp.asarray(lengths), batch_shape)
    if T == 0:
        return jnp.zeros(batch_shape, edges.dtype)

    def one(edges, first, starts, length):
        valid = jnp.arange(T) < length
        starts = (starts | (jnp.arange(T) == 0)) & valid
        ends = valid & jnp.concatenate([starts[1:], jnp.ones((1,), bool)]) | (jnp.arange(T) == length - 1)

        def step(alpha, inputs):
            edges_t, first_t, start_t, valid_t, end_t = inputs
            safe = jnp.where(valid_t, edges_t, 0.0)
            new = jnp.where(start_t, jnp.where(valid_t, first_t, 0.0), logsumexp(alpha[:, None] + safe, 0))
            alpha = jnp.where(valid_t, new, alpha)
            return alpha, jnp.where(end_t & valid_t, logsumexp(alpha, 0), 0.0)

        _, totals = jax.lax.scan(step, jnp.zeros(edges.shape[-1], edges.dtype), (edges, first, starts, valid, ends))
        return jnp.sum(totals)

    flat = lambda x, core: x.reshape((-1,) + x.shape[x.ndim - core :])
    out = jax.vmap(one)(
        flat(jnp.broadcast_to(edges, batch_shape + edges.shape[-3:]), 3),
        flat(jnp.broadcast_to(first, batch_shape + first.shape[-2:]), 2),
        flat(starts, 1),
        lengths.reshape(-1),
    )
    return out.reshape(batch_shape)


def check_gradients(
    fn, args, order: int = 2, modes=("fwd", "rev"), eps: float = 1e-4, atol: float = 1e-5, rtol: float = 1e-5
) -> None:
    """Finite-difference check of `fn`'s derivatives up to `order` (float64).

    Requires `jax.config.update("jax_enable_x64", True)`; raises on mismatch.
    """
    if not jax.config.read("jax_enable_x64"):
        raise RuntimeError("check_gradients needs float64: jax.config.update('jax_enable_x64', True)")
    args = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), tuple(args))
    check_grads(fn, args, order=order, modes=modes, eps=eps, atol=atol, rtol=rtol)
