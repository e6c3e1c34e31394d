"""Bad input to lossfns.semirings: each case raises the stated exception
type with a message naming the offending argument.

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import pytest

from lossfns import semirings
from tests.bad_inputs import assert_raises_a_named_error, case_ids

# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    ("kmax-k-zero", "k = 0 for the k-max semiring", lambda _: semirings.KMax(0), ValueError, ["k", "0"]),
    ("kmax-k-float", "a float k", lambda _: semirings.KMax(2.5), ValueError, ["k", "2.5"]),
    ("kmax-k-bool", "k = True for the k-max semiring", lambda _: semirings.KMax(True), ValueError, ["k", "True"]),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)
