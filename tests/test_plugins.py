"""A researcher's idea lives in their own repository (attn_lab/plugins.py): a module outside ``attn_lab/`` that
registers a kernel, a model kind, an objective, a task and an analysis is imported by ``--plugins`` (a file or a
module name), ``ATTN_LAB_PLUGINS`` or the entry-point group, before the config is built; a plugin that cannot be
imported is one line naming it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from attn_lab import objectives, plugins  # noqa: F401 (objectives: its registry names the loss sections)
from attn_lab.attention.registry import check_call
from attn_lab.train import identity
from tests.helpers import ROOT, tiny_numbers_flags

PLUGIN = textwrap.dedent('''
    """A forker's extensions, one of each kind, outside the attn_lab package."""
    import ml_collections
    from flax import nnx

    from attn_lab.analysis import methods
    from attn_lab.attention.dense import DenseAttention
    from attn_lab.attention.registry import register
    from attn_lab.data import tasks
    from attn_lab.models import sites
    from attn_lab.objectives import LossTerm, register_term


    @register("plugin_kernel")
    class PluginKernel(DenseAttention):
        """Dense attention with a temperature on the logits' scale (an option of the plugin's own)."""

        def __init__(self, *, sharpness: float | None = None, **shared):
            super().__init__(**shared)
            self.sharpness = sharpness


    @register_term
    class PluginTerm(LossTerm):
        name = "plugin_term"

        def default_config(self):
            return ml_collections.ConfigDict({"weight": 0.0})


    @sites.register_model("plugin_model")
    class PluginModel(nnx.Module):
        TASK_KINDS = ("classification",)
        ATTENTION = {"plugin_self": sites.KindSpec(mask="key_padding")}
        GENERATES = False


    tasks.register(tasks.TaskSpec("plugin_task", "translation", {"size": 3}, tasks.task_spec("numbers").load))


    @methods.register_method("plugin_analysis", order=50)
    def plugin_analysis(ctx):
        """The attention kinds of the analysed model and their mask shapes."""
        ctx.output("plugin_analysis", {k: list(v) for k, v in ctx.shapes.items()})
''')
TRAIN = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config",
         os.path.join(ROOT, "configs", "numbers.py:quick")]
ANALYZE = [sys.executable, os.path.join(ROOT, "scripts", "analyze_heads.py")]


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "my_ideas" / "cosine.py"
    path.parent.mkdir()
    path.write_text(PLUGIN)
    return path


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != plugins.ENV}
    return {**env, "PYTHONPATH": ROOT, "WANDB_MODE": "disabled", **extra}


def test_from_argv_reads_both_flag_forms():
    assert plugins.from_argv(["--plugins=a.b,c.py", "--x", "--plugins", "d"]) == ["a.b", "c.py", "d"]
    assert plugins.from_argv(["--config", "x.py"]) == []


def test_a_missing_or_failing_plugin_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^plugins: no module named 'no_such_lab\.kernels'"):
        plugins.load("no_such_lab.kernels")
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('not ready')\n")
    with pytest.raises(ValueError, match=r"bad\.py:1: RuntimeError: not ready$"):
        plugins.load(str(bad))
    proc = subprocess.run([*TRAIN, "--workdir", str(tmp_path / "run"), "--plugins=no_such_lab.kernels"],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode != 0 and proc.stderr.strip().splitlines()[-1] == (
        "error: plugins: no module named 'no_such_lab.kernels' (give an importable module name or a .py file)")
    assert not os.path.exists(tmp_path / "run")


def test_a_missing_plugin_named_by_the_environment_says_so(tmp_path):
    """A plugin the user did not type on this command line (``ATTN_LAB_PLUGINS``) is named with the variable."""
    missing = str(tmp_path / "gone.py")
    proc = subprocess.run([*TRAIN, "--workdir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                          env=_env(**{plugins.ENV: missing}))
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert last.startswith(f"error: {plugins.ENV}={missing}: ") and "gone.py" in last, last
    assert not os.path.exists(tmp_path / "run")


def test_a_plugin_s_key_without_its_plugin_names_the_plugin_not_the_key():
    """An option of a kernel (or a loss section) no loaded plugin registers: the line says the kernel is not
    registered and how to load it, for an unknown key and for a finished run trained with it."""
    hint = plugins.unregistered("model.attention.nope_kernel.sharpness")
    assert hint == ("attention kernel 'nope_kernel' is not registered here: load the plugin that registers it "
                    "(--plugins FILE_OR_MODULE, or ATTN_LAB_PLUGINS, or the entry-point group attn_lab.plugins)")
    assert plugins.unregistered("config.loss.nope_term.weight").startswith("loss term section 'loss.nope_term' is")
    for known in ("model.attention.local.window", "loss.diversity.subspace.weight", "model.num_heads",
                  "model.attention.name"):
        assert plugins.unregistered(known) is None, known
    line = identity.mismatch_text("runs/x", "results.json", [("model.attention.nope_kernel.sharpness", 2.0,
                                                              identity.ABSENT)], identity.FRESH)
    assert line == f"runs/x was trained with a plugin: {hint}"


BAD_CALL = textwrap.dedent('''
    from attn_lab.attention.dense import DenseAttention
    from attn_lab.attention.registry import register


    @register("old_call")
    class OldCall(DenseAttention):
        """A kernel written against an older __call__: no need_weights, no precision."""

        def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                     deterministic):
            return super().__call__(query, key, value, mask=mask, is_causal=is_causal, dropout_rng=dropout_rng,
                                    dropout_rate=dropout_rate, broadcast_dropout=broadcast_dropout,
                                    deterministic=deterministic, precision=None, need_weights=False)


    @register("kwargs_call")
    class KwargsCall(DenseAttention):
        """Takes every keyword through **kwargs: accepted."""

        def __call__(self, query, key, value, **kwargs):
            return super().__call__(query, key, value, **kwargs)
''')


def test_a_plugin_kernel_whose_call_lacks_the_documented_keywords_is_one_line_before_the_folder(tmp_path):
    """A 141-line TypeError from inside jit, after the run folder was made; now one line naming the key, the
    kernel's class and the keywords it lacks, before anything is prepared. ``**kwargs`` passes the check."""
    plugin = tmp_path / "calls.py"
    plugin.write_text(BAD_CALL)
    proc = subprocess.run([*TRAIN, "--workdir", str(tmp_path / "run"), f"--plugins={plugin}",
                           "--config.model.attention.name=old_call", f"--config.task.data_dir={tmp_path / 'data'}"],
                          capture_output=True, text=True, timeout=300, env=_env())
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0] == ("error: model.attention.name='old_call': attn_lab_plugin_calls.OldCall.__call__ must take "
                        "(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout, "
                        "deterministic, precision, need_weights), what every call passes, or **kwargs; it lacks "
                        "precision, need_weights"), lines[0]
    assert not os.path.exists(tmp_path / "run")
    plugins.load(str(plugin))
    check_call("kwargs_call")  # passes
    with pytest.raises(ValueError, match="it lacks precision, need_weights$"):
        check_call("old_call")


@pytest.mark.slow
def test_a_plugin_file_s_kernel_objective_and_analysis_run_from_the_command_line(plugin_file, tmp_path, data_dir):
    """``--plugins=<file>``: the plugin's kernel, with its float option set by flag, trains a tiny run; its
    objective's section and its model kind's attention kind are in the recorded config; its analysis runs on the
    run. The same run again, the plugin given by module name through ATTN_LAB_PLUGINS, has nothing to do."""
    workdir = str(tmp_path / "run")
    flags = [*tiny_numbers_flags(data_dir), "--config.compile_cache=", "--config.model.attention.name=plugin_kernel",
             "--config.model.attention.plugin_kernel.sharpness=0.5"]
    proc = subprocess.run([*TRAIN, "--workdir", workdir, f"--plugins={plugin_file}", *flags],
                          capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = json.load(open(os.path.join(workdir, "results.json")))["config"]
    assert config["model"]["attention"]["plugin_kernel"] == {"sharpness": 0.5}
    assert config["loss"]["plugin_term"] == {"weight": 0.0} and "plugin_self" in config["model"]["kinds"]
    again = subprocess.run([*TRAIN, "--workdir", workdir, *flags], capture_output=True, text=True, timeout=600,
                           env=_env(ATTN_LAB_PLUGINS="cosine", PYTHONPATH=f"{ROOT}:{plugin_file.parent}"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.endswith("nothing to do\n")
    shapes = subprocess.run([*ANALYZE, "--workdir", workdir, "--what", "plugin_analysis", f"--plugins={plugin_file}"],
                            capture_output=True, text=True, timeout=600, env=_env())
    assert shapes.returncode == 0, shapes.stderr[-2000:]
    written = json.load(open(os.path.join(workdir, "analysis", "plugin_analysis.json")))
    assert written == {"encoder_self": [1, 4], "decoder_self": [1, 4], "cross": [1, 4]}


@pytest.mark.slow
def test_a_sweep_finished_before_a_plugin_was_written_skips_its_trials_with_the_plugin_loaded(plugin_file, tmp_path):
    """The lab grows under a finished sweep: a plugin registering a kernel, model kind, objective, task and analysis
    (new config keys in every trial's config) leaves each finished trial the same run, so the rerun skips them all."""
    exp = tmp_path / "exp.py"
    exp.write_text(textwrap.dedent(f"""
        def get_experiment(preset="quick"):
            return {{"name": "grow", "config": {os.path.join(ROOT, "configs", "numbers.py:quick")!r},
                     "variants": {{"two": {{"model.num_heads": 2}}}}, "seeds": [0, 1], "overrides": {{
                         "task.max_value": 199, "model.d_model": 32, "model.mlp_dim": 64, "model.num_layers": 1,
                         "train.num_steps": 4, "train.batch_size": 16, "train.log_every": 2, "train.eval_every": 4,
                         "train.checkpoint_every": 4, "train.max_eval_batches": 1, "wandb.mode": "disabled"}}}}
    """))
    cmd = [sys.executable, "-m", "attn_lab.sweep", "--experiment", str(exp), "--workdir", str(tmp_path / "runs"),
           f"--config.task.data_dir={tmp_path / 'data'}", "--config.compile_cache="]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env())
    assert first.returncode == 0, first.stderr[-2000:]
    grown = subprocess.run([*cmd, f"--plugins={plugin_file}"], capture_output=True, text=True, timeout=600,
                           env=_env())
    assert grown.returncode == 0, grown.stderr[-2000:]
    assert "variant=two,seed=0: skipped" in grown.stdout and "variant=two,seed=1: skipped" in grown.stdout
    changed = subprocess.run([*cmd, f"--plugins={plugin_file}", "--config.model.mlp_dim=32"], capture_output=True,
                             text=True, timeout=600, env=_env())
    assert changed.returncode != 0 and "model.mlp_dim" in changed.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_finished_plugin_sweep_rerun_without_its_plugin_says_to_load_it(plugin_file, tmp_path):
    """The rerun said the trial 'was trained with' the kernel's option and advised a new workdir (retraining
    finished work); it now says the kernel is not registered and how to load it, and writes nothing."""
    exp = tmp_path / "exp.py"
    exp.write_text(textwrap.dedent(f"""
        def get_experiment(preset="quick"):
            return {{"name": "plug", "config": {os.path.join(ROOT, "configs", "numbers.py:quick")!r},
                     "variants": {{"k": {{"model.attention.name": "plugin_kernel"}}}}, "seeds": [0], "overrides": {{
                         "task.max_value": 199, "model.d_model": 32, "model.mlp_dim": 64, "model.num_layers": 1,
                         "train.num_steps": 2, "train.batch_size": 16, "train.log_every": 2, "train.eval_every": 2,
                         "train.max_eval_batches": 1, "wandb.mode": "disabled"}}}}
    """))
    cmd = [sys.executable, "-m", "attn_lab.sweep", "--experiment", str(exp), "--workdir", str(tmp_path / "runs"),
           f"--config.task.data_dir={tmp_path / 'data'}", "--config.compile_cache="]
    first = subprocess.run([*cmd, f"--plugins={plugin_file}"], capture_output=True, text=True, timeout=600,
                           env=_env())
    assert first.returncode == 0, first.stderr[-2000:]
    before = sorted(p for p, _, _ in os.walk(tmp_path / "runs"))
    bare = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env())
    lines = bare.stderr.strip().splitlines()
    assert bare.returncode != 0 and len(lines) == 1, bare.stderr[-2000:]
    assert lines[0] == (f"error: {tmp_path / 'runs' / 'variant=k,seed=0'} was trained with a plugin: attention "
                        f"kernel 'plugin_kernel' is not registered here: load the plugin that registers it "
                        "(--plugins FILE_OR_MODULE, or ATTN_LAB_PLUGINS, or the entry-point group attn_lab.plugins)")
    assert sorted(p for p, _, _ in os.walk(tmp_path / "runs")) == before
