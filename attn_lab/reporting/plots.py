"""Plots the experiments' reports share; reports import this inside their functions, so that loading an experiment
file for a sweep (or a dry-run) does not reach the plotting code."""

from __future__ import annotations

import numpy as np

from attn_lab.analysis import plots


def errorbar_plot(path: str, series: dict[str, tuple[list, list[list[float]]]], xlabel: str, ylabel: str,
                  title: str) -> None:
    """Mean line with the seeds' min-max as error bars, one series per name (``name -> (x, per-x seed values)``)."""
    lines = {name: (x, [float(np.mean(v)) for v in ys]) for name, (x, ys) in series.items()}
    plots.line_plot(path, lines, xlabel=xlabel, ylabel=ylabel, title=title,
                    spread={name: [(min(v), max(v)) for v in ys] for name, (_, ys) in series.items()})
