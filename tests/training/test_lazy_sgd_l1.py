"""Lazy SGD-L1 (sparse rows, Tsuruoka's cumulative penalty caught up when a
row is touched) against the dense `sgd_l1` on the same minibatches, against
a dense reference that applies the L2 step only to the touched rows, against
OWL-QN's optimum, and resumed mid-epoch from a `lossfns.checkpoint`."""

from __future__ import annotations

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lossfns import checkpoint, optimizers, training
from lossfns.features.index import FeatureBatch
from lossfns.losses import sequence
from lossfns.models.linear_chain import LinearChainModel
from lossfns.optimizers.sgd_l1 import take_rows
from lossfns.training.sgd_l1 import chain_batch_rows

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

N, T, F, F2, K, K2, L = 12, 5, 3, 1, 40, 6, 3
BATCH_SIZE = 2
L1 = 0.3


def _loss(model, batch):
    potentials = model(batch.unigram_ids, batch.pair_ids)
    return jnp.sum(sequence.sequence_log_loss(potentials, batch.labels, batch.lengths))


def _planted(pairs: bool) -> FeatureBatch:
    """Planted sentences: labels follow the first observation of each token,
    so that the L1 optimum has exact zeros and non-zeros."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, T + 1, N)
    ids = rng.integers(0, K, (N, T, F))
    labels = ids[..., 0] % L
    valid = np.arange(T) < lengths[:, None]
    ids = np.where(valid[..., None], ids, -1)
    ids[:, :, 2] = np.where(rng.random((N, T)) < 0.3, -1, ids[:, :, 2])  # ragged tokens
    pair_ids = np.where(valid[..., None], rng.integers(0, K2, (N, T, F2)), -1) if pairs else np.zeros((N, T, 0))
    return FeatureBatch(
        jnp.asarray(ids, jnp.int32),
        jnp.asarray(pair_ids, jnp.int32),
        jnp.asarray(lengths, jnp.int32),
        jnp.asarray(np.where(valid, labels, -1), jnp.int32),
    )


# Built once, outside any trace (closed over by the jitted runs below).
_DATA = {pairs: _planted(pairs) for pairs in (True, False)}


def _data(pairs: bool = True) -> FeatureBatch:
    return _DATA[pairs]


def _model(pairs: bool = True) -> LinearChainModel:
    return LinearChainModel.zeros(K, L, K2 if pairs else 0, dtype=jnp.float64)


SCHEDULE = optimizers.decaying_schedule(0.02, steps_per_epoch=N // BATCH_SIZE, decay_per_epoch=0.9)


def _lazy(l2, epochs, segments=1, pairs=True):
    bounds = training.max_rows_per_batch(_data(pairs), BATCH_SIZE)  # from the concrete data
    return _lazy_run(l2, epochs, segments, pairs, bounds)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _lazy_run(l2, epochs, segments, pairs, bounds):
    data, model = _data(pairs), _model(pairs)
    optimizer = optimizers.lazy_sgd_l1(SCHEDULE, L1, l2)
    step_fn = training.lazy_epoch_step_fn(
        _loss,
        optimizer,
        data,
        batch_size=BATCH_SIZE,
        max_rows=bounds,
        segments_per_epoch=segments,
        penalty=optimizers.elastic_net_penalty(L1, l2),
    )
    loop = optimizers.init_loop((model, optimizer.init(model), jax.random.PRNGKey(3)), epochs * segments)
    return optimizers.run_loop(step_fn, loop, epochs * segments, optimizers.relative_change_below(0.0))


@functools.partial(jax.jit, static_argnames=("epochs",))
def _dense(epochs):
    data, model = _data(), _model()
    optimizer = optimizers.sgd_l1(SCHEDULE, L1)
    step_fn = optimizers.epoch_step_fn(
        _loss, optimizer, data, batch_size=BATCH_SIZE, penalty=optimizers.elastic_net_penalty(L1)
    )
    loop = optimizers.init_loop((model, optimizer.init(model), jax.random.PRNGKey(3)), epochs)
    return optimizers.run_loop(step_fn, loop, epochs, optimizers.relative_change_below(0.0))


def _assert_models_close(a, b, atol=1e-12):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


def test_lazy_equals_dense_without_l2():
    # Clipping at a non-decreasing total is cumulative, so catching a row up
    # when it is touched gives the weights of clipping every row every step.
    lazy, dense = _lazy(0.0, 3), _dense(3)
    _assert_models_close(lazy.inner[0], dense.inner[0])
    np.testing.assert_allclose(np.asarray(lazy.trace), np.asarray(dense.trace), rtol=1e-12)
    weights = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(lazy.inner[0])])
    assert 0 < np.count_nonzero(weights) < weights.size  # the clipping did something, and not everything


def test_lazy_equals_dense_steps_restricted_to_the_touched_rows():
    # Reference: the dense optimizer (no L2) fed the batch gradient plus the L2
    # term on the rows the batch uses, over the same minibatches.
    l2, data, model, key = 0.5, _data(), _model(), jax.random.PRNGKey(3)
    dense = optimizers.sgd_l1(SCHEDULE, L1)
    state = dense.init(model)
    grad = jax.jit(jax.grad(_loss))

    @jax.jit
    def step(model, state, batch):
        gradient = jax.tree_util.tree_map(lambda g: g * (N / BATCH_SIZE), grad(model, batch))
        used = lambda ids, size: (
            jnp.zeros(size, bool).at[jnp.where(ids < 0, size, ids).reshape(-1)].set(True, mode="drop")
        )
        touched = dataclasses.replace(
            model,
            emission=used(batch.unigram_ids, K)[:, None],
            pair_emission=used(batch.pair_ids, K2)[:, None, None],
            transitions=jnp.ones((), bool),
            start=jnp.ones((), bool),
        )
        gradient = jax.tree_util.tree_map(lambda g, w, t: g + l2 * jnp.where(t, w, 0.0), gradient, model, touched)
        updates, state = dense.update(gradient, state, model)
        return jax.tree_util.tree_map(jnp.add, model, updates), state

    for epoch in range(2):
        order = np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), N))
        for index in range(N // BATCH_SIZE):
            examples = order[index * BATCH_SIZE : (index + 1) * BATCH_SIZE]
            model, state = step(model, state, jax.tree_util.tree_map(lambda x: x[examples], data))
    _assert_models_close(_lazy(l2, 2).inner[0], model)


def test_reaches_owlqn_optimum_on_a_strongly_convex_problem():
    # Full-batch steps at a constant rate with an L2 term (strongly convex, one
    # optimum): every row is touched at every step, so the lazy L2 is the exact
    # L2 and the cumulative penalty's fixed points are the objective's minimiser.
    l2, data, model = 0.5, _data(pairs=False), _model(pairs=False)
    penalty = optimizers.elastic_net_penalty(L1, l2)
    owlqn = jax.jit(
        lambda: optimizers.minimize(
            lambda m: _loss(m, data), model, optimizers.owlqn(L1, l2), max_steps=300, tol=1e-14, penalty=penalty
        )
    )()
    optimizer = optimizers.lazy_sgd_l1(0.05, L1, l2)
    step_fn = training.lazy_epoch_step_fn(
        _loss, optimizer, data, batch_size=N, max_rows=training.max_rows_per_batch(data, N), penalty=penalty
    )
    loop = optimizers.init_loop((model, optimizer.init(model), jax.random.PRNGKey(3)), 600)
    lazy = jax.jit(lambda: optimizers.run_loop(step_fn, loop, 600, optimizers.relative_change_below(0.0)))()
    best = float(_loss(owlqn.params, data) + penalty(owlqn.params))
    np.testing.assert_allclose(float(lazy.value), best, rtol=1e-10)
    _assert_models_close(lazy.inner[0], owlqn.params, atol=1e-4)
    emission = np.asarray(owlqn.params.emission)
    assert 0 < np.count_nonzero(emission) < emission.size  # the optimum has zeros and non-zeros
    np.testing.assert_array_equal(np.asarray(lazy.inner[0].emission) != 0, emission != 0)


def test_resumes_mid_epoch_from_a_checkpoint(tmp_path):
    # 2 epochs in 3 segments; interrupted after 2 segments (inside epoch 1).
    data, model = _data(), _model()
    optimizer = optimizers.lazy_sgd_l1(SCHEDULE, L1, 0.1)
    step_fn = training.lazy_epoch_step_fn(
        _loss,
        optimizer,
        data,
        batch_size=BATCH_SIZE,
        max_rows=training.max_rows_per_batch(data, BATCH_SIZE),
        segments_per_epoch=3,
    )
    loop = optimizers.init_loop((model, optimizer.init(model), jax.random.PRNGKey(3)), 6)
    stop = optimizers.relative_change_below(0.0)
    run = jax.jit(lambda state, until: optimizers.run_loop(step_fn, state, until, stop))
    straight = run(loop, 6)
    path = checkpoint.save(tmp_path / "lazy.ckpt", run(loop, 2))
    resumed = run(checkpoint.load(path, loop), 6)
    for a, b in zip(jax.tree_util.tree_leaves(straight), jax.tree_util.tree_leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Segments do not change the trajectory (flushing between them is a no-op on it).
    _assert_models_close(straight.inner[0], _lazy(0.1, 2).inner[0])


def test_batch_rows_give_the_loss_and_the_gradient_rows_jit_and_not():
    data, model = _data(), _model()
    model = jax.tree_util.tree_map(lambda x: jax.random.normal(jax.random.PRNGKey(1), x.shape, x.dtype), model)
    batch = jax.tree_util.tree_map(lambda x: x[:3], data)
    bounds = training.max_rows_per_batch(data, 3)
    dense = jax.grad(_loss)(model, batch)
    for batch_rows in (chain_batch_rows, jax.jit(chain_batch_rows, static_argnums=2)):
        rows, local_batch = batch_rows(model, batch, bounds)
        local_model = take_rows(model, rows)
        np.testing.assert_allclose(_loss(local_model, local_batch), _loss(model, batch), rtol=1e-12)
        local = jax.grad(_loss)(local_model, local_batch)
        scattered = jax.tree_util.tree_map(
            lambda g, r, d: jnp.zeros_like(d).at[r].add(g, mode="drop"), local, rows, dense
        )
        _assert_models_close(scattered, dense)


def test_rejects_too_many_segments_and_other_models():
    data = _data()
    optimizer = optimizers.lazy_sgd_l1(0.1, L1)
    bounds = training.max_rows_per_batch(data, BATCH_SIZE)
    with pytest.raises(ValueError, match="segments_per_epoch"):
        training.lazy_epoch_step_fn(
            _loss, optimizer, data, batch_size=BATCH_SIZE, max_rows=bounds, segments_per_epoch=N
        )
    step_fn = training.lazy_epoch_step_fn(_loss, optimizer, data, batch_size=BATCH_SIZE, max_rows=bounds)
    with pytest.raises(TypeError, match="LinearChainModel"):
        step_fn(({"w": jnp.zeros(3)}, None, jax.random.PRNGKey(0)), jnp.zeros((), jnp.int32))


def test_the_recorded_objective_can_be_given():
    """`objective=` replaces `fun(model, data)` in the recorded value (the
    experiment gives the packed corpus's loss); the trajectory is the same."""
    data, model = _data(), _model()
    optimizer = optimizers.lazy_sgd_l1(0.05, L1)
    options = dict(batch_size=N, max_rows=training.max_rows_per_batch(data, N))
    inner = (model, optimizer.init(model), jax.random.PRNGKey(3))
    plain = training.lazy_epoch_step_fn(_loss, optimizer, data, **options)(inner, 0)
    doubled = lambda m: 2.0 * _loss(m, data)
    given = training.lazy_epoch_step_fn(_loss, optimizer, data, objective=doubled, **options)(inner, 0)
    _assert_models_close(given[0][0], plain[0][0], atol=0.0)
    np.testing.assert_allclose(float(given[1]), 2.0 * float(plain[1]), rtol=1e-12)


def _masks(all_true: bool):
    """Emission, pair and transition masks: random (about 60% kept) or all True."""
    rng = np.random.default_rng(5)
    keep = lambda shape: np.ones(shape, bool) if all_true else rng.random(shape) < 0.6
    return keep((K, L)), keep((K2, L, L)), keep((L, L))


def _masked_model(all_true: bool, sparse: bool = False) -> LinearChainModel:
    """sparse: the pair weights in the sparse form with a support per
    position (`pair_slots`, one pair test per position), else dense."""
    emission, pair, transitions = _masks(all_true)
    model = LinearChainModel.zeros(K, L, K2, emission_mask=emission, dtype=jnp.float64)
    model = model.with_pair_mask(pair, max_sparse_fraction=1.0 if sparse else 0.0)
    assert (model.pair_slots is not None) == sparse
    return model.with_transition_mask(transitions)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _masked_lazy(all_true, bounds, sparse=False):
    data, model = _data(), _masked_model(all_true, sparse)
    optimizer = optimizers.lazy_sgd_l1(SCHEDULE, L1)
    step_fn = training.lazy_epoch_step_fn(
        _loss, optimizer, data, batch_size=BATCH_SIZE, max_rows=bounds, penalty=optimizers.elastic_net_penalty(L1)
    )
    loop = optimizers.init_loop((model, optimizer.init(model), jax.random.PRNGKey(3)), 2)
    return optimizers.run_loop(step_fn, loop, 2, optimizers.relative_change_below(0.0))


@jax.jit
def _masked_dense():
    """The dense oracle of a masked lazy run: `sgd_l1` on the float weights,
    the gradient masked (the loss reads the weights through the masks) and
    the penalty only on the weights that exist."""
    data, model = _data(), _masked_model(False)
    weights, fixed = eqx.partition(model, eqx.is_inexact_array)
    exists = model.weight_masks()
    exists = dataclasses.replace(
        weights,
        emission=exists.emission,
        transitions=exists.transitions,
        start=jnp.ones((L,), bool),
        pair_emission=exists.pair_emission,
    )
    masked = lambda w: jax.tree_util.tree_map(lambda x, keep: jnp.where(keep, x, 0.0), w, exists)
    fun = lambda w, batch: _loss(eqx.combine(masked(w), fixed), batch)
    optimizer = optimizers.sgd_l1(SCHEDULE, L1, mask=lambda _: exists)  # a Module is callable: pass it as one
    step_fn = optimizers.epoch_step_fn(
        fun, optimizer, data, batch_size=BATCH_SIZE, penalty=optimizers.elastic_net_penalty(L1)
    )
    loop = optimizers.init_loop((weights, optimizer.init(weights), jax.random.PRNGKey(3)), 2)
    return optimizers.run_loop(step_fn, loop, 2, optimizers.relative_change_below(0.0)), exists


def test_all_true_masks_train_the_unmasked_models_weights():
    bounds = training.max_rows_per_batch(_data(), BATCH_SIZE)
    masked, plain = _masked_lazy(True, bounds), _lazy(0.0, 2)
    _assert_models_close(eqx.filter(masked.inner[0], eqx.is_inexact_array), plain.inner[0], atol=0.0)
    np.testing.assert_array_equal(np.asarray(masked.trace), np.asarray(plain.trace))


def test_masked_run_equals_the_dense_run_with_a_masked_gradient():
    """Lazy SGD-L1 on a model with emission, pair and transition masks
    (float64, jitted, without L2 so that lazy and dense agree) against
    `sgd_l1` on the dense weights with the gradient and penalty masked:
    the same weights and objectives; the weights outside the masks are
    exactly 0, some inside are not."""
    bounds = training.max_rows_per_batch(_data(), BATCH_SIZE)
    lazy = _masked_lazy(False, bounds)
    dense, exists = _masked_dense()
    weights = eqx.filter(lazy.inner[0], eqx.is_inexact_array)
    _assert_models_close(weights, dense.inner[0])
    np.testing.assert_allclose(np.asarray(lazy.trace), np.asarray(dense.trace), rtol=1e-12)
    for leaf, keep in zip(jax.tree_util.tree_leaves(weights), jax.tree_util.tree_leaves(exists)):
        leaf, keep = np.asarray(leaf), np.broadcast_to(np.asarray(keep), np.shape(leaf))
        assert not keep.all() or leaf.ndim == 1  # every table but start has weights that do not exist
        np.testing.assert_array_equal(leaf[~keep], 0.0)
    assert (
        np.count_nonzero(np.asarray(weights.emission)) > 0 and np.count_nonzero(np.asarray(weights.pair_emission)) > 0
    )
    # The penalty counts only weights that exist: none outside, so it equals the dense objective's.
    q = lazy.inner[1].applied_penalty
    np.testing.assert_array_equal(np.asarray(q.emission)[~np.asarray(exists.emission)], 0.0)


def test_sparse_pair_form_trains_the_same_weights_as_the_dense_form():
    """The lazy rows of a model whose pair weights take the sparse form with
    a support per position (`pair_slots`: the rows a step gathers are the
    pair tests' slots) against the same run on the dense `[T, L, L]` form:
    the same weights and objectives, float64."""
    bounds = training.max_rows_per_batch(_data(), BATCH_SIZE)
    sparse, dense = _masked_lazy(False, bounds, True), _masked_lazy(False, bounds, False)
    _assert_models_close(
        eqx.filter(sparse.inner[0], eqx.is_inexact_array), eqx.filter(dense.inner[0], eqx.is_inexact_array)
    )
    np.testing.assert_allclose(np.asarray(sparse.trace), np.asarray(dense.trace), rtol=1e-12)
    assert np.count_nonzero(np.asarray(sparse.inner[0].pair_emission)) > 0


def test_lazy_calibration_chooses_the_dense_calibrations_rate():
    """`calibrate_learning_rate(..., max_rows=)` runs the candidates' lazy
    epochs one after another; without L2 each is the dense epoch, so the
    chosen rate is the dense (vmapped) calibration's, here neither the
    largest nor the smallest candidate, jitted or not."""
    data, model = _data(), _model()
    bounds = training.max_rows_per_batch(data, BATCH_SIZE)
    candidates = (30.0, 3.0, 0.3, 0.03, 0.003)
    options = dict(key=jax.random.PRNGKey(1), batch_size=BATCH_SIZE, sample_size=8, candidates=candidates)
    dense = training.calibrate_learning_rate(_loss, model, data, L1, **options)
    lazy = training.calibrate_learning_rate(_loss, model, data, L1, max_rows=bounds, **options)
    jitted = jax.jit(lambda m: training.calibrate_learning_rate(_loss, m, data, L1, max_rows=bounds, **options))(model)
    assert float(lazy) == float(dense) == float(jitted)
    assert candidates[0] / N > float(lazy) > candidates[-1] / N
    with pytest.raises(ValueError, match="mask: lazy calibration"):
        training.calibrate_learning_rate(_loss, model, data, L1, max_rows=bounds, mask=model, **options)


def _long_planted(num_positions: int) -> FeatureBatch:
    """`_planted`'s sentences padded out to `num_positions` (lengths kept)."""
    data = _data()
    pad = num_positions - T
    widen = lambda x, axis_pad: jnp.pad(x, ((0, 0), (0, pad)) + axis_pad, constant_values=-1)
    return data._replace(
        unigram_ids=widen(data.unigram_ids, ((0, 0),)),
        pair_ids=widen(data.pair_ids, ((0, 0),)),
        labels=widen(data.labels, ()),
    )


@pytest.mark.parametrize("batch_size", [1, BATCH_SIZE])
def test_length_tiers_follow_the_whole_width_trajectory(batch_size):
    """Each minibatch runs on the narrowest tier that holds its longest
    sentence (here widths 2 and 4 of 21, sentences of 1 to 5 tokens): the
    trajectory of running every step at the full width, jit and vmapped over
    two keys; the step is traced at every tier (the cut is real)."""
    data = _long_planted(21)
    bounds = training.max_rows_per_batch(data, batch_size)
    widths = set()

    def loss(model, batch):
        widths.add(batch.unigram_ids.shape[1])
        return _loss(model, batch)

    def run(key, tiers):
        optimizer = optimizers.lazy_sgd_l1(SCHEDULE, L1, 0.1)
        step_fn = training.lazy_epoch_step_fn(
            loss, optimizer, data, batch_size=batch_size, max_rows=bounds, length_tiers=tiers
        )
        loop = optimizers.init_loop((_model(), optimizer.init(_model()), key), 2)
        return optimizers.run_loop(step_fn, loop, 2, optimizers.relative_change_below(0.0))

    keys = jnp.stack([jax.random.PRNGKey(3), jax.random.PRNGKey(4)])
    whole = jax.jit(jax.vmap(lambda key: run(key, ())))(keys)
    assert widths == {21}
    tiered = jax.jit(jax.vmap(lambda key: run(key, (2, 4, 40))))(keys)
    assert widths == {2, 4, 21}
    _assert_models_close(tiered.inner[0], whole.inner[0], atol=1e-12)
    np.testing.assert_allclose(np.asarray(tiered.trace), np.asarray(whole.trace), rtol=1e-12)
    widths.clear()
    single = jax.jit(lambda: run(jax.random.PRNGKey(3), None))()  # None: powers of 2 from 16, so 16 and 21
    assert widths == {16, 21}
    _assert_models_close(single.inner[0], jax.tree_util.tree_map(lambda x: x[0], whole.inner[0]), atol=1e-12)


def test_length_tiers_must_be_positive_ints():
    data, optimizer = _data(), optimizers.lazy_sgd_l1(0.1, L1)
    bounds = training.max_rows_per_batch(data, BATCH_SIZE)
    make = lambda tiers: training.lazy_epoch_step_fn(
        _loss, optimizer, data, batch_size=BATCH_SIZE, max_rows=bounds, length_tiers=tiers
    )
    with pytest.raises(ValueError, match="length_tiers must be an int >= 1, got 0"):
        make((0, 3))
    with pytest.raises(TypeError, match="length_tiers"):
        make((2.5,))
