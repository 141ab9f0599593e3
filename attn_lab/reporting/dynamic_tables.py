"""The tables of experiments/dynamic.py that no other experiment has: per arm the quality, speed against softmax and
the mean learned span / alpha / share of exactly-zero weights per attention kind; the learned-alpha histogram; the
learned spans per layer; and the span check, which says in the verdict table when the adaptive-span row compared a
fixed window (spans that did not move) rather than learned spans.

The spans and alphas come from each trial's results.json (``learned``), the zero-weight shares from its
``analysis/diagnose.json`` (``python -m attn_lab.analysis --what diagnose``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from attn_lab import results
from attn_lab.published.adaptive import CORREIA_ALPHA, CORREIA_BLEU, CORREIA_COLUMN, SUKHBAATAR, SUKHBAATAR_SPAN
from attn_lab.reporting.tables import Table, column, mean_std, read_json, statuses, variant_of

MOVED_TOKENS = 1.0  # a head's span moved when it ends at least this far from where it started (init_span)
MOVED_SHARE = 0.5  # spans learned when at least this share of all heads (every seed) moved
SPAN_KEY = "model.attention.adaptive_span."
Runs = list[tuple[str, dict[str, np.ndarray]]]  # (seed, {layer: per-head spans}) per adaptive-span trial


def _read(path: str) -> dict:
    return read_json(path) or {}  # a trial without analysis (or results) contributes nothing


def per_kind(sweep_dir: str, group: Sequence[Mapping], stat: str) -> dict[str, list[float]]:
    """Every head's ``stat`` over the group's seeds, per attention kind: 'span' / 'alpha' from results.json,
    'zeros' (share of exactly-zero weights) from analysis/diagnose.json."""
    out: dict[str, list[float]] = {}
    for row in group:
        trial = os.path.join(sweep_dir, row["trial"])
        layers = (results.learned_in(trial) if stat != "zeros"
                  else _read(os.path.join(trial, "analysis", "diagnose.json")))
        for name, values in layers.items():
            if stat in values:
                out.setdefault(name.split("/")[0], []).extend(values[stat])
    return out


def kinds_text(values: Mapping[str, list[float]], fmt: str) -> str:
    """``'enc 1.50 / dec 1.40 / x 1.10'``: the mean per kind, encoder, decoder and cross first."""
    short = {"encoder_self": "enc", "decoder_self": "dec", "cross": "x"}  # in this order, then any other kind
    kinds = sorted(values, key=lambda k: (list(short).index(k) if k in short else len(short), k))
    return " / ".join(f"{short.get(k, k)} {format(np.mean(values[k]), fmt)}" for k in kinds) or "–"


def _quality_row(arm: str, group: list[dict], sweep_dir: str, base_speed: float | None) -> list:
    metric = "test_exact_match" if any("test_exact_match" in r for r in group) else "test_accuracy"
    steps = np.mean(column(group, "steps_per_sec")) if group else float("nan")
    zeros = {k: [100 * x for x in v] for k, v in per_kind(sweep_dir, group, "zeros").items()}
    paper = CORREIA_COLUMN.get(arm)
    return [arm, mean_std([100 * v for v in column(group, metric)], 1),
            mean_std(column(group, "test_bleu"), 1) if metric != "test_accuracy" else "–",
            f"{steps / base_speed:.2f}x" if base_speed and group else "–",
            kinds_text(per_kind(sweep_dir, group, "span"), ".1f"),
            kinds_text(per_kind(sweep_dir, group, "alpha"), ".2f"), kinds_text(zeros, ".0f"),
            "–" if paper is None else f"{CORREIA_BLEU['IWSLT17 de-en'][paper]}"]


def quality_table(rows: Sequence[Mapping], groups: Mapping[str, list[dict]], sweep_dir: str) -> Table:
    """Per arm: exact match (or accuracy), BLEU, train steps/s relative to softmax, mean span / alpha / zero-weight
    share per kind, and Correia et al.'s IWSLT BLEU for the same attention."""
    soft = groups.get("softmax", [])
    base = float(np.mean(column(soft, "steps_per_sec"))) if soft else None  # softmax's steps/s
    body = [_quality_row(v, groups.get(v, []), sweep_dir, base) + ([state] if state != "ok" else [])
            for v, state in statuses(list(rows), variant_of).items()]
    header = ["attention", "exact match / accuracy %", "BLEU", "train steps/s vs softmax", "mean span (tokens)",
              "mean alpha", "zero weights %", "Correia IWSLT de-en BLEU"]
    header += ["status"] if any(len(r) > len(header) for r in body) else []
    body = [r + [""] * (len(header) - len(r)) for r in body]
    return Table("Dynamic attention", header, body, "Published BLEU: Correia et al. Table 1 (softmax / 1.5-entmax / "
                 "alpha-entmax), copied from memory; see attn_lab/published/adaptive.py.")


def alpha_table(groups: Mapping[str, list[dict]], sweep_dir: str) -> Table:
    """The learned alphas of ``entmax_learned`` per kind: mean and the share softmax-like, between, sparsemax-like."""
    body = []
    for kind, alphas in sorted(per_kind(sweep_dir, groups.get("entmax_learned", []), "alpha").items()):
        a = np.asarray(alphas)
        body.append([kind, len(a), f"{a.mean():.2f}", f"{np.mean(a < 1.25):.0%}",
                     f"{np.mean((a >= 1.25) & (a <= 1.75)):.0%}", f"{np.mean(a > 1.75):.0%}"])
    return Table("Learned alpha per attention kind (entmax_learned, all seeds)",
                 ["kind", "heads", "mean alpha", "< 1.25 (softmax-like)", "1.25-1.75", "> 1.75 (sparsemax-like)"],
                 body, f"Correia et al.: {CORREIA_ALPHA}. Histogram: analysis/learned_alpha_hist.png per trial.")


def run_spans(groups: Mapping[str, list[dict]], sweep_dir: str) -> Runs:
    """(seed, {layer: per-head spans}) of every finished adaptive-span trial."""
    out = []
    for row in groups.get("adaptive_span", []):
        learned = results.learned_in(os.path.join(sweep_dir, row["trial"]))
        out.append((row["trial"].rsplit("seed=", 1)[-1], {k: np.asarray(v["span"]) for k, v in learned.items()}))
    return out


def spans_moved(runs: Runs, init: float) -> tuple[int, int]:
    """(heads whose span ended at least MOVED_TOKENS from ``init``, all heads) over every run."""
    spans = [np.concatenate(list(layers.values())) for _, layers in runs if layers]
    if not spans:
        return 0, 0
    every = np.concatenate(spans)
    return int(np.sum(np.abs(every - init) >= MOVED_TOKENS)), int(every.size)


def spans_learned(runs: Runs, init: float = 0.0) -> bool | None:
    """Whether the spans learned: at least MOVED_SHARE of all heads moved MOVED_TOKENS or more from their initial
    span (a run with 73 of 80 heads still at 0 is a fixed ramp-wide window, however far the other 7 went). None
    without runs."""
    moved, total = spans_moved(runs, init)
    return None if not total else moved >= MOVED_SHARE * total


def span_options(arm: Mapping[str, object], defaults: Mapping[str, object]) -> dict[str, float]:
    """The adaptive-span arm's ``max_span``, ``ramp`` and ``init_span`` (``defaults`` where the arm sets none), and
    ``init_tokens``: where the spans started, in tokens (``init_span`` is a fraction of ``max_span``)."""
    merged = {**defaults, **arm}
    out = {k: float(merged[SPAN_KEY + k]) for k in ("max_span", "ramp", "init_span")}
    return out | {"init_tokens": out["init_span"] * out["max_span"]}


def span_table(runs: Runs, span: Mapping[str, float]) -> Table:
    """Every adaptive-span trial's spans per layer, and whether they learned (the MOVED_SHARE rule)."""
    body = [[seed, layer, f"{spans.mean():.1f}", f"{spans.max():.1f}", " ".join(f"{x:.1f}" for x in spans)]
            for seed, layers in runs for layer, spans in sorted(layers.items())]
    bpc = ", ".join(f"{k} {v}" for k, v in SUKHBAATAR.items())
    init = span["init_tokens"]
    (moved, total), verdict = spans_moved(runs, init), ""
    if total:
        verdict = (f" {moved} of {total} heads (every seed) moved {MOVED_TOKENS:g}+ tokens from their initial span "
                   f"{init:g}: spans {'learned' if moved >= MOVED_SHARE * total else 'did not learn'} (the rule: at "
                   f"least {MOVED_SHARE:.0%} of heads).")
    return Table("Learned spans per layer (adaptive_span)", ["seed", "layer", "mean span", "longest", "per head"],
                 body, f"Sukhbaatar et al.: {SUKHBAATAR_SPAN}; test bpc {bpc}. Spans are in tokens of max_span "
                 f"{span['max_span']:g} (ramp {span['ramp']} added on top). Plot: analysis/learned_span.png per "
                 f"trial.{verdict}")


def span_check(judged: Table | None, claim: str | None, moved: tuple[int, int], ramp: float) -> Table | None:
    """The adaptive-span finding (``claim``) is about *learned* spans: where fewer than MOVED_SHARE of the heads
    moved from their initial span, its row says what was compared -- a fixed ramp-wide window -- beside the verdict
    on that."""
    heads, total = moved
    if judged is None or claim is None or not total or heads >= MOVED_SHARE * total:
        return judged
    label = (f" -- of a fixed {ramp:g}-token window, not of learned spans ({heads} of {total} heads moved from "
             "their initial span)")
    rows = [[*r[:-1], r[-1] + label] if r[0] == claim else r for r in judged.rows]
    return Table(judged.title, judged.header, rows, judged.note)
