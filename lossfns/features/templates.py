"""CRF++ / Wapiti feature templates.

A template file has one template per line:

* `U01:%x[-1,0]` a unigram (label-observation) template: the observation
  string `U01:<word at t-1>` is tested jointly with the current label;
* `B` alone: plain label-bigram (transition) features;
* `B01:%x[0,0]` a bigram template with an observation: Lavergne's
  label-pair-observation features `f_{y', y, x}`;
* `*01:%x[0,0]` (Wapiti): both a unigram and a bigram template;
* blank lines and lines starting with `#` are ignored.

Macros inside a template: `%x[row,col]` (the token `row` positions away,
column `col`), `%t[row,col,"regex"]` (`true`/`false`: does the regex match
anywhere in that cell), `%m[row,col,"regex"]` (the first match, or empty);
the upper-case `%X`, `%T`, `%M` compare case-insensitively (Wapiti).
Rows outside the sentence read `_B-1`, `_B-2`, ... before it and `_B+1`,
... after it, as CRF++ does. Syntax errors raise ValueError naming the
source and line number.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Sequence, Union

from ..corpora import read_lines
from .extraction import TokenFeatures

_MACRO = re.compile(r'%([xXtTmM])\[\s*(-?\d+)\s*,\s*(\d+)\s*(?:,\s*"((?:[^"\\]|\\.)*)"\s*)?\]')


class Macro(NamedTuple):
    """One `%x[row,col]`-style reference inside a template."""

    kind: str  # "x", "t", "m"; upper case compares case-insensitively
    row: int
    column: int
    pattern: "re.Pattern | None"


class Template(NamedTuple):
    """One parsed template line: `name:` followed by literal text and macros."""

    name: str
    parts: tuple[Union[str, Macro], ...]
    line_number: int


class Templates(NamedTuple):
    """A parsed template file (callable: tokens -> `TokenFeatures`).

    unigram: templates tested with the current label (`U` and `*`);
    pair: templates tested with the label pair (`B` and `*` with macros);
    transitions: whether a plain `B` line asks for label-bigram features;
    text: the source text, kept so that a model can be saved and rebuilt.
    """

    unigram: tuple[Template, ...]
    pair: tuple[Template, ...]
    transitions: bool
    text: str

    def __call__(self, tokens: Sequence[Sequence[str]]) -> TokenFeatures:
        return apply_templates(self, tokens)


def _parse_body(body: str, source: str, line_number: int, line: str) -> tuple[Union[str, Macro], ...]:
    parts: list[Union[str, Macro]] = []
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
            raise ValueError(f"{source}:{line_number}: malformed macro at column {percent + 1} of {line!r}; "
                             'expected %x[row,col], %t[row,col,"regex"] or %m[row,col,"regex"]')
        letter, row, column, pattern = match.groups()
        kind = letter.lower()
        if kind == "x" and pattern is not None:
            raise ValueError(f"{source}:{line_number}: %{letter}[row,col] takes no regex, in {line!r}")
        if kind in "tm":
            if pattern is None:
                raise ValueError(f'{source}:{line_number}: %{letter}[row,col,"regex"] needs a regex, in {line!r}')
            try:
                compiled = re.compile(pattern.replace('\\"', '"'), re.IGNORECASE if letter.isupper() else 0)
            except re.error as error:
                raise ValueError(f"{source}:{line_number}: bad regex {pattern!r}: {error}") from None
        else:
            compiled = None
        parts.append(Macro(letter, int(row), int(column), compiled))
        position = match.end()
    return tuple(parts)


def parse_templates(text: str, source: str = "<templates>") -> Templates:
    """Parse the text of a CRF++/Wapiti template file (see the module
    docstring); a leading UTF-8 byte-order mark is dropped."""
    if text.startswith("\ufeff"):
        text = text[1:]
    unigram: list[Template] = []
    pair: list[Template] = []
    transitions = False
    names: dict[str, int] = {}
    for line_number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind = line[0]
        if kind not in "UB*":
            raise ValueError(f"{source}:{line_number}: a template must start with U, B or *, got {line!r}")
        name, colon, body = line.partition(":")
        if not colon:
            if kind == "B" and line == "B":
                transitions = True
                continue
            if "%" in line:
                raise ValueError(f"{source}:{line_number}: expected 'NAME:BODY' (a ':' after the template "
                                 f"name), got {line!r}")
            # A name without a body is a constant observation (a bias template).
            body = ""
        if any(c.isspace() for c in name):
            raise ValueError(f"{source}:{line_number}: template names cannot contain spaces, got {name!r}")
        if name in names:
            raise ValueError(f"{source}:{line_number}: template name {name!r} already used on line {names[name]}")
        names[name] = line_number
        template = Template(name, _parse_body(body, source, line_number, line), line_number)
        if kind in "U*":
            unigram.append(template)
        if kind in "B*":
            pair.append(template)
        if kind == "B" and not any(isinstance(part, Macro) for part in template.parts) and not body:
            # `B01` without a body behaves like `B`: plain transitions.
            pair.pop()
            transitions = True
    return Templates(tuple(unigram), tuple(pair), transitions, text)


def read_templates(path: str) -> Templates:
    """Parse a UTF-8 template file; errors (invalid UTF-8 included) name the file and line."""
    with read_lines(path) as handle:
        return parse_templates(handle.read(), source=path)


def _cell(tokens: Sequence[Sequence[str]], position: int, macro: Macro, template: Template) -> str:
    index = position + macro.row
    if index < 0:
        return f"_B{index}"
    if index >= len(tokens):
        return f"_B+{index - len(tokens) + 1}"
    row = tokens[index]
    if macro.column >= len(row):
        raise ValueError(f"template {template.name} (line {template.line_number}) reads column {macro.column}, "
                         f"but token {index} has only {len(row)} columns: {tuple(row)!r}")
    return row[macro.column]


def _expand(template: Template, tokens: Sequence[Sequence[str]], position: int) -> str:
    pieces = [template.name, ":"]
    for part in template.parts:
        if isinstance(part, str):
            pieces.append(part)
            continue
        value = _cell(tokens, position, part, template)
        if part.kind == "x":
            pieces.append(value)
        elif part.kind == "X":
            # Wapiti's case-insensitive %X: the cell is compared lower-cased.
            pieces.append(value.lower())
        elif part.kind in "tT":
            pieces.append("true" if part.pattern.search(value) else "false")
        else:
            found = part.pattern.search(value)
            pieces.append(found.group(0) if found else "")
    return "".join(pieces)


def apply_templates(templates: Templates, tokens: Sequence[Sequence[str]]) -> TokenFeatures:
    """Observation strings per token: `TokenFeatures(unigram [T][...], pair [T][...])`."""
    unigram = [[_expand(t, tokens, i) for t in templates.unigram] for i in range(len(tokens))]
    pair = [[_expand(t, tokens, i) for t in templates.pair] for i in range(len(tokens))]
    return TokenFeatures(unigram, pair)
