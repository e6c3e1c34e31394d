"""`lossfns.nn.CRF` against pytorch-crf 0.7.2, side by side in one process.

    python -m benchmarks --only nn                  # with the other parts' machinery (JSON + markdown)
    python -m benchmarks.nn_crf_benchmark [--quick] [--tag cpu-2core]

For each shape `(B, T, L)` both layers hold the same parameters (pytorch-crf's
initialisation) and read the same float32 emissions, random gold tags and a
random prefix mask (lengths uniform in `[1, T]`: pytorch-crf needs the first
position on). Timed, each as one call:

* training: the summed negative log-likelihood and its gradient with
  respect to the emissions and the three parameter arrays (lossfns:
  `equinox.filter_jit` of `filter_value_and_grad`; pytorch-crf: `forward`
  plus `torch.autograd.grad`);
* decoding: the best paths (lossfns: `CRF.decode` under `filter_jit`, tags
  back on the host; pytorch-crf: `decode`, lists of lists).

The losses must agree to 1e-4 (relative) and the paths exactly before any
timing. Repeats are interleaved (`chain_benchmark.time_interleaved`);
medians and minima are reported, ratios from the same run; the first call
(tracing and compilation for lossfns) is reported apart.
"""

from __future__ import annotations

import os

# Before torch or XLA start their thread pools (NUMERICS.md 9).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import datetime
import statistics

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from lossfns.nn import CRF

from benchmarks import chain_benchmark

SHAPES = ((32, 40, 9), (32, 40, 45), (256, 25, 45), (8, 40, 333))
QUICK_SHAPES = ((4, 10, 5), (2, 30, 9))


class Problem:
    """Emissions `[B, T, L]` float32, tags `[B, T]`, a prefix mask `[B, T]`, and
    a pytorch-crf layer (or None) whose parameters the lossfns layer copies."""

    def __init__(self, shape, seed: int = 0):
        B, T, L = shape
        rng = np.random.default_rng(seed)
        self.emissions = (2.0 * rng.standard_normal(shape)).astype(np.float32)
        self.tags = rng.integers(0, L, size=(B, T)).astype(np.int64)
        self.mask = np.arange(T) < rng.integers(1, T + 1, size=B)[:, None]
        self.peer = _pytorch_crf(L)
        if self.peer is not None:
            parameters = (self.peer.transitions, self.peer.start_transitions, self.peer.end_transitions)
            self.crf = CRF.from_parameters(*(p.detach().numpy() for p in parameters))
        else:
            self.crf = CRF(L, key=jax.random.key(seed))


def _pytorch_crf(num_tags: int):
    try:
        import torch
        from torchcrf import CRF as TorchCRF
    except ImportError:
        return None
    torch.manual_seed(0)
    return TorchCRF(num_tags, batch_first=True)


@eqx.filter_jit
def _loss_and_gradient(crf, emissions, tags, mask):
    return eqx.filter_value_and_grad(lambda model, e: -jnp.sum(model.log_likelihood(e, tags, mask)))(crf, emissions)


@eqx.filter_jit
def _decode(crf, emissions, mask):
    return crf.decode(emissions, mask)[1]


def lossfns_runs(problem: Problem) -> dict:
    emissions, tags, mask = (jnp.asarray(x) for x in (problem.emissions, problem.tags, problem.mask))

    def train():
        value, _ = jax.block_until_ready(_loss_and_gradient(problem.crf, emissions, tags, mask))
        return float(value)

    def decode():
        return np.asarray(_decode(problem.crf, emissions, mask))

    return {"train": train, "decode": decode}


def pytorch_runs(problem: Problem) -> dict:
    import torch

    peer = problem.peer
    emissions = torch.tensor(problem.emissions, requires_grad=True)
    tags, mask = torch.tensor(problem.tags), torch.tensor(problem.mask)
    parameters = [emissions, peer.transitions, peer.start_transitions, peer.end_transitions]

    def train():
        loss = -peer(emissions, tags, mask, reduction="sum")
        torch.autograd.grad(loss, parameters)
        return float(loss.detach())

    def decode():
        with torch.no_grad():
            return peer.decode(emissions, mask)

    return {"train": train, "decode": decode}


def _check(problem: Problem, results: dict) -> None:
    """Same loss (1e-4 relative) and the same paths, before anything is timed."""
    ours, theirs = results["lossfns train"], results.get("pytorch-crf train")
    if theirs is not None and abs(ours - theirs) > 1e-4 * max(1.0, abs(theirs)):
        raise AssertionError(f"loss {ours} differs from pytorch-crf's {theirs}")
    if "pytorch-crf decode" in results:
        lengths = problem.mask.sum(1)
        paths = [list(row[:n]) for row, n in zip(results["lossfns decode"], lengths)]
        if paths != results["pytorch-crf decode"]:
            raise AssertionError("decoded paths differ from pytorch-crf's")


def benchmark(shapes=SHAPES, repeats: int = 9, budget_s: float = 60.0, log=print) -> list:
    """All shapes; returns one record per (shape, task) with both layers' timings and the ratio."""
    records = []
    for shape in shapes:
        problem = Problem(shape)
        runs = {f"lossfns {task}": run for task, run in lossfns_runs(problem).items()}
        if problem.peer is not None:
            runs.update({f"pytorch-crf {task}": run for task, run in pytorch_runs(problem).items()})
        first, results = chain_benchmark.first_calls(runs)
        _check(problem, results)
        timings = chain_benchmark.time_interleaved(runs, repeats, budget_s)
        for task in ("train", "decode"):
            record = {"shape": list(shape), "task": task, "tokens": int(problem.mask.sum())}
            for library in ("lossfns", "pytorch-crf"):
                name = f"{library} {task}"
                if name in timings:
                    times = timings[name][1]
                    record[library] = {
                        "median_s": statistics.median(times),
                        "min_s": min(times),
                        "repeats": len(times),
                        "first_call_s": first[name],
                    }
            if "pytorch-crf" in record:
                record["speedup_median"] = record["pytorch-crf"]["median_s"] / record["lossfns"]["median_s"]
                record["speedup_min"] = record["pytorch-crf"]["min_s"] / record["lossfns"]["min_s"]
            records.append(record)
            ours = record["lossfns"]
            peer = record.get("pytorch-crf", {"median_s": float("nan")})
            log(
                f"nn.CRF {task:<6} {tuple(shape)!s:>16}  lossfns {ours['median_s'] * 1e3:8.2f} ms "
                f"(min {ours['min_s'] * 1e3:7.2f}, first call {ours['first_call_s']:5.2f} s)  pytorch-crf "
                f"{peer['median_s'] * 1e3:8.2f} ms  speed-up {record.get('speedup_median', float('nan')):6.1f}x "
                f"(min {record.get('speedup_min', float('nan')):6.1f}x)"
            )
    return records


def markdown(records) -> list:
    """The markdown lines of the results (a section of `python -m benchmarks`' report)."""
    lines = [
        "## nn.CRF vs pytorch-crf (float32, random prefix masks)",
        "",
        "| (B, T, L) | task | lossfns ms (median; min) | pytorch-crf ms (median; min) | speed-up (median; min) "
        "| lossfns first call s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in records:
        ours, peer = r["lossfns"], r.get("pytorch-crf")
        peer_cell = f"{peer['median_s'] * 1e3:.2f}; {peer['min_s'] * 1e3:.2f}" if peer else "n/a"
        speedup = f"{r['speedup_median']:.1f}x; {r['speedup_min']:.1f}x" if peer else "n/a"
        task = "loss + gradient" if r["task"] == "train" else "decode"
        lines.append(
            f"| {tuple(r['shape'])} | {task} | {ours['median_s'] * 1e3:.2f}; {ours['min_s'] * 1e3:.2f} | "
            f"{peer_cell} | {speedup} | {ours['first_call_s']:.2f} |"
        )
    return lines + [""]


def main(argv=None):
    from benchmarks.__main__ import RESULTS, describe_machine, write

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes and few repeats (a smoke run)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of repeats per shape at most")
    parser.add_argument("--tag", default="cpu", help="suffix of the result files, e.g. the machine")
    args = parser.parse_args(argv)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": describe_machine(),
        "command": "python -m benchmarks.nn_crf_benchmark "
        + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
    }
    report["nn"] = benchmark(QUICK_SHAPES if args.quick else SHAPES, 3 if args.quick else args.repeats, args.budget)
    stem = os.path.join(RESULTS, f"nn-crf-{args.tag}{'-quick' if args.quick else ''}")
    write(report, stem)
    print(f"wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
