"""Candidate hit pairs: which layers edges may join, and which hit pairs pass the segment cuts.

Edges join an inner hit (sender) to an outer hit (receiver) on a pair of layers of the
adjacency table, when the pair passes the phi-slope cut |dphi| <= phi_slope_max * dr and the z0
cut |z1 - r1 dz/dr| <= z0_max. Candidate pairs come from phi-sorted layers and
``np.searchsorted`` windows (never all pairs), with wrap-around at +-pi.

Public symbols: ``layer_adjacency``, ``adjacency_mask``, ``find_candidate_pairs``,
``segment_cut_mask``, ``wrap_angle``.
"""

from __future__ import annotations

import functools

import numpy as np

from hvdtrack.errors import DataError
from hvdtrack.events import detector

_TWO_PI = 2.0 * np.pi


def layer_adjacency(barrel_only: bool) -> np.ndarray:
    """The (inner, outer) pairs of global layer indices that edges may join.

    Barrel only: consecutive barrel layers, [[0, 1], [1, 2], ..., [8, 9]]. Whole detector: every
    pair of surfaces crossed one after the other by some helix from the luminous region
    (|z0| <= 200 mm, pT >= 0.15 GeV up to straight lines, |eta| <= 4.5); this yields
    barrel -> barrel, barrel -> first disks, disk -> next disk, pixel end-cap -> strip end-cap or
    strip barrel, and so on, derived from the geometry in ``detector`` rather than typed by hand.

    Returns:
      int64 array [P, 2], sorted by (inner, outer); read-only.
    """
    return _scanned_adjacency() if not barrel_only else _barrel_adjacency()


def find_candidate_pairs(
    layer: np.ndarray,
    r: np.ndarray,
    phi: np.ndarray,
    z: np.ndarray,
    adjacency: np.ndarray,
    phi_slope_max: float,
    z0_max: float,
    max_pairs: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Candidate (inner, outer) hit pairs on adjacent layers that may pass the segment cuts.

    For each layer pair, the z0 cut bounds where on the outer layer a partner can lie (a z range
    on a cylinder, an r range on a disk, hence also the largest dr), and dr bounds the phi
    window |dphi| <= phi_slope_max * dr. The outer layer's hits are binned along z (or r) and
    sorted by phi within each bin, with each bin's phis repeated at -2pi and +2pi so windows
    wrap around +-pi; every inner hit then finds its partners by binary search in the bins its
    range covers. The result is a superset of the pairs passing ``segment_cut_mask`` and costs
    O(N log N + candidates), never O(N_inner * N_outer).

    Args:
      layer: int64 [N] global layer index per hit.
      r, phi, z: float64 [N] hit coordinates (phi in [-pi, pi]).
      adjacency: int [P, 2] (inner, outer) layer pairs.
      phi_slope_max: rad/mm; z0_max: mm.
      max_pairs: the most candidates to allocate (None: no bound).

    Returns:
      (senders, receivers): int64 [C] hit indices, inner and outer.

    Raises:
      DataError: more than ``max_pairs`` candidates, counted before they are allocated.
    """
    order = np.argsort(layer, kind="stable")
    num_layers = max(int(adjacency.max(initial=-1)), int(layer.max(initial=-1))) + 1
    bounds = np.searchsorted(layer[order], np.arange(num_layers + 1))
    senders, receivers = [], []
    budget = np.inf if max_pairs is None else max_pairs
    for inner, outer in adjacency:
        a = order[bounds[inner] : bounds[inner + 1]]
        b = order[bounds[outer] : bounds[outer + 1]]
        if len(a) and len(b):
            barrel = bool(detector.LAYER_IS_BARREL[outer])
            pair = _candidates_between(a, b, r, phi, z, barrel, phi_slope_max, z0_max, budget)
            budget -= len(pair[0])
            senders.append(pair[0])
            receivers.append(pair[1])
    if not senders:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(senders), np.concatenate(receivers)


def segment_cut_mask(
    r: np.ndarray,
    phi: np.ndarray,
    z: np.ndarray,
    senders: np.ndarray,
    receivers: np.ndarray,
    phi_slope_max: float,
    z0_max: float,
) -> np.ndarray:
    """Which candidate segments pass the geometric cuts.

    A segment needs dr > 0 (it points outwards), |dphi| <= phi_slope_max * dr and
    |z0| <= z0_max with z0 = z1 - r1 dz / dr. Both cuts are evaluated multiplied through by dr,
    so end-cap pairs with dr close to 0 need no division: their allowed dphi and z0 window shrink
    with dr, as a track's own dphi does.

    Args:
      r, phi, z: float64 [N] hit coordinates.
      senders, receivers: int [C] inner and outer hit indices.

    Returns:
      bool [C].
    """
    r1, r2 = r[senders], r[receivers]
    dr = r2 - r1
    dphi = wrap_angle(phi[receivers] - phi[senders])
    dz = z[receivers] - z[senders]
    return (
        (dr > 0)
        & (np.abs(dphi) <= phi_slope_max * dr)
        & (np.abs(z[senders] * dr - r1 * dz) <= z0_max * dr)
    )


def _candidates_between(
    a: np.ndarray,
    b: np.ndarray,
    r: np.ndarray,
    phi: np.ndarray,
    z: np.ndarray,
    outer_is_barrel: bool,
    phi_slope_max: float,
    z0_max: float,
    budget: float = np.inf,
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates from inner hits ``a`` to outer hits ``b`` (one layer pair); see
    ``find_candidate_pairs``."""
    r_a, z_a = r[a], z[a]
    # u: the coordinate along the outer surface (z on a cylinder, r on a disk).
    if outer_is_barrel:
        u_b = z[b]
        u_lo, u_hi, dr_hi = _cylinder_window(r_a, z_a, r[b].min(), r[b].max(), z0_max)
    else:
        u_b = r[b]
        u_lo, u_hi, dr_hi = _disk_window(r_a, z_a, r[b].max(), z[b], z0_max)
    margin = 1e-9 * (np.abs(r_a) + np.abs(z_a) + z0_max)  # keep boundary pairs for the exact cut
    u_lo, u_hi = u_lo - margin, u_hi + margin
    half_width = phi_slope_max * np.maximum(dr_hi, 0.0) * (1.0 + 1e-12)

    u_min, u_max = u_b.min(), u_b.max()
    num_bins = int(np.clip(len(b) // 32, 1, 64))
    bin_width = max((u_max - u_min) / num_bins, 1e-9)
    b_bin = np.minimum(((u_b - u_min) / bin_width).astype(np.int64), num_bins - 1)
    keys, key_hit = _binned_phi_keys(b, b_bin, phi[b])
    valid = (u_hi >= u_min) & (u_lo <= u_max) & (half_width > 0)
    inner, bin_index = _spanned_bins(
        np.where(valid, u_lo, u_min),
        np.where(valid, u_hi, u_min),
        valid,
        u_min,
        bin_width,
        num_bins,
    )
    base = bin_index * _BIN_STRIDE + phi[a][inner] + 3.0 * np.pi
    count, position = _phi_window_matches(keys, base, half_width[inner], budget)
    return np.repeat(a[inner], count), key_hit[position]


def _cylinder_window(
    r_a: np.ndarray, z_a: np.ndarray, r_b_min: float, r_b_max: float, z0_max: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per inner hit [A], the z range (u_lo, u_hi) on an outer cylinder and the largest dr."""
    # From z0 = z_a - r_a dz / dr with |z0| <= z0_max and dr > 0: z_b = z_a + (z_a - z0) dr / r_a,
    # linear in z0 and dr, so the extreme corners bound it.
    with np.errstate(divide="ignore", invalid="ignore"):
        corners = [
            z_a + (z_a - z0) * (dr / r_a)
            for z0 in (-z0_max, z0_max)
            for dr in (r_b_min - r_a, r_b_max - r_a)
        ]
        u_lo, u_hi = np.minimum.reduce(corners), np.maximum.reduce(corners)
    return u_lo, u_hi, r_b_max - r_a


def _disk_window(
    r_a: np.ndarray, z_a: np.ndarray, r_b_max: float, z_b: np.ndarray, z0_max: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per inner hit [A], the r range (u_lo, u_hi) on an outer disk with hits at z_b [B], and
    the largest dr (at most r_b_max - r_a)."""
    # z0 = z_a - r_a dz / dr with dr > 0 puts z_a - z0 on the side of dz, so
    # dr = r_a |dz| / |z_a - z0| with |z_a - z0| in [near, far]. Disk modules may be
    # staggered in z, so |dz| spans the layer's z range; an inner hit inside that range
    # (dz of either sign) is not bounded.
    with np.errstate(divide="ignore", invalid="ignore"):
        dz_min, dz_max = z_b.min() - z_a, z_b.max() - z_a
        side = np.where(dz_min > 0, 1.0, np.where(dz_max < 0, -1.0, 0.0))
        abs_dz_min = np.where(side > 0, dz_min, -dz_max)
        abs_dz_max = np.where(side > 0, dz_max, -dz_min)
        near = side * z_a - z0_max
        far = side * z_a + z0_max
        dr_lo = np.where(far > 0, r_a * abs_dz_min / far, np.inf)
        dr_hi = np.where(near > 0, r_a * abs_dz_max / near, np.inf)
        unbounded = side == 0
        dr_lo = np.where(unbounded, -np.inf, dr_lo)
        dr_hi = np.where(unbounded, np.inf, dr_hi)
        u_lo, u_hi = r_a + dr_lo, r_a + dr_hi
        dr_hi = np.minimum(dr_hi, r_b_max - r_a)
    return u_lo, u_hi, dr_hi


# Bins of outer hits are laid end to end in one key axis, this far apart (> 6 pi: no overlap).
_BIN_STRIDE = 32.0


def _binned_phi_keys(
    b: np.ndarray, b_bin: np.ndarray, phi_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted keys bin * stride + phi + 3 pi of the outer hits b [B] (phi repeated at -2pi, 0
    and +2pi so windows wrap), float64 [3B], and the hit of each key, int [3B]."""
    shifted = phi_b + 3.0 * np.pi
    keys = (
        np.concatenate([shifted - _TWO_PI, shifted, shifted + _TWO_PI])
        + np.tile(b_bin, 3) * _BIN_STRIDE
    )
    key_order = np.argsort(keys, kind="stable")
    return keys[key_order], np.tile(b, 3)[key_order]


def _spanned_bins(
    u_lo: np.ndarray,
    u_hi: np.ndarray,
    valid: np.ndarray,
    u_min: float,
    bin_width: float,
    num_bins: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Every (inner hit, bin) pair whose bin the hit's range [u_lo, u_hi] [A] covers (none for
    hits not ``valid``): the inner hit's position in [A] and the bin, both int64 [S]."""
    bin_lo = np.clip(np.floor((u_lo - u_min) / bin_width), 0, num_bins - 1)
    bin_hi = np.clip(np.floor((u_hi - u_min) / bin_width), 0, num_bins - 1)
    bin_lo, bin_hi = bin_lo.astype(np.int64), bin_hi.astype(np.int64)
    num_spanned = np.where(valid, bin_hi - bin_lo + 1, 0)
    inner = np.repeat(np.arange(len(u_lo)), num_spanned)
    offset = np.arange(len(inner)) - np.repeat(np.cumsum(num_spanned) - num_spanned, num_spanned)
    return inner, bin_lo[inner] + offset


def _phi_window_matches(
    keys: np.ndarray, base: np.ndarray, w: np.ndarray, budget: float = np.inf
) -> tuple[np.ndarray, np.ndarray]:
    """Keys within [base - w, base + w] of each query [S]: the count per query, int64 [S], and
    the matched keys' positions, grouped by query, int64 [sum of counts]; DataError when that
    sum exceeds ``budget`` (before the positions are allocated)."""
    full = w >= np.pi
    # Closed window [phi - w, phi + w]; a full turn is taken half-open so no hit comes twice.
    start = np.searchsorted(keys, np.where(full, base - np.pi, base - w), side="left")
    stop = np.where(
        full,
        np.searchsorted(keys, base + np.pi, side="left"),
        np.searchsorted(keys, base + w, side="right"),
    )
    count = np.maximum(stop - start, 0)
    total = int(count.sum())
    if total > budget:
        raise DataError(f"more candidate hit pairs than the {budget:g} still allowed")
    position = np.repeat(start - (np.cumsum(count) - count), count) + np.arange(total)
    return count, position


def adjacency_mask(adjacency: np.ndarray, num_layers: int) -> np.ndarray:
    """bool [num_layers, num_layers]: True at (inner, outer) pairs of ``adjacency``."""
    mask = np.zeros((num_layers, num_layers), dtype=bool)
    if len(adjacency):
        mask[adjacency[:, 0], adjacency[:, 1]] = True
    return mask


@functools.lru_cache(maxsize=1)
def _barrel_adjacency() -> np.ndarray:
    inner = np.arange(detector.NUM_BARREL_LAYERS - 1)
    pairs = np.stack([inner, inner + 1], axis=1)
    pairs.flags.writeable = False
    return pairs


@functools.lru_cache(maxsize=1)
def _scanned_adjacency() -> np.ndarray:
    """Consecutive surface crossings of helices from the beam line, over a grid of
    pseudorapidity, vertex z and curvature radius. (A grid 6x denser in eta, 3x in z and 2x in
    pT gives the same 114 pairs.)"""
    eta = np.linspace(-4.5, 4.5, 601)
    z0 = np.linspace(-200.0, 200.0, 5)
    pt = np.array([0.15, 0.3, 0.6, 1.0, 3.0, np.inf])
    lam_grid, z0_grid, pt_grid = np.meshgrid(np.sinh(eta), z0, pt, indexing="ij")
    lam, vz = lam_grid.ravel(), z0_grid.ravel()
    radius = pt_grid.ravel() / 0.6 * 1000.0  # mm at 2 T
    # Transverse path s to reach radius r: 2R asin(r / 2R) (s = r for a straight line);
    # the transverse radius at path s: 2R sin(s / 2R); the outgoing arc ends at s = pi R.
    path = np.full((len(lam), detector.NUM_LAYERS), np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        for layer in detector.LAYERS:
            if layer.is_barrel:
                ratio = layer.r_min / (2.0 * radius)
                s = np.where(ratio <= 1.0, 2.0 * radius * np.arcsin(np.minimum(ratio, 1.0)), np.inf)
                s = np.where(np.isinf(radius), layer.r_min, s)
                ok = np.isfinite(s) & (np.abs(vz + lam * s) <= layer.z_max)
            else:
                s = (layer.z_min - vz) / lam
                rho = np.where(np.isinf(radius), s, 2.0 * radius * np.sin(s / (2.0 * radius)))
                ok = (s > 0) & (s <= np.pi * radius) & (rho >= layer.r_min) & (rho <= layer.r_max)
            path[:, layer.index] = np.where(ok, s, np.inf)
    order = np.argsort(path, axis=1)
    ordered_path = np.take_along_axis(path, order, axis=1)
    consecutive = np.isfinite(ordered_path[:, 1:])
    keys = order[:, :-1][consecutive] * detector.NUM_LAYERS + order[:, 1:][consecutive]
    keys = np.unique(keys)
    pairs = np.stack([keys // detector.NUM_LAYERS, keys % detector.NUM_LAYERS], axis=1)
    pairs.flags.writeable = False
    return pairs


def wrap_angle(angle: np.ndarray) -> np.ndarray:
    """Maps a difference of two angles in [-pi, pi] into [-pi, pi]."""
    return angle - _TWO_PI * ((angle > np.pi).astype(np.float64) - (angle < -np.pi))
