"""TrackML particle ids: packing and unpacking the vertex/primary/generation/secondary/process bits."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrack.events.particle_ids import decode_particle_id, encode_particle_id


def test_first_primary_of_the_first_vertex_has_the_familiar_trackml_id():
    assert encode_particle_id(np.array([1]), np.array([1])).tolist() == [4503668346847232]


def test_a_secondary_round_trips_through_every_field():
    pid = encode_particle_id(np.array([3]), np.array([7]), 1, 2, 5)
    assert pid.dtype == np.int64 and pid.tolist() == [13511279935234053]
    fields = decode_particle_id(pid)
    assert {k: v.tolist() for k, v in fields.items()} == {
        "vertex_id": [3],
        "primary_id": [7],
        "generation": [1],
        "secondary_id": [2],
        "process": [5],
    }


def test_noise_decodes_to_zeros_and_full_fields_fill_all_64_bits():
    assert {k: v.tolist() for k, v in decode_particle_id(np.array([0])).items()} == {
        "vertex_id": [0],
        "primary_id": [0],
        "generation": [0],
        "secondary_id": [0],
        "process": [0],
    }
    pid = encode_particle_id(np.array([4095]), np.array([65535]), 4095, 4095, 4095)
    assert pid.tolist() == [-1]  # vertex ids above 2047 use the sign bit of the int64
    fields = decode_particle_id(pid)
    assert [fields[k].tolist() for k in fields] == [[4095], [65535], [4095], [4095], [4095]]


def test_values_outside_their_bits_are_refused():
    with pytest.raises(ValueError, match=r"vertex_id must be in \[0, 4095\], got 4096"):
        encode_particle_id(np.array([4096]), np.array([1]))
    with pytest.raises(ValueError, match=r"generation must be in \[0, 4095\], got -1"):
        encode_particle_id(np.array([1]), np.array([1]), generation=-1)
