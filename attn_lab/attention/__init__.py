"""Attention: the drop-in module and the registry of kernels (importing a kernel file registers it)."""

from attn_lab.attention import dense  # noqa: F401  (registers 'dense')
from attn_lab.attention.module import MultiHeadAttention
from attn_lab.attention.registry import KERNELS, AttentionKernel, build_kernel, register, validate_spec

__all__ = ["KERNELS", "AttentionKernel", "MultiHeadAttention", "build_kernel", "register", "validate_spec"]
