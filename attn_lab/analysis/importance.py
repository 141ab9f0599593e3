"""Head importance and masking ablations (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

Every attention kind of a model (encoder self, decoder self, cross) takes a head mask ``xi`` of shape ``[B, L, N]``
at call time (1 = keep). A head's importance is ``I_h = E_x |dL(x)/d xi_h|`` at ``xi = 1``: with a per-example mask,
one backward pass of the summed per-example losses gives every example's gradient, so the expectation of absolute
values is exact and the whole split runs as jit-compiled batches.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from attn_lab.models import Ctx, resolve
from attn_lab.train import losses
from attn_lab.train.state import merge


def ones(shapes: dict[str, tuple[int, int]], batch: int) -> dict[str, jax.Array]:
    return {kind: jnp.ones((batch, *shape)) for kind, shape in shapes.items()}


def example_losses(state: dict, batch: dict, head_masks: dict[str, jax.Array] | None, *,
                   graphdef: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-example mean loss ``[B]``, per-example accuracy ``[B]`` and example validity ``[B]`` under head masks.

    Each row's weighted loss and hits over its own weights (a translation's target tokens, a classifier's one
    label), so the model's ``forward_batch`` layout is all this needs; a row with no weight (padding, a fill row of
    the last batch) is invalid and scores 0.
    """
    logits, labels, weights = merge(graphdef, state).forward_batch(batch, Ctx(), head_masks)  # weights (B, ...)
    sums = jax.vmap(lambda lg, lb, w: jnp.stack(losses.cross_entropy(lg, lb, w)))(logits, labels, weights)  # (B, 2)
    count = jnp.maximum(sums[:, 1], 1.0)
    hits = jax.vmap(losses.correct)(logits, labels, weights)  # (B,)
    return sums[:, 0] / count, hits / count, (sums[:, 1] > 0).astype(jnp.float32)


def compile_analysis(graphdef: Any) -> tuple[Callable, Callable]:
    """(scores, importance_sums) jitted: per-example scores under masks, and sum_x |dL(x)/d xi| per kind."""
    per_example = functools.partial(example_losses, graphdef=graphdef)

    def importance_sums(state, batch, head_masks):
        def total(masks):
            loss, _, valid = per_example(state, batch, masks)
            return (loss * valid).sum()
        grads = jax.grad(total)(head_masks)  # kind -> (B, L, N): each row is one example's gradient
        return {k: jnp.abs(g).sum(0) for k, g in grads.items()}  # (L, N)

    return jax.jit(per_example), jax.jit(importance_sums)


def head_importance(state: dict, batches: Iterable[dict], shapes: dict[str, tuple[int, int]],
                    importance_sums: Callable, normalize: bool = False) -> dict[str, np.ndarray]:
    """``I_h = E_x |dL(x)/d xi_h|`` per kind ``[L, N]`` over ``batches``; ``normalize``: unit l2 norm per layer."""
    sums = {k: np.zeros(s) for k, s in shapes.items()}
    count = 0.0
    for batch in batches:
        rows = batch["inputs"].shape[0]
        for k, v in importance_sums(state, batch, ones(shapes, rows)).items():
            sums[k] += np.asarray(v)
        count += float(_valid(batch).sum())
    out = {k: v / max(count, 1.0) for k, v in sums.items()}
    if normalize:  # Michel et al.: per-layer l2 normalization before comparing heads across layers
        out = {k: v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12) for k, v in out.items()}
    return out


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson correlation of the ranks (ties share their mean rank); nan for a constant input."""
    rx, ry = _ranks(np.ravel(x)), _ranks(np.ravel(y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = np.sqrt((rx**2).sum() * (ry**2).sum())
    return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=np.float64)
    for v in np.unique(values):  # ties: the mean of the ranks they span
        tied = values == v
        ranks[tied] = ranks[tied].mean()
    return ranks


def importance_vs_drop(importance: dict[str, np.ndarray], deltas: dict[str, np.ndarray]) -> dict[str, float]:
    """How well importance predicts the metric's drop when a head is masked alone (Michel et al.'s premise).

    Spearman's rho between ``importance[kind]`` and ``-deltas[kind]`` (both ``[L, N]``) over all heads (``'all'``)
    and within each attention kind. A high rho within kinds with a low one over all heads means the scores rank
    heads well inside a kind but are not comparable across kinds (e.g. after per-layer normalization, which gives
    every layer the same total importance however much the model relies on that layer).
    """
    kinds = list(deltas)
    flat = lambda d, sign=1.0: np.concatenate([sign * np.ravel(np.asarray(d[k], np.float64)) for k in kinds])
    out = {"all": rank_correlation(flat(importance), flat(deltas, -1.0))}
    for k in kinds:
        out[k] = rank_correlation(np.asarray(importance[k]), -np.asarray(deltas[k], np.float64))
    return {k: None if np.isnan(v) else v for k, v in out.items()}  # None: no head changed the metric (JSON-safe)


def _valid(batch: dict) -> np.ndarray:
    if "mask" in batch:
        return np.asarray(batch["mask"])
    return (np.asarray(batch["targets"]) != 0).any(-1).astype(np.float32)


Scorer = Callable[[dict, dict], tuple[np.ndarray, float]]
"""``score(state, masks) -> (per-example scores, corpus value)`` with static masks ``{kind: [L, N]}``; the
per-example scores pair up across masks for the bootstrap, the value is what tables report (mean accuracy, BLEU)."""


def scores_under(state: dict, batches: list[dict], masks: dict[str, np.ndarray], scores: Callable,
                 likelihood: bool = False) -> np.ndarray:
    """Per-example accuracy (token accuracy for translation) over ``batches`` with static masks ``[L, N]``;
    ``likelihood``: the per-example mean token log-likelihood instead (minus the cross-entropy, nats)."""
    out = []
    for batch in batches:
        rows = batch["inputs"].shape[0]
        tiled = {k: jnp.broadcast_to(jnp.asarray(m), (rows, *m.shape)) for k, m in masks.items()}
        loss, acc, valid = scores(state, batch, tiled)
        out.append(np.asarray(-loss if likelihood else acc)[np.asarray(valid) > 0])
    return np.concatenate(out)


def accuracy_scorer(batches: list[dict], scores: Callable, likelihood: bool = False) -> Scorer:
    """Teacher-forced per-example accuracy, or (``likelihood``) mean token log-likelihood in nats -- the
    language model's own metric: perplexity is exp(-value), and unlike accuracy it moves with every probability,
    so small head effects show. The value is the mean over examples. One forward pass per batch: cheap."""
    def score(state, masks):
        per = scores_under(state, batches, masks, scores, likelihood)
        return per, float(per.mean())
    return score


def paired_bootstrap(base: np.ndarray, other: np.ndarray, samples: int = 1000, seed: int = 0) -> float:
    """p-value that ``other`` is not worse than ``base`` (share of resamples where its mean is >= base's)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(base), size=(samples, len(base)))
    return float(((other[idx].mean(1) - base[idx].mean(1)) >= 0).mean())


def single_head_ablation(state: dict, shapes: dict[str, tuple[int, int]], score: Scorer) -> dict[str, Any]:
    """Each head masked alone: the metric's change and its paired-bootstrap p-value, per kind ``[L, N]``."""
    full = {k: np.ones(s) for k, s in shapes.items()}
    base, base_value = score(state, full)
    out: dict[str, Any] = {"baseline": base_value}
    for kind, (layers, heads) in shapes.items():
        delta, p = np.zeros((layers, heads)), np.zeros((layers, heads))
        for layer in range(layers):
            for head in range(heads):
                masks = {k: v.copy() for k, v in full.items()}
                masks[kind][layer, head] = 0.0
                ablated, value = score(state, masks)
                delta[layer, head] = value - base_value
                p[layer, head] = paired_bootstrap(base, ablated)
        out[kind] = {"delta": delta.tolist(), "p_not_worse": p.tolist()}
    return out


def all_but_one(state: dict, shapes: dict[str, tuple[int, int]], score: Scorer) -> dict[str, Any]:
    """Michel et al. Table 2: per layer and kind, the metric keeping only the best single head (others masked)."""
    full = {k: np.ones(s) for k, s in shapes.items()}
    base = score(state, full)[1]
    out: dict[str, Any] = {"baseline": base}
    for kind, (layers, heads) in shapes.items():
        rows = []
        for layer in range(layers):
            best = (-np.inf, -1)
            for head in range(heads):
                masks = {k: v.copy() for k, v in full.items()}
                masks[kind][layer] = 0.0
                masks[kind][layer, head] = 1.0
                best = max(best, (score(state, masks)[1], head))
            rows.append({"layer": layer, "best_head": best[1], "score": best[0], "delta": best[0] - base})
        out[kind] = rows
    return out


def compile_gradients(graphdef: Any) -> Callable:
    """Jitted ``(state, batch) -> gradient of the mean per-example loss`` with respect to the parameters."""
    per_example = functools.partial(example_losses, graphdef=graphdef)

    def grads(state, batch):
        def mean_loss(params):
            loss, _, valid = per_example({**state, "params": params}, batch, None)
            return (loss * valid).sum() / jnp.maximum(valid.sum(), 1.0)
        return jax.grad(mean_loss)(state["params"])

    return jax.jit(grads)


def head_gradient_norms(state: dict, batches: Iterable[dict], sites: list, grads_fn: Callable
                        ) -> dict[str, np.ndarray]:
    """Per head ``[L, N]``: l2 norm of the split's mean gradient on the head's own parameters -- its query slice
    ``[d, h, H]`` and output-projection slice ``[h, H, d]`` (keys and values may be shared by grouped heads).
    ``sites``: the model's attention sites, whose paths lead to each attention's parameters in the gradient."""
    total, count = None, 0
    for batch in batches:
        g = jax.tree.map(np.asarray, grads_fn(state, batch))
        total = g if total is None else jax.tree.map(np.add, total, g)
        count += 1
    rows: dict[str, list[np.ndarray]] = {}
    for site in sites:
        p = resolve(total, site.path)
        q = (p["query"]["kernel"] ** 2).sum((0, 2))  # (N,)
        o = (p["out"]["kernel"] ** 2).sum((1, 2))  # (N,)
        rows.setdefault(site.kind, []).append(np.sqrt(q + o) / max(count, 1))
    return {kind: np.stack(r) for kind, r in rows.items()}
