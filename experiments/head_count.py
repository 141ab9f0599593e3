"""Head-count ablation (Vaswani et al. 2017, Table 3 rows A): vary heads at a fixed model width on `numbers`.

  python scripts/sweep.py --config experiments/head_count.py:quick --workdir runs/head_count
"""


def get_experiment(preset: str = "quick") -> dict:
    """'quick': 4 head counts x 1 seed, short runs; 'full': 1-16 heads, fixed-d_k variant zipped, 3 seeds."""
    if preset == "quick":
        return {"name": "head_count_quick", "config": "configs/numbers.py:quick",
                "overrides": {"train.num_steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300},
                "grid": {"model.num_heads": [1, 2, 4, 8]}, "seeds": [0]}
    if preset == "full":
        return {"name": "head_count_full", "config": "configs/numbers.py",
                "zip": [{"model.num_heads": [1, 2, 4, 8, 16], "model.head_dim": [128, 64, 32, 16, 8]}],
                "seeds": [0, 1, 2]}
    raise ValueError(f"unknown preset '{preset}' for experiments/head_count.py; use quick or full")
