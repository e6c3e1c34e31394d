"""The README's Python examples run as written (the CoNLL training example,
which takes minutes, is exercised by tests/test_tagger.py instead)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
RUNNABLE = [code for code in BLOCKS if "conll2002(" not in code]


def test_readme_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(RUNNABLE)))
def test_readme_example_runs(index):
    code = RUNNABLE[index]
    exec(compile(code, f"README.md example {index}", "exec"), {})
