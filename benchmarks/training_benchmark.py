"""Training against CRFsuite, in one process: CoNLL-2002 Spanish NER (the
`crfsuite_ner` preset, i.e. the sklearn-crfsuite feature set) and conll2000
WSJ POS (the `lavergne_pos` preset, 44 tags).

Same features (state features only for observed (attribute, label) pairs), same
objective (`-sum_i log p(y_i | x_i) + c1 ||w||_1 + c2 ||w||^2`), c1 = c2 = 0.1:

* one full-batch value-and-gradient of the lossfns objective (log-loss plus
  elastic net, jitted; compile time reported apart) against one CRFsuite
  L-BFGS iteration (CRFsuite's own per-iteration times; an iteration may
  evaluate the gradient more than once, which is also reported);
* a whole training run (OWL-QN, at most `iterations` iterations) of each,
  wall time including lossfns's indexing and compilation, and the test
  score (entity F1 on `esp.testb`; token accuracy on conll2000 `test.txt`).

Needs NLTK_DATA pointing at the corpora and python-crfsuite.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from lossfns import corpora, metrics
from lossfns.features import FeatureIndex, pack, preset
from lossfns.features.design import bucket_design, bucket_slices, design_matmul
from lossfns.lattices.chain import FactoredPotentials
from lossfns.losses import sequence_log_loss
from lossfns.models import LinearChainModel
from lossfns.tagger import Tagger, crfsuite_elastic_net

from benchmarks.lattice_benchmark import median_seconds


def _crfsuite(train, test, extractor, c1, c2, iterations):
    import pycrfsuite

    # Timed from the sentences, as the Tagger's fit is: feature extraction and
    # CRFsuite's own data loading (`append` interns the attribute strings) included.
    start = time.perf_counter()
    trainer = pycrfsuite.Trainer(verbose=False)
    for sentence in train:
        trainer.append(extractor(sentence.tokens).unigram, list(sentence.labels))
    trainer.set_params({"c1": c1, "c2": c2, "max_iterations": iterations})
    loading_seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.crfsuite")
        trainer.train(path)
        seconds = time.perf_counter() - start
        tagger = pycrfsuite.Tagger()
        tagger.open(path)
        predicted = [tuple(tagger.tag(extractor(s.tokens).unigram)) for s in test]
    gold = [s.labels for s in test]
    log = trainer.logparser.iterations
    # CRFsuite times its iterations with clock(): processor time, not wall time.
    per_iteration = [float(it["time"]) for it in log]
    trials = [int(it.get("linesearch_trials", 1)) for it in log]
    return {
        "train_seconds": seconds,
        "extraction_and_loading_seconds": loading_seconds,
        "iterations": len(log),
        "wall_seconds_per_iteration": (seconds - loading_seconds) / max(len(log), 1),
        "median_iteration_seconds": statistics.median(per_iteration),
        "median_seconds_per_gradient": statistics.median(t / max(n, 1) for t, n in zip(per_iteration, trials)),
        "test_f1": metrics.entity_scores(gold, predicted).f1,
        "test_token_accuracy": metrics.token_accuracy(gold, predicted),
    }


def _one_gradient(tagger, train, c1, c2, repeats):
    """Median seconds of one full-batch value-and-gradient of log-loss plus
    elastic net at the trained weights, and its compile time."""
    # The Tagger's own objective, variables and packed data: exactly what its optimizer evaluates.
    params, objective, data = tagger.model.weights(), tagger.objective(), tagger.training_data(train)
    penalty = crfsuite_elastic_net(c1, c2)

    def full(params, data):
        leaves = jax.tree_util.tree_leaves(params)
        return (
            objective(params, data)
            + penalty["l1"] * sum(jnp.sum(jnp.abs(x)) for x in leaves)
            + 0.5 * penalty["l2"] * sum(jnp.sum(jnp.square(x)) for x in leaves)
        )

    value_and_grad = jax.jit(jax.value_and_grad(full))
    start = time.perf_counter()
    jax.block_until_ready(value_and_grad(params, data))
    first = time.perf_counter() - start
    times, processor = [], []
    for _ in range(repeats):
        start, start_processor = time.perf_counter(), time.process_time()
        jax.block_until_ready(value_and_grad(params, data))
        times.append(time.perf_counter() - start)
        processor.append(time.process_time() - start_processor)
    median = statistics.median(times)
    # Processor time (all threads) is comparable with CRFsuite's clock()-timed
    # iterations and less sensitive than wall time to other processes.
    return {
        "median_seconds": median,
        "median_processor_seconds": statistics.median(processor),
        "compile_seconds": max(first - median, 0.0),
        "repeats": repeats,
        "tokens": int(sum(len(s.tokens) for s in train)),
    }


def emission_gradient(train, extractor, num_features: int = 2**20, repeats: int = 7):
    """The emission-weight gradient at K = `num_features` hashed features
    against the chain forward-backward it follows (issue 5: not slower).

    Times, on the whole corpus: the weight gradient (the VJP of the sparse
    product `design_matmul`, `[K, L]` out, with its forward product), the forward-backward of the
    log-loss given the emission scores (value and gradient with respect to
    them), and the previous gather / scatter-add path for reference.
    """
    labels = sorted({label for s in train for label in s.labels})
    lookup = {label: i for i, label in enumerate(labels)}
    index = FeatureIndex.hashed_index(num_features, 0)
    packed = pack(
        [index.encode(extractor(s.tokens)) for s in train], [[lookup[label] for label in s.labels] for s in train], 6
    )
    design = jax.tree_util.tree_map(jnp.asarray, bucket_design(packed, num_features))
    shapes = [p.shape for p in packed.positions]
    rng = np.random.default_rng(0)
    weights = jnp.asarray(0.01 * rng.standard_normal((num_features, len(labels))), jnp.float32)
    transitions = jnp.asarray(0.1 * rng.standard_normal((len(labels),) * 2), jnp.float32)
    bucket_labels, bucket_lengths = tuple(map(jnp.asarray, packed.labels)), tuple(map(jnp.asarray, packed.lengths))

    def chain_loss(rows):
        return sum(
            jnp.sum(sequence_log_loss(FactoredPotentials(unary, transitions), y, n))
            for unary, y, n in zip(bucket_slices(rows, shapes), bucket_labels, bucket_lengths)
        )

    rows = jax.jit(design_matmul)(design, weights)
    forward_backward = jax.jit(jax.value_and_grad(chain_loss))
    cotangent = forward_backward(rows)[1]
    weight_gradient = jax.jit(
        lambda design, cotangent: jax.vjp(lambda w: design_matmul(design, w), weights)[1](cotangent)[0]
    )
    token_ids = jnp.asarray(packed.unigram_ids)
    token_cotangent = jnp.asarray(rng.standard_normal((token_ids.shape[0], len(labels))), jnp.float32)
    # The gather path: the model's emission scores of the token rows (a sum of gathered rows, scatter-add gradient).
    model = LinearChainModel.zeros(num_features, len(labels))
    gathered = lambda w: dataclasses.replace(model, emission=w).unary(token_ids)
    scatter = jax.jit(lambda w, c: jax.vjp(gathered, w)[1](c)[0])
    out = {
        "num_features": num_features,
        "labels": len(labels),
        "tokens": int(token_ids.shape[0]),
        "nonzeros": int(design.indices.shape[0]),
        "repeats": repeats,
        "forward_backward_seconds": median_seconds(forward_backward, rows, repeats=repeats),
        "weight_gradient_seconds": median_seconds(weight_gradient, design, cotangent, repeats=repeats),
        "scatter_add_weight_gradient_seconds": median_seconds(scatter, weights, token_cotangent, repeats=repeats),
    }
    out["weight_gradient_over_forward_backward"] = out["weight_gradient_seconds"] / out["forward_backward_seconds"]
    return out


# name: (description, feature preset, corpus loader of (train, test), test score)
TASKS = {
    "ner": (
        "CoNLL-2002 Spanish NER (esp.train -> esp.testb), crfsuite_ner features",
        "crfsuite_ner",
        lambda: (corpora.conll2002("esp.train"), corpora.conll2002("esp.testb")),
        "f1",
    ),
    "pos": (
        "conll2000 WSJ POS (train.txt -> test.txt), lavergne_pos features",
        "lavergne_pos",
        lambda: (corpora.conll2000("train.txt", task="pos"), corpora.conll2000("test.txt", task="pos")),
        "token_accuracy",
    ),
}


def run(quick: bool = False, iterations: int = 100, c1: float = 0.1, c2: float = 0.1, task: str = "ner", log=print):
    """Returns a result record for `task` ("ner" or "pos"), or `{"skipped":
    reason}` without corpus or CRFsuite."""
    description, preset_name, load, score = TASKS[task]
    try:
        import pycrfsuite  # noqa: F401
    except ImportError:
        return {"skipped": "python-crfsuite is not installed"}
    try:
        train, test = load()
    except (LookupError, OSError, ValueError) as error:
        return {"skipped": f"{description}: corpus not found under NLTK_DATA: {error}"}
    if quick:
        train, test, iterations = train[:300], test[:200], 5
    extractor = preset(preset_name)
    gradient_at_scale = None
    if task == "ner":
        gradient_at_scale = emission_gradient(train, extractor, 2**14 if quick else 2**20, 3 if quick else 7)
        log(
            f"  K = {gradient_at_scale['num_features']:,} hashed features: weight gradient "
            f"{gradient_at_scale['weight_gradient_seconds'] * 1e3:.1f} ms, forward-backward "
            f"{gradient_at_scale['forward_backward_seconds'] * 1e3:.1f} ms (ratio "
            f"{gradient_at_scale['weight_gradient_over_forward_backward']:.2f}); scatter-add path "
            f"{gradient_at_scale['scatter_add_weight_gradient_seconds'] * 1e3:.1f} ms"
        )
    log(f"training benchmark, {description}: {len(train)} sentences, c1 = {c1}, c2 = {c2}, {iterations} iterations")

    crfsuite = _crfsuite(train, test, extractor, c1, c2, iterations)
    log(
        f"  crfsuite: {crfsuite['train_seconds']:.1f} s for {crfsuite['iterations']} iterations "
        f"({crfsuite['median_iteration_seconds']:.3f} s per iteration), {score} {crfsuite['test_' + score]:.4f}"
    )

    start = time.perf_counter()
    tagger = Tagger(extractor, **crfsuite_elastic_net(c1, c2), max_iterations=iterations, progress=False)
    tagger.fit(train)
    lossfns_seconds = time.perf_counter() - start
    evaluation = tagger.evaluate(test)
    lossfns = {
        "train_seconds_including_indexing_and_compile": lossfns_seconds,
        "optimisation_loop_seconds": tagger.training_seconds,
        "iterations": len(tagger.history),
        "test_f1": evaluation["f1"],
        "test_token_accuracy": evaluation["token_accuracy"],
    }
    lossfns["gradient"] = _one_gradient(tagger, train, c1, c2, repeats=3 if quick else 7)
    log(
        f"  lossfns: {lossfns_seconds:.1f} s for {lossfns['iterations']} iterations (loop "
        f"{tagger.training_seconds:.1f} s), {score} {lossfns['test_' + score]:.4f}; one gradient "
        f"{lossfns['gradient']['median_seconds']:.3f} s (compile {lossfns['gradient']['compile_seconds']:.1f} s)"
    )

    ratios = {
        "gradient_processor_time_over_crfsuite_iteration": lossfns["gradient"]["median_processor_seconds"]
        / crfsuite["median_iteration_seconds"],
        "gradient_wall_over_crfsuite_wall_per_iteration": lossfns["gradient"]["median_seconds"]
        / crfsuite["wall_seconds_per_iteration"],
        "gradient_over_crfsuite_iteration": lossfns["gradient"]["median_seconds"]
        / crfsuite["median_iteration_seconds"],
        "gradient_over_crfsuite_gradient": lossfns["gradient"]["median_seconds"]
        / crfsuite["median_seconds_per_gradient"],
        "training_time_lossfns_over_crfsuite": lossfns_seconds / crfsuite["train_seconds"],
        f"{score}_lossfns_minus_crfsuite": lossfns["test_" + score] - crfsuite["test_" + score],
    }
    log("  ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    return {
        "task": description,
        "sentences": len(train),
        "c1": c1,
        "c2": c2,
        "max_iterations": iterations,
        "crfsuite": crfsuite,
        "lossfns": lossfns,
        "ratios": ratios,
        "emission_gradient_at_scale": gradient_at_scale,
    }
