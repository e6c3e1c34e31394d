"""Determinism: the same seed gives bit-identical results in separate processes
on the same machine, for the main chain functions (log-partition, marginals,
Viterbi, sampling, a factored gradient) and for a whole training run.

Run as a script (`python tests/test_determinism.py`), this file prints a
JSON object of SHA-256 digests of every result for seeds 0 and 1; the test
compares the digests of two concurrent subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns.lattices import chain
from lossfns.lattices.chain import FactoredPotentials

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_checkpoint import train  # the resumable training loop

SCRIPT = Path(__file__).resolve()


def _digest(tree) -> str:
    """SHA-256 over the bytes, dtypes and shapes of every leaf of `tree`."""
    hasher = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        array = np.asarray(leaf)
        hasher.update(f"{array.dtype}{array.shape}".encode())
        hasher.update(array.tobytes())
    return hasher.hexdigest()


@jax.jit
def _chain_results(seed):
    """Float32 results of the chain functions for inputs drawn from `seed`
    (one compiled program: the suite runs on 2 shared cores)."""
    potentials_key, unary_key, transitions_key, lengths_key, sample_key = jax.random.split(jax.random.key(seed), 5)
    batch, T, L = 3, 7, 4
    potentials = jax.random.normal(potentials_key, (batch, T, L, L), jnp.float32)
    potentials = potentials.at[:, :, 1, 2].set(-jnp.inf)  # a forbidden transition
    factored = FactoredPotentials(
        jax.random.normal(unary_key, (batch, T, L), jnp.float32),
        jax.random.normal(transitions_key, (L, L), jnp.float32),
    )
    lengths = jax.random.randint(lengths_key, (batch,), 0, T + 1).at[0].set(T)
    log_z = lambda p: jnp.sum(chain.log_partition(p, lengths))
    return {
        "log_partition/log": chain.log_partition(potentials, lengths),
        "marginals": chain.marginals(potentials, lengths),
        "viterbi": chain.viterbi(potentials, lengths),
        "sample": chain.sample(sample_key, potentials, lengths),
        "factored/log_partition_and_grad/real": jax.value_and_grad(log_z)(factored),
    }


def digests(seed: int) -> dict:
    """Digests of every chain result and of a short training run's final state."""
    results = dict(_chain_results(seed))
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "final.ckpt"
        train(Path(directory), out, seed=seed, steps=8, every=4)
        results["training/final_state_file"] = np.frombuffer(out.read_bytes(), np.uint8)
    return {name: _digest(value) for name, value in results.items()}


def _subprocess():
    environment = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="0")
    return subprocess.Popen(
        [sys.executable, str(SCRIPT)], env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_same_seed_is_bit_identical_across_processes():
    processes = [_subprocess(), _subprocess()]  # concurrently: the machine has 2 cores
    outputs = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]
        outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    first, second = outputs
    for seed in ("0", "1"):
        assert len(first[seed]) == 6
        assert first[seed] == second[seed], sorted(n for n in first[seed] if first[seed][n] != second[seed][n])
    # The digests see the values: another seed changes every one of them.
    assert not set(first["0"].items()) & set(first["1"].items())


if __name__ == "__main__":
    print(json.dumps({str(seed): digests(seed) for seed in (0, 1)}), flush=True)
