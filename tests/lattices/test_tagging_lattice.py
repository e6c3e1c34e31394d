"""Word lattice x tagging model, against brute force over (string, tag sequence) pairs."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from lossfns.lattices import dag, neighbourhoods, tagging

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

K, V = 3, 5
VOCABULARY = ["The", "dog", "runs", "well-known", "42"]


def random_params(order, rng, spelling_size=0):
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape))
    return tagging.TaggerParams(
        normal(K, V),
        normal(K + 1, K),
        normal(K + 1, K + 1, K) if order == 2 else None,
        normal(spelling_size, K) if spelling_size else None,
    )


def brute_force_log_z(strings, params, dictionary, spelling_ids=None):
    """log sum over (string, allowed tag sequence) of exp(score), scored from the equations."""
    emission, bigram = np.asarray(params.emission), np.asarray(params.bigram)
    scores = []
    for string in strings:
        options = [np.flatnonzero(dictionary[w]) for w in string]
        for tags in itertools.product(*options):
            history = (K, K) + tags
            total = 0.0
            for i, (w, t) in enumerate(zip(string, tags)):
                total += emission[t, w] + bigram[history[i + 1], t]
                if params.trigram is not None:
                    total += np.asarray(params.trigram)[history[i], history[i + 1], t]
                if params.spelling is not None:
                    total += sum(np.asarray(params.spelling)[f, t] for f in spelling_ids[w] if f >= 0)
            scores.append(total)
    return np.logaddexp.reduce(scores) if scores else -np.inf


def dictionary(rng):
    allowed = rng.random((V, K)) < 0.5
    allowed[np.arange(V), rng.integers(0, K, V)] = True
    return allowed


WORD_LATTICES = {
    "sentence": lambda: dag.from_string([0, 1, 2, 1]),
    "trans1": lambda: neighbourhoods.trans1([0, 1, 2, 1]),
    "del1subseq": lambda: neighbourhoods.del1subseq([3, 1, 3]),
    "candidates": lambda: dag.from_strings([[4], [0, 2], [], [1, 1, 2]]),
}


CASES = [(name, order) for name in sorted(WORD_LATTICES) for order in (1, 2)]


@pytest.fixture(scope="module")
def intersected():
    """Every (word lattice, order) case with its own dictionary and weights,
    stacked into one padded batch (one compiled forward for all)."""
    spelling_ids, names = tagging.spelling_features(VOCABULARY)
    cases = []
    for name, order in CASES:
        rng = np.random.default_rng(len(name) + order)
        allowed = dictionary(rng)
        params = random_params(order, rng, spelling_size=len(names))
        tagged = tagging.intersect(WORD_LATTICES[name](), K, order=order, tag_dictionary=allowed)
        cases.append((tagged, params, allowed))
    batch = dag.stack([tagged.lattice for tagged, _, _ in cases])
    scores = [np.asarray(tagging.arc_scores(tagged, params, spelling_ids)) for tagged, params, _ in cases]
    scores = jnp.asarray(np.stack([np.pad(s, (0, batch.num_arcs - s.size)) for s in scores]))
    return cases, batch, scores, spelling_ids


def test_log_partition_equals_brute_force(intersected):
    cases, batch, scores, spelling_ids = intersected
    log_z = dag.log_partition(batch, scores)
    for (name, _), (tagged, params, allowed), value in zip(CASES, cases, log_z):
        expected = brute_force_log_z(dag.enumerate_strings(WORD_LATTICES[name]()), params, allowed, spelling_ids)
        np.testing.assert_allclose(value, expected, rtol=1e-10)
        # Each (string, tags) pair lies on exactly one path of the intersection.
        paths = dag.enumerate_paths(tagged.lattice)
        pairs = {
            (tuple(int(tagged.word[a]) for a in p), tuple(int(tagged.lattice.symbol[a]) for a in p)) for p in paths
        }
        assert len(pairs) == len(paths)


@pytest.mark.slow
def test_gradients_in_parameters():
    rng = np.random.default_rng(0)
    tagged = tagging.intersect(neighbourhoods.del1word([0, 1, 2]), K, order=2, tag_dictionary=dictionary(rng))
    params = random_params(2, rng)
    check_grads(
        lambda p: dag.log_partition(tagged.lattice, tagging.arc_scores(tagged, p)),
        (params,),
        order=1,
        modes=("rev",),
        eps=1e-5,
    )


def test_batched_arc_scores_match_unbatched(intersected):
    """`arc_scores` of the stacked batch (shared weights) equals per-lattice scores."""
    cases, _, _, spelling_ids = intersected
    second_order = [tagged for (_, order), (tagged, _, _) in zip(CASES, cases) if order == 2]
    params = cases[CASES.index(("sentence", 2))][1]  # with spelling weights
    batched = np.asarray(tagging.arc_scores(tagging.stack(second_order), params, spelling_ids))
    for row, tagged in zip(batched, second_order):
        single = np.asarray(tagging.arc_scores(tagged, params, spelling_ids))
        np.testing.assert_allclose(row[: single.size], single)
        assert not row[single.size :].any()


def test_viterbi_reads_tags():
    params = tagging.init_params(K, V)._replace(emission=jnp.asarray(np.eye(K, V) * 5.0))
    tagged = tagging.intersect(dag.from_string([0, 1, 2]), K)
    score, _, tags = dag.viterbi(tagged.lattice, tagging.arc_scores(tagged, params))
    assert tags.tolist() == [0, 1, 2] and np.isclose(score, 15.0)


def test_spelling_features():
    ids, names = tagging.spelling_features(VOCABULARY)
    features = lambda w: {names[i] for i in ids[VOCABULARY.index(w)] if i >= 0}
    assert features("The") == {"suffix1:e", "suffix2:he", "suffix3:The", "capitalized"}
    assert {"hyphen", "suffix3:own"} <= features("well-known")
    assert features("42") == {"suffix1:2", "suffix2:42", "digit"}


def test_bad_input():
    with pytest.raises(ValueError, match="order"):
        tagging.intersect(dag.from_string([0]), K, order=3)
    with pytest.raises(ValueError, match="tag_dictionary"):
        tagging.intersect(dag.from_string([0]), K, tag_dictionary=np.ones((V, K + 1), bool))
    with pytest.raises(ValueError, match="outside"):
        tagging.intersect(dag.from_string([9]), K, tag_dictionary=np.ones((V, K), bool))
    tagged = tagging.intersect(dag.from_string([0]), K)
    with pytest.raises(ValueError, match="order=2"):
        tagging.arc_scores(tagged, random_params(2, np.random.default_rng(0)))


def test_packed_tagged_lattices_equal_brute_force():
    """`tagging.pack` keeps each lattice's arcs (word, history) in order: packed
    arc scores and per-lattice log Z equal the brute force, for both orders."""
    rng = np.random.default_rng(11)
    allowed = dictionary(rng)
    for order in (1, 2):
        params = random_params(order, rng)
        tagged = [
            tagging.intersect(WORD_LATTICES[name](), K, order=order, tag_dictionary=allowed, as_numpy=name == "trans1")
            for name in sorted(WORD_LATTICES)
        ]
        packed = tagging.pack(tagged, num_lattices=len(tagged) + 1)
        log_z = dag.packed_log_partition(packed.lattice, tagging.arc_scores(packed, params))
        for name, value in zip(sorted(WORD_LATTICES), log_z):
            np.testing.assert_allclose(
                value, brute_force_log_z(dag.enumerate_strings(WORD_LATTICES[name]()), params, allowed), rtol=1e-9
            )
        assert float(log_z[-1]) == 0.0  # the padding row
