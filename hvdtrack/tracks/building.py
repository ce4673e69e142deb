"""Track building from scored segments: the builders side by side, and TrackML submissions.

``METHODS``, first the one whose submissions are written:
- ``chains``: crossings (double hits kept together), junctions resolved by mutual best edges,
  chains joined across missing layers by a helix fit (``chains``);
- ``components``: the connected components of the edges above the threshold, the simplest
  builder of the published pipelines, kept as the reference.

Public symbols: ``METHODS``, ``component_tracks``, ``build_tracks``, ``submission``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hvdtrack.tracks.chains import chain_tracks
from hvdtrack.tracks.graph import EventGraph, connected_components, drop_short

METHODS = ("chains", "components")


def component_tracks(
    num_nodes: int,
    senders: np.ndarray,
    receivers: np.ndarray,
    scores: np.ndarray,
    threshold: float = 0.5,
    min_hits: int = 3,
) -> np.ndarray:
    """Tracks as the connected components of the edges scored above ``threshold``.

    Returns:
      int64 [N] track id of each node, 1 .. T; 0 for nodes in components of fewer than
      ``min_hits`` nodes.
    """
    keep = np.asarray(scores) > threshold
    labels = connected_components(num_nodes, np.asarray(senders)[keep], np.asarray(receivers)[keep])
    return drop_short(labels + 1, min_hits)


def build_tracks(
    graph: EventGraph, threshold: float = 0.5, method: str = METHODS[0], min_hits: int = 3
) -> np.ndarray:
    """Track id of each node of an event graph (int64 [H], 0 = unassigned); see ``METHODS``."""
    if method not in METHODS:
        raise ValueError(f"unknown track building method '{method}' (one of {', '.join(METHODS)})")
    edges = (graph.num_nodes, graph.senders, graph.receivers, graph.scores)
    if method == "chains":
        return chain_tracks(*edges, graph.xyz, threshold, min_hits)
    return component_tracks(*edges, threshold, min_hits)


def submission(
    event_id: int, all_hit_ids: np.ndarray, hit_id: np.ndarray, track_id: np.ndarray
) -> pd.DataFrame:
    """A TrackML submission of one event: every hit of the event, with its track.

    Args:
      event_id: the event number.
      all_hit_ids: int64 [N_hits], every hit id of the event (a submission lists them all).
      hit_id: int64 [H], sorted hit ids that have a track id.
      track_id: int64 [H], their track ids; hits not in ``hit_id`` get 0.

    Returns:
      DataFrame with int64 columns event_id, hit_id, track_id, in ``all_hit_ids`` order.
    """
    all_hit_ids = np.asarray(all_hit_ids, np.int64)
    tracks = np.zeros(all_hit_ids.size, np.int64)
    if hit_id.size:
        where = np.clip(np.searchsorted(hit_id, all_hit_ids), 0, hit_id.size - 1)
        found = hit_id[where] == all_hit_ids
        tracks[found] = track_id[where[found]]
    return pd.DataFrame(
        {
            "event_id": np.full(all_hit_ids.size, event_id, np.int64),
            "hit_id": all_hit_ids,
            "track_id": tracks,
        }
    )
