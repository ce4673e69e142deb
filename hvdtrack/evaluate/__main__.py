"""``python -m hvdtrack.evaluate --run RUN [--split test]``: edge metrics, tracks and the TrackML score.

Scores every graph of the split with the run's best checkpoint, reports edge AUC, efficiency and
purity at the threshold, builds tracks per event (chains of crossings joined across gaps, and connected components), scores
them against the events' truth (TrackML score, track efficiency, fake and duplicate rates,
efficiency vs pT and eta), and writes into ``RUN/evaluate-SPLIT/``: ``metrics.json``, PNG plots
(ROC, score distributions, efficiency vs pT and eta) and the chain builder's TrackML submission of
each event (``submissions/event000001000-submission.csv``: event_id, hit_id, track_id); the
scalars and plots also go to ``RUN/tensorboard`` under ``evaluate/SPLIT/``. ``--output DIR``
writes all of it into DIR instead (DIR/tensorboard), e.g. for a read-only run directory; an
output that cannot be written is refused before scoring. ``--threshold`` must lie in (0, 1).
A run whose run.json says it has not finished is evaluated with a warning naming its status
and the checkpoint's step (also kept in metrics.json as ``warning``); ``checkpoint_path`` and
``step`` there name the checkpoint scored.

Two TrackML scores are reported: ``trackml_score`` is TrackML's, over every hit of the event
(hits outside the graphs, e.g. below the pT cut or outside the barrel, count as missed), and
``trackml_score_in_graphs`` the same matching over the hits of the graphs, their weights
normalised to 1 (what the model could reach). Track efficiency, fake and duplicate rates use the
hits of the graphs.

The evaluation itself is ``hvdtrack.evaluate.run.evaluate_run``. Public symbols: ``summary_lines``,
``main``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from hvdtrack.entry import run


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
    lines.append(f"  written: {result['out']}/ ({result['seconds']} s)")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="hvdtrack evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a training run directory (train.run_dir)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--checkpoint", default="best", help="best, latest, or a checkpoint path")
    parser.add_argument(
        "--dataset-dir",
        default=None,
        help="default: the run's data.dataset_dir; another dataset's truth and pT cut come from "
        "its prepare.json, and its evaluation goes to RUN/evaluate-DATASET-SPLIT",
    )
    parser.add_argument(
        "--threshold", type=float, default=None, help="default: train.thresholds[0]"
    )
    parser.add_argument("--pt-min", type=float, default=None, help="default: data.graph.pt_min")
    parser.add_argument(
        "--min-hits", type=int, default=5, help="hits of a reconstructable particle"
    )
    parser.add_argument("--min-track-hits", type=int, default=3, help="shorter tracks are dropped")
    parser.add_argument(
        "--output",
        default=None,
        metavar="DIR",
        help="where to write (default: RUN/evaluate-SPLIT, TensorBoard records into "
        "RUN/tensorboard); given, everything goes into DIR: for a run directory that is "
        "read-only",
    )
    args = parser.parse_args(argv)
    from hvdtrack.evaluate.run import evaluate_run  # TensorFlow, after argparse

    result = evaluate_run(
        args.run, args.split, args.checkpoint, args.dataset_dir, args.threshold,
        args.pt_min, args.min_hits, args.min_track_hits, args.output,
        on_warning=lambda text: print(f"hvdtrack: {text}", file=sys.stderr, flush=True),
    )  # fmt: skip
    print("\n".join(summary_lines(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
