"""Every Python example of the README and of the documentation site
(docs/**/*.md) runs as written, each in a fresh namespace. Examples that need
a corpus are left to the tests of what they call: the CoNLL training example,
which takes minutes, is exercised by tests/applications/test_tagger.py, and the
sklearn-crfsuite drop-in, whose `X_train` comes from CoNLL-2002
(docs/getting-started.md shows how), by tests/applications/test_sklearn.py."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def _blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def _needs_a_corpus(code):
    uses_tutorial_data = re.search(r"\bX_train\b", code) and not re.search(r"\bX_train\b[^=\n]*=[^=]", code)
    return "conll2002(" in code or bool(uses_tutorial_data)


EXAMPLES = [
    (path.relative_to(ROOT).as_posix(), index, code)
    for path in PAGES
    for index, code in enumerate(_blocks(path))
    if not _needs_a_corpus(code)
]


def test_the_pages_have_examples():
    assert len(_blocks(ROOT / "README.md")) >= 2
    assert sum(1 for page, _, _ in EXAMPLES if page.startswith("docs/")) >= 10


@pytest.mark.parametrize("page, index, code", EXAMPLES, ids=[f"{page}:{index}" for page, index, _ in EXAMPLES])
def test_example_runs(page, index, code):
    exec(compile(code, f"{page} example {index}", "exec"), {})
