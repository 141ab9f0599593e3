"""Per-head statistics of attention maps (Clark et al. 2019, "What Does BERT Look At?": per-head entropy, attention
distance, mass on the previous / same / next / first token, and between-head divergences).

All functions take maps ``A [B, N, T, S]`` (rows are distributions over keys), a key validity mask ``[B, S]`` and an
optional query validity mask ``valid_queries [B, T]``, and return one value per head ``[N]`` averaged over the valid
query rows only (padded queries' rows are excluded, so appending padding changes nothing), so a layer x head grid is
one call per layer. Without ``valid_queries``, a self-attention map (``T == S``) takes query t as valid when key t is;
a cross-attention map (``T != S``) then counts every query row -- pass ``valid_queries`` there (the capture in
:mod:`attn_lab.train.capture` always does).

Here, in ``train``, because the trainer logs a summary of them during training (``config.heads.track``); the head
analysis of finished runs reads them from here too.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-12


def _keys(valid_keys: np.ndarray, maps: np.ndarray) -> np.ndarray:
    """Key validity per query row ``[B, T, S]`` from ``[B, S]`` (padding only) or ``[B, T, S]`` (per row: a causal
    decoder's row t may only see keys <= t, so its future keys are not "valid keys with zero weight")."""
    keys = np.asarray(valid_keys, bool)
    keys = keys[:, None, :] if keys.ndim == 2 else keys
    return np.broadcast_to(keys, (maps.shape[0], maps.shape[2], maps.shape[3]))


def _rows(valid_keys: np.ndarray, maps: np.ndarray, valid_queries: np.ndarray | None = None) -> np.ndarray:
    """Weight of each query row ``[B, T]``: 1 for valid queries that have at least one valid key, else 0.

    ``valid_queries`` None: self-attention (``T == S``) with ``[B, S]`` keys uses ``valid_keys`` for the queries,
    otherwise all rows count.
    """
    b, t, s = maps.shape[0], maps.shape[2], maps.shape[3]
    if valid_queries is None:
        valid_queries = valid_keys if t == s and np.ndim(valid_keys) == 2 else np.ones((b, t), bool)
    valid_queries = np.broadcast_to(np.asarray(valid_queries, bool), (b, t))
    return (valid_queries & _keys(valid_keys, maps).any(-1)).astype(float)


def _mean_rows(per_row: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``[B, N, T]`` -> ``[N]`` mean over weighted rows."""
    w = rows[:, None, :]
    return (per_row * w).sum((0, 2)) / np.maximum(w.sum((0, 2)), EPS)


def normalized_entropy(maps: np.ndarray, valid_keys: np.ndarray, valid_queries: np.ndarray | None = None) -> np.ndarray:
    """Row entropy / log(number of valid keys): 1 = uniform over the valid keys, 0 = one-hot."""
    ent = -(maps * np.log(np.maximum(maps, EPS))).sum(-1)  # (B, N, T)
    n = np.maximum(_keys(valid_keys, maps).sum(-1), 2)[:, None]  # (B, 1, T)
    return _mean_rows(ent / np.log(n), _rows(valid_keys, maps, valid_queries))


def zero_share(maps: np.ndarray, valid_keys: np.ndarray, valid_queries: np.ndarray | None = None) -> np.ndarray:
    """Share of a row's valid keys whose weight is exactly 0 (sparse normalizers such as entmax give true zeros;
    softmax gives none except by underflow)."""
    keys = _keys(valid_keys, maps)[:, None]  # (B, 1, T, S)
    zeros = ((maps == 0) & keys).sum(-1) / np.maximum(keys.sum(-1), 1)  # (B, N, T)
    return _mean_rows(zeros, _rows(valid_keys, maps, valid_queries))


def mean_distance(maps: np.ndarray, valid_keys: np.ndarray, valid_queries: np.ndarray | None = None) -> np.ndarray:
    """Expected |query position - key position| under each row (self-attention maps)."""
    t, s = maps.shape[-2:]
    dist = np.abs(np.arange(t)[:, None] - np.arange(s)[None, :])  # (T, S)
    return _mean_rows((maps * dist).sum(-1), _rows(valid_keys, maps, valid_queries))


def position_bias(maps: np.ndarray, valid_keys: np.ndarray,
                  valid_queries: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Mass on the key at offsets -1 (previous), 0 (self), +1 (next) from the query, and on the first key."""
    t, s = maps.shape[-2:]
    rows = _rows(valid_keys, maps, valid_queries)
    out = {}
    for name, offset in (("previous", -1), ("self", 0), ("next", 1)):
        band = np.eye(t, s, k=offset)  # (T, S)
        out[name] = _mean_rows((maps * band).sum(-1), rows)
    out["first"] = _mean_rows(maps[..., 0], rows)
    return out


def pairwise_divergences(maps: np.ndarray, valid_keys: np.ndarray,
                         valid_queries: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Mean KL(A_i || A_j) and Jensen-Shannon divergence between heads, ``[N, N]`` each (0 on the diagonal)."""
    p = np.maximum(maps, EPS)[:, :, None]  # (B, N, 1, T, S)
    q = np.maximum(maps, EPS)[:, None]  # (B, 1, N, T, S)
    kl = (p * np.log(p / q)).sum(-1)  # (B, N, N, T)
    m = (p + q) / 2
    js = 0.5 * (p * np.log(p / m)).sum(-1) + 0.5 * (q * np.log(q / m)).sum(-1)
    w = _rows(valid_keys, maps, valid_queries)[:, None, None, :]
    mean = lambda x: (x * w).sum((0, 3)) / np.maximum(w.sum((0, 3)), EPS)  # noqa: E731
    return {"kl": mean(kl), "js": mean(js)}


def map_similarity(maps: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Cosine similarity of the heads' flattened maps, averaged over the batch, ``[N, N]``.

    ``rows [B, T]`` (weights from ``_rows``): rows weighted 0 (padded queries) are left out of the maps first.
    """
    b, n = maps.shape[:2]
    if rows is not None:
        maps = maps * rows[:, None, :, None]
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


# The per-head statistics of :func:`layer_report` named once: each is drawn as a layer x head grid by the head
# analysis (its diagnose method) and, at every evaluation with ``config.heads.track``, logged by training as one scalar
# per head ("head"), as the layer's mean over its heads ("mean"), or not at all (None).
HEAD_STATS = {"entropy": "head", "distance": "mean", "self": "mean", "first": None, "zeros": "mean"}


def layer_report(maps: np.ndarray, valid_keys: np.ndarray, head_outputs: np.ndarray,
                 valid_queries: np.ndarray | None = None) -> dict:
    """Every statistic and flag of one attention layer (JSON-ready); averages over valid query rows only."""
    stats = {"entropy": normalized_entropy(maps, valid_keys, valid_queries),
             "distance": mean_distance(maps, valid_keys, valid_queries),
             "zeros": zero_share(maps, valid_keys, valid_queries),
             **position_bias(maps, valid_keys, valid_queries)}
    div = pairwise_divergences(maps, valid_keys, valid_queries)
    rows = _rows(valid_keys, maps, valid_queries)  # (B, T)
    sim = map_similarity(maps, rows)
    norm = _mean_rows(np.linalg.norm(head_outputs, axis=-1).transpose(0, 2, 1), rows)  # (B, T, N) -> (N,)
    n = sim.shape[0]
    pair = lambda x: float((x.sum() - np.trace(x)) / max(n * (n - 1), 1))  # noqa: E731
    return {**{k: v.tolist() for k, v in stats.items()}, "output_norm": norm.tolist(),
            "mean_kl": pair(div["kl"]), "mean_js": pair(div["js"]), "mean_similarity": pair(sim),
            "flags": flags(stats, sim, norm)}
