"""One report per experiment type: a finished sweep's rows (and its trials' analysis files) -> tables and plots.

Each report function takes ``(rows, sweep_dir, exp, out_dir, bench)`` -- rows from
:func:`attn_lab.sweep.runner.collect`, the experiment, where to draw PNGs, and the attention benchmark's CSV rows
(variants only) -- and returns its tables; every table carries the published numbers for the same comparison.
Failed trials stay visible: a row whose trials did not all finish gets a status column ('failed (1 of 3 seeds)';
its numbers are over the seeds that finished, '–' when none did), and every report ends with the trials without
results and their error lines.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from attn_lab.analysis import plots
from attn_lab.reporting import published as pub
from attn_lab.reporting.tables import Table, column, grouped, mean_std, read_json, statuses, unfinished_table

KINDS = ("encoder_self", "decoder_self", "cross")


def _metric(row: dict) -> str:
    return "test_bleu" if "test_bleu" in row else "test_accuracy"


def _variant(row: dict) -> str:
    return row.get("variant", row["trial"].rsplit(",seed=", 1)[0])


def _by_variant(rows: list[dict]) -> dict[str, list[dict]]:
    return grouped(rows, _variant)


def _every_variant(rows: list[dict]) -> list[tuple[str, list[dict], str]]:
    """(variant, its finished rows, its status) for every variant, failed ones included, in first-seen order."""
    done = _by_variant(rows)
    return [(v, done.get(v, []), status) for v, status in statuses(rows, _variant).items()]


def _with_status(header: list[str], body: list[list], status: list[str]) -> tuple[list[str], list[list]]:
    """Adds a status column when some row's trials did not all finish (tables of finished sweeps stay as they were)."""
    if all(s == "ok" for s in status):
        return header, body
    return [*header, "status"], [[*row, s] for row, s in zip(body, status)]


def _analyses(sweep_dir: str, group: list[dict], name: str) -> list[Any]:
    """``analysis/<name>.json`` of every seed of a group that has it."""
    found = [read_json(os.path.join(sweep_dir, r["trial"], "analysis", f"{name}.json")) for r in group]
    return [f for f in found if f is not None]


def _errorbar_plot(path: str, series: dict[str, tuple[list, list[list[float]]]], xlabel: str, ylabel: str,
                   title: str) -> None:
    """Mean line with the seeds' min-max as error bars, one series per name."""
    lines = {name: (x, [float(np.mean(v)) for v in ys]) for name, (x, ys) in series.items()}
    plots.line_plot(path, lines, xlabel=xlabel, ylabel=ylabel, title=title,
                    spread={name: [(min(v), max(v)) for v in ys] for name, (_, ys) in series.items()})


def head_count(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Vaswani et al. Table 3 style: heads, d_k, key/value heads, params, BLEU, exact match, perplexity."""
    body, series, status = [], {}, []
    for variant, g, state in _every_variant(rows):
        ov = exp.variants.get(variant, {})
        h, dk = ov.get("model.num_heads"), ov.get("model.head_dim")
        kv = ov.get("model.num_kv_heads") or h
        paper = pub.VASWANI_TABLE3.get((h, 512 // h)) if variant.startswith("A-") and h else None
        status.append(state)
        body.append([variant, h, dk, kv, g[0]["num_params"] if g else None, mean_std(column(g, "test_bleu"), 2),
                     mean_std(column(g, "test_exact_match")), mean_std([math.exp(v) for v in column(g, "test_loss")], 3),
                     mean_std(column(g, "steps_per_sec"), 1), "–" if paper is None else f"{paper[0]} / {paper[1]}"])
        family = variant.split("-")[0]
        if family in ("A", "B") and g:
            x, ys = series.setdefault(f"{family}: " + ("d_k = d_model / h" if family == "A" else f"d_k = {dk}"),
                                      ([], []))
            x.append(h)
            ys.append(column(g, "test_exact_match"))
    _errorbar_plot(os.path.join(out_dir, "head_count.png"), series, "heads h", "test exact match", "head count")
    header = ["variant", "h", "d_k", "kv heads", "params", "BLEU", "exact match", "PPL", "steps/s",
              "Vaswani PPL / BLEU"]
    note = (f"Mean ± std (seeds). Published: Vaswani et al. Table 3 rows (A), same h at d_model 512. "
            f"{pub.VASWANI_NOTE} Rows (B) (h=8): d_k 16 -> 5.16 / 25.1, d_k 32 -> 5.01 / 25.4. Multi-query "
            f"(Shazeer 2019): BLEU {pub.MULTI_QUERY['mha']['bleu']} -> {pub.MULTI_QUERY['mqa']['bleu']}; GQA-8 "
            f"(Ainslie et al. 2023): {pub.GROUPED_QUERY['mha']} -> {pub.GROUPED_QUERY['gqa8']} (MQA "
            f"{pub.GROUPED_QUERY['mqa']}).")
    header, body = _with_status(header, body, status)
    return [Table("Head count", header, body, note), *unfinished_table(rows)]


def _all_but_one(found: list[dict]) -> Table:
    kinds = [k for k in KINDS if k in found[0]["all_but_one"]]
    layers = len(found[0]["all_but_one"][kinds[0]])
    body = []
    for layer in range(layers):
        ours = [mean_std([f["all_but_one"][k][layer]["delta"] for f in found]) for k in kinds]
        paper = [f"{pub.MICHEL_ALL_BUT_ONE[k][layer][0]:+.2f}{'*' if pub.MICHEL_ALL_BUT_ONE[k][layer][1] else ''}"
                 for k in kinds]
        body.append([layer + 1, *ours, *paper])
    metric = found[0].get("metric", "accuracy")
    return Table(f"All-but-one head per layer (delta {metric})", ["layer", *kinds, *(f"Michel {k}" for k in kinds)],
                 body, "Michel et al. 2019 Table 2 (delta BLEU, WMT EN-FR, 6 layers; * significant) for the same "
                 "layer numbers.")


def _single_head(found: list[dict]) -> Table:
    kinds = [k for k in KINDS if k in found[0]["single_head"]]
    body = []
    for kind in kinds:
        deltas = [np.asarray(f["single_head"][kind]["delta"]) for f in found]
        p = [np.asarray(f["single_head"][kind]["p_not_worse"]) for f in found]
        worse = [int((x < 0.05).sum()) for x in p]
        body.append([kind, deltas[0].size, mean_std(worse, 1), mean_std([d.min() for d in deltas], 4),
                     mean_std([d.max() for d in deltas], 4)])
    return Table("Single head masked", ["kind", "heads", "significantly worse (p<0.05)", "min delta", "max delta"],
                 body, f"Published: {pub.MICHEL_SINGLE_HEAD}.")


def _curves(found: list[dict], out_dir: str) -> Table:
    orders = ("importance", "reverse", "random")
    percents = [p["percent"] for p in found[0]["importance"]]
    body = [[f"{pct:.0f}%", *(mean_std([f[o][i]["score"] for f in found]) for o in orders)]
            for i, pct in enumerate(percents)]
    _errorbar_plot(os.path.join(out_dir, "pruning_curves.png"),
                   {o: (percents, [[f[o][i]["score"] for f in found] for i in range(len(percents))]) for o in orders},
                   "% of heads pruned", found[0].get("metric", "accuracy"), "iterative pruning")
    return Table("Iterative pruning", ["pruned", *orders], body, f"Published: {pub.MICHEL_PRUNING}.")


def _gates(found: list[list[dict]]) -> Table:
    kinds = [k for k in KINDS if k in next((r["binary"] for r in found[0] if "binary" in r), {})]
    body = []
    for i, row in enumerate(found[0]):
        per_kind = [mean_std([sum(map(sum, f[i]["binary"][k])) for f in found], 1) if "binary" in row else "all"
                    for k in kinds]
        body.append([row["target"], mean_std([f[i]["kept"] for f in found], 1), *per_kind,
                     mean_std([f[i]["test"] for f in found], 3)])
    voita = "; ".join(f"{'/'.join(map(str, k))} -> {b}" for k, b in pub.VOITA_GATES)
    return Table(f"L0 gates (test {found[0][0]['metric']})", ["target share", "heads kept", *kinds, "metric"], body,
                 f"Voita et al. 2019 (heads kept enc/dec/dec-enc -> BLEU, WMT EN-RU): {voita}.")


def pruning(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Michel et al. tables (single head, all-but-one, curves), structural speed-up and Voita et al. gates."""
    group = next(iter(_by_variant(rows).values()), [])
    tables = []
    ablate = _analyses(sweep_dir, group, "ablate")
    if ablate:
        tables += [_single_head(ablate), _all_but_one(ablate)]
    curves = _analyses(sweep_dir, group, "prune")
    if curves:
        tables.append(_curves(curves, out_dir))
    structural = _analyses(sweep_dir, group, "structural")
    if structural:
        tables.append(Table("Structural pruning", ["% heads removed", "batch", "speed-up vs full",
                                                   "speed-up vs masked", "max |pruned - masked|"],
                            [[f"{structural[0]['percent_pruned']:.0f}%", structural[0]["batch_size"],
                              mean_std([s["speedup_vs_full"] for s in structural], 2),
                              mean_std([s["speedup_vs_masked"] for s in structural], 2),
                              f"{max(s['max_abs_diff'] for s in structural):.1e}"]], f"Published: {pub.MICHEL_SPEED}."))
    gates = _analyses(sweep_dir, group, "gates")
    if gates:
        tables.append(_gates(gates))
    return tables + unfinished_table(rows)


def _prunable_within(curve: list[dict], margin: float) -> float:
    """Largest % of heads pruned (importance order) with the score still within ``margin`` of the full model's."""
    base = curve[0]["score"]
    ok = [p["percent"] for p in curve if p["score"] >= base - margin]
    return max(ok) if ok else 0.0


def diversity(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Li et al. style: each regularizer vs the baseline -- metric, head similarity, robustness to pruning (the share
    of heads prunable within 1 BLEU, and the metric after the first pruning step, both in importance order)."""
    body, first, status = [], None, []
    for variant, g, state in _every_variant(rows):
        metric = _metric(g[0]) if g else "test_accuracy"
        status.append(state)
        diag = _analyses(sweep_dir, g, "diagnose")
        sims = [np.mean([v["mean_similarity"] for v in d.values()]) for d in diag]
        prune = _analyses(sweep_dir, g, "prune")
        margin = 1.0 if prune and prune[0].get("metric") == "bleu" else 0.01
        first = first or (prune[0]["importance"][1]["percent"] if prune else None)
        body.append([variant, mean_std(column(g, metric), 3), mean_std(column(g, "test_exact_match"), 3),
                     mean_std(sims, 3), mean_std([_prunable_within(p["importance"], margin) for p in prune], 0),
                     mean_std([p["importance"][1]["score"] for p in prune], 2)])
    li = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in pub.LI_DIVERSITY.items())
    header, body = _with_status(["variant", "BLEU / accuracy", "exact match", "mean head map similarity",
                                 "% heads prunable within 1 BLEU", f"metric with {first or 0:.1f}% of heads pruned"],
                                body, status)
    return [Table("Head diversity", header, body,
                  f"Li et al. 2018 (disagreement regularization, BLEU base -> regularized): {li}."),
            *unfinished_table(rows)]


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
    """The benchmark row of the sweep's ``dense`` variant: ``dense`` with its default options (what training
    ran) when the CSV has it, else ``dense/xla`` (CSVs from before dense's 'auto' default)."""
    return "dense" if any(r["label"] == "dense" for r in bench) else "dense/xla"


def variants(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """LRA-style: ListOps accuracy per kernel, train speed vs dense in the same sweep, benchmark ratios, LRA's; the
    ratios vs cuDNN flash attention too when the benchmark measured it (on a GPU that is what dense competes with)."""
    groups, bench = _by_variant(rows), bench or []
    dense_sps = np.mean(column(groups.get("dense", []), "steps_per_sec") or [float("nan")])
    cudnn = any(r.get("speedup_vs_cudnn") for r in bench)
    fmt = lambda v: "–" if v is None else f"{v:.2f}x"
    body, status = [], []
    for variant, g, state in _every_variant(rows):
        status.append(state)
        label = _dense_label(bench) if variant == "dense" else variant
        speed = pub.LRA_SPEED.get(variant)
        vs_cudnn = [f"{fmt(_bench_column(bench, label, 4096, 'speedup_vs_cudnn'))} / "
                    f"{fmt(_bench_column(bench, label, 4096, 'memory_vs_cudnn'))}"] if cudnn else []
        body.append([variant, mean_std([100 * a for a in column(g, "test_accuracy")], 1),
                     f"{np.mean(column(g, 'steps_per_sec')) / dense_sps:.2f}x" if g else "–",
                     fmt(_bench_ratio(bench, label, 1024, "fwd_bwd_seconds")),
                     fmt(_bench_ratio(bench, label, 4096, "fwd_bwd_seconds")),
                     fmt(_bench_ratio(bench, label, 4096, "temp_bytes")), *vs_cudnn,
                     pub.LRA_LISTOPS.get(variant, "–"), "–" if speed is None else f"{speed[0]}x / {speed[1]}x"])
    header = ["kernel", "ListOps accuracy %", "train steps/s vs dense", "fwd+bwd speed 1K", "fwd+bwd speed 4K",
              "memory 4K", *(["speed / memory vs cuDNN 4K"] if cudnn else []), "LRA ListOps %", "LRA speed 1K / 4K"]
    note = ("Speed and memory ratios: scripts/bench_attention.py (jax.nn.dot_product_attention = 1; '–' when "
            "its CSV is absent). ")
    if cudnn:
        note += ("vs cuDNN: the same ratios against cuDNN flash attention (jax.nn.dot_product_attention with "
                 "implementation='cudnn' = 1), from the benchmark's own columns. ")
    header, body = _with_status(header, body, status)
    return [Table("Efficient attention (ListOps)", header, body,
                  note + "LRA: Tay et al. 2020 (TPU v3, byte-level text for speed)."), *unfinished_table(rows)]


REPORTS = {"head_count": head_count, "pruning": pruning, "diversity": diversity, "variants": variants}
