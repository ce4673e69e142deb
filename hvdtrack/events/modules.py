"""The module tiling of the detector: flat sensors that overlap, and hits placed on them.

Every layer is tiled by flat modules (TrackML's ``detectors.csv`` lists them, ``module_table``).
Barrel layer: ``n_phi`` (even) rectangles around the beam, ``n_along`` along z; module (k, j)
is tangent to a cylinder of radius r + stagger, its nominal half width r tan(pi / n_phi) and half
length half_length / n_along grown by the overlap fractions, so that neighbours overlap. Disk:
``n_along`` rings of ``n_phi`` trapezoids, perpendicular to z. Neighbours in phi sit
``STAGGER_PHI`` apart (along the normal: radius on a cylinder, z on a disk), neighbours along z
or r ``STAGGER_ALONG`` apart, so overlapping modules are distinct planes; a particle crossing
an overlap leaves a hit on each (TrackML's double hits, 26-28% of real layer crossings).

Local axes: u across the module (along r*phi), v along it (z on a cylinder, r on a disk), w =
u x v (outwards on a cylinder, -z on a disk).

Public symbols: ``MODULES``, ``Modules``, ``module_table``, ``hits_on_modules``,
``module_channels``, ``sample_on_modules``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hvdtrack.events import detector

# Per volume group (pixel, short strip, long strip), TrackML-like values (mm).
_GROUPS = (detector.PIXEL_VOLUMES, detector.SHORT_STRIP_VOLUMES, detector.LONG_STRIP_VOLUMES)
_WIDTH = (16.8, 48.0, 48.0)  # nominal module width along r*phi
_LENGTH = (72.0, 108.0, 108.0)  # nominal module length along z (barrel) or r (disk)
_THICKNESS = (0.15, 0.25, 0.35)
_PITCH = ((0.05, 0.05), (0.08, 1.2), (0.12, 10.8))  # (u, v)
# Overlap of neighbouring modules as a fraction of the nominal width (phi) and length (along).
OVERLAP_PHI = 0.22
OVERLAP_ALONG = 0.06
STAGGER_PHI = (2.0, 4.0, 4.0)
STAGGER_ALONG = (1.0, 2.0, 2.0)
# A crossing further than this from a module plane (grazing incidence) leaves no hit on it.
_MAX_STEP = 30.0


def _group(volume_id: int) -> int:
    return next(i for i, volumes in enumerate(_GROUPS) if volume_id in volumes)


@dataclasses.dataclass(frozen=True)
class Modules:
    """Every module as arrays [M] (rows ordered by global layer index, then module_id), with the
    per-layer tiling [NUM_LAYERS]: n_phi, n_along, first row, start and step of the along
    coordinate (z on a cylinder, r on a disk)."""

    layer: np.ndarray
    module_id: np.ndarray
    centre: np.ndarray  # [M, 3]
    u: np.ndarray  # [M, 3]
    v: np.ndarray  # [M, 3]
    w: np.ndarray  # [M, 3]
    half_u_min: np.ndarray
    half_u_max: np.ndarray
    half_v: np.ndarray
    thickness: np.ndarray
    pitch: np.ndarray  # [M, 2]
    n_phi: np.ndarray
    n_along: np.ndarray
    first_row: np.ndarray
    along_start: np.ndarray
    along_step: np.ndarray

    def row(self, layer: np.ndarray, i_phi: np.ndarray, i_along: np.ndarray) -> np.ndarray:
        """Module rows of (layer, column around phi, row along z or r)."""
        return self.first_row[layer] + i_along * self.n_phi[layer] + i_phi

    def half_u(self, rows: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Half width at local v (trapezoids widen linearly from -half_v to +half_v)."""
        frac = 0.5 * (1.0 + v / self.half_v[rows])
        return self.half_u_min[rows] + frac * (self.half_u_max[rows] - self.half_u_min[rows])


def _build() -> Modules:
    parts: dict[str, list] = {k: [] for k in ("layer", "module_id", "centre", "u", "v", "w")}
    parts.update({k: [] for k in ("half_u_min", "half_u_max", "half_v", "thickness", "pitch")})
    n_phi = np.zeros(detector.NUM_LAYERS, dtype=np.int64)
    n_along = np.zeros(detector.NUM_LAYERS, dtype=np.int64)
    first_row = np.zeros(detector.NUM_LAYERS, dtype=np.int64)
    along_start = np.zeros(detector.NUM_LAYERS)
    along_step = np.zeros(detector.NUM_LAYERS)
    row = 0
    for layer in detector.LAYERS:
        g, i = _group(layer.volume_id), layer.index
        r_mid = 0.5 * (layer.r_min + layer.r_max)
        n_p = int(np.ceil(2 * np.pi * r_mid / _WIDTH[g]))
        n_p += n_p % 2  # even, so that the phi stagger alternates all the way round
        extent = layer.z_max - layer.z_min if layer.is_barrel else layer.r_max - layer.r_min
        n_a = int(np.ceil(extent / _LENGTH[g]))
        step = extent / n_a
        start = layer.z_min if layer.is_barrel else layer.r_min
        n_phi[i], n_along[i], first_row[i] = n_p, n_a, row
        along_start[i], along_step[i] = start, step
        i_along, i_phi = np.divmod(np.arange(n_p * n_a), n_p)
        phi = -np.pi + (i_phi + 0.5) * (2 * np.pi / n_p)
        along = start + (i_along + 0.5) * step
        offset = STAGGER_PHI[g] * (i_phi % 2 - 0.5) + STAGGER_ALONG[g] * (i_along % 2 - 0.5)
        cos, sin, zero, one = np.cos(phi), np.sin(phi), np.zeros(len(phi)), np.ones(len(phi))
        half_v = 0.5 * step * (1.0 + OVERLAP_ALONG) * one
        if layer.is_barrel:
            radius = layer.r_min + offset
            centre = np.stack([radius * cos, radius * sin, along], axis=1)
            axes = ((-sin, cos, zero), (zero, zero, one), (cos, sin, zero))
            half_u_min = half_u_max = layer.r_min * np.tan(np.pi / n_p) * (1 + OVERLAP_PHI) * one
        else:
            centre = np.stack([along * cos, along * sin, layer.z_min + offset], axis=1)
            axes = ((-sin, cos, zero), (cos, sin, zero), (zero, zero, -one))
            half_u_min = np.pi * (along - half_v) / n_p * (1 + OVERLAP_PHI)
            half_u_max = np.pi * (along + half_v) / n_p * (1 + OVERLAP_PHI)
        parts["layer"].append(np.full(len(phi), i))
        parts["module_id"].append(i_along * n_p + i_phi + 1)
        parts["centre"].append(centre)
        for name, axis in zip(("u", "v", "w"), axes):
            parts[name].append(np.stack(axis, axis=1))
        parts["half_u_min"].append(half_u_min)
        parts["half_u_max"].append(half_u_max)
        parts["half_v"].append(half_v)
        parts["thickness"].append(np.full(len(phi), _THICKNESS[g]))
        parts["pitch"].append(np.tile(_PITCH[g], (len(phi), 1)))
        row += len(phi)
    arrays = {name: np.concatenate(values) for name, values in parts.items()}
    modules = Modules(
        **arrays,
        n_phi=n_phi,
        n_along=n_along,
        first_row=first_row,
        along_start=along_start,
        along_step=along_step,
    )
    for field in dataclasses.fields(modules):
        getattr(modules, field.name).flags.writeable = False
    return modules


MODULES = _build()


def module_table() -> dict[str, np.ndarray]:
    """Every module of the detector in the columns of TrackML's ``detectors.csv``.

    ``rot_<global><local>`` are the components of the local axes u, v, w in global x, y, z.

    Returns:
      {column: array [M]}: volume_id, layer_id, module_id (int64), cx, cy, cz, rot_xu ...
      rot_zw, module_t, module_minhu, module_maxhu, module_hv, pitch_u, pitch_v (float64), in
      the order of ``detectors.csv``; modules sorted by volume, layer and module id.
    """
    m = MODULES
    table = {
        "volume_id": detector.LAYER_VOLUME_ID[m.layer],
        "layer_id": detector.LAYER_LAYER_ID[m.layer],
        "module_id": m.module_id,
        "cx": m.centre[:, 0],
        "cy": m.centre[:, 1],
        "cz": m.centre[:, 2],
    }
    for k, xyz in enumerate("xyz"):
        for axis in ("u", "v", "w"):
            table[f"rot_{xyz}{axis}"] = getattr(m, axis)[:, k]
    table.update(
        module_t=m.thickness,
        module_minhu=m.half_u_min,
        module_maxhu=m.half_u_max,
        module_hv=m.half_v,
        pitch_u=m.pitch[:, 0],
        pitch_v=m.pitch[:, 1],
    )
    order = np.lexsort((table["module_id"], table["layer_id"], table["volume_id"]))
    return {name: np.array(column[order]) for name, column in table.items()}


def hits_on_modules(
    layer: np.ndarray, point: np.ndarray, direction: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Where tracks crossing a layer hit its modules: one hit, or two in an overlap.

    Each crossing is a point on the layer's nominal surface (cylinder or disk) and a direction;
    near the point the track is taken as straight (the error is about step^2 / 2R: 0.03 mm
    for a 4 mm step at pT 0.1 GeV, up to about 1 mm for a looper's grazing crossing). The
    module under the point and its nearer neighbours in phi and along are intersected; a hit
    counts when it lies inside the module.

    Args:
      layer: int64 [C] global layer index; point: float64 [C, 3]; direction: float64 [C, 3]
        (unit vectors).

    Returns:
      (crossing, row, position, local_u, local_v): int64 [H] index into the crossings, int64
      [H] module row of ``MODULES``, float64 [H, 3] hit position, float64 [H] local coordinates.
    """
    m = MODULES
    x, y, z = point[:, 0], point[:, 1], point[:, 2]
    barrel = detector.LAYER_IS_BARREL[layer]
    along = np.where(barrel, z, np.hypot(x, y))
    n_phi, n_along = m.n_phi[layer], m.n_along[layer]
    f_phi = (np.arctan2(y, x) + np.pi) / (2 * np.pi) * n_phi
    f_along = (along - m.along_start[layer]) / m.along_step[layer]
    i_phi = np.clip(np.floor(f_phi).astype(np.int64), 0, n_phi - 1)
    i_along = np.clip(np.floor(f_along).astype(np.int64), 0, n_along - 1)
    # The nominal module and its nearer neighbour in phi and along (overlaps are far narrower
    # than half a module).
    side_phi = np.where(f_phi - i_phi < 0.5, -1, 1)
    side_along = np.where(f_along - i_along < 0.5, -1, 1)
    zero = np.zeros_like(i_phi)
    cand_phi = np.mod(i_phi[:, None] + np.stack([zero, side_phi, zero], 1), n_phi[:, None])
    cand_along = i_along[:, None] + np.stack([zero, zero, side_along], 1)
    valid = (cand_along >= 0) & (cand_along < n_along[:, None])
    crossing, k = np.nonzero(valid)
    rows = m.row(layer[crossing], cand_phi[crossing, k], cand_along[crossing, k])
    p, d = point[crossing], direction[crossing]
    normal = m.w[rows]
    along_normal = np.einsum("ij,ij->i", d, normal)
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.einsum("ij,ij->i", m.centre[rows] - p, normal) / along_normal
    hit = p + step[:, None] * d
    rel = hit - m.centre[rows]
    local_u = np.einsum("ij,ij->i", rel, m.u[rows])
    local_v = np.einsum("ij,ij->i", rel, m.v[rows])
    inside = (
        np.isfinite(step)
        & (np.abs(step) <= _MAX_STEP)
        & (np.abs(local_v) <= m.half_v[rows])
        & (np.abs(local_u) <= m.half_u(rows, np.clip(local_v, -m.half_v[rows], m.half_v[rows])))
    )
    return crossing[inside], rows[inside], hit[inside], local_u[inside], local_v[inside]


def module_channels(
    rows: np.ndarray, local_u: np.ndarray, local_v: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The readout channel under each hit: (ch0 across, ch1 along the module), counted from the
    module's low edge in steps of its pitch. int64 [H] each, >= 0."""
    m = MODULES
    ch0 = np.floor((local_u + m.half_u_max[rows]) / m.pitch[rows, 0]).astype(np.int64)
    ch1 = np.floor((local_v + m.half_v[rows]) / m.pitch[rows, 1]).astype(np.int64)
    return np.maximum(ch0, 0), np.maximum(ch1, 0)


def sample_on_modules(
    layers: np.ndarray, num: int, rng: np.random.Generator
) -> tuple[np.ndarray, ...]:
    """``num`` points uniform over the area of the modules of ``layers``.

    Returns:
      (row, position, local_u, local_v) as ``hits_on_modules``.
    """
    m = MODULES
    candidates = np.flatnonzero(np.isin(m.layer, layers))
    area = 2.0 * (m.half_u_min + m.half_u_max)[candidates] * m.half_v[candidates]
    rows = candidates[rng.choice(len(candidates), size=num, p=area / area.sum())]
    local_v = (2.0 * rng.random(num) - 1.0) * m.half_v[rows]
    local_u = (2.0 * rng.random(num) - 1.0) * m.half_u(rows, local_v)
    position = m.centre[rows] + local_u[:, None] * m.u[rows] + local_v[:, None] * m.v[rows]
    return rows, position, local_u, local_v
