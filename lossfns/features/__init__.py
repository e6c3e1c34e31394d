"""Sparse observation features: template files, named presets, token
feature dicts (sklearn-crfsuite's, with real values), an index from
observation strings to ids, padded id (and value) arrays for the models,
sparse design matrices (CSR) for the fast emission-score product, and the
one path of a tagged corpus through them (`corpus`).

`__all__` is what users build corpora and designs with; the plumbing the Tagger
and the model files share (`corpus.check_sentences`, `corpus.extractor_spec`,
`corpus.extractor_from_spec`) and numpy helpers (`index.ragged_rows`) stay in
their modules.
"""

from . import corpus, design, dicts, presets, templates
from .corpus import (
    CorpusArrays,
    bucket_corpora,
    build_index,
    corpus_arrays,
    encode,
    extract,
    extractor,
    in_corpus_order,
    index_corpus,
    label_ids,
    ladder,
    ladder_arrays,
    pack_sentences,
    pack_shards,
    padded_buckets,
)
from .design import SparseDesign, bucket_design, design_from_ids, design_matmul
from .dicts import AttributeCorpus, flatten_corpus, item_features
from .extraction import TokenFeatures
from .index import (
    FeatureBatch,
    FeatureIndex,
    PackedCorpus,
    observed_label_pairs,
    observed_label_triples,
    observed_transitions,
    pack,
    pack_rows,
    pack_token_rows,
    pack_tokens,
    pad_batch,
)
from .presets import preset
from .templates import parse_templates, read_templates

__all__ = [
    "corpus",
    "design",
    "dicts",
    "presets",
    "templates",
    "CorpusArrays",
    "bucket_corpora",
    "build_index",
    "corpus_arrays",
    "encode",
    "extract",
    "extractor",
    "in_corpus_order",
    "index_corpus",
    "label_ids",
    "ladder",
    "ladder_arrays",
    "pack_sentences",
    "pack_shards",
    "padded_buckets",
    "SparseDesign",
    "bucket_design",
    "design_from_ids",
    "design_matmul",
    "AttributeCorpus",
    "flatten_corpus",
    "item_features",
    "TokenFeatures",
    "FeatureBatch",
    "FeatureIndex",
    "PackedCorpus",
    "observed_label_pairs",
    "observed_label_triples",
    "observed_transitions",
    "pack",
    "pack_rows",
    "pack_token_rows",
    "pack_tokens",
    "pad_batch",
    "preset",
    "parse_templates",
    "read_templates",
]
