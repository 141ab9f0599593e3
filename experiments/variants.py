"""Efficient attention on ListOps at sequence length >= 1K (Long Range Arena style), one trial per kernel.

  python scripts/sweep.py --config experiments/variants.py:quick --workdir runs/variants --vmap-seeds
  python scripts/bench_attention.py --out bench/attention     # speed and memory ratios for the same kernels
  python scripts/make_tables.py runs/variants --bench bench/attention.csv
"""

KERNELS = ["dense", "local", "linformer", "performer", "linear", "bigbird", "longformer", "lsh", "strided"]


def get_experiment(preset: str = "quick") -> dict:
    """'quick': sequences of 1000-1024 tokens, a small model, 150 steps, 5 kernels, 2 seeds; 'full': LRA's
    ListOps (depth 10, length up to 2000), every kernel, 3 seeds."""
    if preset == "quick":
        return {"name": "variants_quick", "config": "configs/listops.py:quick", "report": "variants",
                "overrides": {"task.min_length": 1000, "task.max_length": 1024, "task.max_depth": 8,
                              "task.num_train": 2400, "task.num_validation": 200, "task.num_test": 200,
                              "model.attention.linformer.max_len": 1025, "model.num_layers": 1,
                              "train.batch_size": 16, "train.num_steps": 150, "train.warmup_steps": 30,
                              "train.eval_every": 150, "train.checkpoint_every": 150},
                "variants": {k: {"model.attention.name": k} for k in KERNELS[:5]}, "seeds": [0, 1]}
    if preset == "full":
        return {"name": "variants_full", "config": "configs/listops.py", "report": "variants",
                "overrides": {"task.min_length": 500, "task.max_length": 2000, "task.max_depth": 10,
                              "model.attention.linformer.max_len": 2001},
                "variants": {k: {"model.attention.name": k} for k in KERNELS}, "seeds": [0, 1, 2]}
    raise ValueError(f"unknown preset '{preset}' for experiments/variants.py; use quick or full")
