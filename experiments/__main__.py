"""Command line: `python -m experiments NAME [--quick] [--out DIR]`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from lossfns import compilation_cache

from . import EXPERIMENTS
from .harness import RunDirectory, UsageError


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
    parser.add_argument(
        "--units",
        default=None,
        help="comma-separated shell patterns of the units to compute (e.g. 'ner-S1-*,pos-*-boosting'); the others are"
        " read back or left missing, as with --report-only (to split one run over processes)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    arguments = parser.parse_args(argv)
    compilation_cache.enable()  # a second run (the README's main job again) re-uses the first one's programs
    default = os.path.join(os.path.dirname(__file__), "results", arguments.name + ("-quick" if arguments.quick else ""))
    out = arguments.out or default
    # The command that computes what is written: a report of finished units
    # (--report-only, or a part of the run: --units) is what the same command
    # without those flags produces.
    command = [sys.executable, "-m", "experiments"] + _without_partial_flags(
        sys.argv[1:] if argv is None else list(argv)
    )
    only = None if arguments.units is None else tuple(arguments.units.split(","))
    run = RunDirectory(out, command, compute_missing=not arguments.report_only, only=only)
    module = importlib.import_module(EXPERIMENTS[arguments.name])
    tasks = None if arguments.tasks is None else tuple(arguments.tasks.split(","))
    try:
        module.run(run, quick=arguments.quick, progress=not arguments.no_progress, tasks=tasks)
    except UsageError as error:
        parser.error(str(error))
    unmatched = run.unmatched_patterns()
    if unmatched:
        # Checked once the run has asked for its units (they are known only then).
        parser.error(
            f"--units: {', '.join(map(repr, unmatched))} matched no unit of {arguments.name}; its units are "
            f"{', '.join(run.names)}"
        )
    run.write_command()
    print(f"results in {out}")
    return 0


def _without_partial_flags(arguments: list[str]) -> list[str]:
    """`arguments` less `--report-only` and `--units PATTERNS` (either spelling)."""
    kept, skip = [], False
    for argument in arguments:
        if skip:
            skip = False
        elif argument == "--units":
            skip = True
        elif argument != "--report-only" and not argument.startswith("--units="):
            kept.append(argument)
    return kept


if __name__ == "__main__":
    sys.exit(main())
