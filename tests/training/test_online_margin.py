"""CRFsuite's passive-aggressive and AROW trainers (`training.online_margin`):
every epoch equals a plain numpy re-implementation over enumerated paths on
tiny chains (all `pa_type`s, cost with and without `error_sensitive`,
averaging), separable data is separated, jit / vmap / resume; given
CRFsuite's own shuffles (glibc's `rand`, seeded) every epoch's loss and the
final weights equal pycrfsuite's `pa` and `arow`, and with our shuffles the
accuracies agree on a feature-dict corpus."""

from __future__ import annotations

import ctypes
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import training
from lossfns.lattices import chain
from lossfns.optimizers.minimize import init_loop, run_loop_jit
from lossfns.training.online_margin import margin_terms
from tests.optimizers.test_problems import assert_resume_bit_identical

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

# -- a tiny linear chain and its brute-force reference ---------------------------


def factored(params, x):
    """Potentials of one sequence `x [T, F]`: emission `[F, L]`, transitions `[L, L]`, no start scores."""
    return chain.FactoredPotentials(x @ params["emission"], params["transitions"])


def tiny_problem(seed, num_labels, num_sequences=6, max_length=4, num_features=3):
    """Random real features, random gold labels (-1 past each length), random start weights."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_sequences, max_length, num_features))
    lengths = rng.integers(1, max_length + 1, size=num_sequences)
    labels = rng.integers(0, num_labels, size=(num_sequences, max_length))
    labels[np.arange(max_length) >= lengths[:, None]] = -1
    params = {
        "emission": rng.normal(size=(num_features, num_labels)) * 0.5,
        "transitions": rng.normal(size=(num_labels, num_labels)) * 0.5,
    }
    data = training.SequenceData(jnp.asarray(x), jnp.asarray(labels, jnp.int32), jnp.asarray(lengths, jnp.int32))
    return params, data


class Reference:
    """Plain-Python CRF with flat weights `[F * L + L * L]` (emission then transitions)."""

    def __init__(self, num_features, num_labels):
        self.F, self.L = num_features, num_labels

    def phi(self, x, y):
        emission, transitions = np.zeros((self.F, self.L)), np.zeros((self.L, self.L))
        for t, label in enumerate(y):
            emission[:, label] += x[t]
            if t:
                transitions[y[t - 1], label] += 1.0
        return np.concatenate([emission.ravel(), transitions.ravel()])

    def viterbi(self, w, x, n):
        """The best path by enumerating all `L ** n` of them."""
        paths = list(itertools.product(range(self.L), repeat=n))
        scores = [w @ self.phi(x, y) for y in paths]
        return paths[int(np.argmax(scores))]

    def margin(self, w, x, gold, n):
        """`(cost excess, wrong labels, delta = phi(gold) - phi(viterbi))`."""
        best = self.viterbi(w, x, n)
        delta = self.phi(x, gold[:n]) - self.phi(x, best)
        return -(w @ delta), sum(a != b for a, b in zip(best, gold[:n])), delta


def flat(params):
    return np.concatenate([np.ravel(params["emission"]), np.ravel(params["transitions"])])


def epoch_order(key, step, total):
    return np.arange(total) if key is None else np.asarray(jax.random.permutation(jax.random.fold_in(key, step), total))


def reference_pa(params, data, epochs, *, pa_type, c, error_sensitive, key=None):
    """CRFsuite's passive-aggressive loop in numpy: per epoch `(w, ws, u, loss, snapshots)`."""
    x, labels, lengths = (np.asarray(a) for a in data)
    ref = Reference(x.shape[2], params["emission"].shape[1])
    w, ws, u = flat(params), np.zeros_like(flat(params)), 1
    snapshots, out = [w.copy()], []
    for step in range(epochs):
        loss = 0.0
        for n in epoch_order(key, step, len(lengths)):
            excess, wrong, delta = ref.margin(w, x[n], labels[n], lengths[n])
            if wrong:
                cost = excess + (np.sqrt(wrong) if error_sensitive else 1.0)
                norm = delta @ delta
                tau = [cost / norm, min(c, cost / norm), cost / (norm + 0.5 / c)][pa_type]
                w, ws = w + tau * delta, ws + tau * u * delta
                loss += cost
            u += 1
            snapshots.append(w.copy())
        out.append((w.copy(), ws.copy(), u, loss, np.mean(snapshots, axis=0)))
    return out


def reference_arow(params, data, epochs, *, variance, gamma, key=None):
    """CRFsuite's AROW loop in numpy: per epoch `(mean, covariance, loss)`."""
    x, labels, lengths = (np.asarray(a) for a in data)
    ref = Reference(x.shape[2], params["emission"].shape[1])
    mean = flat(params)
    cov = np.full_like(mean, variance)
    out = []
    for step in range(epochs):
        loss = 0.0
        for n in epoch_order(key, step, len(lengths)):
            excess, wrong, delta = ref.margin(mean, x[n], labels[n], lengths[n])
            if wrong:
                cost = excess + wrong
                alpha = cost / (gamma + np.sum(cov * delta**2))
                mean = mean + alpha * cov * delta
                cov = 1.0 / (1.0 / cov + delta**2 / gamma)
                loss += cost
        out.append((mean.copy(), cov.copy(), loss))
    return out


# -- equality with the reference, epoch by epoch ----------------------------------


@pytest.mark.parametrize(
    ("pa_type", "error_sensitive", "num_labels", "shuffle"),
    [(0, True, 2, False), (1, False, 3, True), (2, True, 3, False), (2, False, 2, True)],
)
def test_pa_epochs_equal_the_reference(pa_type, error_sensitive, num_labels, shuffle):
    params, data = tiny_problem(pa_type + 3 * error_sensitive, num_labels)
    key = jax.random.PRNGKey(7) if shuffle else None
    c = 0.3
    expected = reference_pa(params, data, 4, pa_type=pa_type, c=c, error_sensitive=error_sensitive, key=key)
    step_fn = jax.jit(training.pa_epoch_fn(factored, data, pa_type=pa_type, c=c, error_sensitive=error_sensitive))
    state = training.pa_init(jax.tree_util.tree_map(jnp.asarray, params), key)
    for step, (w, ws, u, loss, mean) in enumerate(expected):
        state, value = step_fn(state, jnp.int32(step))
        assert loss > 0  # random gold labels: every epoch updates
        np.testing.assert_allclose(float(value), loss, rtol=1e-9)
        np.testing.assert_allclose(flat(state.params), w, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(flat(state.weighted_updates), ws, rtol=1e-9, atol=1e-9)
        assert int(state.count) == u
        # CRFsuite's averaging trick is the mean of every weight vector so far, the start included.
        np.testing.assert_allclose(flat(training.pa_params(state)), mean, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(flat(training.pa_params(state, averaging=False)), w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("num_labels", "shuffle", "variance", "gamma"), [(2, False, 1.0, 1.0), (3, True, 0.5, 2.0)])
def test_arow_epochs_equal_the_reference(num_labels, shuffle, variance, gamma):
    params, data = tiny_problem(11 + num_labels, num_labels)
    key = jax.random.PRNGKey(3) if shuffle else None
    expected = reference_arow(params, data, 4, variance=variance, gamma=gamma, key=key)
    step_fn = jax.jit(training.arow_epoch_fn(factored, data, gamma=gamma))
    state = training.arow_init(jax.tree_util.tree_map(jnp.asarray, params), variance, key)
    for step, (mean, cov, loss) in enumerate(expected):
        state, value = step_fn(state, jnp.int32(step))
        assert loss > 0
        np.testing.assert_allclose(float(value), loss, rtol=1e-9)
        np.testing.assert_allclose(flat(training.arow_params(state)), mean, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(flat(state.variance), cov, rtol=1e-9, atol=1e-9)


def test_margin_terms_vmapped_over_sentences_equal_the_reference():
    params, data = tiny_problem(5, 3)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    excess, wrong, gradient = jax.jit(jax.vmap(functools.partial(margin_terms, factored, params), in_axes=(0, 0, 0)))(
        data.inputs, data.labels, data.lengths
    )
    ref = Reference(3, 3)
    for n in range(len(data.lengths)):
        cost, errors, delta = ref.margin(
            flat(params), np.asarray(data.inputs[n]), np.asarray(data.labels[n]), int(data.lengths[n])
        )
        np.testing.assert_allclose(float(excess[n]), cost, atol=1e-12)
        assert int(wrong[n]) == errors
        np.testing.assert_allclose(flat(jax.tree_util.tree_map(lambda g: g[n], gradient)), -delta, atol=1e-12)


# -- behaviour of whole runs --------------------------------------------------------


@functools.cache
def separable_data():
    """Gold labels are the Viterbi paths of a random model: separable by construction."""
    rng = np.random.default_rng(1)
    x = (rng.random((24, 6, 8)) < 0.4).astype(np.float64)
    x[..., 0] = 1.0
    lengths = jnp.asarray(rng.integers(2, 7, size=24), jnp.int32)
    truth = {
        "emission": jnp.asarray(rng.normal(size=(8, 3)) * 2.0),
        "transitions": jnp.asarray(rng.normal(size=(3, 3))),
    }
    _, labels = chain.viterbi(jax.vmap(lambda row: factored(truth, row))(jnp.asarray(x)), lengths)
    return training.SequenceData(jnp.asarray(x), labels, lengths)


def mistakes(params, data):
    _, predicted = chain.viterbi(jax.vmap(lambda row: factored(params, row))(data.inputs), data.lengths)
    return int(np.sum(np.any(np.asarray(predicted) != np.asarray(data.labels), axis=1)))


def zeros():
    return {"emission": jnp.zeros((8, 3)), "transitions": jnp.zeros((3, 3))}


def test_both_separate_separable_data():
    data = separable_data()
    run_pa = jax.jit(lambda p: training.passive_aggressive(factored, p, data, max_steps=40, epsilon=1e-9))
    result = run_pa(zeros())
    steps = int(result.num_steps)
    # CRFsuite's pa stops after a clean epoch only with epsilon > 0 (its test is <).
    assert 1 < steps < 40 and float(result.trace[steps - 1]) == 0.0
    assert mistakes(training.pa_params(result.state, averaging=False), data) == 0
    assert mistakes(result.params, data) == 0

    result = jax.jit(lambda p: training.arow(factored, p, data, max_steps=40))(zeros())
    steps = int(result.num_steps)
    assert 1 < steps < 40 and float(result.trace[steps - 1]) == 0.0  # arow's test is <=: epsilon 0 stops
    assert mistakes(result.params, data) == 0


def test_float32_params_stay_float32():
    """float32 weights under float64 inputs (the potentials float64): same
    runs as in float64, to float32's precision, and float32 states."""
    params, data = tiny_problem(9, 3)
    narrow = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), params)
    for train in (functools.partial(training.passive_aggressive, pa_type=2), training.arow):
        run = jax.jit(lambda p, train=train: train(factored, p, data, max_steps=3))
        wide_loop, thin_loop = run(params), run(narrow)
        wide, thin = wide_loop.params, thin_loop.params
        assert {leaf.dtype for leaf in jax.tree_util.tree_leaves((thin, thin_loop.state, thin_loop.trace))} <= {
            jnp.dtype(jnp.float32),
            jnp.dtype(jnp.int32),
        }
        np.testing.assert_allclose(flat(thin), flat(wide), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(thin_loop.trace, wide_loop.trace, rtol=1e-4)


def test_mean_loss_rules():
    trace = jnp.asarray([6.0, 2.0, 0.0])
    assert bool(training.MeanLossBelow(1.0, 4)(trace, 2))  # 0.5 < 1
    assert not bool(training.MeanLossBelow(0.5, 4)(trace, 2))
    assert bool(training.MeanLossBelow(0.5, 4, inclusive=True)(trace, 2))
    assert not bool(training.MeanLossBelow(0.0, 4)(trace, 3))
    assert bool(training.MeanLossBelow(0.0, 4, inclusive=True)(trace, 3))


def test_shuffled_runs_resume_bit_identically(tmp_path):
    params, data = tiny_problem(2, 3)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    step_fn = training.pa_epoch_fn(factored, data, pa_type=2)
    loop = init_loop(training.pa_init(params, jax.random.PRNGKey(0)), 5)
    assert_resume_bit_identical(step_fn, loop, training.MeanLossBelow(0.0, 6), 2, tmp_path / "pa.eqx")
    # The key shuffles: other epochs than in corpus order.
    ordered = run_loop_jit(step_fn, init_loop(training.pa_init(params), 5), 5, training.MeanLossBelow(0.0, 6))
    shuffled = run_loop_jit(step_fn, loop, 5, training.MeanLossBelow(0.0, 6))
    assert not np.allclose(np.asarray(ordered.trace), np.asarray(shuffled.trace))


def test_settings_are_checked():
    params, data = tiny_problem(0, 2)
    with pytest.raises(ValueError, match="pa_type"):
        training.pa_epoch_fn(factored, data, pa_type=3)
    with pytest.raises(ValueError, match="c must"):
        training.pa_epoch_fn(factored, data, c=0.0)
    with pytest.raises(ValueError, match="gamma must"):
        training.arow_epoch_fn(factored, data, gamma=-1.0)
    with pytest.raises(ValueError, match="variance must"):
        training.arow_init(params, 0.0)


# -- against CRFsuite ---------------------------------------------------------------------


def feature_corpus(seed, num_sentences, spread=6):
    """Sentences of feature dicts from a 3-label Markov chain, each label's
    words overlapping the next's by `spread - 4`: `(X, y)`."""
    rng = np.random.default_rng(seed)
    moves = np.array([[0.7, 0.2, 0.1], [0.2, 0.6, 0.2], [0.3, 0.3, 0.4]])
    X, y = [], []
    for _ in range(num_sentences):
        labels = [int(rng.integers(3))]
        for _ in range(int(rng.integers(3, 9)) - 1):
            labels.append(int(rng.choice(3, p=moves[labels[-1]])))
        words = [int(label * 4 + rng.integers(spread)) % 12 for label in labels]
        X.append(
            [
                {f"w={w}": 1.0, f"prev={words[t - 1] if t else 'BOS'}": 1.0, "size": 0.1 * (w % 5)}
                for t, w in enumerate(words)
            ]
        )
        y.append([f"L{label}" for label in labels])
    return X, y


def encode(X, y, attributes, label_names):
    """Padded `SequenceData`: inputs `(ids [N, T, F], values [N, T, F])`, ids -1 where absent."""
    T = max(map(len, X))
    F = max(len(token) for sentence in X for token in sentence)
    ids, values = np.full((len(X), T, F), -1, np.int32), np.zeros((len(X), T, F))
    labels = np.full((len(X), T), -1, np.int32)
    for n, (sentence, tags) in enumerate(zip(X, y)):
        for t, (token, tag) in enumerate(zip(sentence, tags)):
            known = [(attributes[name], value) for name, value in token.items() if name in attributes]
            ids[n, t, : len(known)] = [i for i, _ in known]
            values[n, t, : len(known)] = [v for _, v in known]
            labels[n, t] = label_names.index(tag)
    lengths = np.asarray([len(s) for s in X], np.int32)
    return training.SequenceData((jnp.asarray(ids), jnp.asarray(values)), jnp.asarray(labels), jnp.asarray(lengths))


def sparse_potentials(params, inputs):
    ids, values = inputs
    rows = jnp.where(ids[..., None] >= 0, params["emission"][jnp.maximum(ids, 0)], 0.0)
    return chain.FactoredPotentials(jnp.sum(values[..., None] * rows, axis=-2), params["transitions"])


def libc():
    """The C library whose `rand` CRFsuite's `dataset_shuffle` draws from (glibc here)."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        pytest.skip("no glibc to seed CRFsuite's shuffles")


def crfsuite_train(pycrfsuite, path, X, y, algorithm, settings, seed):
    """Train CRFsuite with every (attribute, label) pair and transition (the
    dense model here), its shuffles seeded: `(Tagger, loss per epoch)`."""
    trainer = pycrfsuite.Trainer(algorithm=algorithm, verbose=False)
    trainer.set_params({**settings, "feature.possible_states": 1, "feature.possible_transitions": 1})
    for xseq, yseq in zip(X, y):
        trainer.append(xseq, yseq)
    libc().srand(seed)
    trainer.train(str(path))
    tagger = pycrfsuite.Tagger()
    tagger.open(str(path))
    return tagger, [iteration["loss"] for iteration in trainer.logparser.iterations]


def crfsuite_orders(seed, total, epochs):
    """The instance order of each of CRFsuite's epochs (`dataset_shuffle`:
    each position swapped with `rand() % N`, the permutation kept across epochs)."""
    rand = libc().rand
    libc().srand(seed)
    perm, orders = np.arange(total), []
    for _ in range(epochs):
        for i in range(total):
            j = rand() % total
            perm[[i, j]] = perm[[j, i]]
        orders.append(perm.copy())
    return orders


@pytest.mark.parametrize(
    ("algorithm", "settings"),
    [
        ("pa", {"type": 1, "c": 0.2, "error_sensitive": 1, "averaging": 1}),
        ("pa", {"type": 2, "c": 0.5, "error_sensitive": 0, "averaging": 0}),
        ("arow", {"variance": 0.7, "gamma": 1.5}),
    ],
)
def test_epochs_equal_crfsuite_given_its_shuffles(tmp_path, algorithm, settings):
    """With CRFsuite's own epoch orders, every epoch's loss (printed to 6
    decimals) and the final weights (dumped to 6) are CRFsuite's."""
    pycrfsuite = pytest.importorskip("pycrfsuite")
    X, y = feature_corpus(4, 8)
    epochs = 5
    tagger, losses = crfsuite_train(
        pycrfsuite, tmp_path / "model", X, y, algorithm, {**settings, "max_iterations": epochs}, seed=1234
    )
    label_names = list(dict.fromkeys(label for tags in y for label in tags))  # CRFsuite's ids: first seen first
    attributes = {name: i for i, name in enumerate(sorted({k for s in X for token in s for k in token}))}
    data = encode(X, y, attributes, label_names)
    start = {"emission": jnp.zeros((len(attributes), 3)), "transitions": jnp.zeros((3, 3))}
    if algorithm == "pa":
        epoch = functools.partial(
            training.pa_epoch_fn,
            pa_type=settings["type"],
            c=settings["c"],
            error_sensitive=bool(settings["error_sensitive"]),
        )
        state = training.pa_init(start)
    else:
        epoch = functools.partial(training.arow_epoch_fn, gamma=settings["gamma"])
        state = training.arow_init(start, settings["variance"])
    # The data in CRFsuite's order each epoch, passed as an argument: one compilation.
    run_epoch = jax.jit(lambda state, data: epoch(sparse_potentials, data)(state, jnp.int32(0)))
    for order, loss in zip(crfsuite_orders(1234, len(X), epochs), losses, strict=True):
        state, value = run_epoch(state, jax.tree_util.tree_map(lambda a: a[order], data))
        np.testing.assert_allclose(float(value), loss, atol=1e-6)
    if algorithm == "pa":
        params = training.pa_params(state, averaging=bool(settings["averaging"]))
    else:
        params = training.arow_params(state)
    info = tagger.info()
    emission, transitions = np.zeros((len(attributes), 3)), np.zeros((3, 3))
    for (name, label), weight in info.state_features.items():
        emission[attributes[name], label_names.index(label)] = weight
    for (before, after), weight in info.transitions.items():
        transitions[label_names.index(before), label_names.index(after)] = weight
    np.testing.assert_allclose(params["emission"], emission, atol=1e-6)
    np.testing.assert_allclose(params["transitions"], transitions, atol=1e-6)


def token_accuracy(predicted, gold):
    pairs = [(p, g) for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs)]
    return sum(p == g for p, g in pairs) / len(pairs)


@pytest.mark.parametrize(
    ("algorithm", "settings"), [("pa", {"type": 1, "c": 1.0, "error_sensitive": 1, "averaging": 1}), ("arow", {})]
)
def test_accuracy_agrees_with_crfsuite_shuffled_its_own_way(tmp_path, algorithm, settings):
    """Our shuffles (four keys, vmapped runs) against CRFsuite's (four seeds):
    mean token accuracies on held-out sentences within 3 points."""
    pycrfsuite = pytest.importorskip("pycrfsuite")
    X_train, y_train = feature_corpus(0, 200, spread=5)
    X_test, y_test = feature_corpus(1, 200, spread=5)
    epochs, runs = 10, 4
    theirs = []
    for seed in range(1, runs + 1):  # glibc's srand(0) is srand(1)
        tagger, _ = crfsuite_train(
            pycrfsuite, tmp_path / f"{seed}", X_train, y_train, algorithm, {**settings, "max_iterations": epochs}, seed
        )
        theirs.append(token_accuracy([tagger.tag(xseq) for xseq in X_test], y_test))

    label_names = ["L0", "L1", "L2"]
    attributes = {name: i for i, name in enumerate(sorted({k for s in X_train for token in s for k in token}))}
    train, test = encode(X_train, y_train, attributes, label_names), encode(X_test, y_test, attributes, label_names)
    start = {"emission": jnp.zeros((len(attributes), 3)), "transitions": jnp.zeros((3, 3))}
    trainer = training.passive_aggressive if algorithm == "pa" else training.arow
    keys = jax.random.split(jax.random.PRNGKey(0), runs)
    params = jax.jit(jax.vmap(lambda key: trainer(sparse_potentials, start, train, max_steps=epochs, key=key).params))(
        keys
    )
    decode = jax.vmap(
        lambda p: chain.viterbi(jax.vmap(lambda i: sparse_potentials(p, i))(test.inputs), test.lengths)[1]
    )
    ours = [
        token_accuracy([[label_names[k] for k in row[:n]] for row, n in zip(rows, np.asarray(test.lengths))], y_test)
        for rows in np.asarray(decode(params))
    ]
    assert 0.6 < np.mean(theirs) < 0.95  # a task neither solves nor fails
    assert abs(np.mean(ours) - np.mean(theirs)) < 0.03, (ours, theirs)
