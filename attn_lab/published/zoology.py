"""Associative recall: Zoology (Arora et al. 2023, arXiv 2312.04927, Figure 2) and Based (Arora et al. 2024, arXiv
2402.18668, Figures 2-3). Both are plots: these values were read from the figures and from the public configs
(HazyResearch/zoology: zoology/experiments/iclr24_zoology_figure2, arxiv24_based_figure2/3), not copied from a
table -- check the figures before citing them (docs/recall.md, "What the papers report")."""

# Zoology Figure 2: MQAR recall per mixer against (T, N) at d_model 64-512.
ZOOLOGY = ("attention ~1.0 at every size; at d_model 64 the gated-convolution mixers (H3, Hyena, RWKV, BaseConv) "
           "~0.5-0.9 at T=64, 0.18-0.37 at T=128, <= 0.15 at T=256 (read from Figure 2)")
# Based Figure 2 (sliding window) and Figure 3 (linear attention's feature maps against state size).
BASED = ("sliding-window recall grows with the window; linear attention's recall grows with its state size "
         "(Performer, CosFormer, ReLU, Taylor feature maps; Figures 2-3)")
