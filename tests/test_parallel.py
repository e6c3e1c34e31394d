"""Data-parallel training: 4 host devices give the parameters of 1 device.

The device count is fixed when jax initialises, so the comparison runs in a
subprocess started with XLA_FLAGS=--xla_force_host_platform_device_count=4.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lossfns import parallel

_SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np, optax
    jax.config.update("jax_enable_x64", True)
    from lossfns import parallel
    from lossfns.lattices import chain

    B, T, D, L, STEPS = 8, 6, 5, 3, 20
    rng = np.random.default_rng(0)
    batch = {"features": rng.normal(size=(B, T, D)), "labels": rng.integers(0, L, size=(B, T)).astype(np.int32),
             "lengths": np.array([6, 5, 4, 3, 6, 2, 1, 0], np.int32)}
    initial = {"weights": jnp.zeros((D, L)), "transitions": jnp.zeros((L, L))}

    def loss_fn(params, batch):
        # a linear-chain CRF: mean negative log-likelihood
        potentials = chain.FactoredPotentials(batch["features"] @ params["weights"], params["transitions"])
        return jnp.mean(chain.log_partition(potentials, batch["lengths"])
                        - chain.score(potentials, batch["labels"], batch["lengths"]))

    def train(devices):
        mesh = parallel.batch_mesh(devices)
        optimizer = optax.adam(0.1)
        step = parallel.make_train_step(loss_fn, optimizer, mesh)
        params = parallel.replicate(initial, mesh)
        opt_state = parallel.replicate(optimizer.init(initial), mesh)
        sharded = parallel.shard_batch(batch, mesh)
        losses = []
        for _ in range(STEPS):
            params, opt_state, loss = step(params, opt_state, sharded)
            losses.append(float(loss))
        shard_rows = sorted({s.data.shape[0] for s in sharded["features"].addressable_shards})
        return {"params": {k: np.asarray(v).tolist() for k, v in params.items()}, "losses": losses,
                "param_devices": len(params["weights"].sharding.device_set),
                "batch_devices": len(sharded["features"].sharding.device_set), "shard_rows": shard_rows}

    try:
        parallel.shard_batch({"features": batch["features"][:6]}, parallel.batch_mesh())
        rejected = ""
    except ValueError as error:
        rejected = str(error)
    print(json.dumps({"device_count": jax.device_count(), "one": train(jax.devices()[:1]),
                      "four": train(jax.devices()), "rejected": rejected}))
""")


@pytest.fixture(scope="module")
def runs():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_four_devices_were_used(runs):
    assert runs["device_count"] == 4
    assert (runs["four"]["param_devices"], runs["four"]["batch_devices"], runs["four"]["shard_rows"]) == (4, 4, [2])
    assert (runs["one"]["param_devices"], runs["one"]["batch_devices"], runs["one"]["shard_rows"]) == (1, 1, [8])


def test_sharded_training_equals_one_device_after_20_steps(runs):
    one, four = runs["one"], runs["four"]
    assert len(one["losses"]) == 20
    # the training moved: a comparison of untouched parameters could not fail
    assert one["losses"][-1] < 0.8 * one["losses"][0]
    assert np.abs(np.asarray(one["params"]["weights"])).max() > 0.1
    for name in ("weights", "transitions"):
        np.testing.assert_allclose(four["params"][name], one["params"][name], atol=1e-6, rtol=0)
    np.testing.assert_allclose(four["losses"], one["losses"], atol=1e-6, rtol=0)


def test_batch_not_divisible_by_devices_is_rejected(runs):
    assert "batch leaf ['features'] must have a leading example axis divisible by the 4" in runs["rejected"]
    with pytest.raises(ValueError, match=r"batch leaf \['x'\] must have a leading example axis"):
        parallel.shard_batch({"x": np.zeros(())}, parallel.batch_mesh())


def test_single_device_step_matches_plain_optax():
    """In-process (1 device): the compiled step is exactly loss -> grad -> optax update."""
    mesh = parallel.batch_mesh()
    optimizer = optax.sgd(0.5)
    loss_fn = lambda params, batch: jnp.mean((batch["x"] @ params - batch["y"]) ** 2)
    batch = {"x": np.arange(12.0).reshape(4, 3) / 10, "y": np.ones(4)}
    params = jnp.array([0.1, -0.2, 0.3])
    expected = params - 0.5 * (2 * batch["x"].T @ (batch["x"] @ params - batch["y"]) / 4)
    step = parallel.make_train_step(loss_fn, optimizer, mesh)
    new, _, loss = step(parallel.replicate(params, mesh), parallel.replicate(optimizer.init(params), mesh),
                        parallel.shard_batch(batch, mesh))
    np.testing.assert_allclose(new, expected, rtol=1e-12)
    np.testing.assert_allclose(loss, np.mean((batch["x"] @ np.asarray(params) - batch["y"]) ** 2), rtol=1e-12)
