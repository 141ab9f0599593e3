"""Head count: Vaswani et al. 2017 (Table 3), Shazeer 2019 (Table 1), Ainslie et al. 2023 (Table 1); and the
h-versus-D transition of arXiv 2510.06662. Checked against the papers' text: docs/published.md."""

# Vaswani et al. 2017, Table 3 rows (A) and (B), EN-DE newstest2013 dev: (h, d_k) -> (PPL, BLEU).
TABLE3 = {(1, 512): (5.29, 24.9), (4, 128): (5.00, 25.5), (8, 64): (4.92, 25.8), (16, 32): (4.91, 25.8),
          (32, 16): (5.01, 25.4), (8, 16): (5.16, 25.1), (8, 32): (5.01, 25.4)}
# Section 6.1: the decoding its test numbers use (validation decodes greedily here: beam 4 costs ~6x greedy).
BEAM = {"eval.beam_size": 4, "eval.length_penalty": 0.6, "eval.validation_beam_size": 1}
# Shazeer 2019, Table 1 (WMT14 EN-DE dev, greedy; ln PPL per subword): multi-head h = 8 vs multi-query.
MULTI_QUERY = {"mha": {"bleu": 26.7, "ln_ppl": 1.424}, "mqa": {"bleu": 26.5, "ln_ppl": 1.439}}
# Ainslie et al. 2023, Table 1 (T5-XXL uptrained for 5% of pre-training; average score).
GROUPED_QUERY = {"mha": 47.2, "gqa8": 47.1, "mqa": 46.6}
SHARP = ("arXiv 2510.06662: with h < D heads the parameters needed grow exponentially in T, with h >= D they do not; "
         "its synthetic retrieval shows a transition at h = D (T 8-128, hidden size 32).")


def vs(a: tuple[int, int], b: tuple[int, int] = (8, 64), column: int = 1) -> str:
    """``'24.9 vs 25.8 BLEU'`` (column 1) or ``'PPL 5.29 vs 4.92'`` (column 0): two rows of Table 3."""
    x, y = TABLE3[a][column], TABLE3[b][column]
    return f"{x} vs {y} BLEU" if column else f"PPL {x:.2f} vs {y:.2f}"
