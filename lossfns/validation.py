"""Argument checks for the public API: run outside `jit`, on static shapes,
dtypes and (when they are concrete) values, so bad input fails with a
`ValueError`/`TypeError` naming the argument instead of a silent wrong
answer or an XLA error deep inside a trace."""

from __future__ import annotations

import math
import numbers

import jax
import jax.core
import jax.numpy as jnp
import numpy as np


def concrete(x):
    """`x` as a numpy array when its value is known now, else `None` (traced)."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def traced(tree) -> bool:
    """Whether any leaf of `tree` is a tracer (its value unknown now)."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree))


def on_device(x) -> jax.Array:
    """`x` as a JAX array, placed by `jax.device_put` (same dtype rules as
    `jnp.asarray`, which in JAX 0.10 compiles a copy program for each new
    shape of a host array); JAX arrays and tracers are returned unchanged."""
    if isinstance(x, jax.Array):
        return x
    return jax.device_put(x if isinstance(x, (bool, int, float, complex)) else np.asarray(x))


def as_float_array(name: str, x, min_rank: int, shape_doc: str) -> jax.Array:
    """`x` as a floating array of rank >= `min_rank`, or a clear error."""
    try:
        x = on_device(x)
    except TypeError as error:
        raise TypeError(f"{name} must be a floating-point array {shape_doc}, got {type(x).__name__}: {error}") from None
    except ValueError:  # numpy's "inhomogeneous shape" for nested lists of uneven lengths
        raise ValueError(
            f"{name} must be a floating-point array {shape_doc}, got a ragged nested {type(x).__name__} "
            "(its rows differ in length); pad them to one shape"
        ) from None
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
        raise ValueError(
            f"{name} contains +inf at index {tuple(int(i) for i in np.argwhere(np.isposinf(value))[0])}; "
            "only -inf (a forbidden choice) is allowed"
        )


def check_int(name: str, value, minimum: int = 1) -> int:
    """`value` as a Python int `>= minimum`: Python and numpy integers are
    accepted, `bool` and everything else (floats such as 3.0 included) refused
    with a `TypeError`/`ValueError` naming `name`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _first_index(mask) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def integer_values(name: str, x, expected: str):
    """Check that `x` holds integers and return its values as a numpy array
    (`None` when traced), in `x`'s own dtype, before any cast to JAX's integer
    type can change them. Floats are refused, even 2.0 (the dtype is wrong and
    a fractional 2.5 would be truncated); the message gives the first
    fractional value when there is one."""
    if isinstance(x, jax.core.Tracer):
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise TypeError(f"{name} must be {expected}, got dtype {x.dtype}")
        return None
    try:
        value = np.asarray(x)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be {expected}, got {type(x).__name__}: {error}") from None
    if value.dtype.kind not in "iu":
        detail = ""
        if value.dtype.kind == "f" and value.size:
            fractional = np.isfinite(value) & (value != np.trunc(value)) | ~np.isfinite(value)
            if fractional.any():
                where = _first_index(fractional)
                detail = f" with value {value[where].item()!r} at index {where}"
        dtype = "object (integers too large for int64?)" if value.dtype.kind == "O" else value.dtype
        raise TypeError(f"{name} must be {expected}, got dtype {dtype}{detail}")
    return value


def as_int_array(name: str, x, value) -> jax.Array:
    """`x` as a JAX array once `integer_values` accepted it: refuse a value
    that the cast to JAX's integer type (int32 unless `jax_enable_x64`) would
    change, e.g. an int64 2**32 + 2 read as 2."""
    if value is not None and not isinstance(x, jax.Array):
        target = jax.dtypes.canonicalize_dtype(value.dtype)
        if target != value.dtype and value.size:
            info = np.iinfo(target)
            lossy = (value < info.min) | (value > info.max)
            if lossy.any():
                where = _first_index(lossy)
                raise ValueError(
                    f"{name} must fit in {target.name} (JAX's integer type; jax_enable_x64 is off), "
                    f"got {value[where].item()} at index {where}"
                )
    return on_device(x)


def as_integer_array(name: str, x, expected: str) -> jax.Array:
    """`x` as a JAX integer array, its values checked before the cast
    (`integer_values`, then `as_int_array`): floats, bools-as-floats and
    values the cast would change are refused naming `name`."""
    return as_int_array(name, x, integer_values(name, x, expected))


def as_lengths(lengths, batch_shape: tuple[int, ...], max_length: int, name: str = "lengths") -> jax.Array:
    """Lengths `[*batch_shape]` of ints in `[0, max_length]`; `None` means full length.
    Values are checked before the cast to int32, so none wraps around."""
    if lengths is None:
        return on_device(np.full(batch_shape, max_length, np.int32))
    value = integer_values(name, lengths, f"an integer array of shape {tuple(batch_shape)}")
    shape = tuple(np.shape(lengths)) if value is None else value.shape
    if shape != tuple(batch_shape):
        raise ValueError(
            f"{name} must have shape {tuple(batch_shape)} (the batch shape of the potentials), got shape {shape}"
        )
    if value is not None and value.size and (value.min() < 0 or value.max() > max_length):
        bad = value[(value < 0) | (value > max_length)].flat[0]
        raise ValueError(f"{name} must lie in [0, {max_length}] (the number of positions T), got {int(bad)}")
    return as_int_array(name, lengths, value)


def as_labels(labels, shape: tuple[int, ...], num_labels: int, lengths, name: str = "labels") -> jax.Array:
    """Labels of `shape` with values in `[0, num_labels)` inside each length
    (checked before the cast to int32; padding outside must fit int32)."""
    value = integer_values(name, labels, f"an integer array of shape {tuple(shape)}")
    given = tuple(np.shape(labels)) if value is None else value.shape
    if given != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ([..., T] matching the potentials), got shape {given}")
    length_value = concrete(lengths)
    if value is not None and length_value is not None and value.size:
        inside = np.arange(shape[-1]) < length_value[..., None]
        bad = inside & ((value < 0) | (value >= num_labels))
        if bad.any():
            where = _first_index(bad)
            raise ValueError(
                f"{name} must lie in [0, {num_labels}) inside each sequence's length, "
                f"got {int(value[where])} at index {where}"
            )
    return as_int_array(name, labels, value)


def nan_unless(mask, value) -> jax.Array:
    """`value` where `mask` is True, else NaN, in the value and in its derivative.

    For what the checks above cannot see under `jit` (traced labels outside
    `[0, L)`, NaN scores): a gather clamps an out-of-range label and the
    derivative of a gathered NaN is a finite one-hot, so without this a bad
    input would train on silently. Multiplying by a constant 1 or NaN costs
    one product per value (a sequence's score, a position's) and leaves
    valid values (-inf included) and their derivatives unchanged."""
    return value * jnp.where(mask, 1.0, jnp.nan)


def labels_in_range(labels, num_labels: int, inside) -> jax.Array:
    """Per position, True unless it is inside the lengths (`inside`) with a
    label outside `[0, num_labels)`: the traced counterpart of `as_labels`."""
    return ~inside | ((labels >= 0) & (labels < num_labels))


def as_mask(mask, params, name: str = "mask"):
    """`mask` (a pytree of bools with the structure of `params` or a prefix
    of it, as `optax.masked` takes; or a callable `params -> such a pytree`)
    resolved and checked: its structure is a prefix of `params`' and each
    bool array broadcasts to the leaves it masks, else an error naming `name`."""
    if callable(mask):
        mask = mask(params)
    structure = jax.tree_util.tree_structure(mask)
    try:
        subtrees = structure.flatten_up_to(params)
    except ValueError:
        raise ValueError(
            f"{name} must be a pytree of bools with the structure of the parameters (or a prefix of it), "
            f"got {structure} for parameters {jax.tree_util.tree_structure(params)}"
        ) from None
    for keep, subtree in zip(structure.flatten_up_to(mask), subtrees):
        if jnp.result_type(keep) != jnp.bool_:
            raise TypeError(f"{name} must hold bools (True: penalised), got {jnp.result_type(keep)} {keep!r:.40}")
        for path, leaf in jax.tree_util.tree_leaves_with_path(subtree):
            if not _broadcasts_to(np.shape(keep), np.shape(leaf)):
                raise ValueError(
                    f"{name} has a bool array of shape {np.shape(keep)} for parameters of shape "
                    f"{np.shape(leaf)}{' at ' + jax.tree_util.keystr(path) if path else ''}; it must broadcast to them"
                )
    return mask


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def check_key(name: str, key) -> None:
    """Refuse anything but one PRNG key: `jax.random.key(seed)`, or an
    old-style `jax.random.PRNGKey(seed)` (raw `uint32` key data)."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        typed = key
    else:
        try:
            typed = jax.random.wrap_key_data(key)
        except (TypeError, ValueError):
            given = (
                f"an array of shape {np.shape(key)} dtype {key.dtype}"
                if hasattr(key, "dtype")
                else f"{type(key).__name__} {key!r:.40}"
            )
            raw = jax.eval_shape(jax.random.PRNGKey, 0)
            raise TypeError(
                f"{name} must be a PRNG key: jax.random.key(seed), or an old-style jax.random.PRNGKey(seed) "
                f"(key data of shape {raw.shape} dtype {raw.dtype}), got {given}"
            ) from None
    if typed.shape != ():
        raise ValueError(f"{name} must be one PRNG key, got an array of {typed.size} keys (shape {typed.shape})")


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
    needed = math.prod(shape) * np.dtype(dtype).itemsize * copies
    available = available_memory_bytes()
    if available is not None and needed > available:
        raise MemoryError(
            f"{name} of shape {tuple(shape)} ({np.dtype(dtype).name}, x{copies}) needs "
            f"{needed / 2**30:.1f} GiB but only {available / 2**30:.1f} GiB is available; "
            "use fewer features (a larger min_count or hashing) or fewer labels"
        )


def check_float_dtype(name: str, dtype) -> None:
    """Reject a dtype that is not floating point (e.g. `jnp.int32` weights)."""
    try:
        given = jnp.dtype(dtype)
    except TypeError:
        given = None
    if given is None or not jnp.issubdtype(given, jnp.floating):
        raise TypeError(
            f"{name} must be a floating-point dtype (jnp.float32 or jnp.float64), "
            f"got {given.name if given is not None else repr(dtype)}"
        )


def _interval(low, high, low_open, high_open) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def check_scalar(name: str, value, low=None, high=None, *, low_open: bool = False, high_open: bool = False) -> None:
    """Reject a concrete `value` that is not a finite real scalar inside the
    interval (NaN, +-inf and bools included); a traced value (under
    `jit`/`vmap`) is left unchecked."""
    expected = f"a number {_interval(low, high, low_open, high_open)}"
    array = concrete(value)
    if array is None:
        return
    if array.dtype.kind not in "iuf":  # bool refused: True is not a learning rate
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    if array.ndim != 0:
        raise ValueError(f"{name} must be {expected} (a scalar), got an array of shape {array.shape}")
    number = array.item()
    below = low is not None and (number <= low if low_open else number < low)
    above = high is not None and (number >= high if high_open else number > high)
    if math.isnan(number) or below or above:
        raise ValueError(f"{name} must be {expected}, got {number!r}")
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be {expected} and finite, got {number!r}")


def check_optimizer(optimizer, name: str = "optimizer") -> None:
    """Reject anything but an optax transformation (e.g. `optax.adam` not called)."""
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        given = getattr(optimizer, "__name__", None)
        hint = f" (call the constructor: {given}(...), not {given})" if callable(optimizer) and given else ""
        raise TypeError(
            f"{name} must be an optax GradientTransformation (with .init and .update){hint}, "
            f"got {type(optimizer).__name__}{' ' + given if given else ''}"
        )


def check_float_params(params, name: str = "params") -> None:
    """Refuse parameters that are not floating point (an int array cannot take
    a fractional step: optax would fail deep inside with `OverflowError:
    cannot convert float infinity to integer`)."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    if not leaves:
        raise ValueError(f"{name} must hold at least one floating-point array, got {type(params).__name__} {params!r}")
    for path, leaf in leaves:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            where = f" at {jax.tree_util.keystr(path)}" if path else ""
            raise TypeError(
                f"{name} must be floating point (the optimizers take fractional steps), got dtype "
                f"{dtype}{where}; pass e.g. jnp.asarray(params, jnp.float32)"
            )


def check_callable(name: str, value) -> None:
    """Refuse a `value` that is not callable (an objective, a step function)."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")
