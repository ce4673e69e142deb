"""Secondaries: decay lengths, the muon of a decay, hadrons from an interaction."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrack.events import propagation, secondaries
from hvdtrack.events.particle_ids import decode_particle_id, encode_particle_id


def _primaries(n, pt, particle_type, lam=0.0):
    charge = np.sign(particle_type).astype(np.int64)
    return {
        "particle_id": encode_particle_id(np.ones(n, dtype=np.int64), np.arange(1, n + 1)),
        "vx": np.zeros(n),
        "vy": np.zeros(n),
        "vz": np.zeros(n),
        "pt": np.full(n, pt),
        "phi": np.zeros(n),
        "lam": np.full(n, lam),
        "q": charge,
        "particle_type": np.asarray(particle_type, dtype=np.int64),
    }


def test_decay_lengths_are_beta_gamma_c_tau_and_protons_do_not_decay():
    n = 20_000
    types = np.where(np.arange(n) % 2 == 0, 211, 2212)
    primaries = _primaries(n, 1.0, types)
    helix = propagation.helices(primaries, 2.0)
    alpha = secondaries.decay_alpha(helix, primaries["particle_type"], np.random.default_rng(0))
    assert np.isinf(alpha[types == 2212]).all()
    length = alpha[types == 211] * helix.radius[types == 211]  # lam = 0: path = R alpha
    assert length.mean() == pytest.approx(1.0 / 0.13957 * 7804.5, rel=0.03)  # 55.9 m


def test_the_muon_of_a_pion_decay_keeps_the_charge_and_most_of_the_momentum():
    primaries = _primaries(3, 2.0, [211, -211, 211])
    helix = propagation.helices(primaries, 2.0)
    alpha = np.array([0.01, 0.02, 0.05])
    muons = secondaries.decay_products(
        primaries, helix, np.arange(3), alpha, np.random.default_rng(1)
    )
    np.testing.assert_array_equal(muons["particle_type"], [-13, 13, -13])  # mu+ is -13
    np.testing.assert_array_equal(muons["q"], primaries["q"])
    vertex = np.stack([muons["vx"], muons["vy"], muons["vz"]], 1)
    np.testing.assert_allclose(vertex, helix.position(np.arange(3), alpha))
    momentum = muons["pt"] * np.sqrt(1 + muons["lam"] ** 2)
    assert ((momentum >= 0.573 * 2.0) & (momentum <= 2.0)).all()
    fields = decode_particle_id(muons["particle_id"])
    np.testing.assert_array_equal(fields["primary_id"], [1, 2, 3])
    np.testing.assert_array_equal(fields["generation"], [1, 1, 1])
    np.testing.assert_array_equal(fields["process"], [201, 201, 201])


def test_hadrons_of_an_interaction_share_part_of_the_momentum_and_are_numbered():
    primaries = _primaries(2, 5.0, [211, 2212])
    helix = propagation.helices(primaries, 2.0)
    products = secondaries.hadronic_products(
        primaries, helix, np.array([0, 1]), np.array([0.02, 0.03]), np.random.default_rng(2)
    )
    fields = decode_particle_id(products["particle_id"])
    momentum = products["pt"] * np.sqrt(1 + products["lam"] ** 2)
    for parent in (1, 2):
        mine = fields["primary_id"] == parent
        assert 1 <= mine.sum() <= 4
        np.testing.assert_array_equal(fields["secondary_id"][mine], np.arange(1, mine.sum() + 1))
        assert momentum[mine].sum() == pytest.approx(0.7 * 5.0)
    assert (fields["process"] == 121).all()
