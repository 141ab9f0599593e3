"""Head-diversity regularizers (Li et al. 2018; a map-cosine hinge) against the baseline, on numbers translation.

  python scripts/sweep.py --config experiments/diversity.py:quick --workdir runs/diversity --vmap-seeds
  python scripts/make_tables.py runs/diversity

Per variant: BLEU and exact match, the mean pairwise similarity of head attention maps (analyze_heads diagnose),
and how many heads can be pruned (importance order) within 1 BLEU of the unpruned model.
"""

WEIGHTS = {"map_cosine": 0.01, "subspace": 1.0, "position": 1.0, "output": 1.0}  # Li et al.: lambda = 1
# weight 1 here is not lambda 1 in the paper: pairs i<j are averaged and `position` is averaged over query rows,
# so weight = lambda (N-1)/N (subspace, output) or lambda T (N-1)/N (position); see attn_lab/train/diversity.py


def get_experiment(preset: str = "quick") -> dict:
    """'quick': baseline + the three Li et al. regularizers (subspace, position, output), 300 steps, 3 seeds;
    'full': every regularizer, full numbers runs."""
    names = ["subspace", "position", "output"] if preset == "quick" else list(WEIGHTS)
    variants = {"baseline": {}} | {n: {f"loss.diversity.{n}.weight": WEIGHTS[n]} for n in names}
    analyze = {"what": "diagnose,prune", "metric": "bleu", "max_batches": 2, "prune_fraction": 0.125}
    if preset == "quick":
        return {"name": "diversity_quick", "config": "configs/numbers.py:quick", "report": "diversity",
                "overrides": {"train.num_steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300},
                "variants": variants, "seeds": [0, 1, 2], "analyze": analyze}
    if preset == "full":
        return {"name": "diversity_full", "config": "configs/numbers.py", "report": "diversity",
                "variants": variants, "seeds": [0, 1, 2], "analyze": analyze | {"max_batches": 8}}
    raise ValueError(f"unknown preset '{preset}' for experiments/diversity.py; use quick or full")
