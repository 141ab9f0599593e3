"""Every bad input stops in one line naming the key, its value and what is allowed, before anything is written.

Table-driven: the config values go through :func:`validate_config` in process (milliseconds each); the CLI path
(flag parsing, config files, workdirs, sweep flags and experiment files) runs ``python -m attn_lab.train``,
``scripts/sweep.py``, ``python -m attn_lab.analysis`` and ``python -m attn_lab.reporting`` as subprocesses, started
together because each spends seconds importing.
"""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import pytest

from attn_lab import checks
from attn_lab.data import load_task
from attn_lab.data.tasks import is_prepared
from attn_lab.sweep.spec import load_experiment
from attn_lab.train.config import validate_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READ_ONLY = "/sys/attn_lab_test"  # sysfs: not writable even by root (os.access would say it is)


def _config(name: str, tmp_path, overrides: dict):
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config("quick")
    c.task.data_dir, c.compile_cache = str(tmp_path / "data"), str(tmp_path / "cache")
    for key, value in overrides.items():
        *path, last = key.split(".")
        node = c
        for part in path:
            node = node[part]
        node[last] = value
    return c


def _files(root) -> list[str]:
    return sorted(os.path.join(d, f) for d, dirs, fs in os.walk(root) for f in dirs + fs)


LINFORMER = {"model.attention.name": "linformer", "model.kinds.decoder_self.attention": "dense"}
ZEROS = "0,0,0,0"

# (task config, overrides, what the one line must contain: the key, the value, what is allowed)
BAD_VALUES = [
    ("numbers", {"train.grad_clip": -1.0}, "train.grad_clip must be positive (the bound on the global gradient "
                                           "norm; 0 would stop learning), got -1.0"),
    ("numbers", {"train.grad_clip": 0.0}, "train.grad_clip must be positive"),
    ("numbers", {"model.kinds.encoder_self.head_mask": "1,2,1,1"},
     "model.kinds.encoder_self.head_mask='1,2,1,1': values must be numbers in [0, 1]"),
    ("numbers", {"model.kinds.cross.head_mask": "a,b,c,d"}, "model.kinds.cross.head_mask='a,b,c,d': values must"),
    ("numbers", {"model.kinds.cross.head_mask": "1,nan,1,1"}, "model.kinds.cross.head_mask='1,nan,1,1'"),
    ("numbers", {"model.kinds.cross.head_mask": "1,1"}, "model.kinds.cross.head_mask='1,1' must have 4 values"),
    ("listops", {"model.kinds.encoder_self.head_mask": ZEROS},
     "model.kinds.encoder_self.head_mask='0,0,0,0': the head masks mask every attention head of the model"),
    ("numbers", {f"model.kinds.{k}.head_mask": ZEROS for k in ("encoder_self", "decoder_self", "cross")},
     "model.kinds.cross.head_mask='0,0,0,0': the head masks mask every attention head"),
    ("numbers", {"train.weight_decay": -5.0}, "train.weight_decay must be >= 0, got -5.0"),
    ("numbers", {"heads.gates.lr": -1.0}, "heads.gates.lr must be positive, got -1.0"),
    ("numbers", {"heads.gates.dual_lr": 0.0}, "heads.gates.dual_lr must be positive, got 0.0"),
    ("numbers", {"heads.gates.l0": -1.0}, "heads.gates.l0 must be >= 0, got -1.0"),
    ("numbers", {"heads.gates.enabled": True, "heads.gates.target": 1.5},
     "heads.gates.target must be in (0, 1] (the share of heads to keep), got 1.5"),
    ("numbers", {"heads.gates.anneal": 2.0}, "heads.gates.anneal must be in [0, 1]"),
    ("numbers", {"heads.gates.target": 0.5}, "heads.gates.l0 / heads.gates.target need heads.gates.enabled=True"),
    ("numbers", {"train.learning_rate": float("inf")}, "train.learning_rate must be finite, got inf"),
    ("numbers", {"train.learning_rate": float("nan")}, "train.learning_rate must be finite, got nan"),
    ("numbers", {"train.learning_rate": 0.0}, "train.learning_rate must be positive, got 0.0"),
    ("numbers", {"loss.diversity.output.weight": float("inf")}, "loss.diversity.output.weight must be finite"),
    ("listops", {"model.attention.name": "performer", "model.attention.performer.num_features": 0},
     "model.attention.performer: "),
    ("numbers", {"loss.diversity.layers": "5"}, "loss.diversity.layers='5': layer 5 does not exist"),
    ("numbers", {"seed": -1}, "seed must be in [0, 2**32 - 1], got -1"),
    ("numbers", {"seed": 2**32}, "seed must be in [0, 2**32 - 1], got 4294967296"),
    ("numbers", {"model.dropout": 1.0}, "model.dropout must be in [0, 1), got 1.0"),
    ("numbers", {"model.attention_dropout": -0.1}, "model.attention_dropout must be in [0, 1), got -0.1"),
    ("numbers", {"train.label_smoothing": 1.5}, "train.label_smoothing must be in [0, 1), got 1.5"),
    ("numbers", {"model.num_layers": 0}, "model.num_layers must be positive, got 0"),
    ("numbers", {"model.num_kv_heads": 0}, "model.num_kv_heads must be positive, got 0"),
    ("numbers", {"model.kinds.cross.num_kv_heads": -2}, "model.kinds.cross.num_kv_heads must be positive, got -2"),
    ("numbers", {"train.warmup_steps": -1}, "train.warmup_steps must be >= 0, got -1"),
    ("numbers", {"train.max_eval_batches": 0}, "train.max_eval_batches must be positive, got 0"),
    ("numbers", {"train.checkpoint_every": 0}, "train.checkpoint_every must be positive, got 0"),
    ("numbers", {"train.batch_size": 100000}, "train.batch_size=100000 exceeds the training split of task 'numbers' "
                                              "(at most 8000 examples"),
    ("listops", {"task.num_train": 10}, "train.batch_size=32 exceeds the training split of task 'listops'"),
    ("numbers", {"eval.bleu_tokenize": "bogus"}, "eval.bleu_tokenize='bogus' is not one of sacrebleu's tokenizers: "),
    ("numbers", {**LINFORMER, "model.attention.linformer.max_len": 32},
     "model.attention.linformer.max_len=32 is shorter than the encoder_self keys of this task (up to 64 tokens"),
    ("listops", {"model.attention.name": "linformer", "model.attention.linformer.max_len": 60},
     "model.attention.linformer.max_len=60 is shorter than the encoder_self keys of this task (up to 64 tokens"),
    ("numbers", {"parallel.process_id": 1}, "parallel.process_id=1 needs parallel.distributed=True"),
    ("numbers", {"parallel.num_processes": 0}, "parallel.num_processes must be positive, got 0"),
    ("numbers", {"wandb.project": " "}, "wandb.project must be non-empty, got ' '"),
    ("numbers", {"wandb.mode": "bogus"}, "wandb.mode='bogus'"),
    ("numbers", {"model.norm": "mid"}, "model.norm='mid' is not one of: pre, post"),
    ("numbers", {"task.split_seed": -1}, "task.split_seed must be an integer >= 0, got -1"),
    ("numbers", {"task.max_input_length": 0}, "task.max_input_length must be a positive integer, got 0"),
    ("numbers", {"train.init_from": "/nonexistent/run"}, "train.init_from='/nonexistent/run' is not a run folder"),
    ("numbers", {"compile_cache": READ_ONLY}, f"compile_cache='{READ_ONLY}': /sys is not writable ('' turns"),
    ("numbers", {"task.data_dir": READ_ONLY}, f"task.data_dir='{READ_ONLY}': /sys is not writable, and task "
                                              "'numbers' is not prepared there"),
    ("numbers", {"task.data_dir": "{tmp}/a_file/data"}, "task.data_dir='{tmp}/a_file/data': {tmp}/a_file is a file"),
    ("listops", {"model.attention.name": "local", "model.attention.local.fused_block_size": 48},
     "model.attention.local: attention.fused_block_size must be one of (16, 32, 64, 128) (Triton tiles are powers "
     "of two, >= 16 for its matrix unit and <= 128 for shared memory), got 48"),
    ("listops", {"model.attention.name": "bigbird", "model.attention.bigbird.fused_block_size": 8},
     "model.attention.bigbird: attention.fused_block_size must be one of (16, 32, 64, 128)"),
    ("listops", {"model.attention.name": "longformer", "model.attention.longformer.implementation": "triton"},
     "model.attention.longformer: attention.implementation must be one of ('auto', 'xla', 'fused', "
     "'fused_interpret'), got 'triton'"),
    # an integer kernel option past int32 overflowed inside jit: refused for every kernel, by the registry
    ("listops", {"model.attention.name": "adaptive_span", "model.attention.adaptive_span.max_span": 2 ** 31},
     "model.attention.max_span=2147483648: out of range for attention 'adaptive_span'; an integer option must lie "
     "in [-2**31, 2**31) (it reaches jit as an int32)"),
    ("listops", {"model.attention.name": "local", "model.attention.local.window": 2 ** 40},
     "model.attention.window=1099511627776: out of range for attention 'local'"),
    ("listops", {"model.attention.name": "performer", "model.attention.performer.num_features": -2 ** 31 - 1},
     "model.attention.num_features=-2147483649: out of range for attention 'performer'"),
    # the fused kernel's tile refusal (a head dim beyond shared memory), interpreted too: before anything compiles
    ("listops", {"model.attention.name": "local", "model.attention.local.implementation": "fused_interpret",
                 "model.head_dim": 1024},
     "model.attention.local: fused kernel: block 64 with head dim 1024 in float32 does not fit in 227 KiB of shared "
     "memory at any tile (forward: 256 KiB at tile 16, one stage); use an implementation that is not fused: 'auto', "
     "'blockwise', 'cudnn' (used by encoder_self)"),
    *([] if jax.default_backend() == "gpu" else [  # an explicit fused kernel where it cannot compile
        ("listops", {"model.attention.name": "strided", "model.attention.strided.implementation": "fused"},
         "model.attention.strided: attention.implementation='fused' cannot run here: backend cpu (the fused kernel "
         "compiles for CUDA GPUs through Pallas' Triton backend)")]),
]


@pytest.mark.parametrize("task,overrides,message", BAD_VALUES, ids=[str(list(o.items())[-1]) for _, o, _ in BAD_VALUES])
def test_bad_config_values_are_one_line_and_write_nothing(tmp_path, task, overrides, message):
    if READ_ONLY in overrides.values() and (not os.path.isdir("/sys") or checks._can_write("/sys")):
        pytest.skip("no read-only /sys here")
    (tmp_path / "a_file").write_text("")
    overrides = {k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for k, v in overrides.items()}
    config = _config(task, tmp_path, overrides)
    with pytest.raises(ValueError) as info:
        validate_config(config)
    assert message.replace("{tmp}", str(tmp_path)) in str(info.value)
    assert "\n" not in str(info.value)
    assert _files(tmp_path) == [str(tmp_path / "a_file")]  # no data, cache or probe file left behind


def test_the_shipped_configs_still_validate(tmp_path):
    for name in ("numbers", "listops"):
        validate_config(_config(name, tmp_path, {}))
    assert not os.listdir(tmp_path)


def test_a_prepared_dataset_on_a_read_only_path_is_read_without_writing(tmp_path, monkeypatch):
    """Reading a prepared dataset opens no lock file and writes nothing, so validation accepts a read-only data
    folder that holds it (and rejects one that does not)."""
    data = tmp_path / "data"
    assert not is_prepared({"name": "numbers", "max_value": 199}, str(data)) and not data.exists()
    load_task({"name": "numbers", "max_value": 199}, str(data))
    for lock in data.glob(".*.lock"):
        lock.unlink()
    before = {f: os.stat(f).st_mtime_ns for f in _files(data)}
    real = checks._can_write
    monkeypatch.setattr(checks, "_can_write", lambda folder: not folder.startswith(str(data)) and real(folder))
    validate_config(_config("numbers", tmp_path, {"task.max_value": 199, "train.batch_size": 16}))
    task = load_task({"name": "numbers", "max_value": 199}, str(data))
    assert task.num_examples("train") == 160
    assert {f: os.stat(f).st_mtime_ns for f in _files(data)} == before  # no lock file, nothing touched
    with pytest.raises(ValueError, match=r"task.data_dir='.*' is not writable, and task 'numbers' is not prepared"):
        validate_config(_config("numbers", tmp_path, {"task.max_value": 299}))


def _run_all(commands: list[list[str]], cwd: str) -> list[subprocess.CompletedProcess]:
    """Runs the commands concurrently (most of each is importing)."""
    procs = [subprocess.Popen(c, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=300), *p.communicate()) for p in procs]


TRAIN = [sys.executable, "-m", "attn_lab.train"]
QUICK = ["--config", os.path.join(ROOT, "configs", "numbers.py:quick")]
# (arguments after `python -m attn_lab.train`; '{w}' is the workdir, '{tmp}' the test folder), what the one line says
BAD_TRAIN_FLAGS = [
    (["--config", "configs/nope.py", "--workdir", "{w}"], "--config=configs/nope.py: no such config file"),
    (["--config", os.path.join(ROOT, "configs", "numbers.py:nope"), "--workdir", "{w}"],
     "numbers.py:nope: unknown preset 'nope' for configs/numbers.py; use '' or 'quick'"),
    ([*QUICK, "--workdir", "{w}", "--config.model.num_head=3"],
     "unknown config key 'config.model.num_head'; did you mean 'config.model.num_heads'?"),
    ([*QUICK, "--workdir", "{w}", "--config.model.kinds.cross.head_mask=a,b,c,d"],
     "model.kinds.cross.head_mask='a,b,c,d': values must be numbers in [0, 1]"),
    ([*QUICK, "--workdir", "{w}", "--config.train.grad_clip=x"], "--config.train.grad_clip=x: expected a number"),
    ([*QUICK, "--workdir", "{w}", "--config.train.grad_clip=-1"], "train.grad_clip must be positive"),
    ([*QUICK, "--workdir", "{tmp}/a_file"], "--workdir='{tmp}/a_file' is a file, not a folder"),
    ([*QUICK, "--workdir", "{w}/" + "n" * 256 + "/x"], "is 256 bytes; the file system allows 255 per folder name"),
    ([*QUICK, "--workdir", "{w}/{seed}" + "n" * 254, "--seeds", "0,10"],  # the seed 10 makes it too long
     "is 256 bytes; the file system allows 255 per folder name"),
    ([*QUICK, "--workdir", "{w}/{{seed}}", "--seeds", "0,-1"], "--seeds must be an integer in [0, 2**32 - 1], got -1"),
    ([*QUICK, "--workdir", "{w}/{{seed}}", "--seeds", "0,x"], "--seeds=0,x: give comma-separated integers, e.g. 0,1,2"),
    ([*QUICK, "--workdir", "{w}", "--seed", "1"], "unknown flag --seed; see --help"),
    ([*QUICK, "--workdir", "{w}", "extra"], "unexpected arguments ['extra']; every argument is a --flag"),
    (["--config", "{tmp}/syntax.py", "--workdir", "{w}"], "--config={tmp}/syntax.py: {tmp}/syntax.py:2: SyntaxError: "),
    (["--config", "{tmp}/name.py:quick", "--workdir", "{w}"],
     "--config={tmp}/name.py:quick: {tmp}/name.py:3: NameError: name 'base' is not defined"),
    (["--config", "{tmp}/folder.py", "--workdir", "{w}"], "{tmp}/folder.py is a folder, not a Python file"),
    ([*QUICK, "--workdir", ""], "--workdir='' is empty; name a folder"),
    ([*QUICK, "--workdir", "{tmp}/ckpt_file"],
     "--workdir='{tmp}/ckpt_file': {tmp}/ckpt_file/checkpoints is not a folder (a run writes its checkpoints there)"),
    ([*QUICK, "--workdir", "{tmp}/results_dir"], "{tmp}/results_dir/results.json is not a file"),
    ([*QUICK, "--workdir", "{w}", "--config.task.max_value=1000000000000"],
     "task.max_value=1000000000000: 1,000,000,000,001 integers from task.min_value=0; at most 10,000,000"),
    ([*QUICK, "--workdir", "{w}", "--config.train.init_from={tmp}/unfinished"],
     "train.init_from='{tmp}/unfinished': {tmp}/unfinished has not finished (no results.json; its newest checkpoint "
     "is step 4); wait for it to finish, or pass --allow-unfinished to use step 4"),
]


def _bad_files(tmp_path) -> None:
    """The files BAD_TRAIN_FLAGS name: config files with errors, run folders with the wrong things in them."""
    (tmp_path / "a_file").write_text("")
    (tmp_path / "syntax.py").write_text("def get_config():\n    return {'a': 1\n")
    (tmp_path / "name.py").write_text("def get_config(preset=''):\n    c = {}\n    return base\n")
    (tmp_path / "folder.py").mkdir()
    (tmp_path / "ckpt_file").mkdir()
    (tmp_path / "ckpt_file" / "checkpoints").write_text("")
    (tmp_path / "results_dir" / "results.json").mkdir(parents=True)
    (tmp_path / "unfinished" / "checkpoints" / "4").mkdir(parents=True)
    (tmp_path / "unfinished" / "config.json").write_text("{}")


def test_bad_train_command_lines_are_one_line_and_write_nothing(tmp_path):
    _bad_files(tmp_path)
    before = _files(tmp_path)
    fill = lambda a: a.replace("{w}", str(tmp_path / "w")).replace("{tmp}", str(tmp_path))
    commands = [TRAIN + [fill(a) for a in args] + [f"--config.task.data_dir={tmp_path / 'data'}"]
                for args, _ in BAD_TRAIN_FLAGS]
    for (args, message), proc in zip(BAD_TRAIN_FLAGS, _run_all(commands, ROOT)):
        assert proc.returncode != 0, args
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: "), (args, proc.stderr)
        assert fill(message) in proc.stderr, (args, proc.stderr)
    assert _files(tmp_path) == before


def _experiment(tmp_path, name: str, body: str) -> str:
    (tmp_path / "experiments").mkdir(exist_ok=True)
    path = tmp_path / "experiments" / f"{name}.py"
    path.write_text(f"def get_experiment(preset='quick'):\n    return {body}\n")
    return str(path)


SPEC = "'config': 'configs/numbers.py:quick'"
BAD_EXPERIMENTS = [
    ("noname", "{" + SPEC + "}", "experiment key 'name' is missing; it needs name, config"),
    ("scalar", "{'name': 'x', " + SPEC + ", 'grid': {'model.num_heads': 4}}",
     "axis 'model.num_heads' must be a list of values, got 4"),
    ("empty", "{'name': 'x', " + SPEC + ", 'grid': {'model.num_heads': []}}", "axis 'model.num_heads' is empty"),
    ("seeds", "{'name': 'x', " + SPEC + ", 'seeds': [0, -1]}", "seeds must be an integer in [0, 2**32 - 1], got -1"),
    ("nobase", "{'name': 'x', 'config': 'configs/nope.py'}", "config='configs/nope.py': config file not found"),
    ("shape", "{'name': 'x', " + SPEC + ", 'grid': [1]}", "experiment key 'grid' must be a dict"),
    ("twice", "{'name': 'x', " + SPEC + ", 'seeds': [0, 1, 0]}", "seeds: seed 0 is given twice; give each seed once"),
    ("syntax", "{'name': 'x', " + SPEC, "syntax.py:2: SyntaxError: "),
    ("name", "{'name': x, " + SPEC + "}", "name.py:2: NameError: name 'x' is not defined"),
]


@pytest.mark.parametrize("name,body,message", BAD_EXPERIMENTS, ids=[b[0] for b in BAD_EXPERIMENTS])
def test_bad_experiment_files_are_one_line(tmp_path, name, body, message):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "numbers.py").symlink_to(os.path.join(ROOT, "configs", "numbers.py"))
    with pytest.raises(ValueError) as info:
        load_experiment(_experiment(tmp_path, name, body))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_sweep_command_lines_are_one_line_and_write_nothing(tmp_path):
    """Bad sweep flags, a bad experiment file, a pass-through override of a swept key and a finished trial's
    truncated results.json stop the sweep in one line before it writes anything."""
    good = _experiment(tmp_path, "good", "{'name': 'x', " + SPEC + ", 'grid': {'model.num_heads': [2, 4]}}")
    noname = _experiment(tmp_path, "noname", "{" + SPEC + "}")
    longname = _experiment(tmp_path, "longname", "{'name': 'x', " + SPEC + ", 'variants': {'v' * 300: {}}}")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "numbers.py").symlink_to(os.path.join(ROOT, "configs", "numbers.py"))
    runs = tmp_path / "runs"
    (runs / "num_heads=2,seed=0").mkdir(parents=True)
    (runs / "num_heads=2,seed=0" / "results.json").write_text('{"final": {"te')
    before = _files(tmp_path)
    sweep = [sys.executable, os.path.join(ROOT, "scripts", "sweep.py")]
    new = str(tmp_path / "new")
    cases = [
        (["--experiment", good, "--workdir", new, "--shard", "x"], "--shard='x': give I/N with 0 <= I < N"),
        (["--experiment", good, "--workdir", new, "--shard", "3"], "--shard='3': give I/N with 0 <= I < N"),
        (["--experiment", good, "--workdir", new, "--parallel", "x"], "--parallel=x: expected an integer"),
        (["--experiment", good, "--workdir", new, "--parallel", "0"], "--parallel=0: 0 is not a positive integer"),
        (["--experiment", good, "--workdir", new, "--seeds", "0,x"], "--seeds=0,x: give comma-separated integers"),
        (["--experiment", good, "--workdir", new, "--status-every", "99999999999999"],  # its thread's wait overflowed
         "--status-every=99999999999999: 99999999999999 is not an integer in the range [0, 86400]"),
        (["--experiment", good, "--workdir", new, "--bogus"], "unknown flag --bogus"),
        (["--experiment", noname, "--workdir", new], "experiment key 'name' is missing"),
        (["--experiment", good, "--workdir", str(runs)], "num_heads=2,seed=0/results.json cannot be read"),
        (["--experiment", good, "--workdir", str(tmp_path / "experiments" / "good.py")], "is a file, not a folder"),
        (["--experiment", good, "--workdir", new, "--config.model.num_heads=8"],  # changes trials named num_heads=2
         "--config.model.num_heads=8: 'model.num_heads' is varied by this sweep (an axis)"),
        (["--experiment", good, "--workdir", new, "--config.seed=3"],
         "--config.seed=3: 'seed' is varied by this sweep (the seeds; use --seeds)"),
        (["--experiment", good, "--workdir", new, "--config.train.num_step=3"],  # checked as a trial would parse it
         "unknown config key 'config.train.num_step'; did you mean 'config.train.num_steps'?"),
        (["--experiment", good, "--workdir", new, "--config.train.num_steps=x"],
         "--config.train.num_steps=x: expected an integer"),
        (["--experiment", good, "--workdir", new, "--config.train.num_steps", "3"],
         "--config.train.num_steps: give the override as --config.key=value"),
        (["--config", good, "--workdir", new],
         f"--config={good}: the sweep takes its experiment file as --experiment FILE[:preset]"),
        (["--workdir", new], "--experiment is required"),
        (["--experiment", str(tmp_path / "experiments"), "--workdir", new],
         f"--experiment={tmp_path / 'experiments'}: {tmp_path / 'experiments'} is a folder, not an experiment file"),
        (["--experiment", good, "--workdir", ""], "--workdir='' is empty; name a folder"),
        # names past the file system's limit (ENAMETOOLONG once created): the workdir's or a trial's
        (["--experiment", good, "--workdir", str(tmp_path / ("w" * 300) / "x")],
         "the name 'wwwwwwwwwwwwwwwwwwwwwwww...' is 300 bytes; the file system allows 255 per folder name"),
        (["--experiment", good, "--workdir", str(tmp_path / "/".join(["d" * 200] * 20))], "bytes long; the file "
         "system allows 4096 per path and a run writes up to 200 more below its folder"),
        (["--experiment", longname, "--workdir", new], "error: trial 'variant=vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv' in "
         "--workdir="),
        # a sweep folder with '{seed}' trained its trials outside itself (the per-seed template is inside it)
        (["--experiment", good, "--workdir", str(tmp_path / "r_{seed}")], "a sweep folder cannot hold '{' or '}'"),
    ]
    for (args, message), proc in zip(cases, _run_all([sweep + a for a, _ in cases], ROOT)):
        assert proc.returncode != 0, args
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: "), (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
    assert _files(tmp_path) == before


ANALYZE = [sys.executable, "-m", "attn_lab.analysis"]
TABLES = [sys.executable, "-m", "attn_lab.reporting"]
# (command, what the one line says; '{tmp}' is the test folder): the head analysis and the tables of a sweep folder
BAD_ANALYSIS_AND_TABLES = [
    ([*ANALYZE, "--workdir", "{tmp}", "--what", "importance,bogus"],
     "--what=importance,bogus: 'bogus' is not one of importance, ablate, prune, structural, gates, diagnose"),
    ([*ANALYZE, "--workdir", "{tmp}", "--what="], "--what=: give at least one of importance, ablate, prune"),
    ([*ANALYZE, "--workdir", "{tmp}", "--prune-orders", "importance,best"],
     "--prune-orders=importance,best: 'best' is not one of importance, reverse, random"),
    ([*ANALYZE, "--workdir", "{tmp}", "--gate-targets", "0.5,x"],
     "--gate-targets=0.5,x: give comma-separated numbers in (0, 1]"),
    ([*ANALYZE, "--workdir", "{tmp}", "--gate-targets", "0.5,1.5"],
     "--gate-targets=0.5,1.5: each must be in (0, 1] (a share of the heads to keep), got 1.5"),
    ([*ANALYZE, "--workdir", "{tmp}", "--structural-percent", "100"],
     "--structural-percent=100.0: must be in [0, 100)"),
    ([*ANALYZE, "--workdir", "{tmp}", "--prune-fraction", "0"], "--prune-fraction=0.0: must be in (0, 1]"),
    ([*ANALYZE, "--workdir", "{tmp}", "--metric", "rouge"],
     "--metric=rouge: value should be one of <accuracy|log_likelihood|bleu|exact_match>"),
    ([*ANALYZE, "--workdir", "{tmp}", "--split", "dev"], "--split=dev: value should be one of <train|validation|test>"),
    ([*ANALYZE, "--workdir", "{tmp}", "--max-batches", "0"], "--max-batches=0: 0 is not a positive integer"),
    ([*ANALYZE, "--what", "importance"], "--workdir is required"),
    ([*ANALYZE, "--workdir", "{tmp}/nope"], "--workdir: {tmp}/nope is not a run folder"),
    ([*ANALYZE, "--workdir", "{tmp}", "importance"], "unexpected arguments ['importance']; every argument is a --flag"),
    ([sys.executable, os.path.join(ROOT, "scripts", "analyze_heads.py"), "--workdir", "{tmp}", "--what", "x"],
     "--what=x: 'x' is not one of importance"),
    ([*TABLES, "{tmp}/runs"], "unexpected argument '{tmp}/runs'; give the sweep folder as --workdir {tmp}/runs"),
    ([sys.executable, os.path.join(ROOT, "scripts", "make_tables.py"), "{tmp}/runs"],
     "unexpected argument '{tmp}/runs'; give the sweep folder as --workdir {tmp}/runs"),
    ([*TABLES, "--out", "{tmp}/tables"], "--workdir is required"),
    ([*TABLES, "--workdir", "{tmp}"], "{tmp}/badres/results.json cannot be read"),  # a folder of runs: one damaged
    ([*TABLES, "--workdir", "{tmp}/badcfg"], "--workdir={tmp}/badcfg: no sweep.json and no finished run"),
    ([*TABLES, "--workdir", "{tmp}/runs"], "--workdir={tmp}/runs: no finished trial"),
    ([*TABLES, "--workdir", "{tmp}/runs", "--bogus"], "unknown flag --bogus"),
    ([*ANALYZE, "--workdir", "{tmp}/badcfg"], "--workdir: {tmp}/badcfg/config.json cannot be read (JSONDecodeError: "),
    ([*ANALYZE, "--workdir", "{tmp}/badres"],
     "--workdir: {tmp}/badres/results.json cannot be read (a JSON list, not an object); a finished run's record is "
     "never overwritten"),
    ([*TABLES, "--workdir", "{tmp}/torn"], "{tmp}/torn/num_heads=2,seed=0/results.json cannot be read"),
    ([*TABLES, "--workdir", "{tmp}/reads"],
     "{tmp}/reads/num_heads=2,seed=0/analysis/importance.json cannot be read (JSONDecodeError: "),
    # tables that cannot be written (a read-only sweep folder, or --out): one line before any is written
    ([*TABLES, "--workdir", "{tmp}/reads", "--out", READ_ONLY], f"--out='{READ_ONLY}': /sys is not writable"),
    ([*TABLES, "--workdir", "{tmp}/reads/num_heads=2,seed=0", "--out", READ_ONLY],
     f"--out='{READ_ONLY}': /sys is not writable"),
]

# A finished trial's record as the trainer writes it (what the tables read), and a report that reads its analysis.
FINISHED = {"final": {"validation": {"loss": 1.0}, "test": {"loss": 1.0}}, "best": {"loss": 1.0}, "steps": 4,
            "num_params": 10, "steps_per_sec": 1.0}
READS = ("\n\ndef report(rows, sweep_dir, exp, out_dir, bench=None):\n    import os\n"
         "    from attn_lab.reporting.tables import read_json\n"
         "    read_json(os.path.join(sweep_dir, rows[0]['trial'], 'analysis', 'importance.json'))\n    return []\n")


def _bad_run_folders(tmp_path, good: str, reads: str) -> None:
    """Run and sweep folders with damaged records: config.json, results.json, a trial's results.json, an
    analysis JSON a report reads."""
    for name, files in {"badcfg": {"config.json": "{"}, "badres": {"config.json": "{}", "results.json": "[]"}}.items():
        for file, text in files.items():
            (tmp_path / name).mkdir(exist_ok=True)
            (tmp_path / name / file).write_text(text)
    for name, experiment in (("torn", good), ("reads", reads)):
        trial = tmp_path / name / "num_heads=2,seed=0"
        (trial / "analysis").mkdir(parents=True)
        (tmp_path / name / "sweep.json").write_text(
            f'{{"experiment": "{experiment}:quick", "root": "{ROOT}", "name": "x"}}')
        (trial / "results.json").write_text('{"final": {"te' if name == "torn" else json.dumps(FINISHED))
        (trial / "analysis" / "importance.json").write_text("{")


def test_bad_analysis_and_tables_command_lines_are_one_line_and_write_nothing(tmp_path):
    good = _experiment(tmp_path, "good", "{'name': 'x', " + SPEC + ", 'grid': {'model.num_heads': [2, 4]}}")
    with open(good, "a") as f:
        f.write("\n\ndef report(rows, sweep_dir, exp, out_dir, bench=None):\n    return []\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "numbers.py").symlink_to(os.path.join(ROOT, "configs", "numbers.py"))
    (tmp_path / "runs").mkdir()  # a sweep folder whose trials have not finished
    (tmp_path / "runs" / "sweep.json").write_text(f'{{"experiment": "{good}:quick", "root": "{ROOT}", "name": "x"}}')
    reads = _experiment(tmp_path, "reads", "{'name': 'x', " + SPEC + ", 'grid': {'model.num_heads': [2, 4]}}")
    with open(reads, "a") as f:
        f.write(READS)
    _bad_run_folders(tmp_path, good, reads)
    before = _files(tmp_path)
    fill = lambda a: a.replace("{tmp}", str(tmp_path))
    commands = [[fill(a) for a in command] for command, _ in BAD_ANALYSIS_AND_TABLES]
    for (command, message), proc in zip(BAD_ANALYSIS_AND_TABLES, _run_all(commands, ROOT)):
        assert proc.returncode != 0, command
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: "), (command, proc.stderr)
        assert fill(message) in proc.stderr, (command, proc.stderr)
    assert _files(tmp_path) == before


def test_a_target_limit_that_cuts_every_training_target_is_refused_before_the_folder_exists(tmp_path, data_dir):
    """numbers with task.max_target_length=4: every German number word is longer, so a model trained on the cut
    targets never sees one end -- one line naming the key, its value and the longest target; the run's folder is
    not made. A limit that cuts only some targets stays a note (the run builds)."""
    from attn_lab.train.trainer import Run, TaskError
    from tests.helpers import tiny_numbers

    config = tiny_numbers(data_dir)
    config.task.max_target_length, config.wandb.mode = 4, "disabled"
    with pytest.raises(TaskError) as info:
        Run(config, str(tmp_path / "cut"))
    line = str(info.value)
    assert line.startswith("task.max_target_length=4 cuts ") and "\n" not in line
    longest = int(line.split("(the longest: ")[1].split(" ")[0])
    assert line.endswith(f"raise it to {longest} or more") and longest > 4
    assert not os.path.exists(tmp_path / "cut")
    config.task.max_target_length = longest - 2  # a few targets cut: a note, not an error
    Run(config, str(tmp_path / "some")).close()


@pytest.mark.parametrize("module", ["attn_lab.train", "attn_lab.sweep", "attn_lab.analysis", "attn_lab.reporting"])
def test_help_prints_the_usage_and_its_flags_and_exits_0(module, tmp_path):
    """Every command's --help (and -h) is its usage on stdout with exit status 0 (absl's help exits 1), speaks to
    users (no notes on the package's layers) and builds nothing."""
    for flag in ("--help", "-h"):
        proc = subprocess.run([sys.executable, "-m", module, flag], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
        assert proc.returncode == 0, proc.stderr[-1000:]
        assert "--workdir" in proc.stdout and "python -m " + module in proc.stdout
        assert "above every layer" not in proc.stdout and not os.listdir(tmp_path)


HELP_IMPORTS = """
import runpy, sys
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_module(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
print(sorted(m for m in ("jax", "flax", "tensorflow_datasets", "scipy", "orbax", "grain") if m in sys.modules))
"""


@pytest.mark.parametrize("module", ["attn_lab.train", "attn_lab.sweep", "attn_lab.analysis", "attn_lab.reporting"])
def test_help_answers_before_anything_heavy_is_imported(module):
    """--help (and a bad flag) must not wait for jax, flax, TFDS or scipy (seconds each on a loaded machine): the
    commands import them after their flags parse (the analysis methods when they run)."""
    proc = subprocess.run([sys.executable, "-c", HELP_IMPORTS, module], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-500:] + proc.stderr[-1000:]
