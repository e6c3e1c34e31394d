"""What every experiment shares: a run directory with resumable per-unit
results, a Markdown table, a JSON of every number, PNG plots and the exact
command, written next to each other.

A run is split into units (one trained model, one table row). Each finished
unit is written atomically to `OUT/units/NAME.json`, so an interrupted run,
started again with the same command, skips what is done and resumes at the
first unfinished unit.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Callable

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")  # no display on CI machines; must precede pyplot
import matplotlib.pyplot as plt


class UsageError(ValueError):
    """A command-line argument an experiment refuses (`--tasks`, `--units`):
    `python -m experiments` prints it as a usage error, without a traceback."""


def select_tasks(experiment: str, tasks, known) -> tuple:
    """The tasks to run, in `known`'s order: all of `known` when `tasks` is
    None, else those named in `tasks`; a name not in `known` is a
    `UsageError` (silently dropped, it would leave nothing to run)."""
    if tasks is None:
        return tuple(known)
    unknown = [task for task in tasks if task not in known]
    if unknown:
        raise UsageError(f"--tasks: {experiment}'s tasks are {', '.join(known)}; got {', '.join(map(repr, unknown))}")
    return tuple(task for task in known if task in tasks)


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


def _as_json(value):
    """`value` as it reads back from JSON (tuples become lists), for comparing settings."""
    return json.loads(json.dumps(value, sort_keys=True))


class RunDirectory:
    """Outputs of one experiment run under `root`."""

    def __init__(
        self,
        root: str,
        command: list[str] | None = None,
        *,
        compute_missing: bool = True,
        only: tuple[str, ...] | None = None,
    ):
        self.root = root
        self.compute_missing = compute_missing
        # `only`: shell-style patterns (`ner-*-boosting`) of the units this
        # run may compute; any other unit is read back or reported missing,
        # as without `compute_missing`, so a long run can be split over
        # processes (one per core) that each take their own units.
        self.only = only
        self.command = command if command is not None else [sys.executable, "-m", "experiments"] + sys.argv[1:]
        self.missing: list[str] = []  # units a report (no `compute_missing`) found unfinished, in order
        self.names: list[str] = []  # every unit asked for, in order
        os.makedirs(os.path.join(root, "units"), exist_ok=True)

    def unit_path(self, name: str) -> str:
        """Where unit `name`'s result is saved (it exists once the unit is done)."""
        return os.path.join(self.root, "units", f"{name}.json")

    def unit(
        self, name: str, compute: Callable[[], dict], settings=None, legacy: Callable[[dict], bool] | None = None
    ) -> dict | None:
        """The result of unit `name`: read back if a previous run finished it
        with the same `settings` (any JSON value: the configuration that
        decides the result, saved with it as `unit_settings`), else computed
        now and saved before returning (or `None` without `compute_missing`:
        a report of a run that is still going). A unit saved before settings
        were recorded stands if `legacy(result)` says it does (its stored
        fields show it was run as these settings would run it). Without
        `compute_missing`, a unit of other settings is returned marked
        `"stale": True` (a report shows what was run, and says so:
        `stale_note`)."""
        self.names.append(name)
        path = self.unit_path(name)
        computes = self._computes(name)
        if os.path.exists(path):
            with open(path) as stream:
                result = json.load(stream)
            stored = result.get("unit_settings")
            if (
                settings is None
                or stored == _as_json(settings)
                or (stored is None and legacy is not None and legacy(result))
            ):
                return result
            if not computes:
                return result | {"stale": True, "unit": name}
        if not computes:
            self.missing.append(name)
            return None
        result = compute()
        if settings is not None:
            result = result | {"unit_settings": _as_json(settings)}
        _atomic_write(path, json.dumps(result, indent=1, sort_keys=True))
        return result

    def unmatched_patterns(self) -> list[str]:
        """The patterns of `only` that matched none of the units asked for so far."""
        return [p for p in self.only or () if not any(fnmatch.fnmatchcase(name, p) for name in self.names)]

    def _computes(self, name: str) -> bool:
        """Whether this run computes unit `name` when it is missing or stale."""
        return self.compute_missing and (self.only is None or any(fnmatch.fnmatchcase(name, p) for p in self.only))

    def read_json(self, name: str):
        """What `write_json(name, ...)` wrote, or None when there is no such file."""
        path = os.path.join(self.root, name)
        if not os.path.exists(path):
            return None
        with open(path) as stream:
            return json.load(stream)

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


# ---------------------------------------------------------------------------
# Convergence: whether a trained row ran to its criterion, and verdicts that
# are judged only from rows that did
# ---------------------------------------------------------------------------


def trace_convergence(trace, rule, cap: int, criterion: str, failure: str | None = None) -> dict:
    """Whether the objective `trace` (`[steps]`, one value per step) met the
    library's stop rule `rule` (`lossfns.optimizers.relative_change_below`,
    `relative_improvement_below`: the rule the training loop itself asked,
    read here host-side on the stored trace), and at which step.

    Returns `{"met", "criterion", "step", "cap", "last_relative_change",
    "failure", "rise"}`: `step` is the first step at which the rule fired
    (None: never, the run stopped at its `cap` or on a failure);
    `last_relative_change` is `|f_{k-1} - f_k| / max(|f_k|, 1)` at the last
    step (how far from the criterion a capped run stopped); `failure`: why
    the run stopped short of both (e.g. a failed line search), shown by
    `converged_cell`; `rise`: `(f_k - f_{k-1}) / max(|f_{k-1}|, 1)` when the
    objective rose at the step `k` the rule fired (CRFsuite's rule fires on
    any rise: a step the line search should have refused), else None."""
    values = np.asarray(trace, np.float64)
    fired = _rule_fired_at_each_step(rule, values)
    step = next((k + 1 for k, stop in enumerate(fired) if stop), None)
    cap = cap if step is not None else min(int(cap), int(values.size))  # an earlier configuration's cap
    last = (abs(values[-2] - values[-1]) / max(abs(values[-1]), 1.0)) if values.size >= 2 else None
    rise = None
    if step is not None and step >= 2 and values[step - 1] > values[step - 2]:
        rise = float((values[step - 1] - values[step - 2]) / max(abs(values[step - 2]), 1.0))
    return {
        "met": step is not None,
        "criterion": criterion,
        "step": step,
        "cap": int(cap),
        "last_relative_change": None if last is None else float(last),
        "failure": None if step is not None else failure,
        "rise": rise,
    }


def _rule_fired_at_each_step(rule, values: np.ndarray) -> np.ndarray:
    """`[S]` bool: whether the stop `rule` fires after each of the `S` steps
    of `values`. The trace is padded with NaN to a power of two (at least
    64) and the rule read by one jitted program per padded length: op by op,
    each trace length compiled every operation of the rule afresh (about 20
    programs a row, 18 s of a 4-minute quick run on 2 shared cores)."""
    size = max(64, 1 << int(values.size).bit_length())
    padded = np.full(size, np.nan)
    padded[: values.size] = values
    return np.asarray(_rule_at_steps(rule, jnp.asarray(padded)))[: values.size]


@functools.partial(jax.jit, static_argnums=0)
def _rule_at_steps(rule, padded):
    """`rule(padded, k)` for `k = 1 .. len(padded)`."""
    return jax.vmap(lambda k: rule(padded, k))(jnp.arange(1, padded.size + 1))


def lbfgs_failure(row: dict) -> str | None:
    """Why an L-BFGS row's run stopped early, from its unit's `status` and
    `restarts` (`tagging.train`), or None."""
    if row.get("status") != "LINE_SEARCH_FAILED":
        return None
    return f"line search failed at step {len(row['objective_trace'])} after {row.get('restarts', 0)} restarts"


def plateau_convergence(
    steps, scores, patience: int, cap: int, criterion: str, *, lower_is_better: bool, relative_patience: float = 0.0
) -> dict:
    """Whether a development-set score stopped improving: met at the first
    evaluated step that lies `max(patience, relative_patience * best step)`
    steps (or evaluations, as `steps` counts them) after the best score so
    far (`relative_patience = 1`: the best step lies in the first half of
    the run). `steps`, `scores`: `[E]` the evaluated steps and their scores.
    Same fields as `trace_convergence`, plus `best_step` (the best score's
    step up to where the rule was met). A driver callback that returns
    `met` on the scores so far stops the run by this same rule."""
    steps, scores = list(steps), [float(s) for s in scores]
    sign = 1.0 if lower_is_better else -1.0
    best, met = 0, None
    for i in range(len(scores)):
        if sign * scores[i] < sign * scores[best]:
            best = i
        if steps[i] - steps[best] >= max(patience, relative_patience * steps[best]):
            met = i
            break
    cap = cap if met is not None or not steps else min(int(cap), int(steps[-1]))  # an earlier configuration's cap
    return {
        "met": met is not None,
        "criterion": criterion,
        "step": None if met is None else int(steps[met]),
        "cap": int(cap),
        "best_step": int(steps[best]) if steps else None,
        "last_relative_change": None,
    }


def stale_note(rows) -> list[str]:
    """Markdown lines naming the rows read from units of an earlier
    configuration (`RunDirectory.unit` without `compute_missing`)."""
    names = sorted({row["unit"] for row in rows if row.get("stale")})
    if not names:
        return []
    return [
        f"Rows from units of an earlier configuration (a run of the command recomputes them): {', '.join(names)}.",
        "",
    ]


def missing_note(run: RunDirectory) -> list[str]:
    """Markdown lines naming the units a report found unfinished."""
    if not run.missing:
        return []
    return [f"Units not run yet (a run of the command computes them): {', '.join(run.missing)}.", ""]


def converged_cell(convergence: dict | None) -> str:
    """The `converged` column: the criterion met at step k (and, when the
    objective rose at that step, by how much), or "not converged" with why
    (the cap reached or the failure that stopped the run, with the last
    relative change)."""
    if convergence is None:
        return "-"
    if convergence["met"]:
        rise = convergence.get("rise")
        how = "" if rise is None else f", on a rise of the objective ({rise:.1e} relative)"
        return f"yes: {convergence['criterion']} at step {convergence['step']}{how}"
    change, best = convergence.get("last_relative_change"), convergence.get("best_step")
    why = convergence.get("failure") or f"cap {convergence['cap']} reached"
    why += "" if change is None else f", last relative change {change:.1e}"
    why += "" if best is None else f", best development score at step {best}"
    return f"not converged ({why})"


def verdict(holds: bool | None, *, quick: bool, converged: bool, current: bool = True, time_boxed: bool = False) -> str:
    """A published claim's verdict: HOLDS / DOES NOT HOLD only when judged
    from a full run's converged rows of the current configuration
    (`current`: none read from a stale unit); else why it is not judged
    (`time_boxed`: a row's run was stopped by its time box)."""
    if quick:
        return "not judged (quick run)"
    if holds is None:
        return "not tested"
    if time_boxed:
        return "not judged (time-boxed)"
    if not converged:
        return "not judged (not converged)"
    if not current:
        return "not judged (rows of an earlier configuration)"
    return "HOLDS" if holds else "DOES NOT HOLD"


def machine() -> dict:
    """The machine a measurement ran on: `{cpu, logical_cores, memory_gib,
    load_average_at_start}` (the load average over the last 1, 5 and 15
    minutes: near 0 on an idle machine)."""
    cpu, memory_gib = platform.processor() or "unknown", None
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as info:
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    with contextlib.suppress(OSError, StopIteration), open("/proc/meminfo") as info:
        memory_gib = int(next(line.split()[1] for line in info if line.startswith("MemTotal"))) / 1024**2
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
