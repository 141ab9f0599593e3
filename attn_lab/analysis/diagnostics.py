"""Per-head statistics of attention maps (source article 002; Clark et al. 2019, "What Does BERT Look At?").

All functions take maps ``A [B, N, T, S]`` (rows are distributions over keys) and a key validity mask ``[B, S]``, and
return one value per head ``[N]`` averaged over valid query rows, so a layer x head grid is one call per layer.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-12


def _rows(valid_keys: np.ndarray, maps: np.ndarray) -> np.ndarray:
    """Weight of each query row ``[B, T]``: 1 for rows of examples with at least one valid key."""
    return np.broadcast_to(valid_keys.any(-1)[:, None], maps.shape[0:1] + maps.shape[2:3]).astype(float)


def _mean_rows(per_row: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``[B, N, T]`` -> ``[N]`` mean over weighted rows."""
    w = rows[:, None, :]
    return (per_row * w).sum((0, 2)) / np.maximum(w.sum((0, 2)), EPS)


def normalized_entropy(maps: np.ndarray, valid_keys: np.ndarray) -> np.ndarray:
    """Row entropy / log(number of valid keys): 1 = uniform over the valid keys, 0 = one-hot."""
    ent = -(maps * np.log(np.maximum(maps, EPS))).sum(-1)  # (B, N, T)
    n = np.maximum(valid_keys.sum(-1), 2)[:, None, None]  # (B, 1, 1)
    return _mean_rows(ent / np.log(n), _rows(valid_keys, maps))


def mean_distance(maps: np.ndarray, valid_keys: np.ndarray) -> np.ndarray:
    """Expected |query position - key position| under each row (self-attention maps)."""
    t, s = maps.shape[-2:]
    dist = np.abs(np.arange(t)[:, None] - np.arange(s)[None, :])  # (T, S)
    return _mean_rows((maps * dist).sum(-1), _rows(valid_keys, maps))


def position_bias(maps: np.ndarray, valid_keys: np.ndarray) -> dict[str, np.ndarray]:
    """Mass on the key at offsets -1 (previous), 0 (self), +1 (next) from the query, and on the first key."""
    t, s = maps.shape[-2:]
    rows = _rows(valid_keys, maps)
    out = {}
    for name, offset in (("previous", -1), ("self", 0), ("next", 1)):
        band = np.eye(t, s, k=offset)  # (T, S)
        out[name] = _mean_rows((maps * band).sum(-1), rows)
    out["first"] = _mean_rows(maps[..., 0], rows)
    return out


def pairwise_divergences(maps: np.ndarray, valid_keys: np.ndarray) -> dict[str, np.ndarray]:
    """Mean KL(A_i || A_j) and Jensen-Shannon divergence between heads, ``[N, N]`` each (0 on the diagonal)."""
    p = np.maximum(maps, EPS)[:, :, None]  # (B, N, 1, T, S)
    q = np.maximum(maps, EPS)[:, None]  # (B, 1, N, T, S)
    kl = (p * np.log(p / q)).sum(-1)  # (B, N, N, T)
    m = (p + q) / 2
    js = 0.5 * (p * np.log(p / m)).sum(-1) + 0.5 * (q * np.log(q / m)).sum(-1)
    w = _rows(valid_keys, maps)[:, None, None, :]
    mean = lambda x: (x * w).sum((0, 3)) / np.maximum(w.sum((0, 3)), EPS)  # noqa: E731
    return {"kl": mean(kl), "js": mean(js)}


def map_similarity(maps: np.ndarray) -> np.ndarray:
    """Cosine similarity of the heads' flattened maps, averaged over the batch, ``[N, N]``."""
    b, n = maps.shape[:2]
    flat = maps.reshape(b, n, -1)
    unit = flat / np.maximum(np.linalg.norm(flat, axis=-1, keepdims=True), EPS)
    return (unit @ unit.transpose(0, 2, 1)).mean(0)


def flags(stats: dict[str, np.ndarray], similarity: np.ndarray, output_norm: np.ndarray, *,
          dead: float = 0.01, diagonal: float = 0.5, clump: float = 0.5, duplicate: float = 0.9) -> dict[str, list]:
    """Heads flagged as dead (output norm < ``dead`` x the layer's mean), diagonal-dominant (self mass >
    ``diagonal``), block-clumping (mass on the first key > ``clump``: every query collapses onto one block) and
    near-duplicate (map cosine > ``duplicate`` with another head)."""
    n = similarity.shape[0]
    off = similarity - np.eye(n) * 2  # ignore the diagonal
    return {"dead": np.flatnonzero(output_norm < dead * max(output_norm.mean(), EPS)).tolist(),
            "diagonal": np.flatnonzero(stats["self"] > diagonal).tolist(),
            "clumping": np.flatnonzero(stats["first"] > clump).tolist(),
            "duplicate": [[i, int(off[i].argmax())] for i in range(n) if off[i].max() > duplicate]}


def layer_report(maps: np.ndarray, valid_keys: np.ndarray, head_outputs: np.ndarray) -> dict:
    """Every statistic and flag of one attention layer (JSON-ready)."""
    stats = {"entropy": normalized_entropy(maps, valid_keys), "distance": mean_distance(maps, valid_keys),
             **position_bias(maps, valid_keys)}
    div = pairwise_divergences(maps, valid_keys)
    sim = map_similarity(maps)
    norm = np.linalg.norm(head_outputs, axis=-1).mean((0, 1))  # (N,)
    n = sim.shape[0]
    pair = lambda x: float((x.sum() - np.trace(x)) / max(n * (n - 1), 1))  # noqa: E731
    return {**{k: v.tolist() for k, v in stats.items()}, "output_norm": norm.tolist(),
            "mean_kl": pair(div["kl"]), "mean_js": pair(div["js"]), "mean_similarity": pair(sim),
            "flags": flags(stats, sim, norm)}
