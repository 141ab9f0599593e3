"""Figures written as files: matplotlib with the Agg backend (no display) and atomic PNG writes, for every layer that
draws (a run's curves.png, the head analysis, the sweep's tables)."""

from __future__ import annotations

import os


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str) -> None:
    """Writes the PNG atomically (a temp file renamed into place) and frees the figure."""
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    pyplot().close(fig)
    os.replace(tmp, path)
