"""What every head-analysis method is handed (:class:`AnalysisContext`): the restored run, the flags the methods share,
the batches and scorer they measure with, and the one way they write what they found.

Every method writes ``<workdir>/analysis/<name>.json``, draws its layer x head grids as ``<name>.png`` and puts each
head's value in the W&B summary as ``<prefix>/<kind>/L<layer>/h<head>``: :meth:`AnalysisContext.output` does the
three, so a method states what it found, not where it goes.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
from typing import Any, Callable, Iterator

import numpy as np
from flax import nnx

from attn_lab.analysis import importance, plots
from attn_lab.analysis.importance import Scorer
from attn_lab.io import write_json_atomic
from attn_lab.models import mask_shapes
from attn_lab.results import METRICS_FILE
from attn_lab.train.logging import MetricLogger
from attn_lab.train.restore import FinishedRun
from attn_lab.train.state import merge


@dataclasses.dataclass(frozen=True)
class SharedFlags:
    """The flags of ``python -m attn_lab.analysis`` that more than one method reads (a method's own flags live in
    its module)."""

    workdir: str
    split: str  # what importance, ablations and pruning measure on
    max_batches: int
    metric: str  # what ablations and pruning score: accuracy, log_likelihood, bleu or exact_match


def per_head(prefix: str, grids: dict[str, Any]) -> dict[str, float]:
    """``{kind: [L, N]}`` -> ``{'<prefix>/<kind>/L<l>/h<h>': value}`` for W&B summaries."""
    return {f"{prefix}/{kind}/L{layer}/h{head}": float(v) for kind, grid in grids.items()
            for layer, row in enumerate(np.asarray(grid)) for head, v in enumerate(row)}


@dataclasses.dataclass
class AnalysisContext:
    """One analysis of one finished run, shared by the methods it runs in turn."""

    run: FinishedRun
    flags: SharedFlags
    batches: list[dict]  # the first --max-batches batches of --split
    score: Scorer  # --metric under static head masks {kind: [L, N]}
    shapes: dict[str, tuple[int, int]]  # kind -> (layers, heads)
    importance_sums: Callable  # compiled once: every method's importance reuses it
    out_dir: str  # <workdir>/analysis
    logger: MetricLogger  # metrics.jsonl of the analysis, and its W&B run
    _steps: Iterator[int] = dataclasses.field(default_factory=itertools.count, repr=False)

    @classmethod
    def open(cls, run: FinishedRun, shared: SharedFlags) -> AnalysisContext:
        """Starts a fresh analysis log (and W&B run, ``<run>-analysis`` in the run's group and mode), compiles the
        importance and scoring passes and takes the batches; close :attr:`logger` when done."""
        out_dir = os.path.join(shared.workdir, "analysis")
        os.makedirs(out_dir, exist_ok=True)
        pathlib.Path(out_dir, METRICS_FILE).unlink(missing_ok=True)  # each analysis is a fresh log (and W&B run)
        w = run.config.wandb
        logger = MetricLogger(out_dir, run.config.to_dict(), mode=w.mode, project=w.project, group=w.group,
                              tags=(*w.tags, "analysis"),
                              name=f"{w.name or os.path.basename(shared.workdir)}-analysis")
        scores, importance_sums = importance.compile_analysis(run.graphdef)
        batches = run.batches(shared.split, shared.max_batches)
        teacher_forced = shared.metric in ("accuracy", "log_likelihood")
        score = (importance.accuracy_scorer(batches, scores, shared.metric == "log_likelihood") if teacher_forced
                 else run.decode_scorer(batches, shared.split, shared.metric))
        return cls(run=run, flags=shared, batches=batches, score=score,
                   shapes=mask_shapes(merge(run.graphdef, run.state)), importance_sums=importance_sums,
                   out_dir=out_dir, logger=logger)

    def model(self) -> nnx.Module:
        """A fresh module of the run's graph and state (its sites, learned spans, grouped heads...)."""
        return merge(self.run.graphdef, self.run.state)

    def head_importance(self, normalize: bool) -> dict[str, np.ndarray]:
        """``{kind: [L, N]}`` E|dL/dxi| over the batches; ``normalize``: unit l2 norm per layer (Michel et al.)."""
        return importance.head_importance(self.run.state, self.batches, self.shapes, self.importance_sums, normalize)

    def path(self, *parts: str) -> str:
        """A path under the analysis folder (a file, or a derived run's folder)."""
        return os.path.join(self.out_dir, *parts)

    def write_json(self, name: str, obj: Any) -> None:
        write_json_atomic(self.path(f"{name}.json"), obj)

    def grid(self, name: str, grids: dict[str, Any], *, title: str, summary_prefix: str) -> None:
        """``<name>.png``, a layer x head heatmap per kind of ``grids`` (``{kind: [L, N]}``), and each head's value
        in the W&B summary under ``summary_prefix``."""
        plots.grid_plot(self.path(f"{name}.png"), grids, title)
        self.summary(per_head(summary_prefix, grids))

    def output(self, name: str, obj: Any, *, grids: dict[str, Any] | None = None, title: str | None = None,
               summary_prefix: str | None = None) -> None:
        """``<name>.json`` = ``obj``; with ``grids``, also :meth:`grid` (``summary_prefix`` defaults to ``name``)."""
        self.write_json(name, obj)
        if grids is not None:
            self.grid(name, grids, title=title or name, summary_prefix=summary_prefix or name)

    def lines(self, name: str, lines: dict[str, tuple[list[float], list[float]]], **labels: str) -> None:
        """``<name>.png``: one line per name through its (x, y) points (``xlabel``, ``ylabel``, ``title``)."""
        plots.line_plot(self.path(f"{name}.png"), lines, **labels)

    def summary(self, metrics: dict[str, Any]) -> None:
        self.logger.summary(metrics)

    def log(self, metrics: dict[str, Any]) -> None:
        """One logged step (metrics.jsonl and W&B); steps count up across methods, as W&B needs."""
        self.logger.log(next(self._steps), metrics)
