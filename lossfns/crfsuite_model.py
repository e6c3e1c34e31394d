"""CRFsuite's model file (`crf1d`, as CRFsuite's crf1dm.c writes it and
python-crfsuite reads it), read and written in numpy, and converted to and
from lossfns' `model_file.SavedModel` (preset `feature_dicts`).

The file is little-endian: a 48-byte header (b"lCRF", the file size, counts,
offsets), the features (type, source, target, float64 weight), the labels' and
attributes' CQDB string databases (with the lookup3 hash tables that CRFsuite's
tagger finds attributes by), and per label and attribute the ids of its features.
`CrfsuiteModel` holds only what tagging reads, as arrays, so both directions are
vectorised; reading checks every size and offset first (`checkpoint.ModelFileError`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from . import checkpoint, model_file
from .features.corpus import extractor_from_spec, extractor_spec
from .features.index import FeatureIndex
from .models.linear_chain import LinearChainModel

MAGIC = b"lCRF"
"""The bytes every CRFsuite model file starts with."""

_HEADER = struct.Struct("<4sI4s9I")  # magic, size, type, version, 3 counts, 5 offsets
_MODEL_TYPE, _VERSION = b"FOMC", 100  # the only kind CRFsuite writes: first-order Markov chain
_CHUNK = struct.Struct("<4sII")  # chunk id, chunk size, number of items
_FEATURE = np.dtype([("type", "<u4"), ("source", "<u4"), ("target", "<u4"), ("weight", "<f8")])  # 20 bytes, packed
_STATE, _TRANSITION = 0, 1  # feature types: (attribute -> label), (label -> label)
_UNUSED_LABEL_REFERENCES = 2  # CRFsuite writes 2 more label-reference slots than labels, left 0

_CQDB_HEADER = struct.Struct("<4s5I")  # "CQDB", size, flag, byte-order mark, number of back links, their offset
_CQDB_BYTE_ORDER = 0x62445371
_CQDB_TABLES = 256  # hash tables, chosen by hash % 256; each holds twice its entries (open addressing)
_CQDB_DATA = _CQDB_HEADER.size + 8 * _CQDB_TABLES  # where the records start

_FEATURE_DICTS = {"preset": "feature_dicts"}  # CRFsuite's attributes are feature dicts' flattened names


class StateFeatures(NamedTuple):
    """CRFsuite's state features: attribute `attributes[s]` with value v adds
    `v * weights[s]` to label `labels[s]`'s score. attributes, labels: `[S]`
    int32 ids; weights: `[S]` float64."""

    attributes: np.ndarray
    labels: np.ndarray
    weights: np.ndarray


class CrfsuiteModel(NamedTuple):
    """What a CRFsuite model file holds: labels `[L]` and attribute names
    `[A]` (their positions are their ids), the state features, and the
    transition weights `[L, L]` float64 (`[i, j]`: label j after label i)."""

    labels: tuple[str, ...]
    attributes: tuple[str, ...]
    state_features: StateFeatures
    transitions: np.ndarray


class _Header(NamedTuple):
    magic: bytes
    size: int
    type: bytes
    version: int
    num_features: int
    num_labels: int
    num_attributes: int
    features: int
    labels: int
    attributes: int
    label_references: int
    attribute_references: int


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def read(path) -> CrfsuiteModel:
    """The model in the CRFsuite model file at `path`; `checkpoint.ModelFileError`
    naming the file when it is missing, not a regular file (a FIFO is refused,
    not waited on), not a CRFsuite model, truncated or inconsistent."""
    return from_bytes(_read_regular_file(path), path)


def is_crfsuite_file(path) -> bool:
    """Whether `path` is a regular file that starts with CRFsuite's magic bytes
    (to tell a CRFsuite model from a lossfns one before loading either)."""
    try:
        with checkpoint.open_regular(path, "CRFsuite model", checkpoint.ModelFileError) as file:
            return file.read(len(MAGIC)) == MAGIC
    except (checkpoint.ModelFileError, OSError):
        return False


def _read_regular_file(path) -> bytes:
    """The bytes of `path`, read whole only once its header's magic and size
    agree with the file (a large foreign file is refused after 48 bytes)."""
    with checkpoint.open_regular(path, "CRFsuite model", checkpoint.ModelFileError) as file:
        size = os.fstat(file.fileno()).st_size
        head = file.read(_HEADER.size)
        _check_frame(head, size, path)
        return head + file.read()


def _check_frame(head: bytes, size: int, path) -> None:
    """Raise unless `head` (the file's first bytes) starts with the magic and,
    when the header is there, gives the file's `size`."""
    if not head.startswith(MAGIC):
        if MAGIC.startswith(head):
            raise checkpoint.ModelFileError(f"CRFsuite model {path} is truncated ({size} bytes, inside the magic)")
        raise checkpoint.ModelFileError(f"{path} is not a CRFsuite model (it starts {head[:4]!r}, not {MAGIC!r})")
    if size < _HEADER.size:
        raise checkpoint.ModelFileError(
            f"CRFsuite model {path} is truncated ({size} bytes, inside its {_HEADER.size}-byte header)"
        )
    stated = _Header(*_HEADER.unpack_from(head)).size
    if stated > size:
        raise checkpoint.ModelFileError(
            f"CRFsuite model {path} is truncated: its header gives {stated} bytes, it has {size}"
        )
    if stated < size:
        raise checkpoint.ModelFileError(
            f"CRFsuite model {path} is corrupted: its header gives {stated} bytes, it has {size}"
        )


def from_bytes(data: bytes, path="<bytes>") -> CrfsuiteModel:
    """The model of a CRFsuite model file's bytes, checked as `read` checks a
    file (errors name `path`)."""
    _check_frame(data[: _HEADER.size], len(data), path)
    header = _Header(*_HEADER.unpack_from(data))
    if (header.type, header.version) != (_MODEL_TYPE, _VERSION):
        raise checkpoint.ModelFileError(
            f"CRFsuite model {path} is of type {header.type!r} version {header.version}; "
            f"lossfns reads type {_MODEL_TYPE!r} version {_VERSION}"
        )
    try:
        return _model(data, header)
    except ValueError as problem:
        raise checkpoint.ModelFileError(f"CRFsuite model {path} is corrupted: {problem}") from None


def _model(data: bytes, header: _Header) -> CrfsuiteModel:
    """The model of checked-framed `data`; ValueError naming what is wrong."""
    L, A = header.num_labels, header.num_attributes
    if L < 1:
        raise ValueError("it has no labels")
    features = _features(data, header.features, header.num_features)
    K = features.size
    labels = _strings(data, header.labels, L, "label")
    attributes = _strings(data, header.attributes, A, "attribute")
    label_of, transition_ids = _references(data, header.label_references, b"LFRF", "label references", L, K)
    attribute_of, state_ids = _references(data, header.attribute_references, b"AFRF", "attribute references", A, K)
    transitions = features[transition_ids]
    state = features[state_ids]
    for what, found, owner, kind in (
        ("label", transitions, label_of, _TRANSITION),
        ("attribute", state, attribute_of, _STATE),
    ):
        if np.any(found["type"] != kind) or np.any(found["source"] != owner):
            raise ValueError(f"its {what} references name features of another {what} or type")
        if np.any(found["target"] >= L):
            raise ValueError(f"a feature's label id is not below its {L} labels")
    table = np.zeros((L, L))
    table[label_of, transitions["target"]] = transitions["weight"]
    return CrfsuiteModel(
        labels,
        attributes,
        StateFeatures(
            attribute_of.astype(np.int32), state["target"].astype(np.int32), state["weight"].astype(np.float64)
        ),
        table,
    )


def _chunk(data: bytes, offset: int, chunk_id: bytes, what: str) -> tuple[int, int]:
    """`(size, number of items)` of the chunk at `offset`, checked to lie in `data`."""
    if offset < _HEADER.size or offset + _CHUNK.size > len(data):
        raise ValueError(f"its {what} offset {offset} is outside the file")
    found, size, count = _CHUNK.unpack_from(data, offset)
    if found != chunk_id:
        raise ValueError(f"its {what} at offset {offset} start {found!r}, not {chunk_id!r}")
    if size < _CHUNK.size or offset + size > len(data):
        raise ValueError(f"its {what} of {size} bytes at offset {offset} do not fit the file")
    return size, count


def _features(data: bytes, offset: int, count: int) -> np.ndarray:
    """The features (`_FEATURE` records) of the chunk at `offset`; `count`,
    the header's number, is 0 in CRFsuite's files (it never sets it)."""
    size, stored = _chunk(data, offset, b"FEAT", "features")
    if count not in (0, stored) or size != _CHUNK.size + _FEATURE.itemsize * stored:
        raise ValueError(f"its header gives {count} features, their chunk holds {stored} in {size} bytes")
    return np.frombuffer(data, _FEATURE, stored, offset + _CHUNK.size)


def _u32_at(bytes_: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The little-endian uint32 at each of `positions [N]` (any alignment) of
    `bytes_ [n]` uint8, as `[N]` int64."""
    gathered = bytes_[positions[:, None] + np.arange(4)]
    return np.ascontiguousarray(gathered).view("<u4")[:, 0].astype(np.int64)


def _references(data: bytes, offset: int, chunk_id: bytes, what: str, count: int, num_features: int):
    """`(owners [R], feature ids [R])` int64 of a reference chunk: for each of
    its first `count` owners (labels or attributes), the ids of its features."""
    size, stored = _chunk(data, offset, chunk_id, what)
    if stored < count or _CHUNK.size + 4 * stored > size:
        raise ValueError(f"its {what} hold {stored} lists in {size} bytes for {count} owners")
    end = offset + size
    bytes_ = np.frombuffer(data, np.uint8, end)
    starts = np.frombuffer(data, "<u4", count, offset + _CHUNK.size).astype(np.int64)
    if np.any(starts < offset) or np.any(starts + 4 > end):
        raise ValueError(f"its {what} point outside their chunk")
    counts = _u32_at(bytes_, starts)
    if np.any(starts + 4 + 4 * counts > end):
        raise ValueError(f"its {what} run past their chunk")
    first = np.cumsum(counts) - counts
    positions = np.repeat(starts + 4 - 4 * first, counts) + 4 * np.arange(int(counts.sum()))
    ids = _u32_at(bytes_, positions)
    if np.any(ids >= num_features):
        raise ValueError(f"its {what} name features beyond its {num_features}")
    return np.repeat(np.arange(count), counts), ids


def _strings(data: bytes, offset: int, count: int, what: str) -> tuple[str, ...]:
    """The `count` strings, by id, of the CQDB database at `offset` (read
    through its back links, id -> record)."""
    if offset < _HEADER.size or offset + _CQDB_DATA > len(data):
        raise ValueError(f"its {what} database at offset {offset} does not fit the file")
    chunk_id, size, _, byte_order, num_links, links_at = _CQDB_HEADER.unpack_from(data, offset)
    if chunk_id != b"CQDB" or byte_order != _CQDB_BYTE_ORDER:
        raise ValueError(f"its {what} database at offset {offset} has no CQDB header")
    if size < _CQDB_DATA or offset + size > len(data):
        raise ValueError(f"its {what} database of {size} bytes at offset {offset} does not fit the file")
    if count == 0:
        return ()
    if num_links != count or links_at < _CQDB_DATA or links_at + 4 * count > size:
        raise ValueError(f"its {what} database links {num_links} strings at {links_at}, the header gives {count}")
    chunk = data[offset : offset + size]
    bytes_ = np.frombuffer(chunk, np.uint8)
    records = np.frombuffer(chunk, "<u4", count, links_at).astype(np.int64)
    if np.any(records < _CQDB_DATA) or np.any(records + 8 > size):
        raise ValueError(f"its {what} database links records outside itself")
    ids, lengths = _u32_at(bytes_, records), _u32_at(bytes_, records + 4)
    ends = records + 8 + lengths
    if np.any(ids != np.arange(count)) or np.any(lengths < 1) or np.any(ends > size) or np.any(bytes_[ends - 1] != 0):
        raise ValueError(f"its {what} database has records that are not its ids' NUL-terminated strings")
    try:
        strings = tuple(
            chunk[start:end].decode("utf-8") for start, end in zip((records + 8).tolist(), (ends - 1).tolist())
        )
    except UnicodeDecodeError as problem:
        raise ValueError(f"a {what} is not UTF-8 ({problem})") from None
    if "\0" in "".join(strings) or len(set(strings)) != count:
        raise ValueError(f"its {what}s hold a NUL or repeat a name")
    return strings


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def write(path, model: CrfsuiteModel) -> None:
    """Write `model` to `path` as CRFsuite writes models, atomically (a
    failed write leaves the previous file as it was)."""
    checkpoint.write_atomically(path, to_bytes(model))


def to_bytes(model: CrfsuiteModel) -> bytes:
    """The bytes of `model`'s CRFsuite model file (the file `write` writes).

    Laid out as CRFsuite lays it out: header, features (the state features by
    attribute, then the non-zero transitions by label), label and attribute
    databases, label and attribute references (4-byte aligned). ValueError
    when the model is inconsistent or a name holds a NUL (C strings)."""
    _check(model)
    L, A = len(model.labels), len(model.attributes)
    state = model.state_features
    order = np.argsort(state.attributes, kind="stable")  # each attribute's features contiguous
    attribute_ids = np.asarray(state.attributes)[order]
    transitions = np.asarray(model.transitions, np.float64)
    sources, targets = np.nonzero(transitions)  # by source label: each label's contiguous
    S, T = order.size, sources.size
    features = np.zeros(S + T, _FEATURE)
    features["type"][S:] = _TRANSITION
    features["source"] = np.concatenate([attribute_ids, sources])
    features["target"] = np.concatenate([np.asarray(state.labels)[order], targets])
    features["weight"] = np.concatenate([np.asarray(state.weights)[order], transitions[sources, targets]])
    feature_chunk = _CHUNK.pack(b"FEAT", _CHUNK.size + features.nbytes, S + T) + features.tobytes()

    label_database, attribute_database = _cqdb(model.labels), _cqdb(model.attributes)
    at_labels = _HEADER.size + len(feature_chunk)
    at_attributes = at_labels + len(label_database)
    padding = bytes(-(at_attributes + len(attribute_database)) % 4)  # reference chunks are 4-byte aligned
    at_label_references = at_attributes + len(attribute_database) + len(padding)
    label_references = _references_chunk(
        b"LFRF", at_label_references, np.bincount(sources, minlength=L), S + np.arange(T), L + _UNUSED_LABEL_REFERENCES
    )
    at_attribute_references = at_label_references + len(label_references)
    attribute_references = _references_chunk(
        b"AFRF", at_attribute_references, np.bincount(attribute_ids, minlength=A), np.arange(S), A
    )
    size = at_attribute_references + len(attribute_references)
    if size >= 1 << 32:
        raise ValueError(f"the model takes {size} bytes; CRFsuite's offsets are 32-bit (files under 4 GiB)")
    offsets = (_HEADER.size, at_labels, at_attributes, at_label_references, at_attribute_references)
    header = _HEADER.pack(MAGIC, size, _MODEL_TYPE, _VERSION, 0, L, A, *offsets)  # 0 features, as CRFsuite writes
    return b"".join(
        [header, feature_chunk, label_database, attribute_database, padding, label_references, attribute_references]
    )


def _check(model: CrfsuiteModel) -> None:
    """Raise ValueError unless `model` can be written: its arrays' shapes and
    ids agree, and its names are distinct C strings."""
    L, A = len(model.labels), len(model.attributes)
    state = model.state_features
    if L < 1 or np.shape(model.transitions) != (L, L):
        raise ValueError(f"transitions must be [L, L] for L = {L} >= 1 labels, got shape {np.shape(model.transitions)}")
    shapes = {np.shape(array) for array in state}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"the state features' attributes, labels and weights must be [S] alike, got shapes {shapes}")
    for name, ids, bound in (("attribute", state.attributes, A), ("label", state.labels, L)):
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu" or (ids.size and (ids.min() < 0 or ids.max() >= bound)):
            raise ValueError(f"the state features' {name} ids must be integers in [0, {bound}), got {ids.dtype}")
    for what, names in (("labels", model.labels), ("attributes", model.attributes)):
        if not all(isinstance(name, str) and "\0" not in name for name in names) or len(set(names)) != len(names):
            raise ValueError(f"the {what} must be distinct strings without NUL characters (CRFsuite's C strings)")


def _references_chunk(chunk_id: bytes, offset: int, counts: np.ndarray, ids: np.ndarray, slots: int) -> bytes:
    """A reference chunk written at `offset`: `slots` list offsets (those past
    `counts [n]` 0), then per owner its count and its `counts[i]` feature ids
    (`ids [R]`, owner after owner)."""
    starts = np.arange(counts.size) + np.cumsum(counts) - counts  # each list's place among the words
    words = np.empty(counts.size + ids.size, np.int64)
    is_count = np.zeros(words.size, bool)
    is_count[starts] = True
    words[is_count], words[~is_count] = counts, ids
    lists_at = offset + _CHUNK.size + 4 * slots
    table = np.zeros(slots, np.int64)
    table[: counts.size] = lists_at + 4 * starts
    size = lists_at - offset + 4 * words.size
    return _CHUNK.pack(chunk_id, size, slots) + np.concatenate([table, words]).astype("<u4").tobytes()


def _cqdb(strings: Sequence[str]) -> bytes:
    """The CQDB database of `strings` (string i has id i): header, table
    references, records (id, size, the NUL-terminated UTF-8 bytes), the hash
    tables CRFsuite looks strings up in, and the back links id -> record."""
    keys = [string.encode("utf-8") + b"\0" for string in strings]
    records = b"".join(struct.pack("<II", i, len(key)) + key for i, key in enumerate(keys))
    sizes = np.fromiter(map(len, keys), np.int64, len(keys)) + 8
    record_at = _CQDB_DATA + np.cumsum(sizes) - sizes
    hashes = _hashlittle(keys)
    buckets, references = _hash_tables(hashes, record_at, _CQDB_DATA + len(records))
    links_at = _CQDB_DATA + len(records) + len(buckets) if keys else 0
    size = _CQDB_DATA + len(records) + len(buckets) + 4 * len(keys)
    header = _CQDB_HEADER.pack(b"CQDB", size, 0, _CQDB_BYTE_ORDER, len(keys), links_at)
    return header + references.astype("<u4").tobytes() + records + buckets + record_at.astype("<u4").tobytes()


def _hash_tables(hashes: np.ndarray, record_at: np.ndarray, tables_at: int) -> tuple[bytes, np.ndarray]:
    """`(buckets, table references [256, 2])`: the 256 open-addressing hash
    tables of the records at `record_at [N]` with `hashes [N]`, laid out from
    `tables_at` (a table holds twice its entries; an entry goes to the first
    free bucket from `(hash >> 8) % size`, where CRFsuite starts its search)."""
    table_of = hashes % _CQDB_TABLES
    sizes = 2 * np.bincount(table_of, minlength=_CQDB_TABLES)
    first = np.cumsum(sizes) - sizes
    table_sizes, table_starts = sizes.tolist(), first.tolist()
    bucket_hashes, bucket_records = [0] * int(sizes.sum()), [0] * int(sizes.sum())  # record offset 0: free
    for hash_, table, record in zip(hashes.tolist(), table_of.tolist(), record_at.tolist()):
        size, base = table_sizes[table], table_starts[table]
        slot = (hash_ >> 8) % size
        while bucket_records[base + slot]:
            slot = (slot + 1) % size
        bucket_hashes[base + slot], bucket_records[base + slot] = hash_, record
    buckets = np.array([bucket_hashes, bucket_records], "<u4").T
    references = np.stack([np.where(sizes > 0, tables_at + 8 * first, 0), sizes], axis=1)
    return buckets.tobytes(), references


def _rotate(x: np.ndarray, k: int) -> np.ndarray:
    return (x << np.uint32(k)) | (x >> np.uint32(32 - k))


def _hashlittle(keys: Sequence[bytes]) -> np.ndarray:
    """Bob Jenkins' lookup3 `hashlittle(key, len(key), 0)` of each non-empty
    key, `[N]` uint32: the hash CQDB files its strings under. Vectorised over
    the keys of each length in 12-byte blocks; a last block's missing bytes
    count as 0, as in lookup3."""
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    blocks = (lengths + 11) // 12
    out = np.zeros(len(keys), np.uint32)
    for count in np.unique(blocks).tolist():
        members = np.flatnonzero(blocks == count)
        padded = b"".join(keys[i].ljust(12 * count, b"\0") for i in members.tolist())
        words = np.frombuffer(padded, "<u4").reshape(members.size, 3 * count).astype(np.uint32)
        a = b = c = ((0xDEADBEEF + lengths[members]) & 0xFFFFFFFF).astype(np.uint32)
        for block in range(count):
            a, b, c = a + words[:, 3 * block], b + words[:, 3 * block + 1], c + words[:, 3 * block + 2]
            if block < count - 1:
                a, b, c = _mix(a, b, c)
        out[members] = _final(a, b, c)
    return out


def _mix(a, b, c):
    """lookup3's `mix`: the state after a block that is not the last."""
    a = (a - c) ^ _rotate(c, 4)
    c = c + b
    b = (b - a) ^ _rotate(a, 6)
    a = a + c
    c = (c - b) ^ _rotate(b, 8)
    b = b + a
    a = (a - c) ^ _rotate(c, 16)
    c = c + b
    b = (b - a) ^ _rotate(a, 19)
    a = a + c
    c = (c - b) ^ _rotate(b, 4)
    b = b + a
    return a, b, c


def _final(a, b, c):
    """lookup3's `final`: the hash `c` after the last block."""
    c = (c ^ b) - _rotate(b, 14)
    a = (a ^ c) - _rotate(c, 11)
    b = (b ^ a) - _rotate(a, 25)
    c = (c ^ b) - _rotate(b, 16)
    a = (a ^ c) - _rotate(c, 4)
    b = (b ^ a) - _rotate(a, 14)
    return (c ^ b) - _rotate(b, 24)


# ---------------------------------------------------------------------------
# lossfns models
# ---------------------------------------------------------------------------


def to_saved_model(model: CrfsuiteModel, num_buckets: int = 6) -> model_file.SavedModel:
    """The lossfns model of a CRFsuite model (`Tagger.from_saved` decodes it):
    preset `feature_dicts`, whose attribute names are CRFsuite's, the
    attributes as the feature index (id for id), emission `[A, L]` the state
    weights (summed where an (attribute, label) repeats, as CRFsuite sums),
    the transitions, start weights 0 (CRFsuite has none), no pair features.
    Weights are float64 under `jax_enable_x64`, else float32."""
    L, A = len(model.labels), len(model.attributes)
    state = model.state_features
    emission = np.zeros((A, L))
    np.add.at(emission, (state.attributes, state.labels), state.weights)
    emission = jnp.asarray(emission)
    linear = LinearChainModel(
        emission,
        jnp.asarray(model.transitions, emission.dtype),
        jnp.zeros(L, emission.dtype),
        jnp.zeros((0, L, L), emission.dtype),
    )
    index = FeatureIndex(dict(zip(model.attributes, range(A))), {}, A, 0)
    return model_file.SavedModel(tuple(model.labels), extractor_from_spec(_FEATURE_DICTS), index, linear, num_buckets)


def from_saved_model(saved: model_file.SavedModel) -> CrfsuiteModel:
    """The CRFsuite model of a lossfns model, its non-zero weights only (as
    CRFsuite keeps them; attributes without one are left out). ValueError
    when CRFsuite cannot represent it: features other than the
    `feature_dicts` preset (CRFsuite's attributes are their names), a hashed
    index (no names), label-pair features, or non-zero start weights."""
    spec = extractor_spec(saved.features)
    if spec != _FEATURE_DICTS:
        raise ValueError(
            f"CRFsuite's attributes are feature-dict names: only preset 'feature_dicts' models convert, got {spec}"
        )
    index, model = saved.index, saved.model
    if index.hashed or index.unigram is None:
        raise ValueError("a hashed feature index keeps no attribute names for CRFsuite's attribute database")
    if model.pair_emission.shape[0]:
        raise ValueError(f"CRFsuite has no label-pair features; the model has {model.pair_emission.shape[0]}")
    start = np.asarray(model.start)
    if np.any(start != 0):
        raise ValueError(
            f"CRFsuite has no start weights; the model's are non-zero ({np.count_nonzero(start)} of {start.size})"
        )
    emission = np.asarray(model.emission, np.float64)
    rows, labels = np.nonzero(emission)
    kept = np.unique(rows)
    names = sorted(index.unigram, key=index.unigram.__getitem__)
    return CrfsuiteModel(
        tuple(saved.labels),
        tuple(names[i] for i in kept.tolist()),
        StateFeatures(np.searchsorted(kept, rows).astype(np.int32), labels.astype(np.int32), emission[rows, labels]),
        np.asarray(model.transitions, np.float64),
    )
