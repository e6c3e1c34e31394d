"""Cost of each chain loss plus its gradient, relative to `sequence_log_loss`.

    .venv/bin/python benchmarks/losses_benchmark.py [--form factored|dense]

Shapes (B, T, L) = (32, 40, 9) and (32, 40, 45), float32, random lengths in
[T/2, T]. Each loss is jitted as `value_and_grad` of its batch sum and timed
after a warm-up call (compile time is reported separately); the time is the
fastest of `--repeats` calls (the least disturbed by other processes on a
shared machine).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from lossfns import losses
from lossfns.lattices.chain import FactoredPotentials, materialize

SHAPES = [(32, 40, 9), (32, 40, 45)]
MARGINAL_LOSSES = {
    "sequence_log_loss": losses.sequence_log_loss,
    "sequence_exp_loss": losses.sequence_exp_loss,
    "log_sequence_exp_loss": losses.log_sequence_exp_loss,
    "pointwise_log_loss": losses.pointwise_log_loss,
    "pointwise_exp_loss": losses.pointwise_exp_loss,
    "expected_hamming_loss": losses.expected_hamming_loss,
}
VITERBI_LOSSES = {"perceptron_loss": losses.perceptron_loss, "structured_hinge_loss": losses.structured_hinge_loss}


def problem(batch, T, L, form, seed=0):
    rng = np.random.default_rng(seed)
    potentials = FactoredPotentials(
        jnp.asarray(rng.normal(size=(batch, T, L)), jnp.float32),
        jnp.asarray(0.5 * rng.normal(size=(L, L)), jnp.float32),
        jnp.asarray(rng.normal(size=(L,)), jnp.float32),
    )
    if form == "dense":
        potentials = materialize(potentials)
    lengths = jnp.asarray(rng.integers(T // 2, T + 1, size=batch), jnp.int32)
    labels = jnp.asarray(rng.integers(0, L, size=(batch, T)), jnp.int32)
    return potentials, labels, lengths


def time_loss(loss, potentials, labels, lengths, repeats):
    step = jax.jit(jax.value_and_grad(lambda p: jnp.sum(loss(p, labels, lengths))))
    start = time.perf_counter()
    jax.block_until_ready(step(potentials))
    compile_seconds = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(potentials))
        times.append(time.perf_counter() - start)
    return min(times), compile_seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--form",
        choices=["factored", "dense"],
        default="factored",
        help="FactoredPotentials (unary + shared transitions) or [B, T, L, L] potentials",
    )
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    chosen = dict(MARGINAL_LOSSES)
    chosen.update(VITERBI_LOSSES)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, form={args.form}, float32")
    for batch, T, L in SHAPES:
        potentials, labels, lengths = problem(batch, T, L, args.form)
        results = {name: time_loss(fn, potentials, labels, lengths, args.repeats) for name, fn in chosen.items()}
        reference = results["sequence_log_loss"][0]
        print(f"\n(B, T, L) = ({batch}, {T}, {L})")
        print(f"{'loss + gradient':<24}{'ms':>10}{'relative':>10}{'compile s':>11}")
        for name, (seconds, compile_seconds) in results.items():
            print(f"{name:<24}{1e3 * seconds:>10.2f}{seconds / reference:>10.2f}{compile_seconds:>11.1f}")


if __name__ == "__main__":
    main()
