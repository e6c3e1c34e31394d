"""What every feature extractor returns: observation strings per token.

An extractor is any callable `tokens -> TokenFeatures`, where `tokens` is a
sentence's `[T]` rows of observation columns (`corpora.Sentence.tokens`):
template files (`templates.Templates`) and the named presets
(`presets.Preset`) both are.
"""

from __future__ import annotations

from typing import NamedTuple


class TokenFeatures(NamedTuple):
    """Observation strings of one sentence.

    unigram: `[T][...]` strings tested jointly with the label at t (emissions);
    pair: `[T][...]` strings tested with the label pair (t-1, t)
      (label-pair-observation features); lists may be empty.
    """

    unigram: list[list[str]]
    pair: list[list[str]]
