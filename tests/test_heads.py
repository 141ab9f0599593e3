"""Head analysis: importance against finite differences, zero-importance heads, diagnostics on hand-built maps,
and the analysis command (``python -m attn_lab.analysis``, ``scripts/analyze_heads.py``) on a finished run.

Float32 comparisons run under 'highest' matmul precision (tests/conftest.py), so their tight tolerances hold on a
GPU too, where float32 matmuls default to TF32.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from attn_lab.analysis import importance
from attn_lab.models import build_model, mask_shapes
from attn_lab.train import diagnostics
from attn_lab.train.config import base_config
from attn_lab.train.steps import init_state, make_optimizer, model_state
from attn_lab.train.trainer import train_and_evaluate


def _tiny_state(zero_head=None):
    c = base_config()
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.num_heads, c.model.dropout = 1, 16, 32, 2, 0.0
    model = build_model(c.model, kind="translation", vocab_size=12, max_len=9, seed=0)
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    if zero_head is not None:  # the head's slice of the output projection: it contributes nothing
        out = params["encoder"]["blocks"][0]["self_attn"]["out"]
        out["kernel"] = out["kernel"].at[zero_head].set(0.0)
    state = init_state(params, model_state(model), make_optimizer(c.train), 0)
    inputs = np.array(jax.random.randint(jax.random.key(1), (3, 6), 4, 12))
    inputs[2, 4:] = 0  # padding
    targets = np.array(jax.random.randint(jax.random.key(2), (3, 5), 4, 12))
    targets[1, 3:] = 0
    return model, graphdef, state, {"inputs": inputs, "targets": targets}


def test_importance_equals_finite_differences():
    model, graphdef, state, batch = _tiny_state()
    shapes = mask_shapes(model)
    assert shapes == {"encoder_self": (1, 2), "decoder_self": (1, 2), "cross": (1, 2)}
    scores, sums = importance.compile_analysis(graphdef)
    got = importance.head_importance(state, [batch], shapes, sums)
    eps = 1e-2
    for kind in shapes:
        for head in range(2):
            diffs = []
            for sign in (1, -1):
                masks = importance.ones(shapes, 3)
                masks[kind] = masks[kind].at[:, 0, head].set(1 + sign * eps)
                diffs.append(np.asarray(scores(state, batch, masks)[0]))
            fd = np.abs((diffs[0] - diffs[1]) / (2 * eps)).mean()
            np.testing.assert_allclose(got[kind][0, head], fd, rtol=2e-2, atol=1e-6, err_msg=f"{kind} {head}")
    assert all(v.max() > 0 for v in got.values())


def test_masking_a_zero_importance_head_changes_nothing():
    model, graphdef, state, batch = _tiny_state(zero_head=1)
    shapes = mask_shapes(model)
    scores, sums = importance.compile_analysis(graphdef)
    imp = importance.head_importance(state, [batch], shapes, sums)
    assert imp["encoder_self"][0, 1] == 0.0 and imp["encoder_self"][0, 0] > 0
    full = importance.ones(shapes, 3)
    masked = {**full, "encoder_self": full["encoder_self"].at[:, 0, 1].set(0.0)}
    np.testing.assert_array_equal(scores(state, batch, full)[0], scores(state, batch, masked)[0])
    other = {**full, "encoder_self": full["encoder_self"].at[:, 0, 0].set(0.0)}
    assert not np.allclose(scores(state, batch, full)[0], scores(state, batch, other)[0])


def test_log_likelihood_scorer_is_the_mean_token_log_probability_of_each_example():
    """--metric=log_likelihood against log-softmax written out: per example, the mean over its target tokens of
    log p(label), padding excluded; masking a head changes it (float32 at 'highest' precision)."""
    from attn_lab.models import Ctx
    from attn_lab.train.steps import merge

    model, graphdef, state, batch = _tiny_state()
    shapes = mask_shapes(model)
    scores, _ = importance.compile_analysis(graphdef)
    full = {k: np.ones(s) for k, s in shapes.items()}
    per, value = importance.accuracy_scorer([batch], scores, likelihood=True)(state, full)
    logits, labels, weights = merge(graphdef, state).forward_batch(batch, Ctx(), None)
    logp = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64), axis=-1))
    picked = np.take_along_axis(logp, np.asarray(labels)[..., None], -1)[..., 0]  # (B, T)
    w = np.asarray(weights, np.float64)
    np.testing.assert_allclose(per, (picked * w).sum(1) / w.sum(1), rtol=1e-5)
    assert value == pytest.approx(per.mean()) and (per < 0).all()
    masked = {**full, "cross": np.array([[0.0, 1.0]])}
    assert importance.accuracy_scorer([batch], scores, likelihood=True)(state, masked)[1] != pytest.approx(value)


def test_head_gradient_norms_are_the_query_and_output_slices_of_the_gradient():
    model, graphdef, state, batch = _tiny_state()
    shapes = mask_shapes(model)
    grads_fn = importance.compile_gradients(graphdef)
    norms = importance.head_gradient_norms(state, [batch], model.sites(), grads_fn)
    g = grads_fn(state, batch)["decoder"]["blocks"][0]["cross_attn"]
    expect = np.sqrt((np.asarray(g["query"]["kernel"][:, 1]) ** 2).sum()
                     + (np.asarray(g["out"]["kernel"][1]) ** 2).sum())
    np.testing.assert_allclose(norms["cross"][0, 1], expect, rtol=1e-5)
    assert all(v.shape == shapes[k] and (v > 0).all() for k, v in norms.items())


def test_pruning_removes_the_zero_importance_head_first_and_keeps_one_head():
    from attn_lab.analysis.pruning import pruning_curve

    model, graphdef, state, batch = _tiny_state(zero_head=1)
    shapes = mask_shapes(model)
    scores, sums = importance.compile_analysis(graphdef)
    score = importance.accuracy_scorer([batch], scores)
    for rescore in (False, True):
        curve = pruning_curve(state, [batch], shapes, score, sums, order="importance", fraction=1 / 6,
                              rescore=rescore)
        assert [p["pruned"] for p in curve] == [0, 1, 2, 3, 4, 5]
        assert curve[1]["score"] == curve[0]["score"]  # the head with importance 0 goes first and changes nothing
    reverse = pruning_curve(state, [batch], shapes, score, sums, order="reverse", fraction=0.5)
    assert [p["percent"] for p in reverse] == [0.0, 50.0]
    randoms = [pruning_curve(state, [batch], shapes, score, sums, order="random", fraction=1 / 6, seed=s)
               for s in (0, 0, 1)]
    assert randoms[0] == randoms[1]


def test_diagnostics_on_hand_built_maps():
    b, n, t = 2, 4, 5
    valid = np.ones((b, t), bool)
    uniform = np.full((b, 1, t, t), 1.0 / t)
    diagonal = np.broadcast_to(np.eye(t), (b, 1, t, t))
    first = np.zeros((b, 1, t, t))
    first[..., 0] = 1.0
    maps = np.concatenate([uniform, diagonal, first, first], axis=1)  # heads: uniform, diagonal, first, first
    np.testing.assert_allclose(diagnostics.normalized_entropy(maps, valid), [1, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(diagnostics.mean_distance(maps, valid)[1], 0.0)
    np.testing.assert_allclose(diagnostics.mean_distance(maps, valid)[2], np.arange(t).mean())
    bias = diagnostics.position_bias(maps, valid)
    np.testing.assert_allclose(bias["self"], [1 / t, 1, 1 / t, 1 / t], atol=1e-6)
    np.testing.assert_allclose(bias["first"][2:], 1.0)
    div = diagnostics.pairwise_divergences(maps, valid)
    assert abs(div["js"][2, 3]) < 1e-9 and abs(div["js"][1, 2] - np.log(2) * (t - 1) / t) < 1e-6
    outputs = np.ones((b, t, n, 3))
    outputs[:, :, 0] = 0.0  # the uniform head is dead
    report = diagnostics.layer_report(maps, valid, outputs)
    assert report["flags"] == {"dead": [0], "diagonal": [1], "clumping": [2, 3], "duplicate": [[2, 3], [3, 2]]}
    np.testing.assert_allclose(diagnostics.normalized_entropy(uniform[:, :, :, :3] * t / 3, valid[:, :3]), [1.0])


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(relative_path):
    """A module of this repository (a config file) loaded from its path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(os.path.basename(relative_path)[:-3],
                                                  os.path.join(ROOT, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _analyze(command: list[str], *flags: str) -> None:
    """Runs the analysis as a user does (absl flags are parsed once per process, so never in this one)."""
    proc = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_analyze_heads_script_on_a_finished_run(tmp_path):
    c = _load("configs/listops.py").get_config("quick")
    c.task.data_dir, c.task.num_train, c.task.num_validation, c.task.num_test = str(tmp_path / "d"), 64, 16, 16
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.num_heads = 2, 32, 64, 2
    c.train.update({"num_steps": 2, "batch_size": 8, "log_every": 1, "eval_every": 2, "checkpoint_every": 2})
    c.wandb.mode = "disabled"
    train_and_evaluate(c, str(tmp_path / "run"))
    _analyze([sys.executable, "-m", "attn_lab.analysis"], "--workdir", str(tmp_path / "run"), "--max-batches", "1",
             "--what", "importance,ablate,prune,structural,gates,diagnose",
             "--prune-fraction", "0.5", "--gate-targets", "0.5", "--gate-steps", "4", "--speed-batch", "8")
    out = tmp_path / "run" / "analysis"
    structural = json.loads((out / "structural.json").read_text())
    assert structural["heads_per_layer"] == {"encoder_self": [1, 1]} and structural["max_abs_diff"] < 1e-4
    assert structural["params_pruned"] < structural["params_full"] and structural["speedup_vs_full"] > 0
    gates = json.loads((out / "gates.json").read_text())
    assert [(g["target"], g["kept"]) for g in gates] == [(1.0, 4), (0.5, 2)]
    imp = json.loads((out / "importance.json").read_text())
    assert np.asarray(imp["encoder_self"]).shape == (2, 2)
    ablate = json.loads((out / "ablate.json").read_text())
    assert len(ablate["all_but_one"]["encoder_self"]) == 2
    diag = json.loads((out / "diagnose.json").read_text())
    assert set(diag) == {"encoder_self/0", "encoder_self/1"} and len(diag["encoder_self/0"]["entropy"]) == 2
    assert (out / "importance.png").stat().st_size > 0 and (out / "diagnose_entropy.png").exists()
    assert len(diag["encoder_self/1"]["gradient_norm"]) == 2 and (out / "maps_encoder_self.png").exists()
    prune = json.loads((out / "prune.json").read_text())
    assert {"importance", "reverse", "random"} <= set(prune) and (out / "prune.png").exists()
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]  # what W&B gets too
    assert [line["step"] for line in logged] == [0, 1, 2, 3]  # prune's two steps, then the gates' two rows
    assert {"prune/random", "prune/percent"} <= set(logged[1]) and "gates/kept" in logged[3]
    _analyze([sys.executable, os.path.join(ROOT, "scripts", "analyze_heads.py")], "--workdir", str(tmp_path / "run"),
             "--what", "prune", "--max-batches", "1", "--prune-fraction", "0.5", "--prune-orders", "random",
             "--finetune-steps", "2", "--random-orders", "2")
    for r in (0, 1):  # each random order its own chain of fine-tuned runs, each starting from the trained run
        finetuned = json.loads((out / "finetune" / "random" / f"order{r}" / "step1" / "results.json").read_text())
        assert finetuned["steps"] == 2 and finetuned["config"]["train"]["init_from"] == str(tmp_path / "run")
        masked = finetuned["config"]["model"]["kinds"]["encoder_self"]["head_mask"]
        assert sorted(masked.replace(";", ",").split(",")) == ["0", "0", "1", "1"]  # half the heads pruned
    prune = json.loads((out / "prune.json").read_text())
    assert set(prune) == {"metric", "finetune_steps", "random_seed", "random_orders", "random"}
    assert (prune["random_seed"], prune["random_orders"]) == (c.seed, 2)
    assert len(prune["random"][1]["scores"]) == 2  # each point: the mean of both orders, and both orders' scores


def test_heads_track_logs_per_head_diagnostics_at_each_evaluation(tmp_path):
    c = _load("configs/numbers.py").get_config("quick")
    c.task.data_dir, c.task.max_value = str(tmp_path / "d"), 199
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.num_heads = 1, 32, 64, 2
    c.train.update({"num_steps": 4, "batch_size": 16, "log_every": 2, "eval_every": 2, "checkpoint_every": 4,
                    "max_eval_batches": 1})
    c.wandb.mode, c.heads.track = "disabled", True
    train_and_evaluate(c, str(tmp_path / "run"))
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    tracked = [line for line in lines if "heads/encoder_self/0/entropy/h0" in line]
    assert [line["step"] for line in tracked] == [2, 4]
    for kind in ("encoder_self", "decoder_self", "cross"):
        for head in (0, 1):
            assert 0.0 <= tracked[-1][f"heads/{kind}/0/entropy/h{head}"] <= 1.0 + 1e-6
        assert tracked[-1][f"heads/{kind}/0/dead_heads"] >= 0
