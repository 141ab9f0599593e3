"""Head analysis of a finished run: importance, ablations, pruning (masked and structural), L0 gates, diagnostics
(``python -m attn_lab.analysis``; ``scripts/analyze_heads.py`` and ``attn-analyze`` run this).

  python -m attn_lab.analysis --workdir runs/numbers_quick     # every method that trains nothing
  python -m attn_lab.analysis --workdir runs/numbers_quick --what gates     # L0 gates: trains derived runs
  python -m attn_lab.analysis --workdir runs/numbers_quick --what prune --prune-orders importance,random --metric bleu

Each method is one module of :mod:`attn_lab.analysis.methods`, registered by name with the flags it alone reads
(``--help`` lists them all); ``--what`` runs the named ones in the order given (default: every registered method
that trains nothing, in registry order -- importance, ablate, prune, structural, diagnose; ``gates`` trains two
derived runs, longer than the run itself, and runs only when named). Each method announces itself (``[i/n] name:
what it does``) and ends with one labelled summary line. Here: the flags they share, the run, and the
:class:`~attn_lab.analysis.context.AnalysisContext` handed to each.

Logs to W&B in the run's group (a run named ``<run>-analysis``, same mode as the run) and writes
``<workdir>/analysis/<method>.json``, a layer x head grid PNG per statistic (per-head gradient norms included), the
pruning curves (importance order vs reverse vs random), heads kept vs metric for the gates, and one example's
attention maps per kind (``--example``). Importance and ablations use the validation split (``--split``).

``--metric``: what ablations and pruning score -- ``accuracy`` (teacher-forced token or class accuracy: one forward
pass per mask, cheap), ``log_likelihood`` (the mean token log-likelihood in nats, minus the loss: a language
model's perplexity is exp(-value); as cheap), or for translation ``bleu`` / ``exact_match`` (greedy decoding under
the masks; the bootstrap pairs per-example exact match). ``gates`` and ``--finetune-steps`` train derived runs under
``analysis/gates/`` and ``analysis/finetune/`` starting from this run's parameters. ``--what``, ``--prune-orders``
and ``--gate-targets`` are absl list flags, written comma-separated.
"""

from __future__ import annotations

import sys

from absl import flags

from attn_lab import results
from attn_lab.analysis import methods
from attn_lab.analysis.methods._flags import ChoicesListParser, list_flag
from attn_lab.checks import RunError
from attn_lab.cli import main_args, run_entry_point
from attn_lab.train.identity import check_finished

METRICS = ("accuracy", "log_likelihood", "bleu", "exact_match")


def _summary(method: methods.Method) -> str:
    """The method's first docstring line, marked when it trains (opt-in)."""
    line = method.doc.splitlines()[0].replace("``", "") if method.doc else ""
    return f"{line} [trains derived runs: only when named]" if method.trains else line
SPLITS = ("train", "validation", "test")

_WORKDIR = flags.DEFINE_string("workdir", None, "A finished run's folder (it has results.json).")
_WHAT = list_flag(ChoicesListParser(methods.names), "what", ",".join(methods.default_names()),
                  "Comma-separated methods, run in the order given (default: every method that trains nothing):\n"
                  + "\n".join(f"  {m.name}: {_summary(m)}" for m in methods.methods()))
_SPLIT = flags.DEFINE_enum("split", "validation", SPLITS, "Split the importance, ablations and pruning use.")
_MAX_BATCHES = flags.DEFINE_integer("max-batches", 8, "Batches of the split to use.", lower_bound=1)
_METRIC = flags.DEFINE_enum("metric", "accuracy", METRICS, "ablate/prune: what to score.")
_ALLOW_UNFINISHED = flags.DEFINE_bool("allow-unfinished", False, "Analyze a run that has not finished (its newest "
                                      "checkpoint, named).")
flags.mark_flag_as_required("workdir")
for _method in methods.methods():  # --help lists each method's own flags with the command's
    flags.adopt_module_key_flags(sys.modules[_method.module])


def main(argv: list[str]) -> int:
    """Loads the finished run, then runs each ``--what`` method in order (flags already checked by absl)."""
    main_args(argv)
    from attn_lab.analysis.context import AnalysisContext, SharedFlags
    from attn_lab.train.restore import load_finished_run

    shared = SharedFlags(workdir=_WORKDIR.value, split=_SPLIT.value, max_batches=_MAX_BATCHES.value,
                         metric=_METRIC.value)
    try:
        results.read_config(shared.workdir)  # a run folder, before anything else is said about it
        check_finished(shared.workdir, "", _ALLOW_UNFINISHED.value)
        run = load_finished_run(shared.workdir)
    except (ValueError, RunError) as e:
        sys.exit(f"error: --workdir: {e}")
    if shared.metric in ("bleu", "exact_match") and not run.generates:
        sys.exit(f"error: --metric={shared.metric}: needs a translation run; {shared.workdir} is {run.kind} "
                 "(use --metric=accuracy or --metric=log_likelihood)")
    ctx = AnalysisContext.open(run, shared)
    try:
        for i, name in enumerate(_WHAT.value, 1):
            print(f"[{i}/{len(_WHAT.value)}] {name}: {_summary(methods.get(name))}", flush=True)
            methods.get(name).run(ctx)
    finally:
        ctx.logger.close()
    print(f"wrote {ctx.out_dir}")
    return 0


def run() -> None:
    """The ``attn-analyze`` console script."""
    run_entry_point(main, __name__)


if __name__ == "__main__":
    run()
