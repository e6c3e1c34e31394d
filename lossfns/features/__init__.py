"""Sparse observation features: template files, named presets, an index
from observation strings to ids, padded id arrays for the models, sparse
design matrices (CSR) for the fast emission-score product, and the one path
of a tagged corpus through them (`corpus`)."""

from . import corpus, design, presets, templates
from .corpus import (CorpusArrays, build_index, check_sentences, corpus_arrays, encode, extractor, extractor_from_spec,
                     extractor_spec, in_corpus_order, label_ids, pack_shards, padded_buckets)
from .design import SparseDesign, bucket_design, design_from_ids, design_matmul
from .extraction import TokenFeatures
from .index import (FeatureBatch, FeatureIndex, PackedCorpus, observed_label_pairs, observed_label_triples, pack,
                    pack_rows, pad_batch)
from .presets import preset
from .templates import parse_templates, read_templates

__all__ = ["corpus", "design", "presets", "templates", "CorpusArrays", "build_index", "check_sentences",
           "corpus_arrays", "encode", "extractor", "extractor_from_spec", "extractor_spec", "in_corpus_order",
           "label_ids", "pack_shards", "padded_buckets", "SparseDesign", "bucket_design", "design_from_ids", "design_matmul",
           "TokenFeatures", "FeatureBatch", "FeatureIndex", "PackedCorpus",
           "observed_label_pairs", "observed_label_triples", "pack", "pack_rows", "pad_batch", "preset", "parse_templates", "read_templates"]
