"""Grouped- and multi-query attention as the papers claim them (Shazeer 2019; Ainslie et al. 2023), on the
decoder-only LM: the 8-head model, its key/value heads shared by 2 groups (GQA) or 1 (MQA) trained from scratch,
and the same two **uptrained** -- each seed's finished 8-head run, its key/value heads mean-pooled into the groups
(``train.init_kv_heads='mean_pool'``), then trained for 5% of its steps, as Ainslie et al. do (Section 2.1).

  python -m attn_lab.sweep --experiment experiments/gqa.py:quick --workdir runs/gqa --vmap-seeds --parallel 2
  python -m attn_lab.sweep --experiment experiments/gqa.py:quick --workdir runs/pilot/gqa --pilot  # re-plan
  python -m attn_lab.sweep --experiment experiments/gqa.py:translation --workdir runs/gqa_translation \
      --pilot-and-verdict --vmap-seeds --parallel 2  # French -> English verses: pilot, plan, verdict

Ainslie et al.'s numbers are for uptrained T5-XXL models, so a from-scratch row is not their claim; the uptrained
rows start from the 8-head trial of the same seed (``'{trial:A-h8}'``: they run after it), the baseline every row
is paired with, in test loss (nats). The runs: docs/head_count.md (GQA uptraining).
"""

from __future__ import annotations

import math

from attn_lab.experiment import Finding, Metric, Powered, Preset, budget
from attn_lab.published.vaswani import GROUPED_QUERY, MULTI_QUERY
from attn_lab.reporting.default import Column, default_columns, metric_column, results_table, verdicts
from attn_lab.reporting.tables import Table, unfinished_table

# --- arms --------------------------------------------------------------------------------------------------------
STEPS = 400  # configs/bible_lm.py:quick
UPTRAIN_STEPS = STEPS // 20  # Ainslie et al.: 5% of the original training
BASELINE = "A-h8"
H8 = {"model.num_heads": 8, "model.head_dim": 8}
# Uptraining restarts at the recipe's peak rate after 3 warmup steps (lower peaks recover less: docs/head_count.md)
UPTRAIN = {"train.init_from": "{trial:A-h8}", "train.init_kv_heads": "mean_pool", "train.num_steps": UPTRAIN_STEPS,
           "train.warmup_steps": 3, "train.eval_every": UPTRAIN_STEPS, "train.checkpoint_every": UPTRAIN_STEPS}
SCRATCH = {BASELINE: H8, "GQA-h8-kv2": H8 | {"model.num_kv_heads": 2}, "MQA-h8": H8 | {"model.num_kv_heads": 1}}
ARMS = SCRATCH | {f"{k}-up": v | UPTRAIN for k, v in SCRATCH.items() if k != BASELINE}

# --- findings: against the 8-head row of the same seed; a margin of 2% perplexity, above Shazeer's multi-query cost
MARGIN = 0.02
NATS = Metric("test_loss", "minus the test loss (nats)", -1.0)
G, LN_PPL = GROUPED_QUERY, {k: v["ln_ppl"] for k, v in MULTI_QUERY.items()}
FINDINGS = {
    "GQA-h8-kv2-up": Finding("uptrained grouped-query attention matches multi-head (Ainslie et al. 2023)",
                             f"{G['gqa8']} vs {G['mha']} (GQA-8, 5% uptraining)", "not_worse", MARGIN),
    "MQA-h8-up": Finding("uptrained multi-query attention costs little (Ainslie et al. 2023)",
                         f"{G['mqa']} vs {G['mha']} (MQA, 5% uptraining)", "not_worse", MARGIN),
    "MQA-h8": Finding("multi-query attention trained from scratch costs little (Shazeer 2019)",
                      f"ln PPL {LN_PPL['mqa']} vs {LN_PPL['mha']}", "not_worse", MARGIN),
    "GQA-h8-kv2": Finding("grouped-query attention trained from scratch matches multi-head (not Ainslie et al.'s "
                          "setting: they uptrain)", f"{G['gqa8']} vs {G['mha']} (uptrained)", "not_worse", MARGIN),
}

# --- presets -----------------------------------------------------------------------------------------------------
# On translation (configs/bible.py:small, 600 steps): multi-query from scratch (Shazeer's setting) and both groupings
# uptrained for 5% of the steps (Ainslie et al.'s); grouped-query from scratch is left out: no paper claims it.
TRANSLATION_STEPS = 600
TRANSLATION_ARMS = {BASELINE: H8, "MQA-h8": SCRATCH["MQA-h8"]} | {
    f"{k}-up": v | UPTRAIN | budget(TRANSLATION_STEPS // 20) for k, v in SCRATCH.items() if k != BASELINE}
PRESETS = {"quick": Preset("gqa_quick", "configs/bible_lm.py:quick", ARMS, [100, 101, 102, 103, 104], FINDINGS,
                           BASELINE, NATS),
           "translation": Preset("gqa_translation", "configs/bible.py:small", TRANSLATION_ARMS, Powered(100, 8),
                                 {k: FINDINGS[k] for k in TRANSLATION_ARMS if k != BASELINE}, BASELINE, NATS)}


# --- report ------------------------------------------------------------------------------------------------------


def _training(arm: dict, steps: int) -> str:
    """How an arm was trained: from scratch (``steps``), or uptrained from the 8-head run."""
    if "train.init_from" in arm:
        return f"uptrained from {BASELINE}: pooled, +{arm['train.num_steps']} steps"
    return f"from scratch, {steps} steps"


def report(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Per arm: key/value heads, how it was trained, then test loss, parameters, speed and test perplexity; then the
    verdicts against the 8-head row."""
    arm = lambda a: exp.variants.get(a, {})  # noqa: E731
    own = [Column("kv heads", lambda a, g: arm(a).get("model.num_kv_heads") or arm(a).get("model.num_heads")),
           Column("training", lambda a, g: _training(arm(a), TRANSLATION_STEPS if "bible.py" in exp.config else STEPS))]
    note = (f"Mean ± std (seeds). Published: Shazeer 2019 (from scratch) ln PPL {LN_PPL['mha']} -> {LN_PPL['mqa']}; "
            f"Ainslie et al. 2023 (uptrained, average score) MHA {G['mha']}, GQA-8 {G['gqa8']}, MQA {G['mqa']}.")
    ppl = metric_column("test_loss", "test PPL", 3, math.exp)
    table = results_table(rows, exp, [*own, *default_columns(exp, rows), ppl],
                          "Grouped- and multi-query attention: from scratch and uptrained", note)
    judged = verdicts(rows, sweep_dir, exp)
    return [table, *([judged] if judged else []), *unfinished_table(rows)]
