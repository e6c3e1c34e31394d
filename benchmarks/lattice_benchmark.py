"""Time `dag.log_partition` plus its gradient on a batch of random lattices.

Usage: .venv/bin/python benchmarks/lattice_benchmark.py [--batch 32] [--states 200] [--in-degree 4] [--float64]

Two shapes of lattice, each with about `states` states and `states * in_degree`
arcs: "layered" (states grouped by position, `width` states per position,
arcs from the previous 1-3 positions, like a word lattice), and "random"
(each state's in-arcs come from uniformly chosen earlier states: fewer,
wider levels). The scan runs one step per level (the longest path), each
over a padded [width, in-degree] block. Prints compile time and the median
time per call (jit, after warm-up).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from lossfns import semirings
from lossfns.lattices import dag


def layered_lattice(rng, num_states, in_degree, width):
    position = np.concatenate([[0], (np.arange(1, num_states) - 1) // width + 1])
    arcs = []
    for state in range(1, num_states):
        earlier = np.flatnonzero((position < position[state]) & (position >= position[state] - 3))
        for source in rng.choice(earlier, size=in_degree):
            arcs.append((int(source), state, int(rng.integers(0, 1000))))
    return dag.from_arcs(arcs, final=np.flatnonzero(position == position.max()), num_states=num_states)


def random_lattice(rng, num_states, in_degree):
    arcs = [
        (int(rng.integers(0, state)), state, int(rng.integers(0, 1000)))
        for state in range(1, num_states)
        for _ in range(in_degree)
    ]
    return dag.from_arcs(arcs, final=[num_states - 1], num_states=num_states)


def median_seconds(fn, *args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--states", type=int, default=200)
    parser.add_argument("--in-degree", type=int, default=4)
    parser.add_argument("--width", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--float64", action="store_true", help="also time float64")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; batch {args.batch}")
    for shape in ("layered", "random"):
        if shape == "layered":
            lattices = [layered_lattice(rng, args.states, args.in_degree, args.width) for _ in range(args.batch)]
        else:
            lattices = [random_lattice(rng, args.states, args.in_degree) for _ in range(args.batch)]
        batch = dag.stack(lattices)
        N, W, D = batch.level_arcs.shape[1:]
        print(
            f"\n{shape}: {batch.num_states} states, {batch.num_arcs} arcs per lattice (padded); "
            f"{N} levels x {W} states x {D} in-arcs"
        )
        for dtype in (jnp.float32, jnp.float64) if args.float64 else (jnp.float32,):
            if dtype == jnp.float64:
                jax.config.update("jax_enable_x64", True)
            scores = jnp.asarray(rng.normal(size=(args.batch, batch.num_arcs)), dtype)
            for semiring in (semirings.Log, semirings.Real):
                value_and_grad = jax.jit(
                    jax.value_and_grad(lambda s, b: jnp.sum(dag.log_partition(b, s, semiring=semiring)))
                )
                start = time.perf_counter()
                jax.block_until_ready(value_and_grad(scores, batch))
                compile_seconds = time.perf_counter() - start
                forward = jax.jit(lambda s, b: dag.log_partition(b, s, semiring=semiring))
                seconds = median_seconds(value_and_grad, scores, batch, repeats=args.repeats)
                forward_seconds = median_seconds(forward, scores, batch, repeats=args.repeats)
                print(
                    f"  {jnp.dtype(dtype).name:8s} {semiring.name:5s} log Z + grad {seconds * 1e3:8.2f} ms "
                    f"(log Z alone {forward_seconds * 1e3:7.2f} ms; first call incl. compile {compile_seconds:5.2f} s)"
                )


if __name__ == "__main__":
    main()
