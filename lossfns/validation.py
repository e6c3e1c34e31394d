"""Argument checks for the public API: run outside `jit`, on static shapes,
dtypes and (when they are concrete) values, so bad input fails with a
`ValueError`/`TypeError` naming the argument instead of a silent wrong
answer or an XLA error deep inside a trace."""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp


def concrete(x):
    """`x` as a numpy array when its value is known now, else `None` (traced)."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def as_float_array(name: str, x, min_rank: int, shape_doc: str) -> jax.Array:
    """`x` as a floating array of rank >= `min_rank`, or a clear error."""
    try:
        x = jnp.asarray(x)
    except TypeError as error:
        raise TypeError(f"{name} must be a floating-point array {shape_doc}, got {type(x).__name__}: {error}") from None
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array {shape_doc}, got dtype {x.dtype}")
    if x.ndim < min_rank:
        raise ValueError(f"{name} must have shape {shape_doc} (rank >= {min_rank}), got shape {x.shape}")
    return x


def check_finite_or_neg_inf(name: str, x) -> None:
    """Reject NaN and `+inf` scores when the values are concrete (`-inf` means forbidden)."""
    value = concrete(x)
    if value is None:
        return
    if np.isnan(value).any():
        raise ValueError(f"{name} contains NaN at index {tuple(int(i) for i in np.argwhere(np.isnan(value))[0])}")
    if np.isposinf(value).any():
        raise ValueError(f"{name} contains +inf at index {tuple(int(i) for i in np.argwhere(np.isposinf(value))[0])}; "
                         "only -inf (a forbidden choice) is allowed")


def as_lengths(lengths, batch_shape: tuple[int, ...], max_length: int, name: str = "lengths") -> jax.Array:
    """Lengths `[*batch_shape]` of ints in `[0, max_length]`; `None` means full length."""
    if lengths is None:
        return jnp.full(batch_shape, max_length, jnp.int32)
    lengths = jnp.asarray(lengths)
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise TypeError(f"{name} must be an integer array of shape {batch_shape}, got dtype {lengths.dtype}")
    if lengths.shape != tuple(batch_shape):
        raise ValueError(f"{name} must have shape {tuple(batch_shape)} (the batch shape of the potentials), "
                         f"got shape {lengths.shape}")
    value = concrete(lengths)
    if value is not None and value.size and (value.min() < 0 or value.max() > max_length):
        bad = value[(value < 0) | (value > max_length)].flat[0]
        raise ValueError(f"{name} must lie in [0, {max_length}] (the number of positions T), got {int(bad)}")
    return lengths


def as_labels(labels, shape: tuple[int, ...], num_labels: int, lengths, name: str = "labels") -> jax.Array:
    """Labels of `shape` with values in `[0, num_labels)` inside each length."""
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"{name} must be an integer array of shape {shape}, got dtype {labels.dtype}")
    if labels.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ([..., T] matching the potentials), got shape {labels.shape}")
    value, length_value = concrete(labels), concrete(lengths)
    if value is not None and length_value is not None and value.size:
        inside = np.arange(shape[-1]) < length_value[..., None]
        bad = inside & ((value < 0) | (value >= num_labels))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name} must lie in [0, {num_labels}) inside each sequence's length, "
                             f"got {int(value[where])} at index {where}")
    return labels


def available_memory_bytes() -> int | None:
    """Physical memory available now (Linux `sysconf`), or `None` if unknown."""
    import os
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_allocation(name: str, shape: tuple[int, ...], dtype, copies: int = 1) -> None:
    """Raise `MemoryError` naming `name` before allocating `copies` dense arrays
    of `shape` that cannot fit in the memory available now, rather than let the
    process be killed by the kernel mid-allocation."""
    import math
    needed = math.prod(shape) * np.dtype(dtype).itemsize * copies
    available = available_memory_bytes()
    if available is not None and needed > available:
        raise MemoryError(f"{name} of shape {tuple(shape)} ({np.dtype(dtype).name}, x{copies}) needs "
                          f"{needed / 2**30:.1f} GiB but only {available / 2**30:.1f} GiB is available; "
                          "use fewer features (a larger min_count or hashing) or fewer labels")
