"""Opt-in value checks inside `jit` (a debug mode), with `jax.experimental.checkify`.

The public functions check shapes and dtypes always, values (NaN or `+inf` scores,
lengths outside `[0, T]`, labels outside `[0, L)`) only when concrete: under `jit` a
NaN potential flows silently into the result. `checked` compiles the value checks
into the program (a `ValueError` naming the argument after it runs), with checkify's
NaN checks (the first operation that made a NaN); leave it off in production runs::

    log_z = debug.checked(chain.log_partition, validate=debug.check_chain_inputs)
    log_z(potentials, lengths)   # compiled; raises ValueError on NaN potentials
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from .lattices import chain

DEFAULT_ERRORS = checkify.user_checks | checkify.nan_checks
"""The checkify errors `checked` looks for: the argument checks and NaNs."""


def check_scores(name: str, scores) -> None:
    """Inside `checked`: fail if `scores` holds NaN or `+inf` (`-inf` is allowed)."""
    scores = jnp.asarray(scores)
    checkify.check(~jnp.any(jnp.isnan(scores)), f"{name} contains NaN (inside jit)")
    checkify.check(~jnp.any(jnp.isposinf(scores)), f"{name} contains +inf (inside jit); only -inf is allowed")


def _first(values, bad):
    """The first entry of `values` where `bad` (0 when none), for messages."""
    flat_bad = bad.reshape(-1)
    if flat_bad.size == 0:
        return jnp.zeros((), values.dtype)
    return jnp.where(flat_bad, values.reshape(-1), 0)[jnp.argmax(flat_bad)]


def check_lengths(lengths, max_length: int, name: str = "lengths") -> None:
    """Inside `checked`: fail unless every length lies in `[0, max_length]`."""
    lengths = jnp.asarray(lengths)
    bad = (lengths < 0) | (lengths > max_length)
    checkify.check(
        ~jnp.any(bad),
        f"{name} must lie in [0, {max_length}] (the number of positions T), got {{}} (inside jit)",
        _first(lengths, bad),
    )


def check_labels(labels, num_labels: int, lengths, name: str = "labels") -> None:
    """Inside `checked`: fail unless labels lie in `[0, num_labels)` inside each length."""
    labels = jnp.asarray(labels)
    inside = jnp.arange(labels.shape[-1]) < jnp.asarray(lengths)[..., None]
    bad = inside & ((labels < 0) | (labels >= num_labels))
    checkify.check(
        ~jnp.any(bad),
        f"{name} must lie in [0, {num_labels}) inside each sequence's length, got {{}} (inside jit)",
        _first(labels, bad),
    )


def check_chain_inputs(potentials, lengths=None, labels=None, **options) -> None:
    """Inside `checked`: the value checks of `lossfns.lattices.chain` for
    `potentials` (`[..., T, L, L]`, `FactoredPotentials` or `SparsePotentials`), `lengths [...]`
    and `labels [..., T]`. Extra keyword options (e.g. `algorithm`) are
    accepted and ignored, so it can validate any chain function's arguments."""
    del options
    form = chain.as_form(potentials)
    for name, scores in form.named_scores():
        check_scores(name, scores)
    T, L = form.num_steps, form.num_labels
    if lengths is not None:
        check_lengths(lengths, T)
    if labels is not None:
        full = jnp.full(jnp.shape(labels)[:-1], T) if lengths is None else lengths
        check_labels(labels, L, full)


def checked(fn: Callable, *, validate: Callable | None = None, errors=DEFAULT_ERRORS) -> Callable:
    """`fn` compiled with value checks; a failed check raises `ValueError`.

    Args:
      fn: a function of arrays (positional arguments are traced; keyword
        arguments are static options such as `semiring` or `algorithm`).
      validate: called with the same arguments inside the compiled program
        before `fn`, e.g. `check_chain_inputs`.
      errors: the checkify error set; default user checks and NaN checks.

    Returns:
      A function with `fn`'s signature. A failed check raises
      `checkify.JaxRuntimeError` (a `ValueError`) whose message is the
      check's, e.g. "potentials contains NaN (inside jit)".
    """

    @functools.cache
    def compiled(options):
        def body(*args):
            if validate is not None:
                validate(*args, **dict(options))
            return fn(*args, **dict(options))

        return jax.jit(checkify.checkify(body, errors=errors))

    @functools.wraps(fn)
    def wrapper(*args, **options):
        error, out = compiled(tuple(sorted(options.items())))(*args)
        error.throw()
        return out

    return wrapper
