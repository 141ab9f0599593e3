"""Uptraining to grouped-query attention (Ainslie et al. 2023, "GQA", Section 2.1): a finished multi-head run's
key and value projection heads are mean-pooled into groups, then the grouped model trains for a few percent of the
original steps (``train.init_from`` + ``train.init_kv_heads='mean_pool'``).

Why mean pooling: Ainslie et al. compare it with keeping the first head of each group and with random
initialization, and mean pooling uptrains best. Query heads ``n`` share key/value head ``n // (N / K)``
(:func:`attn_lab.attention.dense.group_heads`), so group ``k`` pools the source's heads ``k * N / K ...
(k + 1) * N / K - 1``: consecutive heads, the ones whose queries it will serve.
"""

from __future__ import annotations

import numpy as np

KV_MODES = ("same", "mean_pool")
# Projections whose head axis pooling may shrink: LinearGeneral kernels [in, heads, head_dim], biases [heads, dim].
KV_PARAMS = ("key", "value")


def is_kv_param(path: tuple) -> bool:
    """``path`` (a flattened parameter path) is a key or value projection's kernel or bias."""
    return len(path) >= 2 and path[-2] in KV_PARAMS and path[-1] in ("kernel", "bias")


def mean_pool_heads(source: np.ndarray, groups: int) -> np.ndarray:
    """``[..., N, H] -> [..., groups, H]``: each group the mean of its ``N / groups`` consecutive heads."""
    *lead, heads, dim = source.shape
    if heads % groups:
        raise ValueError(f"{heads} key/value heads cannot be mean-pooled into {groups} groups (not a divisor)")
    return np.asarray(source).reshape(*lead, groups, heads // groups, dim).mean(axis=-2)


def poolable(path: tuple, source_shape: tuple, target_shape: tuple) -> bool:
    """A key/value parameter whose shapes differ only in the head axis (-2), the source's heads a multiple."""
    return (is_kv_param(path) and len(source_shape) == len(target_shape) >= 2
            and source_shape[:-2] == target_shape[:-2] and source_shape[-1] == target_shape[-1]
            and source_shape[-2] > target_shape[-2] and source_shape[-2] % target_shape[-2] == 0)
