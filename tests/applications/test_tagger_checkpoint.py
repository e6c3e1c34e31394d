"""Resumable `Tagger.fit`: a training run killed with SIGKILL in a subprocess
resumes from its checkpoint directory and ends bit-identical to an
uninterrupted run; a finished run is not retrained; a checkpoint written for
another corpus is refused. Run as a script, this file is the subprocess."""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lossfns import checkpoint
from lossfns.corpora import Sentence
from lossfns.tagger import Tagger

SCRIPT = Path(__file__).resolve()
TEMPLATES = "U00:%x[0,0]\nU01:%x[-1,0]\nU02:%x[1,0]\nB\n"
ITERATIONS = 40  # many more than the kill point: the subprocess runs on while the test polls


def _corpus(seed: int, size: int = 30):
    """Sentences over a 12-word vocabulary; a word's label depends on it and its left neighbour."""
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(size):
        words = [f"w{int(i)}" for i in rng.integers(0, 12, size=rng.integers(1, 9))]
        labels = [
            "B-X" if w in ("w1", "w2") else "I-X" if i and words[i - 1] in ("w1", "w2") and w < "w6" else "O"
            for i, w in enumerate(words)
        ]
        sentences.append(Sentence(tuple((w,) for w in words), tuple(labels)))
    return sentences


def _tagger():
    # tol = 0: run every iteration, so the kill lands mid-run.
    return Tagger(TEMPLATES, l1=0.05, l2=0.1, max_iterations=ITERATIONS, tol=0.0, num_buckets=2, progress=False)


def _environment():
    # The subprocess computes under the same settings as this test process (x64 off, see conftest).
    return dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="0")


def _weights(tagger):
    return [np.asarray(x) for x in (tagger.model.emission, tagger.model.transitions, tagger.model.start)]


@pytest.mark.slow
def test_killed_fit_resumes_bit_identical(tmp_path):
    from tests.conftest import sigkill_after  # not at the top: this file also runs as the training script

    directory = tmp_path / "checkpoints"
    kill_after = random.Random().randrange(2, 10)  # a different point every run; reported on failure
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(directory)],
        env=_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def wait_until_due():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            latest = checkpoint.latest_checkpoint(directory) if directory.exists() else None
            if latest is not None and int(latest.stem.split("-")[1]) >= kill_after:
                return
            time.sleep(0.02)

    assert sigkill_after(process, wait_until_due), f"the run ended before the kill: {process.stderr.read()[-2000:]}"
    process.stderr.close()
    done = int(checkpoint.latest_checkpoint(directory).stem.split("-")[1])
    assert kill_after <= done < ITERATIONS, f"killed after iteration {done} (aimed at {kill_after})"

    resumed = _tagger().fit(_corpus(0), checkpoint_dir=directory, checkpoint_every=1)
    reference = _tagger().fit(_corpus(0))
    assert len(resumed.history) == len(reference.history) == ITERATIONS
    assert resumed.history == reference.history
    for a, b in zip(_weights(resumed), _weights(reference)):
        np.testing.assert_array_equal(a, b)
    assert np.count_nonzero(_weights(reference)[0]) > 0  # training moved the weights: the test can fail

    # A finished run found in the directory is returned as it is, not retrained.
    again = _tagger().fit(_corpus(0), checkpoint_dir=directory, checkpoint_every=1)
    assert again.history == reference.history
    for a, b in zip(_weights(again), _weights(reference)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_checkpoint_of_another_corpus_is_refused(tmp_path):
    corpus = _corpus(0, size=8)
    _tagger().fit(corpus, checkpoint_dir=tmp_path, checkpoint_every=5)
    reordered = corpus[::-1]  # the same parameter shapes: refused by the fingerprint
    smaller = corpus[:-1]  # fewer features: refused by the parameter shapes
    for other in (reordered, smaller):
        with pytest.raises(checkpoint.CheckpointError, match="other data or other training settings"):
            _tagger().fit(other, checkpoint_dir=tmp_path, checkpoint_every=5)


def test_checkpoint_every_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="checkpoint_every must be an int >= 1"):
        _tagger().fit(_corpus(0, size=2), checkpoint_dir=tmp_path, checkpoint_every=0)


if __name__ == "__main__":
    # The subprocess of the kill test: checkpoint after every iteration.
    _tagger().fit(_corpus(0), checkpoint_dir=sys.argv[1], checkpoint_every=1)
