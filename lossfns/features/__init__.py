"""Sparse observation features: template files, named presets, token
feature dicts (sklearn-crfsuite's, with real values), an index from
observation strings to ids, padded id (and value) arrays for the models,
and sparse design matrices (CSR) for the fast emission-score product."""

from . import design, dicts, presets, templates
from .design import SparseDesign, bucket_design, design_from_ids, design_matmul
from .dicts import AttributeCorpus, flatten_corpus, item_features
from .extraction import TokenFeatures
from .index import (FeatureBatch, FeatureIndex, PackedCorpus, observed_label_pairs, observed_label_triples, pack,
                    pack_rows, pack_token_rows, pack_tokens, pad_batch, ragged_rows)
from .presets import preset
from .templates import parse_templates, read_templates

__all__ = ["design", "dicts", "presets", "templates", "SparseDesign", "bucket_design", "design_from_ids",
           "design_matmul", "AttributeCorpus", "flatten_corpus", "item_features",
           "TokenFeatures", "FeatureBatch", "FeatureIndex", "PackedCorpus",
           "observed_label_pairs", "observed_label_triples", "pack", "pack_rows", "pack_token_rows", "pack_tokens",
           "pad_batch", "ragged_rows", "preset", "parse_templates", "read_templates"]
