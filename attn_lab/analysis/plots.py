"""PNG plots for head analyses and result tables (matplotlib, Agg backend, atomic writes)."""

from __future__ import annotations

import numpy as np

from attn_lab.figures import pyplot, save_figure  # noqa: F401 (re-exported: the plots below and forks use them)


def grid_plot(path: str, grids: dict[str, np.ndarray], title: str) -> None:
    """One layer x head heatmap per attention kind, side by side."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(grids), figsize=(4 * len(grids), 3), squeeze=False)
    for ax, (kind, grid) in zip(axes[0], grids.items()):
        im = ax.imshow(np.asarray(grid), cmap="viridis", aspect="auto")
        ax.set(title=kind, xlabel="head", ylabel="layer")
        _integer_ticks(ax.xaxis, ax.yaxis)  # layers and heads are counted: no tick at layer 0.5
        fig.colorbar(im, ax=ax)
    fig.suptitle(title)
    save_figure(fig, path)


def histogram_plot(path: str, values: dict[str, np.ndarray], *, xlabel: str, title: str,
                   bins: np.ndarray | int = 20) -> None:
    """One histogram panel per name (e.g. learned entmax alpha of every head, per attention kind)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(values), figsize=(4 * len(values), 3), squeeze=False)
    for ax, (name, v) in zip(axes[0], values.items()):
        ax.hist(np.ravel(v), bins=bins)
        ax.set(title=name, xlabel=xlabel, ylabel="heads")
    fig.suptitle(title)
    save_figure(fig, path)


def _integer_ticks(*axes) -> None:
    from matplotlib.ticker import MaxNLocator

    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True))


def line_plot(path: str, lines: dict[str, tuple[list[float], list[float]]], *, xlabel: str, ylabel: str,
              title: str, spread: dict[str, list[tuple[float, float]]] | None = None,
              spread_label: str = "error bars: min-max over seeds") -> None:
    """One line per name through its (x, y) points, e.g. a metric vs % of heads pruned per pruning order;
    ``spread[name]``: a (low, high) error bar per point (e.g. the seeds' range), named by ``spread_label`` in the
    legend's title. An x axis of whole numbers only (heads kept, layers) gets whole-number ticks."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, (x, y) in lines.items():
        if spread and name in spread:
            low, high = np.array(spread[name]).T
            yerr = np.maximum([np.array(y) - low, high - np.array(y)], 0.0)  # float noise when all seeds agree
            ax.errorbar(x, y, yerr=yerr, marker="o", capsize=3, label=name)
        else:
            ax.plot(x, y, marker="o", label=name)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    _say_zoom(ax, [v for _, y in lines.values() for v in y])
    if all(float(v).is_integer() for x, _ in lines.values() for v in x):
        _integer_ticks(ax.xaxis)
    ax.legend(title=spread_label if spread else None, title_fontsize="small")
    save_figure(fig, path)


ZOOM = 0.05  # a y range narrower than this share of the values' size is a zoom, and the plot says so


def _say_zoom(ax, values: list[float]) -> None:
    """Matplotlib fits the y axis to the data, so a spread of 0.15 points at 99.9 fills the panel like a cliff;
    such a zoom is written on the plot (the spread and the values' scale) so that it is not read as a large change."""
    finite = np.asarray([v for v in values if np.isfinite(v)], np.float64)
    if finite.size < 2:
        return
    spread, size = float(np.ptp(finite)), float(np.max(np.abs(finite)))
    if size > 0 and spread < ZOOM * size:
        ax.text(0.02, 0.02, f"y axis zoomed: all values within {spread:.3g} ({finite.min():.4g} to {finite.max():.4g})",
                transform=ax.transAxes, fontsize="small", color="dimgray")


def maps_plot(path: str, captured: dict, kind: str, example: int) -> None:
    """Attention maps of one example: a row per layer, a column per head (valid keys only)."""
    plt = pyplot()
    names = sorted(n for n in captured if n.startswith(kind + "/"))
    heads = captured[names[0]]["maps"].shape[1]
    fig, axes = plt.subplots(len(names), heads, figsize=(2 * heads, 2 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        valid = captured[name]["valid_keys"][example]  # (S,) or, causal, (T, S): keys any row may see
        valid = valid if valid.ndim == 1 else valid.any(0)
        for head in range(heads):
            grid = captured[name]["maps"][example, head]
            axes[row][head].imshow(grid[:, valid], cmap="viridis")  # (queries, valid keys)
            axes[row][head].set(title=f"{name} h{head}", xticks=[], yticks=[])
    save_figure(fig, path)
