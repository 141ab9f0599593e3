"""attn_lab: multi-head attention ablations in JAX / Flax NNX."""

__version__ = "0.1.0"
