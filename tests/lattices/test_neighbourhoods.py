"""Neighbourhood lattices against brute-force constructions of the sets.

The oracles build each set by a different route than the library (index
combinations and permutations filtered by a membership test), for every
sentence of length 1 to 6 with distinct words and with repeated words.
"""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from lossfns.lattices import dag, neighbourhoods, tagging

pytestmark = pytest.mark.float64  # oracles to 1e-10 and finite differences (tests/conftest.py)

SENTENCES = [
    (3,),
    (3, 3),
    (1, 2),
    (1, 2, 3),
    (1, 1, 1),
    (1, 2, 1),
    (1, 2, 3, 4),
    (2, 2, 3, 3),
    (1, 2, 3, 4, 5),
    (1, 2, 1, 2, 1),
    (1, 2, 3, 4, 5, 6),
    (4, 1, 4, 1, 4, 4),
]


def oracle_del1word(x):
    return {x} | set(itertools.combinations(x, len(x) - 1))


def _one_adjacent_swap(x, s):
    differ = [i for i in range(len(x)) if x[i] != s[i]]
    return differ == [] or (
        len(differ) == 2 and differ[1] == differ[0] + 1 and (s[differ[0]], s[differ[1]]) == (x[differ[1]], x[differ[0]])
    )


def oracle_trans1(x):
    return {s for s in itertools.permutations(x) if _one_adjacent_swap(x, s)}


def oracle_del1subseq(x):
    m = len(x)
    out = {x}
    for size in range(1, m + 1):  # keep `size` >= 1 words
        for kept in itertools.combinations(range(m), size):
            deleted = sorted(set(range(m)) - set(kept))
            if deleted and deleted[-1] - deleted[0] + 1 == len(deleted):  # one contiguous block
                out.add(tuple(x[i] for i in kept))
    return out


def assert_deterministic(lattice):
    valid = np.asarray(lattice.arc_valid)
    out = list(zip(np.asarray(lattice.src)[valid].tolist(), np.asarray(lattice.symbol)[valid].tolist()))
    assert len(out) == len(set(out)), "two arcs leave one state with the same symbol"


@pytest.mark.parametrize("sentence", SENTENCES, ids=str)
@pytest.mark.parametrize(
    "name, oracle",
    [
        ("del1word", oracle_del1word),
        ("trans1", oracle_trans1),
        ("delortrans1", lambda x: oracle_del1word(x) | oracle_trans1(x)),
        ("del1subseq", oracle_del1subseq),
    ],
)
def test_neighbourhood_strings(name, oracle, sentence):
    lattice = getattr(neighbourhoods, name)(sentence)
    strings = dag.enumerate_strings(lattice)
    assert len(strings) == len(set(strings)), "a string lies on two paths"
    assert set(strings) == oracle(sentence)
    assert sentence in strings
    assert_deterministic(lattice)


def test_sizes_for_distinct_words():
    for m in range(1, 7):
        x = tuple(range(m))
        assert len(dag.enumerate_paths(neighbourhoods.del1word(x))) == m + 1
        assert len(dag.enumerate_paths(neighbourhoods.trans1(x))) == m
        assert len(dag.enumerate_paths(neighbourhoods.del1subseq(x))) == 1 + m * (m + 1) // 2 - 1
    # Minimal acceptors stay small: DEL1WORD of 30 distinct words is O(m), not O(m^2).
    assert neighbourhoods.del1word(tuple(range(30))).num_arcs <= 3 * 30


@pytest.mark.parametrize("sentence", [(0,), (1, 0), (2, 0, 2)], ids=str)
def test_length_is_all_strings_of_length_m(sentence):
    lattice = neighbourhoods.length(sentence, 3)
    assert lattice.num_arcs == 3 * len(sentence)
    assert sorted(dag.enumerate_strings(lattice)) == sorted(itertools.product(range(3), repeat=len(sentence)))
    assert_deterministic(lattice)
    subset = neighbourhoods.length(sentence, [2, 0, 1, 5])
    assert len(dag.enumerate_paths(subset)) == 4 ** len(sentence)


def test_length_log_partition_closed_form():
    """Without transitions, Z(LENGTH) = (sum_{w, t allowed} exp emission[t, w])^m."""
    rng = np.random.default_rng(0)
    K, V, m = 3, 5, 4
    dictionary = rng.random((V, K)) < 0.6
    dictionary[:, 0] = True
    params = tagging.init_params(K, V)._replace(emission=jnp.asarray(rng.normal(size=(K, V))))
    tagged = tagging.intersect(neighbourhoods.length((1, 4, 1, 2), V), K, tag_dictionary=dictionary)
    log_z = dag.log_partition(tagged.lattice, tagging.arc_scores(tagged, params))
    expected = m * np.log(np.sum(np.exp(np.asarray(params.emission).T) * dictionary))
    np.testing.assert_allclose(log_z, expected, rtol=1e-10)


def test_bad_input():
    with pytest.raises(ValueError, match="sentence"):
        neighbourhoods.del1word([[1, 2]])
    with pytest.raises(ValueError, match="sentence"):
        neighbourhoods.trans1([1.5, 2.0])
    with pytest.raises(ValueError, match="missing"):
        neighbourhoods.length([1, 7], 5)
