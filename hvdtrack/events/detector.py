"""TrackML tracker geometry as named constants, with a global layer index and vectorised lookups.

All lengths in mm. The detector is a set of barrel cylinders (volumes 8, 13, 17) and end-cap
disks (volumes 7/9, 12/14, 16/18 on the -z / +z sides), as tabulated in
``shared/design/physics.md``. ``layer_id`` is even (2, 4, 6, ...), counted outwards in the barrels
and with z increasing in every end-cap, as real TrackML numbers them: on the -z side layer 2 is
the disk farthest from z = 0 (volume 7 layer 2 at z = -1500, layer 14 at -600), on the +z side
the nearest.

Global layer index: the 10 barrel layers come first, ordered by radius (0..9), then the end-cap
disks volume by volume (7, 9, 12, 14, 16, 18), each from the disk nearest z = 0 outwards, the
order an outgoing particle crosses them (10..47). So with ``barrel_only`` graphs the layer index
is simply 0..9, and on the -z side the index runs against the layer_id.

Public symbols: ``BarrelLayer``, ``EndcapDisk``, ``Layer``, ``BARREL_LAYERS``, ``ENDCAP_DISKS``,
``LAYERS``, ``NUM_LAYERS``, ``NUM_BARREL_LAYERS``, ``BARREL_VOLUMES``, ``ENDCAP_VOLUMES``,
``PIXEL_VOLUMES``, ``SHORT_STRIP_VOLUMES``, ``LONG_STRIP_VOLUMES``, ``LAYER_VOLUME_ID``,
``LAYER_LAYER_ID``, ``LAYER_IS_BARREL``, ``LAYER_R_MIN``, ``LAYER_R_MAX``, ``LAYER_Z_MIN``,
``LAYER_Z_MAX``, ``layer_index``, ``is_barrel``, ``module_id``, ``module_channels``,
``module_table``.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class BarrelLayer:
    """A barrel cylinder centred on the beam line: |z| <= half_length at r = radius."""

    volume_id: int
    layer_id: int
    radius: float
    half_length: float


@dataclasses.dataclass(frozen=True)
class EndcapDisk:
    """An end-cap disk at signed position z, covering r_min <= r <= r_max."""

    volume_id: int
    layer_id: int
    z: float
    r_min: float
    r_max: float


@dataclasses.dataclass(frozen=True)
class Layer:
    """One sensitive surface with its global index, as an (r, z) box: a cylinder has
    r_min == r_max, a disk has z_min == z_max."""

    index: int
    volume_id: int
    layer_id: int
    is_barrel: bool
    r_min: float
    r_max: float
    z_min: float
    z_max: float


BARREL_VOLUMES = (8, 13, 17)
ENDCAP_VOLUMES = (7, 9, 12, 14, 16, 18)
PIXEL_VOLUMES = (7, 8, 9)
SHORT_STRIP_VOLUMES = (12, 13, 14)
LONG_STRIP_VOLUMES = (16, 17, 18)

_PIXEL_BARREL_RADII = (32.0, 72.0, 116.0, 172.0)
_SHORT_STRIP_BARREL_RADII = (260.0, 360.0, 500.0, 660.0)
_LONG_STRIP_BARREL_RADII = (820.0, 1020.0)
_PIXEL_DISK_Z = (600.0, 700.0, 820.0, 960.0, 1100.0, 1300.0, 1500.0)
_STRIP_DISK_Z = (1220.0, 1500.0, 1800.0, 2150.0, 2550.0, 2950.0)

BARREL_LAYERS: tuple[BarrelLayer, ...] = (
    *(BarrelLayer(8, 2 * (i + 1), r, 500.0) for i, r in enumerate(_PIXEL_BARREL_RADII)),
    *(BarrelLayer(13, 2 * (i + 1), r, 1140.0) for i, r in enumerate(_SHORT_STRIP_BARREL_RADII)),
    *(BarrelLayer(17, 2 * (i + 1), r, 1140.0) for i, r in enumerate(_LONG_STRIP_BARREL_RADII)),
)

# (volume_id, z sign, disk |z| positions from z = 0 outwards, r_min, r_max), in global-index order.
_ENDCAP_SPECS = (
    (7, -1.0, _PIXEL_DISK_Z, 25.0, 200.0),
    (9, +1.0, _PIXEL_DISK_Z, 25.0, 200.0),
    (12, -1.0, _STRIP_DISK_Z, 235.0, 730.0),
    (14, +1.0, _STRIP_DISK_Z, 235.0, 730.0),
    (16, -1.0, _STRIP_DISK_Z, 750.0, 1050.0),
    (18, +1.0, _STRIP_DISK_Z, 750.0, 1050.0),
)


def _disk_layer_id(i: int, num_disks: int, sign: float) -> int:
    """layer_id of the i-th disk from z = 0: TrackML counts with z increasing on both sides."""
    return 2 * (i + 1) if sign > 0 else 2 * (num_disks - i)


# In global-index order (|z| increasing per volume); layer_id runs with z, see _disk_layer_id.
ENDCAP_DISKS: tuple[EndcapDisk, ...] = tuple(
    EndcapDisk(volume, _disk_layer_id(i, len(positions), sign), sign * z, r_min, r_max)
    for volume, sign, positions, r_min, r_max in _ENDCAP_SPECS
    for i, z in enumerate(positions)
)

LAYERS: tuple[Layer, ...] = (
    *(
        Layer(i, b.volume_id, b.layer_id, True, b.radius, b.radius, -b.half_length, b.half_length)
        for i, b in enumerate(BARREL_LAYERS)
    ),
    *(
        Layer(len(BARREL_LAYERS) + i, d.volume_id, d.layer_id, False, d.r_min, d.r_max, d.z, d.z)
        for i, d in enumerate(ENDCAP_DISKS)
    ),
)
NUM_LAYERS = len(LAYERS)
NUM_BARREL_LAYERS = len(BARREL_LAYERS)


def _column(name: str, dtype: type) -> np.ndarray:
    values = np.array([getattr(layer, name) for layer in LAYERS], dtype=dtype)
    values.flags.writeable = False
    return values


# Per-layer columns indexed by the global layer index: int64 / bool / float64 [NUM_LAYERS].
LAYER_VOLUME_ID = _column("volume_id", np.int64)
LAYER_LAYER_ID = _column("layer_id", np.int64)
LAYER_IS_BARREL = _column("is_barrel", bool)
LAYER_R_MIN = _column("r_min", np.float64)
LAYER_R_MAX = _column("r_max", np.float64)
LAYER_Z_MIN = _column("z_min", np.float64)
LAYER_Z_MAX = _column("z_max", np.float64)

# Lookup table [volume_id, layer_id // 2] -> global index (-1 where no such layer).
_MAX_VOLUME = 32
_MAX_LAYER_SLOT = 16
_INDEX_TABLE = np.full((_MAX_VOLUME, _MAX_LAYER_SLOT), -1, dtype=np.int64)
_INDEX_TABLE[LAYER_VOLUME_ID, LAYER_LAYER_ID // 2] = np.arange(NUM_LAYERS)
_INDEX_TABLE.flags.writeable = False


def layer_index(volume_id: np.ndarray, layer_id: np.ndarray) -> np.ndarray:
    """Maps (volume_id, layer_id) pairs to the global layer index.

    Args:
      volume_id: int array [N].
      layer_id: int array [N], broadcastable against ``volume_id``.

    Returns:
      int64 array [N]: the global layer index, or -1 for a pair that is not a TrackML layer
      (odd layer ids, unknown volumes).
    """
    volume_id = np.asarray(volume_id, dtype=np.int64)
    layer_id = np.asarray(layer_id, dtype=np.int64)
    slot = layer_id // 2
    valid = (
        (volume_id >= 0)
        & (volume_id < _MAX_VOLUME)
        & (layer_id % 2 == 0)
        & (slot >= 0)
        & (slot < _MAX_LAYER_SLOT)
    )
    index = np.full(np.broadcast(volume_id, layer_id).shape, -1, dtype=np.int64)
    volume_b, slot_b = np.broadcast_arrays(volume_id, slot)
    index[valid] = _INDEX_TABLE[volume_b[valid], slot_b[valid]]
    return index


def is_barrel(volume_id: np.ndarray) -> np.ndarray:
    """bool array [N]: True where ``volume_id`` is one of the barrel volumes 8, 13, 17."""
    return np.isin(np.asarray(volume_id), BARREL_VOLUMES)


# Module sizes (mm) used to number modules: (width along r*phi, length along z or r).
_MODULE_SIZE = {
    PIXEL_VOLUMES: (16.8, 72.0),
    SHORT_STRIP_VOLUMES: (48.0, 108.0),
    LONG_STRIP_VOLUMES: (48.0, 108.0),
}
# Module thickness and readout pitch (u across, v along the module), TrackML-like values (mm).
_MODULE_THICKNESS = {PIXEL_VOLUMES: 0.15, SHORT_STRIP_VOLUMES: 0.25, LONG_STRIP_VOLUMES: 0.35}
_MODULE_PITCH = {
    PIXEL_VOLUMES: (0.05, 0.05),
    SHORT_STRIP_VOLUMES: (0.08, 1.2),
    LONG_STRIP_VOLUMES: (0.12, 10.8),
}


def _by_volume(table: dict, volume_id: int):
    return next(v for k, v in table.items() if volume_id in k)


def _module_grid() -> tuple[np.ndarray, ...]:
    """Per layer: modules around phi, modules along z (barrel) or r (disk), module length,
    start of the length coordinate."""
    n_phi = np.zeros(NUM_LAYERS, dtype=np.int64)
    n_along = np.zeros(NUM_LAYERS, dtype=np.int64)
    length = np.zeros(NUM_LAYERS)
    start = np.zeros(NUM_LAYERS)
    for layer in LAYERS:
        width, size = _by_volume(_MODULE_SIZE, layer.volume_id)
        r_mid = 0.5 * (layer.r_min + layer.r_max)
        n_phi[layer.index] = int(np.ceil(2 * np.pi * r_mid / width))
        extent = layer.z_max - layer.z_min if layer.is_barrel else layer.r_max - layer.r_min
        n_along[layer.index] = int(np.ceil(extent / size))
        length[layer.index] = size
        start[layer.index] = layer.z_min if layer.is_barrel else layer.r_min
    return n_phi, n_along, length, start


_MODULE_N_PHI, _MODULE_N_ALONG, _MODULE_LENGTH, _MODULE_START = _module_grid()
_LAYER_PITCH = np.array([_by_volume(_MODULE_PITCH, layer.volume_id) for layer in LAYERS])


def _module_cell(
    layer: np.ndarray, x: np.ndarray, y: np.ndarray, z: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i_phi, i_along, along): a hit's module column and row, and its z (barrel) or r (disk)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    along = np.where(LAYER_IS_BARREL[layer], np.asarray(z, dtype=np.float64), np.hypot(x, y))
    n_phi = _MODULE_N_PHI[layer]
    i_phi = np.floor((np.arctan2(y, x) + np.pi) / (2 * np.pi) * n_phi).astype(np.int64)
    i_phi = np.clip(i_phi, 0, n_phi - 1)
    i_along = np.floor((along - _MODULE_START[layer]) / _MODULE_LENGTH[layer]).astype(np.int64)
    i_along = np.clip(i_along, 0, _MODULE_N_ALONG[layer] - 1)
    return i_phi, i_along, along


def module_id(layer: np.ndarray, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Numbers the module holding each hit: modules tile a layer in phi and in z (barrel) or r (disk).

    This is a plausible TrackML-like numbering (1-based, unique within a layer), not the
    real TrackML module map; ``module_table`` lists the same modules.

    Args:
      layer: int array [N] of global layer indices (all valid).
      x, y, z: float arrays [N], hit positions on that layer (mm).

    Returns:
      int64 array [N] of module ids >= 1.
    """
    layer = np.asarray(layer, dtype=np.int64)
    i_phi, i_along, _ = _module_cell(layer, x, y, z)
    return i_along * _MODULE_N_PHI[layer] + i_phi + 1


def module_channels(
    layer: np.ndarray, x: np.ndarray, y: np.ndarray, z: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The readout channel of each hit on its module: (ch0 across, ch1 along the module).

    Channels count from the module's low edge in steps of the pitch of ``module_table``: ch0
    along r*phi, ch1 along z (barrel) or r (disk).

    Args:
      layer: int array [N] of global layer indices; x, y, z: float arrays [N] (mm).

    Returns:
      (ch0, ch1): int64 arrays [N], >= 0.
    """
    layer = np.asarray(layer, dtype=np.int64)
    i_phi, i_along, along = _module_cell(layer, x, y, z)
    n_phi = _MODULE_N_PHI[layer]
    r = np.hypot(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    phi_low = -np.pi + i_phi * (2 * np.pi / n_phi)
    phi = np.mod(np.arctan2(y, x) - phi_low, 2 * np.pi)
    phi = np.where(phi > np.pi, 0.0, phi)  # rounding at the +-pi seam
    v = along - (_MODULE_START[layer] + i_along * _MODULE_LENGTH[layer])
    pitch = _LAYER_PITCH[layer]
    ch0 = np.floor(r * phi / pitch[:, 0]).astype(np.int64)
    ch1 = np.floor(np.maximum(v, 0.0) / pitch[:, 1]).astype(np.int64)
    return ch0, ch1


def module_table() -> dict[str, np.ndarray]:
    """Every module of the detector in the columns of TrackML's ``detectors.csv``.

    Local axes: u across the module (along r*phi), v along it (z on a cylinder, r on a disk), w
    = u x v (outwards on a cylinder, -z on a disk); ``rot_<global><local>`` are the components
    of the local axes in global x, y, z. Barrel modules are rectangles, disk modules trapezoids
    (half widths module_minhu at the inner edge, module_maxhu at the outer one).

    Returns:
      {column: array [M]}: volume_id, layer_id, module_id (int64), cx, cy, cz, rot_xu ...
      rot_zw, module_t, module_minhu, module_maxhu, module_hv, pitch_u, pitch_v (float64), in
      the order of ``detectors.csv``; modules sorted by volume, layer and module id.
    """
    rows = []
    for layer in LAYERS:
        i = layer.index
        n_phi, n_along = _MODULE_N_PHI[i], _MODULE_N_ALONG[i]
        i_along, i_phi = np.divmod(np.arange(n_phi * n_along), n_phi)
        phi = -np.pi + (i_phi + 0.5) * (2 * np.pi / n_phi)
        centre = _MODULE_START[i] + (i_along + 0.5) * _MODULE_LENGTH[i]
        half_v = 0.5 * _MODULE_LENGTH[i]
        cos, sin, zero, one = np.cos(phi), np.sin(phi), np.zeros(len(phi)), np.ones(len(phi))
        if layer.is_barrel:
            r, cz = np.full(len(phi), layer.r_min), centre
            axes = (-sin, cos, zero, zero, zero, one, cos, sin, zero)  # u, v, w columns
            half_u_min = half_u_max = np.pi * r / n_phi
        else:
            r, cz = centre, np.full(len(phi), layer.z_min)
            axes = (-sin, cos, zero, cos, sin, zero, zero, zero, -one)
            half_u_min = np.pi * (centre - half_v) / n_phi
            half_u_max = np.pi * (centre + half_v) / n_phi
        ux, uy, uz, vx, vy, vz, wx, wy, wz = axes
        pitch_u, pitch_v = _by_volume(_MODULE_PITCH, layer.volume_id)
        rows.append(
            {
                "volume_id": np.full(len(phi), layer.volume_id),
                "layer_id": np.full(len(phi), layer.layer_id),
                "module_id": i_along * n_phi + i_phi + 1,
                "cx": r * cos,
                "cy": r * sin,
                "cz": cz,
                "rot_xu": ux,
                "rot_xv": vx,
                "rot_xw": wx,
                "rot_yu": uy,
                "rot_yv": vy,
                "rot_yw": wy,
                "rot_zu": uz,
                "rot_zv": vz,
                "rot_zw": wz,
                "module_t": np.full(len(phi), _by_volume(_MODULE_THICKNESS, layer.volume_id)),
                "module_minhu": half_u_min * one,
                "module_maxhu": half_u_max * one,
                "module_hv": np.full(len(phi), half_v),
                "pitch_u": np.full(len(phi), pitch_u),
                "pitch_v": np.full(len(phi), pitch_v),
            }
        )
    table = {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
    order = np.lexsort((table["module_id"], table["layer_id"], table["volume_id"]))
    return {name: column[order] for name, column in table.items()}
