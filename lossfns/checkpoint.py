"""Atomic, self-checking checkpoints of any pytree of arrays.

`save` writes a training state's leaves to one file (magic bytes, a JSON header
describing every leaf, with a SHA-256, then the raw bytes) and `load` reads them
back into the structure of a template (`like`), so nothing is unpickled and no
code runs on load; a truncated or altered file raises a `CheckpointError` naming
it. Saves are atomic (temporary file, fsync, `os.replace`), `DirectoryLock` keeps
one writer per directory, and model files share the helpers (`write_atomically`,
`pack_file`, `unpack_file`, `read_file`).
Design notes: docs/internals.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import struct
import tempfile
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import NamedTuple

try:
    import fcntl
except ImportError:  # not POSIX: DirectoryLock does not lock
    fcntl = None

import jax
import jax.numpy as jnp
import numpy as np

FORMAT_VERSION = 1
"""The checkpoint format this version writes and reads."""
MAGIC = b"LOSSFNS-CHECKPOINT\n"
"""The bytes every checkpoint file starts with."""
_SIZE = struct.Struct("<Q")
_NAME_PATTERN = re.compile(r"^checkpoint-(\d+)\.ckpt$")
# What `write_atomically` leaves behind for a checkpoint when killed before its rename.
_TEMPORARY_PATTERN = re.compile(r"^\.checkpoint-\d+\.ckpt\..+\.tmp$")
LOCK_NAME = ".lossfns.lock"
"""The lock file a training run holds in its checkpoint directory (`DirectoryLock`)."""

PathLike = str | os.PathLike
"""A path: `str` or `os.PathLike`."""


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupted, or does not match
    the structure it is loaded into. The message names the file."""


class ModelFileError(ValueError):
    """A model file (`Tagger.save`) is missing, truncated, corrupted, of an
    unknown format version, or its header does not match its weights. The
    message names the file and what is wrong."""


class FileKind(NamedTuple):
    """How one kind of self-checking file is framed and how its errors read."""

    magic: bytes
    noun: str  # "checkpoint", "model file"
    foreign: str  # what a file with other magic bytes is not
    version_key: str
    version: int
    error: type


CHECKPOINT = FileKind(MAGIC, "checkpoint", "a lossfns checkpoint", "format_version", FORMAT_VERSION, CheckpointError)
"""How checkpoint files are framed, versioned and checked (`FileKind`)."""


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
        raise TypeError(
            f"checkpoint leaves must be arrays or numbers, got {type(leaf).__name__} at {jax.tree_util.keystr(path)}"
        )
    description = {
        "path": jax.tree_util.keystr(path),
        "shape": list(array.shape),
        "dtype": array.dtype.name,
        "key_impl": key_impl,
    }
    return description, array


def _describe(tree):
    """Structure description and arrays of every leaf of `tree`."""
    records = [_leaf_record(path, leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)]
    return [r[0] for r in records], [r[1] for r in records]


def _digest(body: dict, payload: bytes) -> str:
    """SHA-256 of the header (less the digest itself) and the payload, so a
    damaged structure description is caught as surely as damaged data."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8") + payload).hexdigest()


def pack_file(kind: FileKind, body: dict, payload: bytes) -> bytes:
    """The bytes of a self-checking file: magic, header size, the JSON header
    (`body` with the format version, the payload size and a SHA-256 over
    header and payload), payload."""
    body = dict(body, **{kind.version_key: kind.version}, payload_bytes=len(payload))
    header_bytes = json.dumps(dict(body, sha256=_digest(body, payload)), sort_keys=True).encode("utf-8")
    return kind.magic + _SIZE.pack(len(header_bytes)) + header_bytes + payload


def _encode(tree) -> bytes:
    leaves, arrays = _describe(tree)
    payload = b"".join(array.tobytes(order="C") for array in arrays)
    body = {"structure": str(jax.tree_util.tree_structure(tree)), "leaves": leaves}
    return pack_file(CHECKPOINT, body, payload)


def unpack_file(path: Path, data: bytes, kind: FileKind = CHECKPOINT):
    """Check framing, format version, size and checksum of a file's bytes
    (written by `pack_file`); `(header, payload)`, else `kind.error` naming
    the file and what is wrong."""
    return _unpack(io.BytesIO(data).read, len(data), path, kind)


def read_file(path: PathLike, kind: FileKind = CHECKPOINT):
    """`(header, payload)` of the file at `path` (written by `pack_file`),
    checked as `unpack_file` checks bytes, in the order it is read: a
    regular file (`open_regular`), the magic, the sizes the header gives
    against the file's size, and only then the payload and its checksum, so
    a foreign or damaged file is refused after reading its first bytes."""
    path = Path(path)
    with open_regular(path, kind.noun, kind.error) as file:
        return _unpack(file.read, os.fstat(file.fileno()).st_size, path, kind)


@contextmanager
def open_regular(path: PathLike, noun: str, error: type):
    """`path` opened for binary reading, refused with `error` ("`noun` PATH
    does not exist / is a FIFO, not a regular file") unless it is a regular
    file. Opened without blocking: `open` of a FIFO waits for a writer
    forever."""
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise error(f"{noun} {path} does not exist") from None
    mode = os.fstat(handle).st_mode
    if not stat.S_ISREG(mode):
        os.close(handle)
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a special file"
        raise error(f"{noun} {path} is {kind}, not a regular file")
    with open(handle, "rb") as file:
        yield file


def _unpack(read, size: int, path, kind: FileKind):
    """`unpack_file`'s checks on a file of `size` bytes read by `read(n)`
    from its start: no part is read before the sizes that lead to it are
    checked against `size`."""
    noun, error = f"{kind.noun} {path}", kind.error
    start = len(kind.magic) + _SIZE.size
    head = read(start)
    if not head.startswith(kind.magic):
        if size < len(kind.magic) and kind.magic.startswith(head):
            raise error(f"{noun} is truncated ({size} bytes, inside the magic)")
        raise error(f"{path} is not {kind.foreign} (bad magic bytes)")
    if size < start:
        raise error(f"{noun} is truncated ({size} bytes, inside the header size)")
    (header_size,) = _SIZE.unpack_from(head, len(kind.magic))
    if size < start + header_size:
        raise error(f"{noun} is truncated: header of {header_size} bytes, file has {size - start} after the magic")
    try:
        header = json.loads(read(header_size).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as problem:
        raise error(f"{noun} is corrupted: unreadable header ({problem})") from None
    if not isinstance(header, dict) or header.get(kind.version_key) != kind.version:
        version = header.get(kind.version_key) if isinstance(header, dict) else None
        raise error(f"{noun} has format version {version!r}; this lossfns reads version {kind.version}")
    expected, available = header.get("payload_bytes"), size - start - header_size
    if isinstance(expected, bool) or not isinstance(expected, int):
        raise error(f"{noun} is corrupted: header has no payload size")
    if available < expected:
        raise error(f"{noun} is truncated: payload has {available} of {expected} bytes")
    if available > expected:
        raise error(f"{noun} is corrupted: {available - expected} unexpected bytes after the payload")
    payload = read(expected)
    body = {key: value for key, value in header.items() if key != "sha256"}
    if _digest(body, payload) != header.get("sha256"):
        raise error(f"{noun} is corrupted: SHA-256 checksum does not match")
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
    return write_atomically(path, _encode(tree))


def write_atomically(path: PathLike, data: bytes) -> Path:
    """Write `data` to `path` so that the file is complete under its final
    name or not changed at all: a temporary file in the same directory,
    fsync, `os.replace`, fsync of the directory. Returns the path."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except FileNotFoundError:  # else the message names the temporary file, not `path`
        raise FileNotFoundError(f"cannot write {path}: its directory {directory} does not exist") from None
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
    return read_file(path)[0]


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
    header, payload = read_file(path)
    expected, _ = _describe(like)
    stored = header["leaves"]
    if len(stored) != len(expected):
        raise CheckpointError(
            f"checkpoint {path} holds {len(stored)} leaves; `like` has {len(expected)} "
            f"(stored structure {header['structure']})"
        )
    for want, got in zip(expected, stored):
        if want != got:
            raise CheckpointError(
                f"checkpoint {path} does not match `like` at leaf {want['path']}: expected "
                f"shape {tuple(want['shape'])} dtype {want['dtype']}, stored {got['path']} "
                f"shape {tuple(got['shape'])} dtype {got['dtype']}"
            )
    sizes = [int(np.prod(d["shape"], dtype=np.int64)) * jnp.dtype(d["dtype"]).itemsize for d in stored]
    if sum(sizes) != len(payload):
        raise CheckpointError(
            f"checkpoint {path}: header does not match its payload: its leaves take "
            f"{sum(sizes)} bytes, the payload has {len(payload)}"
        )
    templates, treedef = jax.tree_util.tree_flatten(like)
    leaves, offset = [], 0
    for template, description in zip(templates, stored):
        dtype = jnp.dtype(description["dtype"])
        size = int(np.prod(description["shape"], dtype=np.int64)) * dtype.itemsize
        array = (
            np.frombuffer(payload, dtype, count=size // dtype.itemsize if dtype.itemsize else 0, offset=offset)
            .reshape(description["shape"])
            .copy()
        )
        offset += size
        leaves.append(_like_leaf(template, array, description["key_impl"]))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _like_leaf(template, array: np.ndarray, key_impl: str | None):
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


def latest_checkpoint(directory: PathLike) -> Path | None:
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
    directory = Path(directory)
    try:
        numbered = _numbered(directory)
    except FileNotFoundError:
        return
    for _, path in numbered[:-keep]:
        path.unlink(missing_ok=True)  # another process may have removed it first


class DirectoryLock:
    """Exclusive, advisory lock of a checkpoint directory: one training run
    writes there at a time.

        with checkpoint.DirectoryLock(directory):
            ...  # resume, train, save, prune

    Creates the directory, then takes an `fcntl.flock` on
    `directory/.lossfns.lock` (the file stays; the kernel drops the lock when
    the holder exits, is killed, or leaves the `with`). If another open lock
    holds it, raises `CheckpointError` naming the directory (and the holder's
    process id) at once instead of waiting. With the lock taken, the
    temporary files of checkpoint saves that were killed before their rename
    are removed. Without `fcntl` (not POSIX) nothing is locked.
    """

    def __init__(self, directory: PathLike):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._handle = None

    def acquire(self) -> DirectoryLock:
        if self._handle is not None:
            raise RuntimeError(f"the lock of {self.directory} is already held by this DirectoryLock")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise CheckpointError(
                f"checkpoint_dir {self.directory} is not a directory: a file is at that path or above it; "
                "give a directory (it is created when missing)"
            ) from None
        if fcntl is None:
            return self
        handle = open(self.path, "a+")  # noqa: SIM115  (held open: the lock lives as long as the handle)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            who = f"process {holder}" if holder.isdigit() else "another process"
            raise CheckpointError(
                f"checkpoint directory {self.directory} is in use by another training run "
                f"({who} holds the lock {self.path}); wait for it to finish, or use "
                "another directory"
            ) from None
        except BaseException:
            handle.close()
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle
        remove_temporaries(self.directory)
        return self

    def release(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def locked(directory: PathLike | None):
    """`DirectoryLock(directory)`, or a context that does nothing when
    `directory` is None (training without checkpoints)."""
    return nullcontext() if directory is None else DirectoryLock(directory)


def remove_temporaries(directory: PathLike) -> list[Path]:
    """Delete the temporary files that checkpoint saves killed before their
    rename left in `directory` (`.checkpoint-<step>.ckpt.*.tmp`); returns
    them. Call it only while holding the directory's `DirectoryLock`: a
    running save's temporary file looks the same."""
    removed = []
    for entry in Path(directory).iterdir():
        if _TEMPORARY_PATTERN.match(entry.name):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed
