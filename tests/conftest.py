"""Test-suite configuration. The suite runs as users run: without 64-bit
mode (float32, int32), where a float64 dtype that JAX would silently lower
is an error (pyproject.toml's filterwarnings). A test that needs float64
(finite differences, 1e-10 oracles) opts in with `pytest.mark.float64`, a
module or class by `pytestmark = pytest.mark.float64` (its import, its
fixtures and its tests then run under `jax.enable_x64(True)`)."""

import ast
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# The suite's cost is XLA's compilation of many small programs, not running
# them: LLVM's optimisation passes are skipped, and fusions are emitted by
# XLA:CPU's classic elemental emitter instead of the MLIR fusion emitters
# (measured: 40% less time on compilation-bound test files), and each program's
# code is generated in one piece, not split for threads that the other xdist
# worker needs (10% less CPU on tests/lattices/test_sparse_chain.py). Set before the
# backend starts; subprocesses inherit it (`subprocess_environment(optimised=True)`
# leaves it out for those that run more than they compile). Semantics are
# unchanged (both are XLA's own code generators for the same HLO).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    + " --xla_cpu_parallel_codegen_split_count=1"
).strip()

# JAX's persistent cache keeps every program, however small and quick to
# compile: most of the suite's are (the library's `compilation_cache.enable`
# sets the same in-process; subprocesses read these).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax
import pytest
from hypothesis import HealthCheck, settings

from lossfns import compilation_cache

# The flags set above (before the imports, where no constant may stand first).
QUICK_COMPILATION = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
)

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("LOSSFNS_HYPOTHESIS_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
settings.load_profile("ci")


# One compilation cache for the whole run (`lossfns.compilation_cache`: the
# library's stored executables and JAX's own cache in its `xla` folder),
# shared by the xdist workers and every subprocess a test starts, so that a
# program compiled by one process is loaded by the next. It is new for each
# run, so a run's time and results never depend on an earlier run's entries;
# a folder already named in LOSSFNS_CACHE_DIR (or `off`) is used as it is.
_RUN_CACHE = pytest.StashKey[str]()


def pytest_configure(config):
    # The controller configures before it starts the workers, which inherit the variable.
    if compilation_cache.ENVIRONMENT_VARIABLE not in os.environ:
        config.stash[_RUN_CACHE] = tempfile.mkdtemp(prefix="lossfns-test-cache-")
        os.environ[compilation_cache.ENVIRONMENT_VARIABLE] = config.stash[_RUN_CACHE]
    compilation_cache.enable()


def pytest_unconfigure(config):
    if _RUN_CACHE in config.stash:
        shutil.rmtree(config.stash[_RUN_CACHE], ignore_errors=True)


# ---------------------------------------------------------------------------
# float64 by opt-in: `pytest.mark.float64` on a test, or `pytestmark` on a module
# ---------------------------------------------------------------------------
#
# `jax.enable_x64` is a context (thread-local: a thread a float64 test starts
# computes in 32-bit mode). A module's marks are known only once it is
# imported, but its import already builds arrays (constants, parametrize
# values), so a module that opts in is recognised from its source first
# (a module-level `pytestmark` naming `float64`) and imported under x64.


def _marks_module_float64(path) -> bool:
    """Whether the test module at `path` assigns a `pytestmark` that names `float64`."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in targets):
            value = getattr(node, "value", None)
            if value is not None and any(
                isinstance(part, ast.Attribute) and part.attr == "float64" for part in ast.walk(value)
            ):
                return True
    return False


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    if isinstance(collector, pytest.Module) and _marks_module_float64(collector.path):
        with jax.enable_x64(True):
            return (yield)
    return (yield)


def _x64_if_marked(node):
    return jax.enable_x64(True) if node.get_closest_marker("float64") else contextlib.nullcontext()


@pytest.fixture(scope="module", autouse=True)
def _float64_module(request):
    """A module that opts in: x64 on for its module-scoped fixtures and tests
    (autouse, so set up before the module's other fixtures)."""
    with _x64_if_marked(request.node):
        yield


@pytest.fixture(autouse=True)
def _float64_test(request):
    """A test that opts in (or its class): x64 on for it and its fixtures."""
    with _x64_if_marked(request.node):
        yield


def subprocess_environment(*, optimised: bool = False, **variables) -> dict:
    """`os.environ` with `variables`, and JAX's cache folder of this run named
    (a child does not turn JAX's cache on by itself: only the library's
    entry points do, `compilation_cache.enable`). `optimised`: XLA_FLAGS
    without QUICK_COMPILATION, for a child whose programs run longer than
    they take to compile (measured: smith_eisner2005's quick run, 121 s of
    CPU with the flags, 80 s without)."""
    environment = dict(os.environ)
    if jax.config.jax_compilation_cache_dir:  # pyright: ignore[reportAttributeAccessIssue]
        environment["JAX_COMPILATION_CACHE_DIR"] = jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue]
    if optimised:
        flags = [flag for flag in environment["XLA_FLAGS"].split() if flag not in QUICK_COMPILATION]
        environment["XLA_FLAGS"] = " ".join(flags)
    return environment | variables


def quick_experiment(name: str, out, *options: str, optimised: bool = False, timeout: int = 600) -> None:
    """`python -m experiments NAME --quick --no-progress --out OUT *options`
    in the checkout, with this run's compilation caches
    (`subprocess_environment(optimised=...)`); fails with its error output."""
    command = [sys.executable, "-m", "experiments", name, "--quick", "--no-progress", "--out", str(out), *options]
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = subprocess_environment(optimised=optimised)
    finished = subprocess.run(
        command, cwd=repository, env=environment, capture_output=True, check=False, text=True, timeout=timeout
    )
    assert finished.returncode == 0, finished.stderr[-3000:]


def corpus_or_fail(path_parts):
    """Locate a corpus as `lossfns.corpora.find_data` does (NLTK's search
    path, plain or zipped); skip locally, fail in CI (CI=true) when missing."""
    from lossfns.corpora import find_data

    try:
        return find_data(*path_parts)
    except FileNotFoundError:
        pass
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"corpus {'/'.join(path_parts)} not found on NLTK's data path (NLTK_DATA) in CI")
    pytest.skip(f"corpus {'/'.join(path_parts)} not found on NLTK's data path (NLTK_DATA)")


def sigkill_after(process, wait_until_due) -> bool:
    """Call `wait_until_due()` (it returns when the kill is due), SIGKILL
    `process` and reap it, whatever happens; True if the kill ended it (not
    an earlier exit)."""
    try:
        wait_until_due()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode == -signal.SIGKILL


@pytest.fixture
def no_corpora(monkeypatch, tmp_path):
    """NLTK's data path emptied: an empty `NLTK_DATA` directory and nothing
    else (once NLTK is imported, `nltk.data.path` keeps the directories of
    `NLTK_DATA` as it was at import, so the variable alone is not enough)."""
    import lossfns.corpora

    monkeypatch.setenv("NLTK_DATA", str(tmp_path))
    monkeypatch.setattr(lossfns.corpora, "data_path", lambda: [str(tmp_path)])
    return tmp_path


def _memory_mappings() -> int | None:
    """How many memory mappings this process holds (Linux), else None."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


# Every compiled XLA:CPU program holds about three memory mappings until its
# cache entry goes; an xdist worker that runs most of the suite compiles
# enough programs to reach Linux's default limit (vm.max_map_count = 65,530),
# where LLVM's next allocation fails and the worker dies of a segmentation
# fault inside `backend_compile`. Clearing JAX's caches well before the limit
# keeps every worker below it and costs at most a few recompilations.
_MAPPINGS_BEFORE_CLEARING = 30_000


def pytest_runtest_teardown(item, nextitem):
    mappings = _memory_mappings()
    if mappings is not None and mappings > _MAPPINGS_BEFORE_CLEARING:
        import gc

        jax.clear_caches()
        gc.collect()
