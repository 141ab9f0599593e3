"""Head analysis of a finished run: importance, ablations, pruning (masked and structural), L0 gates, diagnostics
(``python -m attn_lab.analysis``; ``scripts/analyze_heads.py`` and ``attn-analyze`` run this).

  python -m attn_lab.analysis --workdir runs/numbers_quick --what importance,ablate,prune,structural,gates,diagnose
  python -m attn_lab.analysis --workdir runs/numbers_quick --what prune --prune-orders importance,random --metric bleu

Logs to W&B in the run's group (a run named ``<run>-analysis``, same mode as the run) and writes
``<workdir>/analysis/<method>.json``, a layer x head grid PNG per statistic (per-head gradient norms included), the
pruning curves (importance order vs reverse vs random), heads kept vs metric for the gates, and one example's
attention maps per kind (``--example``). Importance and ablations use the validation split (``--split``).

``--metric``: what ablations and pruning score -- ``accuracy`` (teacher-forced token or class accuracy: one forward
pass per mask, cheap), or for translation ``bleu`` / ``exact_match`` (greedy decoding under the masks; the
bootstrap pairs per-example exact match). ``gates`` and ``--finetune-steps`` train derived runs under
``analysis/gates/`` and ``analysis/finetune/`` starting from this run's parameters. ``--what``, ``--prune-orders``
and ``--gate-targets`` are absl list flags, written comma-separated.
"""

from __future__ import annotations

import os
import pathlib
import sys
import types
from typing import Any

import numpy as np
from absl import flags

from attn_lab.analysis.pruning import ORDERS
from attn_lab.cli import main_args, run_entry_point

METHODS = ("importance", "ablate", "prune", "structural", "gates", "diagnose")
METRICS = ("accuracy", "bleu", "exact_match")
DEFAULT_ORDERS = ORDERS[:3]  # Michel et al.'s curves; importance_raw: importance without per-layer normalization
SPLITS = ("train", "validation", "test")


class _ChoicesListParser(flags.ListParser):
    """``'a,b'`` -> ``['a', 'b']``, each member one of ``choices`` (absl's multi-enum, written comma-separated);
    anything else is a flag error, one line through :func:`attn_lab.cli.parse_flags`."""

    def __init__(self, choices: tuple[str, ...]):
        super().__init__()
        self.choices = choices

    def parse(self, argument):
        items = [item.strip() for item in super().parse(argument)]
        if not [item for item in items if item]:
            raise ValueError(f"give at least one of {', '.join(self.choices)}")
        bad = [item for item in items if item not in self.choices]
        if bad:
            verb = "is" if len(bad) == 1 else "are"
            raise ValueError(f"{', '.join(repr(b) for b in bad)} {verb} not one of {', '.join(self.choices)}")
        return list(dict.fromkeys(items))  # a method named twice runs once

    def flag_type(self) -> str:
        return f"comma separated list of {'|'.join(self.choices)}"


class _ShareListParser(flags.ListParser):
    """``'0.5,0.25'`` -> ``[0.5, 0.25]``, each a share in (0, 1]; anything else is a flag error (one line)."""

    def parse(self, argument):
        items = super().parse(argument)
        try:
            shares = [float(item) for item in items]
        except (TypeError, ValueError):
            raise ValueError("give comma-separated numbers in (0, 1], e.g. 0.5,0.25") from None
        if not shares:
            raise ValueError("give at least one number in (0, 1], e.g. 0.5,0.25")
        bad = [s for s in shares if not 0 < s <= 1]
        if bad:
            raise ValueError(f"each must be in (0, 1] (a share of the heads to keep), got {bad[0]:g}")
        return shares

    def flag_type(self) -> str:
        return "comma separated list of numbers in (0, 1]"


def _list_flag(parser: flags.ListParser, name: str, default: str, help: str) -> flags.FlagHolder:
    return flags.DEFINE(parser, name, default, help, serializer=flags.CsvListSerializer(","))


_WORKDIR = flags.DEFINE_string("workdir", None, "A finished run's folder (it has results.json).")
_WHAT = _list_flag(_ChoicesListParser(METHODS), "what", ",".join(METHODS),
                   f"Comma-separated methods, run in this order: {', '.join(METHODS)}.")
_SPLIT = flags.DEFINE_enum("split", "validation", SPLITS, "Split the importance, ablations and pruning use.")
_MAX_BATCHES = flags.DEFINE_integer("max-batches", 8, "Batches of the split to use.", lower_bound=1)
_NORMALIZE = flags.DEFINE_bool("normalize", False, "importance: unit l2 norm per layer (Michel et al.).")
_RESCORE = flags.DEFINE_bool("rescore", False, "prune: re-score importance before every step.")
_EXAMPLE = flags.DEFINE_integer("example", 0, "diagnose: which example of the first batch to draw.", lower_bound=0)
_PRUNE_FRACTION = flags.DEFINE_float("prune-fraction", 0.1, "prune: share of all heads removed per step.",
                                     lower_bound=0.0, upper_bound=1.0)
_METRIC = flags.DEFINE_enum("metric", "accuracy", METRICS, "ablate/prune: what to score.")
_PRUNE_ORDERS = _list_flag(_ChoicesListParser(ORDERS), "prune-orders", ",".join(DEFAULT_ORDERS),
                           f"prune: comma-separated orders to run, from {', '.join(ORDERS)}.")
_FINETUNE_STEPS = flags.DEFINE_integer("finetune-steps", 0, "prune: train this many steps after each step.",
                                       lower_bound=0)
_STRUCTURAL_PERCENT = flags.DEFINE_float("structural-percent", 50.0, "structural: % of heads removed, in [0, 100).")
_SPEED_BATCH = flags.DEFINE_integer("speed-batch", 64, "structural: batch size of the timed forward pass.",
                                    lower_bound=1)
_GATE_TARGETS = _list_flag(_ShareListParser(), "gate-targets", "0.5,0.25",
                           "gates: comma-separated shares of heads to keep, each in (0, 1]; one run each.")
_GATE_STEPS = flags.DEFINE_integer("gate-steps", 500, "gates: training steps of each gates run.", lower_bound=1)
flags.mark_flag_as_required("workdir")
flags.register_validator("prune-fraction", lambda v: v > 0, message="must be in (0, 1] (a share of all heads)")
flags.register_validator("structural-percent", lambda v: 0 <= v < 100, message="must be in [0, 100)")


def parsed_args() -> types.SimpleNamespace:
    """The parsed flags as ``args.<name>`` (dashes as underscores), what the steps read."""
    holders = {"workdir": _WORKDIR, "what": _WHAT, "split": _SPLIT, "max_batches": _MAX_BATCHES,
               "normalize": _NORMALIZE, "rescore": _RESCORE, "example": _EXAMPLE, "prune_fraction": _PRUNE_FRACTION,
               "metric": _METRIC, "prune_orders": _PRUNE_ORDERS, "finetune_steps": _FINETUNE_STEPS,
               "structural_percent": _STRUCTURAL_PERCENT, "speed_batch": _SPEED_BATCH,
               "gate_targets": _GATE_TARGETS, "gate_steps": _GATE_STEPS}
    return types.SimpleNamespace(**{name: holder.value for name, holder in holders.items()})


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
    deltas = {k: np.asarray(single[k]["delta"]) for k in a.shapes}
    diagnosis = {"batches": len(a.batches), **{
        name: a.importance.importance_vs_drop(
            a.importance.head_importance(a.run.state, a.batches, a.shapes, a.importance_sums, normalize), deltas)
        for name, normalize in (("raw", False), ("normalized", True))}}
    a.write("ablate.json", {"metric": a.args.metric, "single_head": single, "all_but_one": keep_one,
                            "importance_vs_drop": diagnosis})
    print("importance vs single-head drop (Spearman):", diagnosis)
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
    """Removes the least important heads physically and times the forward pass against the full model (skipped, with
    a line and the reason in structural.json, for grouped key/value heads: see ``structural.grouped_kinds``)."""
    grouped = a.structural.grouped_kinds(a.merge(a.run.graphdef, a.run.state))
    if grouped:
        reason = (f"{', '.join(grouped)} has grouped key/value heads (num_kv_heads < num_heads); structural pruning "
                  "removes heads of full multi-head attention only -- the masked pruning curve ('prune') covers it")
        a.write("structural.json", {"skipped": reason})
        print(f"structural: skipped: {reason}")
        return
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
    sites = a.merge(a.run.graphdef, a.run.state).sites()
    for kind, grid in a.importance.head_gradient_norms(a.run.state, a.batches, sites, grads).items():
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
    """Loads the finished run, then runs each ``--what`` method in order (flags already checked by absl)."""
    main_args(argv)
    args = parsed_args()
    from attn_lab.analysis import derived, importance, plots, pruning, structural
    from attn_lab.analysis.run import capture_maps, finished_results
    from attn_lab.io import write_json_atomic
    from attn_lab.models import mask_shapes
    from attn_lab.train import diagnostics, learned
    from attn_lab.train.logging import METRICS_FILE, MetricLogger
    from attn_lab.train.restore import load_finished_run
    from attn_lab.train.steps import merge

    try:
        run = load_finished_run(args.workdir)
    except ValueError as e:
        sys.exit(f"error: --workdir: {e}")
    if args.metric != "accuracy" and not run.generates:
        sys.exit(f"error: --metric={args.metric}: needs a translation run; {args.workdir} is {run.kind} "
                 "(use --metric=accuracy)")
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
        shapes=mask_shapes(merge(run.graphdef, run.state)), importance_sums=importance_sums,
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


def run() -> None:
    """The ``attn-analyze`` console script."""
    run_entry_point(main, __name__)


if __name__ == "__main__":
    run()
