"""Reconstruction of events by a trained run: graphs, edge scores, tracks, submissions, summary.

Public symbols: ``STAGES``, ``SUMMARY``, ``MIN_HITS``, ``COUNTS``, ``reconstruct``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import pandas as pd

from hvdtrack.errors import DataError
from hvdtrack.evaluate.inference import (
    check_output,
    check_threshold,
    graph_scorer,
    load_classifier,
)
from hvdtrack.evaluate.tracking import MethodTally, join_event, score_event
from hvdtrack.graphs.construction import GraphConfig
from hvdtrack.reconstruct.inputs import event_prefixes, input_graphs, read_input
from hvdtrack.tracks import building
from hvdtrack.tracks.truth import truth_of_event
from hvdtrack.train.checkpoints import number
from hvdtrack.utils.io import Staged, write_json

STAGES = ("read", "graphs", "score", "tracks", "write")
SUMMARY = "summary.json"
MIN_HITS = 5  # hits in the graphs of a reconstructable particle: evaluate's default
COUNTS = ("hits", "graph_hits", "graphs", "edges", "tracks")


def reconstruct(
    run_dir: str | Path,
    events: Sequence[str],
    out: Optional[str | Path] = None,
    checkpoint: str = "best",
    score: bool = False,
    pt_cut: bool = True,
    threshold: Optional[float] = None,
    min_track_hits: int = 3,
) -> dict:
    """Reconstructs ``events`` (paths, see ``inputs.event_prefixes``) with a run's model and
    writes into ``out`` (default ``RUN/reconstruct``) one submission per event and
    ``summary.json``, renamed into place together at the end (nothing on an error).

    Args:
      pt_cut: build the graphs of events with truth with the run's pT cut (False: as those of
        events without truth, every hit of the region).
      score: also score the tracks against the events' truth (each needs it), as ``evaluate``.
      threshold: edge score threshold (default: the run's first ``train.thresholds``).

    Returns:
      The summary written to ``summary.json``.

    Raises:
      ConfigError: no run or checkpoint, a threshold outside (0, 1), an ``out`` that cannot be
      written (checked first); DataError: bad or missing input files, named.
    """
    started = time.perf_counter()
    check_threshold(threshold)
    out = Path(run_dir) / "reconstruct" if out is None else Path(out)
    check_output(out, "--out")  # before any event is read: a read-only run directory
    prefixes = event_prefixes(events)
    model, config, path = load_classifier(run_dir, checkpoint)
    threshold = config.train.thresholds[0] if threshold is None else threshold
    job = _Job(graph_scorer(model), config.data.graph, threshold, min_track_hits, score, pt_cut)
    job.seconds["model"] = time.perf_counter() - started
    with Staged() as staged:
        for prefix in prefixes:
            event_id, frame = job.event(prefix)
            clock = time.perf_counter()
            frame.to_csv(staged.path(out / f"event{event_id:09d}-submission.csv"), index=False)
            job.seconds["write"] += time.perf_counter() - clock
        summary = {
            "run_dir": str(run_dir),
            "checkpoint": checkpoint,
            "checkpoint_path": path,
            "step": number(path),
            "out": str(out),
            "events": len(prefixes),
            "events_with_pt_cut": job.cut_events,
            "pt_cut_gev": config.data.graph.pt_min,
            "threshold": threshold,
            "method": building.METHODS[0],
            **job.counts,
            "seconds": {k: round(v, 3) for k, v in job.seconds.items()},
            "seconds_total": round(time.perf_counter() - started, 3),
            "events_per_second": round(len(prefixes) / sum(job.seconds[s] for s in STAGES), 4),
        }
        if score:
            metrics = job.tally.metrics()
            summary["score"] = {k: v for k, v in metrics.items() if "_vs_" not in k}
            summary["score"]["reconstructable_if"] = {
                "pt_min": job.graph.pt_min,
                "min_hits": MIN_HITS,
            }
        write_json(staged.path(out / SUMMARY), summary)
        staged.commit()
    return summary


@dataclasses.dataclass
class _Job:
    """What every event goes through, and the counts and seconds (by stage) so far."""

    scorer: Callable
    graph: GraphConfig
    threshold: float
    min_track_hits: int
    score: bool
    pt_cut: bool
    counts: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    seconds: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    cut_events: int = 0
    tally: MethodTally = dataclasses.field(default_factory=MethodTally)

    def event(self, prefix: str) -> tuple[int, pd.DataFrame]:
        """One event's (id, submission frame); with ``score`` its tracks are scored into
        ``tally`` as ``evaluate`` scores them (``tracking.score_event``)."""
        times = [time.perf_counter()]
        item = read_input(prefix, self.pt_cut)
        if self.score and not item.has_truth:
            raise DataError(f"{prefix}: --score needs the event's truth file (none found)")
        times.append(time.perf_counter())
        graphs = input_graphs(item, self.graph)
        times.append(time.perf_counter())
        scores = self.scorer(graphs)
        times.append(time.perf_counter())
        event_id = item.event.event_id
        graph = join_event(event_id, list(zip(graphs, scores)), self.graph)
        method = building.METHODS[0]
        if self.score:
            limits = (self.threshold, self.graph.pt_min, MIN_HITS, self.min_track_hits)
            truth = truth_of_event(item.event, item.prefix)
            frame = score_event(graph, truth, method, *limits, self.tally)
        else:
            track = building.build_tracks(graph, self.threshold, method, self.min_track_hits)
            hit_id = item.event.hits["hit_id"].to_numpy()
            frame = building.submission(event_id, hit_id, graph.hit_id, track)
        times.append(time.perf_counter())
        for stage, start, end in zip(STAGES, times, times[1:]):
            self.seconds[stage] += end - start
        self.cut_events += item.cut
        found = {"hits": len(item.event.hits), "graph_hits": graph.num_nodes}
        found.update(graphs=len(graphs), edges=sum(g.num_edges for g in graphs))
        found["tracks"] = int(frame["track_id"][frame["track_id"] > 0].nunique())
        for key, value in found.items():
            self.counts[key] += value
        return event_id, frame
