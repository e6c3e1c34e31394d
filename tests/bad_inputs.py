"""What the bad-input tests share: the small inputs their cases build, the
two checks a case makes, and the table of every case (the reliability page's,
docs/reliability.md), gathered from the files that hold them.

Each package's cases live beside its tests (`tests/<package>/test_*_bad_inputs.py`,
listed in `CASE_MODULES`), as `CASES`: (id, description of the bad input, call
taking tmp_path, exception, words its message must contain), and, where the
package has them, `UNDER_JIT_CASES`: (id, description of a bad input inside
sequence 0's length that no check can see under `jax.jit`, call -> (values,
gradients)). `python tests/test_bad_inputs.py` prints the table in Markdown.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import corpora
from lossfns.lattices.chain import FactoredPotentials
from lossfns.nn import CRF

# The files that hold cases, in the table's order (tests/test_bad_inputs.py
# checks that every `test_*_bad_inputs.py` under tests/ is listed).
CASE_MODULES = (
    "tests.semirings.test_semirings_bad_inputs",
    "tests.lattices.test_chain_bad_inputs",
    "tests.lattices.test_dag_bad_inputs",
    "tests.losses.test_losses_bad_inputs",
    "tests.features.test_features_bad_inputs",
    "tests.models.test_models_bad_inputs",
    "tests.optimizers.test_optimizers_bad_inputs",
    "tests.training.test_training_bad_inputs",
    "tests.applications.test_applications_bad_inputs",
    "tests.experiments.test_experiments_bad_inputs",
    "tests.test_bad_inputs",
)

T, L = 3, 2
NAN = float("nan")
INF = float("inf")
WIDE = 2**32 + 2  # an int64 that int32 reads as 2


def potentials(**changes):
    """Zero potentials [2, T, L, L]; `i011=v` sets index (0, 1, 1) to v."""
    p = np.zeros((2, T, L, L))
    for index, value in changes.items():
        p[tuple(int(c) for c in index[1:])] = value
    return jnp.asarray(p)


GOOD = potentials


def factored(unary=None, transitions=None, start=None):
    return FactoredPotentials(
        jnp.zeros((2, T, L)) if unary is None else unary,
        jnp.zeros((L, L)) if transitions is None else transitions,
        start,
    )


def x32(call):
    """Run `call` with jax_enable_x64 off (as users run, and this suite by
    default), where JAX's integer type is int32 and an int64 value could wrap."""
    with jax.enable_x64(False):
        return call()


def squares(params, batch=None):
    return jnp.sum(params**2) if batch is None else jnp.sum((params - batch) ** 2)


EXAMPLES = jnp.zeros((4, 2))  # a 4-example data set for the stochastic optimizers


def column_file(tmp_path, data: bytes, labelled=False):
    path = tmp_path / "bad.conll"
    path.write_bytes(data)
    return corpora.read_column_file(path, labelled=labelled)


def within(seconds: int, call):
    """`call()`, or a TimeoutError once it has blocked for `seconds` (a read
    of a FIFO would wait for a writer forever)."""

    def alarm(*_):
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def fifo(tmp_path, name):
    path = tmp_path / name
    os.mkfifo(path)
    return path


def command_line(main, arguments):
    """Run a command line's `main(arguments)`; a refusal (a non-zero exit
    status) raises SystemExit with the status and the last line of stderr."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            status = main(arguments)
        except SystemExit as exit:
            status = exit.code
    if status:
        raise SystemExit(f"exit status {status}: {errors.getvalue().strip().splitlines()[-1]}")
    return status


# ---------------------------------------------------------------------------
# Under plain jit (nn.CRF and the chain losses)
# ---------------------------------------------------------------------------

CRF_MODEL = CRF(L, key=jax.random.key(0))
EMISSIONS = jax.random.normal(jax.random.key(1), (2, T, L))
TAGS = jnp.array([[0, 1, 0], [1, 1, 0]])


def under_jit(loss, emissions=EMISSIONS, tags=TAGS):
    """`(loss [2], d sum(loss) / d emissions [2, T, L])` of `loss(emissions,
    tags)`, both under `jax.jit` (sequence 0 holds the bad input)."""
    value_and_grad = lambda e, t: (loss(e, t), jax.grad(lambda e: jnp.sum(loss(e, t)))(e))
    return jax.jit(value_and_grad)(emissions, tags)


# ---------------------------------------------------------------------------
# The two checks, and the test ids
# ---------------------------------------------------------------------------


def case_ids(cases):
    return [case.values[0] if hasattr(case, "values") else case[0] for case in cases]


def assert_raises_a_named_error(tmp_path, description, call, error, words):
    """`call(tmp_path)` raises `error` with each of `words` in its message."""
    with pytest.raises(error) as raised:
        call(tmp_path)
    message = str(raised.value)
    for word in words:
        assert word in message, f"{description}: {word!r} not in {message!r}"


def assert_nan_in_sequence_0_only(description, call):
    """`call() -> (values, gradients)`: sequence 0's value and gradient are
    NaN, sequence 1's finite."""
    values, gradients = call()
    assert np.isnan(values[0]) and np.isnan(gradients[0]).any(), f"{description}: {values[0]}, {gradients[0]}"
    assert np.isfinite(values[1]) and np.isfinite(gradients[1]).all(), "the other sequence is untouched"


# ---------------------------------------------------------------------------
# The table of every case
# ---------------------------------------------------------------------------


def case_modules():
    return [importlib.import_module(name) for name in CASE_MODULES]


def all_cases():
    """`(CASES, UNDER_JIT_CASES)` of every file in `CASE_MODULES`, in order."""
    modules = case_modules()
    return (
        [case for module in modules for case in getattr(module, "CASES", [])],
        [case for module in modules for case in getattr(module, "UNDER_JIT_CASES", [])],
    )


def count_phrase() -> str:
    """How the reliability page counts the table: `(N kinds,` (the README carries no count)."""
    cases, under_jit_cases = all_cases()
    return f"({len(cases) + len(under_jit_cases)} kinds,"


def markdown_table(tmp_path: Path) -> str:
    """The reliability page's table: each bad input and the error it gives
    now (the cases under jit: their value and gradient)."""
    cases, under_jit_cases = all_cases()
    rows = ["| bad input | error |", "|---|---|"]
    for case in cases:
        _, description, call, _, _ = case.values if hasattr(case, "values") else case
        try:
            call(tmp_path)
            outcome = "**no error**"
        except (Exception, SystemExit) as error:  # reporting whatever is raised (SystemExit: a refusal)
            text = str(error).replace(str(tmp_path) + "/", "").replace("|", "\\|").splitlines()[0]
            outcome = f"`{type(error).__name__}`: {text[:140]}"
        rows.append(f"| {description} | {outcome} |")
    for _, description, call in under_jit_cases:
        values, gradients = call()
        gradient = "NaN" if np.isnan(gradients[0]).any() else "finite"
        rows.append(f"| under `jit`: {description} | value {float(values[0])}, gradient {gradient} |")
    return "\n".join(rows)
