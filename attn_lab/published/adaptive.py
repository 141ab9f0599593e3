"""Dynamic attention: Correia et al. 2019 ("Adaptively Sparse Transformers", alpha-entmax) and Sukhbaatar et al.
2019 ("Adaptive Attention Span in Transformers"). Checked against the papers' text where a copy was found:
docs/published.md."""

# Correia et al. 2019, Table 1: test BLEU with softmax, 1.5-entmax and alpha-entmax (learned alpha). Copied from
# memory of the paper: the PDF could not be read where this was written, so check before citing
# (aclanthology.org/D19-1223; docs/published.md: no copy of its tables found).
CORREIA_BLEU = {"IWSLT17 de-en": (29.79, 29.83, 29.90), "KFTT ja-en": (21.57, 22.13, 21.74),
                "WMT16 ro-en": (32.70, 33.10, 32.89), "WMT14 en-de": (26.02, 25.89, 26.93)}
CORREIA_COLUMN = {"softmax": 0, "entmax15": 1, "entmax_learned": 2}  # an arm's column of CORREIA_BLEU
# Correia et al. 2019: their learned-alpha finding, per attention kind (from memory, as CORREIA_BLEU).
CORREIA_ALPHA = ("learned alpha: encoder self-attention bimodal (a sparse mode near 2, a dense one between softmax "
                 "and 1.5-entmax); decoder self and context attention one mode each")
# Sukhbaatar et al. 2019, Tables 1-2 (test bpc of the adaptive-span models; also the facebookresearch/adaptive-span
# README).
SUKHBAATAR = {"text8 12L": 1.11, "enwik8 12L": 1.02, "text8 24L": 1.07, "enwik8 24L": 0.98}
# Sukhbaatar et al. 2019, Table 1: average span of the text8 models, in tokens of a maximum span S = 8192 (the 24L
# one as docs/published.md checked it).
SUKHBAATAR_AVERAGE_SPAN = {"text8 12L": 314, "text8 24L": 245}
SUKHBAATAR_MAX_SPAN = 8192
# Sukhbaatar et al. 2019, Section 3 and Figure 4: where the learned spans end up (docs/published.md: confirmed).
SUKHBAATAR_SPAN = ("small context in the low-level layers and very large ones for the last layers; only a few "
                   "heads use a long span (average span ~300 of a maximum of 8192 tokens)")
