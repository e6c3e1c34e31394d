"""The tagger's model file: labels, feature extractor, feature index and
weights of a `LinearChainModel` in one self-checking file.

Layout: a JSON header (format version, labels, feature extractor, feature
vocabulary, shapes, and a SHA-256 over header and weights) followed by the
weights written with `equinox.tree_serialise_leaves`, framed and written
atomically as `lossfns.checkpoint` writes checkpoints (`pack_file`,
`write_atomically`). Reading gives bit-identical weights, and refuses
(`checkpoint.ModelFileError`, naming the file) a missing file, a file of
another format version, a truncated or altered one, and a header that does
not describe its weights: nothing is loaded as garbage.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from . import checkpoint
from .features.corpus import Extractor, extractor_from_spec, extractor_spec
from .features.index import FeatureIndex
from .models.linear_chain import LinearChainModel

MAGIC = b"LOSSFNS-TAGGER\n"
MODEL_FORMAT = 2  # 1: no checksum, no payload size (refused)
MODEL_FILE = checkpoint.FileKind(MAGIC, "model file", "a lossfns tagger file", "format", MODEL_FORMAT,
                                 checkpoint.ModelFileError)


class SavedModel(NamedTuple):
    """What a model file holds: labels `[L]`, the feature extractor, the
    feature index, the model, and the number of length buckets for decoding."""

    labels: tuple
    features: Extractor
    index: FeatureIndex
    model: LinearChainModel
    num_buckets: int


def _serialised(model) -> bytes:
    """`equinox.tree_serialise_leaves` of `model`, as bytes."""
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, model)
    return buffer.getvalue()


def save(path, saved: SavedModel) -> None:
    """Write `saved` to `path` atomically: a save that fails or is killed
    leaves the previous file at `path` as it was."""
    checkpoint.write_atomically(path, to_bytes(saved))


def to_bytes(saved: SavedModel) -> bytes:
    """The bytes `save` writes (e.g. to pickle a model or measure its size)."""
    index, model = saved.index, saved.model
    vocabulary = None
    if not index.hashed:
        vocabulary = {"unigram": sorted(index.unigram, key=index.unigram.get),
                      "pair": sorted(index.pair, key=index.pair.get)}
    header = {"labels": list(saved.labels), "features": extractor_spec(saved.features),
              "num_unigram": index.num_unigram, "num_pair": index.num_pair, "hashed": index.hashed,
              "vocabulary": vocabulary, "dtype": str(jnp.dtype(model.emission.dtype)),
              "masked": model.emission_mask is not None, "pair_masked": model.pair_mask is not None,
              "num_buckets": saved.num_buckets}
    return checkpoint.pack_file(MODEL_FILE, header, _serialised(model))


def load(path) -> SavedModel:
    """Read a file written by `save` (weights bit-identical); see the module
    docstring for what is refused."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise checkpoint.ModelFileError(f"model file {path} does not exist") from None
    return from_bytes(data, path)


def from_bytes(data: bytes, path="<bytes>") -> SavedModel:
    """The model of `to_bytes`' bytes, checked as `load` checks a file
    (errors name `path`)."""
    header, payload = checkpoint.unpack_file(Path(path), data, MODEL_FILE)
    try:
        _check_header(header)
        features = extractor_from_spec(header["features"])
    except (KeyError, TypeError, ValueError) as error:
        raise checkpoint.ModelFileError(f"model file {path} has an invalid header: "
                                        f"{type(error).__name__}: {error}") from None
    labels = tuple(header["labels"])
    if header["hashed"]:
        index = FeatureIndex.hashed_index(header["num_unigram"], header["num_pair"])
    else:
        vocabulary = header["vocabulary"]
        index = FeatureIndex({name: i for i, name in enumerate(vocabulary["unigram"])},
                             {name: i for i, name in enumerate(vocabulary["pair"])},
                             header["num_unigram"], header["num_pair"])
    K, L = header["num_unigram"], len(labels)
    like = LinearChainModel.zeros(K, L, header["num_pair"], dtype=jnp.dtype(header["dtype"]),
                                  emission_mask=np.zeros((K, L), bool) if header["masked"] else None)
    if header.get("pair_masked", False):
        like = like.with_pair_mask(np.zeros((header["num_pair"], L, L), bool))
    described = (f"the header describes {K} features x {L} labels, {header['num_pair']} pair features, "
                 f"{header['dtype']}{', masked' if header['masked'] else ''}")
    expected = len(_serialised(like))
    if len(payload) != expected:
        raise checkpoint.ModelFileError(f"model file {path}: header does not match its weights: {described} "
                                        f"({expected} bytes of weights), the file holds {len(payload)} bytes")
    try:
        model = eqx.tree_deserialise_leaves(io.BytesIO(payload), like)
        matches = _serialised(model) == payload
    except Exception as error:  # numpy / equinox errors on weights that are not what the header says
        raise checkpoint.ModelFileError(f"model file {path}: header does not match its weights: {described}; "
                                        f"reading them failed ({type(error).__name__}: {error})") from None
    if not matches:
        raise checkpoint.ModelFileError(f"model file {path}: header does not match its weights: {described}, "
                                        "but the stored arrays have other shapes, dtypes or memory order")
    if model.pair_mask is not None:  # the sparse support is derived from the mask
        model = model.with_pair_mask(np.asarray(model.pair_mask))
    return SavedModel(labels, features, index, model, header["num_buckets"])


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
    if not all(isinstance(header.get(flag, False), bool) for flag in ("hashed", "masked", "pair_masked")):
        raise ValueError(f"hashed, masked and pair_masked must be true or false, got {header['hashed']!r}, "
                         f"{header['masked']!r}, {header.get('pair_masked')!r}")
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
            raise ValueError(f"the {name} vocabulary has {len(names)} entries ({len(set(names))} distinct) "
                             f"for num_{name} = {size}")
