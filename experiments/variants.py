"""Efficient attention on ListOps (Long Range Arena style), one arm per kernel, judged against dense.

  python -m attn_lab.sweep --experiment experiments/variants.py:quick --workdir runs/variants --vmap-seeds
  python scripts/bench_attention.py --out bench/attention     # speed and memory ratios for the same kernels
  python -m attn_lab.reporting --workdir runs/variants --bench bench/attention.csv

Paper table: Long Range Arena (Tay et al. 2020), ListOps accuracy and speed / memory vs the Transformer at 1K and
4K (attn_lab/published/lra.py); our speed and memory ratios come from scripts/bench_attention.py's CSV (``bench``).
Presets: ``quick`` (the quality half: ListOps of 64-128 tokens, depth 4, 450 steps, 5 kernels; speed and memory at
1K/4K come from the benchmark), ``full`` (LRA's ListOps: depth 10, up to 2000 tokens, every kernel), ``gpu``
(LRA-length ListOps, 5 kernels, about 10 minutes on one H200 with --vmap-seeds). Why these budgets and sizes, and
every run: docs/variants.md.
"""

from __future__ import annotations

import numpy as np

from attn_lab.experiment import Finding, Metric, Preset
from attn_lab.published.lra import LRA_LISTOPS, LRA_SPEED
from attn_lab.reporting.default import verdicts
from attn_lab.reporting.tables import Table, column, every_variant, mean_std, unfinished_table, with_status

KERNELS = ["dense", "local", "linformer", "performer", "linear", "bigbird", "longformer", "lsh", "strided"]
# quick: short sequences, so Linformer keeps n/4 projected keys (k = 32) and Performer F = 64 > d log d for d_k 16
QUICK = {"task.min_length": 64, "task.max_length": 128, "task.max_depth": 4, "model.attention.linformer.max_len": 129,
         "model.attention.local.window": 32, "model.attention.linformer.k": 32,
         "model.attention.performer.num_features": 64,
         "train.num_steps": 450, "train.eval_every": 450, "train.checkpoint_every": 450}
LRA_LENGTHS = {"task.min_length": 500, "task.max_length": 2000, "task.max_depth": 10,
               "model.attention.linformer.max_len": 2001}

# --- findings: LRA's, each kernel's accuracy against the Transformer's ------------------------------------------
ACCURACY = Metric("test_accuracy", "test accuracy")
MARGIN = 0.03  # 3 accuracy points: LRA's kernels are within a point of dense (same) or ~20 below (down)


def lra_finding(kernel: str) -> Finding:
    """LRA's finding for ``kernel``: within 3 points of dense there (matches), else below."""
    ours, dense = LRA_LISTOPS[kernel], LRA_LISTOPS["dense"]
    same = abs(ours - dense) < 3
    return Finding(f"{kernel} {'matches' if same else 'is below'} dense on ListOps (LRA)", f"{ours} vs {dense}",
                   "same" if same else "down", MARGIN)


FINDINGS = {k: lra_finding(k) for k in LRA_LISTOPS if k != "dense"}


def preset(name: str, config: str, kernels: list[str], seeds: list[int], overrides: dict) -> Preset:
    """One arm per kernel, each kernel's LRA finding against dense, piloted on seeds 0-4."""
    return Preset(name, config, {k: {"model.attention.name": k} for k in kernels}, seeds,
                  {k: f for k, f in FINDINGS.items() if k in kernels}, "dense", ACCURACY, overrides=overrides)


PRESETS = {
    "quick": preset("variants_quick", "configs/listops.py:quick", KERNELS[:5], [100, 101, 102, 103, 104], QUICK),
    "full": preset("variants_full", "configs/listops.py", KERNELS, [0, 1, 2], LRA_LENGTHS),
    "gpu": preset("variants_gpu", "configs/listops.py", KERNELS[:5], [0, 1, 2], LRA_LENGTHS),
}


# --- report: LRA's columns beside ours --------------------------------------------------------------------------


def _bench_ratio(bench: list[dict], label: str, length: int, field: str) -> float | None:
    """Reference / kernel for ``field`` (seconds or temp bytes) at ``length`` from the attention benchmark's CSV."""
    find = lambda name: next((r for r in bench if r["label"] == name and int(r["length"]) == length
                              and r[field]), None)
    ref, mine = find("jax.nn.dot_product_attention"), find(label)
    return None if ref is None or mine is None else float(ref[field]) / float(mine[field])


def _bench_column(bench: list[dict], label: str, length: int, field: str) -> float | None:
    """A ratio column the benchmark wrote itself (e.g. ``speedup_vs_cudnn``) at ``length``; None where empty."""
    row = next((r for r in bench if r["label"] == label and int(r["length"]) == length and r.get(field)), None)
    return None if row is None else float(row[field])


def _dense_label(bench: list[dict]) -> str:
    """The benchmark row of the sweep's ``dense`` arm: ``dense`` with its default options (what training ran) when
    the CSV has it, else ``dense/xla`` (CSVs from before dense's 'auto' default)."""
    return "dense" if any(r["label"] == "dense" for r in bench) else "dense/xla"


def _row(variant: str, g: list[dict], bench: list[dict], dense_sps: float, cudnn: bool) -> list:
    """One kernel's cells: accuracy, train speed vs dense, the benchmark's ratios, LRA's numbers."""
    fmt = lambda v: "–" if v is None else f"{v:.2f}x"
    label = _dense_label(bench) if variant == "dense" else variant
    speed = LRA_SPEED.get(variant)
    vs_cudnn = [f"{fmt(_bench_column(bench, label, 4096, 'speedup_vs_cudnn'))} / "
                f"{fmt(_bench_column(bench, label, 4096, 'memory_vs_cudnn'))}"] if cudnn else []
    return [variant, mean_std([100 * a for a in column(g, "test_accuracy")], 1),
            f"{np.mean(column(g, 'steps_per_sec')) / dense_sps:.2f}x" if g else "–",
            fmt(_bench_ratio(bench, label, 1024, "fwd_bwd_seconds")),
            fmt(_bench_ratio(bench, label, 4096, "fwd_bwd_seconds")),
            fmt(_bench_ratio(bench, label, 4096, "temp_bytes")), *vs_cudnn,
            LRA_LISTOPS.get(variant, "–"), "–" if speed is None else f"{speed[0]}x / {speed[1]}x"]


def report(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """LRA-style: ListOps accuracy per kernel, train speed vs dense in the same sweep, benchmark ratios, LRA's; the
    ratios vs cuDNN flash attention too when the benchmark measured it (on a GPU that is what dense competes with)."""
    listed, bench = every_variant(rows), bench or []
    dense = next((g for variant, g, _ in listed if variant == "dense"), [])
    dense_sps = np.mean(column(dense, "steps_per_sec") or [float("nan")])
    cudnn = any(r.get("speedup_vs_cudnn") for r in bench)
    body = [_row(variant, g, bench, dense_sps, cudnn) for variant, g, _ in listed]
    header = ["kernel", "ListOps accuracy %", "train steps/s vs dense", "fwd+bwd speed 1K", "fwd+bwd speed 4K",
              "memory 4K", *(["speed / memory vs cuDNN 4K"] if cudnn else []), "LRA ListOps %", "LRA speed 1K / 4K"]
    note = ("Speed and memory ratios: scripts/bench_attention.py (jax.nn.dot_product_attention = 1; '–' when "
            "its CSV is absent). ")
    if cudnn:
        note += ("vs cuDNN: the same ratios against cuDNN flash attention (jax.nn.dot_product_attention with "
                 "implementation='cudnn' = 1), from the benchmark's own columns. ")
    header, body = with_status(header, body, [state for _, _, state in listed])
    judged = verdicts(rows, sweep_dir, exp, ACCURACY.label) if dense else None  # no baseline: nothing to judge
    return [Table("Efficient attention (ListOps)", header, body,
                  note + "LRA: Tay et al. 2020 (TPU v3, byte-level text for speed)."),
            *([judged] if judged else []), *unfinished_table(rows)]
