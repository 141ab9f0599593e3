"""Evaluation metrics: token/class accuracy from summed step outputs, BLEU (sacrebleu) and exact match."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sacrebleu


def summarize(sums: dict) -> dict[str, float]:
    """Step sums -> mean loss and accuracy (per target token for translation, per example for classification)."""
    weight = max(float(sums["weight"]), 1.0)
    return {"loss": float(sums["loss"]) / weight, "accuracy": float(sums["correct"]) / weight}


def translation_scores(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a") -> dict:
    """Corpus BLEU and exact match of decoded strings.

    ``tokenize='char'`` scores characters: single-word targets (German numbers are one compound word) would
    otherwise have no 2-4-grams and score BLEU 0 even when half of them are right.
    """
    bleu = sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize)
    exact = np.mean([h == r for h, r in zip(hypotheses, references)]) if references else 0.0
    return {"bleu": float(bleu.score), "exact_match": float(exact)}
