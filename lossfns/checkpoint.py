"""Atomic, self-checking checkpoints of any pytree of arrays.

A training state (parameters, optimizer state, RNG key, data position) is a
pytree; `save` writes its leaves to one file and `load` reads them back into
the structure of a template (`like`), as `equinox.tree_deserialise_leaves`
does, so nothing is unpickled and no code runs on load.

File layout (all integers little-endian)::

    b"LOSSFNS-CHECKPOINT\\n"          magic
    uint64                          header size in bytes
    header                          UTF-8 JSON, see below
    payload                         the leaves' raw bytes, C order, one after another

The header holds the format version, the structure description (one entry
per leaf: its key path, shape, dtype, and whether it is a PRNG key), the
payload size and a SHA-256 of the rest of the header and the payload. A file cut short or altered
anywhere fails one of these checks on load, with a `CheckpointError` that
names the file; it is never loaded as garbage.

Saving writes a temporary file in the same directory, fsyncs it, and
renames it over the target with `os.replace` (atomic on POSIX), then fsyncs
the directory: a process killed at any point leaves either the old file or
the new one, never a partial one under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import tempfile
import warnings
from pathlib import Path
from typing import Optional, Union

import numpy as np

import jax
import jax.numpy as jnp

FORMAT_VERSION = 1
MAGIC = b"LOSSFNS-CHECKPOINT\n"
_SIZE = struct.Struct("<Q")
_NAME_PATTERN = re.compile(r"^checkpoint-(\d+)\.ckpt$")

PathLike = Union[str, os.PathLike]


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupted, or does not match
    the structure it is loaded into. The message names the file."""


# ---------------------------------------------------------------------------
# Leaves <-> bytes
# ---------------------------------------------------------------------------


def _is_key(leaf) -> bool:
    return hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _leaf_record(path, leaf):
    """`(description, numpy array)` of one leaf; typed PRNG keys are stored as
    their raw key data plus the name of their implementation."""
    key_impl = None
    if _is_key(leaf):
        key_impl = str(jax.random.key_impl(leaf))
        leaf = jax.random.key_data(leaf)
    array = np.asarray(leaf)
    if array.dtype == object:
        raise TypeError(f"checkpoint leaves must be arrays or numbers, got {type(leaf).__name__} "
                        f"at {jax.tree_util.keystr(path)}")
    description = {"path": jax.tree_util.keystr(path), "shape": list(array.shape),
                   "dtype": array.dtype.name, "key_impl": key_impl}
    return description, array


def _describe(tree):
    """Structure description and arrays of every leaf of `tree`."""
    records = [_leaf_record(path, leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)]
    return [r[0] for r in records], [r[1] for r in records]


def _digest(body: dict, payload: bytes) -> str:
    """SHA-256 of the header (less the digest itself) and the payload, so a
    damaged structure description is caught as surely as damaged data."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8") + payload).hexdigest()


def _encode(tree) -> bytes:
    leaves, arrays = _describe(tree)
    payload = b"".join(array.tobytes(order="C") for array in arrays)
    body = {
        "format_version": FORMAT_VERSION,
        "structure": str(jax.tree_util.tree_structure(tree)),
        "leaves": leaves,
        "payload_bytes": len(payload),
    }
    header_bytes = json.dumps(dict(body, sha256=_digest(body, payload)), sort_keys=True).encode("utf-8")
    return MAGIC + _SIZE.pack(len(header_bytes)) + header_bytes + payload


def _split(path: Path, data: bytes):
    """Check framing, header and checksum of a file's bytes; `(header, payload)`."""
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise CheckpointError(f"checkpoint {path} is truncated ({len(data)} bytes, inside the magic)")
        raise CheckpointError(f"{path} is not a lossfns checkpoint (bad magic bytes)")
    start = len(MAGIC) + _SIZE.size
    if len(data) < start:
        raise CheckpointError(f"checkpoint {path} is truncated ({len(data)} bytes, inside the header size)")
    (header_size,) = _SIZE.unpack_from(data, len(MAGIC))
    if len(data) < start + header_size:
        raise CheckpointError(f"checkpoint {path} is truncated: header of {header_size} bytes, "
                              f"file has {len(data) - start} after the magic")
    try:
        header = json.loads(data[start:start + header_size].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint {path} is corrupted: unreadable header ({error})") from None
    if not isinstance(header, dict) or header.get("format_version") != FORMAT_VERSION:
        version = header.get("format_version") if isinstance(header, dict) else None
        raise CheckpointError(f"checkpoint {path} has format version {version!r}; "
                              f"this lossfns reads version {FORMAT_VERSION}")
    payload = data[start + header_size:]
    expected = header.get("payload_bytes")
    if not isinstance(expected, int):
        raise CheckpointError(f"checkpoint {path} is corrupted: header has no payload size")
    if len(payload) < expected:
        raise CheckpointError(f"checkpoint {path} is truncated: payload has {len(payload)} of {expected} bytes")
    if len(payload) > expected:
        raise CheckpointError(f"checkpoint {path} is corrupted: {len(payload) - expected} "
                              "unexpected bytes after the payload")
    body = {key: value for key, value in header.items() if key != "sha256"}
    if _digest(body, payload) != header.get("sha256"):
        raise CheckpointError(f"checkpoint {path} is corrupted: SHA-256 checksum does not match")
    return header, payload


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def save(path: PathLike, tree) -> Path:
    """Write the pytree `tree` to `path` atomically; returns the path.

    Leaves may be jax or numpy arrays, Python numbers, or typed PRNG keys
    (`jax.random.key`). The file is complete under its final name or not
    there at all (temporary file, fsync, `os.replace`, fsync of the directory).
    """
    path = Path(path)
    data = _encode(tree)
    directory = path.parent if str(path.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    # Make the rename itself durable.
    directory_handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_handle)
    finally:
        os.close(directory_handle)
    return path


def read_header(path: PathLike) -> dict:
    """The verified header of a checkpoint (format version, structure
    description, checksum); raises `CheckpointError` for a bad file."""
    path = Path(path)
    return _split(path, _read_bytes(path))[0]


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None


def load(path: PathLike, like):
    """Read the checkpoint at `path` into the structure of the pytree `like`.

    `like` supplies the structure and leaf types (e.g. freshly initialised
    parameters and optimizer state); its values are not used. Each returned
    leaf has the type of its template leaf (jax array, numpy array, Python
    number or PRNG key). Raises `CheckpointError` naming the file when it is
    missing, truncated or corrupted, or when its leaves' paths, shapes or
    dtypes differ from `like`'s.
    """
    path = Path(path)
    header, payload = _split(path, _read_bytes(path))
    expected, _ = _describe(like)
    stored = header["leaves"]
    if len(stored) != len(expected):
        raise CheckpointError(f"checkpoint {path} holds {len(stored)} leaves; `like` has {len(expected)} "
                              f"(stored structure {header['structure']})")
    for want, got in zip(expected, stored):
        if want != got:
            raise CheckpointError(f"checkpoint {path} does not match `like` at leaf {want['path']}: expected "
                                  f"shape {tuple(want['shape'])} dtype {want['dtype']}, stored {got['path']} "
                                  f"shape {tuple(got['shape'])} dtype {got['dtype']}")
    templates, treedef = jax.tree_util.tree_flatten(like)
    leaves, offset = [], 0
    for template, description in zip(templates, stored):
        dtype = jnp.dtype(description["dtype"])
        size = int(np.prod(description["shape"], dtype=np.int64)) * dtype.itemsize
        array = np.frombuffer(payload, dtype, count=size // dtype.itemsize if dtype.itemsize else 0,
                              offset=offset).reshape(description["shape"]).copy()
        offset += size
        leaves.append(_like_leaf(template, array, description["key_impl"]))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _like_leaf(template, array: np.ndarray, key_impl: Optional[str]):
    """`array` in the type of the template leaf."""
    if key_impl is not None:
        return jax.random.wrap_key_data(jnp.asarray(array), impl=key_impl)
    if isinstance(template, np.ndarray):
        return array
    if isinstance(template, (bool, int, float, complex, np.generic)):
        return type(template)(array.item())
    return jnp.asarray(array)


def checkpoint_path(directory: PathLike, step: int) -> Path:
    """`directory/checkpoint-<step>.ckpt`, zero-padded so names sort by step."""
    if step < 0:
        raise ValueError(f"step must be a non-negative int, got {step}")
    return Path(directory) / f"checkpoint-{step:012d}.ckpt"


def _numbered(directory: Path):
    """`[(step, path)]` of the complete checkpoints in `directory`, by step."""
    found = []
    for entry in directory.iterdir():
        match = _NAME_PATTERN.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(directory: PathLike) -> Optional[Path]:
    """The valid checkpoint with the highest step in `directory`, or `None`.

    Temporary files of an interrupted save are ignored. A newest file that
    fails verification is skipped with a warning naming it (the one before
    it is used), so a damaged disk block does not stop a resume.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return None
    for _, path in reversed(_numbered(directory)):
        try:
            read_header(path)
        except CheckpointError as error:
            warnings.warn(f"skipping unusable checkpoint: {error}", RuntimeWarning, stacklevel=2)
            continue
        return path
    return None


def prune_checkpoints(directory: PathLike, keep: int) -> None:
    """Delete all but the `keep` highest-step checkpoints in `directory`."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    for _, path in _numbered(Path(directory))[:-keep]:
        path.unlink()
