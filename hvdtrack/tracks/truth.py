"""An event's truth for scoring tracks: hit -> particle and weight, particle pT and eta.

Graph records keep hit ids and the event id, not the truth; the truth comes from the event's
CSV files: those ``prepare`` kept under ``DATASET/events`` (``data.keep_csv``), else the TrackML
directory, else the synthetic generator run again (an event is a pure function of its config,
seed and id). ``check_graph_truth`` refuses truth that does not fit the graphs.

Public symbols: ``EventTruth``, ``truth_of_event``, ``load_truth``, ``check_graph_truth``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hvdtrack.errors import DataError
from hvdtrack.events import synthetic, trackml

if TYPE_CHECKING:
    from hvdtrack.config import DataConfig
    from hvdtrack.tracks.graph import EventGraph


@dataclasses.dataclass
class EventTruth:
    """The truth of one event.

    Attributes:
      event_id: the event number.
      hit_id: int64 [N_hits], sorted.
      particle_id: int64 [N_hits], 0 for noise.
      weight: float64 [N_hits], TrackML scoring weight of each hit.
      particles: int64 [P], sorted particle ids; pt, eta: float64 [P], their pT (GeV) and eta.
      source: where the truth was read from (for messages).
    """

    event_id: int
    hit_id: np.ndarray
    particle_id: np.ndarray
    weight: np.ndarray
    particles: np.ndarray
    pt: np.ndarray
    eta: np.ndarray
    source: str = ""

    def particle_of(self, hit_id: np.ndarray) -> np.ndarray:
        """int64 particle id of each of ``hit_id`` (hits of this event)."""
        return self.particle_id[np.searchsorted(self.hit_id, hit_id)]

    def kinematics_of(self, particle_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """pT and eta of each of ``particle_id`` (particles of this event)."""
        index = np.searchsorted(self.particles, particle_id)
        return self.pt[index], self.eta[index]


def truth_of_event(event: trackml.Event, source: str = "") -> EventTruth:
    """The ``EventTruth`` of a read or generated event."""
    truth = event.truth.sort_values("hit_id")
    particles = event.particles.sort_values("particle_id")
    px, py, pz = (particles[c].to_numpy(np.float64) for c in ("px", "py", "pz"))
    pt = np.hypot(px, py)
    return EventTruth(
        event_id=int(event.event_id),
        hit_id=truth["hit_id"].to_numpy(np.int64),
        particle_id=truth["particle_id"].to_numpy(np.int64),
        weight=truth["weight"].to_numpy(np.float64),
        particles=particles["particle_id"].to_numpy(np.int64),
        pt=pt,
        eta=np.arcsinh(pz / np.maximum(pt, 1e-12)),
        source=source,
    )


def load_truth(data: DataConfig, event_id: int) -> EventTruth:
    """The truth of one event of a dataset built from ``data`` (see the module docstring):
    the dataset's own data config, as its prepare.json records it (``evaluate.run.dataset_data``).

    Raises:
      DataError: the event's files cannot be found or read.
    """
    name = f"event{event_id:09d}"
    kept = Path(data.dataset_dir) / "events" / name
    if _has_truth(kept):
        return truth_of_event(trackml.read_event(kept), str(kept))
    if data.source == "trackml":
        prefix = Path(str(data.trackml_dir)) / name
        if not _has_truth(prefix):
            raise DataError(
                f"{prefix}: no truth file for event {event_id} (looked for {name}-truth.csv[.gz] "
                f"in {data.dataset_dir}/events and {data.trackml_dir})"
            )
        return truth_of_event(trackml.read_event(prefix), str(prefix))
    event = synthetic.generate_event(data.synthetic, event_id, data.seed)
    return truth_of_event(event, f"synthetic event {event_id} (seed {data.seed}), generated again")


def check_graph_truth(graph: EventGraph, truth: EventTruth) -> None:
    """Refuses truth that is not the graphs' event: unknown hit ids, or true edges whose hits
    belong to different particles.

    Raises:
      DataError: naming the event, the truth's source and what to do.
    """
    where = np.minimum(np.searchsorted(truth.hit_id, graph.hit_id), truth.hit_id.size - 1)
    known = truth.hit_id[where] == graph.hit_id if truth.hit_id.size else graph.hit_id < 0
    problem = None
    if not np.all(known):
        problem = f"{int(np.sum(~known))} hit ids of the graphs are not in its truth"
    else:
        particle = truth.particle_id[where]
        true_edge = graph.labels > 0.5
        a, b = particle[graph.senders[true_edge]], particle[graph.receivers[true_edge]]
        wrong = (a != b) | (a == 0)
        if wrong.any():
            problem = f"{int(wrong.sum())} true edges join hits of different particles or noise"
    if problem:
        raise DataError(
            f"event {graph.event_id}: the dataset's graphs do not fit the truth of "
            f"{truth.source or 'the event'} ({problem}); the events changed since the dataset "
            "was prepared - run hvdtrack prepare --force with the run's config"
        )


def _has_truth(prefix: Path) -> bool:
    return any(Path(f"{prefix}-truth.csv{ext}").is_file() for ext in ("", ".gz"))
