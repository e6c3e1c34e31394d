"""Bad input across the public API: each package's cases live beside its
tests (`tests/<package>/test_*_bad_inputs.py`, gathered by tests/bad_inputs.py);
here, what spans packages: the reliability page's table of every case
(docs/reliability.md), its count, numpy integers taken wherever ints are,
and the cases of lossfns.checkpoint (whose tests are tests/test_checkpoint.py).

`python tests/test_bad_inputs.py` prints the table in Markdown;
`python tests/test_bad_inputs.py --count` prints the page's count phrase.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest

if __name__ == "__main__":  # `tests` and `experiments` importable, as pytest's pythonpath makes them
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lossfns import checkpoint, optimizers, semirings
from lossfns.checkpoint import CheckpointError
from lossfns.lattices import chain
from tests import bad_inputs
from tests.bad_inputs import GOOD, T, assert_raises_a_named_error, case_ids, fifo, squares, within

TESTS = Path(__file__).resolve().parent


def _truncated_checkpoint(tmp_path):
    path = checkpoint.save(tmp_path / "state.ckpt", {"w": jnp.zeros(4)})
    path.write_bytes(path.read_bytes()[:-3])
    return checkpoint.load(path, like={"w": jnp.zeros(4)})


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    # --- lossfns.checkpoint ---
    (
        "checkpoint-truncated",
        "a truncated checkpoint file",
        _truncated_checkpoint,
        checkpoint.CheckpointError,
        ["state.ckpt", "truncated"],
    ),
    (
        "checkpoint-fifo",
        "checkpoint.load of a FIFO",
        lambda tmp: within(10, lambda: checkpoint.load(fifo(tmp, "pipe.ckpt"), like={"w": jnp.zeros(4)})),
        CheckpointError,
        ["pipe.ckpt", "FIFO"],
    ),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)


# ---------------------------------------------------------------------------
# The table of every case, and the reliability page's count of it
# ---------------------------------------------------------------------------


def test_every_file_of_cases_is_in_the_table():
    found = sorted(
        ".".join(path.relative_to(TESTS.parent).with_suffix("").parts) for path in TESTS.rglob("test_*bad_inputs.py")
    )
    assert found == sorted(bad_inputs.CASE_MODULES)


def test_the_table_is_large_enough_and_the_docs_count_it():
    cases, under_jit_cases = bad_inputs.all_cases()
    assert len(cases) >= 100
    ids = case_ids(cases) + case_ids(under_jit_cases)
    assert len(set(ids)) == len(ids), "case ids are unique across the files"
    reliability = (TESTS.parent / "docs" / "reliability.md").read_text(encoding="utf-8")
    phrase = bad_inputs.count_phrase()
    assert phrase in reliability, f"docs/reliability.md must say {phrase} (python tests/test_bad_inputs.py --count)"


# ---------------------------------------------------------------------------
# Numpy integers are ints wherever ints are (semirings, lattices, optimizers)
# ---------------------------------------------------------------------------


def test_numpy_integers_are_accepted_wherever_ints_are():
    scores, labels = chain.kbest(GOOD(), None, np.int64(2))
    assert scores.shape == (2, 2) and labels.shape == (2, 2, T)
    assert semirings.KMax(np.int32(3)).k == 3 and type(semirings.KMax(np.int32(3)).k) is int
    optimizers.owlqn(0.1, memory_size=np.int64(3), max_linesearch_steps=np.int16(4))
    result = optimizers.minimize(squares, jnp.ones(2), optax.sgd(0.1), max_steps=np.int64(3))
    assert result.trace.shape == (3,)


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] == ["--count"]:  # the reliability page's phrase
        sys.stdout.write(bad_inputs.count_phrase() + "\n")
    else:
        with tempfile.TemporaryDirectory() as directory:
            sys.stdout.write(bad_inputs.markdown_table(Path(directory)) + "\n")
