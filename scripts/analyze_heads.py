"""Head analysis of a finished run: importance, ablations, pruning (masked and structural), L0 gates, diagnostics.

  python scripts/analyze_heads.py --workdir runs/numbers_quick --what importance,ablate,prune,structural,gates,diagnose

Logs to W&B in the run's group (a run named ``<run>-analysis``, same mode as the run) and writes
``<workdir>/analysis/<method>.json``, a layer x head grid PNG per statistic (per-head gradient norms included), the
pruning curves (importance order vs reverse vs random), heads kept vs metric for the gates, and one example's
attention maps per kind (``--example``). Importance and ablations use the validation split (``--split``).

``--metric``: what ablations and pruning score -- ``accuracy`` (teacher-forced token or class accuracy: one forward
pass per mask, cheap), or for translation ``bleu`` / ``exact_match`` (greedy decoding under the masks; the
bootstrap pairs per-example exact match). ``gates`` and ``--finetune-steps`` train derived runs under
``analysis/gates/`` and ``analysis/finetune/`` starting from this run's parameters.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import types
from typing import Any

import numpy as np

METHODS = ("importance", "ablate", "prune", "structural", "gates", "diagnose")
METRICS = ("accuracy", "bleu", "exact_match")


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
    p.add_argument("--metric", default="accuracy", choices=METRICS, help="ablate/prune: what to score")
    p.add_argument("--prune-orders", default="importance,reverse,random", help="prune: which orders to run")
    p.add_argument("--finetune-steps", type=int, default=0, help="prune: train this many steps after each step")
    p.add_argument("--structural-percent", type=float, default=50.0, help="structural: %% of heads removed")
    p.add_argument("--speed-batch", type=int, default=64, help="structural: batch size of the timed forward pass")
    p.add_argument("--gate-targets", default="0.5,0.25", help="gates: shares of heads to keep, one run each")
    p.add_argument("--gate-steps", type=int, default=500, help="gates: training steps of each gates run")
    args = p.parse_args(argv)
    args.what = [w.strip() for w in args.what.split(",") if w.strip()]
    args.prune_orders = [o.strip() for o in args.prune_orders.split(",") if o.strip()]
    bad = [o for o in args.prune_orders if o not in ("importance", "reverse", "random")]
    if bad or not args.prune_orders:
        p.error(f"--prune-orders {bad or '(empty)'}: choose from importance, reverse, random")
    for w in args.what:
        if w not in METHODS:
            p.error(f"--what {w}: unknown; choose from {', '.join(METHODS)}")
    try:
        args.gate_targets = [float(t) for t in args.gate_targets.split(",")]
    except ValueError:
        p.error(f"--gate-targets {args.gate_targets!r}: comma-separated numbers in (0, 1]")
    if not all(0 < t <= 1 for t in args.gate_targets):
        p.error(f"--gate-targets {args.gate_targets}: each must be in (0, 1]")
    if not 0 <= args.structural_percent < 100:
        p.error(f"--structural-percent {args.structural_percent}: must be in [0, 100)")
    return args


def _per_head(prefix: str, grids: dict[str, Any]) -> dict[str, float]:
    """``{kind: [L, N]}`` -> ``{'<prefix>/<kind>/L<l>/h<h>': value}`` for W&B summaries."""
    return {f"{prefix}/{kind}/L{layer}/h{head}": float(v) for kind, grid in grids.items()
            for layer, row in enumerate(np.asarray(grid)) for head, v in enumerate(row)}


def importance_step(a: Any) -> None:
    imp = a.importance.head_importance(a.run.state, a.batches, a.shapes, a.importance_sums, a.args.normalize)
    a.write("importance.json", {k: v.tolist() for k, v in imp.items()})
    a.plots.grid_plot(os.path.join(a.out_dir, "importance.png"), imp, "head importance E|dL/dxi|")
    a.logger.summary(_per_head("importance", imp))
    print("importance:", {k: np.round(v, 4).tolist() for k, v in imp.items()})


def ablate_step(a: Any) -> None:
    single = a.importance.single_head_ablation(a.run.state, a.shapes, a.score)
    keep_one = a.importance.all_but_one(a.run.state, a.shapes, a.score)
    a.write("ablate.json", {"metric": a.args.metric, "single_head": single, "all_but_one": keep_one})
    deltas = {k: single[k]["delta"] for k in a.shapes}
    a.plots.grid_plot(os.path.join(a.out_dir, "ablate.png"), deltas, f"{a.args.metric} change with the head masked")
    a.logger.summary(_per_head("ablate_delta", deltas) | {
        f"all_but_one/{k}/L{r['layer']}": r["delta"] for k in a.shapes for r in keep_one[k]})
    print("all-but-one:", {k: [round(r["delta"], 4) for r in keep_one[k]] for k in a.shapes})


def _finetune(a: Any, order: str):
    """prune's ``finetune`` hook: a derived run per pruning step, each continuing the previous one."""
    previous = {"dir": a.args.workdir}

    def finetune(state, masks, step):
        workdir = os.path.join(a.out_dir, "finetune", order, f"step{step}")
        previous["dir"] = a.derived.finetune_masked(a.run.config, previous["dir"], masks, a.args.finetune_steps,
                                                    workdir)
        return a.load_finished_run(workdir).state
    return finetune if a.args.finetune_steps > 0 else None


def prune_step(a: Any) -> None:
    curves = {order: a.pruning.pruning_curve(a.run.state, a.batches, a.shapes, a.score, a.importance_sums,
                                             order=order, fraction=a.args.prune_fraction, rescore=a.args.rescore,
                                             finetune=_finetune(a, order))
              for order in a.args.prune_orders}
    a.write("prune.json", {"metric": a.args.metric, "finetune_steps": a.args.finetune_steps, **curves})
    a.plots.line_plot(os.path.join(a.out_dir, "prune.png"),
                      {o: ([p["percent"] for p in c], [p["score"] for p in c]) for o, c in curves.items()},
                      xlabel="% of heads pruned", ylabel=a.args.metric, title="iterative head pruning")
    for i, point in enumerate(next(iter(curves.values()))):  # one logged step per pruning step, all orders
        a.log({"prune/percent": point["percent"], **{f"prune/{o}": c[i]["score"] for o, c in curves.items()}})
    print("prune:", {o: [round(p["score"], 4) for p in c] for o, c in curves.items()})


def structural_step(a: Any) -> None:
    """Removes the least important heads physically and times the forward pass against the full model."""
    imp = a.importance.head_importance(a.run.state, a.batches, a.shapes, a.importance_sums, normalize=True)
    masks = a.pruning.prune_masks(imp, a.args.structural_percent)
    report = a.structural.speed_report(a.run.graphdef, a.run.state, masks,
                                       a.structural.tile_batch(a.batches[0], a.args.speed_batch))
    a.write("structural.json", report)
    a.logger.summary({f"structural/{k}": v for k, v in report.items() if isinstance(v, (int, float))})
    print(f"structural: {report['percent_pruned']:.0f}% of heads removed, max |pruned - masked| "
          f"{report['max_abs_diff']:.2e}, forward {report['speedup_vs_full']:.2f}x the full model's speed")


def gates_step(a: Any) -> None:
    """L0 gates trained from this run for each target share of heads; heads kept vs the test metric."""
    metric = "bleu" if a.run.generates else "accuracy"
    base = a.finished_results(a.args.workdir)
    rows = [{"target": 1.0, "kept": sum(n * h for n, h in a.shapes.values()), "metric": metric,
             "test": base["final"]["test"][metric], "workdir": a.args.workdir}]
    for target in a.args.gate_targets:
        workdir = os.path.join(a.out_dir, "gates", f"target={target:g}")
        results = a.derived.train_gates(a.run.config, a.args.workdir, target, a.args.gate_steps, workdir)
        rows.append({"target": target, "kept": results["gates"]["kept"], "total": results["gates"]["total"],
                     "binary": results["gates"]["binary"], "metric": metric,
                     "test": results["final"]["test"][metric], "workdir": workdir})
    a.write("gates.json", rows)
    a.plots.line_plot(os.path.join(a.out_dir, "gates.png"), {"L0 gates": ([r["kept"] for r in rows],
                                                                         [r["test"] for r in rows])},
                      xlabel="heads kept", ylabel=f"test {metric}", title="L0 head gates (Voita et al.)")
    for r in rows:
        a.log({"gates/target": r["target"], "gates/kept": r["kept"], f"gates/test_{metric}": r["test"]})
    print("gates:", [(r["target"], r["kept"], round(r["test"], 4)) for r in rows])


def diagnose_step(a: Any) -> None:
    captured = a.capture_maps(a.run, a.batches[0])
    layers = {name: a.diagnostics.layer_report(c["maps"], c["valid_keys"], c["head_outputs"], c.get("valid_queries"))
              for name, c in captured.items()}
    grads = a.importance.compile_gradients(a.run.graphdef)
    for kind, grid in a.importance.head_gradient_norms(a.run.state, a.batches, a.shapes, grads).items():
        for layer, row in enumerate(grid):
            layers[f"{kind}/{layer}"]["gradient_norm"] = row.tolist()
    learned = a.learned.per_head(a.merge(a.run.graphdef, a.run.state))  # spans / alphas of kernels that learn them
    for name, values in learned.items():
        layers[name].update({k: v.tolist() for k, v in values.items()})
    a.write("diagnose.json", layers)
    for stat in ("entropy", "distance", "self", "first", "zeros", "gradient_norm"):
        grids = _grids(layers, a.shapes, stat)
        a.plots.grid_plot(os.path.join(a.out_dir, f"diagnose_{stat}.png"), grids, stat)
        a.logger.summary(_per_head(stat, grids))
    _learned_plots(a, learned)
    for kind in a.shapes:
        a.plots.maps_plot(os.path.join(a.out_dir, f"maps_{kind}.png"), captured, kind, example=a.args.example)
    print("flags:", {name: r["flags"] for name, r in layers.items()})


def _learned_plots(a: Any, learned: dict[str, dict[str, np.ndarray]]) -> None:
    """Per learned quantity: a layer x head grid per attention kind (e.g. adaptive span's spans) and a histogram per
    kind (e.g. entmax's alphas), as in Sukhbaatar et al.'s and Correia et al.'s figures."""
    for stat in sorted({k for values in learned.values() for k in values}):
        by_kind: dict[str, list] = {}
        for name, values in learned.items():
            if stat in values:
                by_kind.setdefault(name.split("/")[0], []).append(values[stat])
        grids = {kind: np.array(rows) for kind, rows in by_kind.items()}  # (layers, heads)
        a.plots.grid_plot(os.path.join(a.out_dir, f"learned_{stat}.png"), grids, f"learned {stat} per head")
        a.plots.histogram_plot(os.path.join(a.out_dir, f"learned_{stat}_hist.png"), grids, xlabel=stat,
                               title=f"learned {stat} per attention kind")
        a.logger.summary(_per_head(stat, grids))


STEPS = {"importance": importance_step, "ablate": ablate_step, "prune": prune_step, "structural": structural_step,
         "gates": gates_step, "diagnose": diagnose_step}


def main(argv: list[str]) -> int:
    args = parse(argv)
    from attn_lab.analysis import derived, importance, plots, pruning, structural
    from attn_lab.analysis.run import capture_maps, finished_results
    from attn_lab.train import diagnostics, learned
    from attn_lab.train.restore import load_finished_run
    from attn_lab.io import write_json_atomic
    from attn_lab.train.logging import METRICS_FILE, MetricLogger
    from attn_lab.train.steps import merge

    try:
        run = load_finished_run(args.workdir)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if args.metric != "accuracy" and not run.generates:
        sys.exit(f"error: --metric {args.metric} needs a translation run; {args.workdir} is {run.kind}")
    out_dir = os.path.join(args.workdir, "analysis")
    os.makedirs(out_dir, exist_ok=True)
    pathlib.Path(out_dir, METRICS_FILE).unlink(missing_ok=True)  # each analysis is a fresh log (and W&B run)
    w = run.config.wandb
    logger = MetricLogger(out_dir, run.config.to_dict(), mode=w.mode, project=w.project, group=w.group,
                          tags=(*w.tags, "analysis"), name=f"{w.name or os.path.basename(args.workdir)}-analysis")
    scores, importance_sums = importance.compile_analysis(run.graphdef)
    batches = run.batches(args.split, args.max_batches)
    score = (importance.accuracy_scorer(batches, scores) if args.metric == "accuracy"
             else run.decode_scorer(batches, args.split, args.metric))
    a = types.SimpleNamespace(
        args=args, run=run, out_dir=out_dir, logger=logger, batches=batches, score=score,
        shapes=importance.mask_shapes(merge(run.graphdef, run.state)), importance_sums=importance_sums,
        importance=importance, pruning=pruning, diagnostics=diagnostics, structural=structural, derived=derived,
        plots=plots, capture_maps=capture_maps, learned=learned, merge=merge, load_finished_run=load_finished_run,
        finished_results=finished_results,
        write=lambda name, obj: write_json_atomic(os.path.join(out_dir, name), obj))
    logged = iter(range(10**9))  # W&B steps must increase across methods
    a.log = lambda metrics: logger.log(next(logged), metrics)
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
