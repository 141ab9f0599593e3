"""Associative recall (Zoology, Arora et al. 2023, Figure 2; Based, Arora et al. 2024, Figures 2-3): which attention
kernels can look a key up in their context, as the sequence grows at a fixed width.

  python scripts/sweep.py --experiment experiments/recall.py:quick --workdir runs/recall --vmap-seeds --parallel 2
  python scripts/make_tables.py --workdir runs/recall

Each trial trains a 2-layer decoder-only model (configs/mqar.py: attention-only blocks, learned positions, tied
embeddings) on MQAR -- N key-value pairs, then every key queried once at power-law distances
(attn_lab/data/tasks/mqar.py) -- and reports recall: accuracy at the query positions of the test sequences. Rows:
kernel x sequence length (T, N) x width: (64, 4), (128, 8) at width 64 in 'quick', (256, 16) too in 'full' and
(512, 64) in 'gpu'. Zoology finds exact attention at ~1.0 for every size while efficient token mixers fall with T at
a fixed width; Based finds sliding-window recall growing with the window and linear attention's recall growing with
its state.

Where ours differs (and why): a vocabulary of 64 instead of 8,192 and 1,000 steps of batch 32 instead of 64 epochs
of 100,000 sequences, so 'quick' runs on 2 CPU cores; 4 heads instead of Zoology's 1 (in early probes, not kept as a
committed run, one head of width 64 formed the recall circuit far more slowly than four); one learning rate instead
of the best of four. The smaller vocabulary makes recall easier for every kernel (the Zoology README: a larger
vocabulary sharpens the differences), so expect smaller gaps than the papers'. docs/recall.md has the probes that
set the budget, with their commands.

Paper numbers: Zoology Figure 2 and Based Figures 2-3 are plots; the values below were read from them and from the
public configs (HazyResearch/zoology: zoology/experiments/iclr24_zoology_figure2, arxiv24_based_figure2/3), not
copied from a table -- check the figures before citing them.
"""

from __future__ import annotations

import os

import numpy as np

from attn_lab.reporting.tables import Table, column, grouped, mean_std, unfinished_table
from attn_lab.reporting.verdicts import Design, Finding, compare, verdict_table

LENGTHS = [(64, 4), (128, 8), (256, 16)]  # (T, N): Zoology Figure 2's first three
QUICK_LENGTHS = LENGTHS[:2]  # T=256 does not fit 30 CPU minutes (see get_experiment)
CHUNK = 64  # causal linear / Performer chunk: each chunk does a masked quadratic form, so at T <= 256 the default
#             256 would be one whole-sequence quadratic form (the O(T^2) work linear attention exists to avoid)
KERNELS = {  # row name -> overrides (local-w: a causal window of w keys, the query and the w - 1 before it)
    "dense": {"model.attention.name": "dense"},
    "local-8": {"model.attention.name": "local", "model.attention.local.window": 8},
    "local-32": {"model.attention.name": "local", "model.attention.local.window": 32},
    "linear": {"model.attention.name": "linear", "model.attention.linear.chunk_size": CHUNK},
    "performer": {"model.attention.name": "performer", "model.attention.performer.num_features": 64,
                  "model.attention.performer.chunk_size": CHUNK},
}
LEARNED = {"adaptive_span": {"model.attention.name": "adaptive_span", "model.attention.adaptive_span.max_span": 256,
                             "model.attention.adaptive_span.init_span": 0.25},
           "entmax15": {"model.attention.name": "entmax"}}
STEPS = 1000
# 'state': Based's Figure 3 layout at one length -- recall against the size of the recurrent state at T=64, with a
# vocabulary above T as Zoology requires (256 > 64) and the budget at which dense recall reached 1.0 in probes
# (batch 64 x 3,000 steps; docs/recall.md). Performer's state per head is num_features x d_k. Performer-256 (the
# slowest row, ~1 step/s) comes first so that it starts first under --parallel 2.
STATE_KERNELS = {"performer-256": {**KERNELS["performer"], "model.attention.performer.num_features": 256}} | {
    k: KERNELS[k] for k in ("dense", "linear", "performer")} | {
    "performer-16": {**KERNELS["performer"], "model.attention.performer.num_features": 16}}
STATE_STEPS = 3000
STATE_DATA = {"task.vocab_size": 256}
# 'state_sinusoidal': the same layout with the recipe on which dense recall formed on every probe seed. A seed on
# which ':state''s dense row plateaus confuses two neighbouring key-value pairs (recall ~0.5 on each, ~1.0 on the
# others: docs/recall.md, "Why dense plateaus"): the first layer has not learned to tell their positions apart, and
# learned positions start at 0.02 beside unit-scale token embeddings. Fixed sinusoidal positions (unit scale, and
# the previous position is one linear map away) with a learning rate of 1e-2 formed the circuit on seeds 300-302 by
# step 1,500. Performer-256 is left out (~1 step/s, a third of the sweep's CPU time); the pilot compared 64 with 16
# features, a 4x larger state.
SINUSOIDAL = {"model.positions": "sinusoidal", "train.learning_rate": 1e-2}
SINUSOIDAL_STEPS = 1500
SINUSOIDAL_KERNELS = {k: STATE_KERNELS[k] for k in ("dense", "linear", "performer", "performer-16")}
# 'state_tuned': ':state_sinusoidal''s rows, each at the learning rate it learns at (Zoology reports each model at the
# best of a sweep of rates). Chosen from {3e-3, 1e-2} on probe seeds 300-302 (docs/recall.md): dense forms its
# circuit on every seed at 1e-2 and climbs slowly at 3e-3 (0.43-0.48 by step 1,500); linear attention and Performer
# stay at chance at 1e-2 and learn at 3e-3 (linear 0.49-0.53 by step 3,000). 3,000 steps for every row: the
# compressed kernels were still climbing at 1,500.
TUNED_LR = {"dense": 1e-2, "linear": 3e-3, "performer": 3e-3, "performer-16": 3e-3}
TUNED_KERNELS = {k: {**ov, "train.learning_rate": TUNED_LR[k]} for k, ov in SINUSOIDAL_KERNELS.items()}
TUNED_STEPS = 3000


def _train(steps: int, batch: int = 32) -> dict:
    return {"task.vocab_size": 64, "model.num_heads": 4, "train.learning_rate": 3e-3, "train.batch_size": batch,
            "train.num_steps": steps, "train.eval_every": steps, "train.checkpoint_every": steps,
            "train.log_every": 100}


def _variants(widths, kernels: dict, lengths) -> dict:
    """One named row per kernel x length x width: ``dense/T128/d64``."""
    return {f"{k}/T{t}/d{d}": {**ov, "task.seq_len": t, "task.num_kv_pairs": n, "model.d_model": d}
            for k, ov in kernels.items() for t, n in lengths for d in widths}


def get_experiment(preset: str = "quick") -> dict:
    """'quick': five kernels x (T, N) in (64, 4), (128, 8) at d_model 64, 3 seeds, 1,000 steps of batch 32 (<= 30
    minutes on 2 CPU cores); 'full': the three lengths, d_model 64 and 128, adaptive span and entmax too, 1,500
    steps of batch 64, 3 seeds (several hours on 2 CPU cores); 'gpu': the papers' sizes -- vocabulary 8192, 100k
    sequences, T up to 512 (N = 64), d_model 64-256, one head as in Zoology, 3 seeds. 'state',
    'state_sinusoidal' and 'state_tuned': recall against Performer's state at T=64 (the comments above them).

    Why quick stops at T=128: exact attention forms its recall circuit abruptly (train recall 0.09 -> 0.99 between
    steps 600 and 800 at T=256, batch 64), and at batch 16 or 32 it had not formed by step 1,000 (0.07-0.08,
    docs/recall.md). A dense T=256 row at batch 64 x 1,000 steps takes 7.5 minutes per seed here, so the three
    lengths do not fit 30 minutes; 'full' has them. Why batch 32 x 1,000 steps: at batch 64 x 600 steps (the same
    CPU time) dense reached 1.0 at T=64 on one of three seeds and 0.63 / 0.87 on the others, still climbing when the
    cosine schedule ended; a learning rate of 5e-3 (warm-up 50) was worse (0.52 / 0.38, and 0.13 at T=128)."""
    if preset == "quick":
        return {"name": "recall_quick", "config": "configs/mqar.py:quick", "overrides": _train(STEPS),
                "variants": _variants([64], KERNELS, QUICK_LENGTHS), "seeds": VERDICT_SEEDS,
                "design": Design.of(FINDINGS, QUICK_SD, PILOT, PILOT_SEEDS, QUICK_FINDINGS, QUICK_EFFECT)}
    if preset == "state":
        return {"name": "recall_state", "config": "configs/mqar.py:quick",
                "overrides": _train(STATE_STEPS, 64) | STATE_DATA,
                "variants": _variants([64], STATE_KERNELS, LENGTHS[:1]), "seeds": STATE_SEEDS,
                "design": Design.of(FINDINGS, STATE_SD, STATE_PILOT, STATE_PILOT_SEEDS, STATE_FINDINGS, STATE_EFFECT)}
    if preset == "state_sinusoidal":
        return {"name": "recall_state_sinusoidal", "config": "configs/mqar.py:quick",
                "overrides": _train(SINUSOIDAL_STEPS, 64) | STATE_DATA | SINUSOIDAL,
                "variants": _variants([64], SINUSOIDAL_KERNELS, LENGTHS[:1]), "seeds": SINUSOIDAL_SEEDS,
                "design": Design.of(FINDINGS, SINUSOIDAL_SD, SINUSOIDAL_PILOT, SINUSOIDAL_PILOT_SEEDS,
                                    SINUSOIDAL_FINDINGS, SINUSOIDAL_EFFECT)}
    if preset == "state_tuned":
        return {"name": "recall_state_tuned", "config": "configs/mqar.py:quick",
                "overrides": _train(TUNED_STEPS, 64) | STATE_DATA | {"model.positions": "sinusoidal"},
                "variants": _variants([64], TUNED_KERNELS, LENGTHS[:1]), "seeds": TUNED_SEEDS,
                "design": Design.of(FINDINGS, TUNED_SD, TUNED_PILOT, TUNED_PILOT_SEEDS, TUNED_FINDINGS, TUNED_EFFECT)}
    if preset == "full":
        return {"name": "recall_full", "config": "configs/mqar.py:quick", "overrides": _train(1500, 64),
                "variants": _variants([64, 128], {**KERNELS, **LEARNED}, LENGTHS), "seeds": VERDICT_SEEDS,
                "design": Design.of(FINDINGS, None, PILOT, PILOT_SEEDS, LENGTH_FINDINGS)}
    if preset == "gpu":  # Zoology's data: vocabulary 8192, 100k sequences, T up to 512, one head
        data = {"task.num_train": 100_000, "task.num_test": 3000, "train.num_steps": 20_000,
                "train.eval_every": 5000, "train.checkpoint_every": 5000, "train.batch_size": 256,
                "model.num_heads": 1}
        return {"name": "recall_gpu", "config": "configs/mqar.py", "overrides": data,
                "variants": _variants([64, 128, 256], KERNELS, [*LENGTHS, (512, 64)]), "seeds": VERDICT_SEEDS,
                "design": Design.of(FINDINGS, None, PILOT, PILOT_SEEDS, LENGTH_FINDINGS)}
    raise ValueError(f"unknown preset '{preset}' for experiments/recall.py; use quick, state, state_sinusoidal, "
                     "state_tuned, full or gpu")


# --- published findings (Zoology Figure 2; Based Figures 2-3) -----------------------------------------------------
ZOOLOGY = ("attention ~1.0 at every size; at d_model 64 the gated-convolution mixers (H3, Hyena, RWKV, BaseConv) "
           "~0.5-0.9 at T=64, 0.18-0.37 at T=128, <= 0.15 at T=256 (read from Figure 2)")
BASED = ("sliding-window recall grows with the window; linear attention's recall grows with its state size "
         "(Performer, CosFormer, ReLU, Taylor feature maps; Figures 2-3)")
# Each finding is a paired difference in test recall (accuracy at the query positions) over seeds, at the lengths a
# preset judges (JUDGED): 'solves' compares dense's worst judged length with perfect recall (1.0), 'below attention'
# a kernel with dense at the longest judged length. Margins fixed before the verdict run: 0.05 of recall is the
# least that counts as 'solved' (Zoology's attention is within a few points of 1.0), 0.1 the least fall, gap or gain
# that counts (the papers' are 0.3-0.8).
FINDINGS = {
    "attention solves": Finding("attention solves MQAR at every judged length (its worst vs 1.0)",
                                "Zoology Fig. 2: ~1.0", "not_worse", 0.05),
    "linear below attention": Finding("linear attention recalls less than attention at fixed width (longest judged T)",
                                      "Zoology Fig. 2 / Based Fig. 3", "down", 0.1),
    "performer below attention": Finding("Performer recalls less than attention at fixed width (longest judged T)",
                                         "Based Fig. 3 (Performer feature map)", "down", 0.1),
    "linear falls": Finding("linear attention's recall falls from the shortest to the longest T at fixed width",
                            "Zoology Fig. 2 / Based Fig. 3", "down", 0.1),
    "performer falls": Finding("Performer's recall falls from the shortest to the longest T at fixed width",
                               "Based Fig. 3 (Performer feature map)", "down", 0.1),
    "window grows": Finding("sliding-window recall grows with the window (32 vs 8 keys, longest judged T)",
                            "Based Fig. 2", "up", 0.1),
    "performer state grows": Finding("Performer's recall grows with its state (256 vs 16 features, longest T)",
                                     "Based Fig. 3 (Performer feature map)", "up", 0.1),
    "performer state grows (64)": Finding("Performer's recall grows with its state (64 vs 16 features, longest T)",
                                          "Based Fig. 3 (Performer feature map)", "up", 0.1),
}
# The lengths each preset judges, shortest first (default: all). At quick's budget the pilot's dense recall was
# 0.997 at T=64 but 0.17 at T=128 (the circuit forms there only at batch 64: docs/recall.md), so a T=128 comparison
# would measure the budget, not the kernels: quick judges T=64 and only shows T=128; its 'falls' findings wait for
# 'full'.
JUDGED = {"recall_quick": 1}
QUICK_FINDINGS = ("attention solves", "linear below attention", "performer below attention", "window grows")
# Pilot: the quick preset on seeds 0-2 (46 minutes on 2 cores shared with the test suite); the per-seed sds of the
# paired differences are its verdict table's 'sd: run' column under this design (it ran under an earlier one, which
# also judged T=128: --design current reads it under this one):
#   python scripts/sweep.py --experiment experiments/recall.py:quick --workdir runs/pilot/recall --seeds 0,1,2 \
#       --vmap-seeds --parallel 2 && python scripts/make_tables.py --workdir runs/pilot/recall --design current
PILOT_SEEDS = (0, 1, 2)
PILOT = "experiments/recall.py:quick --seeds 0,1,2 (docs/recall.md, pilot)"
QUICK_SD = {"attention solves": 0.006, "linear below attention": 0.049, "performer below attention": 0.008,
            "window grows": 0.042}
# the pilot's mean differences at T=64 (its table: dense 0.997, local-8 0.221, local-32 0.835, linear 0.316,
# performer 0.251)
QUICK_EFFECT = {"attention solves": -0.003, "linear below attention": -0.681, "performer below attention": -0.746,
                "window grows": 0.614}
VERDICT_SEEDS = [100, 101, 102]
LENGTH_FINDINGS = tuple(k for k in FINDINGS if not k.startswith("performer state grows"))  # 'full' / 'gpu'
#                                                                                              have no state rows
STATE_FINDINGS = ("attention solves", "linear below attention", "performer below attention", "performer state grows")
STATE_PILOT_SEEDS = (0, 1, 2)
# The pilot ran at 2,000 steps (docs/recall.md, its table); the budget moved to 3,000 afterwards, where the one-seed
# probes had dense at 1.0, before the verdict run and without reading seeds 100-102. Its sds are pessimistic for
# 3,000 steps (dense's spread at 2,000 came from one seed whose circuit had not formed).
STATE_PILOT = "experiments/recall.py:state --seeds 0,1,2 at 2,000 steps (docs/recall.md, state-size pilot)"
STATE_SD = {"attention solves": 0.163, "linear below attention": 0.137, "performer below attention": 0.177,
            "performer state grows": 0.076}
STATE_EFFECT = {"attention solves": -0.133, "linear below attention": -0.457, "performer below attention": -0.546,
                "performer state grows": 0.105}
STATE_SEEDS = [100, 101, 102]
# Judged: attention alone. The pilot (seeds 0-2) judged the three kernel comparisons too (its sweep.json keeps that
# design), but there linear attention and Performer sat at chance, so a verdict on them would be decided by a
# kernel that did not learn; they are shown, not judged.
SINUSOIDAL_FINDINGS = ("attention solves",)
SINUSOIDAL_PILOT_SEEDS = (0, 1, 2)
SINUSOIDAL_PILOT = "experiments/recall.py:state_sinusoidal --seeds 0,1,2 (docs/recall.md, its pilot)"
# The pilot's (its table in docs/recall.md): dense 1.0 on every seed, but linear attention and Performer at the
# 0.25 of guessing a value from the context -- at a learning rate of 1e-2 they do not learn (linear attention with
# learned positions at 1e-2 stays at 0.25-0.26 too; at 3e-3 it climbs), so comparisons with attention would measure
# the shared learning rate, not the state. 'attention solves' has no pilot sd: dense recalled 1.0 on every pilot
# seed, a spread of 0 that plans nothing (the rule decides it from per-example counts), so it stays exploratory.
SINUSOIDAL_SD = {"linear below attention": 0.006, "performer below attention": 0.002,
                 "performer state grows (64)": 0.005}  # measured, not judged: the pilot's table
SINUSOIDAL_EFFECT = {"attention solves": 0.0, "linear below attention": -0.737, "performer below attention": -0.746,
                     "performer state grows (64)": -0.003}
SINUSOIDAL_SEEDS = [130, 131, 132]  # seeds no recall design has used
TUNED_FINDINGS = ("attention solves", "linear below attention", "performer below attention",
                  "performer state grows (64)")
# Pilot: the four rows' probe runs on seeds 300-302 (the preset's trials run one by one with attn_lab.train, eval
# every 500 steps; docs/recall.md, ':state_tuned'), the seeds the learning rates were chosen on. Paired differences
# of test recall, seed by seed. 'attention solves' has no sd: dense recalled 1.0 on every seed (a spread of 0.0001
# plans nothing; the rule decides it from per-example counts), so it stays exploratory.
TUNED_PILOT_SEEDS = (300, 301, 302)
TUNED_PILOT = "experiments/recall.py:state_tuned's rows on seeds 300-302 (docs/recall.md, ':state_tuned' pilot)"
TUNED_SD = {"linear below attention": 0.023, "performer below attention": 0.123, "performer state grows (64)": 0.167}
TUNED_EFFECT = {"attention solves": 0.0, "linear below attention": -0.480, "performer below attention": -0.537,
                "performer state grows (64)": -0.033}
# Seeds no recall design has used, as many as give both kernel comparisons a 0.8 chance of a verdict (the dry run:
# 'performer below attention' 0.74 at 5 seeds, 0.82 at 7). About 2 hours on 2 idle CPU cores.
TUNED_SEEDS = list(range(140, 147))


def _rows(groups: dict, kernel: str, t: int, width: int) -> list[dict]:
    return groups.get(f"{kernel}/T{t}/d{width}", [])


def _lengths(exp) -> list[tuple[int, int]]:
    """The preset's (T, N), shortest first, read from its rows."""
    return sorted({(ov["task.seq_len"], ov["task.num_kv_pairs"]) for ov in exp.variants.values()})


def _worst(dense: list[list[dict]]) -> list[dict]:
    """Per seed, dense attention's row at its worst length (each carries its own per-example count)."""
    by_seed: dict[int, dict] = {}
    for rows in dense:
        for r in rows:
            seed = int(r["seed"])
            if seed not in by_seed or r["test_accuracy"] < by_seed[seed]["test_accuracy"]:
                by_seed[seed] = r
    seeds = set.intersection(*({int(r["seed"]) for r in rows} for rows in dense)) if all(dense) else set()
    return [by_seed[s] for s in sorted(seeds)]


def _comparisons(groups: dict, width: int, lengths: list[tuple[int, int]]) -> tuple[dict, dict]:
    """Each finding's verdict interval at one width over the judged ``lengths`` (None where a row is missing), and
    per finding the seeds whose compared run diverged."""
    short, long = lengths[0][0], lengths[-1][0]

    def at(kernel: str, t: int) -> list[dict]:
        return _rows(groups, kernel, t, width)
    pairs = {"linear below attention": (at("dense", long), at("linear", long)),
             "performer below attention": (at("dense", long), at("performer", long)),
             "linear falls": (at("linear", short), at("linear", long)),
             "performer falls": (at("performer", short), at("performer", long)),
             "window grows": (at("local-8", long), at("local-32", long)),
             "performer state grows": (at("performer-16", long), at("performer-256", long)),
             "performer state grows (64)": (at("performer-16", long), at("performer", long))}
    found = {k: compare(a, b, "test_accuracy") if a and b else (None, []) for k, (a, b) in pairs.items()}
    worst = _worst([at("dense", t) for t, _ in lengths])  # 'solves': dense's worst length against perfect recall
    found = {"attention solves": compare([], worst, "test_accuracy", fixed=1.0) if worst else (None, []), **found}
    return {k: d for k, (d, _) in found.items()}, {k: s for k, (_, s) in found.items()}


def report(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Recall per kernel and length (one table per width), Zoology's Figure 2 layout as a plot (recall against T,
    one panel per width), and the verdicts at the smallest width."""
    from attn_lab.reporting.plots import errorbar_plot

    groups = grouped(rows, lambda r: r["variant"])
    names = list(dict.fromkeys(v.split("/")[0] for v in exp.variants))
    widths = sorted({int(v.rsplit("/d", 1)[1]) for v in exp.variants})
    lengths, tables = _lengths(exp), []
    for width in widths:
        body, series = [], {}
        for kernel in names:
            cells = [groups.get(f"{kernel}/T{t}/d{width}", []) for t, _ in lengths]
            body.append([kernel, *(mean_std(column(g, "test_accuracy"), 3) for g in cells),
                         *(f"{np.mean(column(g, 'steps_per_sec')):.1f}" if g else "–" for g in cells[-1:])])
            done = [(t, column(g, "test_accuracy")) for (t, _), g in zip(lengths, cells) if g]
            if done:  # a kernel with no finished length has no line
                series[kernel] = ([t for t, _ in done], [v for _, v in done])
        errorbar_plot(os.path.join(out_dir, f"recall_d{width}.png"), series, "sequence length T",
                      "recall (test accuracy at queries)", f"MQAR, d_model {width}")
        tables.append(Table(f"Recall at d_model {width} (mean ± std over seeds)",
                            ["kernel", *(f"T={t}, N={n}" for t, n in lengths), f"steps/s at T={lengths[-1][0]}"],
                            body, f"Published: {ZOOLOGY}. {BASED}."))
    judged_lengths = lengths[:JUDGED.get(exp.name, len(lengths))]
    diffs, diverged = _comparisons(groups, widths[0], judged_lengths)
    judged = verdict_table(getattr(exp, "design", None), diffs, "test recall", sweep_dir, exp, diverged=diverged)
    return tables + ([judged] if judged else []) + unfinished_table(rows)
