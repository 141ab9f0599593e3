"""Attention: the drop-in module and the registry of kernels.

Every module in this package is imported here, so a kernel file registers itself just by existing: adding a
variant touches no other file.
"""

import importlib
import pkgutil

from attn_lab.attention.module import MultiHeadAttention
from attn_lab.attention.registry import KERNELS, AttentionKernel, build_kernel, register, validate_spec

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["KERNELS", "AttentionKernel", "MultiHeadAttention", "build_kernel", "register", "validate_spec"]
