"""Labelled output (`lossfns.labelled_output`): the input again line for line
with a predicted column, in Wapiti's layouts (n-best copies, `# n score`
lines, `label/score` columns), read back by the corpus reader and laid out
as conlleval reads it."""

import io

import pytest

from lossfns import corpora, metrics
from lossfns.labelled_output import write_labelled

CHECKED = "-DOCSTART- -X- O\n\nEl DA O\nrey NC B-PER\n\n\nMadrid\tNP\tB-LOC\n"


@pytest.fixture
def checked(tmp_path):
    path = tmp_path / "testb.conll"
    path.write_text(CHECKED)
    return corpora.read_column_file(path, labelled=True)


def _written(file, labels, **options):
    out = io.StringIO()
    write_labelled(file, labels, out, **options)
    return out.getvalue()


def test_each_line_gets_its_label(checked, tmp_path):
    text = _written(checked, [[("O", "B-LOC")], [("B-LOC",)]])
    assert text == ("-DOCSTART- -X- O O\n\nEl DA O O\nrey NC B-PER B-LOC\n\n\nMadrid\tNP\tB-LOC\tB-LOC\n")
    # Read back: gold then prediction in the last two columns, as conlleval reads them.
    path = tmp_path / "out.conll"
    path.write_text(text)
    back = corpora.read_conll(str(path), label_column=-1, observation_columns=[0, 1, 2])
    assert [s.labels for s in back] == [("O", "B-LOC"), ("B-LOC",)]
    assert [tuple(row[2] for row in s.tokens) for s in back] == [s.labels for s in checked.sentences]
    assert len({len(line.split()) for line in text.splitlines() if line}) == 1  # one table for conlleval
    assert metrics.entity_scores([s.labels for s in checked.sentences], [s.labels for s in back]).correct == 1


def test_unlabelled_input_and_a_given_separator(tmp_path):
    path = tmp_path / "words.txt"
    path.write_text("El\nrey")  # no line end at the end of the file
    file = corpora.read_column_file(path, labelled=False)
    assert _written(file, [[("O", "B-PER")]], separator="\t") == "El\tO\nrey\tB-PER\n"


def test_nbest_with_scores_in_wapitis_layout(checked):
    text = _written(
        checked,
        [[("O", "B-LOC"), ("O", "O")], [("B-LOC",), ("O",)]],
        sequence_scores=[[-1.5, -2.25], [0.5, 0.25]],
        token_scores=[[(0.9, 0.6), (0.9, 0.4)], [(0.75,), (0.25,)]],
    )
    assert text == (
        "-DOCSTART- -X- O O\n\n"
        "# 0 -1.500000\nEl DA O O O/0.900000\nrey NC B-PER B-LOC B-LOC/0.600000\n\n"
        "# 1 -2.250000\nEl DA O O O/0.900000\nrey NC B-PER O O/0.400000\n\n\n"
        "# 0 0.500000\nMadrid\tNP\tB-LOC\tB-LOC\tB-LOC/0.750000\n\n"
        "# 1 0.250000\nMadrid\tNP\tB-LOC\tO\tO/0.250000\n"
    )


@pytest.mark.parametrize(
    "labels, options, message",
    [
        ([[("O", "O")]], {}, r"one \[N\]\[T\] entry per sentence of .*testb.conll \(2\), got 1"),
        ([[("O",)], [("O",)]], {}, r"labels\[0\]\[0\] has 1 labels for the 2 tokens of sentence 0 \(.*testb.conll:3\)"),
        ([("O", "O"), [("O",)]], {}, r"labels\[0\] must be \[N\]\[T\] label strings"),
        (
            [[("O", "O")], [("O",)]],
            {"sequence_scores": [[1.0, 2.0], [1.0]]},
            r"sequence_scores\[0\] must hold one entry",
        ),
        ([[("O", "O")], [("O",)]], {"token_scores": [[(1.0,)], [(1.0,)]]}, r"token_scores\[0\]\[0\] has 1 scores"),
    ],
)
def test_labels_that_do_not_fit_are_named(checked, labels, options, message):
    with pytest.raises(ValueError, match=message):
        _written(checked, labels, **options)
