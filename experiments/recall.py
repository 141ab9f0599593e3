"""Associative recall (Zoology, Arora et al. 2023, Figure 2; Based, Arora et al. 2024, Figures 2-3): which attention
kernels can look a key up in their context, as the sequence grows at a fixed width.

  python -m attn_lab.sweep --experiment experiments/recall.py:quick --workdir runs/recall --vmap-seeds --parallel 2
  python -m attn_lab.reporting --workdir runs/recall

Each trial trains a 2-layer decoder-only model (configs/mqar.py: attention-only blocks, tied embeddings) on MQAR --
N key-value pairs, then every key queried once at power-law distances (attn_lab/data/tasks/mqar.py) -- and reports
recall: accuracy at the query positions of the test sequences. Arms: kernel x sequence length (T, N) x width,
``dense/T128/d64``. Presets: ``quick`` (T 64 and 128, d_model 64, judged at T=64), ``state`` / ``state_tuned``
(recall against Performer's state at T=64; ``state_tuned``: each kernel at the learning rate it learns at),
``full`` (three lengths, d_model 64 and 128, adaptive span and entmax too), ``gpu`` (Zoology's data: vocabulary
8192, 100k sequences, T up to 512, one head). Budgets, probes, pilots and where ours differs from the papers:
docs/recall.md.
"""

from __future__ import annotations

from attn_lab.experiment import Finding, Metric, Preset
from attn_lab.published.zoology import BASED, ZOOLOGY
from attn_lab.reporting import recall_tables
from attn_lab.reporting.default import verdicts
from attn_lab.reporting.tables import Table, grouped, unfinished_table

# --- arms --------------------------------------------------------------------------------------------------------
LENGTHS = [(64, 4), (128, 8), (256, 16)]  # (T, N): Zoology Figure 2's first three
CHUNK = 64  # causal linear / Performer chunk: the default 256 would make T <= 256 one whole-sequence quadratic form
KERNELS = {  # local-w: a causal window of w keys, the query and the w - 1 before it
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


def features(count: int) -> dict:
    """Performer with ``count`` random features: its state per head is count x d_k."""
    return {**KERNELS["performer"], "model.attention.performer.num_features": count}


# recall against the state: Performer-256 (the slowest row) first, so that it starts first under --parallel
STATE_KERNELS = {"performer-256": features(256), **{k: KERNELS[k] for k in ("dense", "linear", "performer")},
                 "performer-16": features(16)}
LR, FAST_LR = 3e-3, 1e-2  # fast: the rate at which dense attention forms its circuit under sinusoidal positions
TUNED_KERNELS = {k: {**STATE_KERNELS[k], "train.learning_rate": FAST_LR if k == "dense" else LR}
                 for k in ("dense", "linear", "performer", "performer-16")}


def arms(kernels: dict, lengths: list[tuple[int, int]], widths: list[int]) -> dict:
    """One named arm per kernel x length x width: ``dense/T128/d64``."""
    return {recall_tables.row_name(k, t, d): {**ov, "task.seq_len": t, "task.num_kv_pairs": n, "model.d_model": d}
            for k, ov in kernels.items() for t, n in lengths for d in widths}


def budget(steps: int, batch: int = 32, vocab: int = 64) -> dict:
    """The small-vocabulary recipe: 4 heads, one learning rate, ``steps`` of ``batch``, evaluated once at the end."""
    return {"task.vocab_size": vocab, "model.num_heads": 4, "train.learning_rate": LR, "train.batch_size": batch,
            "train.num_steps": steps, "train.eval_every": steps, "train.checkpoint_every": steps,
            "train.log_every": 100}


# --- findings: paired differences in test recall over seeds; margins fixed before any run -------------------------
RECALL = Metric("test_accuracy", "test recall")
SOLVED, GAP = 0.05, 0.1  # the least shortfall from perfect recall that counts; the least fall, gap or gain that counts
FEATURE_MAP = "Based Fig. 3 (Performer feature map)"
BOTH = "Zoology Fig. 2 / Based Fig. 3"
FINDINGS = {
    "attention solves": Finding("attention solves MQAR at every judged length (its worst vs 1.0)",
                                "Zoology Fig. 2: ~1.0", "not_worse", SOLVED),
    "linear below attention": Finding("linear attention recalls less than attention at fixed width (longest judged T)",
                                      BOTH, "down", GAP),
    "performer below attention": Finding("Performer recalls less than attention at fixed width (longest judged T)",
                                         FEATURE_MAP, "down", GAP),
    "linear falls": Finding("linear attention's recall falls from the shortest to the longest T at fixed width", BOTH,
                            "down", GAP),
    "performer falls": Finding("Performer's recall falls from the shortest to the longest T at fixed width",
                               FEATURE_MAP, "down", GAP),
    "window grows": Finding("sliding-window recall grows with the window (32 vs 8 keys, longest judged T)",
                            "Based Fig. 2", "up", GAP),
    "performer state grows": Finding("Performer's recall grows with its state (256 vs 16 features, longest T)",
                                     FEATURE_MAP, "up", GAP),
    "performer state grows (64)": Finding("Performer's recall grows with its state (64 vs 16 features, longest T)",
                                          FEATURE_MAP, "up", GAP),
}
# what each finding compares: (kernel, judged length) it is measured against, then the one measured (-1: longest)
PAIRS = {"linear below attention": (("dense", -1), ("linear", -1)),
         "performer below attention": (("dense", -1), ("performer", -1)),
         "linear falls": (("linear", 0), ("linear", -1)), "performer falls": (("performer", 0), ("performer", -1)),
         "window grows": (("local-8", -1), ("local-32", -1)),
         "performer state grows": (("performer-16", -1), ("performer-256", -1)),
         "performer state grows (64)": (("performer-16", -1), ("performer", -1))}


def judging(*keys: str) -> dict[str, Finding]:
    """The named findings, in FINDINGS' order."""
    return {k: f for k, f in FINDINGS.items() if k in keys}


BELOW = ("attention solves", "linear below attention", "performer below attention")
LENGTH_FINDINGS = judging(*BELOW, "linear falls", "performer falls", "window grows")  # no state rows
STATE = Preset("recall_state", "configs/mqar.py:quick", arms(STATE_KERNELS, LENGTHS[:1], [64]), [100, 101, 102],
               judging(*BELOW, "performer state grows"), metric=RECALL, pilot_seeds=(0, 1, 2),
               overrides=budget(3000, 64, 256))
PRESETS = {
    # quick judges T=64 only (options): at its budget dense attention does not learn T=128 (docs/recall.md)
    "quick": Preset("recall_quick", "configs/mqar.py:quick", arms(KERNELS, LENGTHS[:2], [64]), [100, 101, 102],
                    judging(*BELOW, "window grows"), metric=RECALL, pilot_seeds=(0, 1, 2), overrides=budget(1000),
                    options={"judged_lengths": 1}),
    "state": STATE,
    "state_tuned": STATE.replace(name="recall_state_tuned", arms=arms(TUNED_KERNELS, LENGTHS[:1], [64]),
                                 seeds=range(140, 147), findings=judging(*BELOW, "performer state grows (64)"),
                                 pilot_seeds=(300, 301, 302),
                                 overrides=STATE.overrides | {"model.positions": "sinusoidal"}),
    "full": Preset("recall_full", "configs/mqar.py:quick", arms({**KERNELS, **LEARNED}, LENGTHS, [64, 128]),
                   [100, 101, 102], LENGTH_FINDINGS, metric=RECALL, pilot_seeds=(0, 1, 2), overrides=budget(1500, 64)),
    "gpu": Preset("recall_gpu", "configs/mqar.py", arms(KERNELS, [*LENGTHS, (512, 64)], [64, 128, 256]),
                  [100, 101, 102], LENGTH_FINDINGS, metric=RECALL, pilot_seeds=(0, 1, 2),
                  overrides={"task.num_train": 100_000, "task.num_test": 3000, "train.num_steps": 20_000,
                             "train.eval_every": 5000, "train.checkpoint_every": 5000, "train.batch_size": 256,
                             "model.num_heads": 1}),
}


# --- report ------------------------------------------------------------------------------------------------------


def differences(rows, sweep_dir, exp) -> tuple[dict, dict]:
    """The findings compare rows at chosen lengths (PAIRS) at the smallest width, over the lengths the preset judges
    (``options['judged_lengths']``: the shortest that many; default all); 'attention solves' compares dense at its
    worst judged length with perfect recall."""
    sizes = recall_tables.lengths(exp)
    count = (getattr(exp, "preset", None) and exp.preset.options.get("judged_lengths")) or len(sizes)
    groups = grouped(rows, lambda r: r["variant"])
    return recall_tables.comparisons(groups, recall_tables.widths(exp)[0], sizes[:count], PAIRS, "attention solves")


def report(rows, sweep_dir, exp, out_dir, bench=None) -> list[Table]:
    """Recall per kernel and length (one table per width), Zoology's Figure 2 layout as a plot (recall against T,
    one per width), and the verdicts at the smallest width."""
    groups = grouped(rows, lambda r: r["variant"])
    tables = recall_tables.recall_tables(groups, exp, out_dir, f"Published: {ZOOLOGY}. {BASED}.")
    judged = verdicts(rows, sweep_dir, exp, RECALL.label)
    return tables + ([judged] if judged else []) + unfinished_table(rows)
