"""Head importance and pruning (Michel et al. 2019): their claims on French -> English translation (``quick`` =
``translation``) and tweets (``sentiment``) in mean token (or true-class) log-likelihood, on a decoder-only LM
(``lm``), and on synthetic translation with L0 gates too (Voita et al. 2019; ``numbers``, ``full``, ``gpu``).

  python -m attn_lab.sweep --experiment experiments/pruning.py:quick --workdir runs/pruning --pilot-and-verdict \
      --vmap-seeds --parallel 2  # pilot on seeds 0-4, its plan (and comparison point), then the verdict
  python -m attn_lab.reporting --workdir runs/pruning/verdict

Each preset trains one arm (``baseline``) and runs the head analysis on every seed (``python -m attn_lab.analysis``,
flags from ``analyze``): single-head and all-but-one masking, pruning curves in four orders, the structural speed-up
at 50% of heads and (``numbers``) L0 gates keeping 50% and 25% of heads. The findings compare orders on each seed's
curves -- every order prunes the same trained model, so they pair by seed -- at the share of heads pruned where the
mean random curve is at half its unpruned score (for a log-likelihood, which has no zero: midway between its first
and last values), measured by the pilot (``pilot_measures``) and kept in the plan. Every run: docs/pruning.md.
"""

from __future__ import annotations

from attn_lab.experiment import Finding, Metric, Powered, Preset, budget
from attn_lab.published.michel import MICHEL_PRUNING
from attn_lab.reporting import pruning_tables as pt
from attn_lab.reporting.default import verdicts
from attn_lab.reporting.stats import Interval, paired
from attn_lab.reporting.tables import Table, analyses, grouped, read_sweep_info, unfinished_table, variant_of

# --- findings: on the pruning curves, margins fixed before any run (why: docs/pruning.md) ------------------------
MARGIN = 0.02  # in the curves' metric: exact match, BLEU, or nats (2% perplexity)
HALF, MID = "where random is at half", "midway down the random curve"
FINDINGS = {
    "importance vs random": Finding(f"pruning by importance beats random pruning ({HALF})",
                                    "Michel et al. Fig. 3-4: importance >> random", "up", MARGIN),
    "importance_raw vs random": Finding(f"pruning by unnormalized importance beats random ({HALF})",
                                        "(our diagnosis; Michel et al. normalize per layer)", "up", MARGIN),
    "importance vs full at 20%": Finding("~20% of heads prune by importance almost for free (at ~20% pruned)",
                                         MICHEL_PRUNING.split(",")[0], "not_worse", MARGIN),
}
FINDINGS_LM = {k: Finding(f.claim.replace(HALF, MID), f.paper, f.direction, f.margin) for k, f in FINDINGS.items()}
# finding -> (order, compared with, % pruned; None: the comparison point, plan["measured"]["compare_at_percent"])
COMPARISONS = {"importance vs random": ("importance", "random", None),
               "importance_raw vs random": ("importance_raw", "random", None),
               "importance vs full at 20%": ("importance", "full", 20)}

# --- presets -----------------------------------------------------------------------------------------------------
BASELINE = {"baseline": {}}  # one trained model per seed; the orders are the compared "arms"
# one head per step of the numbers model's 24 (2 of the full model's 48): the comparison point is resolved
ANALYZE = {"what": ["ablate", "prune", "structural", "gates"], "metric": "exact_match", "max_batches": 2,
           "gate_targets": [0.5, 0.25], "prune_orders": list(pt.ORDERS), "prune_fraction": 0.04}
TEACHER_FORCED = {"what": ["ablate", "prune", "structural"], "metric": "log_likelihood", "max_batches": 4}  # no gates
SIXTEENTH = {"prune_fraction": 1 / 16}  # one of 16 heads per step
BIG = {"max_batches": 8, "gate_steps": 2000, "metric": "bleu"}
BLEU = Metric("bleu", "bleu")


NATS = Metric("log_likelihood", "log_likelihood (nats)")
TRANSLATION = Preset("pruning_translation", "configs/bible.py:small", BASELINE, Powered(100, 9), FINDINGS_LM,
                     metric=NATS, analyze=ANALYZE | TEACHER_FORCED | {"prune_fraction": 1 / 24})  # 2 of 48 heads
LM = Preset("pruning_lm", "configs/bible_lm.py:quick", BASELINE, range(100, 113), FINDINGS_LM,
            metric=NATS, analyze=ANALYZE | TEACHER_FORCED | SIXTEENTH)
PRESETS = {
    "quick": TRANSLATION, "translation": TRANSLATION, "lm": LM,
    "sentiment": TRANSLATION.replace(name="pruning_sentiment", config="configs/sentiment.py:quick",
                                     overrides=budget(600), analyze=ANALYZE | TEACHER_FORCED | SIXTEENTH),
    "numbers": Preset("pruning_quick", "configs/numbers.py:quick", BASELINE, range(100, 105), FINDINGS,
                      metric=Metric("exact_match", "exact_match"), overrides=budget(200),
                      analyze=ANALYZE | {"gate_steps": 300}),
    "full": Preset("pruning_full", "configs/numbers.py", BASELINE, range(5), FINDINGS, metric=BLEU,
                   overrides={"model.num_heads": 8}, analyze=ANALYZE | BIG),
    "gpu": Preset("pruning_gpu", "configs/bible.py", BASELINE, [0, 1, 2], FINDINGS, metric=BLEU,
                  overrides={"model.num_heads": 8}, analyze=ANALYZE | BIG),
}


# --- the comparison point and the findings' differences ----------------------------------------------------------


def _curves(rows: list[dict], sweep_dir: str) -> dict[int, dict]:
    """Each seed's prune.json of the trained arm."""
    return pt.per_seed(sweep_dir, next(iter(grouped(rows, variant_of).values()), []), "prune")


def _midpoint(curves: dict[int, dict]) -> bool:
    """Log-likelihood curves have no zero to halve: they are compared at the random curve's midpoint."""
    return next(iter(curves.values())).get("metric", "accuracy") == "log_likelihood"


def _own_point(curves: dict[int, dict]) -> float | None:
    """The % pruned where these curves' mean random curve is at half (or midway); None without random curves."""
    if not curves or not all("random" in f for f in curves.values()):
        return None
    return pt.half_point(curves, midpoint=_midpoint(curves))


def planned_point(sweep_dir: str, exp) -> float | None:
    """The plan's comparison point: the plan registered when the sweep started (a later re-pilot changes no
    recorded verdict; a pilot registers none), else the preset's plan; None: no plan has one yet."""
    registered = ((read_sweep_info(sweep_dir) or {}).get("registration") or {})
    use_registered = "plan" in registered and getattr(exp, "judge", "registered") != "current"
    plan = registered["plan"] if use_registered else getattr(exp, "plan", None)
    return ((plan or {}).get("measured") or {}).get("compare_at_percent")


def differences(rows: list[dict], sweep_dir: str, exp) -> tuple[dict[str, Interval | None], dict]:
    """Each finding's paired difference over seeds between two orders (or an order and the unpruned model), at
    the plan's comparison point (none yet: this run's own, as a pilot measures it)."""
    curves = _curves(rows, sweep_dir)
    at = planned_point(sweep_dir, exp)
    at = _own_point(curves) if at is None else at
    diffs = {}
    for key, (order, base, percent) in COMPARISONS.items():
        percent = at if percent is None else percent
        if percent is None or not all(o in f for f in curves.values() for o in {"importance", order, base} - {"full"}):
            continue
        diffs[key] = paired({s: pt.score_at(f, base, percent) for s, f in curves.items()},
                            {s: pt.score_at(f, order, percent) for s, f in curves.items()})
    return diffs, {}


def pilot_measures(rows: list[dict], sweep_dir: str, exp) -> dict:
    """What the plan keeps besides each finding's numbers: the pilot's own comparison point."""
    own = _own_point(_curves(rows, sweep_dir))
    return {} if own is None else {"compare_at_percent": own}


# --- report ------------------------------------------------------------------------------------------------------


def pruning_verdicts(rows: list[dict], sweep_dir: str, exp) -> Table | None:
    """The verdict table, saying where the orders were compared and where this run's own point is."""
    table, curves = verdicts(rows, sweep_dir, exp), _curves(rows, sweep_dir)
    own = _own_point(curves)
    if table is not None and own is not None:
        table.note += pt.comparison_note(planned_point(sweep_dir, exp), own, _midpoint(curves))
    return table


def report(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Michel et al.'s tables (single head, all-but-one, curves), the diagnosis, the random baseline, the verdicts,
    the structural speed-up and Voita et al.'s gates, each from the analysis files of the seeds that have them."""
    group = next(iter(grouped(rows, variant_of).values()), [])
    found = {name: analyses(sweep_dir, group, name) for name in ("ablate", "prune", "structural", "gates")}
    ablate = pt.per_seed(sweep_dir, group, "ablate")
    tables = [pt.single_head_table(found["ablate"]), pt.all_but_one_table(found["ablate"])] if found["ablate"] else []
    tables.append(pt.diagnosis_table(ablate))
    if found["prune"]:
        tables += [pt.curves_table(found["prune"], out_dir),
                   pt.random_baseline_table(pt.per_seed(sweep_dir, group, "prune"), ablate),
                   pruning_verdicts(rows, sweep_dir, exp)]
    tables += [pt.structural_table(found["structural"])] if found["structural"] else []
    tables += [pt.gates_table(found["gates"])] if found["gates"] else []
    return [t for t in tables if t is not None] + unfinished_table(rows)
