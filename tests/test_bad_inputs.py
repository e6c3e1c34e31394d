"""Bad input across the public API: each case must raise the stated exception
type with a message naming the offending argument (and, for files, the
file and line). The table doubles as the reliability page's table (docs/reliability.md):
`python tests/test_bad_inputs.py` prints it in Markdown.

Cases marked `xfail(strict=True)` are checks the API does not make yet; each
names the check to add (strict, so the suite flags it once it is added).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import signal
import sys
import tracemalloc
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lossfns import (
    checkpoint,
    cli,
    corpora,
    crfsuite_model,
    debug,
    hmm,
    labelled_output,
    losses,
    model_file,
    optimizers,
    parallel,
    semirings,
    training,
)
from lossfns.checkpoint import CheckpointError, ModelFileError
from lossfns.corpora import Sentence
from lossfns.crfsuite_tagger import CrfsuiteTagger
from lossfns.features import FeatureBatch, design, dicts, pack, pack_tokens, templates
from lossfns.features.presets import preset
from lossfns.lattices import chain, constraints, dag
from lossfns.lattices.chain import FactoredPotentials
from lossfns.lattices.sparse_chain import SparsePotentials
from lossfns.models import LinearChainModel
from lossfns.nn import CRF, possible_tags
from lossfns.sklearn import CRF as EstimatorCRF
from lossfns.tagger import Tagger
from lossfns.training import reranking

T, L = 3, 2


def _potentials(**changes):
    p = np.zeros((2, T, L, L))
    for index, value in changes.items():
        p[tuple(int(c) for c in index[1:])] = value
    return jnp.asarray(p)


def _factored(unary=None, transitions=None, start=None):
    return FactoredPotentials(
        jnp.zeros((2, T, L)) if unary is None else unary,
        jnp.zeros((L, L)) if transitions is None else transitions,
        start,
    )


def _lattice():
    return dag.from_arcs([(0, 1, 0), (0, 1, 1), (1, 2, 0)], final=[2])


def _truncated_checkpoint(tmp_path):
    path = checkpoint.save(tmp_path / "state.ckpt", {"w": jnp.zeros(4)})
    path.write_bytes(path.read_bytes()[:-3])
    return checkpoint.load(path, like={"w": jnp.zeros(4)})


def _template_file(tmp_path, text):
    path = tmp_path / "bad.tpl"
    path.write_text(text)
    return templates.read_templates(str(path))


def _conll_file(tmp_path, text):
    path = tmp_path / "bad.conll"
    path.write_text(text)
    return corpora.read_conll(str(path))


def _column_file(tmp_path, data: bytes, labelled=False):
    path = tmp_path / "bad.conll"
    path.write_bytes(data)
    return corpora.read_column_file(path, labelled=labelled)


def _zip_file(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "corpus.zip", "w") as archive:
        archive.writestr("conll2002/esp.train", "El DA O\n")
    return str(tmp_path / "corpus.zip")


def _tree_squares(params):
    return sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(params))


def _squares(params, batch=None):
    return jnp.sum(params**2) if batch is None else jnp.sum((params - batch) ** 2)


_EXAMPLES = jnp.zeros((4, 2))  # a 4-example data set for the stochastic optimizers
# 4 one-token sentences of one observation each (lazy SGD-L1)
_FEATURE_BATCH = FeatureBatch(
    jnp.zeros((4, 1, 1), jnp.int32),
    jnp.zeros((4, 1, 0), jnp.int32),
    jnp.ones(4, jnp.int32),
    jnp.zeros((4, 1), jnp.int32),
)


def _lazy_step(model, segments=1):
    sgd = optimizers.lazy_sgd_l1(0.1, 0.1)
    step = training.lazy_epoch_step_fn(
        _squares, sgd, _FEATURE_BATCH, batch_size=2, max_rows=(1, 0), segments_per_epoch=segments
    )
    return step((model, None, jax.random.key(0)), jnp.zeros((), jnp.int32))


def _bcd_corpus(ids=(0, 1, 0), labels=(0, 1, 0)):
    """One labelled sentence of T tokens, one unigram test each."""
    return pack([([[i] for i in ids], [[] for _ in ids])], [list(labels)])


def _bcd_data():
    return training.bcd_data(_bcd_corpus(), LinearChainModel.zeros(2, L))


def _sequence_data():
    return training.SequenceData(jnp.zeros((2, T, L)), jnp.zeros((2, T), jnp.int32), jnp.array([T, T]))


def _unary_model(theta, inputs):
    return FactoredPotentials(inputs + theta[:L], theta[L:].reshape(L, L), None)


def _reranking_data(features=None, reference=(0, 1), mask=None):
    return reranking.reranking_data(jnp.zeros((2, 3, 4)) if features is None else features, jnp.array(reference), mask)


def _not_a_tagger(tmp_path):
    path = tmp_path / "bad.tagger"
    path.write_text("El DA O\n")
    return Tagger.load(path)


_SENTENCE = Sentence((("El", "DA"), ("rey", "NC")), ("O", "O"))


_TINY_CORPUS = [
    Sentence((("El", "DA"), ("rey", "NC"), ("Juan", "NP")), ("O", "O", "B-PER")),
    Sentence((("Ana", "NP"), ("vive", "VM")), ("B-PER", "O")),
]


@functools.cache
def _tiny_tagger():
    return Tagger("crfsuite_ner", l2=1.0, max_iterations=2, num_buckets=1, progress=False).fit(_TINY_CORPUS)


def _damaged_model_file(tmp_path, damage):
    """Save the tiny tagger, apply `damage(bytes) -> bytes`, load it back."""
    path = tmp_path / "ner.tagger"
    _tiny_tagger().save(path)
    path.write_bytes(damage(path.read_bytes()))
    return Tagger.load(path)


def _flip_bit(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :]


def _fit_in_locked_directory(tmp_path):
    with checkpoint.DirectoryLock(tmp_path / "run"):
        return Tagger("crfsuite_ner", max_iterations=1, num_buckets=1, progress=False).fit(
            _TINY_CORPUS, checkpoint_dir=tmp_path / "run"
        )


def _conll_bytes(tmp_path, data: bytes):
    path = tmp_path / "bad.conll"
    path.write_bytes(data)
    return corpora.read_conll(str(path))


def _within(seconds: int, call):
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


def _fifo(tmp_path, name):
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _load_within_a_bounded_read(tmp_path):
    """Load a 2 GiB junk file (sparse: no disk used) as a model file; an
    AssertionError if loading it took more than a megabyte of memory (the
    whole file read before its magic bytes were checked)."""
    path = tmp_path / "junk.tagger"
    with open(path, "wb") as junk:
        junk.write(b"PK\x03\x04 not a model")
        junk.truncate(2 << 30)
    tracemalloc.start()
    try:
        Tagger.load(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 1 << 20, f"{peak} bytes allocated to refuse a junk file"


def _fit_into_a_file(tmp_path):
    (tmp_path / "run").write_text("not a directory")
    return Tagger("crfsuite_ner", max_iterations=1, num_buckets=1, progress=False).fit(
        _TINY_CORPUS, checkpoint_dir=tmp_path / "run"
    )


def _feature_dicts_model(tmp_path):
    """The tiny tagger saved as `lossfns.sklearn.CRF` saves its models: preset
    `feature_dicts` (a model that reads a feature dict per token)."""
    path = tmp_path / "dicts.tagger"
    model_file.save(path, _tiny_tagger().saved()._replace(features=preset("feature_dicts")))
    return path


def _crfsuite_file(tmp_path):
    """The tiny tagger in CRFsuite's format (what `lossfns.sklearn.CRF(model_filename=)` writes)."""
    path = tmp_path / "dicts.crfsuite"
    saved = _tiny_tagger().saved()
    no_start = eqx.tree_at(lambda model: model.start, saved.model, jnp.zeros_like(saved.model.start))  # as CRFsuite
    crfsuite_model.write(
        path, crfsuite_model.from_saved_model(saved._replace(features=preset("feature_dicts"), model=no_start))
    )
    return path


_TRAIN_CONLL = "El DA O\nrey NC O\nJuan NP B-PER\n\nAna NP B-PER\nvive VM O\n"
_PATTERN = "U00:%x[0,0]\nU01:%x[0,1]\nB\n"


def _command_line(main, arguments):
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


def _lossfns(tmp_path, *arguments, pattern=_PATTERN):
    """`lossfns ARGUMENTS` in `tmp_path`, beside `train.conll`, `test.conll`
    (one column), `ner.pattern` and `ner.tagger` (the tiny tagger: its
    preset reads two columns)."""
    (tmp_path / "train.conll").write_text(_TRAIN_CONLL)
    (tmp_path / "test.conll").write_text("El\nrey\n")
    (tmp_path / "ner.pattern").write_text(pattern)
    _tiny_tagger().save(tmp_path / "ner.tagger")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        return _command_line(cli.main, list(arguments))
    finally:
        os.chdir(here)


def _experiments(tmp_path, *arguments):
    from experiments.__main__ import main

    return _command_line(main, [*arguments, "--no-progress", "--out", str(tmp_path / "out")])


def _sparse(**changes):
    fields = dict(
        unary=jnp.zeros((2, T, L)),
        pair_weights=jnp.zeros((2, T, 2)),
        pair_previous=jnp.array([0, 1]),
        pair_next=jnp.array([1, 0]),
    )
    fields.update(changes)
    return SparsePotentials(**fields)


_HMM = hmm.initial_params(2, 4, order=1, key=jax.random.PRNGKey(0), noise=0.5)


def _x32(call):
    """Run `call` with jax_enable_x64 off (the default outside this test
    suite), where JAX's integer type is int32 and an int64 value could wrap."""
    with jax.enable_x64(False):
        return call()


_WIDE = 2**32 + 2  # an int64 that int32 reads as 2
_ARCS = [(0, 1, 0), (0, 1, 1), (1, 2, 0)]

GOOD = _potentials
_CRF = CRF(L, key=jax.random.key(0))
NAN = float("nan")
INF = float("inf")

# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    # --- lossfns.lattices.chain: potentials ---
    (
        "potentials-rank",
        "potentials of rank 2",
        lambda _: chain.log_partition(jnp.zeros((T, L))),
        ValueError,
        ["potentials", "[..., T, L, L]", "(3, 2)"],
    ),
    (
        "potentials-not-square",
        "potentials [..., T, L, M] with L != M",
        lambda _: chain.log_partition(jnp.zeros((T, 2, 3))),
        ValueError,
        ["potentials", "square"],
    ),
    (
        "potentials-int",
        "integer potentials",
        lambda _: chain.log_partition(jnp.zeros((T, L, L), jnp.int32)),
        TypeError,
        ["potentials", "floating", "int32"],
    ),
    (
        "potentials-complex",
        "complex potentials",
        lambda _: chain.viterbi(jnp.zeros((T, L, L), jnp.complex64)),
        TypeError,
        ["potentials", "complex64"],
    ),
    (
        "potentials-nan",
        "NaN in potentials",
        lambda _: chain.marginals(GOOD(i011=NAN)),
        ValueError,
        ["potentials", "NaN", "(0, 1, 1"],
    ),
    (
        "potentials-posinf",
        "+inf in potentials",
        lambda _: chain.viterbi(GOOD(i100=INF)),
        ValueError,
        ["potentials", "+inf"],
    ),
    (
        "potentials-no-labels",
        "zero labels (L = 0)",
        lambda _: chain.log_partition(jnp.zeros((T, 0, 0))),
        ValueError,
        ["potentials", "L >= 1"],
    ),
    ("potentials-string", "a string as potentials", lambda _: chain.log_partition("scores"), TypeError, ["potentials"]),
    (
        "potentials-ragged",
        "a ragged nested list as potentials",
        lambda _: chain.log_partition([[[0.0, 1.0], [1.0]], [[0.0, 0.0], [0.0, 0.0]]]),
        ValueError,
        ["potentials", "ragged", "[..., T, L, L]"],
    ),
    (
        "sample-key-shape",
        "chain.sample with an old-style PRNG key of the wrong shape",
        lambda _: chain.sample(jnp.arange(3, dtype=jnp.uint32), GOOD()),
        TypeError,
        ["key", "PRNG key", "jax.random.key(seed)", "shape (3,)"],
    ),
    (
        "sample-keys",
        "chain.sample with an array of keys for one",
        lambda _: chain.sample(jax.random.split(jax.random.key(0), 2), GOOD()),
        ValueError,
        ["key", "one PRNG key", "shape (2,)"],
    ),
    # --- lengths ---
    (
        "lengths-shape",
        "lengths not of the batch shape",
        lambda _: chain.log_partition(GOOD(), jnp.array([1, 2, 3])),
        ValueError,
        ["lengths", "(2,)", "(3,)"],
    ),
    (
        "lengths-float",
        "float lengths",
        lambda _: chain.entropy(GOOD(), jnp.array([1.0, 2.0])),
        TypeError,
        ["lengths", "integer"],
    ),
    (
        "lengths-negative",
        "a negative length",
        lambda _: chain.viterbi(GOOD(), jnp.array([-1, 2])),
        ValueError,
        ["lengths", "[0, 3]", "-1"],
    ),
    (
        "lengths-too-long",
        "a length above T",
        lambda _: chain.sample(jax.random.key(0), GOOD(), jnp.array([1, 4])),
        ValueError,
        ["lengths", "[0, 3]", "4"],
    ),
    (
        "lengths-too-long-kbest",
        "a length above T (kbest)",
        lambda _: chain.kbest(GOOD(), jnp.array([9, 1]), 2),
        ValueError,
        ["lengths", "9"],
    ),
    (
        "lengths-wrap",
        "an int64 length 2**32 + 2 (int32 would read 2)",
        lambda _: _x32(lambda: chain.log_partition(GOOD(), np.array([_WIDE, 3]))),
        ValueError,
        ["lengths", "[0, 3]", "4294967298"],
    ),
    (
        "lengths-fractional",
        "a fractional length 2.5",
        lambda _: chain.log_partition(GOOD(), np.array([2.5, 3.0])),
        TypeError,
        ["lengths", "integer", "2.5", "(0,)"],
    ),
    # --- labels ---
    (
        "labels-shape",
        "labels not [..., T]",
        lambda _: chain.score(GOOD(), jnp.zeros((2, T + 1), jnp.int32)),
        ValueError,
        ["labels", "(2, 3)", "(2, 4)"],
    ),
    (
        "labels-float",
        "float labels",
        lambda _: chain.score(GOOD(), jnp.zeros((2, T))),
        TypeError,
        ["labels", "integer"],
    ),
    (
        "labels-too-large",
        "a label >= L inside the length",
        lambda _: chain.score(GOOD(), jnp.array([[0, 1, 2], [0, 0, 0]])),
        ValueError,
        ["labels", "[0, 2)", "2"],
    ),
    (
        "labels-negative",
        "a label -1 inside the length",
        lambda _: chain.score(GOOD(), jnp.array([[0, -1, -1], [0, 0, 0]]), jnp.array([2, 3])),
        ValueError,
        ["labels", "-1", "(0, 1)"],
    ),
    (
        "labels-wrap",
        "an int64 label 2**32 + 1 (int32 would read 1)",
        lambda _: _x32(lambda: chain.score(GOOD(), np.array([[0, 2**32 + 1, 0], [0, 0, 0]]))),
        ValueError,
        ["labels", "[0, 2)", "4294967297", "(0, 1)"],
    ),
    (
        "labels-padding-wrap",
        "an int64 label beyond int32 in the padding outside the length",
        lambda _: _x32(lambda: chain.score(GOOD(), np.array([[0, 0, _WIDE], [0, 0, 0]]), np.array([2, 3]))),
        ValueError,
        ["labels", "int32", "4294967298", "(0, 2)"],
    ),
    (
        "labels-fractional",
        "a fractional label 0.5",
        lambda _: chain.score(GOOD(), np.array([[0, 0.5, 0], [0, 0, 0]])),
        TypeError,
        ["labels", "integer", "0.5"],
    ),
    # --- factored potentials ---
    (
        "unary-rank",
        "unary of rank 1",
        lambda _: chain.log_partition(_factored(unary=jnp.zeros(L))),
        ValueError,
        ["unary", "[..., T, L]"],
    ),
    (
        "unary-int",
        "integer unary scores",
        lambda _: chain.log_partition(_factored(unary=jnp.zeros((T, L), int))),
        TypeError,
        ["unary"],
    ),
    (
        "unary-nan",
        "NaN in unary",
        lambda _: chain.marginals(_factored(unary=jnp.full((2, T, L), NAN))),
        ValueError,
        ["unary", "NaN"],
    ),
    (
        "transitions-shape",
        "transitions not [L, L]",
        lambda _: chain.log_partition(_factored(transitions=jnp.zeros((L, L + 1)))),
        ValueError,
        ["transitions", "[..., 2, 2]"],
    ),
    (
        "transitions-batch",
        "transitions batch not broadcastable to unary's",
        lambda _: chain.log_partition(_factored(transitions=jnp.zeros((5, L, L)))),
        ValueError,
        ["transitions", "(5,)", "(2,)"],
    ),
    (
        "transitions-posinf",
        "+inf in transitions",
        lambda _: chain.viterbi(_factored(transitions=jnp.full((L, L), INF))),
        ValueError,
        ["transitions", "+inf"],
    ),
    (
        "start-shape",
        "start not [L]",
        lambda _: chain.log_partition(_factored(start=jnp.zeros(L + 1))),
        ValueError,
        ["start", "[..., 2]"],
    ),
    (
        "start-nan",
        "NaN in start",
        lambda _: chain.entropy(_factored(start=jnp.full(L, NAN))),
        ValueError,
        ["start", "NaN"],
    ),
    # --- options and semirings ---
    (
        "algorithm",
        "unknown algorithm",
        lambda _: chain.log_partition(GOOD(), algorithm="fast"),
        ValueError,
        ["algorithm", "'fast'", "sequential"],
    ),
    (
        "log-partition-semiring",
        "a max semiring for log_partition",
        lambda _: chain.log_partition(GOOD(), semiring=semirings.Max),
        ValueError,
        ["semiring", "Log or Real"],
    ),
    (
        "pointwise-semiring",
        "a max semiring for a pointwise loss",
        lambda _: losses.pointwise_log_loss(GOOD(), jnp.zeros((2, T), int), semiring=semirings.Max),
        ValueError,
        ["semiring", "Log or Real"],
    ),
    ("kmax-k-zero", "k = 0 for the k-max semiring", lambda _: semirings.KMax(0), ValueError, ["k", "0"]),
    ("kmax-k-float", "a float k", lambda _: semirings.KMax(2.5), ValueError, ["k", "2.5"]),
    ("kmax-k-bool", "k = True for the k-max semiring", lambda _: semirings.KMax(True), ValueError, ["k", "True"]),
    ("kbest-k", "k = 0 for kbest", lambda _: chain.kbest(GOOD(), None, 0), ValueError, ["k", "0"]),
    (
        "forward-semiring",
        "a string instead of a semiring",
        lambda _: chain.forward("log", GOOD()),
        TypeError,
        ["semiring", "Semiring"],
    ),
    ("sample-key", "an int instead of a PRNG key", lambda _: chain.sample(0, GOOD()), TypeError, ["PRNG key"]),
    # --- lossfns.lattices.dag ---
    (
        "dag-cycle",
        "a cyclic lattice",
        lambda _: dag.from_arcs([(0, 1, 0), (1, 2, 0), (2, 1, 0)], final=[2]),
        ValueError,
        ["arc 2", "topological order", "cycle"],
    ),
    (
        "dag-order",
        "states not numbered in topological order",
        lambda _: dag.from_arcs([(0, 2, 0), (2, 1, 0)], final=[1]),
        ValueError,
        ["arc 1", "(2 -> 1)"],
    ),
    (
        "dag-missing-state",
        "an arc to a missing state",
        lambda _: dag.from_arcs([(0, 1, 0), (1, 7, 0)], final=[1], num_states=2),
        ValueError,
        ["arc 1", "7"],
    ),
    (
        "dag-arcs-shape",
        "arcs that are not triples",
        lambda _: dag.from_arcs([(0, 1)], final=[1]),
        ValueError,
        ["arcs", "[A, 3]"],
    ),
    (
        "dag-final",
        "a final state that does not exist",
        lambda _: dag.from_arcs([(0, 1, 0)], final=[3], num_states=2),
        ValueError,
        ["final", "[3]"],
    ),
    (
        "dag-arc-scores-shape",
        "arc_scores of the wrong length",
        lambda _: dag.log_partition(_lattice(), jnp.zeros(4)),
        ValueError,
        ["arc_scores", "[..., 3]"],
    ),
    (
        "dag-arc-scores-nan",
        "NaN in arc_scores",
        lambda _: dag.viterbi(_lattice(), jnp.array([0.0, NAN, 0.0])),
        ValueError,
        ["arc_scores", "NaN"],
    ),
    (
        "dag-float-ids",
        "a fractional state id 1.7 in an arc",
        lambda _: dag.from_arcs([(0, 1.7, 0), (0, 1, 1), (1, 2, 0)], final=[2]),
        TypeError,
        ["arcs", "integer", "1.7", "(0, 1)"],
    ),
    (
        "dag-float-final",
        "a fractional final state id",
        lambda _: dag.from_arcs(_ARCS, final=[2.5]),
        TypeError,
        ["final", "state ids", "2.5"],
    ),
    (
        "dag-final-mask",
        "a boolean final mask not of length num_states",
        lambda _: dag.from_arcs(_ARCS, final=[False, True]),
        ValueError,
        ["final", "boolean mask", "[3]", "(2,)"],
    ),
    (
        "dag-num-states-float",
        "a float num_states",
        lambda _: dag.from_arcs(_ARCS, final=[2], num_states=3.0),
        TypeError,
        ["num_states", "int", "3.0"],
    ),
    (
        "dag-float-symbols",
        "a fractional symbol in from_string",
        lambda _: dag.from_string([1, 1.7]),
        TypeError,
        ["symbols", "integer", "1.7"],
    ),
    (
        "dag-traced-arcs",
        "arcs traced inside jit",
        lambda _: jax.jit(lambda a: dag.from_arcs(a, final=[2]))(jnp.array(_ARCS)),
        TypeError,
        ["arcs", "traced", "outside the traced function"],
    ),
    (
        "dag-lattice-type",
        "potentials instead of a lattice",
        lambda _: dag.log_partition(GOOD(), jnp.zeros(3)),
        TypeError,
        ["lattice", "dag.Lattice"],
    ),
    # --- lossfns.losses ---
    (
        "loss-labels",
        "a gold label >= L",
        lambda _: losses.sequence_log_loss(GOOD(), jnp.full((2, T), 5)),
        ValueError,
        ["labels", "5"],
    ),
    (
        "loss-lengths",
        "loss lengths above T",
        lambda _: losses.structured_hinge_loss(GOOD(), jnp.zeros((2, T), int), jnp.array([4, 1])),
        ValueError,
        ["lengths", "4"],
    ),
    (
        "reranking-reference",
        "a reference outside the candidate list",
        lambda _: losses.reranking_log_loss(jnp.zeros((2, 3)), jnp.array([0, 3])),
        ValueError,
        ["reference", "[0, 3)"],
    ),
    (
        "reranking-absent",
        "a reference marked absent by mask",
        lambda _: losses.reranking_log_loss(jnp.zeros((1, 3)), jnp.array([1]), jnp.array([[True, False, True]])),
        ValueError,
        ["reference", "mask"],
    ),
    (
        "reranking-empty",
        "an empty candidate list (N = 0)",
        lambda _: losses.reranking_log_loss(jnp.zeros((2, 0)), jnp.array([0, 0])),
        ValueError,
        ["scores", "candidate"],
    ),
    (
        "hamming-shape",
        "predicted and gold of different shapes",
        lambda _: losses.hamming_loss(jnp.zeros((2, 3), int), jnp.zeros((2, 4), int)),
        ValueError,
        ["predicted", "labels"],
    ),
    # --- lossfns.features.templates ---
    (
        "template-kind",
        "a template line not starting with U, B or *",
        lambda tmp: _template_file(tmp, "U00:%x[0,0]\nX01:%x[1,0]\n"),
        ValueError,
        ["bad.tpl:2", "U, B or *"],
    ),
    (
        "template-macro",
        "a malformed macro",
        lambda tmp: _template_file(tmp, "# c\n\nU00:%x[0,\n"),
        ValueError,
        ["bad.tpl:3", "malformed macro"],
    ),
    (
        "template-duplicate",
        "two templates with the same text before their first macro",
        lambda tmp: _template_file(tmp, "U00:%x[0,0]\nU00:%x[1,0]\n"),
        ValueError,
        ["bad.tpl:2", "U00", "line 1"],
    ),
    (
        "template-regex",
        "a bad regex in %m[...]",
        lambda tmp: _template_file(tmp, 'U00:%m[0,0,"(a"]\n'),
        ValueError,
        ["bad.tpl:1", "regex"],
    ),
    (
        "template-wapiti-regex",
        "a Wapiti regex repeating nothing",
        lambda _: templates.parse_templates('U:%t[0,0,"^*a"]', "p.txt", dialect="wapiti"),
        ValueError,
        ["p.txt:1", "regex", "nothing to repeat"],
    ),
    (
        "template-dialect",
        "an unknown template dialect",
        lambda _: templates.parse_templates("B", dialect="crfpp"),
        ValueError,
        ["dialect", "'python'", "'wapiti'", "crfpp"],
    ),
    (
        "template-indirect-row",
        "%x[*c,col] whose column c holds no integer",
        lambda _: templates.parse_templates("U:%x[*0,0]")((("El", "DA"),)),
        ValueError,
        ["column 0", "'El'"],
    ),
    # --- lossfns.corpora ---
    (
        "corpus-columns",
        "a line with a different number of columns",
        lambda tmp: _conll_file(tmp, "El DA O\nrey NC\n\n"),
        ValueError,
        ["bad.conll:2", "3 columns"],
    ),
    (
        "corpus-one-column",
        "a line with a single column",
        lambda tmp: _conll_file(tmp, "\nword\n"),
        ValueError,
        ["bad.conll:2", "at least 2 columns"],
    ),
    # --- lossfns.checkpoint ---
    (
        "checkpoint-truncated",
        "a truncated checkpoint file",
        _truncated_checkpoint,
        checkpoint.CheckpointError,
        ["state.ckpt", "truncated"],
    ),
    # --- lossfns.optimizers: OWL-QN and SGD-L1 ---
    ("owlqn-l1", "a negative l1 for OWL-QN", lambda _: optimizers.owlqn(-0.1), ValueError, ["l1", ">= 0", "-0.1"]),
    (
        "owlqn-memory-size",
        "memory_size = 0 for OWL-QN",
        lambda _: optimizers.owlqn(0.1, memory_size=0),
        ValueError,
        ["memory_size", ">= 1", "got 0"],
    ),
    (
        "owlqn-shrink",
        "a line-search shrink factor >= 1",
        lambda _: optimizers.owlqn(0.1, shrink=1.5),
        ValueError,
        ["shrink", "(0, 1)", "1.5"],
    ),
    (
        "owlqn-decrease-factor",
        "an Armijo decrease_factor of 0",
        lambda _: optimizers.owlqn(0.1, decrease_factor=0.0),
        ValueError,
        ["decrease_factor", "(0, 1)", "0.0"],
    ),
    (
        "owlqn-linesearch-steps",
        "max_linesearch_steps = 0",
        lambda _: optimizers.owlqn(0.1, max_linesearch_steps=0),
        ValueError,
        ["max_linesearch_steps", ">= 1", "0"],
    ),
    (
        "sgd-learning-rate",
        "a learning rate of 0 for SGD-L1",
        lambda _: optimizers.sgd_l1(0.0, 0.1),
        ValueError,
        ["learning_rate", "> 0", "0.0"],
    ),
    (
        "sgd-learning-rate-string",
        "a string as learning rate",
        lambda _: optimizers.sgd_l1("fast", 0.1),
        TypeError,
        ["learning_rate", "a number > 0", "'fast'"],
    ),
    (
        "sgd-learning-rate-inf",
        "an infinite learning rate for SGD-L1",
        lambda _: optimizers.sgd_l1(INF, 0.1),
        ValueError,
        ["learning_rate", "> 0", "finite", "inf"],
    ),
    (
        "sgd-learning-rate-bool",
        "True as a learning rate",
        lambda _: optimizers.sgd_l1(True, 0.1),
        TypeError,
        ["learning_rate", "a number > 0", "True"],
    ),
    (
        "owlqn-l1-inf",
        "an infinite l1 for OWL-QN",
        lambda _: optimizers.owlqn(INF),
        ValueError,
        ["l1", ">= 0", "finite", "inf"],
    ),
    ("owlqn-l2-nan", "a NaN l2 for OWL-QN", lambda _: optimizers.owlqn(0.1, l2=NAN), ValueError, ["l2", "nan"]),
    (
        "owlqn-memory-size-bool",
        "memory_size = True",
        lambda _: optimizers.owlqn(0.1, memory_size=True),
        TypeError,
        ["memory_size", "int", "True"],
    ),
    (
        "owlqn-int-params",
        "integer parameters for OWL-QN",
        lambda _: optimizers.owlqn(0.1).init({"w": jnp.zeros(2, jnp.int32)}),
        TypeError,
        ["params", "floating point", "int32", "['w']"],
    ),
    (
        "decay-initial-rate-inf",
        "an infinite initial rate",
        lambda _: optimizers.decaying_schedule(INF, 10),
        ValueError,
        ["initial_rate", "finite", "inf"],
    ),
    (
        "sgd-l2",
        "a negative l2 for SGD-L1",
        lambda _: optimizers.sgd_l1(0.1, 0.1, l2=-1.0),
        ValueError,
        ["l2", ">= 0", "-1.0"],
    ),
    (
        "calibrate-candidates",
        "no candidate learning rates to calibrate",
        lambda _: training.calibrate_learning_rate(
            _squares, jnp.zeros(2), _EXAMPLES, 0.1, key=jax.random.key(0), candidates=()
        ),
        ValueError,
        ["candidates", "at least one", "()"],
    ),
    (
        "calibrate-sample-size",
        "a calibration sample of 0 examples",
        lambda _: training.calibrate_learning_rate(
            _squares, jnp.zeros(2), _EXAMPLES, 0.1, key=jax.random.key(0), sample_size=0
        ),
        ValueError,
        ["sample_size", ">= 1", "0"],
    ),
    (
        "lazy-sgd-learning-rate",
        "a learning rate of 0 for lazy SGD-L1",
        lambda _: optimizers.lazy_sgd_l1(0.0, 0.1),
        ValueError,
        ["learning_rate", "> 0", "0.0"],
    ),
    (
        "lazy-sgd-segments",
        "more segments of an epoch than minibatches",
        lambda _: _lazy_step(LinearChainModel.zeros(1, 2), segments=3),
        ValueError,
        ["segments_per_epoch", "[1, 2]", "3"],
    ),
    (
        "train-linear-chain-model-shape",
        "a starting model of other shapes than the corpus's counts",
        lambda _: training.train_linear_chain(_bcd_corpus(), 2, 2, model=LinearChainModel.zeros(3, 2)),
        ValueError,
        ["model", "emission [K, L] = (2, 2)", "(3, 2)"],
    ),
    (
        "lazy-sgd-max-rows-batch",
        "batch_size = 0 to bound the rows of a minibatch",
        lambda _: training.max_rows_per_batch(_FEATURE_BATCH, 0),
        ValueError,
        ["batch_size", ">= 1", "0"],
    ),
    (
        "decay-steps",
        "steps_per_epoch = 0 for the decaying schedule",
        lambda _: optimizers.decaying_schedule(0.1, 0),
        ValueError,
        ["steps_per_epoch", ">= 1", "0"],
    ),
    (
        "decay-rate",
        "a decay factor above 1",
        lambda _: optimizers.decaying_schedule(0.1, 10, 1.5),
        ValueError,
        ["decay_per_epoch", "(0, 1]", "1.5"],
    ),
    # --- minimize, minimize_stochastic, drive, finetune ---
    (
        "minimize-max-steps",
        "max_steps = 0",
        lambda _: optimizers.minimize(_squares, jnp.ones(2), optax.sgd(0.1), max_steps=0),
        ValueError,
        ["max_steps", ">= 1", "0"],
    ),
    (
        "minimize-optimizer",
        "an optax constructor not called (optax.adam)",
        lambda _: optimizers.minimize(_squares, jnp.ones(2), optax.adam, max_steps=5),
        TypeError,
        ["optimizer", "GradientTransformation", "function adam"],
    ),
    (
        "minimize-int-params",
        "integer parameters for L-BFGS (an OverflowError in optax)",
        lambda _: optimizers.minimize(_squares, jnp.ones(2, jnp.int32), optax.lbfgs(), max_steps=5),
        TypeError,
        ["params", "floating point", "int32"],
    ),
    (
        "minimize-int-params-owlqn",
        "integer parameters for OWL-QN via minimize",
        lambda _: optimizers.minimize(_squares, jnp.ones(2, jnp.int32), optimizers.owlqn(0.1), max_steps=5),
        TypeError,
        ["params", "floating point", "int32"],
    ),
    (
        "status-name",
        "an unknown status code",
        lambda _: optimizers.status_name(7),
        ValueError,
        ["code", "minimize status", "7"],
    ),
    (
        "minimize-tol",
        "a negative tolerance",
        lambda _: optimizers.minimize(_squares, jnp.ones(2), optax.sgd(0.1), max_steps=5, tol=-1e-3),
        ValueError,
        ["tol", ">= 0", "-0.001"],
    ),
    (
        "stochastic-batch-size",
        "batch_size = 0",
        lambda _: optimizers.minimize_stochastic(
            _squares, jnp.ones(2), optax.sgd(0.1), _EXAMPLES, key=jax.random.key(0), batch_size=0, num_epochs=1
        ),
        ValueError,
        ["batch_size", "[1, 4]", "0"],
    ),
    (
        "stochastic-batch-size-float",
        "a float batch_size",
        lambda _: optimizers.minimize_stochastic(
            _squares, jnp.ones(2), optax.sgd(0.1), _EXAMPLES, key=jax.random.key(0), batch_size=2.5, num_epochs=1
        ),
        TypeError,
        ["batch_size", "int", "float 2.5"],
    ),
    (
        "stochastic-int-params",
        "integer parameters for SGD-L1",
        lambda _: optimizers.minimize_stochastic(
            _squares,
            jnp.ones(2, jnp.int32),
            optimizers.sgd_l1(0.1, 0.1),
            _EXAMPLES,
            key=jax.random.key(0),
            batch_size=2,
            num_epochs=1,
        ),
        TypeError,
        ["params", "floating point", "int32"],
    ),
    (
        "stochastic-num-epochs",
        "num_epochs = 0",
        lambda _: optimizers.minimize_stochastic(
            _squares, jnp.ones(2), optax.sgd(0.1), _EXAMPLES, key=jax.random.key(0), batch_size=2, num_epochs=0
        ),
        ValueError,
        ["num_epochs", ">= 1", "0"],
    ),
    (
        "minimize-vector-objective",
        "an objective that returns a vector (per-example losses)",
        lambda _: optimizers.minimize(lambda p: p**2, jnp.ones(2), optax.sgd(0.1), max_steps=3),
        ValueError,
        ["fun", "scalar", "shape (2,)", "jnp.sum"],
    ),
    (
        "train-vector-objective",
        "the driver's objective returns a vector (found while tracing the first chunk, at no cost)",
        lambda _: optimizers.train(lambda p, d: (p - d) ** 2, jnp.ones(2), optax.sgd(0.1), jnp.zeros(2), max_steps=3),
        ValueError,
        ["objective", "scalar", "shape (2,)", "jnp.sum"],
    ),
    (
        "stochastic-vector-objective",
        "a minibatch objective that returns a vector",
        lambda _: optimizers.minimize_stochastic(
            lambda p, batch: (p - batch) ** 2,
            jnp.ones(2),
            optax.sgd(0.1),
            _EXAMPLES,
            key=jax.random.key(0),
            batch_size=2,
            num_epochs=2,
        ),
        ValueError,
        ["fun", "scalar", "shape (2, 2)"],
    ),
    (
        "stochastic-key-shape",
        "an old-style PRNG key of the wrong shape",
        lambda _: optimizers.minimize_stochastic(
            _squares,
            jnp.ones(2),
            optax.sgd(0.1),
            _EXAMPLES,
            key=jnp.arange(3, dtype=jnp.uint32),
            batch_size=2,
            num_epochs=2,
        ),
        TypeError,
        ["key", "PRNG key", "shape (3,)"],
    ),
    (
        "owlqn-mask-structure",
        "an OWL-QN mask whose structure is not the parameters'",
        lambda _: optimizers.minimize(
            _tree_squares, {"a": jnp.ones(2), "b": jnp.ones(3)}, optimizers.owlqn(0.1, mask={"a": True}), max_steps=2
        ),
        ValueError,
        ["mask", "structure", "{'a': *}", "{'a': *, 'b': *}"],
    ),
    (
        "sgd-l1-mask-shape",
        "an SGD-L1 mask array that does not fit its parameters",
        lambda _: optimizers.minimize(
            _squares, jnp.ones(3), optimizers.sgd_l1(0.1, 0.1, mask=jnp.array([True, False])), max_steps=2
        ),
        ValueError,
        ["mask", "(2,)", "(3,)", "broadcast"],
    ),
    (
        "l1-mask-not-bool",
        "a penalty mask of numbers, not bools",
        lambda _: losses.l1({"a": jnp.ones(2)}, 0.1, mask={"a": 0.5}),
        TypeError,
        ["mask", "bools", "0.5"],
    ),
    (
        "drive-keep",
        "keep = 0 checkpoints",
        lambda tmp: optimizers.drive(
            lambda data: lambda inner, step: (inner, 0.0),
            optimizers.init_loop(0.0, 2),
            stop=optimizers.relative_change_below(0.0),
            checkpoint_dir=tmp,
            keep=0,
        ),
        ValueError,
        ["keep", ">= 1", "0"],
    ),
    (
        "drive-chunk-steps",
        "chunk_steps = 0 for the driver",
        lambda _: optimizers.drive(
            lambda data: lambda inner, step: (inner, 0.0),
            optimizers.init_loop(0.0, 2),
            stop=optimizers.relative_change_below(0.0),
            chunk_steps=0,
        ),
        ValueError,
        ["chunk_steps", ">= 1", "0"],
    ),
    (
        "drive-callback",
        "a driver callback that is not callable",
        lambda _: optimizers.drive(
            lambda data: lambda inner, step: (inner, 0.0),
            optimizers.init_loop(0.0, 2),
            stop=optimizers.relative_change_below(0.0),
            callback="print",
        ),
        TypeError,
        ["callback", "callable", "str"],
    ),
    (
        "train-objective",
        "a training objective that is not callable",
        lambda _: optimizers.train("loss", jnp.ones(2), optax.lbfgs(), max_steps=2),
        TypeError,
        ["objective", "callable"],
    ),
    (
        "stop-period",
        "a stopping period of 0 for CRFsuite's rule",
        lambda _: optimizers.relative_improvement_below(1e-5, 0),
        ValueError,
        ["period", ">= 1", "0"],
    ),
    (
        "stop-period-either-way",
        "a stopping period of 0 for the either-way rule",
        lambda _: optimizers.relative_change_over(1e-4, 0),
        ValueError,
        ["period", ">= 1", "0"],
    ),
    (
        "mesh-axes",
        "a mesh without a data axis and with two axes",
        lambda _: parallel.data_axis(jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("a", "b"))),
        ValueError,
        ["mesh", "'data'", "('a', 'b')"],
    ),
    (
        "mesh-data-scalar",
        "a scalar data leaf to split over a mesh",
        lambda _: parallel.shard_leading_axis({"x": np.zeros(())}, parallel.data_mesh()),
        ValueError,
        ["data leaf ['x']", "leading axis", "()"],
    ),
    (
        "finetune-l2",
        "a negative l2 for fine-tuning",
        lambda _: optimizers.finetune(_squares, jnp.ones(2), l2=-1.0),
        ValueError,
        ["l2", ">= 0", "-1.0"],
    ),
    # --- block coordinate descent, perceptron, sequence boosting ---
    (
        "bcd-num-sweeps",
        "num_sweeps = 0 for BCD",
        lambda _: training.bcd(_bcd_data(), LinearChainModel.zeros(2, L), 0.1, num_sweeps=0),
        ValueError,
        ["num_sweeps", ">= 1", "0"],
    ),
    (
        "bcd-corpus",
        "a padded id array instead of a PackedCorpus for BCD",
        lambda _: training.bcd_data(np.zeros((1, T, 1), np.int32), LinearChainModel.zeros(2, L)),
        TypeError,
        ["corpus", "PackedCorpus", "ndarray"],
    ),
    (
        "bcd-model",
        "a parameter dict instead of a LinearChainModel for BCD",
        lambda _: training.bcd_data(_bcd_corpus(), {"emission": jnp.zeros((2, L))}),
        TypeError,
        ["model", "LinearChainModel", "dict"],
    ),
    (
        "bcd-feature-ids",
        "a feature id past the model's rows for BCD",
        lambda _: training.bcd_data(_bcd_corpus(ids=(0, 2, 0)), LinearChainModel.zeros(2, L)),
        ValueError,
        ["corpus.unigram_ids", "[-1, 2)", "[0, 2]"],
    ),
    (
        "bcd-labels",
        "a label past the model's labels for BCD",
        lambda _: training.bcd_data(_bcd_corpus(labels=(0, 2, 0)), LinearChainModel.zeros(2, L)),
        ValueError,
        ["labels", "[0, 2)", "got 2"],
    ),
    (
        "sparse-perceptron-ids",
        "a fractional feature id for the sparse perceptron",
        lambda _: training.sparse_sequence_data([[[0, 1.5], [2]]], [[0, 1]], 3),
        TypeError,
        ["feature_ids[0][0]", "integer", "1.5"],
    ),
    (
        "sparse-perceptron-id-range",
        "a feature id equal to num_features (the padding id)",
        lambda _: training.sparse_sequence_data([[[0, 3], [2]]], [[0, 1]], 3),
        ValueError,
        ["feature ids", "[0, 3)", "got 3"],
    ),
    (
        "perceptron-num-epochs",
        "num_epochs = 0 for the perceptron",
        lambda _: training.perceptron(_unary_model, jnp.zeros(L + L * L), _sequence_data(), num_epochs=0),
        ValueError,
        ["num_epochs", ">= 1", "0"],
    ),
    (
        "perceptron-data",
        "a plain tuple instead of SequenceData",
        lambda _: training.perceptron(_unary_model, jnp.zeros(L + L * L), tuple(_sequence_data()), num_epochs=1),
        TypeError,
        ["data", "SequenceData", "tuple"],
    ),
    (
        "boosting-max-rounds",
        "max_rounds = 0 for sequence boosting",
        lambda _: training.sequence_boosting(_unary_model, _sequence_data(), L + L * L, max_rounds=0),
        ValueError,
        ["max_rounds", ">= 1", "0"],
    ),
    (
        "boosting-step",
        "an unknown boosting step rule",
        lambda _: training.sequence_boosting(_unary_model, _sequence_data(), L + L * L, max_rounds=2, step="newton"),
        ValueError,
        ["step", "line_search", "'newton'"],
    ),
    (
        "chain-boosting-labels",
        "a label equal to num_labels for sparse sequence boosting",
        lambda _: training.chain_boosting_data(np.zeros((1, T, 1), np.int32), np.array([[0, 2, 1]]), [3], 2, 2),
        ValueError,
        ["labels", "[0, 2)", "got 2"],
    ),
    (
        "chain-boosting-ids",
        "an observation id equal to num_features for sparse sequence boosting",
        lambda _: training.chain_boosting_data(np.full((1, T, 1), 4, np.int32), np.zeros((1, T), np.int32), [3], 4, 2),
        ValueError,
        ["ids", "[-1, 4)", "got 4"],
    ),
    (
        "chain-boosting-lengths",
        "a length longer than the sequences for sparse sequence boosting",
        lambda _: training.chain_boosting_data(np.zeros((1, T, 1), np.int32), np.zeros((1, T), np.int32), [5], 2, 2),
        ValueError,
        ["lengths", "[0, 3]", "got 5"],
    ),
    (
        "boost-data",
        "a SequenceData instead of a boosting layout for boost",
        lambda _: training.boost(_sequence_data(), _unary_model, max_rounds=2),
        TypeError,
        ["data", "BoostingData", "ChainBoostingData", "SequenceData"],
    ),
    (
        "boost-potentials",
        "a potentials_fn with the sparse boosting layout",
        lambda _: training.boost(
            training.chain_boosting_data(np.zeros((1, T, 1), np.int32), np.zeros((1, T), np.int32), [3], 2, 2),
            _unary_model,
            max_rounds=2,
        ),
        ValueError,
        ["potentials_fn", "None", "ChainBoostingData"],
    ),
    # --- reranking: boosting with shrinkage, FSLR, BLasso ---
    (
        "rerank-shrinkage",
        "shrinkage = 0",
        lambda _: training.boosting_with_shrinkage_step_fn(_reranking_data(), 0.0),
        ValueError,
        ["shrinkage", "(0, 1]", "0.0"],
    ),
    (
        "fslr-epsilon",
        "a negative FSLR step epsilon",
        lambda _: training.fslr_step_fn(_reranking_data(), -0.1),
        ValueError,
        ["epsilon", "> 0", "-0.1"],
    ),
    (
        "blasso-epsilon",
        "BLasso step epsilon = 0",
        lambda _: training.blasso_step_fn(_reranking_data(), 0.0),
        ValueError,
        ["epsilon", "> 0", "0.0"],
    ),
    (
        "blasso-tolerance",
        "a negative BLasso tolerance",
        lambda _: training.blasso_step_fn(_reranking_data(), 0.1, tolerance=-1.0),
        ValueError,
        ["tolerance", ">= 0", "-1.0"],
    ),
    (
        "rerank-max-steps",
        "max_steps = 0 for a reranker",
        lambda _: training.run_reranker(training.fslr_step_fn(_reranking_data(), 0.1), _reranking_data(), max_steps=0),
        ValueError,
        ["max_steps", ">= 1", "0"],
    ),
    (
        "rerank-data",
        "raw features instead of RerankingData",
        lambda _: training.run_reranker(
            training.fslr_step_fn(_reranking_data(), 0.1), jnp.zeros((2, 3, 4)), max_steps=5
        ),
        TypeError,
        ["data", "RerankingData", "got "],
    ),
    (
        "rerank-reference",
        "a reranking reference >= C",
        lambda _: _reranking_data(reference=(0, 3)),
        ValueError,
        ["reference", "[0, 3)", "got 3 at index 1"],
    ),
    (
        "rerank-reference-wrap",
        "an int64 reranking reference 2**32 + 1 (int32 would read 1)",
        lambda _: _x32(lambda: reranking.reranking_data(jnp.zeros((2, 3, 4)), np.array([0, 2**32 + 1]))),
        ValueError,
        ["reference", "int32", "4294967297"],
    ),
    (
        "rerank-reference-absent",
        "a reranking reference that mask marks absent",
        lambda _: _reranking_data(mask=jnp.array([[1, 1, 1], [1, 0, 1]])),
        ValueError,
        ["reference", "mask", "got 1"],
    ),
    (
        "rerank-features-nan",
        "NaN in reranking features",
        lambda _: _reranking_data(features=jnp.zeros((2, 3, 4)).at[1, 2, 0].set(NAN)),
        ValueError,
        ["features", "finite", "nan", "(1, 2, 0)"],
    ),
    (
        "rerank-weights",
        "weights that do not match the features",
        lambda _: training.lasso_loss(_reranking_data(), jnp.zeros(5), 0.1),
        ValueError,
        ["weights", "(4,)", "(5,)"],
    ),
    # --- lossfns.tagger.Tagger ---
    (
        "tagger-preset",
        "an unknown feature preset name",
        lambda _: Tagger("crfsuite_nerr"),
        ValueError,
        ["features", "'crfsuite_nerr'", "crfsuite_ner'"],
    ),
    (
        "tagger-num-buckets",
        "num_buckets = 0",
        lambda _: Tagger(num_buckets=0),
        ValueError,
        ["num_buckets", ">= 1", "0"],
    ),
    ("tagger-min-count", "min_count = 0", lambda _: Tagger(min_count=0), ValueError, ["min_count", ">= 1", "0"]),
    ("tagger-hash-size", "hash_size = 0", lambda _: Tagger(hash_size=0), ValueError, ["hash_size", ">= 1", "0"]),
    (
        "tagger-memory-size",
        "memory_size = 0 for the tagger",
        lambda _: Tagger(memory_size=0),
        ValueError,
        ["memory_size", ">= 1", "0"],
    ),
    ("tagger-period", "a stopping period of 0", lambda _: Tagger(period=0), ValueError, ["period", ">= 1", "0"]),
    ("tagger-tol", "a negative tagger tol", lambda _: Tagger(tol=-1.0), ValueError, ["tol", ">= 0", "-1.0"]),
    ("tagger-l1-string", "a string as l1", lambda _: Tagger(l1="0.1"), TypeError, ["l1", "number", "'0.1'"]),
    (
        "tagger-dtype",
        "an integer weight dtype",
        lambda _: Tagger(dtype=jnp.int32),
        TypeError,
        ["dtype", "floating", "int32"],
    ),
    (
        "tagger-optimizer",
        "an optimizer that is not an optax transformation",
        lambda _: Tagger(optimizer="adam"),
        TypeError,
        ["optimizer", "GradientTransformation", "str"],
    ),
    (
        "tagger-predict-unfitted",
        "predict before fit",
        lambda _: Tagger().predict([_SENTENCE]),
        ValueError,
        ["no model", "fit()"],
    ),
    (
        "tagger-predict-element",
        "a string instead of a Sentence in predict",
        lambda _: Tagger().predict(["El rey"]),
        TypeError,
        ["sentences[0]", "corpora.Sentence", "str"],
    ),
    (
        "tagger-predict-tokens",
        "token rows given as plain strings",
        lambda _: Tagger().predict([Sentence(("El", "rey"), ("O", "O"))]),
        TypeError,
        ["sentences[0].tokens[0]", "tuple of strings", "'El'"],
    ),
    (
        "tagger-fit-empty",
        "fit on an empty corpus",
        lambda _: Tagger().fit([]),
        ValueError,
        ["sentences", "at least one", "got 0"],
    ),
    (
        "tagger-fit-lengths",
        "a sentence with fewer labels than tokens",
        lambda _: Tagger().fit([Sentence(_SENTENCE.tokens, ("O",))]),
        ValueError,
        ["[0]", "2 tokens", "1 label"],
    ),
    (
        "tagger-fit-element",
        "a non-Sentence element passed to fit",
        lambda _: Tagger().fit([_SENTENCE, ("El", "DA")]),
        TypeError,
        ["sentences[1]", "corpora.Sentence", "tuple"],
    ),
    (
        "tagger-fit-corpus",
        "a string instead of a corpus in fit",
        lambda _: Tagger().fit("El DA O"),
        TypeError,
        ["sentences", "list or tuple", "str"],
    ),
    (
        "tagger-kbest-k",
        "k = 0 best sequences",
        lambda _: Tagger().predict_kbest([_SENTENCE], 0),
        ValueError,
        ["k", ">= 1", "0"],
    ),
    (
        "tagger-mesh-loss",
        "a custom loss with data-parallel training",
        lambda _: Tagger(loss=losses.sequence_log_loss).fit([_SENTENCE], mesh=parallel.data_mesh()),
        ValueError,
        ["mesh", "default log-loss"],
    ),
    (
        "label-scheme",
        "an unknown label scheme",
        lambda _: constraints.allowed_transitions(("O", "B-X"), "BIO"),
        ValueError,
        ["scheme", "IOB2", "'BIO'"],
    ),
    (
        "tagger-load",
        "Tagger.load of a file that is not a tagger",
        _not_a_tagger,
        ValueError,
        ["bad.tagger", "not a lossfns tagger file"],
    ),
    # --- model files, checkpoint directories, corpora ---
    (
        "model-file-bit-flip",
        "a model file with one flipped bit",
        lambda tmp: _damaged_model_file(tmp, _flip_bit),
        ModelFileError,
        ["ner.tagger"],
    ),
    (
        "model-file-truncated",
        "a truncated model file",
        lambda tmp: _damaged_model_file(tmp, lambda data: data[:-7]),
        ModelFileError,
        ["ner.tagger"],
    ),
    (
        "model-file-missing",
        "Tagger.load of a missing file",
        lambda tmp: Tagger.load(tmp / "none.tagger"),
        ModelFileError,
        ["none.tagger"],
    ),
    (
        "checkpoint-dir-in-use",
        "a second training run on one checkpoint_dir",
        _fit_in_locked_directory,
        CheckpointError,
        ["run", "in use"],
    ),
    (
        "checkpoint-dir-a-file",
        "a checkpoint_dir that is a regular file",
        _fit_into_a_file,
        CheckpointError,
        ["checkpoint_dir", "run", "not a directory"],
    ),
    (
        "model-file-fifo",
        "Tagger.load of a FIFO (a read would wait for a writer forever)",
        lambda tmp: _within(10, lambda: Tagger.load(_fifo(tmp, "pipe.tagger"))),
        ModelFileError,
        ["pipe.tagger", "FIFO", "not a regular file"],
    ),
    (
        "checkpoint-fifo",
        "checkpoint.load of a FIFO",
        lambda tmp: _within(10, lambda: checkpoint.load(_fifo(tmp, "pipe.ckpt"), like={"w": jnp.zeros(4)})),
        CheckpointError,
        ["pipe.ckpt", "FIFO"],
    ),
    (
        "model-file-huge-junk",
        "a 2 GiB junk file as a model file (refused after its first bytes, not read whole)",
        _load_within_a_bounded_read,
        ModelFileError,
        ["junk.tagger", "not a lossfns tagger file"],
    ),
    (
        "model-file-reads-feature-dicts",
        "a model of feature dicts (lossfns.sklearn.CRF's) loaded to read column files",
        lambda tmp: model_file.load(_feature_dicts_model(tmp), reading=model_file.COLUMNS),
        ModelFileError,
        ["dicts.tagger", "feature dicts", "lossfns.sklearn.CRF"],
    ),
    (
        "model-file-reads-columns",
        "a model of column files opened by the pycrfsuite-style tagger (feature dicts)",
        lambda tmp: _tiny_tagger().save(tmp / "ner.tagger") or CrfsuiteTagger().open(tmp / "ner.tagger"),
        ModelFileError,
        ["ner.tagger", "reads the columns", "not feature dicts"],
    ),
    # --- the command line (`lossfns`): refused before any work, exit status 2, no traceback ---
    (
        "cli-model-is-the-corpus",
        "lossfns train -p P data.conll data.conll (the model written over the corpus)",
        lambda tmp: _lossfns(tmp, "train", "-p", "ner.pattern", "train.conll", "train.conll"),
        SystemExit,
        ["exit status 2", "lossfns: error: MODEL", "is the TRAIN file", "destroy"],
    ),
    (
        "cli-output-is-the-input",
        "lossfns label -m M in.conll in.conll (the output written over the input)",
        lambda tmp: _lossfns(tmp, "label", "-m", "ner.tagger", "test.conll", "test.conll"),
        SystemExit,
        ["exit status 2", "OUTPUT", "is the INPUT file"],
    ),
    (
        "cli-model-directory-missing",
        "lossfns train with MODEL in a missing directory (found before training)",
        lambda tmp: _lossfns(tmp, "train", "-p", "ner.pattern", "train.conll", "none/model"),
        SystemExit,
        ["exit status 2", "MODEL none/model", "directory none does not exist"],
    ),
    (
        "cli-output-directory-missing",
        "lossfns label with OUTPUT in a missing directory (found before labelling)",
        lambda tmp: _lossfns(tmp, "label", "-m", "ner.tagger", "test.conll", "none/out"),
        SystemExit,
        ["exit status 2", "OUTPUT none/out", "directory none does not exist"],
    ),
    (
        "cli-pattern-missing-column",
        "a pattern that reads a column the training file lacks",
        lambda tmp: _lossfns(tmp, "train", "-p", "ner.pattern", "train.conll", "m", pattern="U:%x[0,4]\n"),
        SystemExit,
        ["exit status 2", "-p/--pattern", "reads 5 columns", "has 2 besides its label column"],
    ),
    (
        "cli-pattern-only-comments",
        "a pattern file with only comments",
        lambda tmp: _lossfns(tmp, "train", "-p", "ner.pattern", "train.conll", "m", pattern="# U:%x[0,0]\n"),
        SystemExit,
        ["exit status 2", "holds no U or * template"],
    ),
    (
        "cli-rho2-inf",
        "lossfns train -2 inf",
        lambda tmp: _lossfns(tmp, "train", "-2", "inf", "-p", "ner.pattern", "train.conll", "m"),
        SystemExit,
        ["exit status 2", "-2/--rho2", "finite", "inf"],
    ),
    (
        "cli-model-reads-more-columns",
        "lossfns label with a model that reads more columns than the input has",
        lambda tmp: _lossfns(tmp, "label", "-m", "ner.tagger", "test.conll"),
        SystemExit,
        ["exit status 2", "-m/--model", "reads 2 columns", "INPUT", "has 1"],
    ),
    (
        "cli-feature-dicts-model",
        "lossfns label with a model saved by lossfns.sklearn.CRF (feature dicts)",
        lambda tmp: _lossfns(tmp, "label", "-m", str(_feature_dicts_model(tmp)), "test.conll"),
        SystemExit,
        ["exit status 2", "dicts.tagger", "feature dicts", "not the columns of a column file"],
    ),
    (
        "cli-crfsuite-model",
        "lossfns label with a CRFsuite model (lossfns.sklearn.CRF(model_filename=)'s)",
        lambda tmp: _lossfns(tmp, "label", "-m", str(_crfsuite_file(tmp)), "test.conll"),
        SystemExit,
        ["exit status 2", "dicts.crfsuite", "CRFsuite model", "feature dict"],
    ),
    # --- python -m experiments ---
    (
        "experiments-unknown-task",
        "python -m experiments altun2003 --tasks nerr",
        lambda tmp: _experiments(tmp, "altun2003", "--tasks", "nerr"),
        SystemExit,
        ["exit status 2", "--tasks", "ner, pos", "'nerr'"],
    ),
    (
        "experiments-units-match-nothing",
        "python -m experiments with --units matching no unit",
        lambda tmp: _experiments(tmp, "altun2003", "--quick", "--tasks", "ner", "--units", "nerr-*", "--report-only"),
        SystemExit,
        ["exit status 2", "--units", "'nerr-*' matched no unit", "ner-S1-"],
    ),
    (
        "conll-label-column-dropped",
        "a later CoNLL sentence without its label column",
        lambda tmp: _conll_bytes(tmp, b"El DA O\nrey NC O\n\nMadrid NP\n"),
        ValueError,
        ["bad.conll:4", "columns"],
    ),
    (
        "conll-latin-1",
        "a latin-1 corpus read as UTF-8",
        lambda tmp: _conll_bytes(tmp, b"El DA O\nEspa\xf1a NP B-LOC\n"),
        ValueError,
        ["bad.conll:2", "latin-1"],
    ),
    (
        "column-file-no-gold",
        "a one-column file read with gold labels (--check)",
        lambda tmp: _column_file(tmp, b"El\nrey\n", labelled=True),
        ValueError,
        ["bad.conll:1", "at least 2 columns"],
    ),
    (
        "labelled-output-length",
        "predicted labels shorter than their sentence",
        lambda tmp: labelled_output.write_labelled(_column_file(tmp, b"El DA\nrey NC\n"), [[("O",)]], io.StringIO()),
        ValueError,
        ["labels[0][0]", "1 labels", "2 tokens", "bad.conll:1"],
    ),
    (
        "dicts-string-token",
        "a token given as a string instead of a feature dict",
        lambda _: dicts.flatten_corpus([["El", "rey"]]),
        TypeError,
        ["X[0][0]", "dict", "str"],
    ),
    (
        "dicts-none-value",
        "None as a feature value",
        lambda _: dicts.flatten_corpus([[{"w": "a"}, {"w": None}]]),
        TypeError,
        ["X[0][1]['w']", "NoneType"],
    ),
    (
        "dicts-nan-value",
        "a NaN feature value",
        lambda _: dicts.flatten_corpus([[{"x": float("nan")}]]),
        ValueError,
        ["X[0][0]['x']", "nan", "finite"],
    ),
    (
        "dicts-key-type",
        "a feature key that is not a string",
        lambda _: dicts.item_features([{3: "a"}]),
        TypeError,
        ["items[0]", "key", "int"],
    ),
    (
        "design-values-shape",
        "design values of another shape than the ids",
        lambda _: design.design_from_ids(np.zeros((2, 3), np.int32), 4, np.ones((2, 2))),
        ValueError,
        ["values", "(2, 3)", "(2, 2)"],
    ),
    (
        "model-values-shape",
        "unigram_values of another shape than unigram_ids",
        lambda _: LinearChainModel.zeros(4, 2).unary(np.zeros((1, 3, 2), np.int32), np.ones((1, 3, 1))),
        ValueError,
        ["unigram_values", "(1, 3, 2)"],
    ),
    (
        "pack-tokens-lengths",
        "sentence lengths that do not add up to the token stack",
        lambda _: pack_tokens(np.zeros((5, 2), np.int32), [2, 2]),
        ValueError,
        ["sentence_lengths", "5 tokens", "4"],
    ),
    (
        "zip-member-missing",
        "a path through a zip archive to no member",
        lambda tmp: corpora.read_conll(_zip_file(tmp) + "/conll2002/none"),
        FileNotFoundError,
        ["corpus.zip", "'conll2002/none'"],
    ),
    (
        "sklearn-algorithm",
        "an algorithm that is not CRFsuite's",
        lambda _: EstimatorCRF(algorithm="newton").fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["algorithm", "'newton'", "'lbfgs'"],
    ),
    (
        "sklearn-unknown-algorithm",
        "an algorithm name CRFsuite does not have either",
        lambda _: EstimatorCRF(algorithm="newton").fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["algorithm", "'newton'"],
    ),
    (
        "sklearn-ragged-y",
        "y with fewer labels than its sentence of X has tokens",
        lambda _: EstimatorCRF().fit([[{"w": "a"}, {"w": "b"}]], [["O"]]),
        ValueError,
        ["y[0]", "2 tokens", "1 labels"],
    ),
    (
        "sklearn-y-count",
        "y with another number of sentences than X",
        lambda _: EstimatorCRF().fit([[{"w": "a"}]], [["O"], ["O"]]),
        ValueError,
        ["y", "1 sentences", "2 label"],
    ),
    (
        "sklearn-other-trainer-setting",
        "a setting of CRFsuite's passive-aggressive trainer with lbfgs",
        lambda _: EstimatorCRF(pa_type=1).fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["pa_type", "None"],
    ),
    (
        "sklearn-l2sgd-c2",
        "l2sgd without an L2 weight (its learning rate is 1 / (c2 t))",
        lambda _: EstimatorCRF(algorithm="l2sgd", c2=0.0).fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["c2", "l2sgd", "> 0"],
    ),
    (
        "sklearn-setting-of-another-algorithm",
        "an l2sgd setting given to the averaged perceptron",
        lambda _: EstimatorCRF(algorithm="ap", calibration_eta=0.1).fit([[{"w": "a"}]], [["O"]]),
        ValueError,
        ["calibration_eta", "algorithm='ap'", "None"],
    ),
    (
        "sklearn-unfitted",
        "predict before fit",
        lambda _: EstimatorCRF().predict([[{"w": "a"}]]),
        ValueError,
        ["not fitted", "fit()"],
    ),
    # --- label and id arrays checked before any cast ---
    (
        "hamming-float",
        "float predicted labels for hamming_loss",
        lambda _: losses.hamming_loss(np.array([[0.0, 1.5]]), np.array([[0, 1]])),
        TypeError,
        ["predicted", "integer"],
    ),
    (
        "hamming-wide",
        "an int64 gold label int32 would wrap",
        lambda _: _x32(lambda: losses.hamming_loss(np.array([[0, 1]]), np.array([[_WIDE, 1]]))),
        ValueError,
        ["labels", "int32", str(_WIDE)],
    ),
    (
        "rerank-reference-wide",
        "an int64 reranking reference int32 would wrap",
        lambda _: _x32(lambda: losses.reranking_exp_loss(jnp.zeros((2, 3)), np.array([_WIDE, 0]))),
        ValueError,
        ["reference", str(_WIDE)],
    ),
    (
        "hmm-word-range",
        "a word id outside the HMM's vocabulary",
        lambda _: hmm.log_likelihood(_HMM, [[0, 5, 1]]),
        ValueError,
        ["words", "[0, 4)", "5", "(0, 1)"],
    ),
    (
        "hmm-word-float",
        "float word ids",
        lambda _: hmm.log_likelihood(_HMM, [[0.5, 1.0]]),
        TypeError,
        ["words", "integer", "0.5"],
    ),
    (
        "hmm-noise-without-key",
        "a noisy HMM start without a PRNG key",
        lambda _: hmm.initial_params(2, 4, noise=0.5),
        ValueError,
        ["key", "noise"],
    ),
    (
        "model-ids-float",
        "float feature ids for a model",
        lambda _: LinearChainModel.zeros(4, 2)(np.array([[[0.0, 1.0]]])),
        TypeError,
        ["unigram_ids", "integer", "float"],
    ),
    (
        "model-pair-mask-shape",
        "a pair mask of the wrong shape",
        lambda _: LinearChainModel.zeros(4, 2, 3).with_pair_mask(np.ones((3, 2, 3), bool)),
        ValueError,
        ["pair_mask", "(3, 2, 2)", "(3, 2, 3)"],
    ),
    # --- lossfns.lattices.sparse_chain ---
    (
        "sparse-pair-label",
        "a sparse pair support label outside [0, L)",
        lambda _: chain.log_partition(_sparse(pair_previous=jnp.array([0, 2]))),
        ValueError,
        ["pair_previous", "[0, 2)"],
    ),
    (
        "sparse-pair-weights-shape",
        "pair weights whose T differs from unary's",
        lambda _: chain.log_partition(_sparse(pair_weights=jnp.zeros((2, T + 1, 2)))),
        ValueError,
        ["pair_weights", "T"],
    ),
    (
        "sparse-transitions-shape",
        "sparse transitions of the wrong shape",
        lambda _: chain.log_partition(_sparse(transitions=jnp.zeros((L, L + 1)))),
        ValueError,
        ["transitions", "[..., 2, 2]"],
    ),
    (
        "sparse-nan-inside",
        "NaN in sparse unary scores inside the lengths",
        lambda _: chain.log_partition(_sparse(unary=jnp.zeros((2, T, L)).at[1, 0, 1].set(NAN))),
        ValueError,
        ["unary", "NaN", "(1, 0, 1)"],
    ),
    # --- lossfns.nn.CRF and lossfns.lattices.constraints ---
    ("crf-num-tags", "a CRF with 0 tags", lambda _: CRF(0, key=jax.random.key(0)), ValueError, ["num_tags", ">= 1"]),
    (
        "crf-emissions-tags",
        "emissions whose last axis is not the CRF's number of tags",
        lambda _: _CRF.log_partition(jnp.zeros((2, T, L + 1))),
        ValueError,
        ["emissions", f"[..., T, {L}]"],
    ),
    (
        "crf-emissions-rank",
        "emissions of rank 1",
        lambda _: _CRF.decode(jnp.zeros(L)),
        ValueError,
        ["emissions", "[..., T, L]"],
    ),
    (
        "crf-emissions-nan",
        "NaN in emissions inside the mask",
        lambda _: _CRF.log_partition(jnp.zeros((2, T, L)).at[1, 0, 1].set(NAN)),
        ValueError,
        ["emissions", "NaN", "(1, 0, 1)"],
    ),
    (
        "crf-mask-holes",
        "a mask that is not a prefix mask (a hole inside a sequence)",
        lambda _: _CRF.log_likelihood(
            jnp.zeros((2, T, L)), jnp.zeros((2, T), int), jnp.array([[True, False, True]] * 2)
        ),
        ValueError,
        ["mask", "prefix", "(0, 2)"],
    ),
    (
        "crf-mask-int",
        "an integer mask",
        lambda _: _CRF.decode(jnp.zeros((2, T, L)), jnp.ones((2, T), jnp.int32)),
        TypeError,
        ["mask", "bool"],
    ),
    (
        "crf-mask-shape",
        "a mask not of shape [..., T]",
        lambda _: _CRF.decode(jnp.zeros((2, T, L)), jnp.ones((2, T + 1), bool)),
        ValueError,
        ["mask", "(2, 3)"],
    ),
    (
        "crf-mask-and-lengths",
        "both a mask and lengths",
        lambda _: _CRF.entropy(jnp.zeros((2, T, L)), jnp.ones((2, T), bool), lengths=jnp.array([1, 2])),
        ValueError,
        ["mask", "lengths"],
    ),
    (
        "crf-tags-range",
        "a tag >= L inside the mask",
        lambda _: _CRF.log_likelihood(jnp.zeros((2, T, L)), jnp.array([[0, 1, 2], [0, 0, 0]])),
        ValueError,
        ["tags", "[0, 2)"],
    ),
    ("crf-kbest-k", "k = 0 best sequences", lambda _: _CRF.kbest(jnp.zeros((2, T, L)), 0), ValueError, ["k", ">= 1"]),
    (
        "crf-allowed-shape",
        "an allowed-transition mask of the wrong shape",
        lambda _: CRF(L, key=jax.random.key(0), allowed=jnp.ones((L, L + 1), bool)),
        ValueError,
        ["allowed.transitions", "(2, 2)"],
    ),
    (
        "crf-parameters-inf",
        "a -inf transition given as a parameter (forbid with allowed=)",
        lambda _: CRF.from_parameters(jnp.full((L, L), -jnp.inf), jnp.zeros(L), jnp.zeros(L)),
        ValueError,
        ["transitions", "finite", "allowed"],
    ),
    (
        "crf-cost-diagonal",
        "a softmax-margin cost matrix with a non-zero diagonal",
        lambda _: _CRF.softmax_margin_loss(jnp.zeros((2, T, L)), jnp.zeros((2, T), int), cost=jnp.ones((L, L))),
        ValueError,
        ["cost", "diagonal"],
    ),
    (
        "crf-possible-empty",
        "partial labels allowing no tag at a position inside the mask",
        lambda _: _CRF.partial_log_likelihood(jnp.zeros((2, T, L)), jnp.ones((2, T, L), bool).at[0, 1].set(False)),
        ValueError,
        ["possible", "at least one", "(0, 1)"],
    ),
    (
        "crf-possible-tags-range",
        "partial tags below -1",
        lambda _: possible_tags(jnp.array([[0, -2, 1]]), L),
        ValueError,
        ["tags", "[-1, 2)", "-2"],
    ),
    (
        "constraints-scheme",
        "an unknown tagging scheme",
        lambda _: constraints.allowed_transitions(["O"], "IOB3"),
        ValueError,
        ["scheme", "IOB2", "IOB3"],
    ),
    (
        "constraints-label",
        "a label outside the scheme",
        lambda _: constraints.allowed_transitions(["O", "E-PER"], "IOB2"),
        ValueError,
        ["labels", "'E-PER'", "IOB2"],
    ),
]


def _case_id(case):
    return case.values[0] if hasattr(case, "values") else case[0]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    with pytest.raises(error) as raised:
        call(tmp_path)
    message = str(raised.value)
    for word in words:
        assert word in message, f"{description}: {word!r} not in {message!r}"


# ---------------------------------------------------------------------------
# Under plain jit: what no check can see gives NaN, in the value and the gradient
# ---------------------------------------------------------------------------

_EMISSIONS = jax.random.normal(jax.random.key(1), (2, T, L))
_TAGS = jnp.array([[0, 1, 0], [1, 1, 0]])
_CHAIN_CRF = lambda e: FactoredPotentials(e, _CRF.transitions)


def _under_jit(loss, emissions=_EMISSIONS, tags=_TAGS):
    """`(loss [2], d sum(loss) / d emissions [2, T, L])` of `loss(emissions,
    tags)`, both under `jax.jit` (sequence 0 holds the bad input)."""
    value_and_grad = lambda e, t: (loss(e, t), jax.grad(lambda e: jnp.sum(loss(e, t)))(e))
    return jax.jit(value_and_grad)(emissions, tags)


# (id, description of the bad input inside sequence 0's length, call -> (values, gradients))
UNDER_JIT_CASES = [
    (
        "crf-tag-above-range",
        "nn.CRF.log_likelihood with a tag >= L",
        lambda: _under_jit(_CRF.log_likelihood, tags=_TAGS.at[0, 1].set(L)),
    ),
    (
        "crf-tag-negative",
        "nn.CRF.log_likelihood with a tag -1",
        lambda: _under_jit(_CRF.log_likelihood, tags=_TAGS.at[0, 1].set(-1)),
    ),
    (
        "crf-nan-emission-gold",
        "nn.CRF.log_likelihood with a NaN emission of the gold tag",
        lambda: _under_jit(_CRF.log_likelihood, emissions=_EMISSIONS.at[0, 1, 1].set(NAN)),
    ),
    (
        "crf-nan-emission-other",
        "nn.CRF.log_likelihood with a NaN emission of another tag",
        lambda: _under_jit(_CRF.log_likelihood, emissions=_EMISSIONS.at[0, 1, 0].set(NAN)),
    ),
    (
        "crf-softmax-margin-tag",
        "nn.CRF.softmax_margin_loss with a tag >= L",
        lambda: _under_jit(_CRF.softmax_margin_loss, tags=_TAGS.at[0, 2].set(L + 3)),
    ),
    (
        "sequence-log-loss-label",
        "losses.sequence_log_loss with a label >= L",
        lambda: _under_jit(lambda e, t: losses.sequence_log_loss(_CHAIN_CRF(e), t), tags=_TAGS.at[0, 0].set(L)),
    ),
    (
        "sequence-exp-loss-nan",
        "losses.sequence_exp_loss with a NaN score",
        lambda: _under_jit(
            lambda e, t: losses.sequence_exp_loss(_CHAIN_CRF(e), t), emissions=_EMISSIONS.at[0, 2, 1].set(NAN)
        ),
    ),
    (
        "pointwise-log-loss-label",
        "losses.pointwise_log_loss with a label >= L",
        lambda: _under_jit(lambda e, t: losses.pointwise_log_loss(_CHAIN_CRF(e), t), tags=_TAGS.at[0, 1].set(L)),
    ),
    (
        "pointwise-log-loss-nan",
        "losses.pointwise_log_loss with a NaN score (was +inf with a zero gradient)",
        lambda: _under_jit(
            lambda e, t: losses.pointwise_log_loss(_CHAIN_CRF(e), t), emissions=_EMISSIONS.at[0, 0, 1].set(NAN)
        ),
    ),
    (
        "hinge-label",
        "losses.structured_hinge_loss with a label >= L (dense potentials)",
        lambda: _under_jit(
            lambda e, t: losses.structured_hinge_loss(chain.materialize(_CHAIN_CRF(e)), t), tags=_TAGS.at[0, 1].set(L)
        ),
    ),
]


@pytest.mark.parametrize("case_id, description, call", UNDER_JIT_CASES, ids=[c[0] for c in UNDER_JIT_CASES])
def test_bad_values_under_jit_give_nan_values_and_gradients(case_id, description, call):
    values, gradients = call()
    assert np.isnan(values[0]) and np.isnan(gradients[0]).any(), f"{description}: {values[0]}, {gradients[0]}"
    assert np.isfinite(values[1]) and np.isfinite(gradients[1]).all(), "the other sequence is untouched"


def count_phrase() -> str:
    """How the reliability page counts the table: `(N kinds,` (the README carries no count)."""
    return f"({len(CASES) + len(UNDER_JIT_CASES)} kinds,"


def test_the_table_is_large_enough_and_the_docs_count_it():
    assert len(CASES) >= 100
    reliability = (Path(__file__).parent.parent / "docs" / "reliability.md").read_text(encoding="utf-8")
    assert count_phrase() in reliability, (
        f"docs/reliability.md must say {count_phrase()} (python tests/test_bad_inputs.py --count)"
    )


# ---------------------------------------------------------------------------
# Inside jit: values are traced, so only the opt-in checkify mode sees them
# ---------------------------------------------------------------------------

_checked_log_partition = debug.checked(chain.log_partition, validate=debug.check_chain_inputs)
_checked_score = debug.checked(chain.score, validate=lambda p, y, n=None: debug.check_chain_inputs(p, n, y))
_FORBIDDEN = jnp.zeros((2, T, L, L)).at[:, :, 1, 0].set(-jnp.inf)

INSIDE_JIT_CASES = [
    (
        "nan-potentials",
        lambda: _checked_log_partition(_FORBIDDEN.at[0, 1, 1, 1].set(NAN), jnp.array([1, 3])),
        ["potentials", "NaN"],
    ),
    (
        "posinf-potentials",
        lambda: _checked_log_partition(_FORBIDDEN.at[1, 0, 0, 1].set(INF), None),
        ["potentials", "+inf"],
    ),
    ("nan-unary", lambda: _checked_log_partition(_factored(unary=jnp.full((2, T, L), NAN)), None), ["unary", "NaN"]),
    ("length-above-T", lambda: _checked_log_partition(_FORBIDDEN, jnp.array([0, 4])), ["lengths", "[0, 3]", "4"]),
    ("length-negative", lambda: _checked_log_partition(_FORBIDDEN, jnp.array([-2, 1])), ["lengths", "-2"]),
    (
        "label-out-of-range",
        lambda: _checked_score(_FORBIDDEN, jnp.array([[0, 5, 0], [0, 0, 0]]), jnp.array([3, 3])),
        ["labels", "[0, 2)", "5"],
    ),
    ("nan-made-inside", lambda: debug.checked(lambda x: jnp.log(x) * 0.0)(jnp.array([-1.0])), ["nan", "log"]),
]


@pytest.mark.parametrize("case_id, call, words", INSIDE_JIT_CASES, ids=[c[0] for c in INSIDE_JIT_CASES])
def test_checked_mode_catches_bad_values_inside_jit(case_id, call, words):
    with pytest.raises(ValueError) as raised:  # noqa: PT011  (its words are checked below)
        call()
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_checked_mode_passes_valid_inputs_unchanged():
    lengths = jnp.array([0, 3])
    np.testing.assert_array_equal(_checked_log_partition(_FORBIDDEN, lengths), chain.log_partition(_FORBIDDEN, lengths))
    # Labels outside the length are never read, so -1 padding is fine there.
    labels = jnp.array([[0, 5, -1], [0, 1, 1]])
    np.testing.assert_array_equal(
        _checked_score(_FORBIDDEN, labels, jnp.array([1, 3])), chain.score(_FORBIDDEN, labels, jnp.array([1, 3]))
    )
    # No false NaN alarms from -inf structure, chains with no path, or derivatives.
    marginals = debug.checked(chain.marginals)(jnp.full((2, T, L, L), -jnp.inf), lengths)
    assert np.asarray(marginals).sum() == 0.0


def test_plain_jit_does_not_see_nan_values():
    """Why the debug mode exists: under plain jit the value check is skipped
    and a NaN potential gives a NaN log Z without any error saying where."""
    bad = _FORBIDDEN.at[0, 1, 1, 1].set(NAN)
    jax.block_until_ready(jax.jit(chain.log_partition)(bad, jnp.array([3, 3])))
    with pytest.raises(ValueError, match="potentials contains NaN"):
        _checked_log_partition(bad, jnp.array([3, 3]))


def markdown_table(tmp_path: Path) -> str:
    """The reliability page's table: each bad input and the error it gives
    now (the cases under jit: their value and gradient)."""
    rows = ["| bad input | error |", "|---|---|"]
    for case in CASES:
        _, description, call, _, _ = case.values if hasattr(case, "values") else case
        try:
            call(tmp_path)
            outcome = "**no error**"
        except (Exception, SystemExit) as error:  # reporting whatever is raised (SystemExit: a refusal)
            text = str(error).replace(str(tmp_path) + "/", "").replace("|", "\\|").splitlines()[0]
            outcome = f"`{type(error).__name__}`: {text[:140]}"
        rows.append(f"| {description} | {outcome} |")
    for _, description, call in UNDER_JIT_CASES:
        values, gradients = call()
        gradient = "NaN" if np.isnan(gradients[0]).any() else "finite"
        rows.append(f"| under `jit`: {description} | value {float(values[0])}, gradient {gradient} |")
    return "\n".join(rows)


if __name__ == "__main__":
    import tempfile

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `experiments`, as pytest's pythonpath
    if sys.argv[1:] == ["--count"]:  # the reliability page's phrase
        sys.stdout.write(count_phrase() + "\n")
    else:
        with tempfile.TemporaryDirectory() as directory:
            sys.stdout.write(markdown_table(Path(directory)) + "\n")


def test_a_dense_table_that_cannot_fit_is_refused_before_allocation():
    from lossfns.models import LinearChainModel

    with pytest.raises(MemoryError, match="emission weights W of shape"):
        LinearChainModel.zeros(10**12, 45)


# ---------------------------------------------------------------------------
# Numpy integers are ints; checked ids and lengths are the ones used
# ---------------------------------------------------------------------------


def test_numpy_integers_are_accepted_wherever_ints_are():
    scores, labels = chain.kbest(GOOD(), None, np.int64(2))
    assert scores.shape == (2, 2) and labels.shape == (2, 2, T)
    assert semirings.KMax(np.int32(3)).k == 3 and type(semirings.KMax(np.int32(3)).k) is int
    optimizers.owlqn(0.1, memory_size=np.int64(3), max_linesearch_steps=np.int16(4))
    result = optimizers.minimize(_squares, jnp.ones(2), optax.sgd(0.1), max_steps=np.int64(3))
    assert result.trace.shape == (3,)


def test_lengths_and_labels_in_range_pass_the_int32_cast_unchanged():
    """The pre-cast check refuses only what would change: int64 values that
    fit in int32 run as before, with x64 off."""
    with jax.enable_x64(False):
        lengths, labels = np.array([1, 3], np.int64), np.array([[1, 0, 2**31 - 1], [0, 1, 1]], np.int64)
        np.testing.assert_array_equal(
            chain.score(GOOD(), labels, lengths), chain.score(GOOD(), labels.astype(np.int32), lengths.astype(np.int32))
        )


# ---------------------------------------------------------------------------
# lossfns.lattices.dag: boolean final masks, and jit against eager
# ---------------------------------------------------------------------------


def test_a_boolean_final_mask_is_a_mask_not_state_ids():
    by_mask = dag.from_arcs(_ARCS, final=[False, False, True])
    by_ids = dag.from_arcs(_ARCS, final=[2])
    np.testing.assert_array_equal(by_mask.final, [False, False, True])
    for got, expected in zip(by_mask, by_ids):
        np.testing.assert_array_equal(got, expected)
    # a mask may mark states no arc names (num_states from its length)
    assert dag.from_arcs(_ARCS, final=np.array([False, False, True, True])).num_states == 4


def _padded_batch():
    """Two lattices padded to 6 arcs; padding scores are NaN and +inf (ignored)."""
    sizes = dict(num_states=3, num_arcs=6, num_levels=2, width=1, in_degree=2)
    lattices = dag.stack(
        [
            dag.pad(dag.from_arcs([(0, 1, 0), (0, 1, 1), (1, 2, 0), (0, 2, 3)], final=[2]), **sizes),
            dag.pad(dag.from_arcs([(0, 1, 0), (1, 2, 1)], final=[1, 2]), **sizes),
        ]
    )
    assert lattices.arc_valid.tolist() == [[True] * 4 + [False] * 2, [True] * 2 + [False] * 4]
    scores = jnp.array([[0.1, 0.2, -jnp.inf, -0.5, NAN, INF], [0.3, 1.5, NAN, INF, NAN, -jnp.inf]])
    return lattices, scores


@pytest.mark.parametrize("semiring", [semirings.Log, semirings.Real], ids=["log", "real"])
def test_jit_and_eager_give_the_same_finite_log_z_and_marginals(semiring):
    lattices, scores = _padded_batch()
    log_z = lambda lat, s: dag.log_partition(lat, s, semiring=semiring)
    marginals = lambda lat, s: dag.arc_marginals(lat, s, semiring=semiring)
    eager_z, eager_m = log_z(lattices, scores), marginals(lattices, scores)
    jit_z, jit_m = jax.jit(log_z)(lattices, scores), jax.jit(marginals)(lattices, scores)
    assert np.isfinite(eager_z).all() and np.isfinite(eager_m).all()
    np.testing.assert_allclose(jit_z, eager_z, rtol=1e-12)
    np.testing.assert_allclose(jit_m, eager_m, rtol=1e-12, atol=1e-15)
    # By hand: lattice 0's only allowed path is arc 3 (arcs 0 and 1 lead to the forbidden arc 2);
    # lattice 1 accepts arc 0 (0.3) and arcs 0, 1 (1.8).
    np.testing.assert_allclose(eager_z, [-0.5, np.logaddexp(0.3, 1.8)], rtol=1e-12)
    np.testing.assert_allclose(eager_m[0], [0, 0, 0, 1, 0, 0], atol=1e-15)


def test_invalid_scores_under_jit_give_nan_marginals_not_zeros():
    """+inf or NaN on a real arc: eager refuses it; under jit (no check) the
    result must not look like a lattice without paths (NaN log Z with zero
    marginals): every derivative is NaN too."""
    lattice = dag.from_arcs([(0, 1, 0), (0, 1, 1), (1, 2, 0), (0, 2, 3)], final=[2])
    for bad in (INF, NAN):
        scores = jnp.array([bad, 0.2, 0.3, -0.5])
        with pytest.raises(ValueError, match="arc_scores contains"):
            dag.log_partition(lattice, scores)
        for semiring in (semirings.Log, semirings.Real):
            assert np.isnan(jax.jit(lambda s: dag.log_partition(lattice, s, semiring=semiring))(scores))
            assert np.isnan(jax.jit(lambda s: dag.arc_marginals(lattice, s, semiring=semiring))(scores)).all()


# ---------------------------------------------------------------------------
# Optimizer status: every result says why the run stopped
# ---------------------------------------------------------------------------

_OPTIMIZERS = {
    "owlqn": lambda: optimizers.owlqn(0.0, max_linesearch_steps=3),
    "lbfgs": optax.lbfgs,
    "sgd": lambda: optax.sgd(0.1),
}


def _bowl(params):
    return jnp.sum((params - 3.0) ** 2)


def _cliff(params):
    """Finite at the start (all ones) only: every trial step is NaN."""
    return jnp.where(jnp.all(params == 1.0), jnp.sum(params**2), NAN)


def _nan_everywhere(params):
    return jnp.sum(params**2) + NAN


def _run(objective, name, max_steps, jit):
    run = lambda p: optimizers.minimize(objective, p, _OPTIMIZERS[name](), max_steps=max_steps)
    return (jax.jit(run) if jit else run)(jnp.ones(2))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_status_converged(name, jit):
    result = _run(_bowl, name, 200, jit)
    assert int(result.status) == optimizers.Status.CONVERGED and optimizers.status_name(result.status) == "CONVERGED"
    assert int(result.num_steps) < 200
    np.testing.assert_allclose(result.params, 3.0, atol=1e-3)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_status_iteration_limit(name, jit):
    result = _run(_bowl, name, 1, jit)
    assert optimizers.status_name(result.status) == "ITERATION_LIMIT" and int(result.num_steps) == 1


@pytest.mark.parametrize("objective", [_nan_everywhere, lambda p: _bowl(p) + INF], ids=["nan", "inf"])
@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_status_non_finite_objective_at_the_start_stops_at_once(name, objective):
    with pytest.warns(RuntimeWarning, match="NON_FINITE_OBJECTIVE"):
        result = _run(objective, name, 20, jit=False)
    assert optimizers.status_name(result.status) == "NON_FINITE_OBJECTIVE"
    assert int(result.num_steps) == 1 and not np.isfinite(result.trace[0])
    np.testing.assert_array_equal(result.params, jnp.ones(2))  # untouched, not NaN
    jitted = _run(objective, name, 20, jit=True)  # inside jit: no warning, the status is the signal
    assert int(jitted.status) == optimizers.Status.NON_FINITE_OBJECTIVE
    if name == "owlqn":  # one evaluation at the start, no line search
        assert int(result.state.count) == 1 and int(result.state.status) == optimizers.Status.NON_FINITE_OBJECTIVE


def test_owlqn_does_not_search_from_a_non_finite_start():
    calls = []

    def counted(params):
        jax.debug.callback(lambda: calls.append(1))
        return _nan_everywhere(params)

    with pytest.warns(RuntimeWarning):
        optimizers.minimize(counted, jnp.ones(2), optimizers.owlqn(0.1), max_steps=5)
    assert len(calls) == 1  # the start only: no trial of the line search, no second step


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", ["owlqn", "lbfgs"])
def test_status_line_search_failed(name, jit):
    if jit:
        result = _run(_cliff, name, 20, jit=True)
    else:
        with pytest.warns(RuntimeWarning, match="LINE_SEARCH_FAILED"):
            result = _run(_cliff, name, 20, jit=False)
    assert optimizers.status_name(result.status) == "LINE_SEARCH_FAILED"
    assert int(result.num_steps) == 1  # another step would repeat the same failed search
    np.testing.assert_array_equal(result.params, jnp.ones(2))


def test_stochastic_status_non_finite_when_sgd_diverges():
    with pytest.warns(RuntimeWarning, match="NON_FINITE_OBJECTIVE"):
        result = optimizers.minimize_stochastic(
            _squares,
            jnp.ones(2),
            optimizers.sgd_l1(1e30, 0.0),
            jnp.zeros((4, 2)),
            key=jax.random.key(0),
            batch_size=2,
            num_epochs=50,
        )
    assert optimizers.status_name(result.status) == "NON_FINITE_OBJECTIVE"
    assert int(result.num_steps) < 50
    fine = optimizers.minimize_stochastic(
        _squares,
        jnp.ones(2),
        optimizers.sgd_l1(0.01, 0.0),
        jnp.zeros((4, 2)),
        key=jax.random.key(0),
        batch_size=2,
        num_epochs=3,
    )
    assert optimizers.status_name(fine.status) == "ITERATION_LIMIT"
