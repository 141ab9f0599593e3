"""Head importance and pruning (Michel et al. 2019) and L0 gates (Voita et al. 2019) on numbers translation.

  python scripts/sweep.py --config experiments/pruning.py:quick --workdir runs/pruning --vmap-seeds
  python scripts/make_tables.py runs/pruning

Trains the baseline (one trial per seed), then runs scripts/analyze_heads.py on each: single-head masking and
all-but-one tables, pruning curves (importance vs reverse vs random), the structural speed-up at 50% of heads,
and gates trained from the baseline to keep 50% and 25% of heads.
"""


def get_experiment(preset: str = "quick") -> dict:
    """'quick': the numbers quick model (4 heads x 2 layers x 3 kinds), exact match scored by greedy decoding."""
    analyze = {"what": "ablate,prune,structural,gates", "metric": "exact_match", "max_batches": 2,
               "gate_targets": "0.5,0.25"}
    if preset == "quick":
        return {"name": "pruning_quick", "config": "configs/numbers.py:quick", "report": "pruning",
                "overrides": {"train.num_steps": 600}, "variants": {"baseline": {}}, "seeds": [0, 1, 2],
                "analyze": analyze | {"gate_steps": 300}}
    if preset == "full":
        return {"name": "pruning_full", "config": "configs/numbers.py", "report": "pruning",
                "overrides": {"model.num_heads": 8}, "variants": {"baseline": {}}, "seeds": [0, 1, 2],
                "analyze": analyze | {"max_batches": 8, "gate_steps": 2000, "metric": "bleu"}}
    raise ValueError(f"unknown preset '{preset}' for experiments/pruning.py; use quick or full")
