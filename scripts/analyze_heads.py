"""Head analysis of a finished run: importance, masking ablations and per-head diagnostics.

  python scripts/analyze_heads.py --workdir runs/numbers_quick --what importance,ablate,prune,diagnose

Logs to W&B in the run's group (a run named ``<run>-analysis``, same mode as the run) and writes
``<workdir>/analysis/{importance,ablate,prune,diagnose}.json``, a layer x head grid PNG per statistic (per-head
gradient norms included), the pruning curves (importance order vs reverse vs random) and one example's attention
maps per kind (``--example``).
Importance and ablations use the validation split (``--split``); ablations score per-example (token) accuracy.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import types
from typing import Any

import numpy as np

METHODS = ("importance", "ablate", "prune", "diagnose")
NOT_YET = ("gates",)  # planned (issue 5): L0 gates; structural pruning is not built either


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--what", default=",".join(METHODS), help=f"comma-separated from {', '.join(METHODS)}")
    p.add_argument("--split", default="validation")
    p.add_argument("--max-batches", type=int, default=8, help="batches of the split to use")
    p.add_argument("--normalize", action="store_true", help="importance: unit l2 norm per layer (Michel et al.)")
    p.add_argument("--rescore", action="store_true", help="prune: re-score importance before every step")
    p.add_argument("--example", type=int, default=0, help="diagnose: which example of the first batch to draw")
    p.add_argument("--prune-fraction", type=float, default=0.1, help="prune: share of all heads removed per step")
    args = p.parse_args(argv)
    args.what = [w.strip() for w in args.what.split(",") if w.strip()]
    for w in args.what:
        if w in NOT_YET:
            p.error(f"--what {w}: not implemented yet (tracked in the issues); available: {', '.join(METHODS)}")
        if w not in METHODS:
            p.error(f"--what {w}: unknown; choose from {', '.join(METHODS)}")
    return args


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> None:
    """Writes the PNG atomically (a temp file renamed into place) and frees the figure."""
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    _pyplot().close(fig)
    os.replace(tmp, path)


def grid_plot(path: str, grids: dict[str, np.ndarray], title: str) -> None:
    """One layer x head heatmap per attention kind, side by side."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(grids), figsize=(4 * len(grids), 3), squeeze=False)
    for ax, (kind, grid) in zip(axes[0], grids.items()):
        im = ax.imshow(np.asarray(grid), cmap="viridis", aspect="auto")
        ax.set(title=kind, xlabel="head", ylabel="layer")
        fig.colorbar(im, ax=ax)
    fig.suptitle(title)
    _save(fig, path)


def curve_plot(path: str, curves: dict[str, list[dict]]) -> None:
    """Metric vs % of heads pruned, one line per pruning order."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for order, curve in curves.items():
        ax.plot([p["percent"] for p in curve], [p["score"] for p in curve], marker="o", label=order)
    ax.set(xlabel="% of heads pruned", ylabel="accuracy", title="iterative head pruning")
    ax.legend()
    _save(fig, path)


def maps_plot(path: str, captured: dict, kind: str, example: int) -> None:
    """Attention maps of one example: a row per layer, a column per head (valid keys only)."""
    plt = _pyplot()
    names = sorted(n for n in captured if n.startswith(kind + "/"))
    heads = captured[names[0]]["maps"].shape[1]
    fig, axes = plt.subplots(len(names), heads, figsize=(2 * heads, 2 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        valid = captured[name]["valid_keys"][example]
        for head in range(heads):
            grid = captured[name]["maps"][example, head]
            axes[row][head].imshow(grid[:, valid], cmap="viridis")  # (queries, valid keys)
            axes[row][head].set(title=f"{name} h{head}", xticks=[], yticks=[])
    _save(fig, path)


def _per_head(prefix: str, grids: dict[str, Any]) -> dict[str, float]:
    """``{kind: [L, N]}`` -> ``{'<prefix>/<kind>/L<l>/h<h>': value}`` for W&B summaries."""
    return {f"{prefix}/{kind}/L{layer}/h{head}": float(v) for kind, grid in grids.items()
            for layer, row in enumerate(np.asarray(grid)) for head, v in enumerate(row)}


def importance_step(a: Any) -> None:
    imp = a.importance.head_importance(a.run.state, a.batches, a.shapes, a.importance_sums, a.args.normalize)
    a.write("importance.json", {k: v.tolist() for k, v in imp.items()})
    grid_plot(os.path.join(a.out_dir, "importance.png"), imp, "head importance E|dL/dxi|")
    a.logger.summary(_per_head("importance", imp))
    print("importance:", {k: np.round(v, 4).tolist() for k, v in imp.items()})


def ablate_step(a: Any) -> None:
    single = a.importance.single_head_ablation(a.run.state, a.batches, a.shapes, a.scores)
    keep_one = a.importance.all_but_one(a.run.state, a.batches, a.shapes, a.scores)
    a.write("ablate.json", {"single_head": single, "all_but_one": keep_one})
    deltas = {k: single[k]["delta"] for k in a.shapes}
    grid_plot(os.path.join(a.out_dir, "ablate.png"), deltas, "accuracy change with the head masked")
    a.logger.summary(_per_head("ablate_delta", deltas) | {
        f"all_but_one/{k}/L{r['layer']}": r["delta"] for k in a.shapes for r in keep_one[k]})
    print("all-but-one:", {k: [round(r["delta"], 4) for r in keep_one[k]] for k in a.shapes})


def prune_step(a: Any) -> None:
    curves = {order: a.pruning.pruning_curve(a.run.state, a.batches, a.shapes, a.scores, a.importance_sums,
                                             order=order, fraction=a.args.prune_fraction, rescore=a.args.rescore)
              for order in a.pruning.ORDERS}
    a.write("prune.json", curves)
    curve_plot(os.path.join(a.out_dir, "prune.png"), curves)
    for i, point in enumerate(curves["importance"]):  # one logged step per pruning step, every order together
        a.logger.log(i, {"prune/percent": point["percent"], **{f"prune/{o}": c[i]["score"] for o, c in curves.items()}})
    print("prune:", {o: [round(p["score"], 4) for p in c] for o, c in curves.items()})


def diagnose_step(a: Any) -> None:
    captured = a.capture_maps(a.run, a.batches[0])
    layers = {name: a.diagnostics.layer_report(c["maps"], c["valid_keys"], c["head_outputs"])
              for name, c in captured.items()}
    grads = a.importance.compile_gradients(a.run.graphdef, a.run.kind)
    for kind, grid in a.importance.head_gradient_norms(a.run.state, a.batches, a.shapes, grads).items():
        for layer, row in enumerate(grid):
            layers[f"{kind}/{layer}"]["gradient_norm"] = row.tolist()
    a.write("diagnose.json", layers)
    for stat in ("entropy", "distance", "self", "first", "gradient_norm"):
        grids = _grids(layers, a.shapes, stat)
        grid_plot(os.path.join(a.out_dir, f"diagnose_{stat}.png"), grids, stat)
        a.logger.summary(_per_head(stat, grids))
    for kind in a.shapes:
        maps_plot(os.path.join(a.out_dir, f"maps_{kind}.png"), captured, kind, example=a.args.example)
    print("flags:", {name: r["flags"] for name, r in layers.items()})


STEPS = {"importance": importance_step, "ablate": ablate_step, "prune": prune_step, "diagnose": diagnose_step}


def main(argv: list[str]) -> int:
    args = parse(argv)
    from attn_lab.analysis import diagnostics, importance, pruning
    from attn_lab.analysis.run import capture_maps, load_finished_run
    from attn_lab.train.logging import METRICS_FILE, MetricLogger, write_json_atomic
    from attn_lab.train.steps import merge

    try:
        run = load_finished_run(args.workdir)
    except ValueError as e:
        sys.exit(f"error: {e}")
    out_dir = os.path.join(args.workdir, "analysis")
    os.makedirs(out_dir, exist_ok=True)
    pathlib.Path(out_dir, METRICS_FILE).unlink(missing_ok=True)  # each analysis is a fresh log (and W&B run)
    w = run.config.wandb
    logger = MetricLogger(out_dir, run.config.to_dict(), mode=w.mode, project=w.project, group=w.group,
                          tags=(*w.tags, "analysis"), name=f"{w.name or os.path.basename(args.workdir)}-analysis")
    scores, importance_sums = importance.compile_analysis(run.graphdef, run.kind)
    a = types.SimpleNamespace(
        args=args, run=run, out_dir=out_dir, logger=logger, batches=run.batches(args.split, args.max_batches),
        shapes=importance.mask_shapes(merge(run.graphdef, run.state)), scores=scores,
        importance_sums=importance_sums, importance=importance, pruning=pruning, diagnostics=diagnostics,
        capture_maps=capture_maps, write=lambda name, obj: write_json_atomic(os.path.join(out_dir, name), obj))
    try:
        for what in args.what:
            STEPS[what](a)
    finally:
        logger.close()
    print(f"wrote {out_dir}")
    return 0


def _grids(layers: dict, shapes: dict, stat: str) -> dict[str, np.ndarray]:
    return {kind: np.array([layers[f"{kind}/{layer}"][stat] for layer in range(n_layers)])
            for kind, (n_layers, _) in shapes.items()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
