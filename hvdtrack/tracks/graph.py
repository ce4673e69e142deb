"""One event's scored graph on its hit ids, and the graph operations every track builder uses.

An event may be cut into sections whose graphs share boundary hits; ``join_sections`` maps every
graph's nodes to the event's hit ids so tracks are built per event. Edges always point from the
inner hit (sender) to the outer hit (receiver). Track id 0 means "no track" (unassigned hit).

Public symbols: ``EventGraph``, ``join_sections``, ``connected_components``, ``drop_short``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass
class EventGraph:
    """The scored segments of one event, on the event's hits.

    Attributes:
      event_id: the event number.
      hit_id: int64 [H], sorted unique hit ids of the nodes of the event's graphs.
      senders, receivers: int64 [E], indices into ``hit_id`` of the inner and outer hit.
      scores: float32 [E], edge scores in [0, 1].
      labels: float32 [E], truth labels of the edges (1 = true segment).
      xyz: float64 [H, 3], hit positions (mm).
    """

    event_id: int
    hit_id: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    xyz: np.ndarray

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
    xyz: Sequence[np.ndarray],
) -> EventGraph:
    """Joins the section graphs of one event into one graph on its hit ids.

    A hit kept in two sections becomes one node; an edge present in two sections is kept once,
    with its highest score.

    Args:
      event_id: the event number.
      hit_ids: per graph, int64 [N_g] hit id of each node.
      senders, receivers: per graph, int [E_g] node indices within that graph.
      scores, labels: per graph, float [E_g].
      xyz: per graph, float [N_g, 3], node positions (mm).

    Returns:
      The event's ``EventGraph``.
    """
    hit_id = np.unique(np.concatenate([np.asarray(h, np.int64) for h in hit_ids]))
    send = np.concatenate([np.asarray(h)[s] for h, s in zip(hit_ids, senders)]).astype(np.int64)
    recv = np.concatenate([np.asarray(h)[r] for h, r in zip(hit_ids, receivers)]).astype(np.int64)
    score = np.concatenate([np.asarray(s, np.float32) for s in scores])
    label = np.concatenate([np.asarray(lab, np.float32) for lab in labels])
    send, recv = np.searchsorted(hit_id, send), np.searchsorted(hit_id, recv)
    position = np.zeros((hit_id.size, 3))
    for h, p in zip(hit_ids, xyz):
        position[np.searchsorted(hit_id, np.asarray(h, np.int64))] = p
    # Highest score first, then the first of each (sender, receiver) pair.
    order = np.lexsort((-score, recv, send))
    pair = np.stack([send[order], recv[order]], axis=1)
    first = np.ones(len(order), bool)
    first[1:] = np.any(pair[1:] != pair[:-1], axis=1)
    keep = order[first]
    return EventGraph(event_id, hit_id, send[keep], recv[keep], score[keep], label[keep], position)


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


def drop_short(track: np.ndarray, min_hits: int) -> np.ndarray:
    """Sets tracks of fewer than ``min_hits`` hits to 0 and renumbers the others 1 .. T."""
    size = np.bincount(track)
    keep = (track > 0) & (size[track] >= min_hits)
    out = np.zeros_like(track)
    if keep.any():
        out[keep] = np.unique(track[keep], return_inverse=True)[1] + 1
    return out
