"""``python -m hvdtrack.evaluate --run RUN [--split test]``: edge metrics, tracks and the TrackML score.

Scores every graph of the split with the run's best checkpoint, reports edge AUC, efficiency and
purity at the threshold, builds tracks per event (walkthrough and connected components), scores
them against the events' truth (TrackML score, track efficiency, fake and duplicate rates,
efficiency vs pT and eta), and writes into ``RUN/evaluate-SPLIT/``: ``metrics.json``, PNG plots
(ROC, score distributions, efficiency vs pT and eta) and the walkthrough's TrackML submission of
each event (``submissions/event000001000-submission.csv``: event_id, hit_id, track_id); the
scalars and plots also go to ``RUN/tensorboard`` under ``evaluate/SPLIT/``.

Two TrackML scores are reported: ``trackml_score`` is TrackML's, over every hit of the event
(hits outside the graphs, e.g. below the pT cut or outside the barrel, count as missed), and
``trackml_score_in_graphs`` the same matching over the hits of the graphs, their weights
normalised to 1 (what the model could reach). Track efficiency, fake and duplicate rates use the
hits of the graphs.

Public symbols: ``evaluate_run``, ``PT_BINS``, ``ETA_BINS``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from hvdtrack.entry import run
from hvdtrack.errors import ConfigError

PT_BINS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 100.0)  # GeV
ETA_BINS = tuple(np.round(np.linspace(-4.0, 4.0, 17), 2).tolist())


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    checkpoint: str = "best",
    dataset_dir: Optional[str] = None,
    threshold: Optional[float] = None,
    pt_min: Optional[float] = None,
    min_hits: int = 5,
    min_track_hits: int = 3,
) -> dict:
    """Evaluates a run on a split and writes ``RUN/evaluate-SPLIT/`` (see the module docstring).

    Args:
      run_dir: a training run directory.
      split: the dataset split to evaluate.
      checkpoint: "best", "latest" or a checkpoint path.
      dataset_dir: the dataset (default: the run's ``data.dataset_dir``).
      threshold: edge score threshold (default: the run's first ``train.thresholds``).
      pt_min: reconstructable particles have pT > pt_min (default: the graphs' pT cut) ...
      min_hits: ... and at least this many hits in the graphs.
      min_track_hits: tracks of fewer hits are dropped.

    Returns:
      The metrics written to ``metrics.json``.

    Raises:
      ConfigError: no run directory, config or checkpoint; DataError: no such split, damaged
      records, or truth that does not fit the graphs.
    """
    import tensorflow as tf

    from hvdtrack.evaluate.inference import load_classifier, score_split
    from hvdtrack.model import metrics as edge_lib
    from hvdtrack.records.manifest import open_dataset
    from hvdtrack.tracks import building, matching, plots
    from hvdtrack.tracks.truth import check_graph_truth, load_truth
    from hvdtrack.utils.io import write_json

    started = time.perf_counter()
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(
            f"{run_dir}: no such run directory - give --run the run_dir of a trained run"
        )
    model, config = load_classifier(run_dir, checkpoint)
    data = dataclasses.replace(config.data, dataset_dir=dataset_dir or config.data.dataset_dir)
    manifest = open_dataset(data.dataset_dir, splits=[split], required=[split])
    threshold = config.train.thresholds[0] if threshold is None else threshold
    pt_min = data.graph.pt_min if pt_min is None else pt_min

    by_event: dict[int, list] = collections.defaultdict(list)
    for graph, scores in score_split(
        model, data.dataset_dir, manifest, split, config.train.batch_graphs
    ):
        by_event[graph.event_id].append((graph, scores))
    parts = [p for event in by_event.values() for p in event]
    scores = np.concatenate([s for _, s in parts])
    labels = np.concatenate([g.labels for g, _ in parts])
    edges = edge_lib.edge_metrics(scores, labels, config.train.thresholds)

    out = run_dir / f"evaluate-{split}"
    (out / "submissions").mkdir(parents=True, exist_ok=True)
    counts = {m: matching.TrackCounts() for m in building.METHODS}
    event_scores = {m: [] for m in building.METHODS}
    graph_scores = {m: [] for m in building.METHODS}
    targets = {m: [] for m in building.METHODS}  # (pt, eta, matched) of reconstructable particles
    for event_id in sorted(by_event):
        sections = by_event[event_id]
        graph = building.join_sections(
            event_id,
            *([getattr(g, f) for g, _ in sections] for f in ("hit_id", "senders", "receivers")),
            [s for _, s in sections],
            [g.labels for g, _ in sections],
        )
        truth = load_truth(data, event_id)
        check_graph_truth(graph, truth)
        particle = truth.particle_of(graph.hit_id)
        weight = truth.weight[np.searchsorted(truth.hit_id, graph.hit_id)]
        for method in building.METHODS:
            track = building.build_tracks(graph, threshold, method, min_track_hits)
            frame = building.submission(event_id, truth.hit_id, graph.hit_id, track)
            event_scores[method].append(
                matching.trackml_score(
                    frame["track_id"].to_numpy(), truth.particle_id, truth.weight
                )
            )
            graph_scores[method].append(
                matching.trackml_score(track, particle, weight) / weight.sum()
                if weight.sum()
                else 0.0
            )
            match = matching.match_tracks(track, particle)
            pt, eta = truth.kinematics_of(match.particle_id)
            counts[method] += matching.count_tracks(match, pt, pt_min, min_hits)
            target = matching.reconstructable(match, pt, pt_min, min_hits)
            targets[method].append(
                np.stack([pt[target], eta[target], match.particle_matched[target]])
            )
            if method == building.METHODS[0]:
                frame.to_csv(
                    out / "submissions" / f"event{event_id:09d}-submission.csv", index=False
                )

    tracks = {}
    for method in building.METHODS:
        pt, eta, found = np.concatenate(targets[method], axis=1)
        tracks[method] = {
            "trackml_score": float(np.mean(event_scores[method])),
            "trackml_score_in_graphs": float(np.mean(graph_scores[method])),
            **counts[method].rates(),
            **dataclasses.asdict(counts[method]),
            "trackml_score_per_event": [round(s, 6) for s in event_scores[method]],
            "efficiency_vs_pt": matching.binned_efficiency(pt, found > 0, PT_BINS),
            "efficiency_vs_eta": matching.binned_efficiency(eta, found > 0, ETA_BINS),
        }
    result = {
        "run_dir": str(run_dir),
        "split": split,
        "checkpoint": checkpoint,
        "step": _checkpoint_step(run_dir, checkpoint),
        "dataset_dir": str(data.dataset_dir),
        "events": len(by_event),
        "graphs": len(parts),
        "threshold": threshold,
        "reconstructable": {"pt_min": pt_min, "min_hits": min_hits},
        "min_track_hits": min_track_hits,
        "submissions_from": building.METHODS[0],
        "edges": edges,
        "tracks": tracks,
    }
    title = f"{run_dir.name}, {split} split"
    figures = {
        "roc": plots.roc_png(*edge_lib.roc_curve(scores, labels), edges["auc"], title),
        "scores": plots.score_histogram_png(scores, labels, threshold, title),
        "efficiency_pt": plots.efficiency_png(
            {m: t["efficiency_vs_pt"] for m, t in tracks.items()}, "particle pT (GeV)", title, True
        ),
        "efficiency_eta": plots.efficiency_png(
            {m: t["efficiency_vs_eta"] for m, t in tracks.items()}, "particle eta", title, False
        ),
    }
    for name, png in figures.items():
        (out / f"{name}.png").write_bytes(png)
    with tf.summary.create_file_writer(str(run_dir / "tensorboard")).as_default(
        step=result["step"]
    ):
        prefix = f"evaluate/{split}"
        for key in ("auc", "efficiency", "purity"):
            tf.summary.scalar(f"{prefix}/edge_{key}", edges[key])
        for method, values in tracks.items():
            for key in (
                "trackml_score",
                "trackml_score_in_graphs",
                "efficiency",
                "fake_rate",
                "duplicate_rate",
            ):
                tf.summary.scalar(f"{prefix}/{method}/{key}", values[key])
        for name, png in figures.items():
            tf.summary.image(f"{prefix}/{name}", tf.image.decode_png(png)[None])
    result["seconds"] = round(time.perf_counter() - started, 2)
    write_json(out / "metrics.json", result)
    return result


def _checkpoint_step(run_dir: Path, checkpoint: str) -> int:
    """The optimizer step a checkpoint is numbered by (``ckpt-480``), 0 when unnumbered."""
    import tensorflow as tf

    folder = {"best": run_dir / "best", "latest": run_dir / "checkpoints"}.get(checkpoint)
    path = tf.train.latest_checkpoint(str(folder)) if folder is not None else checkpoint
    found = re.search(r"ckpt-(\d+)$", path or "")
    return int(found.group(1)) if found else 0


def summary_lines(result: dict) -> list[str]:
    """The console report of ``evaluate_run``'s result."""
    e = result["edges"]
    lines = [
        f"[evaluate] {result['run_dir']} {result['split']}: {result['events']} events, "
        f"{result['graphs']} graphs, {int(e['num_edges'])} edges, threshold {result['threshold']:g}",
        f"  edges : AUC {e['auc']:.4f}, efficiency {e['efficiency']:.4f}, purity {e['purity']:.4f}",
    ]
    for method, t in result["tracks"].items():
        lines.append(
            f"  tracks ({method}): TrackML score {t['trackml_score']:.4f} "
            f"(in the graphs {t['trackml_score_in_graphs']:.4f}), efficiency {t['efficiency']:.4f} "
            f"({t['reconstructed']}/{t['reconstructable']}), fake rate {t['fake_rate']:.4f}, "
            f"duplicate rate {t['duplicate_rate']:.4f} ({t['tracks']} tracks)"
        )
    lines.append(
        f"  written: {result['run_dir']}/evaluate-{result['split']}/ ({result['seconds']} s)"
    )
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="hvdtrack evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a training run directory (train.run_dir)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--checkpoint", default="best", help="best, latest, or a checkpoint path")
    parser.add_argument("--dataset-dir", default=None, help="default: the run's data.dataset_dir")
    parser.add_argument(
        "--threshold", type=float, default=None, help="default: train.thresholds[0]"
    )
    parser.add_argument("--pt-min", type=float, default=None, help="default: data.graph.pt_min")
    parser.add_argument(
        "--min-hits", type=int, default=5, help="hits of a reconstructable particle"
    )
    parser.add_argument("--min-track-hits", type=int, default=3, help="shorter tracks are dropped")
    args = parser.parse_args(argv)
    result = evaluate_run(
        args.run, args.split, args.checkpoint, args.dataset_dir, args.threshold,
        args.pt_min, args.min_hits, args.min_track_hits,
    )  # fmt: skip
    print("\n".join(summary_lines(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
