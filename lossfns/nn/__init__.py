"""Layers for neural models: `CRF`, a linear-chain CRF head (an
`equinox.Module`) on top of any encoder's emission scores, built on
`lossfns.lattices.chain`."""

from .crf import CRF, possible_tags

__all__ = ["CRF", "possible_tags"]
