"""Sparse observation features: template files, named presets, an index
from observation strings to ids, padded id arrays for the models, and
sparse design matrices (CSR) for the fast emission-score product."""

from . import design, presets, templates
from .design import SparseDesign, bucket_design, design_from_ids, design_matmul
from .extraction import TokenFeatures
from .index import (FeatureBatch, FeatureIndex, PackedCorpus, observed_label_pairs, observed_label_triples, pack,
                    pack_rows, pad_batch)
from .presets import preset
from .templates import parse_templates, read_templates

__all__ = ["design", "presets", "templates", "SparseDesign", "bucket_design", "design_from_ids", "design_matmul",
           "TokenFeatures", "FeatureBatch", "FeatureIndex", "PackedCorpus",
           "observed_label_pairs", "observed_label_triples", "pack", "pack_rows", "pad_batch", "preset", "parse_templates", "read_templates"]
