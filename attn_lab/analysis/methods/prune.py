"""``--what=prune``: iterative head pruning (Michel et al. 2019): remove --prune-fraction of all heads per step in
each --prune-orders order (importance, reverse, random, importance_raw), scoring --metric after every step; the
random curve is the mean of --random-orders orders drawn from the run's seed. ``--finetune-steps`` trains a derived
run after each step (``analysis/finetune/<order>/step<k>``; ``random/order<r>/step<k>`` per random order). Writes
prune.json, prune.png (the curves) and one logged step per pruning step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from absl import flags

from attn_lab.analysis import pruning
from attn_lab.analysis.methods import register_method
from attn_lab.analysis.methods._flags import ChoicesListParser, list_flag

if TYPE_CHECKING:  # the heavy modules (jax, the models) are imported when a method runs: --help answers at once
    from attn_lab.analysis.context import AnalysisContext

# Michel et al.'s curves; importance_raw: importance without per-layer normalization
DEFAULT_ORDERS = pruning.ORDERS[:3]

_RESCORE = flags.DEFINE_bool("rescore", False, "prune: re-score importance before every step.")
_FRACTION = flags.DEFINE_float("prune-fraction", 0.1, "prune: share of all heads removed per step.",
                               lower_bound=0.0, upper_bound=1.0)
_ORDERS = list_flag(ChoicesListParser(lambda: pruning.ORDERS), "prune-orders", ",".join(DEFAULT_ORDERS),
                    f"prune: comma-separated orders to run, from {', '.join(pruning.ORDERS)}.")
_RANDOM_ORDERS = flags.DEFINE_integer("random-orders", 5, "prune: random orders averaged into the random curve, each "
                                      "drawn from the run's seed.", lower_bound=1)
_FINETUNE_STEPS = flags.DEFINE_integer("finetune-steps", 0, "prune: train this many steps after each step.",
                                       lower_bound=0)
flags.register_validator("prune-fraction", lambda v: v > 0, message="must be in (0, 1] (a share of all heads)")


def _finetune(ctx: AnalysisContext) -> Callable | None:
    """prune's ``finetune`` factory: per curve (``chain``) a derived run per pruning step, each continuing the
    previous one of its chain."""
    from attn_lab.analysis import derived
    from attn_lab.train.restore import load_finished_run

    def chain(name: str) -> Callable:
        previous = {"dir": ctx.flags.workdir}

        def finetune(state, masks, step):
            workdir = ctx.path("finetune", *name.split("/"), f"step{step}")
            previous["dir"] = derived.finetune_masked(ctx.run.config, previous["dir"], masks,
                                                      _FINETUNE_STEPS.value, workdir)
            return load_finished_run(workdir).state
        return finetune
    return chain if _FINETUNE_STEPS.value > 0 else None


@register_method("prune", order=30)
def prune(ctx: AnalysisContext) -> None:
    """Iterative head pruning curves, one per --prune-orders order."""
    seed = int(ctx.run.config.seed)  # each trial its own random orders
    curves = {order: pruning.pruning_curve(ctx.run.state, ctx.batches, ctx.shapes, ctx.score, ctx.importance_sums,
                                           order=order, fraction=_FRACTION.value, rescore=_RESCORE.value,
                                           finetune=_finetune(ctx), seed=seed,
                                           random_orders=_RANDOM_ORDERS.value)
              for order in _ORDERS.value}
    ctx.write_json("prune", {"metric": ctx.flags.metric, "finetune_steps": _FINETUNE_STEPS.value,
                             "random_seed": seed, "random_orders": _RANDOM_ORDERS.value, **curves})
    ctx.lines("prune", {o: ([p["percent"] for p in c], [p["score"] for p in c]) for o, c in curves.items()},
              xlabel="% of heads pruned", ylabel=ctx.flags.metric, title="iterative head pruning")
    for i, point in enumerate(next(iter(curves.values()))):  # one logged step per pruning step, all orders
        ctx.log({"prune/percent": point["percent"], **{f"prune/{o}": c[i]["score"] for o, c in curves.items()}})
    print(f"prune ({ctx.flags.metric} with the share of heads pruned, per order; every step in prune.json):",
          "; ".join(f"{order}: {_ends(c)}" for order, c in curves.items()))


def _ends(curve: list[dict]) -> str:
    """The curve's first point, its middle one and its last: ``0% 0.912 -> 50% 0.905 -> 90% 0.412``."""
    picked = [curve[0], curve[len(curve) // 2], curve[-1]] if len(curve) > 2 else curve
    return " -> ".join(f"{p['percent']:.0f}% {p['score']:.4g}" for p in picked)

