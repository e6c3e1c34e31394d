"""The tagger's model file: labels, feature extractor, feature index and
the non-zero weights of a `LinearChainModel` in one self-checking file.

A JSON header (format version, labels, extractor, the vocabulary of the features
with a non-zero weight, what the model reads of each token, dtypes and shapes, a
SHA-256) and the arrays' raw bytes, framed and written atomically as
`lossfns.checkpoint` writes checkpoints. Only what decoding reads is kept, and a
loaded model decodes identically; reading refuses (`checkpoint.ModelFileError`,
naming the file) anything that is not such a file, before reading the rest.
Design notes: docs/internals.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import checkpoint
from .features.corpus import Extractor, extractor_from_spec, extractor_spec
from .features.index import FeatureIndex
from .features.presets import Preset
from .features.templates import Macro, Templates
from .models.linear_chain import LinearChainModel

MAGIC = b"LOSSFNS-TAGGER\n"
"""The bytes every model file starts with."""
MODEL_FORMAT = 3  # 1: no checksum (refused); 2: dense tables (refused)
"""The model-file format this version writes and reads."""
MODEL_FILE = checkpoint.FileKind(
    MAGIC, "model file", "a lossfns tagger file", "format", MODEL_FORMAT, checkpoint.ModelFileError
)
"""How model files are framed, versioned and checked (`checkpoint.FileKind`)."""


COLUMNS = "columns"
"""`reads(...)["tokens"]` of a model that reads token rows of columns (column files: `lossfns label`)."""
FEATURE_DICTS = "feature dicts"
"""`reads(...)["tokens"]` of a model that reads a feature dict per token (`lossfns.sklearn.CRF`)."""
# The columns each preset reads of a token row (the word first; the others read the word alone).
_PRESET_COLUMNS = {"crfsuite_ner": 2}


def reads(features: Extractor) -> dict:
    """What a model with the extractor `features` reads of each token, as its
    file records it: `{"tokens": "feature dicts"}` (sklearn-crfsuite's
    items: preset `feature_dicts`, `lossfns.sklearn.CRF`) or `{"tokens":
    "columns", "columns": n}` (rows of at least `n` columns, the word first)."""
    if isinstance(features, Preset) and features.name == "feature_dicts":
        return {"tokens": FEATURE_DICTS}
    if isinstance(features, Templates):
        return {"tokens": COLUMNS, "columns": _template_columns(features)}
    return {"tokens": COLUMNS, "columns": _PRESET_COLUMNS.get(features.name, 1)}


def _template_columns(templates: Templates) -> int:
    """The columns a token row needs for `templates`: one past the highest a
    macro reads (`%x[*c,col]` also reads its row offset from column `c`)."""
    macros = [part for template in templates.unigram + templates.pair for part in template.parts]
    read = [max(m.column, m.row if m.mode == "*" else 0) for m in macros if isinstance(m, Macro)]
    return 1 + max(read, default=0)


class SavedModel(NamedTuple):
    """What a model file holds: labels `[L]`, the feature extractor, the
    feature index, the model, and the number of length buckets for decoding."""

    labels: tuple
    features: Extractor
    index: FeatureIndex
    model: LinearChainModel
    num_buckets: int


def save(path, saved: SavedModel) -> None:
    """Write `saved` to `path` atomically: a save that fails or is killed
    leaves the previous file at `path` as it was."""
    checkpoint.write_atomically(path, to_bytes(saved))


def _label_dtype(num_labels: int):
    return np.uint8 if num_labels <= 256 else np.int32


def _arrays(saved: SavedModel) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`(kept rows [K'] of the emission table, {name: array})` of the non-zero weights."""
    model = saved.model
    emission = np.asarray(model.emission)
    rows = np.flatnonzero(np.any(emission != 0, axis=1))
    kept = emission[rows]
    row_of, labels = np.nonzero(kept)
    arrays = {
        "emission_indptr": np.searchsorted(row_of, np.arange(rows.size + 1)).astype(np.int32),
        "emission_labels": labels.astype(_label_dtype(emission.shape[1])),
        "emission_weights": kept[row_of, labels],
        "transitions": np.asarray(model.transitions),
        "start": np.asarray(model.start),
    }
    pair = np.asarray(model.pair_emission).ravel()
    arrays["pair_index"] = np.flatnonzero(pair).astype(np.int64)
    arrays["pair_weights"] = pair[arrays["pair_index"]]
    if model.pair_mask is not None:
        arrays["pair_mask_index"] = np.flatnonzero(np.asarray(model.pair_mask)).astype(np.int64)
    if saved.index.hashed:
        arrays["rows"] = rows.astype(np.int64)
    return rows, arrays


def to_bytes(saved: SavedModel) -> bytes:
    """The bytes `save` writes (e.g. to pickle a model or measure its size)."""
    index, model = saved.index, saved.model
    rows, arrays = _arrays(saved)
    vocabulary = None
    if not index.hashed:
        unigram, pair = index.unigram, index.pair
        assert unigram is not None and pair is not None  # an index that is not hashed has its tables
        names = sorted(unigram, key=unigram.__getitem__)
        vocabulary = {"unigram": [names[i] for i in rows.tolist()], "pair": sorted(pair, key=pair.__getitem__)}
    header = {
        "labels": list(saved.labels),
        "features": extractor_spec(saved.features),
        "reads": reads(saved.features),
        "num_unigram": index.num_unigram if index.hashed else int(rows.size),
        "num_pair": index.num_pair,
        "hashed": index.hashed,
        "vocabulary": vocabulary,
        "dtype": str(jnp.dtype(model.emission.dtype)),
        "pair_masked": model.pair_mask is not None,
        "num_buckets": saved.num_buckets,
        "arrays": [[name, array.dtype.newbyteorder("<").str, list(array.shape)] for name, array in arrays.items()],
    }
    payload = b"".join(
        np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes() for array in arrays.values()
    )
    return checkpoint.pack_file(MODEL_FILE, header, payload)


def load(path, *, reading: str | None = None) -> SavedModel:
    """Read a file written by `save` (non-zero weights bit-identical); see
    the module docstring for what is refused.

    reading: what the caller gives each token, `COLUMNS` (rows of a column
      file) or `FEATURE_DICTS`; a model that reads the other is refused
      (`ModelFileError` naming the file), where it would label garbage.
      None: either.
    """
    saved = _saved_model(*checkpoint.read_file(path, MODEL_FILE), path)
    if reading is not None:
        check_reads(saved, reading, path)
    return saved


def check_reads(saved: SavedModel, reading: str, path) -> None:
    """Refuse (`ModelFileError` naming `path`) a model whose tokens are not
    what the caller reads (`COLUMNS` or `FEATURE_DICTS`)."""
    if reading not in (COLUMNS, FEATURE_DICTS):
        raise ValueError(f"reading must be {COLUMNS!r} or {FEATURE_DICTS!r}, got {reading!r}")
    model_reads = reads(saved.features)["tokens"]
    if model_reads == reading:
        return
    if model_reads == FEATURE_DICTS:
        raise checkpoint.ModelFileError(
            f"model file {path} was trained on feature dicts (lossfns.sklearn.CRF): it reads a feature dict "
            "per token, not the columns of a column file; label with lossfns.sklearn.CRF(model_filename=...)"
        )
    raise checkpoint.ModelFileError(
        f"model file {path} reads the columns of a column file (a pattern or a column preset), not feature "
        "dicts; label with `lossfns label -m MODEL` or lossfns.tagger.Tagger.load"
    )


def from_bytes(data: bytes, path="<bytes>") -> SavedModel:
    """The model of `to_bytes`' bytes, checked as `load` checks a file
    (errors name `path`)."""
    return _saved_model(*checkpoint.unpack_file(Path(path), data, MODEL_FILE), path)


def _saved_model(header: dict, payload: bytes, path) -> SavedModel:
    """The model of a file's verified header and payload (errors name `path`)."""
    try:
        _check_header(header)
        features = extractor_from_spec(header["features"])
        _check_recorded_reads(header, features)
    except (KeyError, TypeError, ValueError) as error:
        raise checkpoint.ModelFileError(
            f"model file {path} has an invalid header: {type(error).__name__}: {error}"
        ) from None
    labels = tuple(header["labels"])
    K, K2, L, dtype = header["num_unigram"], header["num_pair"], len(labels), np.dtype(header["dtype"])
    described = f"the header describes {K} features x {L} labels, {K2} pair features, {header['dtype']}"
    try:
        arrays = _read_arrays(header["arrays"], payload)
        model = _model(arrays, header, K, K2, L, dtype)
    except ValueError as error:
        raise checkpoint.ModelFileError(
            f"model file {path}: header does not match its weights: {described}; {error}"
        ) from None
    if header["hashed"]:
        index = FeatureIndex.hashed_index(K, K2)
    else:
        vocabulary = header["vocabulary"]
        index = FeatureIndex(
            dict(zip(vocabulary["unigram"], range(K))), dict(zip(vocabulary["pair"], range(K2))), K, K2
        )
    return SavedModel(labels, features, index, model, header["num_buckets"])


def _read_arrays(described: list, payload: bytes) -> dict:
    """The arrays `[[name, dtype, shape]]` describes, read from `payload`."""
    counts = [int(np.prod(shape, dtype=np.int64)) for _, _, shape in described]
    offsets = np.cumsum([0] + [count * np.dtype(dtype).itemsize for count, (_, dtype, _) in zip(counts, described)])
    if offsets[-1] != len(payload):
        raise ValueError(
            f"the arrays it lists take {offsets[-1]} bytes of weights, the file holds {len(payload)} bytes"
        )
    return {
        name: np.frombuffer(payload, np.dtype(dtype), count, int(offset)).reshape(shape)
        for (name, dtype, shape), count, offset in zip(described, counts, offsets)
    }


def _model(arrays: dict, header: dict, K: int, K2: int, L: int, dtype) -> LinearChainModel:
    """The `LinearChainModel` of the stored arrays, every index checked in range."""

    def check(name, shape=None, kind=None, bound=None):
        array = arrays[name]
        if (shape is not None and array.shape != shape) or (kind is not None and array.dtype.kind != kind):
            raise ValueError(f"{name} has shape {array.shape} and dtype {array.dtype}")
        if bound is not None and array.size and (array.min() < 0 or array.max() >= bound):
            raise ValueError(f"{name} holds indices outside [0, {bound})")
        return array

    indptr = check("emission_indptr", kind="i")
    rows = check("rows", (indptr.size - 1,), "i", K) if header["hashed"] else np.arange(K)
    if indptr.size != rows.size + 1 or indptr[0] != 0 or np.any(np.diff(indptr) < 1):
        raise ValueError(f"emission_indptr does not describe {rows.size} non-empty rows")
    labels = check("emission_labels", (int(indptr[-1]),), kind="u" if L <= 256 else "i", bound=L)
    weights = check("emission_weights", (int(indptr[-1]),))
    emission = np.zeros((K, L), dtype)
    emission[np.repeat(rows, np.diff(indptr)), labels] = weights
    pair_index = check("pair_index", kind="i", bound=K2 * L * L)
    pair = np.zeros(K2 * L * L, dtype)
    pair[pair_index] = check("pair_weights", pair_index.shape)
    transitions, start = check("transitions", (L, L)), check("start", (L,))
    if any(a.dtype != dtype for a in (weights, transitions, start, arrays["pair_weights"])):
        raise ValueError(f"weights are not all {dtype}")
    # device_put, not jnp.asarray: that compiles a copy program per table shape (every model's differs).
    model = LinearChainModel(*jax.device_put((emission, transitions, start, pair.reshape(K2, L, L))))
    if header["pair_masked"]:
        mask = np.zeros(K2 * L * L, bool)
        mask[check("pair_mask_index", kind="i", bound=K2 * L * L)] = True
        model = model.with_pair_mask(mask.reshape(K2, L, L))
    return model


def _check_recorded_reads(header: dict, features: Extractor) -> None:
    """What the header says the model reads must be what its features read
    (files written before it was recorded have none: theirs is derived)."""
    recorded = header.get("reads")
    if recorded is not None and recorded != reads(features):
        raise ValueError(f"reads is {recorded!r}, but its features read {reads(features)!r}")


def _check_header(header: dict) -> None:
    """Raise ValueError/TypeError/KeyError when a header is not
    self-consistent (checked beyond the checksum: the header is also what
    builds the feature index the weights are read against)."""

    def count(name):
        value = header[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        return value

    labels = header["labels"]
    if not isinstance(labels, list) or not labels or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"labels must be a non-empty list of strings, got {labels!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels repeat a label: {labels!r}")
    num_unigram, num_pair = count("num_unigram"), count("num_pair")
    if count("num_buckets") < 1:
        raise ValueError(f"num_buckets must be an int >= 1, got {header['num_buckets']!r}")
    if not all(isinstance(header[flag], bool) for flag in ("hashed", "pair_masked")):
        raise ValueError(
            f"hashed and pair_masked must be true or false, got {header['hashed']!r}, {header['pair_masked']!r}"
        )
    described = header["arrays"]
    if not isinstance(described, list) or not all(
        isinstance(a, list)
        and len(a) == 3
        and isinstance(a[0], str)
        and isinstance(a[1], str)
        and isinstance(a[2], list)
        and all(isinstance(n, int) and n >= 0 for n in a[2])
        for a in described
    ):
        raise ValueError(f"arrays must be a list of [name, dtype, shape], got {described!r:.80}")
    names = [a[0] for a in described]
    required = (
        {"emission_indptr", "emission_labels", "emission_weights", "transitions", "start", "pair_index", "pair_weights"}
        | ({"pair_mask_index"} if header["pair_masked"] else set())
        | ({"rows"} if header["hashed"] else set())
    )
    if set(names) != required or len(names) != len(set(names)):
        raise ValueError(f"arrays must be {sorted(required)}, got {names}")
    for _, dtype, _ in described:
        np.dtype(dtype)
    if not jnp.issubdtype(jnp.dtype(header["dtype"]), jnp.floating):
        raise ValueError(f"dtype must be a floating-point dtype, got {header['dtype']!r}")
    if not isinstance(header["features"], dict):
        raise ValueError(f"features must be a preset or templates, got {header['features']!r}")
    if header["hashed"]:
        return
    vocabulary = header["vocabulary"]
    for name, size in (("unigram", num_unigram), ("pair", num_pair)):
        names = vocabulary[name]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"the {name} vocabulary must be a list of strings")
        if len(names) != size or len(set(names)) != size:
            raise ValueError(
                f"the {name} vocabulary has {len(names)} entries ({len(set(names))} distinct) for num_{name} = {size}"
            )
