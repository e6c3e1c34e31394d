"""Checkpoints: exact round trips, detection of truncated and corrupted files,
atomic saves, and a training run killed with SIGKILL that resumes to
parameters bit-identical to an uninterrupted run.

Run as a script (`python tests/test_checkpoint.py DIRECTORY OUT --seed S`),
this file is the small resumable training loop (plain optax.adam on a toy
chain CRF) that the kill test runs in a subprocess; tests/test_determinism.py
imports the same loop.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lossfns import checkpoint
from lossfns.lattices import chain
from lossfns.lattices.chain import FactoredPotentials

SCRIPT = Path(__file__).resolve()

# ---------------------------------------------------------------------------
# The resumable training loop (runs in a subprocess, float32, no x64)
# ---------------------------------------------------------------------------

NUM_SENTENCES, NUM_POSITIONS, VOCABULARY, NUM_LABELS, BATCH = 12, 6, 10, 3, 4
OPTIMIZER = optax.adam(0.1)


def _data(seed):
    """A fixed toy tagging set: tokens/labels `[N, T]`, lengths `[N]` (0 and T included)."""
    tokens_key, labels_key, lengths_key = jax.random.split(jax.random.key(seed), 3)
    tokens = jax.random.randint(tokens_key, (NUM_SENTENCES, NUM_POSITIONS), 0, VOCABULARY)
    labels = jax.random.randint(labels_key, (NUM_SENTENCES, NUM_POSITIONS), 0, NUM_LABELS)
    lengths = jax.random.randint(lengths_key, (NUM_SENTENCES,), 0, NUM_POSITIONS + 1)
    return tokens, labels, lengths.at[0].set(NUM_POSITIONS).at[1].set(0)


def _initial_state(seed):
    """Everything a resume needs: parameters, optimizer state, RNG key, data position."""
    init_key, shuffle_key = jax.random.split(jax.random.key(seed + 1))
    emission_key, transition_key = jax.random.split(init_key)
    params = {
        "emissions": 0.1 * jax.random.normal(emission_key, (VOCABULARY, NUM_LABELS)),
        "transitions": 0.1 * jax.random.normal(transition_key, (NUM_LABELS, NUM_LABELS)),
        "start": jnp.zeros((NUM_LABELS,)),
    }
    order_key, key = jax.random.split(shuffle_key)
    return {
        "params": params,
        "opt_state": OPTIMIZER.init(params),
        "key": key,
        "order": jax.random.permutation(order_key, NUM_SENTENCES),
        "position": jnp.zeros((), jnp.int32),
        "step": jnp.zeros((), jnp.int32),
    }


def _loss(params, tokens, labels, lengths):
    potentials = FactoredPotentials(params["emissions"][tokens], params["transitions"], params["start"])
    negative_log_likelihood = chain.log_partition(potentials, lengths) - chain.score(potentials, labels, lengths)
    return jnp.mean(negative_log_likelihood)


@jax.jit
def _setup(seed):
    """`(data, initial state)` for a seed; one compiled program."""
    return _data(seed), _initial_state(seed)


@jax.jit
def _training_step(data, state):
    """One adam step on the next batch; reshuffles from the carried key at the
    end of an epoch. Pure: the whole run is a function of the seed."""
    tokens, labels, lengths = data
    batch = jax.lax.dynamic_slice(state["order"], (state["position"],), (BATCH,))
    grads = jax.grad(_loss)(state["params"], tokens[batch], labels[batch], lengths[batch])
    updates, opt_state = OPTIMIZER.update(grads, state["opt_state"], state["params"])
    state = dict(
        state,
        params=optax.apply_updates(state["params"], updates),
        opt_state=opt_state,
        position=state["position"] + BATCH,
        step=state["step"] + 1,
    )

    def reshuffle(state):
        key, order_key = jax.random.split(state["key"])
        return dict(
            state, key=key, order=jax.random.permutation(order_key, NUM_SENTENCES), position=jnp.zeros((), jnp.int32)
        )

    return jax.lax.cond(state["position"] >= NUM_SENTENCES, reshuffle, lambda state: state, state)


def train(directory, out, *, seed, steps, every):
    """Train `steps` adam steps, checkpointing every `every`; resume from the
    latest checkpoint in `directory`; save the final state to `out`."""
    data, state = _setup(seed)
    latest = checkpoint.latest_checkpoint(directory)
    if latest is not None:
        state = checkpoint.load(latest, like=state)
        print(f"resumed {int(state['step'])}", flush=True)
    while int(state["step"]) < steps:
        state = _training_step(data, state)
        if int(state["step"]) % every == 0:
            checkpoint.save(checkpoint.checkpoint_path(directory, int(state["step"])), state)
            checkpoint.prune_checkpoints(directory, keep=2)
        print(f"step {int(state['step'])}", flush=True)
    checkpoint.save(out, state)


def training_command(directory, out, seed, steps=30, every=4):
    return [
        sys.executable,
        str(SCRIPT),
        str(directory),
        str(out),
        "--seed",
        str(seed),
        "--steps",
        str(steps),
        "--every",
        str(every),
    ]


def _main():
    parser = argparse.ArgumentParser(description="resumable toy CRF training (for the checkpoint tests)")
    parser.add_argument("directory")
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=4)
    arguments = parser.parse_args()
    Path(arguments.directory).mkdir(parents=True, exist_ok=True)
    train(arguments.directory, arguments.out, seed=arguments.seed, steps=arguments.steps, every=arguments.every)


def _environment():
    """Subprocess environment: CPU and float32, as the loop is written for."""
    return dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="0")


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


def _example_tree():
    params = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "b": jnp.array([1.5, -jnp.inf], jnp.float64)}
    return {
        "params": params,
        "opt_state": optax.adam(1e-3).init(params),
        "key": jax.random.key(7),
        "raw_key": jax.random.PRNGKey(3),
        "position": 11,
        "scale": 0.25,
        "numpy": np.arange(4, dtype=np.int16),
        "half": jnp.array([1.0, 2.5, -3.0], jnp.bfloat16),
        "empty": jnp.zeros((0, 3), jnp.float32),
        "scalar": jnp.array(3, jnp.int32),
        "transposed": jnp.arange(6.0).reshape(2, 3).T,
    }


def _assert_bit_identical(got, want):
    got_leaves, got_def = jax.tree_util.tree_flatten(got)
    want_leaves, want_def = jax.tree_util.tree_flatten(want)
    assert got_def == want_def
    for path_and_leaf, g, w in zip(jax.tree_util.tree_leaves_with_path(want), got_leaves, want_leaves):
        where = jax.tree_util.keystr(path_and_leaf[0])
        assert type(g) is type(w) or (isinstance(g, jax.Array) and isinstance(w, jax.Array)), where
        if hasattr(w, "dtype") and jnp.issubdtype(w.dtype, jax.dtypes.prng_key):
            assert g.dtype == w.dtype, where
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, where
        assert g.tobytes() == w.tobytes(), where


@pytest.mark.float64  # a float64 leaf among the leaf types
def test_round_trip_is_bit_exact_and_keeps_leaf_types(tmp_path):
    tree = _example_tree()
    path = checkpoint.save(tmp_path / "state.ckpt", tree)
    _assert_bit_identical(checkpoint.load(path, like=tree), tree)
    header = checkpoint.read_header(path)
    assert header["format_version"] == checkpoint.FORMAT_VERSION
    assert {leaf["path"] for leaf in header["leaves"]} >= {"['params']['w']", "['position']", "['key']"}


def test_round_trip_of_an_equinox_module(tmp_path):
    model = eqx.nn.Linear(3, 2, key=jax.random.key(0))
    template = eqx.nn.Linear(3, 2, key=jax.random.key(1))
    restored = checkpoint.load(checkpoint.save(tmp_path / "model.ckpt", model), like=template)
    np.testing.assert_array_equal(restored.weight, model.weight)
    np.testing.assert_array_equal(restored.bias, model.bias)
    assert not np.array_equal(template.weight, model.weight)  # the values came from the file


def _saved_bytes(tmp_path):
    tree = {"w": jnp.arange(5, dtype=jnp.float32), "step": 3}
    path = checkpoint.save(tmp_path / "small.ckpt", tree)
    return tree, path, path.read_bytes()


def _assert_rejected(path, like, *words):
    with pytest.raises(checkpoint.CheckpointError) as error:
        checkpoint.load(path, like=like)
    message = str(error.value)
    assert str(path) in message
    for word in words:
        assert word in message, message


def test_truncated_file_is_detected_at_every_length(tmp_path):
    tree, _path, data = _saved_bytes(tmp_path)
    cut = tmp_path / "cut.ckpt"
    for size in range(len(data)):
        cut.write_bytes(data[:size])
        _assert_rejected(cut, tree)
    for size in (0, 5, len(checkpoint.MAGIC) + 3, len(checkpoint.MAGIC) + 20, len(data) - 1):
        cut.write_bytes(data[:size])
        _assert_rejected(cut, tree, "truncated")


def test_every_single_byte_corruption_is_detected(tmp_path):
    tree, _path, data = _saved_bytes(tmp_path)
    damaged = tmp_path / "damaged.ckpt"
    for index in range(len(data)):
        flipped = bytearray(data)
        flipped[index] ^= 0x01
        damaged.write_bytes(bytes(flipped))
        _assert_rejected(damaged, tree)
    flipped = bytearray(data)
    flipped[-1] ^= 0x40  # inside the payload: only the checksum can tell
    damaged.write_bytes(bytes(flipped))
    _assert_rejected(damaged, tree, "checksum")


def test_trailing_garbage_missing_file_and_foreign_file_are_rejected(tmp_path):
    tree, _path, data = _saved_bytes(tmp_path)
    longer = tmp_path / "longer.ckpt"
    longer.write_bytes(data + b"\0")
    _assert_rejected(longer, tree, "unexpected bytes")
    _assert_rejected(tmp_path / "missing.ckpt", tree, "does not exist")
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, w=np.arange(5.0))
    _assert_rejected(foreign, tree, "not a lossfns checkpoint")


@pytest.mark.parametrize(
    "like, word",
    [
        ({"w": np.arange(5, dtype=np.float64), "step": 3}, "dtype"),
        ({"w": np.arange(4, dtype=np.float32), "step": 3}, "shape"),
        ({"v": np.arange(5, dtype=np.float32), "step": 3}, "['v']"),
        ({"w": np.arange(5, dtype=np.float32)}, "leaves"),
    ],
)
def test_structure_mismatch_names_the_leaf(tmp_path, like, word):
    _, path, _ = _saved_bytes(tmp_path)
    _assert_rejected(path, like, word)


def test_unsupported_leaf_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match=r"\['name'\]"):
        checkpoint.save(tmp_path / "x.ckpt", {"name": object()})
    assert not list(tmp_path.iterdir())


def test_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    _tree, path, data = _saved_bytes(tmp_path)

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(path, {"w": jnp.zeros(5, jnp.float32), "step": 4})
    assert path.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_latest_checkpoint_ignores_temporaries_and_skips_damaged_files(tmp_path):
    assert checkpoint.latest_checkpoint(tmp_path / "absent") is None
    assert checkpoint.latest_checkpoint(tmp_path) is None
    tree = {"w": jnp.zeros(3)}
    for step in (2, 10, 4):
        checkpoint.save(checkpoint.checkpoint_path(tmp_path, step), tree)
    # What a save killed before its rename leaves behind.
    (tmp_path / f".{checkpoint.checkpoint_path(tmp_path, 12).name}.abc.tmp").write_bytes(b"LOSSFNS")
    assert checkpoint.latest_checkpoint(tmp_path) == checkpoint.checkpoint_path(tmp_path, 10)
    newest = checkpoint.checkpoint_path(tmp_path, 11)
    newest.write_bytes(checkpoint.checkpoint_path(tmp_path, 10).read_bytes()[:-2])
    with pytest.warns(RuntimeWarning, match=str(newest.name)):
        assert checkpoint.latest_checkpoint(tmp_path) == checkpoint.checkpoint_path(tmp_path, 10)
    checkpoint.prune_checkpoints(tmp_path, keep=2)
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert names == [checkpoint.checkpoint_path(tmp_path, s).name for s in (10, 11)]
    with pytest.raises(ValueError, match="keep"):
        checkpoint.prune_checkpoints(tmp_path, keep=0)
    with pytest.raises(ValueError, match="step"):
        checkpoint.checkpoint_path(tmp_path, -1)


def _header_and_payload(data):
    start = len(checkpoint.MAGIC) + 8
    size = int.from_bytes(data[len(checkpoint.MAGIC) : start], "little")
    return data[: start + size], data[start + size :]


def test_a_fifo_among_the_checkpoints_is_skipped_not_waited_on(tmp_path):
    """A resumed run reads the newest checkpoint: a FIFO under that name
    would block its read forever; it is skipped, with a warning naming it."""
    checkpoint.save(checkpoint.checkpoint_path(tmp_path, 2), {"w": jnp.zeros(3)})
    fifo = checkpoint.checkpoint_path(tmp_path, 5)
    os.mkfifo(fifo)

    def alarm(*_):
        raise TimeoutError("latest_checkpoint blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(10)
    try:
        with pytest.warns(RuntimeWarning, match=f"{fifo} is a FIFO, not a regular file"):
            assert checkpoint.latest_checkpoint(tmp_path) == checkpoint.checkpoint_path(tmp_path, 2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_sizes_are_checked_before_the_rest_is_read(tmp_path):
    """A 2 GiB file (sparse) whose header claims more than it holds is refused
    from its first bytes, not read whole into memory first."""
    path = tmp_path / "claims.ckpt"
    with open(path, "wb") as file:
        file.write(checkpoint.MAGIC + (1 << 40).to_bytes(8, "little"))
        file.truncate(2 << 30)
    tracemalloc.start()
    try:
        _assert_rejected(path, {"w": jnp.zeros(3)}, "truncated: header of 1099511627776 bytes")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated to refuse it"


def test_payload_of_one_checkpoint_under_the_header_of_another_is_rejected(tmp_path):
    tree, path, data = _saved_bytes(tmp_path)
    other = checkpoint.save(tmp_path / "other.ckpt", {"w": jnp.arange(5, 10, dtype=jnp.float32), "step": 9})
    header, _ = _header_and_payload(data)
    _, payload = _header_and_payload(other.read_bytes())
    assert len(payload) == len(_header_and_payload(data)[1])  # same size: only the checksum can tell
    swapped = tmp_path / "swapped.ckpt"
    swapped.write_bytes(header + payload)
    _assert_rejected(swapped, tree, "checksum")
    # A valid checksum over a header whose leaves do not fit the payload (a buggy writer).
    stored = checkpoint.read_header(path)
    body = {"structure": stored["structure"], "leaves": stored["leaves"]}
    swapped.write_bytes(checkpoint.pack_file(checkpoint.CHECKPOINT, body, payload[:-4]))
    _assert_rejected(swapped, tree, "header does not match its payload")


KILLED_SAVE = """
import os, signal, sys
import numpy as np
from lossfns import checkpoint
def die(fd):  # the temporary file is written, not yet renamed
    print("killing", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
checkpoint.os.fsync = die
checkpoint.save(sys.argv[1], {"w": np.zeros(5, np.float32), "step": 4})
print("not killed", flush=True)
"""


def test_a_save_killed_mid_write_keeps_the_previous_file_and_the_lock_cleans_up(tmp_path):
    tree = {"w": jnp.arange(5, dtype=jnp.float32), "step": 3}
    path = checkpoint.save(checkpoint.checkpoint_path(tmp_path, 3), tree)
    data = path.read_bytes()
    environment = dict(_environment(), PYTHONPATH=str(SCRIPT.parents[1]))
    process = subprocess.run(
        [sys.executable, "-c", KILLED_SAVE, str(path)],
        env=environment,
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    assert process.returncode == -9 and process.stdout.strip() == "killing", process
    assert path.read_bytes() == data
    orphans = [p for p in tmp_path.iterdir() if p != path]
    assert len(orphans) == 1 and orphans[0].name.startswith(f".{path.name}.") and orphans[0].name.endswith(".tmp")
    assert checkpoint.latest_checkpoint(tmp_path) == path
    _assert_bit_identical(checkpoint.load(path, like=tree), tree)
    with checkpoint.DirectoryLock(tmp_path):  # taking the lock removes the orphan
        assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.LOCK_NAME, path.name]


def test_failed_rename_keeps_the_previous_file(tmp_path, monkeypatch):
    _tree, path, data = _saved_bytes(tmp_path)

    def crash(*args):
        raise OSError("rename failed")

    monkeypatch.setattr(checkpoint.os, "replace", crash)
    with pytest.raises(OSError, match="rename failed"):
        checkpoint.save(path, {"w": jnp.zeros(5, jnp.float32), "step": 4})
    assert path.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_two_writers_on_one_directory(tmp_path):
    """The second run (another open lock: flock locks belong to open file
    descriptions) is refused with the directory's name; the first saves and
    prunes undisturbed, and leaves the directory free."""
    directory = tmp_path / "run"
    with checkpoint.DirectoryLock(directory):
        with (
            pytest.raises(checkpoint.CheckpointError, match=f"checkpoint directory {directory} is in use"),
            checkpoint.DirectoryLock(directory),
        ):
            pass
        for step in (1, 2, 3):
            checkpoint.save(checkpoint.checkpoint_path(directory, step), {"w": jnp.zeros(2)})
        checkpoint.prune_checkpoints(directory, keep=2)
        assert checkpoint.latest_checkpoint(directory) == checkpoint.checkpoint_path(directory, 3)
    assert checkpoint.DirectoryLock(directory).acquire().release() is None


def _kill_at(directory, out, seed, kill_step):
    """Start a run and SIGKILL it right after it reports `kill_step`."""
    from tests.conftest import sigkill_after  # not at the top: this file also runs as the training script

    process = subprocess.Popen(
        training_command(directory, out, seed),
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )

    def wait_until_due():
        for line in process.stdout:
            if line.startswith("step ") and int(line.split()[1]) >= kill_step:
                return

    killed = sigkill_after(process, wait_until_due)
    process.stdout.close()
    assert killed, "the training run finished before it could be killed"


@pytest.mark.slow
def test_killed_training_resumes_bit_identical(tmp_path):
    seed, steps = 5, 30
    directory, out = tmp_path / "interrupted", tmp_path / "interrupted.ckpt"
    directory.mkdir()
    kill_step = random.Random().randrange(4, steps - 4)  # a different point every run; reported on failure
    _kill_at(directory, out, seed, kill_step)
    assert not out.exists()
    assert checkpoint.latest_checkpoint(directory) is not None, f"killed at step {kill_step} before any checkpoint"

    # Resume and reference run in this process, under the subprocess's float32 settings.
    with jax.enable_x64(False):
        train(directory, out, seed=seed, steps=steps, every=4)
        reference_out = tmp_path / "reference.ckpt"
        (tmp_path / "reference").mkdir()
        train(tmp_path / "reference", reference_out, seed=seed, steps=steps, every=4)
        state = _setup(seed)[1]
    reference = checkpoint.load(reference_out, like=state)
    resumed = checkpoint.load(out, like=state)
    assert resumed["step"] == reference["step"] == steps
    _assert_bit_identical(resumed, reference)
    assert checkpoint.read_header(out)["sha256"] == checkpoint.read_header(reference_out)["sha256"]
    # The test can fail: training moved the parameters away from their start.
    assert not np.array_equal(resumed["params"]["emissions"], state["params"]["emissions"])


if __name__ == "__main__":
    _main()
