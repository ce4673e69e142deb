"""TrackML truth weights on hand-made particles with the expected weights written out."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrack.events.weights import ORDER_WEIGHTS, hit_weights, weight_pt


def test_pt_weight_is_flat_then_linear_to_3_gev():
    pt = [0.01, 0.05, 0.3, 0.5, 1.75, 3.0, 10.0]
    np.testing.assert_allclose(weight_pt(np.array(pt)), [0, 0.2, 0.2, 0.2, 0.6, 1.0, 1.0])


def test_order_weights_of_a_four_hit_particle():
    # The proposal [10, 8, 6, 5, 3, 3, 3, 5, 6] interpolated at hits 0..3: 10, 16/3, 3, 6.
    np.testing.assert_allclose(ORDER_WEIGHTS[4, :4], np.array([30, 16, 9, 18]) / 73)
    assert (ORDER_WEIGHTS[:4] == 0).all()
    np.testing.assert_allclose(ORDER_WEIGHTS[4:].sum(axis=1), 1.0)


def test_hit_weights_of_a_tiny_event():
    # Particle 1: pT 3 GeV (weight 1), hits listed out of order along z. Particle 2: 3 hits
    # (weight 0). Particle 3: pT 1.75 GeV (weight 0.6), vertex at z = 5. Hit 12: noise.
    hit_pid = np.array([1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 0])
    tz = np.array([10, 40, 20, 30, 10, 20, 30, 15, 25, 35, 45, 50], dtype=np.float64)
    weight = hit_weights(
        hit_pid,
        tz,
        particle_id=np.array([1, 2, 3]),
        vz=np.array([0.0, 0.0, 5.0]),
        pt=np.array([3.0, 5.0, 1.75]),
    )
    order = np.array([30, 16, 9, 18]) / 73  # weights of hits 0..3 along a 4-hit particle
    expected = np.concatenate([order[[0, 3, 1, 2]] * 1.0, [0, 0, 0], order * 0.6, [0]]) / 1.6
    np.testing.assert_allclose(weight, expected)
    assert weight.sum() == pytest.approx(1.0)


def test_only_20_hits_of_a_long_particle_count():
    weight = hit_weights(
        np.ones(22, dtype=np.int64), np.arange(22.0), np.array([1]), np.zeros(1), np.ones(1) * 5
    )
    np.testing.assert_allclose(weight[:20], ORDER_WEIGHTS[20, :20])
    assert weight[20:].tolist() == [0.0, 0.0]


def test_noise_and_unlisted_particles_weigh_nothing():
    weight = hit_weights(np.array([0, 9, 9, 9, 9]), np.arange(5.0), np.array([1]), [0.0], [2.0])
    assert weight.tolist() == [0.0] * 5
    assert hit_weights(np.array([1]), np.zeros(1), np.zeros(0, np.int64), [], []).tolist() == [0]
