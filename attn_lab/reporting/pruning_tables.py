"""The head-importance and pruning tables of experiments/pruning.py, beside Michel et al. 2019 and Voita et al. 2019
(:mod:`attn_lab.published.michel`), each from the analysis files ``python -m attn_lab.analysis`` writes per trial
(``ablate.json``, ``prune.json``, ``structural.json``, ``gates.json``); and the reading of the pruning curves the
experiment's findings are judged on (:func:`per_seed`, :func:`score_at`, :func:`half_point`).

The ``*_table`` functions take the analysis files of one arm's seeds (a list, or ``{seed: file}`` where a table
pairs by seed) and return a :class:`Table`, or None when the files hold nothing to show.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from attn_lab.analysis import pruning as pruning_lib
from attn_lab.published.michel import MICHEL_ALL_BUT_ONE, MICHEL_PRUNING, MICHEL_SINGLE_HEAD, MICHEL_SPEED, VOITA_GATES
from attn_lab.reporting.tables import Table, mean_std, read_json

KINDS = ("encoder_self", "decoder_self", "cross")
ORDERS = ("importance", "importance_raw", "reverse", "random")


# --- reading the curves -----------------------------------------------------------------------------------------


def per_seed(sweep_dir: str, group: list[dict], name: str) -> dict[int, dict]:
    """``{seed: analysis/<name>.json}`` for the seeds that have it (paired comparisons need the seed)."""
    found = {int(r["seed"]): read_json(os.path.join(sweep_dir, r["trial"], "analysis", f"{name}.json"))
             for r in group if "seed" in r}
    return {seed: f for seed, f in found.items() if f is not None}


def score_at(prune: Mapping, order: str, percent: float) -> float:
    """An order's score at the pruning step nearest ``percent`` % of heads pruned; ``'full'``: the unpruned model
    (every curve's first point)."""
    if order == "full":
        return prune["importance"][0]["score"]
    return min(prune[order], key=lambda p: abs(p["percent"] - percent))["score"]


def half_point(curves: Mapping[int, dict], order: str = "random", midpoint: bool = False) -> float:
    """The % pruned at which ``order``'s mean curve over seeds is nearest half the mean unpruned score
    (``midpoint``: nearest the middle of the mean curve's first and last values -- for a log-likelihood, which has
    no zero to halve). There a better order has room to show: both curves are off the floor."""
    points = [p["percent"] for p in next(iter(curves.values()))[order]]
    mean = np.mean([[p["score"] for p in f[order]] for f in curves.values()], axis=0)  # (steps,)
    target = (mean[0] + mean[-1]) / 2 if midpoint else mean[0] / 2
    return float(points[int(np.argmin(np.abs(mean - target)))])


def comparison_note(planned: float | None, half: float, midpoint: bool) -> str:
    """The verdict table's sentence on where orders were compared: the plan's point (or, with none yet, this
    run's own, as a pilot records it) beside the point these curves give."""
    fixed = "the design's" if planned is not None else "these curves' own (no pilot value yet)"
    where = "midway between its unpruned and last values" if midpoint else "half the unpruned score"
    return (f" Orders compared at {planned if planned is not None else half:.1f}% pruned ({fixed} "
            f"{'midpoint' if midpoint else 'half point'}); "
            f"in this run the mean random curve is nearest {where} at {half:.1f}%.")


# --- tables -----------------------------------------------------------------------------------------------------


def all_but_one_table(found: list[dict]) -> Table:
    """Every head of a layer masked but one, per layer and kind, beside Michel et al.'s Table 2."""
    kinds = [k for k in KINDS if k in found[0]["all_but_one"]]
    layers = len(found[0]["all_but_one"][kinds[0]])
    body = []
    for layer in range(layers):
        ours = [mean_std([f["all_but_one"][k][layer]["delta"] for f in found]) for k in kinds]
        paper = [f"{MICHEL_ALL_BUT_ONE[k][layer][0]:+.2f}{'*' if MICHEL_ALL_BUT_ONE[k][layer][1] else ''}"
                 for k in kinds]
        body.append([layer + 1, *ours, *paper])
    metric = found[0].get("metric", "accuracy")
    return Table(f"All-but-one head per layer (delta {metric})", ["layer", *kinds, *(f"Michel {k}" for k in kinds)],
                 body, "Michel et al. 2019 Table 2 (delta BLEU, WMT EN-FR, 6 layers; * significant) for the same "
                 "layer numbers.")


def single_head_table(found: list[dict]) -> Table:
    """One head masked at a time: how many heads make the metric significantly worse, and the range of changes."""
    kinds = [k for k in KINDS if k in found[0]["single_head"]]
    body = []
    for kind in kinds:
        deltas = [np.asarray(f["single_head"][kind]["delta"]) for f in found]
        p = [np.asarray(f["single_head"][kind]["p_not_worse"]) for f in found]
        worse = [int((x < 0.05).sum()) for x in p]
        body.append([kind, deltas[0].size, mean_std(worse, 1), mean_std([d.min() for d in deltas], 4),
                     mean_std([d.max() for d in deltas], 4)])
    return Table("Single head masked", ["kind", "heads", "significantly worse (p<0.05)", "min delta", "max delta"],
                 body, f"Published: {MICHEL_SINGLE_HEAD}.")


def curves_table(found: list[dict], out_dir: str) -> Table:
    """The iterative pruning curves (mean ± sd over seeds per step and order), plotted to pruning_curves.png."""
    from attn_lab.reporting.plots import errorbar_plot

    orders = [o for o in ORDERS if o in found[0]]
    percents = [p["percent"] for p in found[0]["importance"]]
    body = [[f"{pct:.0f}%", *(mean_std([f[o][i]["score"] for f in found]) for o in orders)]
            for i, pct in enumerate(percents)]
    errorbar_plot(os.path.join(out_dir, "pruning_curves.png"),
                  {o: (percents, [[f[o][i]["score"] for f in found] for i in range(len(percents))]) for o in orders},
                  "% of heads pruned", found[0].get("metric", "accuracy"), "iterative pruning")
    return Table("Iterative pruning", ["pruned", *orders], body, f"Published: {MICHEL_PRUNING}.")


def structural_table(found: list[dict]) -> Table:
    """The speed-up of removing pruned heads from the weights (vs the full model and vs masking them)."""
    return Table("Structural pruning", ["% heads removed", "batch", "speed-up vs full", "speed-up vs masked",
                                        "max |pruned - masked|"],
                 [[f"{found[0]['percent_pruned']:.0f}%", found[0]["batch_size"],
                   mean_std([s["speedup_vs_full"] for s in found], 2),
                   mean_std([s["speedup_vs_masked"] for s in found], 2),
                   f"{max(s['max_abs_diff'] for s in found):.1e}"]], f"Published: {MICHEL_SPEED}.")


def gates_table(found: list[list[dict]]) -> Table:
    """L0 gates trained to each target share of heads: heads kept per kind and the test metric, beside Voita et al."""
    kinds = [k for k in KINDS if k in next((r["binary"] for r in found[0] if "binary" in r), {})]
    body = []
    for i, row in enumerate(found[0]):
        per_kind = [mean_std([sum(map(sum, f[i]["binary"][k])) for f in found], 1) if "binary" in row else "all"
                    for k in kinds]
        body.append([row["target"], mean_std([f[i]["kept"] for f in found], 1), *per_kind,
                     mean_std([f[i]["test"] for f in found], 3)])
    voita = "; ".join(f"{'/'.join(map(str, k))} -> {b}" for k, b in VOITA_GATES)
    return Table(f"L0 gates (test {found[0][0]['metric']})", ["target share", "heads kept", *kinds, "metric"], body,
                 f"Voita et al. 2019 (heads kept enc/dec/dec-enc -> BLEU, WMT EN-RU): {voita}.")


def random_baseline_table(curves: Mapping[int, dict], ablate: Mapping[int, dict]) -> Table | None:
    """The random order's first step (one head pruned) per seed: the mean of the run's random orders against the
    exact expectation of removing one uniformly random head (the full score plus the mean single-head ablation
    change), which has no sampling noise: how far the averaged random curve is from what it estimates."""
    seeds = sorted(s for s in curves if s in ablate and "random" in curves[s] and len(curves[s]["random"]) > 1
                   and curves[s]["random"][1].get("pruned") == 1)  # the expectation is of one head removed
    if not seeds:
        return None
    body = []
    for s in seeds:
        first = curves[s]["random"][1]
        single = ablate[s]["single_head"]  # {'baseline': the unmasked score, kind: {'delta': [L][N], ...}}
        deltas = {k: v["delta"] for k, v in single.items() if isinstance(v, dict)}
        exact = pruning_lib.expected_one_head_removal(single.get("baseline", curves[s]["random"][0]["score"]), deltas)
        orders = first.get("scores", [first["score"]])
        body.append([s, f"{first['percent']:.1f}%", f"{exact:.3f}", f"{first['score']:.3f}",
                     f"{np.std(orders, ddof=1) if len(orders) > 1 else float('nan'):.3f} ({len(orders)})"])
    return Table("Random pruning baseline: one head removed", ["seed", "pruned", "exact expectation",
                                                               "mean of random orders", "sd over orders (orders)"],
                 body, "Each seed prunes in its own random orders (drawn from its seed, prune --random-orders). The "
                 "exact expectation averages the single-head ablations (ablate.json) over every head: what the "
                 "random curve's first step estimates.")


def diagnosis_table(ablate: Mapping[int, dict]) -> Table | None:
    """How well importance predicts each head's own masking drop: Spearman's rho per seed, all heads and per kind,
    with raw and per-layer-normalized importance (the pruning order uses the normalized one)."""
    found = [f["importance_vs_drop"] for f in ablate.values() if "importance_vs_drop" in f]
    if not found:
        return None
    scopes = ["all", *(k for k in KINDS if k in found[0]["raw"])]
    body = [[name, *(mean_std([f[name][s] for f in found if f[name][s] is not None], 2) for s in scopes)]
            for name in ("raw", "normalized")]
    note = (f"Spearman's rho between head importance and the metric's drop when that head alone is masked, per seed "
            f"(mean ± std over seeds), on {found[0]['batches']} validation batches. Per-layer l2 normalization "
            "(Michel et al.; the 'importance' pruning order) gives every layer the same total importance however "
            "much the model relies on it, which reorders heads across layers -- across kinds and across the layers "
            "of one kind; 'raw' is the unnormalized score (the 'importance_raw' order). Where 'raw' ranks the drop "
            "far better, normalized pruning removes heads the metric depends on early.")
    return Table("Pruning diagnosis: importance vs actual drop", ["importance", *scopes], body, note)
