"""Compilation stops dominating everyday calls: a second cross-validation
fold, a refit with other penalties and a second prediction compile nothing
(counted with JAX's own monitoring events), and the programs kept across
processes (`lossfns.compilation_cache`) are only ever re-used for the same
program, survive damaged entries and can be turned off."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from lossfns import compilation_cache
from lossfns.features import ladder
from lossfns.sklearn import CRF

# Every lowering (a compilation, or a look-up in JAX's own cache) and every XLA compilation.
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_to_mlir_module_duration", "/jax/core/compile/backend_compile_duration")


@contextlib.contextmanager
def counted_compilations():
    """A list that collects the names of the functions compiled inside the block."""
    compiled: list = []

    def listener(event, _duration, **info):
        if event in _COMPILE_EVENTS:
            compiled.append(info.get("fun_name", "?"))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield compiled
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def _sentences(count: int, seed: int):
    """`count` sentences of feature dicts whose labels follow their words (a learnable toy)."""
    rng = np.random.default_rng(seed)
    X, y = [], []
    for _ in range(count):
        words = rng.integers(0, 30, size=rng.integers(3, 12))
        X.append([{"word": f"w{w}", "suffix": f"s{w % 7}", "bias": 1.0} for w in words])
        y.append(["B-X" if w % 3 == 0 else ("I-X" if w % 3 == 1 else "O") for w in words])
    return X, y


@pytest.fixture(scope="module")
def corpus():
    return _sentences(90, 0)


def test_ladder_rungs_grow_by_at_most_an_eighth():
    sizes = list(range(5000))
    rungs = [ladder(n) for n in sizes]
    assert all(r >= n for r, n in zip(rungs, sizes))
    assert rungs[:17] == list(range(17))
    distinct = sorted(set(rungs))
    assert all(b <= 1.125 * a for a, b in itertools.pairwise(distinct[16:]))
    assert all(ladder(r) == r for r in distinct)  # idempotent


def test_second_fold_refit_and_predict_compile_nothing(corpus):
    X, y = corpus
    folds = [(X[:60], y[:60]), (X[30:], y[30:])]  # two training sets of equal size, other sentences
    settings = dict(c1=0.1, c2=0.05, max_iterations=15, all_possible_transitions=True)
    first = CRF(**settings).fit(*folds[0])
    first.predict(X[60:])
    first.predict_marginals(X[60:])
    with counted_compilations() as compiled:
        second = CRF(**settings).fit(*folds[1])
    assert compiled == [], f"a second fold compiled {compiled}"
    with counted_compilations() as compiled:
        refit = CRF(**dict(settings, c1=0.3, c2=0.2)).fit(*folds[1])
    assert compiled == [], f"a refit with other c1/c2 compiled {compiled}"
    assert refit.training_log_.iterations != second.training_log_.iterations  # the penalties did change the run
    with counted_compilations() as compiled:
        second.predict(X[:30])  # other sentences, as many
        refit.predict_marginals(X[10:40])
    assert compiled == [], f"a second prediction compiled {compiled}"


def test_padding_to_the_ladder_changes_no_weight(corpus):
    """The feature rows and corpus padding add nothing: the weights equal those
    of the same fit on a corpus whose sizes already sit on the ladder (checked
    by fitting twice on shuffled copies: same objective trace)."""
    X, y = corpus
    crf = CRF(c1=0.0, c2=0.1, max_iterations=20).fit(X, y)
    order = np.random.default_rng(1).permutation(len(X))
    again = CRF(c1=0.0, c2=0.1, max_iterations=20).fit([X[i] for i in order], [y[i] for i in order])
    assert len(crf.state_features_) == len(again.state_features_)
    for key, value in crf.state_features_.items():
        assert again.state_features_[key] == pytest.approx(value, rel=1e-3, abs=1e-4)


_CHILD = textwrap.dedent(
    """
    import json
    import jax
    import numpy as np
    from lossfns.sklearn import CRF
    lowered = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _, **info: lowered.append(info.get("fun_name"))
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration" else None
    )
    rng = np.random.default_rng(0)
    X, y = [], []
    for _ in range(40):
        words = rng.integers(0, 20, size=rng.integers(3, 9))
        X.append([{"word": f"w{w}"} for w in words])
        y.append(["A" if w % 2 else "B" for w in words])
    crf = CRF(c1=0.05, c2=0.05, max_iterations=10).fit(X, y)
    labels = crf.predict(X[:5])
    print(json.dumps({"loss": crf.training_log_.last_iteration["loss"], "labels": labels, "lowered": lowered}))
    """
)


def _child(cache: str) -> dict:
    environment = dict(os.environ, LOSSFNS_CACHE_DIR=cache)
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=environment, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_new_process_reuses_the_stored_programs_and_survives_damaged_entries(tmp_path):
    cache = str(tmp_path / "cache")
    first = _child(cache)
    entries = sorted((tmp_path / "cache" / "executables").glob("*.bin"))
    assert entries, "the training and decoding programs were not stored"
    assert list((tmp_path / "cache" / "xla").iterdir()), "JAX's own cache is not on"
    assert first["lowered"].count("jit(stored_program)") >= 2  # the training loop and the decoder
    second = _child(cache)
    assert (second["loss"], second["labels"]) == (first["loss"], first["labels"])
    assert "jit(stored_program)" not in second["lowered"], f"stored programs traced again: {second['lowered']}"
    # Damage the entries in four ways: truncated, altered bytes, a foreign file, a FIFO in its place.
    for i, entry in enumerate(entries):
        data = entry.read_bytes()
        if i % 4 == 0:
            entry.write_bytes(data[: len(data) // 2])
        elif i % 4 == 1:
            entry.write_bytes(data[:-100] + bytes(b ^ 0xFF for b in data[-100:]))
        elif i % 4 == 2:
            entry.write_bytes(b"not an executable")
        else:
            entry.unlink()
            os.mkfifo(entry)
    damaged = _child(cache)
    assert (damaged["loss"], damaged["labels"]) == (first["loss"], first["labels"])
    # The programs compiled again in a process that loaded others from JAX's cache are stored
    # whole (never taken from JAX's cache, whose loaded executables serialise without their
    # kernels on CPU): the next process runs them without tracing.
    assert not list((tmp_path / "cache" / "xla").glob("jit_stored_program-*")), "stored programs in JAX's cache"
    repaired = _child(cache)
    assert (repaired["loss"], repaired["labels"]) == (first["loss"], first["labels"])
    assert "jit(stored_program)" not in repaired["lowered"], f"repaired entries failed: {repaired['lowered']}"


_CRF_CHILD = textwrap.dedent(
    """
    import json
    import jax
    import numpy as np
    from lossfns import nn
    lowered = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _, **info: lowered.append(info.get("fun_name"))
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration" else None
    )
    crf = nn.CRF(5, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    emissions = rng.normal(size=(3, 7, 5)).astype(np.float32)
    tags = rng.integers(0, 5, (3, 7))
    mask = np.arange(7) < np.array([7, 4, 1])[:, None]
    before = len(lowered)  # the key and the parameters are the caller's and the constructor's
    values = {
        "log_likelihood": crf.log_likelihood(emissions, tags, mask).tolist(),
        "decode": crf.decode(emissions, mask)[1].tolist(),
        "marginals": crf.marginals(emissions, mask).tolist(),
        "kbest": crf.kbest(emissions, 2, mask)[0].tolist(),
    }
    print(json.dumps({"values": values, "lowered": lowered[before:]}))
    """
)


def test_a_new_process_calls_nn_crf_at_a_seen_shape_without_tracing(tmp_path):
    """nn.CRF's methods on known arrays run stored executables: a second
    process lowers nothing for them, not even the input checks."""
    environment = dict(os.environ, LOSSFNS_CACHE_DIR=str(tmp_path / "cache"))
    run = lambda: json.loads(
        subprocess.run(
            [sys.executable, "-c", _CRF_CHILD], capture_output=True, text=True, env=environment, check=True
        ).stdout.splitlines()[-1]
    )
    first, second = run(), run()
    assert first["lowered"].count("jit(stored_program)") == 4
    assert second["lowered"] == [], f"traced again in a new process: {second['lowered']}"
    assert second["values"] == first["values"]


def test_the_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(compilation_cache.ENVIRONMENT_VARIABLE, "off")
    assert compilation_cache.cache_directory() is None
    assert compilation_cache.describe_program(("anything",)) is not None  # described, but nowhere to keep it
    assert compilation_cache.load_executable("0" * 64) is None
    monkeypatch.setenv(compilation_cache.ENVIRONMENT_VARIABLE, str(tmp_path / "elsewhere"))
    assert compilation_cache.cache_directory() == tmp_path / "elsewhere"


def _closure_factory(scale):
    return lambda x: x * scale


def test_programs_with_parts_that_cannot_be_described_are_not_stored():
    """A closure, a lambda or user code could hide a value the key would not
    see: such programs are never stored under a description."""
    assert compilation_cache.describe_program((_closure_factory(2.0),)) is None
    assert compilation_cache.describe_program((lambda x: x,)) is None
    assert compilation_cache.describe_program((_sentences,)) is None  # a test module's function: not trusted
    from lossfns.optimizers.minimize import relative_improvement_below

    one, other = relative_improvement_below(1e-5, 10), relative_improvement_below(1e-5, 11)
    assert compilation_cache.describe_program((one,)) != compilation_cache.describe_program((other,))
    assert compilation_cache.describe_program((one,)) == compilation_cache.describe_program((one,))


def test_a_process_that_misses_an_entry_another_is_compiling_waits_and_loads_it(tmp_path, monkeypatch):
    """The folds of a parallel cross-validation miss the same entries at
    once: the first compiles under the entry's lock, the others wait and
    load what it stored (here a thread waits on the lock the test holds)."""
    import threading

    import jax.numpy as jnp

    monkeypatch.setenv(compilation_cache.ENVIRONMENT_VARIABLE, str(tmp_path / "cache"))
    traced = []

    def function(x):
        traced.append(1)  # once per trace
        return jnp.cumsum(x) * 2.0

    arguments = (np.arange(5.0, dtype=np.float32),)
    parts = ("concurrent-compilation-test", str(tmp_path))  # a key of this test alone
    program = compilation_cache.describe_program((parts, str(compilation_cache.signature(arguments))))
    results = []
    waiter = threading.Thread(
        target=lambda: results.append(compilation_cache.compiled(parts, arguments, function)[0](*arguments))
    )
    with compilation_cache._entry_lock(program):
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive() and traced == []  # it waits for the lock, compiling nothing
        compilation_cache._StoredProgram(program, function, arguments, None).compile()  # as the holder does
    waiter.join(timeout=60)
    assert not waiter.is_alive() and len(traced) == 1  # loaded, not traced again
    np.testing.assert_array_equal(np.asarray(results[0]), np.cumsum(arguments[0]) * 2.0)


def test_small_programs_take_the_elemental_emitter_and_large_ones_the_default(monkeypatch):
    """On CPU, `_compile` asks XLA for its elemental emitter up to the size
    bound (counting the equations of nested jaxprs too) and for the default
    emitters above it; either way the program computes the same values."""
    asked = []
    original = jax.stages.Lowered.compile

    def spy(self, compiler_options=None):
        asked.append(compiler_options)
        return original(self, compiler_options)

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)

    def program(x):  # 3 equations, the loop among them, and 3 in the loop's body: 6
        return jax.lax.fori_loop(0, 3, lambda _, y: jax.numpy.sin(y) * 2.0, x * 1.5).sum()

    x = jax.numpy.linspace(-1.0, 1.0, 7)
    traced = jax.jit(program).trace(x)
    bound = compilation_cache._equations(traced.jaxpr.jaxpr)
    assert (len(traced.jaxpr.jaxpr.eqns), bound) == (3, 6)
    outputs = []
    for limit in (bound, bound - 1):
        monkeypatch.setattr(compilation_cache, "_ELEMENTAL_EMITTER_MAX_EQUATIONS", limit)
        outputs.append(float(compilation_cache._compile(jax.jit(program).trace(x))(x)))
    assert asked == [{"xla_cpu_use_fusion_emitters": False}, None]
    np.testing.assert_allclose(outputs, float(program(x)), rtol=1e-6)
