"""How a finished run reads at a glance: ``curves.png`` (loss and the task's metric against step) and one summary
line -- what a researcher looks at first; the whole record stays in results.json (``--print-json`` prints it).
"""

from __future__ import annotations

import math
import os
from typing import Any

from attn_lab import results

CURVES_FILE = "curves.png"
# The task metric a curve shows: the first of these a run validates (translation: BLEU; otherwise token accuracy)
METRICS = ("bleu", "exact_match", "accuracy")
LABELS = {"bleu": "BLEU", "exact_match": "exact match", "accuracy": "token accuracy", "loss": "loss"}


def curve_points(workdir: str) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """``{'loss': {'train': (steps, values), 'validation': ...}, '<metric>': {...}}`` from metrics.jsonl (the
    logged training windows and every validation), finite values only."""
    panels: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for record in results.metric_lines(workdir):
        for key, value in record.items():
            prefix, _, name = key.partition("/")
            if prefix not in ("train", "eval") or name not in ("loss", *METRICS) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value):
                continue
            steps, values = panels.setdefault(name, {}).setdefault(
                "train" if prefix == "train" else "validation", ([], []))
            steps.append(int(record["step"]))
            values.append(float(value))
    metric = next((m for m in METRICS if m in panels and "validation" in panels[m]), None)
    return {k: v for k, v in panels.items() if k == "loss" or k == metric}


def write_curves(workdir: str) -> str | None:
    """``<workdir>/curves.png``: a panel per quantity (loss; the task metric), training and validation against
    step, each axis over its whole range; None when nothing was logged."""
    panels = curve_points(workdir)
    if not panels:
        return None
    from attn_lab.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.5), squeeze=False)
    for ax, (name, lines) in zip(axes[0], sorted(panels.items(), key=lambda kv: kv[0] != "loss")):
        for split, (steps, values) in lines.items():
            ax.plot(steps, values, marker="o" if len(steps) < 20 else None, label=split)
        ax.set(xlabel="step", ylabel=LABELS.get(name, name), title=LABELS.get(name, name))
        ax.legend()
    path = os.path.join(workdir, CURVES_FILE)
    save_figure(fig, path)
    return path


def example_line(record: dict[str, Any], width: int = 100) -> str | None:
    """``example: source '...' | reference '...' | ours '...'`` of a translation run (the test split's first
    example, decoded as scored) or ``example: prompt '...' | ours '...'`` of a language model (its greedy
    continuation of the test split's first text), each text cut to ``width`` characters; None for other runs."""
    example = record.get("example")
    if not example:
        return None
    cut = {k: v if len(v) <= width else v[: width - 3] + "..." for k, v in example.items()}
    return "example: " + " | ".join(f"{k} {v!r}" for k, v in cut.items())


def summary_line(workdir: str, record: dict[str, Any]) -> str:
    """``<workdir>: <steps> steps in <s> s (<r> steps/s after compilation); test loss ... (perplexity ...), <metric>
    ...; files: results.json, metrics.jsonl, curves.png``."""
    test = record.get("final", {}).get("test", {})
    scores = []
    if "loss" in test:
        scores.append(f"test loss {test['loss']:.4f} (perplexity {math.exp(min(test['loss'], 700)):.3g})"
                      if isinstance(test["loss"], (int, float)) else f"test loss {test['loss']}")
    scores += [f"{LABELS[m]} {test[m]:.4g}" if isinstance(test[m], (int, float)) else f"{LABELS[m]} {test[m]}"
               for m in reversed(METRICS) if m in test]
    steady, whole = record.get("steady_steps_per_sec"), record.get("steps_per_sec")
    speed = (f" ({steady:.2f} steps/s after compilation)" if steady else
             f" ({whole:.2f} steps/s, compilation included: one log window)" if whole else "")
    files = [f for f in (results.RESULTS_FILE, results.METRICS_FILE, CURVES_FILE)
             if os.path.exists(os.path.join(workdir, f))]
    wall = record.get("wall_time_sec")  # None: training.json was lost before a resumed final test
    took = f"{wall:.0f} s" if isinstance(wall, (int, float)) else "an unrecorded time"
    return (f"{workdir}: {record.get('steps', '?')} steps in {took}{speed}; "
            f"{', '.join(scores) or 'no test scores'}; files: {', '.join(files)}")
