"""The chain builder on hand-made hits of known helices: helix fits from summed moments, double
hits kept as one crossing, junctions resolved by mutual best edges, chains joined across a gap."""

import numpy as np
import pytest

from hvdtrack.tracks import helix
from hvdtrack.tracks.building import component_tracks
from hvdtrack.tracks.chains import (
    chain_tracks,
    double_hit_crossings,
    join_continuations,
    mutual_best,
)

RADII = np.array([32.0, 72.0, 116.0, 172.0, 260.0, 360.0, 500.0, 660.0, 820.0, 1020.0])


def helix_hits(radii, bend_radius, phi0=0.0, z0=0.0, cot_theta=0.5):
    """Hits at ``radii`` of a helix from the origin: a circle of ``bend_radius`` (mm) through
    the origin in x-y (np.inf: a straight line), starting along ``phi0``; z = z0 + cot_theta * s,
    s the arc length."""
    radii = np.asarray(radii, np.float64)
    if np.isinf(bend_radius):
        x, y, s = radii, np.zeros_like(radii), radii
    else:
        alpha = 2 * np.arcsin(radii / (2 * bend_radius))  # turning angle at radius r
        x, y = bend_radius * np.sin(alpha), bend_radius * (1 - np.cos(alpha))
        s = bend_radius * alpha
    c, n = np.cos(phi0), np.sin(phi0)
    return np.stack([c * x - n * y, n * x + c * y, z0 + cot_theta * s], axis=1)


def fit(*hit_sets):
    """The helix residuals of the hit sets fitted together, from their summed moments."""
    moments = [helix.hit_moments(np.zeros(len(h), np.int64), h, 1) for h in hit_sets]
    transverse, longitudinal = helix.residuals(sum(moments))
    return float(transverse[0]), float(longitudinal[0])


@pytest.mark.parametrize("bend_radius", [833.0, 1667.0, 50_000.0, np.inf])  # pT 0.5, 1, 30 GeV, inf
def test_a_helix_fits_itself_from_the_sums_of_its_pieces(bend_radius):
    hits = helix_hits(RADII, bend_radius, phi0=2.5, z0=-40.0)
    whole = fit(hits)
    pieces = fit(hits[:4], hits[6:])  # two pieces across a gap: their moments add
    # x-y exact; z against the arc length to third order in r / 2R: 1.2 mm off at pT 0.5 when
    # r / 2R reaches 0.6 (r = 1 m), far below MAX_LONGITUDINAL (10 mm).
    bound = 1.5 if bend_radius < 1000 else 0.1
    for transverse, longitudinal in (whole, pieces):
        assert transverse == pytest.approx(0.0, abs=1e-3) and longitudinal < bound


def test_two_different_helices_do_not_fit_as_one():
    inner = helix_hits(RADII[:4], 1667.0)
    assert fit(inner, helix_hits(RADII[6:], 1667.0, phi0=0.05))[0] > 2  # turned 50 mrad
    assert fit(inner, helix_hits(RADII[6:], 1667.0, z0=80.0))[1] > 10  # 80 mm apart in z
    # The other charge bends the other way.
    assert fit(inner, helix_hits(RADII[6:], -1667.0))[0] > 2
    # Two hits fix nothing: NaN, never a fit.
    assert np.isnan(fit(inner[:2])).all()


def test_double_hits_sharing_a_neighbour_are_one_crossing():
    # Hit 0 scores well to hits 1 and 2 (3 mm apart, one behind the other as seen from 0: a
    # module overlap), 3 (100 mm away) and 4 (4 mm beside 1 on its module: another particle).
    xyz = np.array([[30.0, 0, 0], [70, 0, 0], [73, 0.1, 0], [70, 100, 0], [70, 4, 0]])
    senders, receivers = np.array([0, 0, 0, 0]), np.array([1, 2, 3, 4])
    scores = np.array([0.9, 0.8, 0.7, 0.85])
    crossing = double_hit_crossings(5, senders, receivers, scores, xyz)
    assert crossing.tolist() == [0, 1, 1, 2, 3]
    # The same hits sharing the hit after them.
    crossing = double_hit_crossings(5, receivers, senders, scores, xyz)
    assert crossing.tolist() == [0, 1, 1, 2, 3]
    # Side by side is one crossing only when the alignment is not asked for.
    crossing = double_hit_crossings(5, senders, receivers, scores, xyz, min_alignment=-1.0)
    assert crossing.tolist() == [0, 1, 1, 2, 1]


def test_mutual_best_keeps_an_edge_best_at_both_ends():
    # 0 -> 2 (0.9) is 0's best but not 2's (1 -> 2, 0.95); 0 -> 3 (0.6) is 3's best but not
    # 0's: neither is kept, and 0 is left out rather than given a second choice.
    senders, receivers = np.array([0, 1, 0, 2]), np.array([2, 2, 3, 4])
    scores = np.array([0.9, 0.95, 0.6, 0.8])
    assert mutual_best(senders, receivers, scores).tolist() == [1, 3]


def test_chains_keep_double_hits_and_resolve_a_junction():
    # Particle A on 6 layers with a double hit on layer 2 (hits 2 and 3); particle B beside it.
    # A fake edge from A's hit 1 into B's hit 9 scores 0.7: components merge A and B, the chain
    # builder does not (9's best incoming edge is B's own, 0.95).
    a = helix_hits(RADII[:6], 1667.0)
    path = (a[3] - a[2]) / np.linalg.norm(a[3] - a[2])
    a = np.insert(a, 3, a[2] + 3.0 * path, axis=0)  # hit 3: 3 mm behind hit 2 on its path
    b = helix_hits(RADII[:6], 1667.0, phi0=0.4)  # 46 mm from A on layer 2
    xyz = np.concatenate([a, b])  # A: hits 0-6, B: hits 7-12
    senders = np.array([0, 1, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 1])
    receivers = np.array([1, 2, 3, 4, 4, 5, 6, 8, 9, 10, 11, 12, 9])
    scores = np.array([0.99] * 7 + [0.95] * 5 + [0.7])
    chained = chain_tracks(13, senders, receivers, scores, xyz, 0.5, min_hits=3)
    assert chained.tolist() == [1] * 7 + [2] * 6
    assert component_tracks(13, senders, receivers, scores, 0.5).tolist() == [1] * 13


def test_a_particle_split_by_a_missing_layer_is_joined_but_not_to_another():
    # One particle in two chains (layers 0-3, 5-9: layer 4 missed, no edge spans it), and a
    # chain of another particle starting where the first one's gap ends, bent the other way.
    inner, outer = helix_hits(RADII[:4], 1667.0), helix_hits(RADII[5:], 1667.0)
    other = helix_hits(RADII[5:], -1667.0, phi0=0.1)
    xyz = np.concatenate([inner, outer, other])
    chain = np.repeat([0, 1, 2], [4, 5, 5])
    joined = join_continuations(chain, xyz)
    assert joined.tolist() == [0] * 9 + [1] * 5
    # The same through chain_tracks: edges only within each chain.
    senders = np.array([0, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12])
    scores = np.full(senders.size, 0.9)
    tracks = chain_tracks(14, senders, senders + 1, scores, xyz, 0.5, min_hits=3)
    assert tracks.tolist() == [1] * 9 + [2] * 5
