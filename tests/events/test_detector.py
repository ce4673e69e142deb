"""The TrackML geometry constants and the global layer index."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrack.events import detector


def test_barrel_layers_match_the_physics_table():
    table = [(b.volume_id, b.layer_id, b.radius, b.half_length) for b in detector.BARREL_LAYERS]
    assert table == [
        (8, 2, 32.0, 500.0),
        (8, 4, 72.0, 500.0),
        (8, 6, 116.0, 500.0),
        (8, 8, 172.0, 500.0),
        (13, 2, 260.0, 1140.0),
        (13, 4, 360.0, 1140.0),
        (13, 6, 500.0, 1140.0),
        (13, 8, 660.0, 1140.0),
        (17, 2, 820.0, 1140.0),
        (17, 4, 1020.0, 1140.0),
    ]
    assert detector.BARREL_VOLUMES == (8, 13, 17)


def test_endcap_disks_match_the_physics_table():
    disks = {(d.volume_id, d.layer_id): (d.z, d.r_min, d.r_max) for d in detector.ENDCAP_DISKS}
    assert len(disks) == 38
    assert disks[(7, 14)] == (-600.0, 25.0, 200.0)  # on the -z side layer 2 is the farthest
    assert disks[(7, 2)] == (-1500.0, 25.0, 200.0)
    assert disks[(9, 14)] == (1500.0, 25.0, 200.0)
    assert disks[(12, 2)] == (-2950.0, 235.0, 730.0)
    assert disks[(14, 2)] == (1220.0, 235.0, 730.0)
    assert disks[(16, 10)] == (-1500.0, 750.0, 1050.0)
    assert disks[(18, 12)] == (2950.0, 750.0, 1050.0)


# Median hit z per end-cap layer, layer_id 2, 4, ... in order, in a real TrackML event
# (shared/design/physics.md, "Real events"); volume 16 matches 12, and 14 and 18 mirror them.
REAL_MEDIAN_Z = {
    7: (-1498, -1302, -1100, -962, -818, -698, -598),
    9: (598, 698, 818, 962, 1100, 1302, 1498),
    12: (-2948, -2548, -2148, -1798, -1498, -1218),
    14: (1218, 1498, 1798, 2148, 2548, 2948),
    16: (-2948, -2548, -2148, -1798, -1498, -1218),
    18: (1218, 1498, 1798, 2148, 2548, 2948),
}


@pytest.mark.parametrize("volume", sorted(REAL_MEDIAN_Z))
def test_endcap_layer_ids_follow_the_real_numbering(volume):
    real_z = np.array(REAL_MEDIAN_Z[volume], dtype=np.float64)
    layer_id = 2 * np.arange(1, len(real_z) + 1)
    index = detector.layer_index(np.full(len(real_z), volume), layer_id)
    assert (index >= 0).all()
    # Each (volume, layer_id) is the disk where real hits of that layer lie: within 5 mm (real
    # disks hold modules staggered around the nominal z).
    np.testing.assert_allclose(detector.LAYER_Z_MIN[index], real_z, atol=5.0)
    assert (np.diff(detector.LAYER_Z_MIN[index]) > 0).all()  # layer ids run with z


def test_layer_index_orders_barrel_first_then_endcaps():
    # End-cap disks are indexed from z = 0 outwards: on the -z side against the layer_id.
    volume = np.array([8, 8, 13, 17, 7, 7, 9, 12, 18])
    layer = np.array([2, 8, 2, 4, 14, 2, 2, 12, 12])
    np.testing.assert_array_equal(
        detector.layer_index(volume, layer), [0, 3, 4, 9, 10, 16, 17, 24, 47]
    )
    assert detector.NUM_LAYERS == 48 and detector.NUM_BARREL_LAYERS == 10
    assert [layer.index for layer in detector.LAYERS] == list(range(48))


def test_layer_index_marks_unknown_pairs():
    # odd layer id, layer beyond the volume, unknown volume, negative values
    volume = np.array([8, 8, 99, 10, -1, 17])
    layer = np.array([3, 10, 2, 2, 2, 6])
    np.testing.assert_array_equal(detector.layer_index(volume, layer), [-1] * 6)


def test_layer_columns_describe_each_surface():
    i = detector.layer_index(np.array([13, 14]), np.array([6, 4]))
    np.testing.assert_array_equal(detector.LAYER_IS_BARREL[i], [True, False])
    np.testing.assert_array_equal(detector.LAYER_R_MIN[i], [500.0, 235.0])
    np.testing.assert_array_equal(detector.LAYER_R_MAX[i], [500.0, 730.0])
    np.testing.assert_array_equal(detector.LAYER_Z_MIN[i], [-1140.0, 1500.0])
    np.testing.assert_array_equal(detector.LAYER_Z_MAX[i], [1140.0, 1500.0])
