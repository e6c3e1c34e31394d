"""What every feature extractor returns: observation strings per token.

An extractor is any callable `tokens -> TokenFeatures`, where `tokens` is a
sentence's `[T]` rows of observation columns (`corpora.Sentence.tokens`):
template files (`templates.Templates`) and the named presets
(`presets.Preset`) both are, and so is `dicts.item_features` for tokens
given as sklearn-crfsuite feature dicts. An observation is binary (weight 1)
unless `unigram_values` gives it a real value: CRFsuite's attribute values,
which scale the emission weights they select (`value * emission[id]`).
"""

from __future__ import annotations

from typing import NamedTuple


class TokenFeatures(NamedTuple):
    """Observation strings of one sentence.

    unigram: `[T][...]` strings tested jointly with the label at t (emissions);
    pair: `[T][...]` strings tested with the label pair (t-1, t)
      (label-pair-observation features); lists may be empty;
    unigram_values: `[T][...]` floats, the value of each `unigram` string
      (aligned with it), or None: every value 1.
    """

    unigram: list[list[str]]
    pair: list[list[str]]
    unigram_values: list[list[float]] | None = None
