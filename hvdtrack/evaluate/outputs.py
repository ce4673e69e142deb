"""What an evaluation writes besides ``metrics.json``: the PNG plots, and the scalars and plots
in the run's TensorBoard log under ``evaluate/SPLIT/``.

Public symbols: ``make_figures``, ``write_figures``, ``write_tensorboard``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import tensorflow as tf

from hvdtrack.model import metrics as edge_lib
from hvdtrack.tracks import plots

TRACK_SCALARS = (
    "trackml_score",
    "trackml_score_in_graphs",
    "efficiency",
    "fake_rate",
    "duplicate_rate",
)


def make_figures(
    scores: np.ndarray,
    labels: np.ndarray,
    edges: Mapping[str, float],
    tracks: Mapping[str, dict],
    threshold: float,
    title: str,
) -> dict[str, bytes]:
    """The PNG plots by name: ROC, score distributions, track efficiency vs pT and eta."""
    return {
        "roc": plots.roc_png(*edge_lib.roc_curve(scores, labels), edges["auc"], title),
        "scores": plots.score_histogram_png(scores, labels, threshold, title),
        "efficiency_pt": plots.efficiency_png(
            {m: t["efficiency_vs_pt"] for m, t in tracks.items()}, "particle pT (GeV)", title, True
        ),
        "efficiency_eta": plots.efficiency_png(
            {m: t["efficiency_vs_eta"] for m, t in tracks.items()}, "particle eta", title, False
        ),
    }


def write_figures(out: Path, figures: Mapping[str, bytes]) -> None:
    """Writes ``out/NAME.png`` of each figure."""
    for name, png in figures.items():
        (out / f"{name}.png").write_bytes(png)


def write_tensorboard(
    directory: Path,
    split: str,
    step: int,
    edges: Mapping[str, float],
    tracks: Mapping[str, dict],
    figures: Mapping[str, bytes],
) -> None:
    """Edge and track scalars and the figures into the TensorBoard log ``directory`` at
    ``step``."""
    with tf.summary.create_file_writer(str(directory)).as_default(step=step):
        prefix = f"evaluate/{split}"
        for key in ("auc", "efficiency", "purity"):
            tf.summary.scalar(f"{prefix}/edge_{key}", edges[key])
        for method, values in tracks.items():
            for key in TRACK_SCALARS:
                tf.summary.scalar(f"{prefix}/{method}/{key}", values[key])
        for name, png in figures.items():
            tf.summary.image(f"{prefix}/{name}", tf.image.decode_png(png)[None])
