"""lossfns: differentiable sequence objectives in JAX."""

__version__ = "0.2.0"
"""The version of lossfns (the one source: pyproject.toml reads it, CHANGELOG.md says what it holds)."""
