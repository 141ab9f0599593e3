"""Runs derived from a finished run: fine-tuning a pruned (masked) model, and training L0 head gates from it.

Both are ordinary trainer runs (their own folder, metrics.jsonl, W&B run in the same group, checkpoints,
results.json) started from the finished run's parameters with ``train.init_from``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from attn_lab.train.trainer import train_and_evaluate


def head_mask_text(mask: np.ndarray) -> str:
    """``[L, N]`` 0/1 -> the config form ``'1,0,1,1;1,1,1,1'`` (``model.kinds.<kind>.head_mask``)."""
    return ";".join(",".join(f"{v:g}" for v in row) for row in np.asarray(mask))


def derived_config(config: Any, source: str, steps: int, name: str) -> Any:
    """``config`` continued from ``source`` for ``steps`` steps (fresh optimizer, short warmup, one eval at the end)."""
    c = config.copy_and_resolve_references()
    c.train.update(init_from=source, num_steps=steps, warmup_steps=min(c.train.warmup_steps, max(steps // 10, 1)),
                   eval_every=steps, checkpoint_every=steps, log_every=min(c.train.log_every, steps))
    c.wandb.name = f"{c.wandb.name or os.path.basename(os.path.normpath(source))}-{name}"
    return c


def finetune_masked(config: Any, source: str, masks: dict[str, np.ndarray], steps: int, workdir: str) -> str:
    """Trains ``source``'s model with ``masks`` applied (pruned heads stay at zero) for ``steps``; returns its
    folder."""
    c = derived_config(config, source, steps, os.path.basename(workdir))
    for kind, mask in masks.items():
        c.model.kinds[kind].head_mask = head_mask_text(mask)
    train_and_evaluate(c, workdir, allow_unfinished=True)  # the analysis checked its source run
    return workdir


def train_gates(config: Any, source: str, target: float, steps: int, workdir: str) -> dict:
    """L0 gates trained on ``source``'s model to keep ``target`` of all heads; the run's results (with ``gates``)."""
    c = derived_config(config, source, steps, f"gates{target:g}")
    c.heads.gates.update(enabled=True, target=float(target))
    return train_and_evaluate(c, workdir, allow_unfinished=True)  # the analysis checked its source run
