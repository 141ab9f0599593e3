"""Head-count ablation (Vaswani et al. 2017, Table 3): numbers translation, one sweep for every row.

  python scripts/sweep.py --config experiments/head_count.py:quick --workdir runs/head_count --vmap-seeds
  python scripts/make_tables.py runs/head_count

Rows ``A-h<h>``: h heads at a fixed width, d_k = d_model / h (Table 3 rows A). Rows ``B-h<h>``: d_k fixed at the
A-h4 value while h varies (rows B style: capacity grows with h). ``MQA-h8`` / ``GQA-h8-kv2``: 8 query heads
sharing 1 or 2 key/value heads (Shazeer 2019; Ainslie et al. 2023).
"""


def _rows(d_model: int, heads: list[int], fixed_dk: int, b_heads: list[int]) -> dict:
    rows = {f"A-h{h}": {"model.num_heads": h, "model.head_dim": d_model // h} for h in heads}
    rows |= {f"B-h{h}": {"model.num_heads": h, "model.head_dim": fixed_dk} for h in b_heads}
    rows["MQA-h8"] = {"model.num_heads": 8, "model.head_dim": d_model // 8, "model.num_kv_heads": 1}
    rows["GQA-h8-kv2"] = {"model.num_heads": 8, "model.head_dim": d_model // 8, "model.num_kv_heads": 2}
    return rows


def get_experiment(preset: str = "quick") -> dict:
    """'quick': d_model 64, h in 1..16, 300 steps, 3 seeds; 'full': d_model 128, h in 1..32, 4000 steps, 3 seeds;
    'bible': one head vs eight (Table 3's largest gap) on French -> English bible translation, 3 seeds (about 8.5
    minutes per run on 2 CPU cores); 'bible_all': every row on bible (24 runs)."""
    if preset == "quick":
        return {"name": "head_count_quick", "config": "configs/numbers.py:quick", "report": "head_count",
                "overrides": {"train.num_steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300},
                "variants": _rows(64, [1, 2, 4, 8, 16], 16, [1, 2, 8]), "seeds": [0, 1, 2]}
    if preset in ("bible", "bible_all"):  # French -> English verses, SentencePiece, d_model 128 (configs/bible.py)
        rows = _rows(128, [1, 2, 4, 8], 32, [1, 2])
        rows = rows if preset == "bible_all" else {k: rows[k] for k in ("A-h1", "A-h8")}
        return {"name": f"head_count_{preset}", "config": "configs/bible.py:quick", "report": "head_count",
                "variants": rows, "seeds": [0, 1, 2]}
    if preset == "full":
        return {"name": "head_count_full", "config": "configs/numbers.py", "report": "head_count",
                "variants": _rows(128, [1, 2, 4, 8, 16, 32], 32, [1, 2, 8, 16]), "seeds": [0, 1, 2]}
    raise ValueError(f"unknown preset '{preset}' for experiments/head_count.py; use quick, full, bible or bible_all")
