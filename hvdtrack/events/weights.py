"""TrackML truth weights: per hit, a pT weight times a hit-order weight, summing to 1 per event.

The pT weight is 0.2 up to pT = 0.5 GeV, rising linearly to 1 at 3 GeV (and 0 below 0.05 GeV,
a guard of the TrackML library). The order weight spreads the proposal
[10, 8, 6, 5, 3, 3, 3, 5, 6] over a particle's hits ordered by |tz - vz| (from the vertex along
z), normalised to 1 per particle; particles with fewer than 4 hits weigh 0, at most 20 hits
count. Noise (particle_id 0) and particles missing from the particles table weigh 0. Written
from the definition in ``shared/design/physics.md``.

Public symbols: ``ORDER_PROPOSAL``, ``ORDER_MIN_HITS``, ``ORDER_MAX_HITS``, ``ORDER_WEIGHTS``,
``weight_pt``, ``hit_weights``.
"""

from __future__ import annotations

import numpy as np

ORDER_PROPOSAL = (10.0, 8.0, 6.0, 5.0, 3.0, 3.0, 3.0, 5.0, 6.0)
ORDER_MIN_HITS = 4
ORDER_MAX_HITS = 20


def _order_weights() -> np.ndarray:
    """float64 [ORDER_MAX_HITS + 1, ORDER_MAX_HITS]: row n, column i is the weight of the i-th
    hit of a particle with n hits (rows below ORDER_MIN_HITS are 0)."""
    table = np.zeros((ORDER_MAX_HITS + 1, ORDER_MAX_HITS))
    proposal = np.asarray(ORDER_PROPOSAL)
    for n in range(ORDER_MIN_HITS, ORDER_MAX_HITS + 1):
        # The proposal's points spread evenly from the first to the last hit.
        support = np.linspace(0.0, n - 1, len(proposal))
        row = np.interp(np.arange(n), support, proposal)
        table[n, :n] = row / row.sum()
    table.flags.writeable = False
    return table


ORDER_WEIGHTS = _order_weights()


def weight_pt(pt: np.ndarray) -> np.ndarray:
    """float64 [P]: 0.2 for 0.05 <= pT <= 0.5 GeV, linear to 1.0 at 3 GeV, 1.0 above, 0 below
    0.05 GeV."""
    return np.interp(np.asarray(pt, dtype=np.float64), [0.05, 0.5, 3.0], [0.2, 0.2, 1.0], left=0.0)


def hit_weights(
    hit_particle_id: np.ndarray,
    tz: np.ndarray,
    particle_id: np.ndarray,
    vz: np.ndarray,
    pt: np.ndarray,
) -> np.ndarray:
    """The TrackML weight of every hit.

    Args:
      hit_particle_id: int64 [H], particle of each hit (0 = noise).
      tz: float [H], true z of each hit (mm).
      particle_id, vz, pt: [P], the particles table: id, vertex z (mm), pT (GeV).

    Returns:
      float64 [H], summing to 1 (all 0 when no hit has a weight).
    """
    hit_particle_id = np.asarray(hit_particle_id, dtype=np.int64)
    tz = np.asarray(tz, dtype=np.float64)
    particle_id = np.asarray(particle_id, dtype=np.int64)
    weight = np.zeros(len(hit_particle_id))
    if len(particle_id) == 0:
        return weight
    by_id = np.argsort(particle_id, kind="stable")
    pos = np.minimum(np.searchsorted(particle_id[by_id], hit_particle_id), len(by_id) - 1)
    row = by_id[pos]
    listed = (hit_particle_id != 0) & (particle_id[row] == hit_particle_id)
    hit_vz = np.asarray(vz, dtype=np.float64)[row]
    w_pt = np.where(listed, weight_pt(np.asarray(pt)[row]), 0.0)

    # Rank each listed hit along its particle by |tz - vz|; count the particle's hits.
    hits = np.flatnonzero(listed)
    order = hits[np.lexsort((np.abs(tz[hits] - hit_vz[hits]), hit_particle_id[hits]))]
    pid = hit_particle_id[order]
    starts = np.flatnonzero(np.r_[len(pid) > 0, pid[1:] != pid[:-1]])
    counts = np.diff(np.r_[starts, len(order)])
    rank = np.arange(len(order)) - np.repeat(starts, counts)
    nhits = np.repeat(counts, counts)
    w_order = np.zeros(len(hit_particle_id))
    counted = rank < ORDER_MAX_HITS
    w_order[order[counted]] = ORDER_WEIGHTS[
        np.minimum(nhits[counted], ORDER_MAX_HITS), rank[counted]
    ]

    weight = w_pt * w_order
    total = weight.sum()
    return weight / total if total > 0 else weight
