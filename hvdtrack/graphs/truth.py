"""Truth of hit pairs: a particle's hits in order along its path, true segments and edge labels.

A true segment joins two consecutive layer crossings of one particle (the Exa.TrkX convention):
a particle's hits are ordered by distance from its production vertex and grouped by layer, so
two hits of one particle on one layer (a module overlap, or a looper coming back) form one
crossing; every hit of a crossing is joined to every hit of the next, and hits of one crossing
are never joined to each other (edges join different layers). A segment is formable when the
two crossings' layers are an adjacency pair, else lost (counted apart).

Public symbols: ``group_hits_along_particles``, ``count_true_segments``,
``count_lost_segments``, ``label_edges``.
"""

from __future__ import annotations

import numpy as np

from hvdtrack.graphs.pairs import adjacency_mask


def group_hits_along_particles(
    particle_id: np.ndarray, layer: np.ndarray, distance: np.ndarray
) -> np.ndarray:
    """Numbers each particle's hits by layer crossing, in order along its path.

    A particle's hits are ordered by distance from its vertex; consecutive hits on the same
    layer (double hits) share a group. Groups are numbered globally so that the next crossing
    of the same particle is group + 1.

    Args:
      particle_id: int64 [N] (0 = noise).
      layer: int64 [N] global layer index.
      distance: float64 [N] distance from the particle's vertex.

    Returns:
      int64 [N] group number; -1 for noise.
    """
    group = np.full(len(particle_id), -1, dtype=np.int64)
    signal = np.flatnonzero(particle_id != 0)
    if len(signal) == 0:
        return group
    order = signal[np.lexsort((distance[signal], particle_id[signal]))]
    pid, lay = particle_id[order], layer[order]
    new_group = np.ones(len(order), dtype=bool)
    new_group[1:] = (pid[1:] != pid[:-1]) | (lay[1:] != lay[:-1])
    group[order] = np.cumsum(new_group) - 1
    return group


def count_true_segments(
    particle_id: np.ndarray, layer: np.ndarray, group: np.ndarray, adjacency: np.ndarray
) -> np.ndarray:
    """Per hit, the true segments it starts: hits of its particle's next group, when the two
    groups' layers are an adjacency pair (a segment across a missing layer cannot be an edge).

    Args:
      particle_id: int64 [N]; layer: int64 [N]; group: int64 [N] from
        ``group_hits_along_particles``; adjacency: int [P, 2].

    Returns:
      int64 [N]; its sum is the number of true segments.
    """
    return _next_group_sizes(particle_id, layer, group, adjacency)[0]


def count_lost_segments(
    particle_id: np.ndarray, layer: np.ndarray, group: np.ndarray, adjacency: np.ndarray
) -> np.ndarray:
    """Per hit, the true segments it starts that no layer pair can form: hits of its particle's
    next group when the two groups' layers are not an adjacency pair.

    Args and Returns: as ``count_true_segments``; the two counts never share a segment.
    """
    return _next_group_sizes(particle_id, layer, group, adjacency)[1]


def label_edges(
    particle_id: np.ndarray, group: np.ndarray, senders: np.ndarray, receivers: np.ndarray
) -> np.ndarray:
    """float32 [E]: 1.0 when both hits belong to the same (non-noise) particle and the outer
    hit is on the particle's next crossing after the inner one, else 0.0.

    Args:
      particle_id: int64 [N]; group: int64 [N] from ``group_hits_along_particles``;
      senders, receivers: int [E] inner and outer hit indices.
    """
    same = (particle_id[senders] == particle_id[receivers]) & (particle_id[senders] != 0)
    consecutive = group[receivers] == group[senders] + 1
    return (same & consecutive).astype(np.float32)


def _next_group_sizes(
    particle_id: np.ndarray, layer: np.ndarray, group: np.ndarray, adjacency: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per hit, the size of its particle's next group: int64 [N] where the two layers are an
    adjacency pair (formable), and int64 [N] where they are not (lost); 0 without a next group."""
    formable = np.zeros(len(group), dtype=np.int64)
    lost = np.zeros(len(group), dtype=np.int64)
    signal = group >= 0
    if not signal.any():
        return formable, lost
    num_groups = int(group.max()) + 1
    size = np.bincount(group[signal], minlength=num_groups)
    group_pid = np.zeros(num_groups, dtype=np.int64)
    group_layer = np.zeros(num_groups, dtype=np.int64)
    group_pid[group[signal]] = particle_id[signal]
    group_layer[group[signal]] = layer[signal]
    allowed = adjacency_mask(
        adjacency, max(int(layer.max()) + 1, int(adjacency.max(initial=0)) + 1)
    )
    has_next = np.zeros(num_groups, dtype=bool)
    has_next[:-1] = group_pid[1:] == group_pid[:-1]
    is_pair = np.zeros(num_groups, dtype=bool)
    is_pair[:-1] = allowed[group_layer[:-1], group_layer[1:]]
    next_size = np.zeros(num_groups, dtype=np.int64)
    next_size[:-1] = size[1:]
    formable[signal] = np.where(has_next & is_pair, next_size, 0)[group[signal]]
    lost[signal] = np.where(has_next & ~is_pair, next_size, 0)[group[signal]]
    return formable, lost
