"""lossfns: differentiable sequence objectives in JAX."""
