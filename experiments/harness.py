"""What every experiment shares: a run directory with resumable per-unit
results, a Markdown table, a JSON of every number, PNG plots and the exact
command, written next to each other.

A run is split into units (one trained model, one table row). Each finished
unit is written atomically to `OUT/units/NAME.json`, so an interrupted run,
started again with the same command, skips what is done and resumes at the
first unfinished unit.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")  # no display on CI machines; must precede pyplot
import matplotlib.pyplot as plt


def _atomic_write(path: str, text: str) -> None:
    """Write via a temporary file and `os.replace`, so a killed run never
    leaves a half-written file that a resumed run would trust."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(handle, "w") as stream:
        stream.write(text)
    os.chmod(temporary, 0o644)  # mkstemp creates 0600; results are for everyone to read
    os.replace(temporary, path)


class RunDirectory:
    """Outputs of one experiment run under `root`."""

    def __init__(self, root: str, command: list[str] | None = None, *, compute_missing: bool = True):
        self.root = root
        self.compute_missing = compute_missing
        self.command = command if command is not None else [sys.executable, "-m", "experiments"] + sys.argv[1:]
        os.makedirs(os.path.join(root, "units"), exist_ok=True)

    def _unit_path(self, name: str) -> str:
        return os.path.join(self.root, "units", f"{name}.json")

    def unit(self, name: str, compute: Callable[[], dict]) -> dict | None:
        """The result of unit `name`: read back if a previous run finished it,
        else computed now and saved before returning (or `None` without
        `compute_missing`: a report of a run that is still going)."""
        path = self._unit_path(name)
        if os.path.exists(path):
            with open(path) as stream:
                return json.load(stream)
        if not self.compute_missing:
            return None
        result = compute()
        _atomic_write(path, json.dumps(result, indent=1, sort_keys=True))
        return result

    def write_json(self, name: str, data) -> str:
        path = os.path.join(self.root, name)
        _atomic_write(path, json.dumps(data, indent=1, sort_keys=True))
        return path

    def write_text(self, name: str, text: str) -> str:
        path = os.path.join(self.root, name)
        _atomic_write(path, text)
        return path

    def write_command(self) -> str:
        """The command line that produced this directory (relative `python`
        so it can be pasted from the repository root)."""
        arguments = ["python"] + self.command[1:]
        environment = f"NLTK_DATA={os.environ['NLTK_DATA']} " if os.environ.get("NLTK_DATA") else ""
        return self.write_text("COMMAND.txt", environment + shlex.join(arguments) + "\n")

    def save_figure(self, name: str, figure) -> str:
        path = os.path.join(self.root, name)
        figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(figure)
        return path


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A GitHub Markdown table; floats to 2 decimals, `None` as a dash."""
    def cell(value):
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.2f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def floors_section(floors: dict, heading: str, missing: str) -> list[str]:
    """Markdown lines reporting the issue's floors: `floors[name]` holds
    `ours` (None when not measured), `floor`, `met` and `applies` (a full run
    on the real corpus); `missing` says why a value is absent."""
    lines = [f"## Floors ({heading})\n"]
    for name, floor in floors.items():
        status = ("met" if floor["met"] else "NOT met") if floor["applies"] else "not applicable (synthetic or quick)"
        if floor["ours"] is None:
            status = f"not measured yet ({missing})"
        ours = "-" if floor["ours"] is None else f"{floor['ours']:.2f}"
        lines.append(f"- {name}: ours {ours}, floor {floor['floor']}: {status}")
    return lines
