"""Bad input to `python -m experiments`: refused before any work, with exit
status 2 and a message naming the option.

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import pytest

from tests.bad_inputs import assert_raises_a_named_error, case_ids, command_line


def _experiments(tmp_path, *arguments):
    from experiments.__main__ import main

    return command_line(main, [*arguments, "--no-progress", "--out", str(tmp_path / "out")])


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
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
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)
