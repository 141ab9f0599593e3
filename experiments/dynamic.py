"""Dynamic attention: softmax vs entmax at alpha 3/2 vs learned-alpha entmax (Correia et al. 2019, "Adaptively Sparse
Transformers") vs adaptive span (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers"), with its own
tables: per-kind mean span / alpha / share of exactly-zero weights, learned alphas, learned spans.

  python -m attn_lab.sweep --experiment experiments/dynamic.py:quick --workdir runs/dynamic_lm --vmap-seeds
  python -m attn_lab.sweep --experiment experiments/dynamic.py:lm_span --workdir runs/dynamic_lm_span --vmap-seeds
  python -m attn_lab.sweep --experiment experiments/dynamic.py:quick --workdir runs/pilot/dyn --pilot  # re-plan

Presets: ``quick`` = ``lm_quick`` (the decoder-only LM, every arm, in nats), ``lm_span`` (softmax against adaptive
span trained with the paper's clamp), ``numbers`` (translation, 150 steps, exact match), ``full`` (numbers' full
config), ``gpu`` (ListOps at LRA lengths, about 10 minutes on one H200 with --vmap-seeds). Every trial runs
``python -m attn_lab.analysis --what diagnose`` (zero weights); spans and alphas come from results.json. Why each
budget and setting, and every run: docs/dynamic.md.
"""

from __future__ import annotations

from attn_lab.experiment import Finding, Metric, Preset, budget
from attn_lab.published import adaptive as paper
from attn_lab.reporting import dynamic_tables as dt
from attn_lab.reporting.default import verdicts
from attn_lab.reporting.tables import Table, grouped, unfinished_table, variant_of

# --- arms --------------------------------------------------------------------------------------------------------
# Spans start at 0 as in the paper's released code (--adapt-span-init 0) and pay its enwik8 scripts' span-loss weight
# (per token of mean span and layer); a span of 64 covers every numbers / quick-LM sequence, with an 8-token ramp.
SPAN = {"model.attention.adaptive_span.max_span": 64, "model.attention.adaptive_span.ramp": 8.0,
        "model.attention.adaptive_span.init_span": 0.0, "loss.span.weight": 2e-6}
ENTMAX = {"model.attention.name": "entmax", "model.attention.entmax.alpha": 1.5}
ARMS = {  # translation: the decoder's cross-attention stays softmax under adaptive span (no distance between texts)
    "softmax": {"model.attention.name": "dense"},
    "entmax15": ENTMAX,
    # 25 bisection steps, not the entmax package's 50: below float32's resolution already (tests/test_kernel_entmax)
    "entmax_learned": {**ENTMAX, "model.attention.entmax.learn_alpha": True, "model.attention.entmax.n_iter": 25},
    "adaptive_span": {"model.attention.name": "adaptive_span", "model.kinds.cross.attention": "dense", **SPAN},
}
# The LM and ListOps have self-attention only: every kind gets the arm's kernel (naming cross-attention is refused)
SELF_ONLY = ARMS | {"adaptive_span": {k: v for k, v in ARMS["adaptive_span"].items() if "kinds" not in k}}
# ':lm_span': the paper code's clamp of v to [0, 1] after every step, spans started at half of S (docs/dynamic.md)
CLAMPED = SELF_ONLY["adaptive_span"] | {"model.attention.adaptive_span.clamp": True,
                                        "model.attention.adaptive_span.init_span": 0.5}
LRA = {  # ':gpu': ListOps at 500-2000 tokens
    "model.attention.adaptive_span.max_span": 1024, "model.attention.adaptive_span.ramp": 32.0}


# --- findings: each arm against softmax, with a margin (exact match, accuracy or nats) fixed before any run ------
MARGIN = 0.02  # Correia et al.'s entmax gains are 1-3% of BLEU
NATS = Metric("test_loss", "minus the test loss (nats)", -1.0)
EXACT = Metric("test_exact_match", "exact match")
ACCURACY = Metric("test_accuracy", "accuracy")
BLEU = paper.CORREIA_BLEU["IWSLT17 de-en"]
IWSLT = {arm: f"IWSLT de-en {BLEU[paper.CORREIA_COLUMN[arm]]:.2f} vs {BLEU[paper.CORREIA_COLUMN['softmax']]:.2f}"
         for arm in ("entmax15", "entmax_learned")}
SPAN_CLAIM = "adaptive span keeps quality at a fraction of the span (Sukhbaatar et al.)"
TEXT8 = f"text8 24L {paper.SUKHBAATAR['text8 24L']} bpc"
FINDINGS = {
    "entmax15": Finding("1.5-entmax matches softmax (Correia et al. Table 1)", IWSLT["entmax15"], "not_worse", MARGIN),
    "entmax_learned": Finding("learned-alpha entmax matches softmax (Correia et al. Table 1)", IWSLT["entmax_learned"],
                              "not_worse", MARGIN),
    "adaptive_span": Finding(SPAN_CLAIM, f"{TEXT8}, mean span ~300 of {paper.SUKHBAATAR_MAX_SPAN}", "not_worse",
                             MARGIN),
}
# ':lm_span' cites the paper's row as docs/published.md checked it (the 24-layer text8 model's average span)
AVERAGE = f"average span {paper.SUKHBAATAR_AVERAGE_SPAN['text8 24L']} of {paper.SUKHBAATAR_MAX_SPAN} (Table 1)"
FINDINGS_SPAN = {"adaptive_span": Finding(SPAN_CLAIM, f"{TEXT8}, {AVERAGE}", "not_worse", MARGIN)}

# --- presets -----------------------------------------------------------------------------------------------------
DIAGNOSE = {"what": ["diagnose"]}
VERDICT_SEEDS = [100, 101, 102, 103, 104]
LM = Preset("dynamic_lm_quick", "configs/bible_lm.py:quick", SELF_ONLY, VERDICT_SEEDS, FINDINGS, "softmax", NATS,
            analyze=DIAGNOSE)
PRESETS = {
    "quick": LM, "lm_quick": LM,
    "lm_span": LM.replace(name="dynamic_lm_span", arms={"softmax": SELF_ONLY["softmax"], "adaptive_span": CLAMPED},
                          seeds=[110, 111, 112, 113, 114], findings=FINDINGS_SPAN),
    "numbers": Preset("dynamic_quick", "configs/numbers.py:quick", ARMS, VERDICT_SEEDS, FINDINGS, "softmax", EXACT,
                      overrides=budget(150), analyze=DIAGNOSE),
    "full": Preset("dynamic_full", "configs/numbers.py", ARMS, [0, 1, 2], FINDINGS, "softmax", EXACT,
                   analyze=DIAGNOSE),
    "gpu": Preset("dynamic_gpu", "configs/listops.py", SELF_ONLY | {"adaptive_span": SELF_ONLY["adaptive_span"] | LRA},
                  [0, 1, 2], FINDINGS, "softmax", ACCURACY, analyze=DIAGNOSE,
                  overrides={"task.min_length": 500, "task.max_length": 2000, "task.max_depth": 10}),
}


# --- report ------------------------------------------------------------------------------------------------------


def report(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Quality, speed vs softmax, mean span / alpha / zero weights per kind; learned alpha and span tables; the
    verdicts, the adaptive-span row labelled a fixed window where its spans did not move (dynamic_tables.span_check)."""
    groups = grouped(rows, variant_of)
    span = dt.span_options((exp.variants or {}).get("adaptive_span", {}), SPAN)
    runs = dt.run_spans(groups, sweep_dir)
    finding = exp.design.findings.get("adaptive_span") if exp.design else None
    judged = dt.span_check(verdicts(rows, sweep_dir, exp), finding and finding.claim,
                           dt.spans_moved(runs, span["init_tokens"]), span["ramp"])
    alphas = [dt.alpha_table(groups, sweep_dir)] if "entmax_learned" in groups else []
    return [dt.quality_table(rows, groups, sweep_dir), *alphas, dt.span_table(runs, span),
            *([judged] if judged else []), *unfinished_table(rows)]
