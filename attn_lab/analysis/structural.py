"""Structural head pruning: physically remove masked heads (Michel et al. 2019, Section 5: pruned BERT ran 17.5%
faster at batch 64 with half its heads removed).

A mask only multiplies a head's output by zero -- the head is still computed. :func:`prune_model` rebuilds every
attention layer with only its kept heads (smaller projection matrices, see ``MultiHeadAttention.keep_heads``), so the
re-jitted forward pass does less work and its outputs equal the masked model's.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_lab.models import Ctx, attention_layers, count_params, resolve, set_module
from attn_lab.train.state import merge


def prune_model(model: nnx.Module, masks: dict[str, np.ndarray]) -> nnx.Module:
    """A copy of ``model`` without the heads where ``masks[kind][layer, head] == 0``, site by site.

    A layer whose heads are all pruned keeps one head with a zero output projection, so the sublayer adds only its
    output bias -- exactly what the fully masked layer computes. Static config head masks (held by the stack the
    site names) are folded in (kept heads keep their static value).
    """
    pruned = nnx.clone(model)
    for site in pruned.sites():
        attn = resolve(pruned, site.path)
        row = np.asarray(masks[site.kind][site.layer]) if site.kind in masks else np.ones(attn.num_heads)
        if set(np.unique(row)) - {0.0, 1.0}:
            raise ValueError(f"prune_model: masks[{site.kind!r}][{site.layer}] must be 0/1, got {row.tolist()}")
        keep = np.flatnonzero(row).tolist() or [0]
        small = attn.keep_heads(keep)
        if not row.any():
            small.out.kernel[...] = small.out.kernel[...] * 0.0  # (1, H, d): the layer adds only its bias
        set_module(pruned, site.path, small)
        stack = resolve(pruned, site.stack)
        static = stack.static_masks.get(site.kind)
        if static is not None:
            rows = list(static)
            rows[site.layer] = tuple(static[site.layer][h] for h in keep)
            stack.static_masks = {**stack.static_masks, site.kind: tuple(rows)}
    return pruned


def grouped_kinds(model: nnx.Module) -> list[str]:
    """The attention kinds with grouped key/value heads (``num_kv_heads < num_heads``): removing some query heads of
    a group would leave groups of unequal size, which the module cannot hold, so they are pruned by masking only."""
    return list(dict.fromkeys(kind for kind, _, attn in attention_layers(model) if attn.num_kv_heads < attn.num_heads))


def heads_left(model: nnx.Module) -> dict[str, list[int]]:
    """Attention kind -> number of heads per layer."""
    out: dict[str, list[int]] = {}
    for kind, _, attn in attention_layers(model):
        out.setdefault(kind, []).append(attn.num_heads)
    return out


def compare_speed(fns: dict[str, Callable[[], Any]], repeats: int = 20, rounds: int = 5) -> dict[str, float]:
    """Median seconds per call of each (already compiled) function, timed in interleaved rounds so machine noise
    hits every function alike; call each once before to compile."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeats):
                jax.block_until_ready(fn())
            times[name].append((time.perf_counter() - start) / repeats)
    return {name: float(np.median(t)) for name, t in times.items()}


def compile_forward(model: nnx.Module) -> Callable:
    """Jitted ``(batch, head_masks=None) -> logits`` of a model's ``forward_batch`` at test time."""
    graphdef, state = nnx.split(model)

    def forward(state, batch, head_masks):
        return nnx.merge(graphdef, state).forward_batch(batch, Ctx(), head_masks)[0]  # (B, T, V) or (B, C)

    jitted = jax.jit(forward)
    return lambda batch, head_masks=None: jitted(state, batch, head_masks)


def tile_batch(batch: dict, rows: int) -> dict:
    """``batch`` repeated along its first axis to exactly ``rows`` examples (a fixed batch size for timing)."""
    return {k: np.resize(v, (rows, *np.shape(v)[1:])) for k, v in batch.items()}


def speed_report(graphdef: Any, state: dict, masks: dict[str, np.ndarray], batch: dict) -> dict:
    """Prunes the model of a training state, checks it against the masked model, and times the full, masked and
    pruned forward passes in one interleaved run."""
    model = merge(graphdef, state)
    pruned = prune_model(model, masks)
    full_fn, pruned_fn = compile_forward(model), compile_forward(pruned)
    jmasks = {k: jnp.asarray(v, jnp.float32) for k, v in masks.items()}
    diff = float(jnp.abs(pruned_fn(batch) - full_fn(batch, jmasks)).max())
    seconds = compare_speed({"full": lambda: full_fn(batch), "masked": lambda: full_fn(batch, jmasks),
                             "pruned": lambda: pruned_fn(batch)})
    total = sum(m.size for m in masks.values())
    return {"percent_pruned": 100.0 * (total - sum(m.sum() for m in masks.values())) / total,
            "masks": {k: v.tolist() for k, v in masks.items()}, "heads_per_layer": heads_left(pruned),
            "params_full": count_params(model), "params_pruned": count_params(pruned),
            "batch_size": int(np.shape(batch["inputs"])[0]), "max_abs_diff": diff, "seconds_per_forward": seconds,
            "speedup_vs_full": seconds["full"] / seconds["pruned"],
            "speedup_vs_masked": seconds["masked"] / seconds["pruned"]}
