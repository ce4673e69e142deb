"""Tracks per event from the scored graphs, scored against the events' truth.

For each event the graphs of its sections are joined, tracks are built by every
``building.METHODS`` method and matched to the truth particles: TrackML score over every hit of
the event and over the hits of the graphs, track efficiency, fake and duplicate rates, efficiency
vs pT and eta. The first method's TrackML submission of each event is written as CSV.

Public symbols: ``PT_BINS``, ``ETA_BINS``, ``MethodTally``, ``join_event``, ``score_event``,
``evaluate_tracks``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from hvdtrack.graphs.construction import node_positions
from hvdtrack.tracks import building, matching
from hvdtrack.tracks.graph import EventGraph, join_sections
from hvdtrack.tracks.truth import EventTruth, check_graph_truth, load_truth

if TYPE_CHECKING:
    import pandas as pd

    from hvdtrack.config import DataConfig
    from hvdtrack.graphs.construction import GraphConfig

PT_BINS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 100.0)  # GeV
ETA_BINS = tuple(np.round(np.linspace(-4.0, 4.0, 17), 2).tolist())


@dataclasses.dataclass
class MethodTally:
    """What one track-building method scored over the events so far. ``targets``: per event,
    the (pt, eta, matched) rows of its reconstructable particles."""

    counts: matching.TrackCounts = dataclasses.field(default_factory=matching.TrackCounts)
    event_scores: list[float] = dataclasses.field(default_factory=list)
    graph_scores: list[float] = dataclasses.field(default_factory=list)
    targets: list[np.ndarray] = dataclasses.field(default_factory=list)

    def metrics(self) -> dict:
        """The method's entry of ``metrics.json``'s ``tracks``."""
        pt, eta, found = np.concatenate(self.targets, axis=1)
        return {
            "trackml_score": float(np.mean(self.event_scores)),
            "trackml_score_in_graphs": float(np.mean(self.graph_scores)),
            **self.counts.rates(),
            **dataclasses.asdict(self.counts),
            "trackml_score_per_event": [round(s, 6) for s in self.event_scores],
            "efficiency_vs_pt": matching.binned_efficiency(pt, found > 0, PT_BINS),
            "efficiency_vs_eta": matching.binned_efficiency(eta, found > 0, ETA_BINS),
        }


def join_event(event_id: int, sections: Sequence[tuple], graph: GraphConfig) -> EventGraph:
    """One event's graph from its sections' (graph, edge scores); ``graph``: the dataset's
    graph config, whose feature scales give the hits' positions."""
    return join_sections(
        event_id,
        *([getattr(g, f) for g, _ in sections] for f in ("hit_id", "senders", "receivers")),
        [s for _, s in sections],
        [g.labels for g, _ in sections],
        [node_positions(g.nodes, graph) for g, _ in sections],
    )


def score_event(
    graph: EventGraph,
    truth: EventTruth,
    method: str,
    threshold: float,
    pt_min: float,
    min_hits: int,
    min_track_hits: int,
    tally: MethodTally,
) -> pd.DataFrame:
    """Builds one event's tracks by ``method``, adds their scores to ``tally``; returns the
    event's TrackML submission frame."""
    particle = truth.particle_of(graph.hit_id)
    weight = truth.weight[np.searchsorted(truth.hit_id, graph.hit_id)]
    track = building.build_tracks(graph, threshold, method, min_track_hits)
    frame = building.submission(graph.event_id, truth.hit_id, graph.hit_id, track)
    tally.event_scores.append(
        matching.trackml_score(frame["track_id"].to_numpy(), truth.particle_id, truth.weight)
    )
    tally.graph_scores.append(
        matching.trackml_score(track, particle, weight) / weight.sum() if weight.sum() else 0.0
    )
    match = matching.match_tracks(track, particle)
    pt, eta = truth.kinematics_of(match.particle_id)
    tally.counts += matching.count_tracks(match, pt, pt_min, min_hits)
    target = matching.reconstructable(match, pt, pt_min, min_hits)
    tally.targets.append(np.stack([pt[target], eta[target], match.particle_matched[target]]))
    return frame


def evaluate_tracks(
    by_event: dict[int, list],
    data: DataConfig,
    threshold: float,
    pt_min: float,
    min_hits: int,
    min_track_hits: int,
    submissions: Path,
) -> dict[str, dict]:
    """Tracks of every event of ``by_event`` (event id -> [(graph, edge scores)]) against the
    truth of ``data`` (a ``DataConfig``); writes the first method's submissions into
    ``submissions``; returns {method: its metrics}."""
    tallies = {m: MethodTally() for m in building.METHODS}
    for event_id in sorted(by_event):
        graph = join_event(event_id, by_event[event_id], data.graph)
        truth = load_truth(data, event_id)
        check_graph_truth(graph, truth)
        for method, tally in tallies.items():
            args = (threshold, pt_min, min_hits, min_track_hits, tally)
            frame = score_event(graph, truth, method, *args)
            if method == building.METHODS[0]:
                frame.to_csv(submissions / f"event{event_id:09d}-submission.csv", index=False)
    return {method: tally.metrics() for method, tally in tallies.items()}
