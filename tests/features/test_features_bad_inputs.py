"""Bad input to lossfns.features and lossfns.corpora: each case raises the
stated exception type with a message naming the offending argument (and, for
files, the file and line).

The reliability page's table (docs/reliability.md) gathers these cases with
every package's (tests/bad_inputs.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from lossfns import corpora
from lossfns.features import design, dicts, pack_tokens, templates
from tests.bad_inputs import assert_raises_a_named_error, case_ids, column_file


def _template_file(tmp_path, text):
    path = tmp_path / "bad.tpl"
    path.write_text(text)
    return templates.read_templates(str(path))


def _conll_file(tmp_path, text):
    path = tmp_path / "bad.conll"
    path.write_text(text)
    return corpora.read_conll(str(path))


def _conll_bytes(tmp_path, data: bytes):
    path = tmp_path / "bad.conll"
    path.write_bytes(data)
    return corpora.read_conll(str(path))


def _zip_file(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "corpus.zip", "w") as archive:
        archive.writestr("conll2002/esp.train", "El DA O\n")
    return str(tmp_path / "corpus.zip")


# (id, description of the bad input, call taking tmp_path, exception, words the message must contain)
CASES = [
    # --- lossfns.features.templates ---
    (
        "template-kind",
        "a template line not starting with U, B or *",
        lambda tmp: _template_file(tmp, "U00:%x[0,0]\nX01:%x[1,0]\n"),
        ValueError,
        ["bad.tpl:2", "U, B or *"],
    ),
    (
        "template-macro",
        "a malformed macro",
        lambda tmp: _template_file(tmp, "# c\n\nU00:%x[0,\n"),
        ValueError,
        ["bad.tpl:3", "malformed macro"],
    ),
    (
        "template-duplicate",
        "two templates with the same text before their first macro",
        lambda tmp: _template_file(tmp, "U00:%x[0,0]\nU00:%x[1,0]\n"),
        ValueError,
        ["bad.tpl:2", "U00", "line 1"],
    ),
    (
        "template-regex",
        "a bad regex in %m[...]",
        lambda tmp: _template_file(tmp, 'U00:%m[0,0,"(a"]\n'),
        ValueError,
        ["bad.tpl:1", "regex"],
    ),
    (
        "template-wapiti-regex",
        "a Wapiti regex repeating nothing",
        lambda _: templates.parse_templates('U:%t[0,0,"^*a"]', "p.txt", dialect="wapiti"),
        ValueError,
        ["p.txt:1", "regex", "nothing to repeat"],
    ),
    (
        "template-dialect",
        "an unknown template dialect",
        lambda _: templates.parse_templates("B", dialect="crfpp"),
        ValueError,
        ["dialect", "'python'", "'wapiti'", "crfpp"],
    ),
    (
        "template-indirect-row",
        "%x[*c,col] whose column c holds no integer",
        lambda _: templates.parse_templates("U:%x[*0,0]")((("El", "DA"),)),
        ValueError,
        ["column 0", "'El'"],
    ),
    # --- lossfns.corpora ---
    (
        "corpus-columns",
        "a line with a different number of columns",
        lambda tmp: _conll_file(tmp, "El DA O\nrey NC\n\n"),
        ValueError,
        ["bad.conll:2", "3 columns"],
    ),
    (
        "corpus-one-column",
        "a line with a single column",
        lambda tmp: _conll_file(tmp, "\nword\n"),
        ValueError,
        ["bad.conll:2", "at least 2 columns"],
    ),
    (
        "conll-label-column-dropped",
        "a later CoNLL sentence without its label column",
        lambda tmp: _conll_bytes(tmp, b"El DA O\nrey NC O\n\nMadrid NP\n"),
        ValueError,
        ["bad.conll:4", "columns"],
    ),
    (
        "conll-latin-1",
        "a latin-1 corpus read as UTF-8",
        lambda tmp: _conll_bytes(tmp, b"El DA O\nEspa\xf1a NP B-LOC\n"),
        ValueError,
        ["bad.conll:2", "latin-1"],
    ),
    (
        "column-file-no-gold",
        "a one-column file read with gold labels (--check)",
        lambda tmp: column_file(tmp, b"El\nrey\n", labelled=True),
        ValueError,
        ["bad.conll:1", "at least 2 columns"],
    ),
    (
        "zip-member-missing",
        "a path through a zip archive to no member",
        lambda tmp: corpora.read_conll(_zip_file(tmp) + "/conll2002/none"),
        FileNotFoundError,
        ["corpus.zip", "'conll2002/none'"],
    ),
    # --- feature dicts, designs, packing ---
    (
        "dicts-string-token",
        "a token given as a string instead of a feature dict",
        lambda _: dicts.flatten_corpus([["El", "rey"]]),
        TypeError,
        ["X[0][0]", "dict", "str"],
    ),
    (
        "dicts-none-value",
        "None as a feature value",
        lambda _: dicts.flatten_corpus([[{"w": "a"}, {"w": None}]]),
        TypeError,
        ["X[0][1]['w']", "NoneType"],
    ),
    (
        "dicts-nan-value",
        "a NaN feature value",
        lambda _: dicts.flatten_corpus([[{"x": float("nan")}]]),
        ValueError,
        ["X[0][0]['x']", "nan", "finite"],
    ),
    (
        "dicts-key-type",
        "a feature key that is not a string",
        lambda _: dicts.item_features([{3: "a"}]),
        TypeError,
        ["items[0]", "key", "int"],
    ),
    (
        "design-values-shape",
        "design values of another shape than the ids",
        lambda _: design.design_from_ids(np.zeros((2, 3), np.int32), 4, np.ones((2, 2))),
        ValueError,
        ["values", "(2, 3)", "(2, 2)"],
    ),
    (
        "pack-tokens-lengths",
        "sentence lengths that do not add up to the token stack",
        lambda _: pack_tokens(np.zeros((5, 2), np.int32), [2, 2]),
        ValueError,
        ["sentence_lengths", "5 tokens", "4"],
    ),
]


@pytest.mark.parametrize("case_id, description, call, error, words", CASES, ids=case_ids(CASES))
def test_bad_input_raises_a_named_error(tmp_path, case_id, description, call, error, words):
    assert_raises_a_named_error(tmp_path, description, call, error, words)
