"""Head count (Vaswani et al. 2017, Table 3): h heads at a fixed width (rows ``A-h<h>``, d_k = d_model / h), at a
fixed d_k (rows ``B-h<h>``), and 8 query heads sharing 1 or 2 key/value heads (``MQA-h8``, Shazeer 2019;
``GQA-h8-kv2``, Ainslie et al. 2023); and the h-versus-D transition of arXiv 2510.06662 (``:sharp*``).

  python -m attn_lab.sweep --experiment experiments/head_count.py:quick --workdir runs/head_count --pilot-and-verdict \
      --vmap-seeds --parallel 2  # pilot on seeds 0-4, its plan, then the verdict seeds the plan asks

Presets: ``quick`` = ``translation`` (French -> English verses, rows A in test nats; ``translation_kv``: MQA, GQA),
``sentiment`` (tweets, true-class nats), ``demo``, ``lm*`` (decoder-only LM), ``numbers``, ``sharp*``, ``full``,
``gpu``. Every run: docs/head_count.md.
"""

from __future__ import annotations

import math
import os

from attn_lab.experiment import Finding, Metric, Powered, Preset, budget
from attn_lab.published.vaswani import BEAM, GROUPED_QUERY, MULTI_QUERY, SHARP, TABLE3, vs
from attn_lab.reporting.default import Column, as_declared, default_columns, metric_column, results_table, verdicts
from attn_lab.reporting.tables import Table, column, every_variant, unfinished_table

# --- arms --------------------------------------------------------------------------------------------------------


def rows(d_model: int, heads: list[int], fixed_dk: int, b_heads: list[int], only: tuple = ()) -> dict:
    """Rows A (d_k = d_model / h), B (d_k fixed), MQA and GQA at 8 heads; ``only``: just those rows."""
    out = {f"A-h{h}": {"model.num_heads": h, "model.head_dim": d_model // h} for h in heads}
    out |= {f"B-h{h}": {"model.num_heads": h, "model.head_dim": fixed_dk} for h in b_heads}
    out |= {f"{name}-h8{tail}": {"model.num_heads": 8, "model.head_dim": d_model // 8, "model.num_kv_heads": kv}
            for name, tail, kv in (("MQA", "", 1), ("GQA", "-kv2", 2))}
    return {k: v for k, v in out.items() if not only or k in only}


def sharp_rows(lookups: list[int], heads: tuple[int, ...]) -> dict:
    """``D<D>-h<h>`` (``A-h<h>`` for one D): h heads splitting d_model 32, the answer summing D lookups."""
    name = (lambda d, h: f"A-h{h}") if len(lookups) == 1 else (lambda d, h: f"D{d}-h{h}")
    return {name(d, h): {"task.num_lookups": d, "model.num_heads": h, "model.head_dim": 32 // h}
            for d in lookups for h in heads}


# --- findings: margins fixed before any run (why these: docs/head_count.md) --------------------------------------
NATS = Metric("test_loss", "minus the test loss (nats)", sign=-1.0)
EXACT = Metric("test_exact_match", "test exact match")
READOUT = Metric("test_accuracy", "test accuracy at the read-out position")
CLASS = Metric("test_loss", "minus the test loss: log-likelihood of the true class (nats)", sign=-1.0)
MARGIN, SHARP_MARGIN = 0.02, 0.25  # 2% perplexity (or exact match); a quarter of the answers (chance's share)


def table3(paper: dict[str, str]) -> dict[str, Finding]:
    """Table 3's findings against eight heads, with the paper's numbers in the metric ``paper`` gives."""
    return {"A-h1": Finding("one head is worse than eight at fixed width (Table 3 A)", paper["A-h1"], "down", MARGIN),
            "A-h16": Finding("sixteen heads are no better or worse than eight (Table 3 A)", paper["A-h16"], "same",
                             MARGIN),
            "MQA-h8": Finding("one shared key/value head costs little (Shazeer 2019)", paper["MQA-h8"], "not_worse",
                              MARGIN),
            "GQA-h8-kv2": Finding("grouped key/value heads match full multi-head (Ainslie et al. 2023)",
                                  f"{GROUPED_QUERY['gqa8']} vs {GROUPED_QUERY['mha']}", "not_worse", MARGIN)}


MQA = {k: MULTI_QUERY[k] for k in ("mqa", "mha")}
FINDINGS = table3({"A-h1": vs((1, 512)), "A-h16": vs((16, 32)), "MQA-h8": "{} vs {} BLEU".format(
    *(v["bleu"] for v in MQA.values()))})
FINDINGS_LM = table3({"A-h1": vs((1, 512), column=0), "A-h16": vs((16, 32), column=0),
                      "MQA-h8": "ln PPL {} vs {}".format(*(v["ln_ppl"] for v in MQA.values()))})
DEMO_FINDING = {"A-h16": Finding("sixteen heads are no better or worse than eight (Table 3 A; 200 steps from scratch)",
                                 FINDINGS_LM["A-h16"].paper, "same", MARGIN)}
TRANSITION = "h < D fails, h >= D solves"
SHARP_SUM = {"A-h1": Finding("one head fails where two solve when an answer sums two lookups (arXiv 2510.06662)",
                         TRANSITION, "down", SHARP_MARGIN),
         "A-h4": Finding("four heads solve it as two do (h >= D)", "h >= D solves", "same", SHARP_MARGIN)}
SHARP_H4 = {"A-h1": Finding("one head fails where four solve when an answer sums two lookups (arXiv 2510.06662: "
                            "h < D fails, h > D solves)", TRANSITION, "down", SHARP_MARGIN)}

# --- presets -----------------------------------------------------------------------------------------------------
LM = Preset("head_count_lm", "configs/bible_lm.py:quick", rows(64, [1, 2, 4, 8, 16], 16, []), range(100, 105),
            FINDINGS_LM, "A-h8", NATS)
SHARP_H4_PRESET = Preset("head_count_sharp_h4", "configs/dretrieval.py:sum", sharp_rows([2], (1, 4)), [110, 111, 112],
                         SHARP_H4, "A-h4", READOUT)
TRANSLATION = Preset("head_count_translation", "configs/bible.py:small", rows(64, [1, 8, 16], 16, [], (
    "A-h1", "A-h8", "A-h16")), Powered(100, 8), {k: FINDINGS_LM[k] for k in ("A-h1", "A-h16")}, "A-h8", NATS)
PRESETS = {
    "demo": Preset("head_count_demo", "configs/bible_lm.py:quick", rows(64, [8, 16], 16, [], ("A-h8", "A-h16")),
                   [500, 501, 502], DEMO_FINDING, "A-h8", NATS, overrides=budget(200)),
    "quick": TRANSLATION, "translation": TRANSLATION, "lm": LM,
    "translation_kv": TRANSLATION.replace(name="head_count_translation_kv", arms=rows(64, [8], 16, [], (
        "A-h8", "MQA-h8", "GQA-h8-kv2")), findings={k: FINDINGS_LM[k] for k in ("MQA-h8", "GQA-h8-kv2")}),
    "lm_powered": LM.replace(name="head_count_lm_powered", arms=rows(64, [1, 8], 16, [], ("A-h1", "A-h8")),
                             seeds=Powered(200), findings={"A-h1": FINDINGS_LM["A-h1"]}, pilot_seeds=range(100, 105)),
    "lm_mqa": LM.replace(name="head_count_lm_mqa", arms=rows(64, [8], 16, [], ("A-h8", "MQA-h8")), seeds=Powered(300),
                         findings={"MQA-h8": FINDINGS_LM["MQA-h8"]}, pilot_seeds=range(100, 105)),
    "numbers": Preset("head_count_quick", "configs/numbers.py:quick", rows(64, [1, 2, 4, 8, 16], 16, [1, 8]),
                      range(100, 105), FINDINGS, "A-h8", EXACT, overrides=budget(150) | BEAM),
    "sharp": Preset("head_count_sharp_sum", "configs/dretrieval.py:sum", sharp_rows([2], (1, 2, 4)), [100, 101, 102],
                    SHARP_SUM, "A-h2", READOUT),
    "sharp_h4": SHARP_H4_PRESET,
    "sharp_powered": SHARP_H4_PRESET.replace(name="head_count_sharp_powered", seeds=Powered(120),
                                             pilot_seeds=(*range(5), 100, 101, 102, 110, 111, 112, 200, 201)),
    "sharp_curve": Preset("head_count_sharp_sum_curve", "configs/dretrieval.py:sum",
                          sharp_rows([2, 3], (1, 2, 4, 8)), [200, 201], metric=READOUT),
    "sentiment": Preset("head_count_sentiment", "configs/sentiment.py:quick", rows(64, [1, 8], 16, [], (
        "A-h1", "A-h8")), Powered(100, 14), {"A-h1": FINDINGS_LM["A-h1"]}, "A-h8", CLASS, overrides=budget(600)),
    "full": Preset("head_count_full", "configs/numbers.py", rows(128, [1, 2, 4, 8, 16, 32], 32, [1, 2, 8, 16]),
                   range(5), FINDINGS, "A-h8", EXACT, overrides=BEAM),
    "gpu": Preset("head_count_gpu", "configs/bible.py", rows(256, [1, 4, 8, 16], 64, [], ("A-h1", "A-h4", "A-h8",
                  "A-h16")), [0, 1, 2], {k: FINDINGS[k] for k in ("A-h1", "A-h16")}, "A-h8", EXACT,
                  overrides={"model.d_model": 256} | BEAM),
}


# --- report: Table 3's columns and the h-curve per family ----------------------------------------------------------


def _paper(arm: str, h: int | None) -> str:
    found = TABLE3.get((h, 512 // h)) if arm.startswith("A-") and h else None
    return "–" if found is None else f"{found[0]} / {found[1]}"


def report(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Heads, d_k, key/value heads, then the default columns, BLEU and perplexity beside Vaswani et al.'s; a plot
    of the deciding metric against h per family (rows A, rows B, or one curve per D)."""
    from attn_lab.reporting.plots import errorbar_plot

    exp = as_declared(exp, EXACT if any("test_exact_match" in r for r in rows) else NATS, "A-h8")
    metric, sharp = exp.preset.metric, exp.preset.metric.key == "test_accuracy"
    arm = lambda a: exp.variants.get(a, {})  # noqa: E731
    heads = lambda a: arm(a).get("model.num_heads")  # noqa: E731
    own = [Column("h", lambda a, g: heads(a)), Column("d_k", lambda a, g: arm(a).get("model.head_dim")),
           Column("kv heads", lambda a, g: arm(a).get("model.num_kv_heads") or heads(a))]
    paper = [] if sharp else [metric_column("test_accuracy", "accuracy")] if metric == CLASS else [
        metric_column("test_bleu", "BLEU", 2), metric_column("test_loss", "PPL", 3, math.exp),
        Column("Vaswani PPL / BLEU", lambda a, g: _paper(a, heads(a)))]
    series = {}
    for name, group, _ in every_variant(rows):
        family = name.split("-")[0]
        if group and (family in ("A", "B") or family[:1] == "D"):
            label = {"A": "d_k = d_model / h", "B": f"d_k = {arm(name).get('model.head_dim')}"}.get(
                family, f"D = {family[1:]} lookups")
            x, ys = series.setdefault(f"{family}: {label}", ([], []))
            x.append(heads(name))
            ys.append([math.exp(v) if metric.sign < 0 else v for v in column(group, metric.key)])
    errorbar_plot(os.path.join(out_dir, "head_count.png"), series, "heads h",
                  "test perplexity" if metric.sign < 0 else metric.label, "head count")
    note = ("Mean ± std (seeds). Published: Vaswani et al. Table 3, same h at d_model 512; multi-query (Shazeer) BLEU "
            f"{MULTI_QUERY['mha']['bleu']} -> {MULTI_QUERY['mqa']['bleu']}; GQA-8 (Ainslie et al.) "
            f"{GROUPED_QUERY['mha']} -> {GROUPED_QUERY['gqa8']}.") if not sharp else \
        f"Mean ± std (seeds); chance 1/4 at every D (a sum mod 4). Published: {SHARP}"
    table = results_table(rows, exp, [*own, *default_columns(exp, rows), *paper], "Head count", note)
    judged = verdicts(rows, sweep_dir, exp)
    return [table, *([judged] if judged else []), *unfinished_table(rows)]
