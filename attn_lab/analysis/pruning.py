"""Iterative head pruning by importance (Michel et al. 2019, Section 4), with random and reverse baselines.

Heads of all attention kinds are pruned together, ``fraction`` of them at a time, in the order given by importance
(least important first, per-layer normalized so layers compare: Michel et al.'s ``importance``), by raw importance
(``importance_raw``: no normalization), by the reverse order, or at random. Importance is either scored once on the
full model or re-scored before each step with the gradient taken at the current mask (pruned heads stay pruned).

Why both importance orders: per-layer l2 normalization gives every layer the same total importance, however much
the model relies on it. On the numbers quick model raw importance ranks heads like their own masking drop (Spearman
~0.8 over all heads) while the normalized scores barely do (~0.2), so the normalized order prunes heads the
metric depends on first (``importance_vs_drop`` in :mod:`attn_lab.analysis.importance` measures this per run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:  # importance (jax) is imported where a curve is computed: the prune method's flags read ORDERS
    from attn_lab.analysis.importance import Scorer

def head_importance(*args, **kwargs) -> dict[str, np.ndarray]:
    """:func:`attn_lab.analysis.importance.head_importance`, imported when first called (it needs jax; the prune
    method's flags read :data:`ORDERS` at import)."""
    from attn_lab.analysis.importance import head_importance as compute

    return compute(*args, **kwargs)


ORDERS = ("importance", "reverse", "random", "importance_raw")


def _flat(masks: dict[str, np.ndarray]) -> list[tuple[str, int, int]]:
    return [(k, layer, head) for k, m in masks.items() for layer in range(m.shape[0]) for head in range(m.shape[1])]


def _ranked(scores: dict[str, np.ndarray], masks: dict[str, np.ndarray], order: str,
            rng: np.random.Generator | None) -> list[tuple[str, int, int]]:
    """Unpruned heads, first to prune first."""
    alive = [h for h in _flat(masks) if masks[h[0]][h[1], h[2]] > 0]
    if order == "random":
        return [alive[i] for i in rng.permutation(len(alive))]
    value = np.array([scores[k][layer, head] for k, layer, head in alive])  # importance or importance_raw
    idx = np.argsort(value, kind="stable")
    return [alive[i] for i in (idx[::-1] if order == "reverse" else idx)]


def pruning_curve(state: dict, batches: list[dict], shapes: dict[str, tuple[int, int]], score: Scorer,
                  importance_sums: Callable, *, order: str = "importance", fraction: float = 0.1,
                  rescore: bool = False, seed: int = 0, finetune: Callable[[str], Callable] | None = None,
                  random_orders: int = 1) -> list[dict]:
    """The metric after pruning 0%, 10%, ... of all heads; one dict per step.

    ``order='random'`` prunes in ``random_orders`` independent random orders drawn from the run's ``seed`` (order
    ``r`` from the stream ``(seed, r)``: each seed of a sweep gets its own orders) and returns their mean curve, each
    point keeping the orders' own ``scores``: one random order per seed is a noisy baseline, and one fixed order on
    every seed is no baseline at all (it prunes the same heads first everywhere).

    ``finetune(chain) -> hook``, ``hook(state, masks, step) -> state``: trains the pruned model between steps
    (Michel et al. Section 4.2's optional retraining); importance (when re-scored) and the metric then use the
    fine-tuned state. Each curve is its own chain of fine-tuned runs (``chain``: the order, or ``random/order<r>``
    for the ``r``-th random order), so the random orders never continue each other's runs.
    """
    if order not in ORDERS:
        raise ValueError(f"pruning order {order!r} is not one of {ORDERS}")
    if order != "random":
        return _curve(state, batches, shapes, score, importance_sums, order, fraction, rescore, None,
                      finetune and finetune(order))
    curves = [_curve(state, batches, shapes, score, importance_sums, order, fraction, rescore,
                     np.random.default_rng([seed, r]), finetune and finetune(f"random/order{r}"))
              for r in range(random_orders)]
    return [{**points[0], "score": float(np.mean([p["score"] for p in points])), "scores": [p["score"] for p in points]}
            for points in zip(*curves)]


def _curve(state: dict, batches: list[dict], shapes: dict[str, tuple[int, int]], score: Scorer,
           importance_sums: Callable, order: str, fraction: float, rescore: bool, rng: np.random.Generator | None,
           finetune: Callable | None) -> list[dict]:
    """One pruning curve in one order (``rng``: the random order's stream)."""
    masks = {k: np.ones(s) for k, s in shapes.items()}
    total = sum(m.size for m in masks.values())
    per_step = max(1, int(round(fraction * total)))
    normalize = order != "importance_raw"
    imp = head_importance(state, batches, shapes, importance_sums, normalize=normalize)
    curve = []
    while True:
        pruned = total - int(sum(m.sum() for m in masks.values()))
        curve.append({"pruned": pruned, "percent": 100.0 * pruned / total, "score": score(state, masks)[1]})
        if pruned + per_step >= total:  # keep at least one head
            return curve
        if rescore and order != "random":
            imp = _importance_at(state, batches, masks, importance_sums, normalize)
        for kind, layer, head in _ranked(imp, masks, order, rng)[:per_step]:
            masks[kind][layer, head] = 0.0
        if finetune is not None:
            state = finetune(state, masks, len(curve))


def expected_one_head_removal(full_score: float, single_head_deltas: dict[str, np.ndarray]) -> float:
    """The exact expectation of the metric after removing one head chosen uniformly at random: the full score plus
    the mean over every head of its single-head ablation's change (``{kind: [L, N] deltas}``). The random curve's
    first step (one head pruned) estimates this; here it is computed, with no sampling noise."""
    deltas = np.concatenate([np.asarray(d, np.float64).ravel() for d in single_head_deltas.values()])
    return float(full_score + deltas.mean())


def prune_masks(importance: dict[str, np.ndarray], percent: float) -> dict[str, np.ndarray]:
    """0/1 masks removing the ``percent`` least important heads (per-layer normalized scores; one head kept)."""
    masks = {k: np.ones(v.shape) for k, v in importance.items()}
    total = sum(m.size for m in masks.values())
    count = min(int(round(percent / 100.0 * total)), total - 1)
    for kind, layer, head in _ranked(importance, masks, "importance", None)[:count]:
        masks[kind][layer, head] = 0.0
    return masks


def _importance_at(state: dict, batches: list[dict], masks: dict[str, np.ndarray],
                   importance_sums: Callable, normalize: bool = True) -> dict[str, np.ndarray]:
    """Importance with the gradient taken at the current mask (per-layer normalized unless ``normalize`` is off)."""
    sums = {k: np.zeros(m.shape) for k, m in masks.items()}
    for batch in batches:
        rows = batch["inputs"].shape[0]
        tiled = {k: np.broadcast_to(m, (rows, *m.shape)).astype(np.float32) for k, m in masks.items()}
        for k, v in importance_sums(state, batch, tiled).items():
            sums[k] += np.asarray(v)
    if not normalize:
        return sums
    return {k: v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12) for k, v in sums.items()}
