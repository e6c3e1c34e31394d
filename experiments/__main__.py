"""Command line: `python -m experiments NAME [--quick] [--out DIR]`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import EXPERIMENTS
from .harness import RunDirectory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__)
    parser.add_argument("name", choices=sorted(EXPERIMENTS), help="which experiment to run")
    parser.add_argument(
        "--quick", action="store_true", help="small data and few iterations (a few minutes on 2 CPU cores)"
    )
    parser.add_argument("--out", default=None, help="output directory (default experiments/results/NAME[-quick])")
    parser.add_argument(
        "--tasks", default=None, help="comma-separated subset of an experiment's tasks (e.g. ner), default all"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="write the tables from the finished units only; train nothing"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    arguments = parser.parse_args(argv)
    default = os.path.join(os.path.dirname(__file__), "results", arguments.name + ("-quick" if arguments.quick else ""))
    out = arguments.out or default
    # The command that computes what is written: a report of finished units
    # (--report-only) is what the same command without that flag produces.
    command = [sys.executable, "-m", "experiments"] + [
        argument for argument in (sys.argv[1:] if argv is None else list(argv)) if argument != "--report-only"
    ]
    run = RunDirectory(out, command, compute_missing=not arguments.report_only)
    module = importlib.import_module(EXPERIMENTS[arguments.name])
    tasks = None if arguments.tasks is None else tuple(arguments.tasks.split(","))
    module.run(run, quick=arguments.quick, progress=not arguments.no_progress, tasks=tasks)
    run.write_command()
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
