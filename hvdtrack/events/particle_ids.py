"""TrackML particle ids: the 64-bit word of vertex, primary, generation, secondary and process.

Bits (most significant first): vertex_id 52-63, primary_id 36-51, generation 24-35,
secondary_id 12-23, process 0-11 (``shared/design/physics.md``). Primaries have generation 0,
secondary_id 0 and process 0; vertex ids start at 1; particle_id 0 marks noise hits.

Public symbols: ``FIELDS``, ``encode_particle_id``, ``decode_particle_id``.
"""

from __future__ import annotations

import numpy as np

# (name, lowest bit, number of bits), most significant first.
FIELDS: tuple[tuple[str, int, int], ...] = (
    ("vertex_id", 52, 12),
    ("primary_id", 36, 16),
    ("generation", 24, 12),
    ("secondary_id", 12, 12),
    ("process", 0, 12),
)


def encode_particle_id(
    vertex_id: np.ndarray,
    primary_id: np.ndarray,
    generation: np.ndarray | int = 0,
    secondary_id: np.ndarray | int = 0,
    process: np.ndarray | int = 0,
) -> np.ndarray:
    """Packs the five fields into TrackML particle ids.

    Args:
      vertex_id: int [P], 1..4095; vertex ids above 2047 set the sign bit of the int64, as
        they would in TrackML (none of its events has that many vertices).
      primary_id: int [P], 0..65535.
      generation, secondary_id, process: int [P] or scalars, 0..4095 (0 for primaries).

    Returns:
      int64 [P] particle ids.

    Raises:
      ValueError: naming the field and the first value that does not fit its bits.
    """
    values = dict(
        vertex_id=vertex_id,
        primary_id=primary_id,
        generation=generation,
        secondary_id=secondary_id,
        process=process,
    )
    word = np.zeros(np.broadcast(*values.values()).shape, dtype=np.uint64)
    for name, shift, bits in FIELDS:
        value = np.asarray(values[name], dtype=np.int64)
        bad = (value < 0) | (value >= 1 << bits)
        if bad.any():
            raise ValueError(
                f"encode_particle_id: {name} must be in [0, {(1 << bits) - 1}], "
                f"got {value[bad].flat[0]}"
            )
        word |= value.astype(np.uint64) << np.uint64(shift)
    return word.view(np.int64) if word.ndim else np.int64(word.astype(np.int64))


def decode_particle_id(particle_id: np.ndarray) -> dict[str, np.ndarray]:
    """Splits TrackML particle ids into their fields.

    Args:
      particle_id: int64 [P].

    Returns:
      {"vertex_id", "primary_id", "generation", "secondary_id", "process"}: int64 [P] each
      (all 0 for noise, particle_id 0).
    """
    word = np.asarray(particle_id, dtype=np.int64).astype(np.uint64)
    return {
        name: ((word >> np.uint64(shift)) & np.uint64((1 << bits) - 1)).astype(np.int64)
        for name, shift, bits in FIELDS
    }
