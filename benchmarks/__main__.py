"""Run the benchmarks side by side in one process, print tables, write JSON
and a markdown summary to `benchmarks/results/`.

    python -m benchmarks                     # chain, sparse, training (NER, POS) and perceptron vs CRFsuite
    python -m benchmarks --quick             # a smoke run: small shapes, few repeats
    python -m benchmarks --only chain        # one part: chain, crf, sparse, training or perceptron
    python -m benchmarks --only crf          # CRF loss plus gradient vs pytorch-crf
    python -m benchmarks --only nn           # the nn.CRF layer vs pytorch-crf (masked, end transitions)
    python -m benchmarks --only perceptron --tag cpu-perceptron   # averaged perceptron vs CRFsuite
    python -m benchmarks --only sklearn --tag cpu-sklearn         # sklearn-crfsuite's tutorial, both estimators
    python -m benchmarks --only everyday --tag cpu-2core          # fit, predict, search: fresh processes
    python -m benchmarks --only margin --tag cpu-2core            # pa and arow on all of CoNLL-2002
    python -m benchmarks --only cli --tag cpu-2core               # `lossfns label` vs `wapiti label` (WAPITI=...)

Peers (torch==2.13.0 with torch-struct 0.5 and pytorch-crf 0.7.2, python-crfsuite) are installed
with pip into the running interpreter when missing (`--no-install` to skip
them instead). Timings on shared machines drift: compare the ratios, which
come from the same run.
"""

from __future__ import annotations

import os

# Before torch or XLA start their thread pools: spinning OpenMP threads of
# torch steal the cores from XLA's and make both 10x noisier (NUMERICS.md 9).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import datetime
import importlib
import json
import platform
import subprocess
import sys

PEERS = {
    "torch": "torch==2.13.0",
    "torch_struct": "torch-struct==0.5",
    "torchcrf": "pytorch-crf==0.7.2",
    "pycrfsuite": "python-crfsuite",
    "sklearn_crfsuite": "sklearn-crfsuite",
}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def ensure_peers(install: bool, log=print):
    """Import each peer, pip-installing the missing ones when `install`."""
    available = {}
    for module, requirement in PEERS.items():
        try:
            importlib.import_module(module)
            available[module] = True
            continue
        except ImportError:
            available[module] = False
        if install:
            log(f"installing {requirement} ...")
            done = subprocess.run(
                [sys.executable, "-m", "pip", "install", requirement], capture_output=True, check=False, text=True
            )
            if done.returncode == 0:
                importlib.invalidate_caches()
                try:
                    importlib.import_module(module)
                    available[module] = True
                except ImportError as error:
                    log(f"  installed but not importable: {error}")
            else:
                log(f"  pip failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return available


def describe_machine():
    import jax
    import numpy as np

    from experiments.harness import machine

    versions = {"python": platform.python_version(), "jax": jax.__version__, "numpy": np.__version__}
    for module in ("torch", "torch_struct", "torchcrf", "pycrfsuite"):
        try:
            versions[module] = getattr(importlib.import_module(module), "__version__", "installed")
        except ImportError:
            versions[module] = None
    return {
        **machine(),
        "jax_devices": [str(d) for d in jax.devices()],
        "platform": platform.platform(),
        "versions": versions,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "float": "float32 (numpy reference: float64)",
    }


def markdown(report) -> str:
    machine = report["machine"]
    lines = [
        f"# lossfns benchmarks ({report['date']})",
        "",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, "
        f"{machine['memory_gib']:.0f} GiB, devices {machine['jax_devices']}; load average at start "
        f"{machine['load_average_at_start']}; versions {machine['versions']}. "
        "Medians of interleaved repeats in one process; ratios from the same run.",
        "",
    ]
    if "note" in report:
        lines += [report["note"], ""]
    if "chain" in report:
        lines += [
            "## Chain: log-partition plus marginals (float32)",
            "",
            "| (B, T, L) | variant | median ms | min ms | tokens/s (median) | compile s |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for r in report["chain"]["records"]:
            if "median_s" in r:
                compile_s = f"{r['compile_s']:.2f}" if r["compile_s"] is not None else "-"
                lines.append(
                    f"| {tuple(r['shape'])} | {r['variant']} | {r['median_s'] * 1e3:.2f} | {r['min_s'] * 1e3:.2f} | "
                    f"{r['tokens_per_s']:,.0f} | {compile_s} |"
                )
            else:
                lines.append(f"| {tuple(r['shape'])} | {r['variant']} | skipped: {r['skipped']} | | | |")
        lines += [
            "",
            "Speed-up of the fastest lossfns variant of each form:",
            "",
            "| (B, T, L) | form | fastest lossfns variant | vs torch-struct (median; min) "
            "| vs numpy float64 (median; min) | numpy over the products-only floor (median; min) |",
            "|---|---|---|---:|---:|---:|",
        ]
        ratio = lambda r, key: f"{r[key]:.1f}x; {r[key + '_min']:.1f}x" if key in r else "n/a"
        for r in report["chain"]["ratios"]:
            torch_ratio, numpy_ratio = ratio(r, "vs_torch_struct"), ratio(r, "vs_numpy")
            lines.append(
                f"| {tuple(r['shape'])} | {r['form']} | {r['fastest_lossfns']} | {torch_ratio} | {numpy_ratio} "
                f"| {ratio(r, 'floor_vs_numpy')} |"
            )
        lines += [
            "",
            "The last column bounds what any XLA forward-backward of the factored form could gain on "
            "numpy at that shape: numpy's whole forward-backward over the time of the matrix products alone.",
            "",
        ]
        lines.append("")
    if "crf" in report:
        names = [n for n in report["crf"][0]["variants"] if n != "pytorch-crf"] if report["crf"] else []
        lines += [
            "## CRF negative log-likelihood plus gradient vs pytorch-crf (float32, factored)",
            "",
            "| (B, T, L) | "
            + " | ".join(f"{n} ms" for n in names)
            + " | pytorch-crf ms | "
            + " | ".join(f"{n} vs pytorch-crf (median; min)" for n in names)
            + " |",
            "|---|" + "---:|" * (2 * len(names) + 1),
        ]
        for r in report["crf"]:
            v = r["variants"]
            peer = f"{v['pytorch-crf']['median_s'] * 1e3:.2f}" if "pytorch-crf" in v else "n/a"
            speedups = [
                f"{r['vs_pytorch_crf'][n]['median']:.1f}x; {r['vs_pytorch_crf'][n]['min']:.1f}x"
                if "vs_pytorch_crf" in r
                else "n/a"
                for n in names
            ]
            lines.append(
                f"| {tuple(r['shape'])} | "
                + " | ".join(f"{v[n]['median_s'] * 1e3:.2f}" for n in names)
                + f" | {peer} | "
                + " | ".join(speedups)
                + " |"
            )
        lines += ["", "First calls (compilation included) are in the JSON (`first_call_s`).", ""]
    if "everyday" in report:
        from benchmarks import everyday_benchmark

        lines += everyday_benchmark.markdown(report["everyday"])
    if "margin" in report:
        from benchmarks import online_margin_benchmark

        lines += online_margin_benchmark.markdown(report["margin"])
    if "cli" in report:
        from benchmarks import cli_benchmark

        lines += cli_benchmark.markdown(report["cli"])
    if "nn" in report:
        from benchmarks import nn_crf_benchmark

        lines += nn_crf_benchmark.markdown(report["nn"])
    if "sparse" in report:
        lines += [
            "## Sparse forward-backward (Lavergne 4.1) vs dense, log Z plus gradients (float32)",
            "",
            "| (B, T, L) | support | zero label-pair weights | sparse ms | dense ms (from weights) "
            "| dense ms (given matrices) | speed-up | log Z rel. error | marginals max error |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in report["sparse"]:
            m = r["median_s"]
            lines.append(
                f"| {tuple(r['shape'])} | {r.get('support', 'one')} | {r['zero_fraction']:.0%} | {m['sparse'] * 1e3:.1f} | "
                f"{m['dense (from the sparse weights)'] * 1e3:.1f} | {m['dense (given [B, T, L, L])'] * 1e3:.1f} | "
                f"{r['speedup_vs_dense_from_weights']:.1f}x / {r['speedup_vs_dense_given']:.1f}x | "
                f"{r['log_z_relative_error']:.1e} | {r['marginal_max_abs_error']:.1e} |"
            )
        lines.append("")
    if "training" in report:
        for task, result in report["training"].items():
            lines += [f"## Training vs CRFsuite: {task}", "", "```", json.dumps(result, indent=2), "```", ""]
    if "sklearn" in report:
        from benchmarks import sklearn_benchmark

        lines += sklearn_benchmark.markdown(report["sklearn"])
    if "perceptron" in report:
        lines += ["## Averaged perceptron epoch vs CRFsuite (conll2000, joint POS|chunk labels)", ""]
        result = report["perceptron"]
        if "ratios" in result:
            crf, ours = result["crfsuite"], result["lossfns"]
            lines += [
                "| | epoch s (median) | compile s | test token accuracy |",
                "|---|---:|---:|---|",
                f"| CRFsuite ap | {crf['median_epoch_seconds']:.2f} (train() wall "
                f"{crf['median_train_wall_seconds']:.2f}) | - | "
                + ", ".join(f"{e} ep: {a:.4f}" for e, a in crf["test_token_accuracy"].items())
                + " |",
                f"| lossfns sparse_perceptron_epoch | {ours['median_epoch_seconds']:.3f} | "
                f"{ours['compile_seconds']:.1f} | "
                + ", ".join(f"{e} ep: {a:.4f}" for e, a in ours["test_token_accuracy"].items())
                + " |",
                "",
                f"CRFsuite epoch / lossfns epoch: {result['ratios']['crfsuite_epoch_over_lossfns_epoch']:.1f}x",
                "",
            ]
        lines += ["```", json.dumps(result, indent=2), "```", ""]
    return "\n".join(lines)


def write(report, stem):
    """The JSON and markdown files of `report` (rewritten as parts finish)."""
    os.makedirs(RESULTS, exist_ok=True)
    with open(stem + ".json", "w") as out:
        json.dump(report, out, indent=2)
    with open(stem + ".md", "w") as out:
        out.write(markdown(report))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--only",
        choices=("chain", "crf", "nn", "sparse", "training", "perceptron", "sklearn", "everyday", "margin", "cli"),
        action="append",
    )
    parser.add_argument("--quick", action="store_true", help="small shapes and few repeats (a smoke run)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of repeats per shape at most")
    parser.add_argument("--no-install", action="store_true", help="skip missing peers instead of installing them")
    parser.add_argument("--tag", default="cpu", help="suffix of the result files, e.g. the device")
    parser.add_argument("--shapes", help="chain shapes BxTxL, comma-separated (default: the five of issue 8)")
    parser.add_argument("--iterations", type=int, default=100, help="training iterations of each trainer")
    parser.add_argument("--training-tasks", default="ner,pos", help="training: ner (CoNLL-2002), pos (conll2000)")
    parser.add_argument("--epochs", default="1,5", help="perceptron: test accuracy after these epochs")
    args = parser.parse_args(argv)
    parts = args.only or ["chain", "crf", "sparse", "training", "perceptron"]

    ensure_peers(not args.no_install)
    from benchmarks import chain_benchmark

    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": describe_machine(),
        "command": " ".join(["python -m benchmarks"] + (argv or sys.argv[1:])),
    }
    repeats = 3 if args.quick else args.repeats
    stem = os.path.join(RESULTS, f"benchmarks-{args.tag}{'-quick' if args.quick else ''}")
    if "chain" in parts:
        shapes = ((4, 10, 5), (2, 200, 9)) if args.quick else chain_benchmark.SHAPES
        if args.shapes:
            shapes = tuple(tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(","))

        def save_partial(records):
            report["chain"] = {"records": records, "ratios": chain_benchmark.chain_ratios(records)}
            write(report, stem)

        records = chain_benchmark.benchmark_chain(shapes, repeats, args.budget, on_shape=save_partial)
        report["chain"] = {"records": records, "ratios": chain_benchmark.chain_ratios(records)}
        for row in report["chain"]["ratios"]:
            print(
                f"{tuple(row['shape'])!s:>18} {row['form']:<13} {row['fastest_lossfns']:<36} "
                f"vs torch-struct {row.get('vs_torch_struct', float('nan')):7.1f}x "
                f"(min {row.get('vs_torch_struct_min', float('nan')):7.1f}x)   "
                f"vs numpy {row.get('vs_numpy', float('nan')):7.1f}x (min {row.get('vs_numpy_min', float('nan')):7.1f}x)"
            )
    if "crf" in parts:
        shapes = ((4, 10, 5), (2, 200, 9)) if args.quick else chain_benchmark.CRF_SHAPES
        report["crf"] = chain_benchmark.benchmark_crf_loss(shapes, repeats, args.budget)
        write(report, stem)
    if "nn" in parts:
        from benchmarks import nn_crf_benchmark

        shapes = nn_crf_benchmark.QUICK_SHAPES if args.quick else nn_crf_benchmark.SHAPES
        report["nn"] = nn_crf_benchmark.benchmark(shapes, repeats, args.budget)
        write(report, stem)
    if "sparse" in parts:
        shape = (2, 10, 50) if args.quick else (8, 40, 333)
        per_position = ((2, 10, 12), 6) if args.quick else ((128, 40, 44), 62)
        report["sparse"] = chain_benchmark.benchmark_sparse(
            shape, repeats=repeats, budget_s=args.budget, per_position=per_position
        )
        write(report, stem)
    if "training" in parts:
        try:
            from benchmarks import training_benchmark
        except ImportError as error:
            print(f"training benchmark unavailable: {error}")
        else:
            report["training"] = {}
            for task in args.training_tasks.split(","):
                report["training"][task] = training_benchmark.run(
                    quick=args.quick, iterations=args.iterations, task=task
                )
                write(report, stem)

    if "perceptron" in parts:
        from benchmarks import perceptron_benchmark

        report["perceptron"] = perceptron_benchmark.run(
            quick=args.quick, epochs=[int(e) for e in args.epochs.split(",")], repeats=min(repeats, 3)
        )

    if "sklearn" in parts:
        from benchmarks import sklearn_benchmark

        report["sklearn"] = sklearn_benchmark.run(quick=args.quick)
    if "everyday" in parts:
        from benchmarks import everyday_benchmark

        report["everyday"] = everyday_benchmark.run(quick=args.quick)
    if "margin" in parts:
        from benchmarks import online_margin_benchmark

        report["margin"] = online_margin_benchmark.run(quick=args.quick)
    if "cli" in parts:
        from benchmarks import cli_benchmark

        report["cli"] = cli_benchmark.run(quick=args.quick)
    write(report, stem)
    print(f"wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
