"""Evaluation figures as PNG bytes: ROC curve, edge score distributions, efficiency vs pT and eta.

matplotlib is imported (with the Agg backend) only when a figure is drawn.

Public symbols: ``roc_png``, ``score_histogram_png``, ``efficiency_png``.
"""

from __future__ import annotations

import io
from typing import Mapping

import numpy as np


def roc_png(fpr: np.ndarray, tpr: np.ndarray, auc: float, title: str) -> bytes:
    """ROC curve (true vs false positive rate of the edges), log-scaled false positive axis."""
    fig, ax = _figure()
    ax.plot(np.maximum(fpr, 1e-6), tpr, label=f"AUC {auc:.4f}")
    ax.set(xscale="log", xlim=(1e-4, 1), ylim=(0, 1.01), title=title)
    ax.set(xlabel="false positive rate (fake edges kept)", ylabel="true positive rate (efficiency)")
    ax.legend(loc="lower right")
    return _png(fig)


def score_histogram_png(
    scores: np.ndarray, labels: np.ndarray, threshold: float, title: str
) -> bytes:
    """Score distributions of true and fake edges, log counts, with the threshold marked."""
    fig, ax = _figure()
    bins = np.linspace(0, 1, 51)
    truth = np.asarray(labels) > 0.5
    ax.hist(scores[truth], bins, histtype="step", label=f"true edges ({truth.sum()})")
    ax.hist(scores[~truth], bins, histtype="step", label=f"fake edges ({(~truth).sum()})")
    ax.axvline(threshold, color="grey", linestyle="--", label=f"threshold {threshold:g}")
    ax.set(yscale="log", xlabel="edge score", ylabel="edges", title=title)
    ax.legend(loc="upper center")
    return _png(fig)


def efficiency_png(curves: Mapping[str, Mapping], xlabel: str, title: str, log_x: bool) -> bytes:
    """Track efficiency per bin with binomial errors, one curve per track building method.

    Args:
      curves: ``{method: matching.binned_efficiency(...)}``.
    """
    fig, ax = _figure()
    for name, curve in curves.items():
        edges = np.asarray(curve["edges"], np.float64)
        finite = np.where(np.isfinite(edges), edges, edges[np.isfinite(edges)].max() * 2)
        centres = (finite[:-1] + finite[1:]) / 2
        ax.errorbar(
            centres,
            curve["efficiency"],
            yerr=curve["error"],
            xerr=(finite[1:] - finite[:-1]) / 2,
            fmt="o",
            label=name,
        )
    ax.set(xlabel=xlabel, ylabel="track efficiency", ylim=(0, 1.05), title=title)
    if log_x:
        ax.set_xscale("log")
    ax.legend(loc="lower right")
    return _png(fig)


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt.subplots(figsize=(6, 4.5), dpi=100)


def _png(fig) -> bytes:
    from matplotlib import pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
