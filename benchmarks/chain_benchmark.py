"""Chain log-partition plus marginals, side by side in one process.

For each shape `(B, T, L)` every variant computes `log Z` and its gradient
with respect to the potentials (the marginals) in float32, except the numpy
reference (float64):

* lossfns (`lossfns.lattices.chain`, jitted): {factored, per-position} x
  {sequential (the default call: the exact kernel, which `Real` also
  runs), parallel (log semiring)};
* torch-struct 0.5 `LinearChainCRF` (log semiring, per-position potentials,
  autograd), skipped where its `[B, T/2, L, L, L]` intermediate would not fit;
* a numpy float64 scaled forward-backward written here, on factored and
  per-position input;
* a floor, not an implementation: only the matrix products that any
  forward-backward of the factored form performs (2 (T - 1) steps of
  `[B, L] x [L, L]`, each normalised, and the `[L, T B] x [T B, L]` edge
  sums), in float32 XLA. numpy's time over the floor's is the largest
  speed-up over numpy that an XLA forward-backward could reach at a shape.

Repeats are interleaved (round robin over the variants of a shape, in
blocks after an untimed warm call) so that load drift on a shared machine
hits every variant alike; medians are reported, with ratios against
torch-struct and numpy taken from the same run.
Compile time (first call minus the median) is reported separately.

Also: the sparse forward-backward (`lossfns.lattices.sparse_chain`) against
the dense per-position chain at 333 labels with 90% (and 98%) of the
label-pair weights zero.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lossfns import semirings
from lossfns.lattices import chain, sparse_chain

SHAPES = ((32, 40, 9), (32, 40, 45), (8, 40, 333), (256, 25, 45), (1, 10_000, 9))
SEMIRINGS = {"log": semirings.Log}
# Skip a variant whose largest intermediate would exceed this (shared machine).
MEMORY_LIMIT_BYTES = 2 * 1024**3
TORCH_STRUCT_WORK_LIMIT = 32 * 40 * 45**3


class Problem(NamedTuple):
    """One random float32 problem: factored scores and their per-position form."""

    unary: np.ndarray  # [B, T, L]
    transitions: np.ndarray  # [L, L]
    start: np.ndarray  # [L]
    per_position: np.ndarray  # [B, T, L, L]


def make_problem(shape, seed: int = 0) -> Problem:
    B, T, L = shape
    rng = np.random.default_rng(seed)
    unary = (2.0 * rng.standard_normal((B, T, L))).astype(np.float32)
    transitions = rng.standard_normal((L, L)).astype(np.float32)
    start = rng.standard_normal(L).astype(np.float32)
    factored = chain.FactoredPotentials(jnp.asarray(unary), jnp.asarray(transitions), jnp.asarray(start))
    per_position = np.asarray(chain.materialize(factored))
    return Problem(unary, transitions, start, per_position)


# ---------------------------------------------------------------------------
# numpy float64 forward-backward (scaled, probability space)
# ---------------------------------------------------------------------------


def numpy_factored(unary, transitions, start):
    """`(log Z [B], node marginals [B, T, L], expected transition counts [L, L])`."""
    unary, transitions, start = (np.asarray(x, np.float64) for x in (unary, transitions, start))
    B, T, L = unary.shape
    unary_shift = unary.max(-1, keepdims=True)
    emissions = np.exp(unary - unary_shift)
    transition_shift = transitions.max()
    factors = np.exp(transitions - transition_shift)
    first = np.exp(start + unary[:, 0] - (start + unary[:, 0]).max(-1, keepdims=True))
    log_z = np.log(first.sum(-1)) + (start + unary[:, 0]).max(-1)
    alphas, norms = np.empty((B, T, L)), np.empty((B, T))
    alphas[:, 0], norms[:, 0] = first / first.sum(-1, keepdims=True), 1.0
    for t in range(1, T):
        a = (alphas[:, t - 1] @ factors) * emissions[:, t]
        norms[:, t] = a.sum(-1)
        alphas[:, t] = a / norms[:, t, None]
    log_z += np.log(norms[:, 1:]).sum(-1) + unary_shift[:, 1:, 0].sum(-1) + (T - 1) * transition_shift
    beta = np.ones((B, L))
    nodes = np.empty((B, T, L))
    nodes[:, T - 1] = alphas[:, T - 1]
    outer = np.zeros((L, L))
    for t in range(T - 1, 0, -1):
        weighted = emissions[:, t] * beta / norms[:, t, None]
        outer += alphas[:, t - 1].T @ weighted
        beta = weighted @ factors.T
        nodes[:, t - 1] = alphas[:, t - 1] * beta
    return log_z, nodes, outer * factors


def numpy_per_position(potentials):
    """`(log Z [B], edge marginals [B, T, L, L])` of `[B, T, L, L]` potentials."""
    potentials = np.asarray(potentials, np.float64)
    B, T, L, _ = potentials.shape
    shifts = potentials[:, 1:].max(axis=(-2, -1))
    factors = np.exp(potentials[:, 1:] - shifts[..., None, None])
    first_scores = potentials[:, 0, 0]
    first = np.exp(first_scores - first_scores.max(-1, keepdims=True))
    log_z = np.log(first.sum(-1)) + first_scores.max(-1) + shifts.sum(-1)
    alphas, norms = np.empty((B, T, L)), np.ones((B, T))
    alphas[:, 0] = first / first.sum(-1, keepdims=True)
    for t in range(1, T):
        a = np.einsum("bi,bij->bj", alphas[:, t - 1], factors[:, t - 1])
        norms[:, t] = a.sum(-1)
        alphas[:, t] = a / norms[:, t, None]
    log_z += np.log(norms[:, 1:]).sum(-1)
    edges = np.zeros((B, T, L, L))
    beta = np.ones((B, L))
    for t in range(T - 1, 0, -1):
        weighted = beta / norms[:, t, None]
        edges[:, t] = alphas[:, t - 1, :, None] * factors[:, t - 1] * weighted[:, None, :]
        beta = np.einsum("bij,bj->bi", factors[:, t - 1], weighted)
    edges[:, 0, 0] = alphas[:, 0] * beta
    return log_z, edges


# ---------------------------------------------------------------------------
# Variants: `build(problem)` returns `run() -> log Z` (per chain, or their sum)
# ---------------------------------------------------------------------------


class Variant(NamedTuple):
    name: str
    peer: str  # "lossfns", "torch-struct" or "numpy"
    form: str  # "factored" or "per-position"
    build: Callable  # problem -> (run: () -> log Z [B])
    fits: Callable  # shape -> None or a reason to skip


def _lossfns_variant(form: str, semiring: str, algorithm: str) -> Variant:
    def build(problem: Problem):
        B, T, _L = problem.unary.shape
        lengths = jnp.full((B,), T, jnp.int32)
        if form == "factored":
            inputs = chain.FactoredPotentials(
                jnp.asarray(problem.unary), jnp.asarray(problem.transitions), jnp.asarray(problem.start)
            )
        else:
            inputs = jnp.asarray(problem.per_position)

        @jax.jit
        def value_and_marginals(potentials):
            total = lambda p: jnp.sum(chain.forward(SEMIRINGS[semiring], p, lengths, algorithm=algorithm))
            return jax.value_and_grad(total)(potentials)

        def run():
            value, _grads = jax.block_until_ready(value_and_marginals(inputs))
            return value

        return run

    def fits(shape):
        B, T, L = shape
        itemsize = 4
        if algorithm == "parallel":
            # the generic log-semiring matmul materialises [.., L, L, L] per product
            needed = B * max(T // 2, 1) * L**3 * itemsize * 3
        elif form == "per-position":
            needed = B * T * L * L * itemsize * 4
        else:
            needed = B * T * L * L * itemsize
        if needed > MEMORY_LIMIT_BYTES:
            return f"needs about {needed / 1024**3:.1f} GiB"
        return None

    return Variant(f"lossfns {form} {semiring} {algorithm}", "lossfns", form, build, fits)


def _torch_struct_variant() -> Variant | None:
    try:
        import torch
        import torch_struct
    except ImportError:
        return None
    # torch-struct 0.5 predates torch's `arg_constraints` check; the warning is noise.
    warnings.filterwarnings("ignore", message=".*does not define `arg_constraints`")

    def build(problem: Problem):
        B, T, _L = problem.unary.shape
        # torch-struct's log_potentials[b, n, z_{n+1}, z_n] over T - 1 edges;
        # the first node's scores are folded into the first edge.
        edges = problem.per_position[:, 1:].transpose(0, 1, 3, 2).copy()
        edges[:, 0] += problem.per_position[:, 0, 0][:, None, :]
        log_potentials = torch.tensor(edges, requires_grad=True)
        lengths = torch.full((B,), T, dtype=torch.long)

        def run():
            distribution = torch_struct.LinearChainCRF(log_potentials, lengths=lengths)
            partition = distribution.partition
            (_marginals,) = torch.autograd.grad(partition.sum(), log_potentials)
            return partition.detach().numpy()

        return run

    def fits(shape):
        B, T, L = shape
        needed = B * max(T // 2, 1) * L**3 * 4
        if needed > 2 * MEMORY_LIMIT_BYTES:
            return f"out of memory: its [B, T/2, L, L, L] log-semiring product needs about {needed / 1024**3:.1f} GiB"
        if B * T * L**3 > TORCH_STRUCT_WORK_LIMIT:
            return (
                "not run for time: its work B T L^3 exceeds that of (32, 40, 45), where one call took "
                "about 30 s on the loaded 2-core machine"
            )
        if T < 2:
            return "needs T >= 2"
        return None

    return Variant("torch-struct per-position log", "torch-struct", "per-position", build, fits)


def _numpy_variant(form: str) -> Variant:
    def build(problem: Problem):
        if form == "factored":
            return lambda: numpy_factored(problem.unary, problem.transitions, problem.start)[0]
        return lambda: numpy_per_position(problem.per_position)[0]

    def fits(shape):
        B, T, L = shape
        needed = B * T * L * L * 8 * 3 if form == "per-position" else B * T * L * 8 * 4
        return f"needs about {needed / 1024**3:.1f} GiB" if needed > MEMORY_LIMIT_BYTES else None

    return Variant(f"numpy float64 {form}", "numpy", form, build, fits)


def _products_floor_variant() -> Variant:
    def build(problem: Problem):
        B, T, L = problem.unary.shape
        transitions = jnp.asarray(np.exp(problem.transitions - problem.transitions.max()), jnp.float32)

        @jax.jit
        def products(transitions):
            def step(vectors, _):
                new = vectors @ transitions
                return new / jnp.max(new), new

            _, steps = jax.lax.scan(step, jnp.ones((B, L), jnp.float32), None, length=2 * (T - 1))
            forward, backward = steps[: T - 1].reshape(-1, L), steps[T - 1 :].reshape(-1, L)
            return jnp.sum(forward.T @ backward)

        return lambda: jax.block_until_ready(products(transitions))

    return Variant(FLOOR, "floor", "factored", build, lambda shape: None)


FLOOR = "floor: XLA matrix products only"


def variants():
    # The parallel scan (log semiring, exact) is 4-9x slower than the
    # sequential one on CPU (NUMERICS.md 7); it stands for the accelerator path.
    out = [
        _lossfns_variant(form, "log", algorithm)
        for form in ("factored", "per-position")
        for algorithm in ("sequential", "parallel")
    ]
    torch_struct = _torch_struct_variant()
    if torch_struct is not None:
        out.append(torch_struct)
    out += [_numpy_variant("factored"), _numpy_variant("per-position"), _products_floor_variant()]
    return out


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


def first_calls(runs: dict):
    """Call every `run` once (compiling it); returns `({name: seconds}, {name: result})`."""
    seconds, results = {}, {}
    for name, run in runs.items():
        start = time.perf_counter()
        results[name] = run()
        seconds[name] = time.perf_counter() - start
    return seconds, results


def time_interleaved(runs: dict, repeats: int, budget_s: float, block: int = 3):
    """Round-robin blocks of repeats of every `run`; returns `{name: (first_s, [times])}`.

    Each turn makes one untimed call and then `block` timed ones: the first
    call after another library ran pays for waking this library's thread
    pool while the other's (OpenBLAS, OpenMP) may still spin, which costs
    XLA up to 20 ms on 2 cores and is not what a training loop sees. Stops
    early (after at least 3 rounds) once `budget_s` has been spent.
    """
    first, _ = first_calls(runs)
    times = {name: [] for name in runs}
    began = time.perf_counter()
    for round_index in range(max(1, math.ceil(repeats / block))):
        for name, run in runs.items():
            if times[name] and sum(times[name]) > budget_s:
                continue  # a very slow peer: its few timings suffice
            run()
            for _ in range(block):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        if round_index >= 2 and time.perf_counter() - began > budget_s:
            break
    return {name: (first[name], times[name]) for name in runs}


def benchmark_chain(shapes=SHAPES, repeats: int = 7, budget_s: float = 60.0, log=print, on_shape=None):
    """All variants on all shapes; returns a list of result records.
    `on_shape(records so far)` is called after each shape (partial results)."""
    records = []
    all_variants = variants()
    for shape in shapes:
        B, T, _L = shape
        problem = make_problem(shape)
        reference = numpy_factored(problem.unary, problem.transitions, problem.start)[0]
        runs, skipped = {}, {}
        for variant in all_variants:
            reason = variant.fits(shape)
            if reason:
                skipped[variant.name] = reason
                continue
            runs[variant.name] = variant.build(problem)
        first, results = first_calls(runs)
        for name, result in results.items():  # every variant must give the same sum of log Z
            if name == FLOOR:
                continue
            total = float(np.sum(np.asarray(result, np.float64)))
            error = abs(total - float(np.sum(reference))) / max(1.0, abs(float(np.sum(reference))))
            if error > 1e-4:
                raise AssertionError(f"{name} at {shape}: log Z differs from numpy float64 by {error:.2e} (relative)")
        timings = {name: (first[name], times) for name, (_, times) in time_interleaved(runs, repeats, budget_s).items()}
        by_name = {v.name: v for v in all_variants}
        for name, (first, times) in timings.items():
            median = statistics.median(times)
            records.append(
                {
                    "shape": list(shape),
                    "variant": name,
                    "peer": by_name[name].peer,
                    "form": by_name[name].form,
                    "median_s": median,
                    "min_s": min(times),
                    "repeats": len(times),
                    "first_call_s": first,
                    "compile_s": max(first - median, 0.0) if by_name[name].peer == "lossfns" else None,
                    "tokens_per_s": B * T / median,
                }
            )
            log(
                f"{shape!s:>18} {name:<36} {median * 1e3:10.2f} ms (min {min(times) * 1e3:9.2f})  "
                f"{B * T / median:12.0f} tok/s  "
                f"compile {max(first - median, 0.0):6.2f} s"
            )
        for name, reason in skipped.items():
            records.append(
                {
                    "shape": list(shape),
                    "variant": name,
                    "peer": by_name[name].peer,
                    "form": by_name[name].form,
                    "skipped": reason,
                }
            )
            log(f"{shape!s:>18} {name:<36} skipped: {reason}")
        if on_shape is not None:
            on_shape(records)
    return records


def chain_ratios(records):
    """Speed-ups of the fastest lossfns variant per form over each peer, per
    shape, from medians and (less sensitive to other processes) minima."""
    out = []
    for shape in sorted({tuple(r["shape"]) for r in records}, key=lambda s: SHAPES.index(s) if s in SHAPES else 99):
        timed = [r for r in records if tuple(r["shape"]) == shape and "median_s" in r]
        peers = {r["variant"]: r for r in timed if r["peer"] != "lossfns"}
        for form in ("factored", "per-position"):
            ours = [r for r in timed if r["peer"] == "lossfns" and r["form"] == form]
            if not ours:
                continue
            best = min(ours, key=lambda r: r["median_s"])
            best_min = min(ours, key=lambda r: r["min_s"])
            row = {
                "shape": list(shape),
                "form": form,
                "fastest_lossfns": best["variant"],
                "median_s": best["median_s"],
                "fastest_lossfns_by_min": best_min["variant"],
                "min_s": best_min["min_s"],
            }
            for key, peer in (("torch_struct", "torch-struct per-position log"), ("numpy", f"numpy float64 {form}")):
                if peer in peers:
                    row[f"vs_{key}"] = peers[peer]["median_s"] / best["median_s"]
                    row[f"vs_{key}_min"] = peers[peer]["min_s"] / best_min["min_s"]
            numpy_name = f"numpy float64 {form}"
            if form == "factored" and FLOOR in peers and numpy_name in peers:
                row["floor_vs_numpy"] = peers[numpy_name]["median_s"] / peers[FLOOR]["median_s"]
                row["floor_vs_numpy_min"] = peers[numpy_name]["min_s"] / peers[FLOOR]["min_s"]
            out.append(row)
    return out


# ---------------------------------------------------------------------------
# CRF loss plus gradient against pytorch-crf
# ---------------------------------------------------------------------------


CRF_SHAPES = ((32, 40, 9), (32, 40, 45), (256, 25, 45), (8, 40, 333), (1, 2000, 9))


def _gold_tags(shape, seed: int = 1) -> np.ndarray:
    B, T, L = shape
    return np.random.default_rng(seed).integers(0, L, size=(B, T)).astype(np.int32)


def _lossfns_crf_loss(semiring, mapped: bool = False):
    """The negative log-likelihood of factored potentials summed over the
    batch, `log Z - score`, with its gradient in unary, transitions and start;
    with `mapped`, the default call on one sentence under `jax.vmap` over
    the batch (the "one instance plus vmap" idiom)."""

    def build(problem: Problem, tags):
        potentials = chain.FactoredPotentials(
            jnp.asarray(problem.unary), jnp.asarray(problem.transitions), jnp.asarray(problem.start)
        )
        tags = jnp.asarray(tags)
        if semiring is None:  # the default call
            log_partition = chain.log_partition
        else:
            log_partition = lambda p: chain.forward(semiring, p)

        def loss(p):
            if mapped:
                one = lambda unary, y: (
                    chain.log_partition(p._replace(unary=unary)) - chain.score(p._replace(unary=unary), y)
                )
                return jnp.sum(jax.vmap(one)(p.unary, tags))
            return jnp.sum(log_partition(p) - chain.score(p, tags))

        @jax.jit
        def loss_and_gradient(potentials):
            return jax.value_and_grad(loss)(potentials)

        def run():
            value, _ = jax.block_until_ready(loss_and_gradient(potentials))
            return float(value)

        return run

    return build


def _pytorch_crf_loss():
    """pytorch-crf's `CRF` (batch first, no mask, end transitions 0, so the
    same model): forward plus backward of the summed negative log-likelihood."""
    try:
        import torch
        from torchcrf import CRF
    except ImportError:
        return None

    def build(problem: Problem, tags):
        _B, _T, L = problem.unary.shape
        crf = CRF(L, batch_first=True)
        with torch.no_grad():
            crf.transitions.copy_(torch.tensor(problem.transitions))
            crf.start_transitions.copy_(torch.tensor(problem.start))
            crf.end_transitions.zero_()
        emissions = torch.tensor(problem.unary, requires_grad=True)
        gold = torch.tensor(tags, dtype=torch.long)
        parameters = [emissions, crf.transitions, crf.start_transitions, crf.end_transitions]

        def run():
            loss = -crf(emissions, gold, reduction="sum")
            torch.autograd.grad(loss, parameters)
            return float(loss.detach())

        return run

    return build


def benchmark_crf_loss(shapes=CRF_SHAPES, repeats: int = 7, budget_s: float = 60.0, log=print):
    """CRF negative log-likelihood plus gradient in float32: lossfns's default
    call (`chain.log_partition(potentials) - chain.score(potentials, tags)`,
    factored), `chain.forward` with `Log` and with `Real` (the same exact kernel), the default call
    under a user's `jax.vmap`, and pytorch-crf, side by side; the losses
    must agree to 1e-4 (relative)."""
    builders = {
        "lossfns default": _lossfns_crf_loss(None),
        "lossfns forward(Log)": _lossfns_crf_loss(semirings.Log),
        "lossfns forward(Real)": _lossfns_crf_loss(semirings.Real),
        "lossfns vmap(default)": _lossfns_crf_loss(None, mapped=True),
    }
    pytorch_crf = _pytorch_crf_loss()
    if pytorch_crf is not None:
        builders["pytorch-crf"] = pytorch_crf
    records = []
    for shape in shapes:
        _B, _T, _L = shape
        problem, tags = make_problem(shape), _gold_tags(shape)
        runs = {name: build(problem, tags) for name, build in builders.items()}
        first, results = first_calls(runs)
        reference = results["lossfns default"]
        for name, value in results.items():
            if abs(value - reference) > 1e-4 * max(1.0, abs(reference)):
                raise AssertionError(f"{name} at {shape}: loss {value} differs from lossfns's {reference}")
        timings = time_interleaved(runs, repeats, budget_s)
        record = {"shape": list(shape), "loss": reference, "variants": {}}
        for name, (_, times) in timings.items():
            first_s = first[name]  # the very first call: tracing and compilation included
            median = statistics.median(times)
            record["variants"][name] = {
                "median_s": median,
                "min_s": min(times),
                "repeats": len(times),
                "first_call_s": first_s,
            }
            log(
                f"crf loss {shape!s:>16} {name:<24} {median * 1e3:10.2f} ms (min {min(times) * 1e3:9.2f})  "
                f"first call {first_s:6.2f} s"
            )
        if "pytorch-crf" in record["variants"]:
            peer = record["variants"]["pytorch-crf"]
            record["vs_pytorch_crf"] = {
                name: {"median": peer["median_s"] / v["median_s"], "min": peer["min_s"] / v["min_s"]}
                for name, v in record["variants"].items()
                if name != "pytorch-crf"
            }
            log(
                f"crf loss {shape!s:>16} speed-up over pytorch-crf: "
                + ", ".join(
                    f"{name} {r['median']:.1f}x (min {r['min']:.1f}x)" for name, r in record["vs_pytorch_crf"].items()
                )
            )
        records.append(record)
    return records


# ---------------------------------------------------------------------------
# Sparse forward-backward against the dense chain
# ---------------------------------------------------------------------------


def _support_per_position(seed: int, shape, K: int) -> tuple:
    """`(previous, following)` `[B, T, K]`: K distinct random label pairs at each position."""
    B, T, L = shape
    rng = np.random.default_rng(seed)
    flat = np.stack([rng.choice(L * L, K, replace=False) for _ in range(B * T)]).reshape(B, T, K)
    return tuple(jnp.asarray(x, jnp.int32) for x in np.divmod(flat, L))


def benchmark_sparse(
    shape=(8, 40, 333),
    densities=(0.1, 0.02),
    repeats: int = 7,
    budget_s: float = 60.0,
    log=print,
    per_position: tuple = ((128, 40, 44), 62),
):
    """log Z plus gradients: sparse (O(L + K) per step) against the dense
    per-position chain (real semiring, O(L^2) per step), in float32: at
    `shape` on one support of each density, and at `per_position = (shape,
    K)` on K pairs per position (the conll2000 pair features' largest) with
    shared transitions (the model's form)."""
    cases = [(shape, density, None) for density in densities]
    if per_position:
        cases.append((per_position[0], per_position[1] / per_position[0][2] ** 2, per_position[1]))
    records = []
    for shape, density, per_position_pairs in cases:
        B, T, L = shape
        keys = jax.random.split(jax.random.PRNGKey(1), 5)
        if per_position_pairs is None:
            previous, following = sparse_chain.random_support(keys[0], L, density)
            transitions = None
        else:
            previous, following = _support_per_position(1, shape, per_position_pairs)
            transitions = jax.random.normal(keys[4], (L, L), jnp.float32)
        K = previous.shape[-1]
        potentials = sparse_chain.SparsePotentials(
            2.0 * jax.random.normal(keys[1], (B, T, L), jnp.float32),
            jax.random.normal(keys[2], (B, T, K), jnp.float32),
            jnp.asarray(previous),
            jnp.asarray(following),
            jax.random.normal(keys[3], (L,), jnp.float32),
            transitions,
        )
        lengths = jnp.full((B,), T, jnp.int32)
        fields = (potentials.unary, potentials.pair_weights, potentials.start)

        def with_fields(f):
            return potentials._replace(unary=f[0], pair_weights=f[1], start=f[2])

        sparse_fn = jax.jit(jax.value_and_grad(lambda f: jnp.sum(chain.log_partition(with_fields(f), lengths))))
        dense_fn = jax.jit(
            jax.value_and_grad(lambda f: jnp.sum(chain.log_partition(sparse_chain.to_dense(with_fields(f)), lengths)))
        )
        dense_matrices = sparse_chain.to_dense(potentials)
        dense_given_fn = jax.jit(jax.value_and_grad(lambda p: jnp.sum(chain.log_partition(p, lengths))))
        runs = {
            "sparse": lambda: jax.block_until_ready(sparse_fn(fields)),
            "dense (from the sparse weights)": lambda: jax.block_until_ready(dense_fn(fields)),
            "dense (given [B, T, L, L])": lambda: jax.block_until_ready(dense_given_fn(dense_matrices)),
        }
        first, results = first_calls(runs)
        (sparse_z, sparse_grads), (dense_z, dense_grads) = results["sparse"], results["dense (from the sparse weights)"]
        log_z_error = float(jnp.abs(sparse_z - dense_z) / jnp.abs(dense_z))
        marginal_error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(sparse_grads, dense_grads))
        timings = {name: (first[name], times) for name, (_, times) in time_interleaved(runs, repeats, budget_s).items()}
        medians = {name: statistics.median(times) for name, (_, times) in timings.items()}
        record = {
            "shape": list(shape),
            "support": "one" if per_position_pairs is None else "per position",
            "zero_fraction": 1.0 - K / L**2,
            "nonzero_pairs": K,
            "log_z_relative_error": log_z_error,
            "marginal_max_abs_error": marginal_error,
            "median_s": medians,
            "compile_s": {n: max(f - medians[n], 0.0) for n, (f, _) in timings.items()},
            "speedup_vs_dense_from_weights": medians["dense (from the sparse weights)"] / medians["sparse"],
            "speedup_vs_dense_given": medians["dense (given [B, T, L, L])"] / medians["sparse"],
        }
        records.append(record)
        log(
            f"sparse {shape} {record['support']} support, zeros {record['zero_fraction']:.0%} (K = {K}): "
            f"sparse {medians['sparse'] * 1e3:.1f} ms, "
            f"dense {medians['dense (from the sparse weights)'] * 1e3:.1f} ms "
            f"(given matrices {medians['dense (given [B, T, L, L])'] * 1e3:.1f} ms): "
            f"{record['speedup_vs_dense_from_weights']:.1f}x / {record['speedup_vs_dense_given']:.1f}x; "
            f"log Z rel. error {log_z_error:.1e}, marginals max error {marginal_error:.1e}"
        )
    return records
