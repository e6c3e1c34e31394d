"""Named feature sets, each a callable `tokens -> TokenFeatures`.

`altun_s1`, `altun_s2`, `altun_s3` are the feature sets of Altun, Johnson &
Hofmann (2003) (the current word; plus its spelling; plus the same for a window
of 3); `crfsuite_ner` the NER features of the sklearn-crfsuite tutorial (tokens
`(word, POS)`); `lavergne_pos` Lavergne et al.'s POS set; `feature_dicts` reads
tokens that are already feature dicts (`dicts.item_features`). String-valued
tests become `name=value`; boolean tests are present only when true.
Design notes: docs/internals.md.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

from .dicts import item_features
from .extraction import TokenFeatures

Tokens = Sequence[Sequence[str]]
"""A sentence: per token, its columns (the word first)."""


def _spelling(word: str, prefix: str) -> list[str]:
    """Altun's spelling tests (adapted from Bikel et al. 1999)."""
    first = word[:1]
    features = [f"{prefix}suffix1={word[-1:]}", f"{prefix}suffix2={word[-2:]}", f"{prefix}suffix3={word[-3:]}"]
    if first.islower():
        features.append(f"{prefix}first_lower")
    if first.isupper():
        features.append(f"{prefix}first_upper")
    if first.isalnum():
        features.append(f"{prefix}first_alphanumeric")
    if first.isupper() and "." in word:
        features.append(f"{prefix}capitalised_with_dot")
    if word.isupper():
        features.append(f"{prefix}all_capitals")
    if "-" in word:
        features.append(f"{prefix}hyphen")
    return features


def _word_at(tokens: Tokens, index: int) -> str:
    if index < 0:
        return f"_B{index}"
    if index >= len(tokens):
        return f"_B+{index - len(tokens) + 1}"
    return tokens[index][0]


def altun_s1(tokens: Tokens) -> TokenFeatures:
    """Altun et al. (2003) feature set S1: the word."""
    return TokenFeatures([[f"word={row[0]}"] for row in tokens], [[] for _ in tokens])


def altun_s2(tokens: Tokens) -> TokenFeatures:
    """Altun et al. (2003) feature set S2: the word and its spelling features."""
    return TokenFeatures([[f"word={row[0]}"] + _spelling(row[0], "") for row in tokens], [[] for _ in tokens])


def altun_s3(tokens: Tokens) -> TokenFeatures:
    """Altun et al. (2003) feature set S3: S2 over a window of neighbouring words."""
    unigram = []
    for t, row in enumerate(tokens):
        features = [f"word={row[0]}"] + _spelling(row[0], "")
        for offset in (-1, 1):
            word = _word_at(tokens, t + offset)
            features.append(f"{offset:+d}:word={word}")
            if 0 <= t + offset < len(tokens):
                features.extend(_spelling(word, f"{offset:+d}:"))
        unigram.append(features)
    return TokenFeatures(unigram, [[] for _ in tokens])


def crfsuite_ner(tokens: Tokens) -> TokenFeatures:
    """sklearn-crfsuite's tutorial features; tokens are `(word, POS)` rows."""
    unigram = []
    for t, row in enumerate(tokens):
        if len(row) < 2:
            raise ValueError(f"crfsuite_ner needs (word, POS) token rows, got {tuple(row)!r} at position {t}")
        word, tag = row[0], row[1]
        features = ["bias", f"word.lower()={word.lower()}", f"word[-3:]={word[-3:]}", f"word[-2:]={word[-2:]}"]
        features += [
            name
            for name, test in (
                ("word.isupper()", word.isupper()),
                ("word.istitle()", word.istitle()),
                ("word.isdigit()", word.isdigit()),
            )
            if test
        ]
        features += [f"postag={tag}", f"postag[:2]={tag[:2]}"]
        for offset, edge in ((-1, "BOS"), (1, "EOS")):
            if 0 <= t + offset < len(tokens):
                other, other_tag = tokens[t + offset][0], tokens[t + offset][1]
                name = f"{offset:+d}" if offset > 0 else f"{offset}"
                features.append(f"{name}:word.lower()={other.lower()}")
                features += [
                    f"{name}:{test}"
                    for test, value in (("word.istitle()", other.istitle()), ("word.isupper()", other.isupper()))
                    if value
                ]
                features += [f"{name}:postag={other_tag}", f"{name}:postag[:2]={other_tag[:2]}"]
            else:
                features.append(edge)
        unigram.append(features)
    return TokenFeatures(unigram, [[] for _ in tokens])


def _shape(word: str) -> str:
    """Character shape with runs collapsed: `Mr.` -> `Xx.`, `1,234` -> `d,d`."""
    shape = re.sub(r"[A-Z]+", "X", word)
    shape = re.sub(r"[a-z]+", "x", shape)
    return re.sub(r"[0-9]+", "d", shape)


@functools.lru_cache(maxsize=1 << 18)
def _lavergne_word(word: str) -> tuple[str, ...]:
    """The features of `lavergne_pos` that depend on the word alone, computed
    once per word type (a corpus repeats its types: 212K tokens, 19K types in
    conll2000's training set)."""
    features = [f"word={word}", f"lower={word.lower()}", f"shape={_shape(word)}"]
    features += [f"prefix{n}={word[:n]}" for n in range(1, 5) if len(word) >= n]
    features += [f"suffix{n}={word[-n:]}" for n in range(1, 5) if len(word) >= n]
    return tuple(features)


def lavergne_pos(tokens: Tokens) -> TokenFeatures:
    """Lavergne et al. (2010)'s part-of-speech features: the word, its lowercase form, shape,
    prefixes and suffixes up to 4 characters, the words at offsets -2 to 2 and adjacent word pairs."""
    words = [f"_B{offset}" for offset in (-2, -1)] + [row[0] for row in tokens] + ["_B+1", "_B+2"]
    unigram = []
    for t in range(len(tokens)):
        w = words[t : t + 5]  # offsets -2 .. 2
        unigram.append(
            [
                *_lavergne_word(w[2]),
                f"-2:word={w[0]}",
                f"-1:word={w[1]}",
                f"+1:word={w[3]}",
                f"+2:word={w[4]}",
                f"-2-1:words={w[0]}|{w[1]}",
                f"-1+0:words={w[1]}|{w[2]}",
                f"+0+1:words={w[2]}|{w[3]}",
                f"+1+2:words={w[3]}|{w[4]}",
            ]
        )
    return TokenFeatures(unigram, [[] for _ in tokens])


PRESETS: dict[str, Callable[[Tokens], TokenFeatures]] = {
    "altun_s1": altun_s1,
    "altun_s2": altun_s2,
    "altun_s3": altun_s3,
    "crfsuite_ner": crfsuite_ner,
    "lavergne_pos": lavergne_pos,
    # Tokens that are sklearn-crfsuite feature dicts (`dicts.item_features`):
    # the name a model trained on them (`lossfns.sklearn.CRF`) is saved under.
    "feature_dicts": item_features,
}
"""The feature presets by name (the `features` argument of `Tagger`)."""


class Preset(NamedTuple):
    """A named preset as a callable extractor (the name is what gets saved)."""

    name: str

    def __call__(self, tokens: Tokens) -> TokenFeatures:
        return PRESETS[self.name](tokens)


def preset(name: str) -> Preset:
    """The preset called `name` (one of `PRESETS`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown feature preset {name!r}; expected one of {sorted(PRESETS)}")
    return Preset(name)
