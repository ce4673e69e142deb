"""Track building from scored segments: one event's graph, components or a walkthrough, submissions.

An event may be cut into sections whose graphs share boundary hits; ``join_sections`` maps every
graph's nodes to the event's hit ids so tracks are built per event. Edges always point from the
inner hit (sender) to the outer hit (receiver). Track id 0 means "no track" (unassigned hit).

Public symbols: ``EventGraph``, ``join_sections``, ``connected_components``,
``component_tracks``, ``walk_tracks``, ``build_tracks``, ``METHODS``, ``submission``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import pandas as pd

METHODS = ("walk", "components")


@dataclasses.dataclass
class EventGraph:
    """The scored segments of one event, on the event's hits.

    Attributes:
      event_id: the event number.
      hit_id: int64 [H], sorted unique hit ids of the nodes of the event's graphs.
      senders, receivers: int64 [E], indices into ``hit_id`` of the inner and outer hit.
      scores: float32 [E], edge scores in [0, 1].
      labels: float32 [E], truth labels of the edges (1 = true segment).
    """

    event_id: int
    hit_id: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    scores: np.ndarray
    labels: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.hit_id.shape[0])


def join_sections(
    event_id: int,
    hit_ids: Sequence[np.ndarray],
    senders: Sequence[np.ndarray],
    receivers: Sequence[np.ndarray],
    scores: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
) -> EventGraph:
    """Joins the section graphs of one event into one graph on its hit ids.

    A hit kept in two sections becomes one node; an edge present in two sections is kept once,
    with its highest score.

    Args:
      event_id: the event number.
      hit_ids: per graph, int64 [N_g] hit id of each node.
      senders, receivers: per graph, int [E_g] node indices within that graph.
      scores, labels: per graph, float [E_g].

    Returns:
      The event's ``EventGraph``.
    """
    hit_id = np.unique(np.concatenate([np.asarray(h, np.int64) for h in hit_ids]))
    send = np.concatenate([np.asarray(h)[s] for h, s in zip(hit_ids, senders)]).astype(np.int64)
    recv = np.concatenate([np.asarray(h)[r] for h, r in zip(hit_ids, receivers)]).astype(np.int64)
    score = np.concatenate([np.asarray(s, np.float32) for s in scores])
    label = np.concatenate([np.asarray(lab, np.float32) for lab in labels])
    send, recv = np.searchsorted(hit_id, send), np.searchsorted(hit_id, recv)
    # Highest score first, then the first of each (sender, receiver) pair.
    order = np.lexsort((-score, recv, send))
    pair = np.stack([send[order], recv[order]], axis=1)
    first = np.ones(len(order), bool)
    first[1:] = np.any(pair[1:] != pair[:-1], axis=1)
    keep = order[first]
    return EventGraph(event_id, hit_id, send[keep], recv[keep], score[keep], label[keep])


def connected_components(num_nodes: int, senders: np.ndarray, receivers: np.ndarray) -> np.ndarray:
    """Connected components of an undirected graph (vectorised hooking and pointer jumping).

    Args:
      num_nodes: N.
      senders, receivers: int [E], node indices of the edges.

    Returns:
      int64 [N], component number of each node, 0 .. C-1, numbered by their smallest node.
    """
    parent = np.arange(num_nodes, dtype=np.int64)
    senders = np.asarray(senders, np.int64)
    receivers = np.asarray(receivers, np.int64)
    while True:
        a, b = parent[senders], parent[receivers]
        low = np.minimum(a, b)
        hooked = parent.copy()
        # Hook each root under the smallest root it touches, then jump pointers to the roots.
        np.minimum.at(hooked, a, low)
        np.minimum.at(hooked, b, low)
        while True:
            jumped = hooked[hooked]
            if np.array_equal(jumped, hooked):
                break
            hooked = jumped
        if np.array_equal(hooked, parent):
            return np.unique(parent, return_inverse=True)[1].astype(np.int64)
        parent = hooked


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
    return _drop_short(labels + 1, min_hits)


def walk_tracks(
    num_nodes: int,
    senders: np.ndarray,
    receivers: np.ndarray,
    scores: np.ndarray,
    threshold: float = 0.5,
    min_hits: int = 3,
) -> np.ndarray:
    """Tracks by a walkthrough of the edges scored above ``threshold`` (as in Exa.TrkX).

    Every seed (a free hit with an outgoing kept edge to a free hit and no incoming one from a
    free hit: the innermost hit of what is left) starts a track; all tracks step outwards
    together, each to the free hit of its best-scored outgoing edge. When two tracks reach for
    the same hit, the higher-scored edge wins and the other track tries its next-best edge at
    the next step. A track ends when no kept edge leads to a free hit. Rounds of seeds repeat
    until no kept edge joins two free hits.

    Args:
      num_nodes: N.
      senders, receivers: int [E], inner and outer node of each edge.
      scores: float [E].
      threshold: edges scoring above it are followed.
      min_hits: tracks with fewer hits are dropped (their hits get track 0).

    Returns:
      int64 [N] track id of each node, 1 .. T, 0 for unassigned nodes.
    """
    keep = np.asarray(scores) > threshold
    s = np.asarray(senders, np.int64)[keep]
    r = np.asarray(receivers, np.int64)[keep]
    w = np.asarray(scores, np.float64)[keep]
    track = np.zeros(num_nodes, np.int64)
    next_id = 1
    while True:
        free_edge = (track[s] == 0) & (track[r] == 0)
        if not free_edge.any():
            break
        has_out = np.zeros(num_nodes, bool)
        has_in = np.zeros(num_nodes, bool)
        has_out[s[free_edge]] = True
        has_in[r[free_edge]] = True
        seeds = np.flatnonzero(has_out & ~has_in)
        if seeds.size == 0:  # only a cycle is left (not from inner -> outer edges): cut it
            seeds = np.flatnonzero(has_out)[:1]
        track[seeds] = np.arange(next_id, next_id + seeds.size)
        next_id += seeds.size
        current = seeds
        while current.size:
            walking = np.zeros(num_nodes, bool)
            walking[current] = True
            candidates = np.flatnonzero(walking[s] & (track[r] == 0))
            if candidates.size == 0:
                break
            # Each walker's best edge: highest score, ties to the lower receiver index.
            order = candidates[np.lexsort((r[candidates], -w[candidates], s[candidates]))]
            best = order[np.unique(s[order], return_index=True)[1]]
            # Each contested hit goes to the best-scored edge reaching it.
            ranked = best[np.lexsort((s[best], -w[best]))]
            winners = ranked[np.unique(r[ranked], return_index=True)[1]]
            track[r[winners]] = track[s[winners]]
            losers = np.setdiff1d(s[best], s[winners])
            current = np.concatenate([r[winners], losers])
    return _drop_short(track, min_hits)


def build_tracks(
    graph: EventGraph, threshold: float = 0.5, method: str = "walk", min_hits: int = 3
) -> np.ndarray:
    """Track id of each node of an event graph (int64 [H], 0 = unassigned); see ``METHODS``."""
    if method not in METHODS:
        raise ValueError(f"unknown track building method '{method}' (one of {', '.join(METHODS)})")
    build = walk_tracks if method == "walk" else component_tracks
    return build(graph.num_nodes, graph.senders, graph.receivers, graph.scores, threshold, min_hits)


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


def _drop_short(track: np.ndarray, min_hits: int) -> np.ndarray:
    """Sets tracks of fewer than ``min_hits`` hits to 0 and renumbers the others 1 .. T."""
    size = np.bincount(track)
    keep = (track > 0) & (size[track] >= min_hits)
    out = np.zeros_like(track)
    if keep.any():
        out[keep] = np.unique(track[keep], return_inverse=True)[1] + 1
    return out
