"""Compiled programs kept across processes, so a new process does not pay XLA again.

Two layers, both in the user's cache directory (`LOSSFNS_CACHE_DIR`, default
`$XDG_CACHE_HOME/lossfns` or `~/.cache/lossfns`; `LOSSFNS_CACHE_DIR=off`
disables both): JAX's own persistent compilation cache (keyed by the lowered
program), and whole executables keyed by a description of what was traced,
which also skips tracing and lowering. A program is described only when every
part of it is a value (no closure, no lambda, code from lossfns or its
dependencies), so two programs never share a key; a damaged, foreign or stale
entry is ignored and written again, and entries are replaced atomically.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import pickle
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: concurrent processes each compile a missing program
    fcntl = None

import jax
import jax.extend.core as jax_extend_core
import jax.numpy as jnp
from jax._src import compilation_cache as jax_compilation_cache  # its state, read once per process
from jax._src import config as jax_config  # a context that turns JAX's own cache off (no public one)

from . import checkpoint

__all__ = [
    "cache_directory",
    "compiled",
    "describe_program",
    "enable",
    "load_executable",
    "signature",
    "store_executable",
]

#: The environment variable that moves (a path) or disables (`off`, `0`, `false`, empty) the cache.
ENVIRONMENT_VARIABLE = "LOSSFNS_CACHE_DIR"
_DISABLED = ("", "0", "off", "false", "no", "none")
_MAGIC = b"LOSSFNS-EXECUTABLE-1\n"
_MAX_ENTRY_BYTES = 1 << 30  # a bound before reading: an entry is a compiled program, not data
# Modules whose functions are trusted to be described by name: their code is fixed by their version.
_TRUSTED_MODULES = ("lossfns", "jax", "optax", "equinox", "numpy")


def cache_directory() -> Path | None:
    """The cache's folder, or None when `LOSSFNS_CACHE_DIR` disables it."""
    setting = os.environ.get(ENVIRONMENT_VARIABLE)
    if setting is not None:
        return None if setting.strip().lower() in _DISABLED else Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lossfns"


def enable() -> Path | None:
    """Turn JAX's persistent compilation cache on in `cache_directory() / "xla"`,
    unless disabled or the user chose another folder for JAX; the folder used (or None)."""
    directory = cache_directory()
    if directory is None:
        return None
    chosen = jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue]
    if chosen:
        return Path(chosen)
    try:
        (directory / "xla").mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: run without the cache
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory / "xla"))
    # Small programs too: the estimator's are 0.1-4 s each, and every one counts in a short run.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory / "xla"


@functools.cache
def _environment_digest() -> str:
    """What else decides a compiled program: lossfns' own source, the versions
    of JAX and its backend, the devices and the configuration that changes lowering."""
    digest = hashlib.sha256()
    package = Path(__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    versions = {name: _version(name) for name in ("jax", "jaxlib", "optax", "equinox", "numpy")}
    devices = [(d.platform, getattr(d, "device_kind", "")) for d in jax.devices()]
    flags = {
        name: str(getattr(jax.config, name, None))
        for name in ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl")
    }
    digest.update(json.dumps([versions, devices, flags, sys.version]).encode())
    return digest.hexdigest()


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


class _NotDescribable(Exception):
    pass


def _describe(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return [type(value).__name__, value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple: its type and fields
        return [_qualified_name(type(value)), [_describe(v) for v in value]]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [_describe(v) for v in value]]
    if isinstance(value, dict):
        return ["dict", [[_describe(k), _describe(v)] for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))]]
    if isinstance(value, functools.partial):
        return ["partial", _describe(value.func), _describe(value.args), _describe(value.keywords)]
    if hasattr(value, "lower") and hasattr(value, "__wrapped__"):  # a `jax.jit` of a function
        return ["jit", _describe(value.__wrapped__)]
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        if getattr(value, "__closure__", None) or "<" in value.__qualname__:  # closures, lambdas, local functions
            raise _NotDescribable
        return ["function", _qualified_name(value)]
    raise _NotDescribable


def _qualified_name(value) -> str:
    module = getattr(value, "__module__", "") or ""
    if module.split(".")[0] not in _TRUSTED_MODULES:
        raise _NotDescribable
    return f"{module}.{value.__qualname__}"


def describe_program(parts) -> str | None:
    """A key for the program that `parts` (values: NamedTuples, plain numbers
    and strings, functions of lossfns and its dependencies) and the
    environment decide, or None when some part cannot be described
    completely (a closure, a lambda, user code): then only JAX's own cache,
    keyed by the lowered program, is used."""
    try:
        described = json.dumps(_describe(parts))
    except _NotDescribable:
        return None
    return hashlib.sha256((_environment_digest() + described).encode()).hexdigest()


def _entry_path(key: str) -> Path | None:
    directory = cache_directory()
    return None if directory is None else directory / "executables" / f"{key}.bin"


def load_executable(key: str | None):
    """The executable stored under `key`, or None (no cache, no entry, or an
    entry that is damaged, foreign or of another JAX: it is then ignored)."""
    path = None if key is None else _entry_path(key)
    if path is None:
        return None
    try:
        with checkpoint.open_regular(path, "cache entry", OSError) as file:
            size = os.fstat(file.fileno()).st_size
            head = file.read(len(_MAGIC) + 32)
            if size > _MAX_ENTRY_BYTES or head[: len(_MAGIC)] != _MAGIC:
                return None
            payload = file.read()
        if hashlib.sha256(payload).digest() != head[len(_MAGIC) :]:
            return None
        from jax.experimental import serialize_executable

        serialized, in_tree, out_tree = pickle.loads(payload)
        return serialize_executable.deserialize_and_load(serialized, in_tree, out_tree)
    except Exception:  # any damage or incompatibility: compile again, never fail the run
        return None


def store_executable(key: str | None, executable) -> None:
    """Keep `executable` under `key`, written atomically (a concurrent reader
    sees the old entry or the new one, whole); failures are ignored."""
    path = None if key is None else _entry_path(key)
    if path is None:
        return
    try:
        from jax.experimental import serialize_executable

        payload = pickle.dumps(serialize_executable.serialize(executable), protocol=pickle.HIGHEST_PROTOCOL)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    except Exception:  # an executable that does not serialise, an unwritable folder: run without keeping it
        return
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(temporary, path)
    except OSError:  # a full disk: the entry is not kept
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def signature(tree) -> tuple:
    """The structure, shapes, dtypes, weak types and shardings of `tree`'s
    leaves: what a compiled program's arguments must match (hashable; its
    `str` describes it completely). Computed on every call, so kept cheap."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    return structure, tuple(_leaf_signature(x) for x in leaves)


def _leaf_signature(x) -> tuple:
    if isinstance(x, jax.Array):
        return (x.shape, x.dtype, getattr(x, "weak_type", False), x.sharding)
    return (jnp.shape(x), jnp.result_type(x), bool(getattr(x, "weak_type", False)), None)


_IN_MEMORY: collections.OrderedDict = collections.OrderedDict()
_IN_MEMORY_KEEP = 32  # executables of recent calls: a run cycles through a handful of shapes


# XLA:CPU's elemental emitter compiles small and middle-sized programs faster than its MLIR fusion
# emitters (the default), and large ones slower. Measured on 2 cores, JAX 0.10.2, in equations of the
# traced program (nested ones included): a Viterbi decoder (211) in 0.2 s instead of 0.37 s, the
# estimator's L-BFGS chunk (1,355) in 2.0 s instead of 2.6 s, sequence boosting's chunks (2,400-3,500)
# in 8.0 s instead of 10.8 s; the Altun et al. experiment's four-loss L-BFGS chunk (16,427) in 50 s
# instead of 24 s. Compiled programs also ran 9-25% faster (benchmarks/results/README.md).
_ELEMENTAL_EMITTER_MAX_EQUATIONS = 8_000


def _compile(traced):
    """`traced` (a `jax.stages.Traced`) lowered and compiled, on CPU by the
    emitter that compiles a program of its size faster (the same HLO either
    way: both are XLA's own code generators for it)."""
    options = None
    if jax.default_backend() == "cpu" and _equations(traced.jaxpr.jaxpr) <= _ELEMENTAL_EMITTER_MAX_EQUATIONS:
        options = {"xla_cpu_use_fusion_emitters": False}
    return traced.lower().compile(options)


def _equations(jaxpr) -> int:
    """How many equations `jaxpr` holds, those of the jaxprs in its equations included."""
    return sum(1 + sum(map(_equations, jax_extend_core.jaxprs_in_params(eqn.params))) for eqn in jaxpr.eqns)


def compiled(parts, arguments: tuple, function: Callable, **jit_options) -> tuple:
    """`(executable, seconds)`: `jax.jit(function, **jit_options)` (the
    program that the hashable `parts` decide) compiled for `arguments`, from
    this process's recent executables, the cache directory (when `parts` can
    be described, `describe_program`, and there are no `jit_options`), or
    compiled now and kept in both. `executable(*arguments)` runs it;
    `seconds` is 0 for one of this process, else the time to load or compile it."""
    argument_signature = signature(arguments)
    key = (parts, argument_signature)
    if key in _IN_MEMORY:
        _IN_MEMORY.move_to_end(key)
        return _IN_MEMORY[key], 0.0
    start = time.perf_counter()
    program = None if jit_options else describe_program((parts, str(argument_signature)))
    if program is None:
        executable = _compile(jax.jit(function, **jit_options).trace(*arguments))
    else:
        executable = _load_or_compile(program, function, arguments)
    _IN_MEMORY[key] = executable
    while len(_IN_MEMORY) > _IN_MEMORY_KEEP:
        _IN_MEMORY.popitem(last=False)
    return executable, time.perf_counter() - start


def _load_or_compile(program: str, function: Callable, arguments: tuple) -> _StoredProgram:
    """The stored executable of `program`, else `function` compiled and
    stored. Processes that miss the same entry at once (the folds of a
    parallel cross-validation, test workers) compile it once: the first
    compiles under the entry's lock, the others wait for it and load."""
    stored = _StoredProgram(program, function, arguments, load_executable(program))
    if stored.executable is None:
        with _entry_lock(program):
            stored.executable = load_executable(program)
            if stored.executable is None:
                stored.compile()
    return stored


@contextlib.contextmanager
def _entry_lock(key: str):
    """An exclusive `fcntl.flock` on the entry's lock file, waited for (the
    kernel drops it when its holder exits or is killed); nothing when the
    folder cannot hold one or without `fcntl`."""
    path = _entry_path(key)
    handle = None
    if fcntl is not None and path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path.with_suffix(".lock"), "a")  # noqa: SIM115  (held open: the lock lives with it)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError:  # an unwritable folder: compile without waiting for anyone
            if handle is not None:
                handle.close()
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            handle.close()  # closing the file releases its lock


@contextlib.contextmanager
def _without_jax_cache():
    """JAX's persistent cache off for the compilations inside. JAX reads its
    setting once per process (`is_cache_used`), so the setting alone is not
    enough: its cache state is reset on the way in and out (a compilation
    of another thread meanwhile misses the cache; it is never wrong)."""
    with jax_config.enable_compilation_cache(False):
        jax_compilation_cache.reset_cache()
        try:
            yield
        finally:
            jax_compilation_cache.reset_cache()


class _StoredProgram:
    """An executable of the arguments' leaves, flat (a stored program's input
    structure is then a plain tuple, whatever pytree types, such as equinox
    modules, they had), called with the arguments themselves. One loaded from
    the cache that fails on its first run is compiled again and run again (the
    arguments are not donated), and its entry replaced: a bad entry costs a
    compilation, never the run."""

    def __init__(self, program: str, function: Callable, arguments: tuple, executable):
        self.program, self.function, self.executable = program, function, executable
        self.structure = jax.tree_util.tree_structure(arguments)
        self.leaves = [
            jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in jax.tree_util.tree_leaves(arguments)
        ]
        self.verified = executable is None

    def compile(self) -> None:
        structure, function = self.structure, self.function

        def stored_program(*leaves):  # the name JAX's logs and monitoring events show
            return function(*jax.tree_util.tree_unflatten(structure, leaves))

        # Compiled afresh, not taken from JAX's own cache: an executable that was itself loaded
        # from a cache serialises without its kernels on CPU (a third of them missing when run).
        with _without_jax_cache():
            self.executable = _compile(jax.jit(stored_program).trace(*self.leaves))
        self.verified = True
        store_executable(self.program, self.executable)

    def __call__(self, *arguments):
        leaves = jax.tree_util.tree_leaves(arguments)
        if self.verified:
            return self.executable(*leaves)
        try:
            out = jax.block_until_ready(self.executable(*leaves))
        except jax.errors.JaxRuntimeError:
            self.compile()
            return self.executable(*leaves)
        self.verified = True
        return out
