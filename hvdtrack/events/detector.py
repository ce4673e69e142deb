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
``LAYER_Z_MAX``, ``layer_index``, ``is_barrel``. The modules tiling the layers are in
``hvdtrack.events.modules``.
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
