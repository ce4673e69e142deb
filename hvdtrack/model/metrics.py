"""Exact edge-classification metrics over a whole (gathered) validation set: numpy only."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve, exactly (Mann-Whitney U with ties counted as one half).

    Args:
      scores: float [E], higher means "true".
      labels: [E], 1 for true edges and 0 for fake ones.

    Returns:
      The AUC, or NaN if one of the classes is absent.
    """
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels) > 0.5
    num_pos = int(labels.sum())
    num_neg = labels.size - num_pos
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Average 1-based ranks over runs of equal scores.
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg_rank = first + (counts + 1) / 2.0
    ranks = np.empty_like(scores)
    ranks[order] = np.repeat(avg_rank, counts)
    u = ranks[labels].sum() - num_pos * (num_pos + 1) / 2.0
    return float(u / (num_pos * num_neg))


def roc_curve(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve: false and true positive rates, float64 [K + 1] each, from (0, 0) to (1, 1),
    one point per distinct score (``scores >= s`` counted as positive)."""
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels) > 0.5
    order = np.argsort(-scores, kind="mergesort")
    tp = np.cumsum(labels[order])
    fp = np.cumsum(~labels[order])
    last = np.r_[np.flatnonzero(np.diff(scores[order])), scores.size - 1] if scores.size else []
    tp, fp = np.r_[0, tp[last]], np.r_[0, fp[last]]
    with np.errstate(invalid="ignore", divide="ignore"):
        return fp / max(fp[-1], 1), tp / max(tp[-1], 1)


def threshold_counts(scores: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, int]:
    """True/false positive/negative counts of ``scores > threshold`` against ``labels``."""
    predicted = np.asarray(scores) > threshold
    truth = np.asarray(labels) > 0.5
    tp = int(np.count_nonzero(predicted & truth))
    fp = int(np.count_nonzero(predicted & ~truth))
    fn = int(np.count_nonzero(~predicted & truth))
    return {"tp": tp, "fp": fp, "fn": fn, "tn": int(truth.size - tp - fp - fn)}


def edge_metrics(
    scores: np.ndarray, labels: np.ndarray, thresholds: Sequence[float] = (0.5,)
) -> dict[str, float]:
    """Efficiency (recall), purity (precision) and accuracy at each threshold, and the AUC.

    Keys: ``auc``, and per threshold ``efficiency@0.5``, ``purity@0.5``, ``accuracy@0.5``;
    the first threshold is also reported without suffix (``efficiency`` ...).
    """
    out: dict[str, float] = {"auc": roc_auc(scores, labels), "num_edges": float(np.size(labels))}
    for i, threshold in enumerate(thresholds):
        c = threshold_counts(scores, labels, threshold)
        total = c["tp"] + c["fp"] + c["fn"] + c["tn"]
        values = {
            "efficiency": c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else float("nan"),
            "purity": c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else float("nan"),
            "accuracy": (c["tp"] + c["tn"]) / total if total else float("nan"),
        }
        for name, value in values.items():
            out[f"{name}@{threshold:g}"] = value
            if i == 0:
                out[name] = value
    return out
