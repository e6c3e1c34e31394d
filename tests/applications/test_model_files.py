"""Model files and checkpoint directories: no silent wrong answer.

`Tagger.save` files carry a format version and a SHA-256 over header and
weights and are written atomically: bit flips, truncation, a foreign format
version, and the weights of one model under another's header are refused
with a `ModelFileError` naming the file; a save that fails or is killed
leaves the previous file intact. One training run writes to a checkpoint
directory at a time (`checkpoint.DirectoryLock`): a second one, in another
process or through another open lock in this one, gets a `CheckpointError`
naming the directory; taking the lock removes the temporary files of killed
saves; pruning tolerates files that vanish.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import checkpoint, optimizers
from lossfns.checkpoint import CheckpointError, DirectoryLock, ModelFileError
from lossfns.corpora import Sentence
from lossfns.model_file import MAGIC, MODEL_FILE
from lossfns.tagger import Tagger

ROOT = Path(__file__).resolve().parents[2]

CORPUS_A = [
    Sentence((("El", "DA"), ("rey", "NC"), ("Juan", "NP"), ("Carlos", "NP")), ("O", "O", "B-PER", "I-PER")),
    Sentence((("Madrid", "NP"), ("es", "VS"), ("grande", "AQ")), ("B-LOC", "O", "O")),
    Sentence((("Ana", "NP"), ("vive", "VM"), ("en", "SP"), ("Roma", "NP")), ("B-PER", "O", "O", "B-LOC")),
]
CORPUS_B = [
    Sentence((("Paris", "NP"), ("brilla", "VM")), ("B-LOC", "O")),
    Sentence((("Luis", "NP"), ("come", "VM")), ("B-PER", "O")),
]


def _tagger(max_iterations=4):
    return Tagger("crfsuite_ner", l2=1.0, max_iterations=max_iterations, num_buckets=1, progress=False)


def _train(corpus):
    return _tagger().fit(corpus)


@pytest.fixture(scope="module")
def taggers():
    return _train(CORPUS_A), _train(CORPUS_B)


@pytest.fixture
def saved(tmp_path, taggers):
    path = tmp_path / "a.tagger"
    taggers[0].save(path)
    return path, path.read_bytes()


def _split(data: bytes):
    """`(header dict, weights bytes)` of a model file's bytes (format checked by the tests themselves)."""
    start = len(MAGIC) + 8
    size = int.from_bytes(data[len(MAGIC) : start], "little")
    return json.loads(data[start : start + size]), data[start + size :]


def _repack(header: dict, weights: bytes) -> bytes:
    """A model file with a *valid* checksum over `header` and `weights`: what
    a buggy writer could produce; only the structural checks can refuse it."""
    body = {key: value for key, value in header.items() if key not in ("sha256", "payload_bytes", "format")}
    return checkpoint.pack_file(MODEL_FILE, body, weights)


def _assert_refused(path, *words):
    with pytest.raises(ModelFileError) as error:
        Tagger.load(path)
    message = str(error.value)
    assert str(path) in message, message
    for word in words:
        assert word in message, message
    return message


# ---------------------------------------------------------------------------
# Tagger model files
# ---------------------------------------------------------------------------


def _nonzero_weights(tagger):
    """`{(feature string, label): weight}` of the non-zero emission weights, and the other tables."""
    names = sorted(tagger.index.unigram, key=tagger.index.unigram.get)
    emission = np.asarray(tagger.model.emission)
    emission_weights = {(names[i], tagger.labels[j]): emission[i, j].tobytes() for i, j in zip(*np.nonzero(emission))}
    rest = [
        np.asarray(leaf).tobytes()
        for leaf in (tagger.model.transitions, tagger.model.start, tagger.model.pair_emission)
    ]
    return emission_weights, rest


def test_round_trip_keeps_every_nonzero_weight_and_is_versioned(saved, taggers):
    path, data = saved
    loaded = Tagger.load(path)
    assert _nonzero_weights(loaded) == _nonzero_weights(taggers[0])
    assert loaded.model.emission.dtype == taggers[0].model.emission.dtype
    assert loaded.labels == taggers[0].labels and loaded.index.num_unigram <= taggers[0].index.num_unigram
    assert loaded.predict(CORPUS_A + CORPUS_B) == taggers[0].predict(CORPUS_A + CORPUS_B)
    np.testing.assert_array_equal(
        np.concatenate(loaded.predict_marginals(CORPUS_A)), np.concatenate(taggers[0].predict_marginals(CORPUS_A))
    )
    header, weights = _split(data)
    assert header["format"] == 3 and header["payload_bytes"] == len(weights) and len(header["sha256"]) == 64
    assert issubclass(ModelFileError, ValueError)


def test_features_whose_weights_are_all_zero_are_left_out(tmp_path):
    """L1 training zeroes most features: the file keeps only the others (and loads them as they were)."""
    tagger = Tagger("crfsuite_ner", l1=1.0, l2=0.1, max_iterations=15, num_buckets=1, progress=False).fit(CORPUS_A)
    emission = np.asarray(tagger.model.emission)
    zero_rows = int(np.sum(~np.any(emission != 0, axis=1)))
    assert zero_rows > 0
    path = tmp_path / "sparse.tagger"
    tagger.save(path)
    loaded = Tagger.load(path)
    assert loaded.index.num_unigram == tagger.index.num_unigram - zero_rows
    assert _nonzero_weights(loaded) == _nonzero_weights(tagger)
    assert loaded.predict(CORPUS_A + CORPUS_B) == tagger.predict(CORPUS_A + CORPUS_B)


def test_a_flipped_bit_in_the_feature_vocabulary_is_refused(saved, tmp_path):
    path, data = saved
    # Flipping 0x01 of 'madrid' gives 'madrie': a feature of another word, same JSON length.
    at = data.index(b"word.lower()=madrid") + len("word.lower()=madri")
    damaged = bytearray(data)
    damaged[at] ^= 0x01
    path.write_bytes(bytes(damaged))
    _assert_refused(path, "corrupted", "SHA-256")


def test_every_byte_flip_is_refused(saved):
    path, data = saved
    for index in range(len(data)):
        damaged = bytearray(data)
        damaged[index] ^= 0x10
        path.write_bytes(bytes(damaged))
        _assert_refused(path)


def test_truncated_files_are_refused(saved):
    path, data = saved
    for size in range(len(data)):
        path.write_bytes(data[:size])
        _assert_refused(path)
    for size in (3, len(MAGIC) + 4, len(MAGIC) + 40, len(data) - 1):
        path.write_bytes(data[:size])
        _assert_refused(path, "truncated")
    path.write_bytes(data + b"\0")
    _assert_refused(path, "unexpected bytes")
    _assert_refused(path.with_name("missing.tagger"), "does not exist")


@pytest.mark.parametrize("version", [99, 1, 2, None, "3"])
def test_unknown_format_versions_are_refused(saved, version):
    path, data = saved
    header, weights = _split(data)
    body = dict(header, format=version)
    del body["sha256"]
    if version is None:
        del body["format"]
    # A correct checksum for the altered header: only the version check can refuse it.
    header_bytes = json.dumps(dict(body, sha256=checkpoint._digest(body, weights)), sort_keys=True).encode()
    path.write_bytes(MAGIC + len(header_bytes).to_bytes(8, "little") + header_bytes + weights)
    _assert_refused(path, f"format version {version!r}", "reads version 3")


def test_a_file_of_the_old_unchecked_format_is_refused(tmp_path, taggers):
    """What the format-1 `save` wrote: a header without checksum, then the weights."""
    tagger = taggers[0]
    header = {
        "format": 1,
        "labels": list(tagger.labels),
        "features": {"preset": "crfsuite_ner"},
        "num_unigram": tagger.index.num_unigram,
        "num_pair": tagger.index.num_pair,
        "hashed": False,
        "vocabulary": None,
        "dtype": "float64",
        "masked": True,
        "num_buckets": 1,
    }
    encoded = json.dumps(header).encode()
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, tagger.model)
    path = tmp_path / "old.tagger"
    path.write_bytes(MAGIC + len(encoded).to_bytes(8, "little") + encoded + buffer.getvalue())
    _assert_refused(path, "format version 1")


def test_weights_of_one_model_under_the_header_of_another_are_refused(tmp_path, taggers):
    a, b = tmp_path / "a.tagger", tmp_path / "b.tagger"
    taggers[0].save(a)
    taggers[1].save(b)
    header_a, _ = _split(a.read_bytes())
    header_b, weights_b = _split(b.read_bytes())
    assert header_a["num_unigram"] != header_b["num_unigram"]
    swapped = tmp_path / "swapped.tagger"
    # Spliced bytes: the checksum no longer matches.
    start = len(MAGIC) + 8
    size = int.from_bytes(a.read_bytes()[len(MAGIC) : start], "little")
    swapped.write_bytes(a.read_bytes()[: start + size] + weights_b)
    _assert_refused(swapped)
    # A consistent checksum over a header that does not describe the weights.
    swapped.write_bytes(_repack(header_a, weights_b))
    _assert_refused(
        swapped, "header does not match its weights", f"{header_a['num_unigram']} features", "bytes of weights"
    )


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda arrays: arrays[0][2].__setitem__(0, arrays[0][2][0] - 1), ["bytes of weights"]),  # [K'+1] read as [K']
        (lambda arrays: arrays.reverse(), []),  # the same bytes read in another order
        (lambda arrays: arrays[1].__setitem__(1, "<i1"), ["emission_labels", "dtype"]),
    ],
)
def test_arrays_the_header_describes_otherwise_are_refused(saved, change, words):
    """A consistent checksum over a header whose array list does not
    describe the stored bytes (what a buggy writer could produce)."""
    path, data = saved
    header, weights = _split(data)
    change(header["arrays"])
    path.write_bytes(_repack(header, weights))
    _assert_refused(path, "header does not match its weights", *words)


def test_indices_out_of_range_are_refused(saved):
    path, data = saved
    header, weights = _split(data)
    header["labels"] = header["labels"][:-1]  # stored label ids now reach past the labels
    path.write_bytes(_repack(header, weights))
    _assert_refused(path, "header does not match its weights")


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("vocabulary", {"unigram": ["x"], "pair": []}, ["invalid header", "unigram vocabulary has 1 entries"]),
        ("labels", ["O", "O", "B-PER", "I-PER", "B-LOC"], ["invalid header", "repeat"]),
        ("num_unigram", -1, ["invalid header", "num_unigram"]),
        ("dtype", "int32", ["invalid header", "floating"]),
        ("arrays", [["start", "<f8", [2]]], ["invalid header", "arrays must be"]),
        ("features", {"preset": "no_such_preset"}, ["invalid header", "no_such_preset"]),
    ],
)
def test_inconsistent_headers_are_refused(saved, field, value, words):
    path, data = saved
    header, weights = _split(data)
    header[field] = value
    path.write_bytes(_repack(header, weights))
    _assert_refused(path, *words)
    header.pop(field)
    path.write_bytes(_repack(header, weights))
    _assert_refused(path, "invalid header", "KeyError")


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_save_keeps_the_previous_model(saved, taggers, monkeypatch, failing):
    path, data = saved

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.os, failing, crash)
    with pytest.raises(OSError, match="disk full"):
        taggers[1].save(path)
    monkeypatch.undo()
    assert path.read_bytes() == data
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert Tagger.load(path).labels == taggers[0].labels


KILLED_SAVE = """
import os, signal, sys
from lossfns import checkpoint
from lossfns.tagger import Tagger
from lossfns.corpora import Sentence
tagger = Tagger.load(sys.argv[1])
tagger.labels = tagger.labels[::-1]  # another model, same shapes
real_fsync = os.fsync
def die(fd):
    # The temporary file is complete but not yet renamed: the worst moment.
    print("killing", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
checkpoint.os.fsync = die
tagger.save(sys.argv[1])
print("not killed", flush=True)
"""


def _python(code, *arguments, **popen):
    environment = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, arguments)], env=environment, cwd=ROOT, **popen
    )


def test_a_save_killed_mid_write_keeps_the_previous_model(saved, taggers):
    path, data = saved
    process = _python(KILLED_SAVE, path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=120)
    assert process.returncode == -signal.SIGKILL, (out, err)
    assert out.strip() == "killing"
    assert path.read_bytes() == data
    leftovers = [p for p in path.parent.iterdir() if p.name != path.name]
    assert len(leftovers) == 1 and leftovers[0].name.endswith(".tmp")  # the orphan of the killed save
    assert Tagger.load(path).labels == taggers[0].labels


# ---------------------------------------------------------------------------
# One writer per checkpoint directory
# ---------------------------------------------------------------------------


def test_a_second_lock_on_a_directory_is_refused_naming_it(tmp_path):
    directory = tmp_path / "run"
    with DirectoryLock(directory) as lock:
        assert directory.is_dir() and lock.path.exists()
        # flock locks belong to open file descriptions: a second open lock conflicts, even in this process.
        with pytest.raises(CheckpointError) as error:
            DirectoryLock(directory).acquire()
        message = str(error.value)
        assert str(directory) in message and "in use by another training run" in message
        assert f"process {os.getpid()}" in message
    # Released on leaving the `with` (the lock objects stay referenced: no help from garbage collection).
    DirectoryLock(directory).acquire().release()
    failing = DirectoryLock(directory)
    with pytest.raises(ZeroDivisionError), failing:
        raise ZeroDivisionError
    DirectoryLock(directory).acquire().release()  # released on an exception too
    assert lock.path.read_text() == str(os.getpid())


def test_tagger_fit_refuses_a_directory_in_use(tmp_path):
    directory = tmp_path / "ckpt"
    with DirectoryLock(directory):
        with pytest.raises(CheckpointError, match=f"checkpoint directory {directory} is in use"):
            _tagger(2).fit(CORPUS_B, checkpoint_dir=directory)
        assert not list(directory.glob("checkpoint-*"))
    # Free again: the run goes ahead, and leaves the lock free when it ends.
    _tagger(2).fit(CORPUS_B, checkpoint_dir=directory)
    assert len(list(directory.glob("checkpoint-*.ckpt"))) == 1
    DirectoryLock(directory).acquire().release()


def test_minimize_drive_refuses_a_directory_in_use(tmp_path):
    directory = tmp_path / "drive"

    def step_fn(inner, step):  # gradient descent on (x - 3)^2
        return inner - 0.2 * (inner - 3.0), jnp.sum((inner - 3.0) ** 2)

    stop = optimizers.relative_change_below(0.0)
    loop = optimizers.init_loop(jnp.zeros(2), 6)
    with DirectoryLock(directory), pytest.raises(CheckpointError, match=f"checkpoint directory {directory} is in use"):
        optimizers.drive(lambda _: step_fn, loop, stop=stop, chunk_steps=2, checkpoint_dir=directory, progress=False)
    assert not list(directory.glob("checkpoint-*"))
    done = optimizers.drive(
        lambda _: step_fn, loop, stop=stop, chunk_steps=2, checkpoint_dir=directory, keep=2, progress=False
    ).state
    assert int(done.step) == 6 and len(list(directory.glob("checkpoint-*.ckpt"))) == 2
    DirectoryLock(directory).acquire().release()  # released when drive returns


HOLDER = """
import sys, time
from lossfns.checkpoint import DirectoryLock
with DirectoryLock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.readline()  # hold the lock until the test closes stdin
"""


def test_a_second_process_on_a_checkpoint_directory_gets_a_clear_error(tmp_path):
    directory = tmp_path / "shared"
    holder = _python(HOLDER, directory, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointError) as error:
            _tagger(2).fit(CORPUS_B, checkpoint_dir=directory)
        assert str(directory) in str(error.value) and f"process {holder.pid}" in str(error.value)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    _tagger(2).fit(CORPUS_B, checkpoint_dir=directory)  # free once the holder is gone


def test_a_killed_holder_releases_the_lock(tmp_path):
    directory = tmp_path / "killed"
    holder = _python(HOLDER, directory, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointError):
            DirectoryLock(directory).acquire()
    finally:
        holder.kill()
        holder.wait(timeout=60)
    DirectoryLock(directory).acquire().release()


def test_taking_the_lock_removes_orphaned_temporaries_only(tmp_path):
    checkpoint.save(checkpoint.checkpoint_path(tmp_path, 3), {"w": jnp.zeros(2)})
    orphan = tmp_path / f".{checkpoint.checkpoint_path(tmp_path, 4).name}.k2j3_x.tmp"
    orphan.write_bytes(b"LOSSFNS-CHECK")
    unrelated = [tmp_path / "notes.tmp", tmp_path / ".model.tagger.abc.tmp", tmp_path / "checkpoint-5.ckpt.tmp"]
    for path in unrelated:
        path.write_bytes(b"keep")
    with DirectoryLock(tmp_path):
        assert not orphan.exists()
        assert all(path.exists() for path in unrelated)
        assert checkpoint.latest_checkpoint(tmp_path) == checkpoint.checkpoint_path(tmp_path, 3)


def test_prune_tolerates_vanished_files_and_directories(tmp_path, monkeypatch):
    for step in (1, 2, 3):
        checkpoint.save(checkpoint.checkpoint_path(tmp_path, step), {"w": jnp.zeros(2)})
    listing = checkpoint._numbered(tmp_path)
    checkpoint.checkpoint_path(tmp_path, 1).unlink()  # another process pruned it after our listing
    monkeypatch.setattr(checkpoint, "_numbered", lambda directory: listing)
    checkpoint.prune_checkpoints(tmp_path, keep=1)
    monkeypatch.undo()
    assert [p.name for p in sorted(tmp_path.glob("checkpoint-*"))] == [checkpoint.checkpoint_path(tmp_path, 3).name]
    checkpoint.prune_checkpoints(tmp_path / "gone", keep=1)


def test_a_header_whose_reads_contradict_its_features_is_refused(saved):
    path, data = saved
    header, weights = _split(data)
    assert header["reads"] == {"tokens": "columns", "columns": 2}  # preset crfsuite_ner: (word, POS) rows
    header["reads"] = {"tokens": "columns", "columns": 9}
    path.write_bytes(_repack(header, weights))
    _assert_refused(path, "invalid header", "reads")


def test_a_file_written_before_reads_was_recorded_still_loads(saved, taggers):
    path, data = saved
    header, weights = _split(data)
    del header["reads"]
    path.write_bytes(_repack(header, weights))
    assert Tagger.load(path).predict(CORPUS_A) == taggers[0].predict(CORPUS_A)
