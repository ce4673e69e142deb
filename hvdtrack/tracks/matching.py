"""Track metrics from their published definitions: the TrackML score, efficiency, fake and duplicate rates.

All functions take per-hit arrays aligned with each other: ``track_id`` (0 = no track),
``particle_id`` (0 = noise) and, for the score, the truth ``weight``. A particle's hit count is
the number of its hits among the hits passed, so passing the whole event gives TrackML's
definition and passing the hits of the graphs gives the figures within the graphs' acceptance.

Matching (TrackML, double majority): a track's majority particle is the particle holding most of
its hits (ties: the smaller particle id); the track is matched to it when that particle holds
more than half of the track's hits AND the track holds more than half of the particle's hits.
Noise is never a track's match. A particle is matched by at most one track.

Public symbols: ``TrackMatch``, ``match_tracks``, ``trackml_score``, ``TrackCounts``,
``count_tracks``, ``reconstructable``, ``binned_efficiency``.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class TrackMatch:
    """Per-track and per-particle results of the double-majority matching.

    Attributes:
      track_id: int64 [T], the tracks (track id 0 excluded).
      track_hits: int64 [T], hits of each track.
      majority_particle: int64 [T], the particle holding most of the track's hits (0 = noise).
      majority_hits: int64 [T], that particle's hits in the track.
      matched: bool [T], double majority holds.
      particle_id: int64 [P], the particles with hits (noise excluded).
      particle_hits: int64 [P], hits of each particle.
      particle_matched: bool [P], a track is matched to the particle.
      majority_tracks: int64 [P], tracks whose hits are more than half this particle's.
    """

    track_id: np.ndarray
    track_hits: np.ndarray
    majority_particle: np.ndarray
    majority_hits: np.ndarray
    matched: np.ndarray
    particle_id: np.ndarray
    particle_hits: np.ndarray
    particle_matched: np.ndarray
    majority_tracks: np.ndarray


def match_tracks(track_id: np.ndarray, particle_id: np.ndarray) -> TrackMatch:
    """Matches tracks to particles by double majority.

    Args:
      track_id: int [H], track of each hit, 0 for hits in no track.
      particle_id: int [H], particle of each hit, 0 for noise.

    Returns:
      The ``TrackMatch``.
    """
    track_id = np.asarray(track_id, np.int64)
    particle_id = np.asarray(particle_id, np.int64)
    particles, particle_hits = np.unique(particle_id[particle_id != 0], return_counts=True)
    in_track = track_id != 0
    pairs, pair_hits = np.unique(
        np.stack([track_id[in_track], particle_id[in_track]], axis=1), axis=0, return_counts=True
    )
    pairs = pairs.reshape(-1, 2)
    tracks, track_hits = np.unique(track_id[in_track], return_counts=True)
    # The first row of each track, after sorting by (track, most hits, smaller particle id).
    order = np.lexsort((pairs[:, 1], -pair_hits, pairs[:, 0]))
    first = order[np.unique(pairs[order, 0], return_index=True)[1]]
    majority, majority_hits = pairs[first, 1], pair_hits[first]
    hits_of_majority = np.zeros_like(majority)
    real = majority != 0
    hits_of_majority[real] = particle_hits[np.searchsorted(particles, majority[real])]
    pure = 2 * majority_hits > track_hits
    matched = real & pure & (2 * majority_hits > hits_of_majority)
    particle_matched = np.isin(particles, majority[matched])
    index = np.searchsorted(particles, majority[real & pure])
    majority_tracks = np.bincount(index, minlength=particles.size).astype(np.int64)
    return TrackMatch(
        tracks, track_hits, majority, majority_hits, matched,
        particles, particle_hits, particle_matched, majority_tracks,
    )  # fmt: skip


def trackml_score(track_id: np.ndarray, particle_id: np.ndarray, weight: np.ndarray) -> float:
    """The TrackML score of one event: the truth weight of the matched tracks' correct hits.

    Args:
      track_id: int [H], track of each hit (0: none).
      particle_id: int [H], particle of each hit (0: noise).
      weight: float [H], truth weight of each hit (sums to 1 over a whole event).

    Returns:
      Sum of the weights of the hits that are in a matched track and belong to its particle;
      1 for perfect tracks of a whole event.
    """
    track_id = np.asarray(track_id, np.int64)
    particle_id = np.asarray(particle_id, np.int64)
    match = match_tracks(track_id, particle_id)
    in_track = track_id != 0
    index = np.searchsorted(match.track_id, track_id[in_track])
    correct = np.zeros(track_id.size, bool)
    correct[in_track] = match.matched[index] & (
        match.majority_particle[index] == particle_id[in_track]
    )
    return float(np.sum(np.asarray(weight, np.float64)[correct]))


@dataclasses.dataclass
class TrackCounts:
    """Counts behind the track efficiency, fake and duplicate rates (they add over events).

    Attributes:
      reconstructable: particles with pT above the cut and at least ``min_hits`` hits.
      reconstructed: reconstructable particles matched by a track (double majority).
      tracks: tracks (track id 0 excluded).
      matched_tracks: tracks matched to a particle (double majority).
      majority_tracks: tracks more than half of whose hits are one particle's.
      duplicate_tracks: majority tracks beyond the first of their particle.
    """

    reconstructable: int = 0
    reconstructed: int = 0
    tracks: int = 0
    matched_tracks: int = 0
    majority_tracks: int = 0
    duplicate_tracks: int = 0

    def __add__(self, other: TrackCounts) -> TrackCounts:
        return TrackCounts(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )

    def rates(self) -> dict[str, float]:
        """``efficiency`` = reconstructed / reconstructable; ``fake_rate`` = tracks matched to no
        particle / tracks; ``duplicate_rate`` = duplicate tracks / majority tracks. Under double
        majority a particle has at most one matched track, so duplicates are counted over
        tracks whose majority (more than half of the track's hits) is one particle."""
        return {
            "efficiency": _ratio(self.reconstructed, self.reconstructable),
            "fake_rate": _ratio(self.tracks - self.matched_tracks, self.tracks),
            "duplicate_rate": _ratio(self.duplicate_tracks, self.majority_tracks),
        }


def count_tracks(
    match: TrackMatch, particle_pt: np.ndarray, pt_min: float = 1.0, min_hits: int = 5
) -> TrackCounts:
    """Efficiency, fake and duplicate counts of one event.

    Args:
      match: ``match_tracks`` of the event.
      particle_pt: float [P], pT (GeV) of ``match.particle_id``.
      pt_min: reconstructable particles have pT > pt_min ...
      min_hits: ... and at least this many hits.
    """
    target = reconstructable(match, particle_pt, pt_min, min_hits)
    majority = match.majority_tracks
    return TrackCounts(
        reconstructable=int(target.sum()),
        reconstructed=int((target & match.particle_matched).sum()),
        tracks=int(match.track_id.size),
        matched_tracks=int(match.matched.sum()),
        majority_tracks=int(majority.sum()),
        duplicate_tracks=int(np.maximum(majority - 1, 0).sum()),
    )


def reconstructable(
    match: TrackMatch, particle_pt: np.ndarray, pt_min: float, min_hits: int
) -> np.ndarray:
    """bool [P]: the particles of ``match`` with pT > pt_min and at least ``min_hits`` hits."""
    return (np.asarray(particle_pt) > pt_min) & (match.particle_hits >= min_hits)


def binned_efficiency(
    values: np.ndarray, matched: np.ndarray, edges: np.ndarray
) -> dict[str, list[float]]:
    """Efficiency in bins of a particle quantity (pT, eta).

    Args:
      values: float [P], the quantity of each reconstructable particle.
      matched: bool [P], the particle is reconstructed.
      edges: float [B + 1], bin edges; values outside are left out.

    Returns:
      ``edges``, ``total`` and ``matched`` counts [B], ``efficiency`` [B] (NaN for an empty bin)
      and its binomial standard error ``error`` [B].
    """
    edges = np.asarray(edges, np.float64)
    total = np.histogram(values, edges)[0]
    found = np.histogram(np.asarray(values)[np.asarray(matched, bool)], edges)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        eff = found / total
        err = np.sqrt(eff * (1 - eff) / total)
    return {
        "edges": edges.tolist(),
        "total": total.tolist(),
        "matched": found.tolist(),
        "efficiency": eff.tolist(),
        "error": err.tolist(),
    }


def _ratio(a: int, b: int) -> float:
    return a / b if b else float("nan")
