"""Synthetic TrackML events: charged particles from pile-up vertices, their secondaries, and noise.

Primaries (pions, kaons, protons) come from ``num_vertices`` vertices with a Tsallis pT
spectrum from 0.1 GeV (median about 0.4 GeV, a third above 0.5 GeV, as real TrackML particles)
and flat pseudorapidity. Each is a helix in the solenoidal field (``propagation``): loopers are
followed for a whole turn. At each layer crossing a primary may interact (probability
``interaction_probability``), and pions and kaons decay in flight; the primary stops there and
its secondaries (``secondaries``: hadrons from an interaction, the muon of a decay; generation
1) leave from that point and are propagated the same way. A crossing of a layer becomes hits on the flat modules
(``modules``): one, or two where neighbouring modules overlap; each hit is then kept with the
probability ``layer_efficiency`` and smeared in the module's local u, v. Noise hits are spread
uniformly over the module area so that they are ``noise_fraction`` of all hits. Everything is
vectorised over particles (the only loop is over the 48 surfaces) and deterministic in
(seed, event_id).

The files are TrackML's: hits, cells, particles (with particle_type), truth, and a
``detectors.csv`` of the module tiling per dataset; particle ids follow TrackML's bit layout
(``particle_ids``: vertex_id = vertex + 1, primary_id = number within the vertex; secondaries
share their parent's and have generation 1, secondary_id 1, 2, ... and process 121 or 201)
and truth weights TrackML's definition (``weights``).

Simplifications (stated so nobody mistakes them for TrackML): no energy loss (loopers do not
shrink), no photon conversions or delta rays, secondaries do not interact or decay again;
every particle is a pion for the scattering's beta; scattering displaces later hits but the truth momentum (tpx, tpy, tpz) is that of the
unscattered helix; near a module the track is a straight line; each hit has one cell whose
value is a random deposited charge.

Public symbols: ``SyntheticConfig``, ``generate_event``, ``generate_dataset``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Union

import numpy as np
import pandas as pd

from hvdtrack.configtools import check
from hvdtrack.events import detector, modules, propagation, secondaries
from hvdtrack.events.particle_ids import encode_particle_id
from hvdtrack.events.trackml import COLUMNS, Event, write_detectors, write_event
from hvdtrack.events.weights import hit_weights

# PDG codes of positive primaries, with their shares (negatives: minus the code).
_PRIMARY_TYPES = ((211, 0.80), (321, 0.12), (2212, 0.08))


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """Settings of the synthetic event generator. Defaults give a pile-up-200-like event.

    With the defaults an event holds about 100,000 hits (17% of them noise) from 6,000
    primaries and their secondaries; of the particles with hits 38% / 13% have pT above 0.5 /
    1 GeV (median 0.38 GeV). ``num_particles``, ``eta_max`` and ``pt_tsallis_t`` were tuned so
    that graph construction matches the real-event figures of physics.md
    (``hvdtrack.graphs.realism``; ``python -m hvdtrack.bench construct --compare-real``).

    Attributes:
      num_particles: primary charged particles per event.
      num_vertices: pile-up vertices the primaries are shared among.
      pt_min: floor of the pT spectrum (GeV).
      pt_max: cap of the pT spectrum (GeV).
      pt_tsallis_n, pt_tsallis_t: the pT spectrum dN/dpT ~ pT (1 + pT / (n T))^-n.
      eta_max: primaries are uniform in pseudorapidity on [-eta_max, eta_max] (2.5: real
        events hold more central high-pT particles than a flat |eta| < 4 gives).
      vertex_sigma_z: Gaussian spread of the vertices along the beam (mm).
      vertex_sigma_xy: Gaussian spread of the vertices across the beam (mm).
      field_tesla: solenoid field along +z (T).
      material_x0: thickness of one sensitive layer in radiation lengths (at normal incidence).
      interaction_probability: probability that a particle interacts at a layer crossing.
      layer_efficiency: probability that a hit on a module is recorded.
      noise_fraction: fraction of all hits that are noise (particle_id 0).
      resolution_pixel: (u, v) Gaussian hit resolution on the pixel modules (mm).
      resolution_short_strip: the same for the short-strip modules (mm).
      resolution_long_strip: the same for the long-strip modules (mm).
      barrel_only: simulate the barrel cylinders only (no end-cap disks, no end-cap noise).
    """

    num_particles: int = 6_000
    num_vertices: int = 200
    pt_min: float = 0.1
    pt_max: float = 100.0
    pt_tsallis_n: float = 6.0
    pt_tsallis_t: float = 0.14
    eta_max: float = 2.5
    vertex_sigma_z: float = 55.0
    vertex_sigma_xy: float = 0.015
    field_tesla: float = 2.0
    material_x0: float = 0.025
    interaction_probability: float = 0.01
    layer_efficiency: float = 0.985
    noise_fraction: float = 0.17
    resolution_pixel: tuple[float, float] = (0.015, 0.015)
    resolution_short_strip: tuple[float, float] = (0.025, 0.35)
    resolution_long_strip: tuple[float, float] = (0.035, 3.0)
    barrel_only: bool = False

    def __post_init__(self) -> None:
        # Upper bounds far above the default's pile-up 200 (6,000 particles, 200 vertices).
        check(0 <= self.num_particles <= 1_000_000, "num_particles", "must be in [0, 1000000]")
        check(1 <= self.num_vertices <= 100_000, "num_vertices", "must be in [1, 100000]")
        check(self.pt_min > 0, "pt_min", "must be > 0 (GeV)")
        check(self.pt_max > self.pt_min, "pt_max", "must be > pt_min")
        check(self.pt_tsallis_n > 2, "pt_tsallis_n", "must be > 2")
        check(self.pt_tsallis_t > 0, "pt_tsallis_t", "must be > 0 (GeV)")
        check(self.eta_max > 0, "eta_max", "must be > 0")
        check(self.vertex_sigma_z >= 0, "vertex_sigma_z", "must be >= 0 (mm)")
        check(self.vertex_sigma_xy >= 0, "vertex_sigma_xy", "must be >= 0 (mm)")
        check(self.field_tesla > 0, "field_tesla", "must be > 0 (T)")
        check(self.material_x0 > 0, "material_x0", "must be > 0 (radiation lengths)")
        check(0 <= self.interaction_probability < 1, "interaction_probability", "must be in [0, 1)")
        check(0 < self.layer_efficiency <= 1, "layer_efficiency", "must be in (0, 1]")
        check(0 <= self.noise_fraction < 1, "noise_fraction", "must be in [0, 1)")
        for key in ("resolution_pixel", "resolution_short_strip", "resolution_long_strip"):
            check(min(getattr(self, key)) >= 0, key, "must be >= 0 (mm)")


def generate_event(cfg: SyntheticConfig, event_id: int, seed: int) -> Event:
    """Simulates one event.

    Args:
      cfg: generator settings.
      event_id: the event number (also part of the random stream).
      seed: the random seed; the event is a pure function of (cfg, seed, event_id).

    Returns:
      An ``Event`` with hits (hit_id 1..N, sorted by volume, layer, module), truth (noise has
      particle_id 0 and weight 0; TrackML weights summing to 1), particles (primaries, then
      secondaries; nhits = hits left after acceptance and inefficiency) and cells (one per hit).
    """
    rng = np.random.default_rng([int(seed), int(event_id)])
    surfaces = _surfaces(cfg)
    primaries = _sample_particles(cfg, rng)
    helix = propagation.helices(primaries, cfg.field_tesla)
    alpha, layer = propagation.find_crossings(helix, surfaces)
    crossed = np.isfinite(alpha)
    # A particle stops where it interacts (at a crossing) or decays, whichever comes first.
    interacts_at = crossed & (rng.random(alpha.shape) < cfg.interaction_probability)
    first = np.argmax(interacts_at, axis=1)
    rows = np.arange(len(first))
    alpha_interaction = np.where(interacts_at.any(axis=1), alpha[rows, first], np.inf)
    alpha_decay = secondaries.decay_alpha(helix, primaries["particle_type"], rng)
    alpha_decay = np.where(alpha_decay < helix.alpha_max, alpha_decay, np.inf)
    stop = np.minimum(alpha_interaction, alpha_decay)
    crossed &= alpha <= stop[:, None]
    states = propagation.crossing_states(helix, alpha, layer, crossed, cfg.material_x0, rng)
    hadronic = np.flatnonzero(alpha_interaction < alpha_decay)
    decays = np.flatnonzero(np.isfinite(alpha_decay) & (alpha_decay < alpha_interaction))
    produced = _concat(
        secondaries.hadronic_products(primaries, helix, hadronic, alpha_interaction[hadronic], rng),
        secondaries.decay_products(primaries, helix, decays, alpha_decay[decays], rng),
    )
    helix2 = propagation.helices(produced, cfg.field_tesla)
    alpha2, layer2 = propagation.find_crossings(helix2, surfaces)
    states2 = propagation.crossing_states(
        helix2, alpha2, layer2, np.isfinite(alpha2), cfg.material_x0, rng
    )
    states2["particle"] = states2["particle"] + cfg.num_particles
    particles = _concat(primaries, produced)
    signal = _signal_hits(cfg, _concat(states, states2), rng)
    noise = _noise_hits(cfg, surfaces, len(signal["row"]), rng)
    event = _assemble_event(event_id, particles, signal, noise)
    value = rng.gamma(4.0, 0.075, len(event.hits))  # drawn last: the hits do not depend on it
    event.cells["value"] = value.astype(COLUMNS["cells"]["value"])
    return event


def generate_dataset(
    cfg: SyntheticConfig,
    directory: Union[str, os.PathLike],
    num_events: int,
    seed: int,
    first_event_id: int = 1000,
    compress: bool = False,
) -> list[str]:
    """Generates ``num_events`` events and writes them as TrackML CSVs with ``write_event``,
    plus the dataset's ``detectors.csv``.

    Returns:
      The event prefixes written, e.g. ``['<directory>/event000001000', ...]``.
    """
    check(num_events >= 0, "num_events", "must be >= 0")
    write_detectors(modules.module_table(), directory)
    prefixes = []
    for event_id in range(first_event_id, first_event_id + num_events):
        event = generate_event(cfg, event_id, seed)
        prefixes.append(write_event(event, directory, compress=compress))
    return prefixes


# ------------------------------------------------------------------------------------ internals
@functools.lru_cache(maxsize=8)
def _pt_table(pt_min: float, pt_max: float, n: float, t: float) -> tuple[np.ndarray, np.ndarray]:
    """(cdf, pt) on a log grid of the Tsallis spectrum, for sampling by inverse transform."""
    pt = np.geomspace(pt_min, pt_max, 4096)
    density = pt * (1.0 + pt / (n * t)) ** -n
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (density[1:] + density[:-1]) * np.diff(pt))])
    return cdf / cdf[-1], pt


def _sample_particles(cfg: SyntheticConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Kinematics and production vertex of every primary: dict of float64/int64 arrays [P]."""
    n = cfg.num_particles
    vertex = rng.integers(0, cfg.num_vertices, size=n)
    vertex_xyz = np.stack(
        [
            rng.normal(0.0, cfg.vertex_sigma_xy, cfg.num_vertices),
            rng.normal(0.0, cfg.vertex_sigma_xy, cfg.num_vertices),
            rng.normal(0.0, cfg.vertex_sigma_z, cfg.num_vertices),
        ],
        axis=1,
    )[vertex]
    cdf, grid = _pt_table(cfg.pt_min, cfg.pt_max, cfg.pt_tsallis_n, cfg.pt_tsallis_t)
    pt = np.interp(rng.random(n), cdf, grid)
    eta = rng.uniform(-cfg.eta_max, cfg.eta_max, n)
    phi = rng.uniform(-np.pi, np.pi, n)
    charge = rng.choice(np.array([-1, 1]), size=n)
    # TrackML ids: vertex_id = vertex + 1, primary_id = 1, 2, ... within the vertex.
    number_in_vertex = np.zeros(n, dtype=np.int64)
    order = np.argsort(vertex, kind="stable")
    starts = np.searchsorted(vertex[order], vertex[order])
    number_in_vertex[order] = np.arange(n) - starts
    return {
        "particle_id": encode_particle_id(vertex + 1, number_in_vertex + 1),
        "vx": vertex_xyz[:, 0],
        "vy": vertex_xyz[:, 1],
        "vz": vertex_xyz[:, 2],
        "pt": pt,
        "phi": phi,
        "lam": np.sinh(eta),  # pz / pT
        "q": charge,
        "particle_type": secondaries.particle_types(charge, _PRIMARY_TYPES, rng),
    }


def _concat(*parts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


def _surfaces(cfg: SyntheticConfig) -> np.ndarray:
    """Global indices of the simulated layers."""
    if cfg.barrel_only:
        return np.flatnonzero(detector.LAYER_IS_BARREL)
    return np.arange(detector.NUM_LAYERS)


def _layer_resolution(cfg: SyntheticConfig) -> np.ndarray:
    """float64 [NUM_LAYERS, 2]: (u, v) resolution of each layer's modules (mm)."""
    resolution = np.zeros((detector.NUM_LAYERS, 2))
    for volumes, value in (
        (detector.PIXEL_VOLUMES, cfg.resolution_pixel),
        (detector.SHORT_STRIP_VOLUMES, cfg.resolution_short_strip),
        (detector.LONG_STRIP_VOLUMES, cfg.resolution_long_strip),
    ):
        resolution[np.isin(detector.LAYER_VOLUME_ID, volumes)] = value
    return resolution


def _signal_hits(
    cfg: SyntheticConfig, states: dict[str, np.ndarray], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Hits of the crossings on the modules, after inefficiency and smearing.

    Returns:
      Per hit (arrays [H]): particle, row (module row), true position true [H, 3], measured
      position xyz [H, 3], local_u, local_v (measured), momentum [H, 3].
    """
    crossing, row, true, local_u, local_v = modules.hits_on_modules(
        states["layer"], states["point"], states["direction"]
    )
    keep = rng.random(len(row)) < cfg.layer_efficiency
    crossing, row, true, local_u, local_v = (
        a[keep] for a in (crossing, row, true, local_u, local_v)
    )
    m = modules.MODULES
    resolution = _layer_resolution(cfg)[m.layer[row]]
    # Smeared in the module's local u, v and kept on the module, as a measured cluster is.
    meas_v = np.clip(
        local_v + rng.standard_normal(len(row)) * resolution[:, 1], *_span(m.half_v[row])
    )
    meas_u = local_u + rng.standard_normal(len(row)) * resolution[:, 0]
    meas_u = np.clip(meas_u, *_span(m.half_u(row, meas_v)))
    return {
        "particle": states["particle"][crossing],
        "row": row,
        "true": true,
        "xyz": m.centre[row] + meas_u[:, None] * m.u[row] + meas_v[:, None] * m.v[row],
        "local_u": meas_u,
        "local_v": meas_v,
        "momentum": states["momentum"][crossing],
    }


def _span(half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return -half, half


def _noise_hits(
    cfg: SyntheticConfig, surfaces: np.ndarray, num_signal: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Noise hits, uniform over the module area, so that they are ``noise_fraction`` of all."""
    num = int(round(cfg.noise_fraction / (1.0 - cfg.noise_fraction) * num_signal))
    row, xyz, local_u, local_v = modules.sample_on_modules(surfaces, num, rng)
    return {"row": row, "xyz": xyz, "local_u": local_u, "local_v": local_v}


def _assemble_event(
    event_id: int,
    particles: dict[str, np.ndarray],
    signal: dict[str, np.ndarray],
    noise: dict[str, np.ndarray],
) -> Event:
    """The TrackML frames of the signal hits [S] and noise hits [N], listed by volume, layer and
    module (hit_id 1..S+N in that order)."""
    row = np.concatenate([signal["row"], noise["row"]])
    order = _trackml_hit_order(row)
    particle_id, xyz, true, momentum, local = _hit_arrays(particles, signal, noise, order)
    hit_id = np.arange(1, len(row) + 1, dtype=np.int64)
    nhits = np.bincount(signal["particle"], minlength=len(particles["pt"]))
    return Event(
        int(event_id),
        _hits_frame(hit_id, xyz, row[order]),
        _truth_frame(hit_id, particle_id, true, momentum, particles),
        _particles_frame(particles, nhits),
        _cells_frame(hit_id, row[order], local),
    )


def _trackml_hit_order(row: np.ndarray) -> np.ndarray:
    """int64 [H]: the hits on module rows ``row`` [H] sorted by volume, layer and module, as
    TrackML lists them."""
    layer = modules.MODULES.layer[row]
    module = modules.MODULES.module_id[row]
    return np.lexsort((module, detector.LAYER_LAYER_ID[layer], detector.LAYER_VOLUME_ID[layer]))


def _hit_arrays(
    particles: dict[str, np.ndarray],
    signal: dict[str, np.ndarray],
    noise: dict[str, np.ndarray],
    order: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """Signal then noise hits' values, taken in ``order`` [H]: particle_id int64 [H] (0 for
    noise), measured xyz [H, 3], true xyz [H, 3] (the measured one for noise), momentum [H, 3]
    (0 for noise) and local (u, v) [H, 2]."""
    num_noise = len(noise["row"])
    particle_row = np.concatenate([signal["particle"], np.full(num_noise, -1)])[order]
    particle_id = np.where(
        particle_row >= 0, particles["particle_id"][np.maximum(particle_row, 0)], 0
    )
    xyz = np.concatenate([signal["xyz"], noise["xyz"]])[order]
    true = np.concatenate([signal["true"], noise["xyz"]])[order]
    momentum = np.concatenate([signal["momentum"], np.zeros((num_noise, 3))])[order]
    local = np.concatenate(
        [
            np.stack([signal["local_u"], signal["local_v"]], 1),
            np.stack([noise["local_u"], noise["local_v"]], 1),
        ]
    )[order]
    return particle_id, xyz, true, momentum, local


def _hits_frame(hit_id: np.ndarray, xyz: np.ndarray, row: np.ndarray) -> pd.DataFrame:
    """TrackML hits of positions xyz [H, 3] on module rows ``row`` [H]."""
    layer = modules.MODULES.layer[row]
    return pd.DataFrame(
        {
            "hit_id": hit_id,
            "x": xyz[:, 0],
            "y": xyz[:, 1],
            "z": xyz[:, 2],
            "volume_id": detector.LAYER_VOLUME_ID[layer],
            "layer_id": detector.LAYER_LAYER_ID[layer],
            "module_id": modules.MODULES.module_id[row],
        }
    ).astype(COLUMNS["hits"])


def _truth_frame(
    hit_id: np.ndarray,
    particle_id: np.ndarray,
    true: np.ndarray,
    momentum: np.ndarray,
    particles: dict[str, np.ndarray],
) -> pd.DataFrame:
    """TrackML truth of hits [H] with true positions [H, 3] and momenta [H, 3], with weights."""
    weight = hit_weights(
        particle_id, true[:, 2], particles["particle_id"], particles["vz"], particles["pt"]
    )
    return pd.DataFrame(
        {
            "hit_id": hit_id,
            "particle_id": particle_id,
            "tx": true[:, 0],
            "ty": true[:, 1],
            "tz": true[:, 2],
            "tpx": momentum[:, 0],
            "tpy": momentum[:, 1],
            "tpz": momentum[:, 2],
            "weight": weight,
        }
    ).astype(COLUMNS["truth"])


def _particles_frame(particles: dict[str, np.ndarray], nhits: np.ndarray) -> pd.DataFrame:
    """TrackML particles [P], with ``nhits`` [P] recorded hits each."""
    pt, phi = particles["pt"], particles["phi"]
    return pd.DataFrame(
        {
            "particle_id": particles["particle_id"],
            "vx": particles["vx"],
            "vy": particles["vy"],
            "vz": particles["vz"],
            "px": pt * np.cos(phi),
            "py": pt * np.sin(phi),
            "pz": pt * particles["lam"],
            "q": particles["q"],
            "nhits": nhits,
            "particle_type": particles["particle_type"],
        }
    ).astype(COLUMNS["particles"])


def _cells_frame(hit_id: np.ndarray, row: np.ndarray, local: np.ndarray) -> pd.DataFrame:
    """TrackML cells, one per hit [H] on module rows ``row`` [H] at local (u, v) [H, 2]; the
    value is filled in later."""
    ch0, ch1 = modules.module_channels(row, local[:, 0], local[:, 1])
    return pd.DataFrame({"hit_id": hit_id, "ch0": ch0, "ch1": ch1, "value": 0.0}).astype(
        COLUMNS["cells"]
    )
