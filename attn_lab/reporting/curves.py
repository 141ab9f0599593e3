"""A sweep's learning curves per variant: the mean over seeds with a band from the lowest to the highest seed, for
the training and the validation loss (``<tables>/curves.png``, written with the experiment's tables). A table gives
the end point; the curves say whether the rows were still moving when the budget ended."""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

import numpy as np

from attn_lab.train.summary import curve_points

CURVES_FILE = "curves.png"
SPLITS = ("train", "validation")
MAX_VARIANTS = 12  # more lines than a legend can name are not a figure


def variant_name(trial: str) -> str:
    """The trial's name without its seed: ``variant=A-h8,seed=3`` -> ``variant=A-h8``."""
    return re.sub(r"(^|,)seed=-?\d+(?=,|$)", "", trial).strip(",") or "all"


def variant_curves(sweep_dir: str, rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, tuple]]:
    """``{split: {variant: (steps, mean, low, high)}}`` of the loss over the finished trials' seeds, at the steps
    every seed of the variant logged."""
    seeds: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("status") in ("ok", "skipped"):
            seeds.setdefault(variant_name(row["trial"]), []).append(
                curve_points(os.path.join(sweep_dir, row["trial"])).get("loss", {}))
    out: dict[str, dict[str, tuple]] = {split: {} for split in SPLITS}
    for variant, runs in seeds.items():
        for split in SPLITS:
            series = [dict(zip(*run[split])) for run in runs if split in run]
            if len(series) != len(runs):
                continue
            steps = sorted(set.intersection(*(set(s) for s in series)))
            if steps:
                values = np.array([[s[step] for step in steps] for s in series])  # (seeds, steps)
                out[split][variant] = (steps, values.mean(0), values.min(0), values.max(0))
    return {split: curves for split, curves in out.items() if curves}


def write_variant_curves(out_dir: str, sweep_dir: str, rows: Sequence[dict[str, Any]]) -> str | None:
    """``<out_dir>/curves.png``: a panel per split, a line per variant (mean) with its seeds' band; None when no
    trial logged a loss or there are more than :data:`MAX_VARIANTS` variants."""
    curves = variant_curves(sweep_dir, rows)
    if not curves or max(len(c) for c in curves.values()) > MAX_VARIANTS:
        return None
    from attn_lab.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 3.8), squeeze=False)
    for ax, (split, lines) in zip(axes[0], curves.items()):
        for variant, (steps, mean, low, high) in lines.items():
            (line,) = ax.plot(steps, mean, label=variant)
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
        ax.set(xlabel="step", ylabel="loss", title=f"{split} loss: mean over seeds, band min-max")
        ax.legend(fontsize="x-small")
    path = os.path.join(out_dir, CURVES_FILE)
    save_figure(fig, path)
    return path
