"""Track building by chains of layer crossings: double hits, junctions and gaps handled on purpose.

Three steps, each for one way the simpler builders lose tracks in full-density events:

1. Crossings (``double_hit_crossings``). A particle crossing two overlapping modules leaves two
   hits on one layer (about a quarter of crossings in real events): both are joined by good edges
   to the same hit before or after them. Such hits, within ``DOUBLE_HIT_DISTANCE`` and one behind
   the other along the particle's path (``MIN_ALIGNMENT``), are one crossing, and stay together
   in one track; two particles' hits side by side on one module are not.
2. Chains (``mutual_best``). On the graph of crossings, an edge is kept when it is both the best
   scored edge out of its inner crossing and the best into its outer one. Every crossing keeps at
   most one edge each way, so a junction (a fake edge into another particle's hits) is resolved
   by the scores on both of its sides, and the chains are paths.
3. Joins across gaps (``join_continuations``). A particle misses a layer (inefficiency), or leaves
   the barrel graph through an end-cap and comes back in the outer barrel: no edge can span the
   gap, so its hits form two chains. Chains that one helix fits (``helix.residuals`` within
   ``MAX_TRANSVERSE`` and ``MAX_LONGITUDINAL``), the outer starting beyond the inner's end, are
   joined, best fits first, each chain continued at most once each way.

Public symbols: ``DOUBLE_HIT_DISTANCE``, ``MIN_ALIGNMENT``, ``MAX_TRANSVERSE``,
``MAX_LONGITUDINAL``, ``double_hit_crossings``, ``mutual_best``, ``join_continuations``,
``chain_tracks``.
"""

from __future__ import annotations

import numpy as np

from hvdtrack.tracks import helix
from hvdtrack.tracks.graph import connected_components, drop_short

# Module overlaps put a particle's two hits on one layer within about 20 mm (synthetic and
# TrackML barrels: 2-15 mm); two particles' hits that close and scored to one hit are rare.
DOUBLE_HIT_DISTANCE = 20.0  # mm
# A particle's two hits on overlapping modules lie one behind the other along its path: in the
# transverse plane, the step between them points the way the particle goes (from the hit they
# share an edge with), |cos| > 0.99 for 99.9% of such pairs. Two particles' hits on one module
# lie side by side along it (median |cos| 0.14): merging them put one particle's hits in
# another's track (default events, test split: 0.012 of the TrackML score).
MIN_ALIGNMENT = 0.99
# A join must fit one helix this well (RMS, mm): hit resolution and multiple scattering over a
# gap of one or two layers stay well below; other particles' chains rarely do.
MAX_TRANSVERSE = 2.0
MAX_LONGITUDINAL = 10.0
# The outer chain starts at least this much farther from the origin than the inner one ends.
MIN_GAP = 10.0  # mm
# Only chains this close in azimuth (where one ends and the other starts) are fitted together.
MAX_GAP_DPHI = 0.3  # rad


def double_hit_crossings(
    num_nodes: int, senders: np.ndarray, receivers: np.ndarray, scores: np.ndarray,
    xyz: np.ndarray, max_distance: float = DOUBLE_HIT_DISTANCE,
    min_alignment: float = MIN_ALIGNMENT,
) -> np.ndarray:  # fmt: skip
    """Groups hits into crossings: two hits that are among the three best-scored neighbours of one
    hit on the same side, within ``max_distance`` of each other, and one behind the other as
    seen from that hit (``MIN_ALIGNMENT``), are one crossing (transitively).

    Args:
      num_nodes: N; senders, receivers, scores: the kept edges (inner -> outer); xyz: [N, 3] mm.

    Returns:
      int64 [N], crossing of each node, 0 .. C-1.
    """
    first, second, hubs = [], [], []
    for hub, other in ((senders, receivers), (receivers, senders)):
        order = np.lexsort((-scores, hub))
        hub, other = hub[order], other[order]
        for k in (1, 2):
            same = hub[k:] == hub[:-k]
            first.append(other[:-k][same])
            second.append(other[k:][same])
            hubs.append(hub[k:][same])
    a, b, hub = np.concatenate(first), np.concatenate(second), np.concatenate(hubs)
    step = xyz[b, :2] - xyz[a, :2]
    heading = (xyz[a, :2] + xyz[b, :2]) / 2 - xyz[hub, :2]
    with np.errstate(invalid="ignore", divide="ignore"):
        alignment = np.abs(np.sum(step * heading, axis=1)) / (
            np.linalg.norm(step, axis=1) * np.linalg.norm(heading, axis=1)
        )
    close = np.linalg.norm(xyz[a] - xyz[b], axis=1) < max_distance
    one = close & (alignment > min_alignment)
    return connected_components(num_nodes, a[one], b[one])


def mutual_best(senders: np.ndarray, receivers: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Indices of the edges that are the best-scored edge out of their sender and into their
    receiver (ties to the lower other end)."""
    order = np.lexsort((receivers, -scores, senders))
    best_out = order[np.unique(senders[order], return_index=True)[1]]
    order = np.lexsort((senders, -scores, receivers))
    best_in = order[np.unique(receivers[order], return_index=True)[1]]
    return np.intersect1d(best_out, best_in)


def join_continuations(
    chain: np.ndarray, xyz: np.ndarray, max_transverse: float = MAX_TRANSVERSE,
    max_longitudinal: float = MAX_LONGITUDINAL,
) -> np.ndarray:  # fmt: skip
    """Joins chains that continue each other across a gap (see the module docstring).

    Args:
      chain: int [H], chain of each hit, 0 .. C-1.
      xyz: float [H, 3], hit positions (mm).

    Returns:
      int64 [H], the joined chain of each hit, 0 .. J-1.
    """
    count = int(chain.max()) + 1 if chain.size else 0
    moments = helix.hit_moments(chain, xyz, count)
    found = [_fitting_pairs(moments, *pairs, max_transverse, max_longitudinal)
             for pairs in _candidate_pairs(chain, xyz, count)]  # fmt: skip
    inner, outer, cost = (np.concatenate([f[i] for f in found] or [np.zeros(0)]) for i in range(3))
    inner, outer = inner.astype(np.int64), outer.astype(np.int64)
    links_in, links_out = [], []
    # Greedy by cost, as rounds of locally best pairs (the same matching, vectorised).
    while inner.size:
        order = np.lexsort((outer, inner, cost))
        best_of_inner = order[np.unique(inner[order], return_index=True)[1]]
        best_of_outer = order[np.unique(outer[order], return_index=True)[1]]
        chosen = np.intersect1d(best_of_inner, best_of_outer)
        links_in.append(inner[chosen])
        links_out.append(outer[chosen])
        free = ~np.isin(inner, inner[chosen]) & ~np.isin(outer, outer[chosen])
        inner, outer, cost = inner[free], outer[free], cost[free]
    pairs = [np.concatenate(x or [np.zeros(0, np.int64)]) for x in (links_in, links_out)]
    return connected_components(count, *pairs)[chain]


def _fitting_pairs(moments, inner, outer, max_transverse, max_longitudinal) -> tuple:
    """The (inner, outer, cost) of the pairs one helix fits within the limits."""
    transverse, longitudinal = helix.residuals(moments[inner] + moments[outer])
    fits = (transverse < max_transverse) & (longitudinal < max_longitudinal)
    cost = (transverse / max_transverse) ** 2 + (longitudinal / max_longitudinal) ** 2
    return inner[fits], outer[fits], cost[fits]


def _candidate_pairs(chain: np.ndarray, xyz: np.ndarray, count: int, chunk: int = 1 << 20):
    """Yields (inner, outer) chain pairs, about ``chunk`` at a time (memory stays bounded on
    graphs of every hit): the outer starting beyond the inner's end, its first hit within
    ``MAX_GAP_DPHI`` of the inner's last, and one of the two of 2 hits or more (single hits
    are not paired with each other: on a graph of every hit they are most hits)."""
    distance = np.linalg.norm(xyz, axis=1)
    start = np.full(count, np.inf)
    end = np.full(count, -np.inf)
    np.minimum.at(start, chain, distance)
    np.maximum.at(end, chain, distance)
    phi = np.arctan2(xyz[:, 1], xyz[:, 0])
    first_phi, last_phi = np.zeros(count), np.zeros(count)
    by_distance = np.argsort(distance, kind="stable")
    last_phi[chain[by_distance]] = phi[by_distance]  # the last write is the outermost hit
    first_phi[chain[by_distance[::-1]]] = phi[by_distance[::-1]]
    longer = np.bincount(chain, minlength=count) >= 2
    # From each longer chain's end to every start near it, and from each longer chain's start
    # to every end near it but of a single hit (the pairs of two longer chains come once).
    for pairs in _near_in_phi(np.flatnonzero(longer), last_phi, first_phi, chunk):
        inner, outer = pairs
        keep = start[outer] > end[inner] + MIN_GAP
        yield inner[keep], outer[keep]
    for pairs in _near_in_phi(np.flatnonzero(longer), first_phi, last_phi, chunk):
        outer, inner = pairs
        keep = (start[outer] > end[inner] + MIN_GAP) & ~longer[inner]
        yield inner[keep], outer[keep]


def _near_in_phi(chains: np.ndarray, phi_of: np.ndarray, phi_to: np.ndarray, chunk: int):
    """Yields (a, b) pairs, a of ``chains``, b any chain with phi_to[b] within MAX_GAP_DPHI of
    phi_of[a], about ``chunk`` pairs at a time."""
    order = np.argsort(phi_to, kind="stable")
    wrapped = np.concatenate([phi_to[order] - 2 * np.pi, phi_to[order], phi_to[order] + 2 * np.pi])
    owners = np.concatenate([order, order, order])
    low = np.searchsorted(wrapped, phi_of[chains] - MAX_GAP_DPHI)
    high = np.searchsorted(wrapped, phi_of[chains] + MAX_GAP_DPHI)
    bounds = np.searchsorted(np.cumsum(high - low), np.arange(chunk, (high - low).sum(), chunk))
    for part in np.split(np.arange(chains.size), np.unique(bounds)):
        width = high[part] - low[part]
        a = np.repeat(chains[part], width)
        within = np.arange(a.size) - np.repeat(np.cumsum(width) - width, width)
        yield a, owners[np.repeat(low[part], width) + within]


def chain_tracks(
    num_nodes: int, senders: np.ndarray, receivers: np.ndarray, scores: np.ndarray,
    xyz: np.ndarray, threshold: float = 0.5, min_hits: int = 3,
) -> np.ndarray:  # fmt: skip
    """Tracks as chains of crossings joined across gaps (see the module docstring).

    Args:
      num_nodes: N; senders, receivers: int [E], inner and outer node of each edge;
      scores: float [E]; xyz: float [N, 3], node positions (mm).
      threshold: edges scoring above it are used.
      min_hits: tracks with fewer hits are dropped (their hits get track 0).

    Returns:
      int64 [N] track id of each node, 1 .. T, 0 for unassigned nodes.
    """
    keep = np.asarray(scores) > threshold
    send = np.asarray(senders, np.int64)[keep]
    recv = np.asarray(receivers, np.int64)[keep]
    score = np.asarray(scores, np.float64)[keep]
    xyz = np.asarray(xyz, np.float64)
    crossing = double_hit_crossings(num_nodes, send, recv, score, xyz)
    send, recv = crossing[send], crossing[recv]
    between = send != recv
    send, recv, score = send[between], recv[between], score[between]
    link = mutual_best(send, recv, score)
    count = int(crossing.max()) + 1 if num_nodes else 0
    chain = connected_components(count, send[link], recv[link])[crossing]
    return drop_short(join_continuations(chain, xyz) + 1, min_hits)
