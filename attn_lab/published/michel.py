"""Head importance and pruning: Michel et al. 2019 ("Are Sixteen Heads Really Better than One?", NeurIPS) and Voita
et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned",
ACL). Checked against the papers' text: docs/published.md (Voita et al. not yet)."""

# Michel et al. 2019, Table 2: all-but-one head per layer, delta BLEU (WMT EN-FR, 6 layers x 16 heads);
# True = significant (p < 0.01). Kinds named as in attn_lab (encoder_self = Enc-Enc, cross = Enc-Dec,
# decoder_self = Dec-Dec).
MICHEL_ALL_BUT_ONE = {
    "encoder_self": [(-1.31, True), (-0.16, False), (0.12, False), (-0.15, False), (0.02, False), (-0.36, True)],
    "cross": [(0.24, True), (0.06, False), (0.05, False), (-0.24, False), (-1.55, True), (-13.56, True)],
    "decoder_self": [(-0.03, False), (0.12, False), (0.18, False), (0.17, False), (-0.04, False), (0.24, False)],
}
# Michel et al. 2019, Section 3.2 and Table 1: one head masked at a time (WMT EN-FR encoder).
MICHEL_SINGLE_HEAD = "8 of 96 encoder heads change BLEU significantly when masked alone (-0.53 to +0.24; base 36.05)"
# Michel et al. 2019, Section 4.2 (Figure 3-4): iterative pruning by importance.
MICHEL_PRUNING = "~20% (WMT) / ~40% (BERT) of heads removable by importance without noticeable loss, then a sharp drop"
# Michel et al. 2019, Table 4: inference speed of BERT with 50% of its heads pruned.
MICHEL_SPEED = "50% of BERT's heads pruned: +17.5% examples/s at batch 64 (124.7 -> 146.6), +1.9% at batch 1"
# Voita et al. 2019, all attention types pruned with L0 gates, WMT EN-RU: heads kept (enc, dec, dec-enc) -> BLEU.
VOITA_GATES = [((48, 48, 48), 29.6), ((14, 31, 30), 29.62), ((12, 21, 25), 29.36), ((8, 13, 15), 29.06),
               ((5, 9, 12), 28.90)]
