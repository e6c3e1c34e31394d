"""CRF++ / Wapiti feature templates (pattern files), read as the two tools read them.

One template per line: `U01:%x[-1,0]` a unigram (label-observation) template,
`B` the label bigrams, `B01:%x[0,0]` Lavergne's label-pair-observation features,
`*01:%x[0,0]` (Wapiti) both; the expanded line is the observation string. The
macros `%x[row,col]`, `%t[row,col,"regex"]` and `%m[row,col,"regex"]` read cells
(upper case lower-cases the result), rows outside the sentence read `_B-1`, ...,
`_B+1`, ... as CRF++ does, and the `"wapiti"` dialect reads Wapiti's regexes.
Syntax errors, and templates that could share observation strings, raise
ValueError naming the source and line. Design notes: docs/internals.md.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..corpora import read_lines
from .extraction import TokenFeatures

_MACRO = re.compile(r'%([xXtTmM])\[\s*([@*]?)\s*([+-]?\d+)\s*,\s*(\d+)\s*(?:,\s*"((?:[^"\\]|\\.)*)"\s*)?\]')
DIALECTS = ("python", "wapiti")
"""Template dialects: `python` (CRF++'s macros, Python regular expressions) or `wapiti` (Wapiti's regex subset)."""


class Macro(NamedTuple):
    """One `%x[row,col]`-style reference inside a template.

    kind: "x", "t", "m", upper case to lower-case the result; row: the
    offset from the current token (`mode` ""), the absolute row (`mode`
    "@"), or the column holding the offset (`mode` "*"); column: the
    column read; pattern: the compiled regex of `%t`/`%m`, else None.
    """

    kind: str
    row: int
    column: int
    pattern: re.Pattern | None
    mode: str = ""


class Template(NamedTuple):
    """One parsed template line: `name` (its text up to a `:` or the first
    macro, for messages), then literal text and macros (`parts`)."""

    name: str
    parts: tuple[str | Macro, ...]
    line_number: int


class Templates(NamedTuple):
    """A parsed template file (callable: tokens -> `TokenFeatures`).

    unigram: templates tested with the current label (`U` and `*`);
    pair: templates tested with the label pair (`B` and `*` with macros);
    transitions: whether a `B` (or a constant `*`) line asks for
      label-bigram features;
    text: the source text, kept so that a model can be saved and rebuilt;
    dialect: "python" or "wapiti", how `text` reads (regexes, comments):
      a model file must keep it beside `text`.
    """

    unigram: tuple[Template, ...]
    pair: tuple[Template, ...]
    transitions: bool
    text: str
    dialect: str = "python"

    def __call__(self, tokens: Sequence[Sequence[str]]) -> TokenFeatures:
        return apply_templates(self, tokens)


# Wapiti's character classes (C locale, as its matcher calls isalpha & co.).
_PUNCTUATION = re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_CLASSES = {
    "a": "A-Za-z",
    "d": "0-9",
    "l": "a-z",
    "u": "A-Z",
    "w": "A-Za-z0-9",
    "s": " \\t\\n\\r\\f\\v",
    "p": _PUNCTUATION,
}


def wapiti_regex(pattern: str) -> str:
    """Wapiti's regex subset (see the module docstring) as a Python regex
    with the same matches: `re.search(wapiti_regex(p), s)` finds what
    Wapiti's matcher finds (leftmost; `*` shortest first, `?` longest
    first). Raises ValueError for a `*` or `?` with nothing to repeat."""
    out, position = [], 0
    if pattern.startswith("^"):
        out.append("^")
        position = 1
    while position < len(pattern):
        char = pattern[position]
        if char == "$" and position == len(pattern) - 1:
            out.append(r"\Z")
            break
        if char in "*?":
            raise ValueError(f"unescaped {char!r} with nothing to repeat at position {position} of {pattern!r}")
        if char == "\\" and position + 1 < len(pattern):
            escaped = pattern[position + 1]
            if escaped.lower() in _CLASSES:
                negate = "^" if escaped.isupper() else ""
                out.append(f"[{negate}{_CLASSES[escaped.lower()]}]")
            else:
                out.append(re.escape(escaped))
            position += 2
        else:
            out.append("." if char == "." else re.escape(char))
            position += 1
        if position < len(pattern) and pattern[position] in "*?":
            out.append("*?" if pattern[position] == "*" else "?")
            position += 1
    return "".join(out)


def _parse_body(body: str, source: str, line_number: int, line: str, dialect: str):
    parts: list[str | Macro] = []
    position = 0
    while position < len(body):
        percent = body.find("%", position)
        if percent < 0:
            parts.append(body[position:])
            break
        if percent > position:
            parts.append(body[position:percent])
        match = _MACRO.match(body, percent)
        if match is None:
            raise ValueError(
                f"{source}:{line_number}: malformed macro at column {percent + 1} of {line!r}; "
                'expected %x[row,col], %t[row,col,"regex"] or %m[row,col,"regex"]'
            )
        letter, mode, row, column, pattern = match.groups()
        kind = letter.lower()
        if kind == "x" and pattern is not None:
            raise ValueError(f"{source}:{line_number}: %{letter}[row,col] takes no regex, in {line!r}")
        if kind in "tm":
            if pattern is None:
                raise ValueError(f'{source}:{line_number}: %{letter}[row,col,"regex"] needs a regex, in {line!r}')
            try:
                text = wapiti_regex(pattern) if dialect == "wapiti" else pattern.replace('\\"', '"')
                compiled = re.compile(text, re.DOTALL)
            except (re.error, ValueError) as error:
                raise ValueError(f"{source}:{line_number}: bad regex {pattern!r}: {error}") from None
        else:
            compiled = None
        parts.append(Macro(letter, int(row), int(column), compiled, mode))
        position = match.end()
    return tuple(parts)


def parse_templates(text: str, source: str = "<templates>", *, dialect: str = "python") -> Templates:
    """Parse the text of a CRF++/Wapiti template file (see the module
    docstring); a leading UTF-8 byte-order mark is dropped.

    dialect: "python" (regexes are Python's; `#` starts a comment line) or
      "wapiti" (Wapiti's regex subset; `#` starts a comment anywhere), for
      pattern files written for Wapiti.
    """
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {DIALECTS}, got {dialect!r}")
    if text.startswith("\ufeff"):
        text = text[1:]
    unigram: list[Template] = []
    pair: list[Template] = []
    transitions = False
    prefixes: dict[tuple[str, str], int] = {}
    for line_number, raw in enumerate(text.splitlines(), start=1):
        line = (raw.split("#", 1)[0] if dialect == "wapiti" else raw).strip()
        if not line or line.startswith("#"):
            continue
        kind = line[0].upper()
        if kind not in "UB*":
            raise ValueError(f"{source}:{line_number}: a template must start with U, B or * (or u, b), got {line!r}")
        parts = _parse_body(line, source, line_number, line, dialect)
        if ":" not in line:
            parts += (":",)  # a bare name (`U`, `Ubias`) reads `name:`, as before names were optional
        prefix = parts[0] if parts and isinstance(parts[0], str) else ""
        name = prefix.split(":", 1)[0]
        constant = not any(isinstance(part, Macro) for part in parts)
        template = Template(name, parts, line_number)
        groups = [group for group, kinds in (("unigram", "U*"), ("pair", "B*")) if kind in kinds]
        if kind in "B*" and constant:
            # A constant tested with the label pair is a copy of the transitions.
            transitions = True
            groups.remove("pair")
        for group in groups:
            if (group, prefix) in prefixes:
                raise ValueError(
                    f"{source}:{line_number}: template text {prefix!r} before the first macro is "
                    f"already used on line {prefixes[group, prefix]}: their observation strings "
                    "could coincide; give each template its own name"
                )
            prefixes[group, prefix] = line_number
        if "unigram" in groups:
            unigram.append(template)
        if "pair" in groups:
            pair.append(template)
    return Templates(tuple(unigram), tuple(pair), transitions, text, dialect)


def read_templates(path: str, *, dialect: str = "python") -> Templates:
    """Parse a UTF-8 template file (plain, or a member of a zip archive, as
    `corpora.read_lines` reads it); errors (invalid UTF-8 included) name the
    file and line. `dialect` as in `parse_templates`."""
    with read_lines(path) as handle:
        return parse_templates(handle.read(), source=str(path), dialect=dialect)


def _cell(tokens: Sequence[Sequence[str]], position: int, macro: Macro, template: Template) -> str:
    if macro.mode == "@":
        index = macro.row + len(tokens) if macro.row < 0 else macro.row - 1
    elif macro.mode == "*":
        offset = _column(tokens, position, macro.row, template)
        try:
            index = position + int(offset)
        except ValueError:
            raise ValueError(
                f"template {template.name} (line {template.line_number}) reads a row offset from "
                f"column {macro.row}, but token {position} has {offset!r} there"
            ) from None
    else:
        index = position + macro.row
    if index < 0:
        return f"_B{index}"
    if index >= len(tokens):
        return f"_B+{index - len(tokens) + 1}"
    return _column(tokens, index, macro.column, template)


def _column(tokens: Sequence[Sequence[str]], index: int, column: int, template: Template) -> str:
    row = tokens[index]
    if column >= len(row):
        raise ValueError(
            f"template {template.name} (line {template.line_number}) reads column {column}, "
            f"but token {index} has only {len(row)} columns: {tuple(row)!r}"
        )
    return row[column]


def _transformed(part: Macro, values: list[str]) -> list[str]:
    """`%t` (does the regex match: "true"/"false"), `%m` (its first match) and
    the upper-case commands' lower-casing, of each of `values`."""
    kind, pattern = part.kind.lower(), part.pattern
    if kind == "t" and pattern is not None:
        values = ["true" if pattern.search(value) else "false" for value in values]
    elif kind == "m" and pattern is not None:
        values = [found.group(0) if found else "" for found in map(pattern.search, values)]
    # Wapiti's upper-case commands lower-case what they produce.
    return [value.lower() for value in values] if part.kind.isupper() else values


def _factorize(values: list) -> tuple[list, np.ndarray]:
    """`(distinct, codes)`: the distinct values in order of first appearance,
    and each value's index among them (`values[i] == distinct[codes[i]]`)."""
    index = {value: i for i, value in enumerate(dict.fromkeys(values))}
    return list(index), np.fromiter(map(index.__getitem__, values), np.int64, len(values))


class TemplateColumn(NamedTuple):
    """One template's observation strings over a corpus, factorized: token i
    reads `strings[codes[i]]` (`codes` `[N]` int64 over the corpus's tokens,
    sentence after sentence). Each string is built once, however many tokens
    read it, and a lookup (the feature index) needs one per string."""

    strings: list[str]
    codes: np.ndarray

    def tolist(self) -> list[str]:
        """The string of every token."""
        return list(map(self.strings.__getitem__, self.codes.tolist()))


def expand_templates(
    templates: Templates, sentences: Sequence[Sequence[Sequence[str]]]
) -> tuple[list[TemplateColumn], list[TemplateColumn]]:
    """`(unigram, pair)`: per template (`templates.unigram`, then
    `templates.pair`), its observation strings over every token of
    `sentences` (`TemplateColumn`); `apply_templates` gives one sentence's
    strings token by token.

    One template at a time over the whole corpus: the sentences are laid end
    to end, each between its boundary rows (`_B-2`, `_B-1` before, `_B+1`,
    ... after, as many as the farthest relative row reaches), so that a cell
    `%x[r,c]` of every token is one slice of column `c`'s codes; a transform
    (`%t`, `%m`, upper case) runs once per distinct value, and a string is
    built once per distinct combination of a template's cells. Absolute rows,
    offsets read from a column and tokens too short for a column are read
    position by position (`_cell`, whose errors name the template and token)."""
    return _Expansion(templates, sentences).columns()


class _Expansion:
    """The corpus laid out for `expand_templates`: `frame` holds every
    sentence's token rows between `reach` boundary rows on each side; the
    aligned positions are `frame[reach:-reach]` (each token, and between two
    sentences their boundary rows, which `tokens` leaves out)."""

    def __init__(self, templates: Templates, sentences: Sequence[Sequence[Sequence[str]]]):
        self.templates, self.sentences = templates, sentences
        macros = [p for t in templates.unigram + templates.pair for p in t.parts if isinstance(p, Macro)]
        self.reach = reach = max((abs(p.row) for p in macros if not p.mode), default=0)
        width = 1 + max((p.column for p in macros), default=0)
        before = [(f"_B{i}",) * width for i in range(-reach, 0)]
        after = [(f"_B+{i}",) * width for i in range(1, reach + 1)]
        self.frame: list = []
        for tokens in sentences:
            self.frame += before
            self.frame += tokens
            self.frame += after
        self.span = max(len(self.frame) - 2 * reach, 0)
        lengths = np.fromiter(map(len, sentences), np.int64, len(sentences))
        self.count = int(lengths.sum())
        self.tokens = None  # the aligned positions of the tokens (None: all of them)
        if self.count != self.span:
            starts = np.cumsum(lengths + 2 * reach) - lengths - 2 * reach  # each sentence's first aligned position
            self.tokens = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(self.count)
        self._columns: dict = {}  # column -> (distinct cells, codes over the frame), or None: a token too short
        self._transforms: dict = {}  # (kind, pattern, column) -> (distinct transformed cells, code map)

    def columns(self) -> tuple[list[TemplateColumn], list[TemplateColumn]]:
        return [self._expand(t) for t in self.templates.unigram], [self._expand(t) for t in self.templates.pair]

    def _column(self, column: int):
        if column not in self._columns:
            try:
                cells = list(map(operator.itemgetter(column), self.frame))
            except IndexError:
                self._columns[column] = None
            else:
                self._columns[column] = _factorize(cells)
        return self._columns[column]

    def _cells(self, part: Macro, template: Template) -> tuple[list[str], np.ndarray]:
        """`(distinct, codes)`: the (transformed) cell `part` reads, at every token."""
        column = None if part.mode else self._column(part.column)
        if column is None:  # position by position
            raw = [
                _cell(tokens, position, part, template) for tokens in self.sentences for position in range(len(tokens))
            ]
            return _factorize(_transformed(part, raw))
        distinct, codes = column
        start = self.reach + part.row
        codes = codes[start : start + self.span]
        if self.tokens is not None:
            codes = codes[self.tokens]
        if part.kind == "x":
            return distinct, codes
        key = (part.kind, part.pattern, part.column)
        if key not in self._transforms:
            transformed, code_map = _factorize(_transformed(part, distinct))
            self._transforms[key] = transformed, code_map
        transformed, code_map = self._transforms[key]
        return transformed, code_map[codes]

    def _expand(self, template: Template) -> TemplateColumn:
        parts = template.parts
        macros = [self._cells(part, template) for part in parts if isinstance(part, Macro)]
        if not macros:  # a constant
            return TemplateColumn(["".join(part for part in parts if isinstance(part, str))], np.zeros(self.count, int))
        if len(macros) == 1:
            (distinct, codes), cells = macros[0], [macros[0][0]]
            if len(parts) == 2 and isinstance(parts[0], str):  # `name:%x[r,c]`, the usual template
                return TemplateColumn(list(map(parts[0].__add__, distinct)), codes)
        else:  # the distinct combinations of the cells, and each one's cells
            combinations, codes = _factorize(list(zip(*(codes.tolist() for _, codes in macros))))
            columns = list(zip(*combinations)) or [()] * len(macros)  # each macro's cells, per combination
            cells = [list(map(values.__getitem__, column)) for (values, _), column in zip(macros, columns)]
        pieces, at = [], 0
        for part in parts:
            if isinstance(part, str):
                pieces.append(itertools.repeat(part))
            else:
                pieces.append(cells[at])
                at += 1
        return TemplateColumn(list(map("".join, zip(*pieces))), codes)


def apply_templates(templates: Templates, tokens: Sequence[Sequence[str]]) -> TokenFeatures:
    """Observation strings per token: `TokenFeatures(unigram [T][...], pair [T][...])`."""
    return apply_templates_to_corpus(templates, [tokens])[0]


def apply_templates_to_corpus(
    templates: Templates, sentences: Sequence[Sequence[Sequence[str]]]
) -> list[TokenFeatures]:
    """`apply_templates` of every sentence (each one's tokens), expanded over
    the whole corpus at once (`expand_templates`): faster than sentence by
    sentence, the same strings."""
    unigram, pair = expand_templates(templates, sentences)
    count = sum(map(len, sentences))
    by_token = lambda columns: (
        list(map(list, zip(*(c.tolist() for c in columns)))) if columns else [[] for _ in range(count)]
    )
    unigram_rows, pair_rows = by_token(unigram), by_token(pair)
    ends = list(itertools.accumulate(map(len, sentences)))
    return [TokenFeatures(unigram_rows[start:end], pair_rows[start:end]) for start, end in zip([0, *ends], ends)]
