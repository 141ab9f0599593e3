"""Published numbers printed beside ours in the result tables (copied from the papers; see each comment).

Our tasks are far smaller than the papers', so tables compare shapes and ratios -- which setting wins, and by how
much relative to seed spread -- not absolute BLEU.
"""

# Vaswani et al. 2017, Table 3 rows (A) and (B), EN-DE newstest2013 dev: (h, d_k) -> (PPL, BLEU).
VASWANI_TABLE3 = {
    (1, 512): (5.29, 24.9), (4, 128): (5.00, 25.5), (8, 64): (4.92, 25.8), (16, 32): (4.91, 25.8),
    (32, 16): (5.01, 25.4),
    # rows (B): h = 8, smaller d_k (d_v = 64)
    (8, 16): (5.16, 25.1), (8, 32): (5.01, 25.4),
}
VASWANI_NOTE = "Single-head attention is 0.9 BLEU worse than the best setting; quality also drops with too many heads."

# Shazeer 2019, Table 1 (WMT14 EN-DE dev): multi-head h=8 vs multi-query; Ainslie et al. 2023 (T5-XXL, avg score).
MULTI_QUERY = {"mha": {"bleu": 26.7, "ln_ppl": 1.424}, "mqa": {"bleu": 26.5, "ln_ppl": 1.439}}
GROUPED_QUERY = {"mha": 47.2, "gqa8": 47.1, "mqa": 46.6}

# Michel et al. 2019, Table 2: all-but-one head per layer, delta BLEU (WMT EN-FR, 6 layers x 16 heads);
# True = significant. Kinds named as in attn_lab (encoder_self = Enc-Enc, cross = Enc-Dec, decoder_self = Dec-Dec).
MICHEL_ALL_BUT_ONE = {
    "encoder_self": [(-1.31, True), (-0.16, False), (0.12, False), (-0.15, False), (0.02, False), (-0.36, True)],
    "cross": [(0.24, True), (0.06, False), (0.05, False), (-0.24, False), (-1.55, True), (-13.56, True)],
    "decoder_self": [(-0.03, False), (0.12, False), (0.18, False), (0.17, False), (-0.04, False), (0.24, False)],
}
MICHEL_SINGLE_HEAD = "8 of 96 encoder heads change BLEU significantly when masked alone (-0.53 to +0.24; base 36.05)"
MICHEL_PRUNING = "~20% (WMT) / ~40% (BERT) of heads removable by importance without noticeable loss, then a sharp drop"
MICHEL_SPEED = "50% of BERT's heads pruned: +17.5% examples/s at batch 64 (124.7 -> 146.6), +1.9% at batch 1"

# Voita et al. 2019, all attention types, WMT EN-RU: heads kept (enc, dec, dec-enc) -> BLEU.
VOITA_GATES = [((48, 48, 48), 29.6), ((14, 31, 30), 29.62), ((12, 21, 25), 29.36), ((8, 13, 15), 29.06),
               ((5, 9, 12), 28.90)]

# Li et al. 2018 (disagreement regularization, lambda = 1; from a secondary write-up): BLEU base -> regularized.
LI_DIVERSITY = {"zh-en base": (24.13, 24.85), "en-de base": (27.64, 28.51), "en-de big": (28.58, 29.28)}

# Long Range Arena (Tay et al. 2020): ListOps accuracy (%), and speed / memory vs the Transformer at 1K and 4K
# (byte-level text, batch 32, TPU v3; memory = Transformer's peak / the model's).
LRA_LISTOPS = {"dense": 36.37, "local": 15.82, "linformer": 35.70, "lsh": 37.27, "bigbird": 36.05, "linear": 16.13,
               "performer": 18.01, "longformer": 35.63, "strided": 17.07}
LRA_SPEED = {"dense": (1.0, 1.0), "local": (1.1, 5.3), "linformer": (1.2, 5.5), "lsh": (0.5, 0.8),
             "bigbird": (0.9, 1.1), "linear": (1.1, 5.6), "performer": (1.2, 5.7)}
LRA_MEMORY = {"dense": (1.0, 1.0), "local": (0.85 / 0.42, 9.48 / 1.37), "linformer": (0.85 / 0.37, 9.48 / 0.99),
              "lsh": (0.85 / 0.48, 9.48 / 2.28), "bigbird": (0.85 / 0.77, 9.48 / 2.88),
              "linear": (0.85 / 0.37, 9.48 / 1.03), "performer": (0.85 / 0.37, 9.48 / 1.06)}
