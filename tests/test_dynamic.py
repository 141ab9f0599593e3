"""Kernels that learn their shape, through the paths every kernel uses: the span penalty in the loss, per-head
spans / alphas logged and written, the zero-weight diagnostic, and experiments/dynamic.py's table.

Losses are compared at 'highest' matmul precision (tests/conftest.py) with rtol 1e-5.
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from attn_lab.models import attention_layers, build_model
from attn_lab.objectives import configured
from attn_lab.train import diagnostics, learned
from attn_lab.train.config import base_config, validate_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(attention: str, **options):
    c = base_config()
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.num_heads, c.model.dropout = 2, 32, 64, 4, 0.0
    c.model.attention.name = attention
    for key, value in options.items():
        c.model.attention[attention][key] = value
    c.model.kinds.cross.attention = "dense"
    return c


def test_span_penalty_is_weight_times_sum_over_layers_of_mean_span_and_shrinks_spans(tiny_step):
    """total = task loss + w * sum_layers mean_heads z (Sukhbaatar et al.), z written out from the parameters."""
    c = _config("adaptive_span", max_span=16, ramp=2.0, init_span=0.5)
    c.loss.span.weight = 0.05
    step, state, batch, _ = tiny_step(c, max_len=17, length=16, objectives=configured(c))
    fractions = [v for path, v in jax.tree_util.tree_leaves_with_path(state["params"])
                 if "span_fraction" in jax.tree_util.keystr(path)]
    assert len(fractions) == 4  # encoder self x2, decoder self x2 (cross stays dense)
    expected = sum(float(16 * np.clip(np.asarray(f)[0], 0, 1).mean()) for f in fractions)
    new, metrics = step(state, batch)
    np.testing.assert_allclose(metrics["span/penalty"][0], expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["total_loss"][0], metrics["loss"][0] + 0.05 * expected, rtol=1e-5)
    for _ in range(10):
        new, metrics = step(new, batch)
    assert float(metrics["span/penalty"][0]) < expected  # the penalty's gradient reaches the spans


def test_no_penalty_term_without_weight(tiny_step):
    c = _config("adaptive_span", max_span=16, ramp=2.0)
    step, state, batch, _ = tiny_step(c, max_len=17, length=16, objectives=configured(c))
    _, metrics = step(state, batch)
    assert "span/penalty" not in metrics and "total_loss" not in metrics


def _fractions(state):
    """Every layer's span fractions v of the first seed, by parameter path."""
    return {jax.tree_util.keystr(path): np.asarray(v)[0] for path, v in jax.tree_util.tree_leaves_with_path(
        state["params"]) if "span_fraction" in jax.tree_util.keystr(path)}


def test_clamp_is_the_unclamped_update_clipped_to_the_unit_interval(tiny_step):
    """With ``clamp`` a train step ends with v = clip(v + update, 0, 1) (the paper code's ``clamp_param`` after
    ``optimizer.step()``), written out here from the same step without it; every other parameter is the same. A
    strong span penalty from v = 0 drives the unclamped v below 0, so the clamp has something to do."""
    new = {}
    for clamp in (False, True):
        c = _config("adaptive_span", max_span=16, ramp=2.0, init_span=0.0, clamp=clamp)
        c.loss.span.weight = 0.5
        step, state, batch, _ = tiny_step(c, max_len=17, length=16, objectives=configured(c))
        new[clamp], _ = step(state, batch)
    off, on = (dict(jax.tree_util.tree_leaves_with_path(new[k]["params"])) for k in (False, True))
    spans = [path for path in off if "span_fraction" in jax.tree_util.keystr(path)]
    assert len(spans) == 4 and all(np.asarray(off[p]).min() < 0.0 for p in spans)
    for path in off:
        expected = np.clip(off[path], 0.0, 1.0) if path in spans else off[path]
        np.testing.assert_allclose(on[path], expected, rtol=1e-6, atol=0, err_msg=jax.tree_util.keystr(path))
    assert all(np.asarray(on[p]).min() == 0.0 for p in spans)


def test_clamped_spans_stay_in_the_unit_interval_over_many_steps(tiny_step):
    """Ten steps under a penalty that pushes every v down (no warmup, learning rate 1e-2): unclamped fractions drift
    below 0 (the frozen spans of docs/dynamic.md), clamped ones stay in [0, 1] at every step."""
    final = {}
    for clamp in (False, True):
        c = _config("adaptive_span", max_span=16, ramp=2.0, init_span=0.0, clamp=clamp)
        c.loss.span.weight, c.train.warmup_steps, c.train.learning_rate = 0.5, 0, 1e-2
        step, state, batch, _ = tiny_step(c, max_len=17, length=16, objectives=configured(c))
        final[clamp] = []
        for _ in range(10):
            state, _ = step(state, batch)
            final[clamp] += list(_fractions(state).values())
    assert min(v.min() for v in final[False]) < -0.05
    assert all(0.0 <= v.min() and v.max() <= 1.0 for v in final[True])


def test_project_sets_fractions_outside_the_unit_interval_to_its_bounds_and_is_free_without_clamp():
    from flax import nnx

    from attn_lab.attention import build_kernel
    from attn_lab.train.steps import project
    kernel = build_kernel({"name": "adaptive_span", "max_span": 8, "clamp": True}, num_heads=4, num_kv_heads=4,
                          head_dim=8)
    kernel.span_fraction[...] = np.array([-0.3, 0.4, 1.7, 1.0], np.float32)
    assert kernel.projects
    kernel.project()
    np.testing.assert_array_equal(kernel.span_fraction[...], np.array([0.0, 0.4, 1.0, 1.0], np.float32))
    for attention, options in (("dense", {}), ("adaptive_span", {"max_span": 8})):  # nothing projects: same leaves
        model = build_model(_config(attention, **options).model, kind="translation", vocab_size=20, max_len=9,
                            seed=0)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        params = nnx.to_pure_dict(params)
        assert project(graphdef, {"params": params, "model_state": nnx.to_pure_dict(rest)}, params) is params


def test_a_run_recorded_before_the_clamp_compares_as_clamp_off_and_a_clamped_one_differs():
    from attn_lab.train import identity
    c = _config("adaptive_span", max_span=16)
    recorded = c.to_dict()
    del recorded["model"]["attention"]["adaptive_span"]["clamp"]  # a run recorded before the option existed
    assert identity.differences(recorded, c.to_dict()) == []
    c.model.attention.adaptive_span.clamp = True
    assert identity.differences(recorded, c.to_dict()) == [
        ("model.attention.adaptive_span.clamp", identity.ABSENT, True)]


def test_per_head_values_of_learning_kernels_only():
    c = _config("entmax", learn_alpha=True, alpha=1.3)
    model = build_model(c.model, kind="translation", vocab_size=20, max_len=17, seed=0)
    values = learned.per_head(model)
    assert sorted(values) == ["decoder_self/0", "decoder_self/1", "encoder_self/0", "encoder_self/1"]
    for layer in values.values():
        np.testing.assert_allclose(layer["alpha"], [1.3] * 4, rtol=1e-5)  # initialized at the option
    flat = learned.scalars(values)
    assert flat["learned/encoder_self/0/alpha/h3"] == pytest.approx(1.3, rel=1e-5)
    assert learned.per_head(build_model(_config("dense").model, kind="translation", vocab_size=20, max_len=17,
                                        seed=0)) == {}
    assert len(attention_layers(model)) == 6


@pytest.mark.parametrize("weight,attention,match", [
    (1e-3, "dense", "loss.span.weight=0.001 needs an attention kernel with a span penalty"),
    (-1.0, "adaptive_span", "loss.span.weight must be >= 0, got -1.0")])
def test_span_weight_errors_are_one_line(weight, attention, match):
    c = _config(attention)
    c.loss.span.weight = weight
    with pytest.raises(ValueError, match=match) as err:
        validate_config(c)
    assert "\n" not in str(err.value)


def test_zero_share_counts_exact_zeros_among_valid_keys_of_valid_rows():
    maps = np.array([[[[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.1, 0.9, 0, 0]]]])
    valid = np.array([[True, True, True, False]])  # key 3 is padding; query 3 too
    # rows 0..2 over keys 0..2: zeros 1/3, 2/3, 0/3 -> mean 1/3
    np.testing.assert_allclose(diagnostics.zero_share(maps, valid), [1 / 3])


def _fake_sweep(tmp_path, spans=(3.0, 40.0)):
    """A finished dynamic sweep on disk: results.json (with learned values) and analysis/diagnose.json per trial."""
    rows = []
    spec = {"softmax": ({}, 0.90), "entmax15": ({"alpha": [1.5] * 2}, 0.91),
            "entmax_learned": ({"alpha": [1.1, 1.9]}, 0.92), "adaptive_span": ({"span": list(spans)}, 0.85)}
    for variant, (values, score) in spec.items():
        for seed in range(3):
            trial = f"variant={variant},seed={seed}"
            os.makedirs(tmp_path / trial / "analysis")
            learned_values = {f"{kind}/{layer}": values for kind in ("encoder_self", "decoder_self")
                              for layer in range(2)} if values else {}
            (tmp_path / trial / "results.json").write_text(json.dumps({"learned": learned_values}))
            zeros = {f"{k}/0": {"zeros": [0.5, 0.5] if "entmax" in variant else [0.0, 0.0]}
                     for k in ("encoder_self", "decoder_self", "cross")}
            (tmp_path / trial / "analysis" / "diagnose.json").write_text(json.dumps(zeros))
            rows.append({"variant": variant, "seed": seed, "trial": trial, "status": "ok", "test_loss": 1.0,
                         "test_exact_match": score + 0.001 * seed + 0.002 * (seed == 1) * (variant != "softmax"),
                         "test_bleu": 90.0, "steps_per_sec": 10.0})
    return rows


def _dynamic():
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    try:
        import dynamic
    finally:
        sys.path.pop(0)
    return dynamic


def _exp(preset: str = "numbers"):
    """The preset as the sweep loads it, on the rows' seeds 0-2, under a design whose pilot (seeds 10-14) saw no loss
    at sd 0.001 (confirmatory at 3 seeds)."""
    from attn_lab.reporting.verdicts import Design
    from attn_lab.sweep.spec import load_experiment

    exp = load_experiment(os.path.join(ROOT, "experiments", f"dynamic.py:{preset}"))
    findings = exp.preset.findings
    design = Design(findings, dict.fromkeys(findings, 0.001), "pilot", (10, 11, 12, 13, 14),
                    effect=dict.fromkeys(findings, 0.0))
    return dataclasses.replace(exp, seeds=[0, 1, 2], design=design)


def test_dynamic_report_reads_learned_values_and_zero_weights(tmp_path):
    dynamic = _dynamic()
    tables = dynamic.report(_fake_sweep(tmp_path), str(tmp_path), _exp(), str(tmp_path))
    quality = {r[0]: r for r in tables[0].rows}
    assert quality["adaptive_span"][4] == "enc 21.5 / dec 21.5"  # mean of 3 and 40
    assert quality["entmax_learned"][5] == "enc 1.50 / dec 1.50"
    assert quality["entmax15"][6] == "enc 50 / dec 50 / x 50" and quality["softmax"][6] == "enc 0 / dec 0 / x 0"
    assert quality["entmax15"][7] == "29.83"
    alpha = {r[0]: r for r in tables[1].rows}
    assert alpha["encoder_self"][3:] == ["50%", "0%", "50%"]  # 1.1 softmax-like, 1.9 sparsemax-like
    assert len(tables[2].rows) == 3 * 4  # seeds x layers with spans
    assert "24 of 24 heads (every seed) moved 1+ tokens from their initial span 0: spans learned" in tables[2].note
    assert "max_span 64 (ramp 8.0 added on top)" in tables[2].note
    verdicts = {r[0].split(" (")[0]: r[3:] for r in tables[3].rows}  # exact match vs softmax, paired by seed
    assert verdicts["1.5-entmax matches softmax"][0].startswith("+0.011 [")
    assert verdicts["1.5-entmax matches softmax"][-1] == "reproduced (no collapse in 3 seeds: rate < 63%)"
    assert verdicts["adaptive span keeps quality at a fraction of the span"][-1] == "not reproduced"  # -0.05
    assert "exact match" in tables[3].note


@pytest.mark.parametrize("spans, moved", [((0.0, 0.4), 0), ((0.0, 30.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), 12)])
def test_spans_that_did_not_move_are_reported_as_a_fixed_window(tmp_path, spans, moved):
    """Spans that stayed at their initial value (0 here) are a fixed ramp-wide window: the span row's verdict is
    labelled as that, not as adaptive span -- also when a few heads moved far (1 in 8 per layer, 30 tokens: the
    old one-token-spread check passed it)."""
    dynamic = _dynamic()
    tables = dynamic.report(_fake_sweep(tmp_path, spans=spans), str(tmp_path), _exp(), str(tmp_path))
    total = 3 * 4 * len(spans)
    assert f"{moved} of {total} heads (every seed) moved" in tables[2].note and "did not learn" in tables[2].note
    verdicts = {r[0].split(" (")[0]: r for r in tables[3].rows}
    assert verdicts["adaptive span keeps quality at a fraction of the span"][-1] == (
        f"not reproduced -- of a fixed 8-token window, not of learned spans ({moved} of {total} heads moved from "
        "their initial span)")
    assert verdicts["1.5-entmax matches softmax"][-1].startswith("reproduced")


def test_dynamic_lm_preset_judges_minus_the_test_loss_and_spans_every_kind(tmp_path):
    """'lm_quick' (= 'quick'): a decoder-only LM has no cross-attention, so adaptive span sets no per-kind override;
    rows carry a test loss and no exact match, and the findings are judged in minus the loss (nats): a lower loss is
    better."""
    dynamic = _dynamic()
    preset = dynamic.PRESETS["lm_quick"]
    assert dynamic.PRESETS["quick"] is preset and preset.name == "dynamic_lm_quick"
    assert preset.config == "configs/bible_lm.py:quick" and preset.metric.sign == -1.0
    assert not any(k.startswith("model.kinds.") for k in preset.arms["adaptive_span"])
    rows = [{k: v for k, v in r.items() if k not in ("test_exact_match", "test_bleu")} | {
        "test_loss": 5.0 - r["test_exact_match"]} for r in _fake_sweep(tmp_path)]
    judged = dynamic.report(rows, str(tmp_path), _exp("lm_quick"), str(tmp_path))[3]
    verdicts = {r[0].split(" (")[0]: r[3:] for r in judged.rows}
    assert verdicts["1.5-entmax matches softmax"][0].startswith("+0.011 [")  # 0.011 nats lower loss than softmax
    assert verdicts["adaptive span keeps quality at a fraction of the span"][-1] == "not reproduced"  # 0.05 nats
    assert "minus the test loss" in judged.note


def test_dynamic_presets_resolve_judge_in_their_metric_and_bad_or_retired_presets_are_one_line():
    """Each preset decides in its task's metric (the LM in nats, numbers in exact match, ListOps in accuracy); an
    unknown preset is one line listing the others, and a folder of a retired preset's sweep names the last commit
    that builds it."""
    from attn_lab.sweep.spec import RETIRED_AT, load_experiment, recorded_preset

    path = os.path.join(ROOT, "experiments", "dynamic.py")
    exp = load_experiment(f"{path}:full")
    assert exp.report_fn is not None and len(exp.trials()) == 12 and "model.kinds.cross.attention" in \
        exp.variants["adaptive_span"]
    metrics = {name: (p.metric.key, p.baseline) for name, p in _dynamic().PRESETS.items()}
    assert metrics == {"quick": ("test_loss", "softmax"), "lm_quick": ("test_loss", "softmax"),
                       "lm_span": ("test_loss", "softmax"), "numbers": ("test_exact_match", "softmax"),
                       "full": ("test_exact_match", "softmax"), "gpu": ("test_accuracy", "softmax")}
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sweep.py"), "--experiment",
                          f"{path}:tiny", "--workdir", "unused", "--dry-run"], capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        "error: unknown preset 'tiny' for experiments/dynamic.py; use quick, lm_quick, lm_span, numbers, full or gpu"]
    for preset, name in (("listops_full", "dynamic_listops_full"), ("listops_quick", "dynamic_listops_quick"),
                         ("lm_full", "dynamic_lm_full")):
        with pytest.raises(ValueError, match=f"'{name}' .* retired after commit {RETIRED_AT}: tabulate"):
            recorded_preset(path, preset, name)
    assert recorded_preset(path, "quick", "dynamic_quick") == "numbers"  # a folder recorded before the rename


def test_the_span_preset_trains_the_papers_clamped_spans_from_inside_the_interval_against_softmax():
    """':lm_span': two rows on lm_quick's LM -- softmax and adaptive span with the clamp, started at half the span
    (the span table's 'moved' rule then measures from 32 tokens) -- on seeds its pilot (0-4) did not use."""
    from attn_lab.reporting.dynamic_tables import span_options
    from attn_lab.sweep.spec import load_experiment

    dynamic = _dynamic()
    exp = load_experiment(os.path.join(ROOT, "experiments", "dynamic.py:lm_span"))
    assert exp.preset.config == "configs/bible_lm.py:quick" and exp.name.startswith("dynamic_lm")
    span = exp.variants["adaptive_span"]
    assert span["model.attention.adaptive_span.clamp"] is True and sorted(exp.variants) == ["adaptive_span", "softmax"]
    assert span_options(span, dynamic.SPAN)["init_tokens"] == 32.0
    assert list(exp.design.findings) == ["adaptive_span"] and exp.design.sd["adaptive_span"] is not None
    assert not set(exp.seeds) & set(exp.design.pilot_seeds)
