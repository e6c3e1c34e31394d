"""Sparse observation features: template files, named presets, an index
from observation strings to ids, and padded id arrays for the models."""

from . import presets, templates
from .extraction import TokenFeatures
from .index import FeatureBatch, FeatureIndex, PackedCorpus, observed_label_pairs, pack, pad_batch
from .presets import preset
from .templates import parse_templates, read_templates

__all__ = ["presets", "templates", "TokenFeatures", "FeatureBatch", "FeatureIndex", "PackedCorpus",
           "observed_label_pairs", "pack", "pad_batch", "preset", "parse_templates", "read_templates"]
