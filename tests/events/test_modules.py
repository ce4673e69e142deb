"""The module tiling: overlapping flat modules, hits placed on them, channels, noise on them."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrack.events import detector, modules

M = modules.MODULES


def _row(layer, module_id):
    return int(np.flatnonzero((M.layer == layer) & (M.module_id == module_id))[0])


def test_table_lists_every_module_once_with_the_detectors_columns():
    table = modules.module_table()
    assert len(table["module_id"]) == len(M.layer) > 5000
    keys = np.stack([table["volume_id"], table["layer_id"], table["module_id"]], 1)
    assert len(np.unique(keys, axis=0)) == len(keys)
    axes = np.stack([table[f"rot_{g}w"] for g in "xyz"], 1)
    np.testing.assert_allclose(np.linalg.norm(axes, axis=1), 1.0)


def test_neighbouring_barrel_modules_overlap_on_distinct_planes():
    layer = 0  # pixel barrel, r = 32
    n_phi = M.n_phi[layer]
    assert n_phi % 2 == 0
    a, b = _row(layer, 1), _row(layer, 2)
    nominal_half = 32.0 * np.tan(np.pi / n_phi)
    assert M.half_u_max[a] == pytest.approx(nominal_half * (1 + modules.OVERLAP_PHI))
    radius = np.hypot(M.centre[[a, b], 0], M.centre[[a, b], 1])
    assert radius[1] - radius[0] == pytest.approx(modules.STAGGER_PHI[0])


def test_a_radial_track_through_a_module_centre_leaves_one_hit_on_its_plane():
    layer, row = 0, _row(0, 1)
    phi = np.arctan2(M.centre[row, 1], M.centre[row, 0])
    point = np.array([[32.0 * np.cos(phi), 32.0 * np.sin(phi), M.centre[row, 2]]])
    direction = np.array([[np.cos(phi), np.sin(phi), 0.0]])
    crossing, rows, hit, u, v = modules.hits_on_modules(np.array([layer]), point, direction)
    np.testing.assert_array_equal(crossing, [0])
    np.testing.assert_array_equal(rows, [row])
    np.testing.assert_allclose(hit, M.centre[[row]], atol=1e-9)
    np.testing.assert_allclose([u[0], v[0]], [0.0, 0.0], atol=1e-9)


def test_a_track_through_a_phi_overlap_leaves_two_hits_on_two_modules():
    layer, n_phi = 0, M.n_phi[0]
    phi = -np.pi + 2 * np.pi / n_phi  # the boundary between module columns 0 and 1
    z = M.centre[_row(0, 1), 2]
    point = np.array([[32.0 * np.cos(phi), 32.0 * np.sin(phi), z]])
    direction = np.array([[np.cos(phi), np.sin(phi), 0.0]])
    crossing, rows, hit, _, _ = modules.hits_on_modules(np.array([layer]), point, direction)
    np.testing.assert_array_equal(crossing, [0, 0])
    assert set(M.module_id[rows]) == {1, 2}
    assert abs(np.hypot(*hit[0, :2]) - np.hypot(*hit[1, :2])) > 1.0  # staggered planes


def test_channels_count_from_the_module_edge():
    row = _row(0, 1)
    ch0, ch1 = modules.module_channels(
        np.array([row, row]),
        np.array([-M.half_u_max[row], -M.half_u_max[row] + 0.125]),
        np.array([-M.half_v[row], -M.half_v[row] + 0.051]),
    )
    np.testing.assert_array_equal(ch0, [0, 2])  # pixel pitch 0.05 mm
    np.testing.assert_array_equal(ch1, [0, 1])


def test_noise_points_lie_inside_modules_of_the_requested_layers():
    layers = np.flatnonzero(detector.LAYER_IS_BARREL)
    rows, point, u, v = modules.sample_on_modules(layers, 500, np.random.default_rng(0))
    assert set(M.layer[rows]) <= set(layers)
    normal_offset = np.einsum("ij,ij->i", point - M.centre[rows], M.w[rows])
    np.testing.assert_allclose(normal_offset, 0.0, atol=1e-9)
    assert (np.abs(v) <= M.half_v[rows]).all() and (np.abs(u) <= M.half_u(rows, v)).all()
