"""Lavergne, Cappe & Yvon (2010), "Practical very large scale CRFs".

Three ways of training an L1-penalised linear-chain CRF (MATH.md section 6),
`l(theta) + rho_1 ||theta||_1 + rho_2 / 2 ||theta||^2`:

* OWL-QN (Andrew & Gao 2007, `lossfns.optimizers.owlqn`), full batch,
  through the library's training path (`training.train_linear_chain`,
  the Tagger's, on `features.pack_rows`);
* SGD with the cumulative L1 penalty (Tsuruoka et al. 2009,
  `lossfns.optimizers.lazy_sgd_l1`: applied lazily to the rows a minibatch
  touches), learning rate calibrated on a sample (`calibrate_learning_rate`)
  and decayed per epoch;
* block coordinate descent (Sokolovska et al. 2010, `lossfns.training.bcd`),
  one block per observation test,

each also followed by the paper's fine-tuning: L-BFGS on the active
(non-zero) features only with a small L2 penalty (`lossfns.optimizers.finetune`).
All three train the same model (`chain_model`): weights only on the (test,
label) pairs and (word, y', y) triples seen in training (CRFsuite's
parameter set; the paper counts its features over every combination, and
the report gives both counts). Whole-corpus objectives are summed over 8
blocks one at a time (`models.blockwise_corpus_loss`), so that the dense
`[N, L, L]` potentials of the pair features fit in memory.
CRFsuite (python-crfsuite: L-BFGS with the same penalties, and its L2-only
`l2sgd`) trains the same tasks from the same observation strings, as extra rows.

Tasks (conll2000 WSJ, all 8,936 training and 2,012 test sentences;
`experiments.synthetic` planted data without the corpus):

* `pos`: POS tagging (44 tags) with Lavergne's feature set (`lavergne_pos`:
  words, lower case, prefixes and suffixes up to 4, shape, words and word
  pairs in a window of 5), Table 4 analogue;
* `pairs`: the same with label-pair-observation features `f_{y', y, x}`
  (here: the current word, every `(word, y', y)` weight), Table 1 analogue
  against `pos`;
* `joint`: the joint POS and chunk label of each token (`NN|B-NP`, 319
  labels), the large-label-set condition of the paper's Nettalk+prosody
  (Table 5); BCD there only after a probe on a subset says it fits;
* `sparse`: Table 2 analogue, whole OWL-QN runs of the `pairs` model with
  the sparse and with the dense forward-backward (`LinearChainModel.
  with_pair_mask`, passed as `train_linear_chain(model=)`).

Every optimizer runs through `optimizers.drive` with checkpoints under
`OUT/checkpoints/UNIT` (an interrupted unit resumes where it stopped) and
stops on a relative objective change (CRFsuite's rule,
`relative_improvement_below`; SGD-L1 on the change either way,
`relative_change_over`); the iteration caps are safety limits, and a
unit's optimisation is time-boxed at `TIME_BOX_SECONDS` (its rows say so).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from lossfns import corpora, features, metrics, models, optimizers, training
from lossfns.features import presets, templates
from lossfns.models import LinearChainModel
from lossfns.training import bcd_schedule

from . import crfsuite_comparison, synthetic, tagging
from .harness import (
    RunDirectory,
    converged_cell,
    machine,
    markdown_table,
    missing_note,
    select_tasks,
    stale_note,
    trace_convergence,
    verdict,
)

# ---------------------------------------------------------------------------
# The paper's numbers (MATH.md section 6; paper text in /work/shared/papers)
# ---------------------------------------------------------------------------

# Table 4, Nettalk 5-grm+ (1-grm for context): iterations, active features,
# phoneme error %, time (all cores' CPU time; wall time up to 7x less).
PAPER_TABLE4 = {
    "OWL-QN": "141.0 it., 43,429 feat., 7.89%, 1h37 (1-grm: 63.4 it., 4,684, 17.79%, 11 min)",
    "SGD-L1": "28.5 it., 34,319 feat., 8.01%, 45 min (1-grm: 21.4 it., 3,540, 18.21%, 9 min)",
    "BCD": "8.7 it., 47,675 feat., 7.91%, 2h18 (1-grm: 28.2 it., 5,017, 18.27%, 27 min)",
}
# Table 5, Nettalk+prosody (114 joint labels): error on joint / phonemic labels.
PAPER_TABLE5 = {
    "OWL-QN": "not run (largest model it could handle: 3-grm, 69M features, 48 min)",
    "SGD-L1": "5-grm+: 13.91% / 7.51%, 2h45",
    "BCD": "5-grm+: 13.85% / 7.47%, 7h14",
}
# Section 5.3.3 and 5.4, Penn Treebank POS (45 tags, 43,207 observations).
PAPER_POS = {
    "OWL-QN": "about 1 hour; 2.91% error (base set with pair features, Table 1)",
    "SGD-L1": "about 40 minutes",
    "BCD": "'unpractically slower' (each sequence visited 380 times per sweep); "
    "incremental BCD: 2.78% test error, 400k active of 4 billion features",
}
# Table 1: error (and feature count) with / without label-pair-observation features.
PAPER_TABLE1 = (
    ("Nettalk 3-grm", "10.74% (14.3M)", "14.59% (0.3M)"),
    ("Nettalk 5-grm", "8.48% (132.5M)", "11.54% (2.5M)"),
    ("POS base", "2.91% (436.7M)", "3.47% (70.2M)"),
)
# Table 2: training time with L2 / L1 + sparse fb / L1 + dense fb, and % zeros of M.
PAPER_TABLE2 = (
    ("1-grm", "84 min", "41 min", "57 min", "44.6%"),
    ("3-grm-", "65 min", "16 min", "44 min", "99.6%"),
    ("3-grm", "72 min", "48 min", "58 min", "19.9%"),
)

L1 = 0.5  # rho_1 and rho_2 of the paper, "used throughout"
L2 = 1e-5
FINETUNE_L2 = 1e-5  # "a small L2 penalty"
OWLQN_MEMORY = 5  # "5 past values of the gradient"
SEED = 0
# CRFsuite's c1, c2 for the same objective (`optimizers.crfsuite_elastic_net`
# maps them back to L1, L2); its l2sgd is L2 only, at CRFsuite's default c2.
CRFSUITE_C1, CRFSUITE_C2 = L1, L2 / 2
L2SGD_C2 = 1.0

PAIR_TEMPLATES = "B01:%x[0,0]"  # label pair x current word: f_{y', y, x}

# Stopping (relative objective change, CRFsuite's rule
# `relative_improvement_below(tol, period)`: `(f_{k-period} - f_k) / |f_k| <
# tol`): `stop` for the quasi-Newton runs (OWL-QN, CRFsuite L-BFGS: its
# defaults delta 1e-5, period 10), `epoch_stop` for epochs and sweeps (SGD-L1,
# BCD, l2sgd); fine-tuning stops on a relative change below `finetune_tol` in
# one iteration. SGD-L1 takes `epoch_stop` on the change either way
# (`relative_change_over`): CRFsuite's rule stopped the pairs run at epoch 14,
# when its objective rose (20,230 to 20,630) with the step still too large.
# The caps are safety limits far beyond (a capped row says so).
_FULL_CHAIN = dict(
    num_train=None,
    num_test=None,
    features="lavergne_pos",
    pairs="",
    num_buckets=4,
    blocks=8,  # the objective's blocks (`Encoded.blocks`): a block's [N / 8, L, L] at a time
    owlqn_steps=5000,
    sgd_epochs=200,
    batch_size=1,  # Tsuruoka et al.'s per-sentence steps (lazy: as cheap per epoch as minibatches)
    bcd_sweeps=200,
    finetune_steps=3000,
    stop=(1e-5, 10),
    epoch_stop=(1e-4, 3),
    finetune_tol=1e-6,
    chunk=10,
    crfsuite=("lbfgs", "l2sgd"),
    crfsuite_iterations=5000,
)
FULL = {
    "pos": dict(_FULL_CHAIN),
    # CRFsuite has no label-pair-observation features: no CRFsuite rows.
    "pairs": dict(_FULL_CHAIN, pairs=PAIR_TEMPLATES, crfsuite=()),
    # BCD at 319 labels: first one sweep on `bcd_probe_sentences`, then the
    # full unit only if the extrapolated sweep fits `bcd_budget`. CRFsuite
    # (about 48 s a gradient) first runs `crfsuite_probe_iterations`, whose
    # seconds set the iteration cap the time box allows (`crfsuite_unit`).
    "joint": dict(_FULL_CHAIN, bcd_probe_sentences=100, crfsuite_probe_iterations=3),
    "sparse": dict(_FULL_CHAIN, pairs=PAIR_TEMPLATES, crfsuite=(), finetune_steps=0),
}
# Quick: tiny slices of short sentences, a few steps, a fixed SGD rate (no
# calibration to compile), and a BCD plan sized for them. A BCD sweep has a
# round per observation test of the busiest sentence (at most 20 tokens: about
# 300 rounds, against 818 with a 60-token sentence), and each round runs the
# plan's padded jobs and cell chunks (`training.bcd_data`), whose defaults
# suit the whole corpus: on 30 sentences they are mostly padding. Together a
# sweep takes 3 s instead of 3.5 min (the suite's XLA flags, 2 cores).
_QUICK_CHAIN = dict(
    _FULL_CHAIN,
    num_train=40,
    num_test=20,
    max_length=20,
    bcd_plan=dict(rows_per_job=32, window_rows=4, cells_per_chunk=64),
    num_buckets=1,
    blocks=2,
    owlqn_steps=6,
    sgd_epochs=2,
    batch_size=10,
    sgd_rate=1e-2,
    bcd_sweeps=1,
    finetune_steps=3,
    chunk=3,
    crfsuite_iterations=10,
)
QUICK = {
    "pos": dict(_QUICK_CHAIN, num_train=30, num_test=30),
    "pairs": dict(_QUICK_CHAIN, pairs=PAIR_TEMPLATES, crfsuite=()),
    "joint": dict(_QUICK_CHAIN, bcd_probe_sentences=10, crfsuite_probe_iterations=2),
    "sparse": dict(_QUICK_CHAIN, pairs=PAIR_TEMPLATES, crfsuite=(), finetune_steps=0),
}
# BCD on a joint-label task runs when its plan, model and sweep fit in
# `bytes` (this machine: 23 GiB, shared) and a sweep is estimated to take at
# most `seconds` (`bcd_probe`; a run is checkpointed after each sweep).
BCD_BUDGET = {"bytes": 12 * 2**30, "seconds": 2 * 3600}
# A unit's optimisation (its optimizer, then its fine-tuning) stops at the
# first chunk end after this many seconds, summed over the processes it
# resumed from (`optimizers.drive(time_limit=)`), and is reported as
# time-boxed: its rows are not converged, and no claim is judged on them.
TIME_BOX_SECONDS = 150 * 60
# Short probes of every full-scale unit (`benchmarks.lavergne_scale_benchmark
# --part probe --all`): seconds per iteration and peak memory, from which the
# report estimates each unit's wall time.
PROBES_FILE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "benchmarks",
    "results",
    "lavergne-scale-probes-cpu-2core.json",
)
# Table 4's iterations (Nettalk 5-grm+): the estimates' typical run length.
PAPER_ITERATIONS = {"OWL-QN": 141.0, "SGD-L1": 28.5, "BCD": 8.7}
TASKS = ("pos", "pairs", "joint", "sparse")
OPTIMIZERS = ("OWL-QN", "SGD-L1", "BCD")
CRFSUITE_ROWS = {"lbfgs": "CRFsuite L-BFGS", "l2sgd": "CRFsuite l2sgd (L2 only)"}


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def _subset(sentences: list, count, seed: int) -> list:
    """A fixed random subset of `count` sentences in corpus order (all if None),
    chosen as `tagging.load_task` chooses its subsets."""
    if count is None or count >= len(sentences):
        return list(sentences)
    return [sentences[i] for i in np.sort(corpora.shuffled(len(sentences), seed)[:count])]


def joint_labels(sentence: corpora.Sentence) -> corpora.Sentence:
    """A conll2000 chunk sentence (tokens `(word, POS)`, IOB2 chunk labels) as
    tokens `(word,)` with joint labels `POS|chunk`."""
    return corpora.Sentence(
        tuple((row[0],) for row in sentence.tokens),
        tuple(f"{row[1]}|{label}" for row, label in zip(sentence.tokens, sentence.labels)),
    )


def _runs_as_chunks(tags) -> tuple[str, ...]:
    """Synthetic stand-in for chunk labels: `tag|B` at the start of each run of
    equal tags, `tag|I` inside it (a segmentation on top of the tags)."""
    return tuple(f"{tag}|{'I' if t and tags[t - 1] == tag else 'B'}" for t, tag in enumerate(tags))


def load_joint(num_train, num_test, seed: int = SEED, max_length: int | None = None) -> tagging.TaskData:
    """Joint POS+chunk labels of conll2000 (train.txt -> test.txt); without the
    corpus, planted POS sentences whose tags are split into runs (`_runs_as_chunks`).
    Only sentences of at most `max_length` tokens, if given (quick mode)."""
    try:
        train = [joint_labels(s) for s in corpora.conll2000("train.txt", task="chunk")]
        test = [joint_labels(s) for s in corpora.conll2000("test.txt", task="chunk")]
        source = "conll2000 WSJ joint POS|chunk labels (train.txt -> test.txt)"
    except FileNotFoundError:
        pairs_train, pairs_test, _ = synthetic.synthetic_corpus(seed, "pos", num_train or 3000, num_test or 1000)
        train, test = (
            [corpora.Sentence(tuple((w,) for w in words), _runs_as_chunks(tags)) for words, tags in pairs]
            for pairs in (pairs_train, pairs_test)
        )
        source = f"synthetic planted model (pos tags x runs, seed {seed}): no corpus under NLTK_DATA"
    if max_length is not None:
        train, test = ([s for s in split if len(s.labels) <= max_length] for split in (train, test))
    train, test = _subset(train, num_train, seed), _subset(test, num_test, seed + 1)
    labels = tuple(sorted({label for sentence in train for label in sentence.labels}))
    return tagging.TaskData("joint", train, test, labels, "accuracy", source)


def load(task: str, config: dict) -> tagging.TaskData:
    # `max_length` only in the quick configuration: the full units' settings stay as they were saved.
    max_length = config.get("max_length")
    if task == "joint":
        return load_joint(config["num_train"], config["num_test"], max_length=max_length)
    return tagging.load_task("pos", config["num_train"], config["num_test"], SEED, max_length=max_length)


class Extractor(NamedTuple):
    """Unigram observations from a preset or templates (`unigram`), label-pair
    observations from template text (`pairs`, may be empty)."""

    unigram: str
    pairs: str = ""

    def __call__(self, tokens) -> features.TokenFeatures:
        if self.unigram in presets.PRESETS:
            observed = presets.preset(self.unigram)(tokens)
        else:
            observed = _parsed(self.unigram)(tokens)
        if not self.pairs:
            return observed
        return observed._replace(pair=_parsed(self.pairs)(tokens).pair)


_parsed = functools.lru_cache(maxsize=None)(templates.parse_templates)


class Encoded(NamedTuple):
    """A featurised task.

    rows: the training set packed into rows of back-to-back sentences
    (`features.pack_rows`, the Tagger's packing): what the model's masks
    (`chain_model`) and BCD's plan (`training.bcd_data`) read;
    blocks: the same rows as equally shaped blocks (`features.pack_shards`,
    `CorpusArrays [S, ...]`): the objective of OWL-QN
    (`train_linear_chain(shards=)`), fine-tuning and SGD's epochs, summed one
    block at a time (`models.blockwise_corpus_loss`: the whole corpus at once
    needs several `[N, L, L]` arrays of 1.6 GB with pair features);
    stacked: the training set as one `FeatureBatch` `[N, T_max, ...]` (the
    minibatches of SGD are drawn from one leading axis), device arrays;
    test: the test set (unlabelled) packed into length buckets (`features.pack`),
    test_arrays: its `features.CorpusArrays` (what `models.packed.viterbi` reads);
    num_unigram, num_pair: K and K2 (observation tests seen in training).
    """

    rows: features.PackedCorpus
    blocks: features.CorpusArrays
    stacked: features.FeatureBatch
    test: features.PackedCorpus
    test_arrays: features.CorpusArrays
    num_unigram: int
    num_pair: int


def _device(batch: features.FeatureBatch) -> features.FeatureBatch:
    return jax.tree_util.tree_map(jnp.asarray, batch)  # absent fields (None) stay absent


def encode(data: tagging.TaskData, extractor: Extractor, num_buckets: int, num_blocks: int = 1) -> Encoded:
    """Featurise `data` (index built on the training set): the training set
    packed into rows, into `num_blocks` blocks and stacked, the test set in
    `num_buckets` length buckets."""
    index, train_ids, train_labels = features.index_corpus(extractor, data.train, data.labels)
    test = features.pack(features.encode(index, extractor, data.test), num_buckets=num_buckets)
    return Encoded(
        features.pack_rows(train_ids, train_labels),
        features.pack_shards(train_ids, train_labels, index.num_unigram, num_blocks),
        _device(features.pad_batch(train_ids, train_labels)),
        test,
        _device(features.corpus_arrays(test, index.num_unigram)),
        index.num_unigram,
        index.num_pair,
    )


def chain_model(encoded: Encoded, num_labels: int) -> LinearChainModel:
    """The zero model all three optimizers train: weights only on the
    (observation test, label) pairs and (pair test, y', y) triples seen in
    training (`training.initial_chain_model`, CRFsuite's parameter set;
    the pair weights in the sparse form when their label pairs are few)."""
    return training.initial_chain_model(encoded.rows, num_labels, encoded.num_unigram, encoded.num_pair)


def possible_features(encoded: Encoded, num_labels: int) -> int:
    """Every (test, label) pair, (pair test, y', y) triple, transition and
    start weight: the paper's feature count (over all combinations)."""
    L = num_labels
    return encoded.num_unigram * L + encoded.num_pair * L * L + L * L + L


# ---------------------------------------------------------------------------
# The chain model: objective, decoding, error
# ---------------------------------------------------------------------------


def token_errors(gold, predicted, joint: bool) -> dict:
    """Token error (%) of `predicted` label strings against `gold` (lists of
    label tuples); for joint labels also the error on their POS part alone
    (`NN|B-NP` -> `NN`), as the paper gives the phonemic part of its joint labels."""
    errors = {"error": 100.0 * (1.0 - metrics.token_accuracy(gold, predicted))}
    if joint:
        part = lambda sentences: [tuple(label.split("|")[0] for label in labels) for labels in sentences]
        errors["pos_error"] = 100.0 * (1.0 - metrics.token_accuracy(part(gold), part(predicted)))
    return errors


def chain_errors(model: LinearChainModel, encoded: Encoded, data: tagging.TaskData) -> dict:
    """`token_errors` of the Viterbi labels of the test set (`models.packed.viterbi`)."""
    buckets = [np.asarray(labels) for labels in models.packed.viterbi(model, encoded.test_arrays)]
    predicted = [tuple(data.labels[j] for j in row) for row in features.in_corpus_order(encoded.test, buckets)]
    return token_errors([s.labels for s in data.test], predicted, data.name == "joint")


# ---------------------------------------------------------------------------
# Checkpointed optimisation loops
# ---------------------------------------------------------------------------


class Fit(NamedTuple):
    """params: the trained model; steps: iterations (epochs, sweeps) done;
    trace: `[steps]` the objective after each; curve: after each chunk,
    `{seconds, step, objective, nonzero, error, ...}`; compile_seconds;
    train_seconds (optimisation only: no compilation, no evaluation; the
    checkpoints' saving included, and an interrupted run's earlier part);
    time_boxed: stopped by its time limit before its stop rule and cap."""

    params: object
    steps: int
    trace: list
    curve: list
    compile_seconds: float
    train_seconds: float
    time_boxed: bool


class CurveRecorder:
    """The driver's per-chunk `callback`: evaluates `evaluate(params_of(
    report.inner)) -> dict` (not timed) and appends it to the unit's curve,
    saved beside its checkpoints (`OUT/checkpoints/NAME.curve.json`) so that
    it resumes with them; each process's first point names its machine
    (`machine`: cpu, cores, memory), since a resumed run may run elsewhere.
    `finish(compile_seconds)` removes this process's compilation from its
    points' seconds and returns the curve."""

    def __init__(self, run: RunDirectory, name: str, evaluate: Callable, params_of: Callable):
        self.run, self.evaluate, self.params_of = run, evaluate, params_of
        self.file = os.path.join("checkpoints", f"{name}.curve.json")
        self.curve = run.read_json(self.file) or []
        self.fresh = []  # this process's points: their seconds include the compilation
        self.clock = time.perf_counter()

    def __call__(self, report: optimizers.Report) -> None:
        elapsed = time.perf_counter() - self.clock
        self.curve[:] = [point for point in self.curve if point["step"] < report.step]
        before = self.curve[-1]["seconds"] if self.curve else 0.0
        point = {"seconds": before + elapsed, "step": report.step, "objective": report.value}
        if not self.fresh:
            point["machine"] = {key: value for key, value in machine().items() if key != "load_average_at_start"}
        self.curve.append(point | self.evaluate(self.params_of(report.inner)))
        self.fresh.append(self.curve[-1])
        self.run.write_json(self.file, self.curve)
        self.clock = time.perf_counter()

    def finish(self, compile_seconds: float) -> list:
        for point in self.fresh:
            point["seconds"] -= compile_seconds
        return self.curve


def _checkpoints(run: RunDirectory, name: str) -> str:
    return os.path.join(run.root, "checkpoints", name)


def run_checkpointed(
    run: RunDirectory,
    name: str,
    make_step: Callable,
    inner,
    data,
    *,
    max_steps: int,
    stop,
    chunk: int,
    params_of: Callable,
    evaluate: Callable,
    settings,
    progress: bool,
    time_limit: float,
) -> Fit:
    """Run `make_step(data)` (a `run_loop` step function) through
    `optimizers.drive` in chunks of `chunk` steps, checkpointed under
    `OUT/checkpoints/name` after each chunk (a run started again resumes
    there), with a `CurveRecorder`, for at most `time_limit` seconds."""
    dtype = jax.tree_util.tree_leaves(eqx.filter(params_of(inner), eqx.is_inexact_array))[0].dtype
    recorder = CurveRecorder(run, name, evaluate, params_of)
    result = optimizers.drive(
        make_step,
        optimizers.init_loop(inner, max_steps, dtype),
        data,
        stop=stop,
        chunk_steps=chunk,
        checkpoint_dir=_checkpoints(run, name),
        checkpoint_every=chunk,
        settings=settings,
        progress=progress,
        callback=recorder,
        description=name,
        time_limit=time_limit,
    )
    curve = recorder.finish(result.compile_seconds)
    steps = int(result.num_steps)
    trace = np.asarray(result.trace)[:steps].tolist()
    seconds = curve[-1]["seconds"] if curve else 0.0
    boxed = _time_boxed(result, max_steps)
    return Fit(params_of(result.params), steps, trace, curve, result.compile_seconds, seconds, boxed)


def _time_boxed(result: optimizers.Result, max_steps: int) -> bool:
    """Whether a run without `until` stopped on its time limit: short of its
    cap, with no stop rule fired and no failure (status `ITERATION_LIMIT`)."""
    return optimizers.status_name(result.status) == "ITERATION_LIMIT" and int(result.num_steps) < max_steps


def owlqn_fit(
    run: RunDirectory, name: str, model: LinearChainModel, encoded: Encoded, config: dict, evaluate, progress, settings
) -> Fit:
    """OWL-QN from `model` (its masks and potential form) on the training
    set's blocks through the library's training path
    (`training.train_linear_chain`), checkpointed and evaluated after each
    chunk, time-boxed (`TIME_BOX_SECONDS`), as `run_checkpointed` is."""
    structure = model.structure()
    as_model = lambda weights: model.with_weights(weights, structure)
    recorder = CurveRecorder(run, name, evaluate, lambda inner: as_model(inner[0]))
    result = training.train_linear_chain(
        encoded.rows,
        model.num_labels,
        model.emission.shape[0],
        model.pair_emission.shape[0],
        l1=L1,
        l2=L2,
        memory_size=OWLQN_MEMORY,
        max_steps=config["owlqn_steps"],
        stop=_stop_rule(config, "stop"),
        model=model,
        shards=encoded.blocks,
        chunk_steps=config["chunk"],
        checkpoint_dir=_checkpoints(run, name),
        checkpoint_every=config["chunk"],
        settings=settings,
        progress=progress,
        callback=recorder,
        description=name,
        time_limit=TIME_BOX_SECONDS,
    )
    curve = recorder.finish(result.compile_seconds)
    steps = int(result.num_steps)
    trace = np.asarray(result.trace)[:steps].tolist()
    seconds = curve[-1]["seconds"] if curve else 0.0
    boxed = _time_boxed(result, config["owlqn_steps"])
    return Fit(result.params, steps, trace, curve, result.compile_seconds, seconds, boxed)


def _sgd_step_fn(data, *, loss: Callable, schedule, l1: float, l2: float, batch_size: int, max_rows):
    """Lazy SGD-L1 on `data = (stacked FeatureBatch, blocks of the packed
    rows)`: minibatches from the first, the epoch's objective on the second
    (`models.blockwise_corpus_loss`: the padded set at once would take
    several times the memory)."""
    stacked, blocks = data
    return training.lazy_epoch_step_fn(
        loss,
        optimizers.lazy_sgd_l1(schedule, l1, l2),
        stacked,
        batch_size=batch_size,
        max_rows=max_rows,
        penalty=optimizers.elastic_net_penalty(l1, l2),
        objective=lambda model: models.blockwise_corpus_loss(model, blocks),
    )


def _bcd_step_fn(data, *, l1: float, l2: float):
    """`bcd_sweep_fn` on `(model, ())`: the driver reads an optimizer state
    (none here) beside the parameters."""
    sweep = training.bcd_sweep_fn(data, l1, l2)

    def step(inner, index):
        model, value = sweep(inner[0], index)
        return (model, inner[1]), value

    return step


def _stop_rule(config: dict, key: str):
    tol, period = config[key]
    return optimizers.relative_improvement_below(tol, period)


def _sgd_stop_rule(config: dict):
    """SGD-L1's: `epoch_stop` on the objective's change either way (a rise is no convergence)."""
    return optimizers.relative_change_over(*config["epoch_stop"])


@functools.partial(jax.jit, static_argnames=("loss", "batch_size", "sample_size", "max_rows"))
def _calibrate(params, data, key, *, loss, batch_size, sample_size, max_rows):
    return training.calibrate_learning_rate(
        loss, params, data, L1, key=key, l2=L2, batch_size=batch_size, sample_size=sample_size, max_rows=max_rows
    )


def sgd_schedule(params, data, config: dict) -> tuple[Callable, dict]:
    """The SGD-L1 learning rate: calibrated by lazy epochs on a sample, one
    candidate rate after another (or `config["sgd_rate"]`, the quick mode's,
    to save the calibration's compilation), decayed by 0.9 per epoch.
    Returns the schedule and `{rate, seconds, calibrated}`."""
    total = optimizers.num_examples(data)
    batch_size = min(config["batch_size"], total)
    start = time.perf_counter()
    rate = config.get("sgd_rate")
    if rate is None:
        max_rows = training.max_rows_per_batch(data, batch_size)
        sample_size = min(200, total)
        rate = float(
            _calibrate(
                params,
                data,
                jax.random.PRNGKey(SEED),
                loss=models.batch_loss,
                batch_size=batch_size,
                sample_size=sample_size,
                max_rows=max_rows,
            )
        )
    calibration = {"rate": rate, "seconds": time.perf_counter() - start, "calibrated": "sgd_rate" not in config}
    # Tsuruoka et al.'s decay of 0.85 per epoch would stop learning after about
    # 7 epochs; 0.9 spreads the rate over more.
    schedule = optimizers.decaying_schedule(rate, steps_per_epoch=total // batch_size, decay_per_epoch=0.9)
    return schedule, calibration


def fit(
    run: RunDirectory, name: str, optimizer: str, model: LinearChainModel, train, config: dict, evaluate, progress
) -> tuple:
    """OWL-QN (`train`: the `Encoded` task), SGD-L1 (`train`: the
    stacked training set and `Encoded.blocks`) or BCD (`train`: `training.bcd_data`) from
    `model`; `evaluate(model) -> dict` after each chunk. Returns `(Fit,
    extra row fields)`."""
    settings = {key: value for key, value in config.items() if key != "chunk"} | {"optimizer": optimizer}
    if optimizer == "OWL-QN":
        return owlqn_fit(run, name, model, train, config, evaluate, progress, settings), {}
    common = dict(
        params_of=lambda inner: inner[0], evaluate=evaluate, progress=progress, chunk=1, time_limit=TIME_BOX_SECONDS
    )
    extra = {}
    if optimizer == "SGD-L1":
        stacked = train[0]
        schedule, extra["calibration"] = sgd_schedule(model, stacked, config)
        batch_size = min(config["batch_size"], optimizers.num_examples(stacked))
        max_rows = training.max_rows_per_batch(stacked, batch_size)  # a step touches at most these rows
        make = functools.partial(
            _sgd_step_fn,
            loss=models.batch_loss,
            schedule=schedule,
            l1=L1,
            l2=L2,
            batch_size=batch_size,
            max_rows=max_rows,
        )
        inner = (model, optimizers.lazy_sgd_l1(schedule, L1, L2).init(model), jax.random.PRNGKey(SEED))
        common.update(max_steps=config["sgd_epochs"], stop=_sgd_stop_rule(config))
        settings["rate"] = extra["calibration"]["rate"]
    else:
        make, inner = functools.partial(_bcd_step_fn, l1=L1, l2=L2), (model, ())
        common.update(max_steps=config["bcd_sweeps"], stop=_stop_rule(config, "epoch_stop"))
    return run_checkpointed(run, name, make, inner, train, settings=settings, **common), extra


def fine_tune(
    run: RunDirectory, name: str, model: LinearChainModel, blocks, config: dict, progress: bool, time_limit: float
) -> tuple[LinearChainModel, list, float, float, bool]:
    """The paper's final L-BFGS pass on the active features with a small L2,
    until the relative change falls below `finetune_tol` in one iteration (or
    `finetune_steps`), on the model's weights over the training blocks
    (`models.weights_objective`, the objective `train_linear_chain`
    minimises), checkpointed under `OUT/checkpoints/NAME-finetune` after
    each chunk (a run started again resumes there), for at most `time_limit`
    seconds. Returns `(model, trace, seconds, compile seconds, time-boxed)`,
    the seconds summed over resumed runs."""
    structure = model.structure()
    name = f"{name}-finetune"
    recorder = CurveRecorder(run, name, lambda _: {}, lambda inner: inner[0])
    result = optimizers.train_finetune(
        models.weights_objective(model, blockwise=True),
        model.weights(),
        models.TrainingData(blocks, structure),
        l2=FINETUNE_L2,
        max_steps=config["finetune_steps"],
        stop=optimizers.relative_change_below(config["finetune_tol"]),
        memory_size=OWLQN_MEMORY,
        chunk_steps=config["chunk"],
        checkpoint_dir=_checkpoints(run, name),
        checkpoint_every=config["chunk"],
        settings=_unit_settings(config),
        progress=progress,
        callback=recorder,
        description=name,
        time_limit=time_limit,
    )
    curve = recorder.finish(result.compile_seconds)
    trace = np.asarray(result.trace)[: int(result.num_steps)].tolist()
    seconds = curve[-1]["seconds"] if curve else 0.0
    boxed = _time_boxed(result, config["finetune_steps"])
    return model.with_weights(result.params, structure), trace, seconds, result.compile_seconds, boxed


# ---------------------------------------------------------------------------
# Units: one optimizer (+ fine-tuning), or one CRFsuite trainer, on one task
# ---------------------------------------------------------------------------


def _row(task, optimizer, *, trace, nonzero, errors, seconds, **extra) -> dict:
    return {
        "task": task,
        "optimizer": optimizer,
        "iterations": len(trace),
        "trace": trace,
        "nonzero": nonzero,
        **errors,
        "train_seconds": seconds,
        **extra,
    }


def _time_box(boxed: bool) -> dict:
    """A row's mark of a time-boxed run."""
    return {"time_boxed": True, "time_box_seconds": TIME_BOX_SECONDS} if boxed else {}


def _fit_row(task, optimizer, result: Fit, **extra) -> dict:
    """The row of an optimizer's run: its errors and active features after the last chunk."""
    last = result.curve[-1]
    return _row(
        task,
        optimizer,
        trace=result.trace,
        nonzero=last["nonzero"],
        errors={k: v for k, v in last.items() if k.endswith("error")},
        seconds=result.train_seconds,
        compile_seconds=result.compile_seconds,
        curve=result.curve,
        **_time_box(result.time_boxed),
        **extra,
    )


def _print_rows(rows) -> None:
    print(
        "  "
        + "; ".join(
            f"{r['optimizer']}: {r['error']:.2f}% error, {r['nonzero']} non-zeros, "
            f"{r['iterations']} it., {r['train_seconds']:.0f} s"
            for r in rows
        ),
        flush=True,
    )


def _finish_unit(run: RunDirectory, name: str, unit: dict | None) -> dict | None:
    """A unit as the report reads it: its checkpoints removed once it is
    saved, its rows marked when they come from an earlier configuration."""
    for part in (name, f"{name}-finetune"):
        shutil.rmtree(_checkpoints(run, part), ignore_errors=True)
        curve = os.path.join(run.root, "checkpoints", f"{part}.curve.json")
        if os.path.exists(curve):
            os.remove(curve)
    if unit is None:
        return None
    marks = {"stale": True, "unit": name} if unit.get("stale") else {}
    unit["rows"] = [row | marks for row in unit["rows"]]
    return unit


def _evaluator(encoded: Encoded, data) -> Callable:
    """`model -> {error(s), nonzero}` on the test set."""
    return lambda model: {**chain_errors(model, encoded, data), "nonzero": model.num_nonzero()}


def chain_unit(run: RunDirectory, task, optimizer, data, encoded: Encoded, model, config, progress):
    """OWL-QN, SGD-L1 or BCD (on `training.bcd_data`, the plan's seconds
    in its row) from `model` (`chain_model`), then fine-tuning, on a task."""
    name = f"{task}-{optimizer.lower()}"

    def compute():
        measured_on = machine()
        start = time.perf_counter()
        train = {
            "OWL-QN": lambda: encoded,
            "SGD-L1": lambda: (encoded.stacked, encoded.blocks),
            "BCD": lambda: training.bcd_data(encoded.rows, model, **config.get("bcd_plan", {})),
        }[optimizer]()
        plan_seconds = time.perf_counter() - start
        result, extra = fit(run, name, optimizer, model, train, config, _evaluator(encoded, data), progress)
        if optimizer == "BCD":
            extra["plan_seconds"] = plan_seconds
        rows = [_fit_row(task, optimizer, result, **extra)]
        # Fine-tuning gets what the time box leaves; a time-boxed optimizer leaves nothing.
        if config["finetune_steps"] and not result.time_boxed:
            tuned, trace, seconds, compile_seconds, boxed = fine_tune(
                run, name, result.params, encoded.blocks, config, progress, TIME_BOX_SECONDS - result.train_seconds
            )
            rows.append(
                _row(
                    task,
                    optimizer + " + fine-tuning",
                    trace=trace,
                    nonzero=tuned.num_nonzero(),
                    errors=chain_errors(tuned, encoded, data),
                    seconds=seconds,
                    compile_seconds=compile_seconds,
                    **_time_box(boxed),
                )
            )
        _print_rows(rows)
        return {"rows": [row | {"machine": measured_on} for row in rows]}

    return _finish_unit(run, name, run.unit(name, compute, _unit_settings(config)))


def _unit_settings(config: dict) -> dict:
    return {key: value for key, value in config.items() if key != "chunk"}


def crfsuite_unit(run: RunDirectory, task: str, algorithm: str, data, config: dict) -> dict | None:
    """python-crfsuite on the task's observation strings: `lbfgs` on the
    same objective (c1, c2 converted) and stop rule as OWL-QN, or `l2sgd`
    (L2 only, CRFsuite's own learning-rate calibration) with the epochs' rule.
    With `crfsuite_probe_iterations` set, the run is capped at the
    iterations the time box leaves after a probe of that many (CRFsuite can
    neither stop on time nor save a model mid-run); a run that reaches that
    cap before its stop rule is reported time-boxed."""
    name = f"{task}-crfsuite-{algorithm}"
    if config["pairs"]:
        raise ValueError("CRFsuite has no label-pair-observation features")

    def compute():
        measured_on = machine()
        start = time.perf_counter()
        extractor = Extractor(config["features"])
        if algorithm == "lbfgs":
            assert optimizers.crfsuite_elastic_net(CRFSUITE_C1, CRFSUITE_C2) == {"l1": L1, "l2": L2}
            tol, period = config["stop"]
            # epsilon (the gradient-norm test) off: the same rule as OWL-QN's decides.
            params = {"c1": CRFSUITE_C1, "c2": CRFSUITE_C2, "epsilon": 1e-30, "num_memories": OWLQN_MEMORY}
        else:
            tol, period = config["epoch_stop"]
            params = {"c2": L2SGD_C2}
        params |= {"max_iterations": config["crfsuite_iterations"], "period": period, "delta": tol}
        extra = {}
        with tempfile.TemporaryDirectory() as directory:
            train = functools.partial(
                crfsuite_comparison.train_crfsuite,
                data.train,
                extractor,
                path=os.path.join(directory, "model.crfsuite"),
                algorithm=algorithm,
            )
            if config.get("crfsuite_probe_iterations"):
                probe = _crfsuite_probe(train, params, config["crfsuite_probe_iterations"])
                cap = _crfsuite_time_box_cap(probe, time.perf_counter() - start)
                extra["crfsuite_probe"] = probe | {"time_box_cap": cap}
                params["max_iterations"] = min(params["max_iterations"], cap)
            tagger, seconds, nonzero, iterations = train(params=params)
            predicted = [tuple(tagger.tag(extractor(s.tokens).unigram)) for s in data.test]
        boxed = (
            "crfsuite_probe" in extra and len(iterations) == params["max_iterations"] < config["crfsuite_iterations"]
        )
        errors = token_errors([s.labels for s in data.test], predicted, data.name == "joint")
        trace = [float(iteration["loss"]) for iteration in iterations]
        # CRFsuite's own seconds per iteration (its log); `seconds` adds extraction and data loading.
        iteration_seconds = sum(float(iteration.get("time", 0.0)) for iteration in iterations)
        row = _row(task, CRFSUITE_ROWS[algorithm], trace=trace, nonzero=nonzero, errors=errors, seconds=seconds)
        row |= {"crfsuite_params": params, "iteration_seconds": iteration_seconds, "machine": measured_on}
        row |= extra | _time_box(boxed)
        _print_rows([row])
        return {"rows": [row]}

    return _finish_unit(run, name, run.unit(name, compute, _unit_settings(config) | {"algorithm": algorithm}))


def _crfsuite_probe(train: Callable, params: dict, iterations: int) -> dict:
    """`iterations` of CRFsuite (`train(params=...)`): its seconds, and the
    seconds an iteration takes from its log, averaged after the first (whose
    line search tries more steps, and whose epoch follows l2sgd's calibration)."""
    start = time.perf_counter()
    *_, log = train(params=params | {"max_iterations": iterations})
    times = [float(iteration.get("time", 0.0)) for iteration in log]
    later = times[1:] or times
    return {
        "iterations": len(log),
        "seconds": time.perf_counter() - start,
        "iteration_seconds": times,
        "seconds_per_iteration": sum(later) / max(len(later), 1),
    }


def _crfsuite_time_box_cap(probe: dict, spent: float) -> int:
    """The iterations that fit in what the time box leaves after `spent`
    seconds (the probe and the data), at the probe's seconds per iteration
    and with the probe's fixed cost (extraction, data loading, l2sgd's
    calibration) counted again; at least one."""
    fixed = max(probe["seconds"] - sum(probe["iteration_seconds"]), 0.0)
    left = TIME_BOX_SECONDS - spent - fixed
    return max(1, int(left // max(probe["seconds_per_iteration"], 1e-9)))


def _bcd_sweep(model, data, *, l1, l2):
    return training.bcd_sweep_fn(data, l1, l2)(model, jnp.int32(0))


def _timed_sweep(encoded: Encoded, num_labels: int, config: dict, *, run_it: bool = True) -> dict:
    """One BCD sweep from zero weights (the plan's sizes: `config["bcd_plan"]`,
    else the defaults): the plan's and the sweep's seconds (`run_it=False`:
    compiled only), the plan's bytes and the sweep's temporaries (XLA's
    memory analysis of the compiled sweep)."""
    model = chain_model(encoded, num_labels)
    start = time.perf_counter()
    plan = training.bcd_data(encoded.rows, model, **config.get("bcd_plan", {}))
    plan_seconds = time.perf_counter() - start
    compiled = jax.jit(functools.partial(_bcd_sweep, l1=L1, l2=L2)).lower(model, plan).compile()
    memory = compiled.memory_analysis()
    out = {
        "labels": num_labels,
        "rounds": int(plan.num_rounds),
        "plan_seconds": plan_seconds,
        "plan_bytes": int(sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(plan))),
        "temporary_bytes": int(getattr(memory, "temp_size_in_bytes", 0) or 0),
        "model_bytes": 2 * int(sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(model))),  # in, out
        "sweep_seconds": None,
    }
    if run_it:
        start = time.perf_counter()
        jax.block_until_ready(compiled(model, plan))
        out["sweep_seconds"] = time.perf_counter() - start
    return out


def pos_part(data: tagging.TaskData) -> tagging.TaskData:
    """A joint-label task with its labels cut to their POS part (`NN|B-NP` -> `NN`)."""
    cut = lambda sentences: [s._replace(labels=tuple(label.split("|")[0] for label in s.labels)) for s in sentences]
    train = cut(data.train)
    labels = tuple(sorted({label for sentence in train for label in sentence.labels}))
    return data._replace(train=train, test=cut(data.test), labels=labels)


def bcd_probe(run: RunDirectory, task: str, data, extractor: Extractor, config: dict) -> dict | None:
    """Whether BCD on a joint-label task fits, measured without running it.

    Memory: the plan and the compiled sweep's temporaries on the whole
    training set at the task's label count (compiled, not run). Time: a
    sweep's cost grows with the label count as `L^2` per chain cell and with
    the corpus less than in proportion (bigger rounds), so the whole set's
    sweep is estimated as one measured sweep of the same sentences with
    their POS labels, times the ratio of a sweep at the task's labels to one
    at the POS labels on `bcd_probe_sentences` sentences (both measured).
    Runs when both fit `BCD_BUDGET`."""
    name = f"{task}-bcd-probe"

    def compute():
        encoded = encode(data, extractor, 1)
        whole = _timed_sweep(encoded, len(data.labels), config, run_it=False)
        pos = pos_part(data)
        whole_pos = _timed_sweep(encode(pos, extractor, 1), len(pos.labels), config)
        sentences = _subset(list(range(len(data.train))), config["bcd_probe_sentences"], SEED)
        subset = lambda d: d._replace(train=[d.train[i] for i in sentences])
        part = _timed_sweep(encode(subset(data), extractor, 1), len(data.labels), config)
        part_pos = _timed_sweep(encode(subset(pos), extractor, 1), len(pos.labels), config)
        ratio = part["sweep_seconds"] / part_pos["sweep_seconds"]
        out = {
            "whole": whole,
            "whole_pos_labels": whole_pos,
            "subset": part,
            "subset_pos_labels": part_pos,
            "sentences": len(sentences),
            "ratio": ratio,
            "full_sweep_seconds": whole_pos["sweep_seconds"] * ratio,
            "full_bytes": whole["plan_bytes"] + whole["temporary_bytes"] + whole["model_bytes"],
        }
        out["fits"] = out["full_bytes"] <= BCD_BUDGET["bytes"] and out["full_sweep_seconds"] <= BCD_BUDGET["seconds"]
        print(
            f"  BCD probe: {out['full_bytes'] / 2**30:.1f} GiB at {len(data.labels)} labels; sweep ~"
            f"{_minutes(out['full_sweep_seconds'])} ({_minutes(whole_pos['sweep_seconds'])} at "
            f"{len(pos.labels)} labels x {ratio:.1f}): {'runs' if out['fits'] else 'not run'}",
            flush=True,
        )
        return out

    return run.unit(name, compute, _unit_settings(config) | {"budget": BCD_BUDGET})


def forward_backward_unit(run: RunDirectory, form: str, data, encoded: Encoded, config: dict, progress) -> dict | None:
    """Table 2: OWL-QN on the model of the pair features' observed (test,
    y', y) triples (`chain_model`) forced onto the sparse (`form="sparse"`)
    or the dense forward-backward, through `train_linear_chain(model=)`."""
    name = f"sparse-{form}-fb"

    def compute():
        measured_on = machine()
        observed = chain_model(encoded, len(data.labels))
        mask = np.asarray(observed.pair_mask)
        model = observed.with_pair_mask(mask, max_sparse_fraction=1.0 if form == "sparse" else 0.0)
        settings = _unit_settings(config) | {"form": form}
        result = owlqn_fit(run, name, model, encoded, config, _evaluator(encoded, data), progress, settings)
        pair_weights = np.asarray(result.params.pair_emission)[mask]
        row = _fit_row(
            "sparse",
            "OWL-QN",
            result,
            form=form,
            pair_weights=int(mask.sum()),
            pair_weights_zero_fraction=float(np.mean(pair_weights == 0)) if pair_weights.size else None,
            support_fraction=_support_fraction(model, mask, encoded),
            machine=measured_on,
        )
        _print_rows([row])
        return {"rows": [row]}

    return _finish_unit(run, name, run.unit(name, compute, _unit_settings(config) | {"form": form}))


def _support_fraction(model: LinearChainModel, mask: np.ndarray, encoded: Encoded) -> float | None:
    """The label pairs the sparse recursion visits per position, as a
    fraction of the `L^2`: the mean over training tokens of their pair
    test's observed pairs (a support per position), or the one support's
    size; None for the dense form."""
    L2 = mask.shape[1] * mask.shape[2]
    if model.pair_slots is not None:
        ids = np.asarray(encoded.stacked.pair_ids)[..., 0]
        counts = mask.reshape(mask.shape[0], L2).sum(1)
        return float(counts[ids[ids >= 0]].mean()) / L2
    if model.pair_support is not None:
        return len(model.pair_support[0]) / L2
    return None


def bcd_cost(encoded: Encoded, num_labels: int) -> dict:
    """The size of one sweep of `training.bcd` on a chain task, counted
    from the training set.

    A sweep updates every block once (`training.bcd_schedule`: the
    transitions, each emission row and each label-pair row that occurs). A
    block's statistics need forward-backward over the sentences where it is
    active, truncated to the forward scores up to its last position `l` and
    the backward scores down to its first `f`: `T + l - f + 1` chain cells
    of about `L^2` multiply-adds per (block, sentence) visit, the paper's
    count (the sweep reuses stored scores between visits of a sentence and
    runs fewer). One gradient evaluation takes `2 T` cells per sentence."""
    corpus = encoded.rows
    sentences = bcd_schedule.corpus_sentences(corpus)
    visits = bcd_schedule.block_visits(
        bcd_schedule.corpus_blocks(corpus, sentences, encoded.num_unigram, encoded.num_pair), sentences
    )
    lengths = np.diff(sentences.offsets)
    cells = int(np.sum(lengths[visits.sentence] + visits.last - visits.first + 1))
    return {
        "blocks": int(visits.block.max(initial=-1)) + 1,
        "visits": int(visits.block.size),
        "visits_per_sentence": visits.block.size / lengths.size,
        "truncated_cells": cells,
        "gradient_equivalents": cells / (2 * int(lengths.sum())),
        "multiply_adds_per_sweep": float(cells) * num_labels**2,
    }


# ---------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------


def _describe(data, encoded: Encoded, model: LinearChainModel) -> dict:
    """The task's sizes; `num_parameters` the weights of the model the
    optimizers train (`chain_model`), `possible_features` every combination
    (the paper's count)."""
    return {
        "source": data.source,
        "synthetic": data.source.startswith("synthetic"),
        "num_train": len(data.train),
        "num_test": len(data.test),
        "num_labels": len(data.labels),
        "train_tokens": int(sum(len(s.labels) for s in data.train)),
        "num_unigram_tests": encoded.num_unigram,
        "num_pair_tests": encoded.num_pair,
        "num_parameters": model.num_parameters(),
        "possible_features": possible_features(encoded, len(data.labels)),
    }


def _chain_task(run: RunDirectory, task: str, config: dict, progress: bool) -> dict:
    """The three optimizers (BCD after a probe where `bcd_probe_sentences`
    is set) and the CRFsuite trainers on one task."""
    data = load(task, config)
    extractor = Extractor(config["features"], config["pairs"])
    encoded = encode(data, extractor, config["num_buckets"], config["blocks"])
    model = chain_model(encoded, len(data.labels))
    info = _describe(data, encoded, model)
    print(
        f"[{task}] {data.source}: {info['num_train']} train / {info['num_test']} test sentences, "
        f"{info['num_labels']} labels, {encoded.num_unigram} observation tests, {encoded.num_pair} pair tests, "
        f"{info['num_parameters']} weights in the model of {info['possible_features']} possible",
        flush=True,
    )
    probe = bcd_probe(run, task, data, extractor, config) if config.get("bcd_probe_sentences") else None
    optimizer_names = ("OWL-QN", "SGD-L1") + (("BCD",) if probe is None or probe["fits"] else ())
    units = [chain_unit(run, task, name, data, encoded, model, config, progress) for name in optimizer_names]
    units += [crfsuite_unit(run, task, algorithm, data, config) for algorithm in config["crfsuite"]]
    units = [unit for unit in units if unit is not None]
    return {
        **info,
        "rows": [row for unit in units for row in unit["rows"]],
        "bcd_probe": probe,
        "bcd_cost": bcd_cost(encoded, len(data.labels)),
    }


def _sparse_task(run: RunDirectory, config: dict, progress: bool) -> dict:
    """Table 2: whole OWL-QN runs with the sparse and the dense forward-backward."""
    data = load("sparse", config)
    encoded = encode(data, Extractor(config["features"], config["pairs"]), config["num_buckets"], config["blocks"])
    print(f"[sparse] {data.source}: {len(data.train)} train / {len(data.test)} test sentences", flush=True)
    units = [forward_backward_unit(run, form, data, encoded, config, progress) for form in ("sparse", "dense")]
    units = [unit for unit in units if unit is not None]
    return {
        **_describe(data, encoded, chain_model(encoded, len(data.labels))),
        "rows": [row for unit in units for row in unit["rows"]],
    }


# ---------------------------------------------------------------------------
# Convergence and conclusions
# ---------------------------------------------------------------------------


def row_convergence(row: dict, config: dict) -> dict:
    """Whether a row's objective trace met its stop rule (`harness.
    trace_convergence`): `stop` for OWL-QN and CRFsuite's L-BFGS,
    `epoch_stop` for SGD-L1, BCD and l2sgd, a relative change below
    `finetune_tol` in one iteration for fine-tuning. A row without a trace
    (an earlier configuration's) is not converged."""
    name = row["optimizer"]
    if name.endswith("+ fine-tuning"):
        rule, cap = optimizers.relative_change_below(config["finetune_tol"]), config["finetune_steps"]
        criterion = f"relative change < {config['finetune_tol']:g}"
    else:
        key = "stop" if name in ("OWL-QN", CRFSUITE_ROWS["lbfgs"]) else "epoch_stop"
        tol, period = config[key]
        if name == "SGD-L1":
            rule, criterion = _sgd_stop_rule(config), f"relative change (either way) over {period} it. < {tol:g}"
        else:
            rule, criterion = (
                optimizers.relative_improvement_below(tol, period),
                f"relative change over {period} it. < {tol:g}",
            )
        cap = {"OWL-QN": "owlqn_steps", "SGD-L1": "sgd_epochs", "BCD": "bcd_sweeps"}.get(name, "crfsuite_iterations")
        cap = config[cap]
    trace = row.get("trace")
    if trace is None:
        return {"met": False, "criterion": criterion, "step": None, "cap": row["iterations"]}
    boxed = f"time-boxed at {_minutes(row['time_box_seconds'])}" if row.get("time_boxed") else None
    return trace_convergence(trace, rule, cap, criterion, failure=boxed)


def _judged(rows) -> dict:
    """`{converged, current, time_boxed}`: all rows converged, none from an
    earlier configuration, any stopped by the time box."""
    rows = list(rows)
    return {
        "converged": all(row["convergence"]["met"] for row in rows),
        "current": not any(row.get("stale") for row in rows),
        "time_boxed": any(row.get("time_boxed") for row in rows),
    }


def _check_conclusions(results: dict) -> dict:
    """The paper's claims as measured here, each with the rows it rests on:
    few active features (under 10% of the parameters) and similar error
    (SGD-L1 and BCD within `SIMILAR_POINTS` of OWL-QN) per task; the best
    error at most issue 20's `TARGET_ERROR` on POS; label-pair features
    lower the error (each optimizer, `pairs` against `pos`); the sparse
    forward-backward trains faster (Table 2)."""
    out = {}
    for task in ("pos", "pairs", "joint"):
        if task not in results:
            continue
        rows = {row["optimizer"]: row for row in results[task]["rows"]}
        ours = [rows[o] for o in OPTIMIZERS if o in rows]
        if "OWL-QN" not in rows or len(ours) < 2:
            out[task] = {"checked": False}
            continue
        gaps = {o: rows[o]["error"] - rows["OWL-QN"]["error"] for o in OPTIMIZERS[1:] if o in rows}
        active = max(row["nonzero"] for row in ours) / results[task]["num_parameters"]
        out[task] = {
            "checked": True,
            **_judged(ours),
            "gaps": gaps,
            "similar_error": all(abs(gap) <= SIMILAR_POINTS for gap in gaps.values()),
            "largest_active_fraction": active,
            "few_active": active < 0.1,
            "best_error": min(row["error"] for row in results[task]["rows"] if not row["optimizer"].startswith("CRF")),
        }
    if "pos" in results and "pairs" in results:
        without = {row["optimizer"]: row for row in results["pos"]["rows"]}
        with_pairs = {row["optimizer"]: row for row in results["pairs"]["rows"]}
        names = [o for o in OPTIMIZERS if o in without and o in with_pairs]
        used = [without[o] for o in names] + [with_pairs[o] for o in names]
        gains = {o: without[o]["error"] - with_pairs[o]["error"] for o in names}
        out["pair_features"] = {
            "checked": bool(names),
            "gains": gains,
            "holds": all(gain > 0 for gain in gains.values()),
            **_judged(used),
        }
    if "sparse" in results:
        forms = {row["form"]: row for row in results["sparse"]["rows"]}
        if {"sparse", "dense"} <= set(forms):
            out["sparse_fb"] = {
                "checked": True,
                "speedup": forms["dense"]["train_seconds"] / max(forms["sparse"]["train_seconds"], 1e-9),
                "holds": forms["sparse"]["train_seconds"] < forms["dense"]["train_seconds"],
                **_judged(forms.values()),
            }
        else:
            out["sparse_fb"] = {"checked": False}
    return out


SIMILAR_POINTS = 0.1  # issue 20: SGD-L1 and BCD within 0.1 points of OWL-QN's error
TARGET_ERROR = 2.0  # issue 20: error at most 2.0% for the best POS model


def _conclusion_lines(checks: dict, quick: bool) -> list[str]:
    """Each claim's verdict (`harness.verdict`: judged only from converged
    rows of the current configuration) with the paper's numbers."""
    paper = {
        "pos": "paper (POS): OWL-QN 2.91% error; incremental BCD 2.78%, 400k of 4 billion features active",
        "pairs": "paper (POS base set with pair features, Table 1): 2.91%, 436.7M features",
        "joint": "paper (Nettalk+prosody, Table 5): SGD-L1 13.91%, BCD 13.85%",
    }
    lines = []
    judge = lambda check, holds: verdict(
        holds, quick=quick, converged=check["converged"], current=check["current"], time_boxed=check["time_boxed"]
    )
    for task in ("pos", "pairs", "joint"):
        check = checks.get(task)
        if not check:
            continue
        if not check["checked"]:
            lines.append(f"- {task}: not checked (rows missing).")
            continue
        gaps = ", ".join(f"{name} {gap:+.2f}" for name, gap in check["gaps"].items())
        lines.append(
            f"- {task}: error against OWL-QN's: {gaps} points (similar if within {SIMILAR_POINTS}): similar "
            f"error: {judge(check, check['similar_error'])}; at most {100 * check['largest_active_fraction']:.2f}% "
            f"of the parameters active (few if < 10%): few active features: {judge(check, check['few_active'])}"
            + (
                f"; best error {check['best_error']:.2f}% (issue 20's target: at most {TARGET_ERROR}%): "
                f"{judge(check, check['best_error'] <= TARGET_ERROR)}"
                if task in ("pos", "pairs")
                else ""
            )
            + f" ({paper[task]})."
        )
    check = checks.get("pair_features")
    if check:
        gains = ", ".join(f"{name} {-gain:+.2f}" for name, gain in check["gains"].items())
        lines.append(
            "- pair features: not checked (rows missing)."
            if not check["checked"]
            else f"- pair features: they change the error by {gains} points: they help: "
            f"{judge(check, check['holds'])} (paper, Table 1: -0.56 points on POS, 3.47% -> 2.91%; -3.06 on "
            f"Nettalk 5-grm)."
        )
    check = checks.get("sparse_fb")
    if check:
        lines.append(
            "- sparse forward-backward: not checked (rows missing)."
            if not check["checked"]
            else f"- sparse forward-backward: the dense run takes {check['speedup']:.2f}x the sparse run's time: "
            f"it speeds up training: {judge(check, check['holds'])} (paper, Table 2: 1.2x-2.8x on Nettalk)."
        )
    return lines


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _minutes(seconds) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _objective(row: dict):
    """The penalised objective an L1 optimizer minimised, at its end (fine-
    tuning and CRFsuite minimise others, CRFsuite's with its scaling)."""
    return f"{row['trace'][-1]:.1f}" if row.get("trace") and row.get("curve") else None


def _bcd_probe_cell(probe: dict) -> str:
    whole = probe["whole"]
    return (
        f"not run: at {whole['labels']} labels the plan, model and one sweep need "
        f"{probe['full_bytes'] / 2**30:.1f} GiB (budget {BCD_BUDGET['bytes'] / 2**30:.0f} GiB), a sweep ~"
        f"{_minutes(probe['full_sweep_seconds'])} (budget {_minutes(BCD_BUDGET['seconds'])}; "
        f"{_minutes(probe['whole_pos_labels']['sweep_seconds'])} "
        f"measured at the POS labels x {probe['ratio']:.1f}, the ratio measured on {probe['sentences']} "
        f"sentences)"
    )


def _table4(task: str, result: dict) -> str:
    paper, paper_name = {
        "pos": (PAPER_POS, "paper (Penn Treebank POS)"),
        "pairs": (PAPER_POS, "paper (Penn Treebank POS)"),
        "joint": (PAPER_TABLE5, "paper (Nettalk+prosody, Table 5)"),
    }[task]
    joint = task == "joint"
    header = ["optimizer", "iterations", "active features", "error %"] + (["POS-part error %"] if joint else [])
    header += ["converged", "time", "penalised objective", paper_name, "paper (Nettalk, Table 4)"]
    found = {row["optimizer"]: row for row in result["rows"]}
    names = [name for o in OPTIMIZERS for name in (o, o + " + fine-tuning")]
    names += [name for name in CRFSUITE_ROWS.values() if name in found]
    rows = []
    for name in names:
        row = found.get(name)
        papers = [paper.get(name, ""), PAPER_TABLE4.get(name, "")]
        if row is None:
            probe = result.get("bcd_probe")
            reason = "not run yet"
            if name.endswith(" + fine-tuning") and found.get(name.removesuffix(" + fine-tuning"), {}).get("time_boxed"):
                reason = "not run (its optimizer was time-boxed)"
            elif name.startswith("BCD") and probe is not None and not probe["fits"]:
                reason = _bcd_probe_cell(probe) if name == "BCD" else "not run"
            rows.append([name, reason, None, None] + ([None] if joint else []) + [None, None, None] + papers)
            continue
        rows.append(
            [name + (" (earlier configuration)" if row.get("stale") else ""), row["iterations"], row["nonzero"]]
            + [row["error"]]
            + ([row.get("pos_error")] if joint else [])
            + [converged_cell(row["convergence"]), _minutes(row["train_seconds"]), _objective(row)]
            + papers
        )
    return markdown_table(header, rows)


def _bcd_note(result: dict) -> str:
    cost, probe = result.get("bcd_cost"), result.get("bcd_probe")
    if not cost:
        return ""
    measured = ""
    if probe is not None:
        measured = (
            f" Probe (`bcd_probe`, before the run): {probe['full_bytes'] / 2**30:.1f} GiB for the plan, the model "
            f"and one sweep at {probe['whole']['labels']} labels; a sweep ~{_minutes(probe['full_sweep_seconds'])} "
            f"({_minutes(probe['whole_pos_labels']['sweep_seconds'])} measured on the same sentences at their "
            f"{probe['whole_pos_labels']['labels']} POS labels, x {probe['ratio']:.1f}, the ratio of one sweep at "
            f"each label set on {probe['sentences']} sentences)."
        )
    return (
        f"BCD: a sweep updates each of the {cost['blocks']} blocks once (an observation test's L unigram "
        f"weights, its L^2 label-pair weights, or the transitions), in rounds of blocks active in disjoint "
        f"sentences; {cost['visits']} (block, sentence) visits, {cost['visits_per_sentence']:.0f} per sentence "
        f"(the paper: 380 on the Penn Treebank), {cost['truncated_cells']:.2e} truncated chain cells (the "
        f"forward-backward work of {cost['gradient_equivalents']:.0f} gradient evaluations; the sweep reuses "
        f"stored scores between visits of a sentence and runs fewer). Its time excludes the plan "
        f"(`training.bcd_data`, in the JSON).{measured}\n"
    )


def _features_cell(result: dict) -> str:
    """The possible features (every combination, the paper's count) and the
    weights of the model the optimizers train (those seen in training)."""
    possible, model = result.get("possible_features"), result.get("num_parameters")
    if possible is None or model is None:  # a unit written before the counts were kept
        return "features not counted"
    return f"{possible} possible features (all combinations, the paper's count), {model} in the model"


def _table1(results: dict) -> str:
    header = ["optimizer", "error % with", "error % without", "active with", "active without"]
    header += ["features with (possible / in the model)", "features without (possible / in the model)"]
    header += ["converged (both)"]
    with_pairs = {row["optimizer"]: row for row in results.get("pairs", {}).get("rows", [])}
    without = {row["optimizer"]: row for row in results.get("pos", {}).get("rows", [])}
    rows = []
    for name in OPTIMIZERS:
        a, b = with_pairs.get(name), without.get(name)
        get = lambda row, key: None if row is None else row[key]
        both = a is not None and b is not None
        rows.append(
            [name, get(a, "error"), get(b, "error"), get(a, "nonzero"), get(b, "nonzero")]
            + [_feature_counts(results.get("pairs")), _feature_counts(results.get("pos"))]
            + ["yes" if both and a["convergence"]["met"] and b["convergence"]["met"] else ("no" if both else "-")]
        )
    paper = markdown_table(["paper: setting", "with", "without"], [list(r) for r in PAPER_TABLE1])
    return markdown_table(header, rows) + "\nThe paper's Table 1 (OWL-QN; error and feature count):\n\n" + paper


def _feature_counts(result: dict | None) -> str:
    if result is None or result.get("possible_features") is None:
        return "-"
    return f"{result['possible_features']} / {result['num_parameters']}"


def _table2(result: dict) -> str:
    header = ["forward-backward", "iterations", "converged", "time", "time per iteration", "error %"]
    header += ["zero pair weights", "label pairs visited per position", "penalised objective"]
    rows = []
    for row in sorted(result["rows"], key=lambda row: row["form"] != "sparse"):
        zeros, support = row.get("pair_weights_zero_fraction"), row.get("support_fraction")
        rows.append(
            [
                row["form"] + (" (earlier configuration)" if row.get("stale") else ""),
                row["iterations"],
                converged_cell(row["convergence"]),
                _minutes(row["train_seconds"]),
                f"{row['train_seconds'] / max(row['iterations'], 1):.2f} s",
                row["error"],
                "-" if zeros is None else f"{100 * zeros:.1f}%",
                "-" if support is None else f"{100 * support:.1f}%",
                _objective(row),
            ]
        )
    paper = markdown_table(
        ["paper (Nettalk)", "L2", "L1 sparse", "L1 dense", "% zero"], [list(r) for r in PAPER_TABLE2]
    )
    return markdown_table(header, rows) + "\nThe paper's Table 2 (whole training runs):\n\n" + paper


def _plot_curves(run: RunDirectory, results: dict) -> str | None:
    tasks = [task for task in ("pos", "pairs", "joint") if task in results and results[task]["rows"]]
    if not tasks:
        return None
    figure, axes = plt.subplots(2, len(tasks), figsize=(4.5 * len(tasks), 6.5), squeeze=False)
    for column, task in enumerate(tasks):
        for row in results[task]["rows"]:
            curve = row.get("curve")
            if not curve:
                continue
            seconds = [max(point["seconds"], 1e-3) for point in curve]
            axes[0][column].plot(seconds, [point["error"] for point in curve], marker=".", label=row["optimizer"])
            axes[1][column].plot(seconds, [point["nonzero"] for point in curve], marker=".", label=row["optimizer"])
        axes[0][column].set_title(f"{task} ({'synthetic' if results[task]['synthetic'] else 'conll2000'})")
        axes[0][column].set_ylabel("test error (%)")
        axes[1][column].set_ylabel("active features")
        axes[1][column].set_xlabel("training seconds (log scale)")
        axes[1][column].set_yscale("log")
        for axis in axes[:, column]:
            axis.set_xscale("log")  # BCD takes minutes where SGD takes seconds
            axis.xaxis.set_minor_formatter(NullFormatter())  # overlapping 2x10^1, 3x10^1 labels
        axes[0][column].legend(fontsize=7)
    return run.save_figure("error_and_sparsity_vs_time.png", figure)


def _read_probes() -> dict | None:
    if not os.path.exists(PROBES_FILE):
        return None
    with open(PROBES_FILE) as stream:
        return json.load(stream)


def probe_estimates(probes: dict, configs: dict) -> list[str]:
    """The probes' table: per unit its seconds per iteration, time to the
    first iteration, peak memory and the wall time estimated at the paper's
    iteration count and at the cap (setup, compilation, calibration or plan
    included, evaluation and fine-tuning not)."""
    caps = {"OWL-QN": "owlqn_steps", "SGD-L1": "sgd_epochs", "BCD": "bcd_sweeps"}
    header = ["task", "unit", "labels", "possible features", "in the model", "per iteration", "to the first"]
    header += ["peak memory", "estimate at the paper's iterations", "estimate at the cap"]
    rows = []
    for probe in probes["probes"]:
        task, unit = probe["task"], probe["optimizer"]
        optimizer = unit if unit in caps else "OWL-QN"  # Table 2's forms run OWL-QN
        name = unit if task != "sparse" else f"OWL-QN, {unit} forward-backward"
        if "failed" in probe:
            rows.append([task, name, None, None, None, f"not measured: {probe['failed']}"] + [None] * 4)
            continue
        fixed = probe["setup_s"] + probe["compile_s"] + (probe["calibration_s"] or 0) + (probe["plan_s"] or 0)
        cap = configs.get(task, FULL[task])[caps[optimizer]]
        estimate = lambda count: _minutes(fixed + count * probe["per_iteration_s"])
        rows.append(
            [task, name, probe["labels"], probe["possible_features"], probe["weights_in_model"]]
            + [f"{probe['per_iteration_s']:.2f} s", _minutes(fixed + probe["first_iteration_s"])]
            + [
                f"{probe['peak_gib']:.1f} GiB",
                f"{estimate(PAPER_ITERATIONS[optimizer])} ({PAPER_ITERATIONS[optimizer]:g} it.)",
            ]
            + [f"{estimate(cap)} ({cap} it.)"]
        )
    return [
        "## Full-scale probes: time per iteration, memory and wall-time estimates",
        "",
        f"Each unit of the full run, its caps cut to a few iterations (`{probes.get('command', '')}`, one process "
        f"per unit, resident memory limited to {probes['limit_gib']:g} GiB; {probes.get('machine', '')}): seconds "
        "per iteration (epoch, sweep) at steady state, the time to the end of the first (setup: corpus, "
        "features, packing and the model; compilation; the SGD calibration or the BCD plan), and the process's "
        "peak resident memory. Estimates: that fixed time plus the iterations at the steady rate, for the "
        "paper's Table 4 iteration counts (OWL-QN 141, SGD-L1 28.5, BCD 8.7) and for the caps; evaluation "
        "after each chunk and fine-tuning are extra. Where the stop rule ends a run is known only from the run.",
        "",
        markdown_table(header, rows),
        "",
    ]


def _preamble(quick: bool, configs: dict) -> list[str]:
    mode = "quick (tiny slices, a few iterations: not comparable to the paper)" if quick else "full"
    rate = "calibrated on a sample (`calibrate_learning_rate`)" if not quick else "fixed (quick mode)"
    config = next(iter(configs.values()), _FULL_CHAIN)
    (tol, period), (epoch_tol, epoch_period) = config["stop"], config["epoch_stop"]
    return [
        "# Lavergne, Cappe & Yvon (2010): L1-penalised CRFs, three optimizers",
        "",
        f"Mode: {mode}. Objective `l(theta) + {L1} ||theta||_1 + {L2:g}/2 ||theta||^2` (the paper's rho_1, "
        f"rho_2), summed over sentences; float32; seed {SEED}. Fine-tuning: L-BFGS on the non-zero weights "
        f"only, L2 {FINETUNE_L2:g}. OWL-QN keeps {OWLQN_MEMORY} gradient pairs. SGD-L1: learning rate {rate}, "
        f"decayed by 0.9 per epoch, lazy penalties on the rows a step touches. CRFsuite L-BFGS: c1 "
        f"{CRFSUITE_C1:g}, c2 {CRFSUITE_C2:g} (`optimizers.crfsuite_elastic_net`: the same objective), on the "
        f"same observation strings, with features only for the (attribute, label) pairs and transitions seen "
        f"in training (its default); CRFsuite l2sgd: L2 only, c2 {L2SGD_C2:g} (its default), its own learning-"
        f"rate calibration. 'Iterations' are L-BFGS/OWL-QN iterations, SGD epochs and BCD sweeps; 'active "
        f"features' are non-zero weights (transitions included); 'penalised objective' is the objective each "
        f"L1 optimizer minimised, at its end; times are wall-clock seconds of optimisation "
        f"(compilation, the SGD learning-rate calibration, the BCD plan and evaluation "
        f"excluded: all in the JSON; CRFsuite's include its feature extraction and data loading); each "
        f"unit's machine and its load when it started are listed below; the "
        f"paper's are CPU times of 8 cores. Stopping (CRFsuite's rule, `relative_improvement_below`): the "
        f"objective improved by less than {tol:g} (relative) over the last {period} iterations (OWL-QN, "
        f"CRFsuite L-BFGS), or by less than {epoch_tol:g} over the last {epoch_period} epochs or sweeps "
        f"(BCD, l2sgd; SGD-L1: changed by less than that either way, `relative_change_over`, since a rise "
        f"means its step is still too large); fine-tuning: a relative change below {config['finetune_tol']:g} in one "
        f"iteration. Iteration caps are safety limits (the paper stopped on a development set); the "
        f"`converged` columns say which rows met the rule. Conclusions are judged only from converged rows.",
        "",
    ]


def _deviations(results: dict) -> list[str]:
    lines = ["## Deviations from the paper", ""]
    lines.append(
        "- POS: conll2000 (WSJ sections 15-18 for training, 20 for testing), not the paper's sections 0-18 "
        "and 22-24. The paper's base POS set put label-pair-observation features on every test (436.7M "
        "features); `pairs` puts them on the current word only."
    )
    if "joint" in results:
        lines.append(
            f"- Joint labels: conll2000's POS|chunk pairs ({results['joint']['num_labels']} labels in the "
            "training set), not Nettalk+prosody (114); test tokens with a joint label unseen in training "
            "count as errors."
        )
    lines.append(
        "- CRFsuite has no label-pair-observation features: no CRFsuite rows on `pairs`. Its l2sgd "
        "minimises an L2-only objective (the paper's L2 column of Table 2), not the L1 one."
    )
    lines.append(
        "- The model: weights only on the (test, label) pairs and (word, y', y) triples seen in training "
        "(CRFsuite's convention, `training.initial_chain_model`), for all three optimizers; the paper counts "
        "its features over all combinations (both counts are given)."
    )
    lines.append("- Table 2: the `pairs` model, OWL-QN for both forms, no fine-tuning.")
    return lines + [""]


def _task_sections(results: dict, configs: dict) -> list[str]:
    document = []
    for task, title in (
        ("pos", "Table 4 analogue, POS tagging"),
        ("pairs", "Table 4 analogue, POS tagging with label-pair-observation features"),
        ("joint", "Table 5 analogue, joint POS+chunk labels"),
    ):
        if task not in results:
            continue
        result, config = results[task], configs[task]
        document += [
            f"## {title} ({task})",
            "",
            f"{result['source']}: {result['num_train']} training sentences ({result['train_tokens']} tokens), "
            f"{result['num_test']} test sentences, {result['num_labels']} labels, "
            f"{result['num_unigram_tests']} observation tests"
            + (f" and {result['num_pair_tests']} label-pair tests (`{config['pairs']}`)" if config["pairs"] else "")
            + f"; {_features_cell(result)}. Caps: OWL-QN {config['owlqn_steps']} iterations, "
            f"SGD {config['sgd_epochs']} epochs of minibatches of {config['batch_size']}, BCD "
            f"{config['bcd_sweeps']} sweeps, fine-tuning {config['finetune_steps']} iterations, CRFsuite "
            f"{config['crfsuite_iterations']}.",
            "",
            _table4(task, result),
            _bcd_note(result),
        ]
    if "pos" in results or "pairs" in results:
        document += ["## Table 1 analogue: label-pair-observation features (pairs against pos)", "", _table1(results)]
    if "sparse" in results:
        result = results["sparse"]
        document += [
            "## Table 2 analogue: sparse versus dense forward-backward in training (sparse)",
            "",
            f"{result['source']}: {result['num_train']} training sentences, {result['num_labels']} labels, the "
            f"`pairs` features on the (word, y', y) triples seen in training; OWL-QN from zero weights, the same "
            f"stop rule, once on the sparse form (`with_pair_mask(..., max_sparse_fraction=1)`: the recursion "
            f"over each position's own label pairs, those its word was seen with, and the shared transitions) "
            f"and once on the dense per-position `[T, L, L]` form (`max_sparse_fraction=0`).",
            "",
            _table2(result),
        ]
    return document


def _machine_words(where: dict) -> str:
    return f"{where['cpu']}, {where['logical_cores']} logical cores, {where['memory_gib']:.0f} GiB"


def _processes(curve: list) -> list[tuple[int, int, dict | None]]:
    """`(first step, last step, machine)` of each process that ran part of a
    curve (`CurveRecorder` names the machine at each process's first point;
    None for steps whose process named none: curves of earlier versions)."""
    starts = [index for index, point in enumerate(curve) if "machine" in point]
    if not starts:
        return []
    if starts[0]:
        starts.insert(0, 0)
    ends = [*starts[1:], len(curve)]
    return [
        (curve[start - 1]["step"] + 1 if start else 1, curve[end - 1]["step"], curve[start].get("machine"))
        for start, end in zip(starts, ends, strict=True)
    ]


def _machines(results: dict) -> list[str]:
    """Where each row's time was measured: the machine and its load average
    when the unit started (about 0 on an idle machine, about 2 with both
    cores busy), for the units that recorded it."""
    lines, unrecorded = [], []
    for task, result in results.items():
        for row in result["rows"]:
            label = f"{task} {row['optimizer']}" + (f" ({row['form']})" if "form" in row else "")
            where = row.get("machine")
            if where is None:
                unrecorded.append(label)
                continue
            load = where.get("load_average_at_start")
            processes = _processes(row.get("curve") or [])
            lines.append(
                f"- {label}: {_machine_words(where)}; load average at the start "
                + ("of its last process " if len(processes) > 1 else "")
                + ("not known" if load is None else "/".join(f"{value:.2f}" for value in load))
                + (
                    f"; run in {len(processes)} processes (resumed from checkpoints): "
                    + "; ".join(
                        f"steps {first}-{last} on {_machine_words(on) if on else 'a machine not recorded'}"
                        for first, last, on in processes
                    )
                    if len(processes) > 1
                    else ""
                )
            )
    if unrecorded:
        lines.append(
            f"- not recorded (units of earlier runs, on a machine that may have been shared): {', '.join(unrecorded)}"
        )
    return ["## Where the times were measured", "", *lines, ""] if lines or unrecorded else []


def run(run: RunDirectory, *, quick: bool = False, progress: bool = True, tasks=None) -> dict:
    """Run the experiment (`tasks`: a subset of `TASKS`, default all), unit by unit."""
    base = QUICK if quick else FULL
    configs = {task: base[task] for task in select_tasks("lavergne2010", tasks, tuple(base))}
    results = {}
    for task in ("pos", "pairs", "joint"):
        if task in configs:
            results[task] = _chain_task(run, task, configs[task], progress)
    if "sparse" in configs:
        results["sparse"] = _sparse_task(run, configs["sparse"], progress)
    rows = [row for result in results.values() for row in result["rows"]]
    for task, result in results.items():
        for row in result["rows"]:
            row["convergence"] = row_convergence(row, configs[task])
    checks = _check_conclusions(results)
    document = _preamble(quick, configs) + _task_sections(results, configs) + _machines(results)
    document += [
        "## Conclusions checked",
        "",
        "Published: the three L1 optimizers reach similar error with few active features, label-pair-"
        "observation features help, and the sparse forward-backward speeds up training.",
        "",
    ]
    document += stale_note(rows) + missing_note(run)
    document += _conclusion_lines(checks, quick) + [""] + _deviations(results)
    probes = None if quick else _read_probes()
    if probes is not None:
        document += probe_estimates(probes, configs)
    figure = _plot_curves(run, results)
    if figure:
        document += [f"![error and active features vs time]({os.path.basename(figure)})"]
    run.write_text("results.md", "\n".join(document) + "\n")
    summary = {
        "quick": quick,
        "l1": L1,
        "l2": L2,
        "finetune_l2": FINETUNE_L2,
        "seed": SEED,
        "configs": configs,
        "tasks": results,
        "conclusions": checks,
    }
    run.write_json("results.json", summary)
    return summary
