"""Head-diversity regularizers (Li et al. 2018, "Multi-Head Attention with Disagreement Regularization": the
subspace, position and output terms; a map-cosine hinge) against the baseline.

  python -m attn_lab.sweep --experiment experiments/diversity.py:quick --workdir runs/diversity --pilot-and-verdict \
      --vmap-seeds --parallel 2  # pilot on seeds 0-4, its plan, then the verdict seeds the plan asks

Presets: ``quick`` = ``translation`` (French -> English verses, each term at Li et al.'s lambda = 1, judged in
test nats; BLEU beside), ``translation_small`` (the Li et al. terms at the ``lm`` weights), ``lm`` (a decoder-only
LM, each term at the papers' range of weights, nats), ``numbers`` (synthetic translation, lambda = 1, exact
match), ``full``, ``gpu``. Per arm: quality, the mean pairwise similarity of head attention maps (the analysis'
diagnose) and how many heads prune (importance order) within 1 BLEU (a point of token accuracy) of the unpruned
model. Every run: docs/diversity.md.
"""

from __future__ import annotations

import numpy as np

from attn_lab.experiment import Finding, Metric, Powered, Preset, budget
from attn_lab.published.li import LI_DIVERSITY, MAP_COSINE_GAIN
from attn_lab.reporting.default import Column, results_table, verdicts
from attn_lab.reporting.tables import Table, analyses, column, every_variant, mean_std, unfinished_table

# --- arms: one diversity term each (loss.diversity.<term>.weight) ---------------------------------------------------
LI = ("subspace", "position", "output")
# Li et al.'s lambda = 1 is weight 1 here (attn_lab/train/diversity.py; tests/test_diversity_scale.py); the
# map-cosine hinge at its source article's weight.
HINGE = 0.01
WEIGHTS = {"map_cosine": HINGE} | dict.fromkeys(LI, 1.0)
LM_WEIGHTS = {"map_cosine": HINGE} | dict.fromkeys(LI, 0.1)  # the top of the range such terms are used at


def arms(terms, weights: dict) -> dict:
    """The baseline and one arm per diversity term at its weight."""
    return {"baseline": {}} | {n: {f"loss.diversity.{n}.weight": weights[n]} for n in terms}


# --- findings: each term against the baseline; the margin (exact match or nats) is the smallest gain that counts --
MARGIN = 0.02  # Li et al.'s gain is about 3% relative (docs/diversity.md)
NATS = Metric("test_loss", "minus the test loss (nats)", -1.0)
EXACT = Metric("test_exact_match", "test exact match")
LI_BLEU = "en-de base {} -> {} BLEU".format(*LI_DIVERSITY["en-de base"])


def findings(weights: dict | None = None) -> dict[str, Finding]:
    """Each term improves quality; with ``weights`` (the LM preset) each claim names its weight."""
    def weight(term: str) -> str:
        return f"; weight {weights[term]}" if weights else ""

    out = {n: Finding(f"the {n} disagreement regularizer improves quality (Li et al. 2018{weight(n)})",
                      LI_BLEU if weights else f"{LI_BLEU} (all three combined)", "up", MARGIN) for n in LI}
    out["map_cosine"] = Finding(f"the map-cosine hinge improves quality (source article 002{weight('map_cosine')})",
                                MAP_COSINE_GAIN, "up", MARGIN)
    return out


FINDINGS, FINDINGS_LM = findings(), findings(LM_WEIGHTS)

# --- presets -----------------------------------------------------------------------------------------------------
ANALYZE = {"what": ["diagnose", "prune"], "metric": "bleu", "max_batches": 2, "prune_fraction": 0.125}
LM = Preset("diversity_lm", "configs/bible_lm.py:quick", arms(LM_WEIGHTS, LM_WEIGHTS), range(100, 106),
            FINDINGS_LM, "baseline", NATS, analyze=ANALYZE | {"metric": "accuracy"})  # pruning by token accuracy
TRANSLATION = Preset("diversity_translation", "configs/bible.py:small", arms(WEIGHTS, WEIGHTS), Powered(100, 8),
                     findings(WEIGHTS), "baseline", NATS, analyze=ANALYZE | {"metric": "accuracy"})
PRESETS = {
    "quick": TRANSLATION, "translation": TRANSLATION, "lm": LM,
    "translation_small": TRANSLATION.replace(name="diversity_translation_small", arms=arms(LI, LM_WEIGHTS),
                                             findings={n: FINDINGS_LM[n] for n in LI}),
    "numbers": Preset("diversity_quick", "configs/numbers.py:quick", arms([*LI, "map_cosine"], WEIGHTS),
                      range(100, 105), FINDINGS, "baseline", EXACT, analyze=ANALYZE,
                      overrides=budget(150)),
    "full": Preset("diversity_full", "configs/numbers.py", arms(WEIGHTS, WEIGHTS), range(5), FINDINGS, "baseline",
                   EXACT, analyze=ANALYZE | {"max_batches": 8}),
    "gpu": Preset("diversity_gpu", "configs/bible.py", arms(LI, WEIGHTS), [0, 1, 2], {n: FINDINGS[n] for n in LI},
                  "baseline", EXACT, analyze=ANALYZE | {"max_batches": 8}),
}


# --- report: quality, head similarity and robustness to pruning per arm ----------------------------------------------
PRUNE_WITHIN = {"bleu": 1.0, "accuracy": 0.01}  # a pruning curve's score still counts as unpruned within this


def within(lm: bool) -> str:
    """The pruning margin of a translation's curve (in BLEU) or a language model's (in token accuracy), as text."""
    return f"{PRUNE_WITHIN['accuracy']:g} accuracy" if lm else f"{PRUNE_WITHIN['bleu']:g} BLEU"


def _prunable_within(curve: list[dict], margin: float) -> float:
    """Largest % of heads pruned (importance order) with the score still within ``margin`` of the full model's."""
    base = curve[0]["score"]
    ok = [p["percent"] for p in curve if p["score"] >= base - margin]
    return float(max(ok, default=0))


def _similarity(sweep_dir: str, group: list[dict]) -> str:
    """Mean pairwise similarity of head maps over layers, per seed (analysis/diagnose.json)."""
    return mean_std([np.mean([v["mean_similarity"] for v in d.values()]) for d in analyses(sweep_dir, group,
                                                                                           "diagnose")], 3)


def _prunable(sweep_dir: str, group: list[dict]) -> str:
    """% of heads prunable within PRUNE_WITHIN of the unpruned score (in the curve's metric)."""
    prune = analyses(sweep_dir, group, "prune")
    margin = PRUNE_WITHIN["bleu" if prune and prune[0].get("metric") == "bleu" else "accuracy"]
    return mean_std([_prunable_within(p["importance"], margin) for p in prune], 0)


def report(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Li et al. style: each regularizer vs the baseline -- quality (test perplexity where judged in nats, BLEU and
    exact match for translation), head similarity, robustness to pruning (the share of heads prunable within
    PRUNE_WITHIN, and the metric after the first pruning step, both in importance order); then the verdicts."""
    lm = bool(rows) and not any("test_exact_match" in r for r in rows)
    first = next((p[0]["importance"][1]["percent"] for _, g, _ in every_variant(rows)
                  if (p := analyses(sweep_dir, g, "prune"))), None)
    score = "test_bleu" if any("test_bleu" in r for r in rows) else "test_accuracy"
    ppl = Column("test perplexity", lambda a, g: mean_std([float(np.exp(v)) for v in column(g, "test_loss")], 3))
    quality = [ppl, Column("token accuracy", lambda a, g: mean_std(column(g, "test_accuracy"), 3))] if lm else \
        [*([ppl] if getattr(exp.preset, "metric", None) == NATS else []),  # judged in nats: BLEU beside
         Column("BLEU / accuracy", lambda a, g: mean_std(column(g, score), 3)),
         Column("exact match", lambda a, g: mean_std(column(g, "test_exact_match"), 3))]
    columns = [*quality, Column("mean head map similarity", lambda a, g: _similarity(sweep_dir, g)),
               Column(f"% heads prunable within {within(lm)}", lambda a, g: _prunable(sweep_dir, g)),
               Column(f"metric with {first or 0:.1f}% of heads pruned", lambda a, g: mean_std(
                   [p["importance"][1]["score"] for p in analyses(sweep_dir, g, "prune")], 2))]
    li = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in LI_DIVERSITY.items())
    table = results_table(rows, exp, columns, "Head diversity",
                          f"Li et al. 2018 (disagreement regularization, BLEU base -> regularized): {li}.")
    judged = verdicts(rows, sweep_dir, exp)
    return [table, *([judged] if judged else []), *unfinished_table(rows)]
