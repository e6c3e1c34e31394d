"""Data-parallel training: on 4 host devices the driver and `Tagger.fit`
give one device's weights.

The device count is fixed when jax initialises, so the 4-device runs happen
in one subprocess started with XLA_FLAGS=--xla_force_host_platform_device_count=4.
Oracle: the same training on one device, without a mesh (another packing of
the corpus, so the sums are added in another order). Both run in float64, so
that the comparison does not depend on float32 summation order: the
tolerances are a few thousand float64 roundings, far below any real
difference (a lost shard moves the weights by 1e-2 or more)."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import subprocess_environment

from lossfns import parallel

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

_SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np, optax
    jax.config.update("jax_enable_x64", True)
    from lossfns import optimizers, parallel
    from lossfns.corpora import Sentence
    from lossfns.lattices import chain
    from lossfns.tagger import Tagger

    mesh = parallel.data_mesh()

    # The driver on a toy CRF in float64: 8 sequences over 4 devices, 2 each.
    rng = np.random.default_rng(0)
    data = {"features": rng.normal(size=(8, 6, 5)),
            "labels": rng.integers(0, 3, size=(8, 6)).astype(np.int32),
            "lengths": np.array([6, 5, 4, 3, 6, 2, 1, 0], np.int32)}

    def objective(params, batch):  # a sum over the examples of the batch
        potentials = chain.FactoredPotentials(batch["features"] @ params["weights"], params["transitions"])
        # L2 (strong convexity: without it these 8 sequences leave flat
        # directions, where L-BFGS magnifies rounding), as a share per
        # example, so that the shards add up to it once
        share = batch["lengths"].shape[0] / 8
        l2 = share * 0.05 * sum(jnp.sum(p ** 2) for p in params.values())
        return jnp.sum(chain.log_partition(potentials, batch["lengths"])
                       - chain.score(potentials, batch["labels"], batch["lengths"])) + l2

    seen = []
    def callback(report):
        seen.append(len(report.inner[0]["weights"].sharding.device_set))

    initial = {"weights": jnp.zeros((5, 3), jnp.float64), "transitions": jnp.zeros((3, 3), jnp.float64)}
    runs = {}
    for name, options in (("one", {}), ("four", {"mesh": mesh, "callback": callback})):
        result = optimizers.train(objective, initial, optax.lbfgs(), data, max_steps=20, progress=False,
                                  stop=optimizers.relative_change_below(0.0), **options)
        runs[name] = {"params": {k: np.asarray(v).tolist() for k, v in result.params.items()},
                      "trace": np.asarray(result.trace).tolist()}
    runs["param_devices"] = sorted(set(seen))

    # The Tagger: label-pair features (sparse form), OWL-QN, float64.
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(12)]
    corpus = []
    for _ in range(60):
        ws = [words[int(i)] for i in rng.integers(0, 12, size=rng.integers(1, 10))]
        tags = ["B-X" if w in ("w1", "w2") else "I-X" if i and ws[i - 1] in ("w1", "w2") else "O"
                for i, w in enumerate(ws)]
        corpus.append(Sentence(tuple((w,) for w in ws), tuple(tags)))
    templates = "U00:%x[0,0]\\nU01:%x[-1,0]\\nB\\nB01:%x[0,0]\\n"
    taggers = {name: Tagger(templates, l1=0.05, l2=0.1, max_iterations=12, tol=0.0, progress=False, dtype=jnp.float64).fit(
        corpus, mesh=mesh if name == "four" else None) for name in ("one", "four")}
    runs["tagger"] = {name: {"weights": [np.asarray(x).ravel().tolist() for x in tagger.model.weights()],
                             "history": tagger.history, "predicted": tagger.predict(corpus[:10])}
                      for name, tagger in taggers.items()}
    try:
        parallel.shard_leading_axis({"x": np.zeros((6, 2))}, mesh)
        runs["rejected"] = ""
    except ValueError as error:
        runs["rejected"] = str(error)
    runs["device_count"] = jax.device_count()
    print(json.dumps(runs))
""")


@pytest.fixture(scope="module")
def runs():
    # The suite's XLA flags (conftest: quicker compilation) and four host devices.
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = subprocess_environment(
        XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, check=False, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_four_devices_hold_the_parameters(runs):
    assert runs["device_count"] == 4 and runs["param_devices"] == [4]


def test_driver_on_four_devices_equals_one_device(runs):
    one, four = runs["one"], runs["four"]
    assert one["trace"][-1] < 0.9 * one["trace"][0]  # training moved: the comparison can fail
    assert np.abs(np.asarray(one["params"]["weights"])).max() > 0.1
    for name in ("weights", "transitions"):
        # float64 sums in another order (four partial sums, then psum)
        np.testing.assert_allclose(four["params"][name], one["params"][name], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(four["trace"], one["trace"], rtol=1e-10)


def test_tagger_fit_on_a_four_device_mesh_equals_one_device(runs):
    one, four = runs["tagger"]["one"], runs["tagger"]["four"]
    assert len(one["history"]) == len(four["history"]) == 12
    assert one["history"][-1] < 0.5 * one["history"][0]
    for a, b in zip(four["weights"], one["weights"]):
        # float64 rounding through 12 OWL-QN steps, orthant projections included
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)
    assert max(np.abs(np.asarray(a)).max() for a in one["weights"]) > 0.5
    np.testing.assert_allclose(four["history"], one["history"], rtol=1e-10)
    assert four["predicted"] == one["predicted"]


def test_data_not_divisible_by_the_shards_is_rejected(runs):
    assert "data leaf ['x'] must have a leading axis divisible by the 4 shards" in runs["rejected"]


def test_sum_over_shards_on_one_device_is_the_plain_sum():
    """In-process (1 device): the mesh path is the objective itself, and its gradient."""
    mesh = parallel.data_mesh()
    fn = lambda params, block: jnp.sum((block["x"] @ params - block["y"]) ** 2)
    block = {"x": np.arange(12.0).reshape(4, 3) / 10, "y": np.ones(4)}
    params = jnp.array([0.1, -0.2, 0.3])
    summed = jax.jit(parallel.sum_over_shards(fn, mesh))
    sharded = parallel.shard_leading_axis(block, mesh)
    np.testing.assert_allclose(summed(params, sharded), fn(params, block), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(summed)(params, sharded), jax.grad(fn)(params, block), rtol=1e-12)
    with pytest.raises(ValueError, match="must have an axis named 'data' or a single axis"):
        parallel.data_axis(jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("a", "b")))
