"""The synthetic generator: determinism, hits on the detector surfaces, helix geometry, truth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hvdtrack.errors import ConfigError
from hvdtrack.events import detector, modules
from hvdtrack.events.particle_ids import decode_particle_id
from hvdtrack.events.synthetic import SyntheticConfig, generate_dataset, generate_event
from hvdtrack.events.trackml import COLUMNS, find_events, read_event

from .conftest import SMALL


def _frames(event):
    return event.hits, event.truth, event.particles


def test_same_seed_and_event_give_identical_frames():
    first, second = generate_event(SMALL, 1000, seed=3), generate_event(SMALL, 1000, seed=3)
    for a, b in zip(_frames(first), _frames(second)):
        pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_seed_and_event_id_change_the_event():
    base = generate_event(SMALL, 1000, seed=3)
    for other in (generate_event(SMALL, 1000, seed=4), generate_event(SMALL, 1001, seed=3)):
        assert not base.particles[["px", "py", "pz"]].equals(other.particles[["px", "py", "pz"]])


def test_frames_have_the_trackml_columns_and_ids(small_event):
    for part in ("hits", "truth", "particles", "cells"):
        frame = getattr(small_event, part)
        assert list(frame.columns) == list(COLUMNS[part])
        assert frame.dtypes.astype(str).to_dict() == COLUMNS[part]
    hits, truth, cells = small_event.hits, small_event.truth, small_event.cells
    np.testing.assert_array_equal(hits.hit_id, np.arange(1, len(hits) + 1))
    np.testing.assert_array_equal(truth.hit_id, hits.hit_id)
    np.testing.assert_array_equal(cells.hit_id, hits.hit_id)  # one cell per hit
    assert (cells.ch0 >= 0).all() and (cells.ch1 >= 0).all() and (cells.value > 0).all()


def test_particle_ids_decode_to_primaries_and_secondaries():
    event = generate_event(SyntheticConfig(num_particles=2000), 1000, seed=3)
    particles = event.particles
    fields = decode_particle_id(particles.particle_id.to_numpy())
    assert set(fields["vertex_id"]) <= set(range(1, 201))
    assert (fields["primary_id"] >= 1).all()
    primary = fields["generation"] == 0
    for name in ("secondary_id", "process"):
        assert (fields[name][primary] == 0).all()
    # secondaries: generation 1, numbered per parent; hadrons from interactions in a layer
    # (process 121, away from the beam line) and muons from decays (201)
    assert 0 < (~primary).sum() < primary.sum()
    assert (fields["generation"][~primary] == 1).all()
    assert (fields["secondary_id"][~primary] >= 1).all()
    hadronic, decay = fields["process"] == 121, fields["process"] == 201
    assert hadronic.any() and decay.any() and (hadronic | decay | primary).all()
    assert (np.hypot(particles.vx, particles.vy)[hadronic] > 20).all()
    assert particles.particle_id.is_unique
    # primaries of one vertex_id share the vertex position
    assert (particles[primary].groupby(fields["vertex_id"][primary]).vz.nunique() == 1).all()
    assert set(np.abs(particles.particle_type[~decay])) <= {211, 321, 2212}
    np.testing.assert_array_equal(np.sign(particles.particle_type[~decay]), particles.q[~decay])
    np.testing.assert_array_equal(particles.particle_type[decay], -13 * particles.q[decay])


def test_true_hits_lie_on_their_module_planes_and_overlaps_give_double_hits(small_event):
    hits, truth = small_event.hits, small_event.truth
    layer = detector.layer_index(hits.volume_id, hits.layer_id)
    assert (layer >= 0).all()
    m = modules.MODULES
    row = m.first_row[layer] + hits.module_id.to_numpy() - 1
    np.testing.assert_array_equal(m.module_id[row], hits.module_id)
    true = truth[["tx", "ty", "tz"]].to_numpy(np.float64)
    measured = hits[["x", "y", "z"]].to_numpy(np.float64)
    for xyz in (true, measured):  # both on the plane (float32 files: 1e-3 mm)
        offset = np.einsum("ij,ij->i", xyz - m.centre[row], m.w[row])
        np.testing.assert_allclose(offset, 0.0, atol=2e-3)
    # not on a nominal cylinder: barrel radii spread over the staggered planes
    barrel = detector.LAYER_IS_BARREL[layer]
    spread = np.hypot(true[barrel, 0], true[barrel, 1]) - detector.LAYER_R_MIN[layer][barrel]
    assert spread.max() - spread.min() > 1.0
    signal = truth.particle_id != 0
    crossings = pd.DataFrame(
        {"p": truth.particle_id, "v": hits.volume_id, "l": hits.layer_id, "m": hits.module_id}
    )[signal]
    per_crossing = crossings.groupby(["p", "v", "l"]).m.nunique()
    assert 0.1 < (per_crossing == 2).mean() < 0.5


def test_weights_nhits_and_noise(small_event):
    truth, particles = small_event.truth, small_event.particles
    noise = truth.particle_id == 0
    assert truth.weight.sum() == pytest.approx(1.0, abs=1e-5)
    # TrackML: noise and particles with fewer than 4 hits weigh 0, every other hit more.
    nhits = truth.particle_id.map(particles.set_index("particle_id").nhits)
    short = nhits < 4
    assert (truth.weight[noise | short] == 0).all()
    # at most 20 hits of a particle count; pT below 0.05 GeV weighs 0 (a TrackML guard)
    pt = truth.particle_id.map(np.hypot(particles.px, particles.py).set_axis(particles.particle_id))
    counted = ~noise & ~short & (nhits <= 20) & (pt >= 0.05)
    assert (truth.weight[counted] > 0).all() and counted.sum() > 100
    assert noise.mean() == pytest.approx(SMALL.noise_fraction, abs=0.01)
    counts = truth.particle_id[~noise].value_counts()
    nhits = particles.set_index("particle_id").nhits
    np.testing.assert_array_equal(nhits.reindex(counts.index), counts)
    assert nhits.drop(counts.index).eq(0).all()
    assert set(truth.particle_id[~noise]) <= set(particles.particle_id)


def test_hit_count_and_pt_spectrum_are_roughly_right():
    cfg = SyntheticConfig(num_particles=2000)
    event = generate_event(cfg, 1000, seed=1)
    particles = event.particles[event.particles.nhits > 0]
    pt = np.hypot(particles.px, particles.py)
    # physics.md, real events: median 0.40 GeV, 33% / 12% above 0.5 / 1 GeV
    assert 0.3 < pt.median() < 0.5
    assert 0.25 < (pt > 0.5).mean() < 0.45 and 0.08 < (pt > 1.0).mean() < 0.18
    primary = decode_particle_id(event.particles.particle_id.to_numpy())["generation"] == 0
    assert np.hypot(event.particles.px, event.particles.py)[primary].min() >= cfg.pt_min
    # the default event: ~100k hits for 6,000 primaries, 17% noise
    assert 28_000 < len(event.hits) < 40_000
    assert (event.truth.particle_id == 0).mean() == pytest.approx(0.17, abs=0.01)


def test_unscattered_hits_follow_the_helix_and_loopers_come_back():
    cfg = SyntheticConfig(
        num_particles=300,
        pt_min=0.1,
        material_x0=1e-12,
        interaction_probability=0.0,
        resolution_pixel=(0.0, 0.0),
        resolution_short_strip=(0.0, 0.0),
        resolution_long_strip=(0.0, 0.0),
        noise_fraction=0.0,
    )
    event = generate_event(cfg, 7, seed=11)
    hits = event.hits.merge(event.truth, on="hit_id").merge(event.particles, on="particle_id")
    pt = np.hypot(hits.px, hits.py).to_numpy(np.float64)
    radius = pt / (0.3 * cfg.field_tesla) * 1000.0
    h = -np.sign(hits.q.to_numpy())
    phi0 = np.arctan2(hits.py, hits.px).to_numpy(np.float64)
    cx = hits.vx - h * radius * np.sin(phi0)
    cy = hits.vy + h * radius * np.cos(phi0)
    # On the circle through the vertex, up to the straight-line step onto the module plane:
    # step^2 / 2R, under 0.05 mm but for grazing crossings of loopers (up to ~1 mm).
    off = np.abs(np.hypot(hits.x - cx, hits.y - cy) - radius)
    assert np.quantile(off, 0.99) < 0.05 and off.max() < 1.5
    # ... with z linear in the turned angle on the outgoing half turn.
    chord = np.hypot(hits.x - hits.vx, hits.y - hits.vy).to_numpy(np.float64)
    turned = 2 * np.arcsin(np.clip(chord / (2 * radius), 0, 1))
    outgoing = radius > 1100.0  # circles leaving the tracker: no incoming arc
    expected = radius * turned * hits.pz / pt
    np.testing.assert_allclose(
        (hits.z - hits.vz)[outgoing], expected[outgoing], atol=0.05, rtol=1e-4
    )
    # A looper crosses a barrel layer outwards and back inwards: two hits far apart.
    barrel = hits[hits.volume_id.isin([8, 13, 17]) & (pt < 0.3)]
    spread = barrel.groupby(["particle_id", "volume_id", "layer_id"]).x.agg(np.ptp)
    assert (spread > 50).any()


def test_barrel_only_simulates_only_barrel_volumes():
    event = generate_event(SyntheticConfig(num_particles=100, barrel_only=True), 1, seed=0)
    assert set(event.hits.volume_id) <= {8, 13, 17}


def test_generate_dataset_writes_readable_events(tmp_path):
    prefixes = generate_dataset(SMALL, tmp_path, num_events=2, seed=5, compress=True)
    assert prefixes == find_events(tmp_path)
    assert prefixes[0].endswith("event000001000") and prefixes[1].endswith("event000001001")
    event = read_event(prefixes[1])
    expected = generate_event(SMALL, 1001, seed=5)
    pd.testing.assert_frame_equal(event.hits, expected.hits, check_exact=True)
    pd.testing.assert_frame_equal(event.truth, expected.truth, check_exact=True)
    pd.testing.assert_frame_equal(event.particles, expected.particles, check_exact=True)
    pd.testing.assert_frame_equal(event.cells, expected.cells, check_exact=True)
    assert (tmp_path / "detectors.csv").is_file()


def test_config_refuses_bad_values():
    with pytest.raises(ConfigError, match=r"'layer_efficiency' must be in \(0, 1\]"):
        SyntheticConfig(layer_efficiency=1.5)
    with pytest.raises(ConfigError, match="'pt_max' must be > pt_min"):
        SyntheticConfig(pt_min=2.0, pt_max=1.0)
