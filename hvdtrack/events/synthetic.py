"""Synthetic TrackML-like events: charged helices from a pile-up vertex spread through the detector.

Each particle is a helix in the solenoidal field; its crossings with every barrel cylinder and
end-cap disk on the outgoing arc (loopers stop at their turning point) become hits after
multiple scattering (Highland, accumulated along the track), measurement smearing and layer
inefficiency; noise hits are spread uniformly over the sensitive area. Everything is vectorised
over particles (the only loop is over the 48 surfaces) and deterministic in (seed, event_id).

The files are TrackML's: hits, cells, particles (with particle_type), truth, and a
``detectors.csv`` of the module tiling per dataset; particle ids follow TrackML's bit layout
(``particle_ids``: vertex_id = vertex + 1, primary_id = number within the vertex, generation,
secondary_id and process 0) and truth weights TrackML's definition (``weights``).

Simplifications (stated so nobody mistakes them for TrackML): every particle is a charged pion
(particle_type +-211) and a primary: no energy loss, no secondaries, no double hits on
overlapping modules; hits lie on the nominal cylinders and disks, not on module planes;
scattering displaces later hits but the truth momentum (tpx, tpy, tpz) is that of the
unscattered helix; module ids and channels follow a simple tiling (``detector.module_table``);
each hit has one cell whose value is a random deposited charge.

Public symbols: ``SyntheticConfig``, ``generate_event``, ``generate_dataset``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Union

import numpy as np
import pandas as pd

from hvdtrack.configtools import check
from hvdtrack.events import detector
from hvdtrack.events.particle_ids import encode_particle_id
from hvdtrack.events.trackml import COLUMNS, Event, write_detectors, write_event
from hvdtrack.events.weights import hit_weights

PION_MASS = 0.13957  # GeV; every particle is treated as a pion for beta in the Highland formula.
_MM_PER_M = 1000.0


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """Settings of the synthetic event generator. Defaults give a pile-up-200-like event.

    With the defaults an event holds 10,000 particles and about 100,000 hits (10% of them noise);
    about 10% of the particles have pT > 1 GeV.

    Attributes:
      num_particles: charged particles per event.
      num_vertices: pile-up vertices the particles are shared among.
      pt_min: floor of the pT spectrum (GeV).
      pt_max: cap of the pT spectrum (GeV).
      pt_slope: index a of the power law P(pT > x) = (x / pt_min)^-a; with pt_min 0.15 the
        default 1.21 puts 10% of the particles above 1 GeV.
      eta_max: particles are uniform in pseudorapidity on [-eta_max, eta_max].
      vertex_sigma_z: Gaussian spread of the vertices along the beam (mm).
      vertex_sigma_xy: Gaussian spread of the vertices across the beam (mm).
      field_tesla: solenoid field along +z (T).
      material_x0: thickness of one sensitive layer in radiation lengths (at normal incidence).
      layer_efficiency: probability that a crossing leaves a hit.
      noise_fraction: fraction of all hits that are noise (particle_id 0).
      resolution_pixel: (r*phi, z-or-r) Gaussian hit resolution in the pixel volumes (mm).
      resolution_short_strip: the same for the short-strip volumes (mm).
      resolution_long_strip: the same for the long-strip volumes (mm).
      barrel_only: simulate the barrel cylinders only (no end-cap disks, no end-cap noise).
    """

    num_particles: int = 10_000
    num_vertices: int = 200
    pt_min: float = 0.15
    pt_max: float = 100.0
    pt_slope: float = 1.21
    eta_max: float = 4.0
    vertex_sigma_z: float = 55.0
    vertex_sigma_xy: float = 0.015
    field_tesla: float = 2.0
    material_x0: float = 0.025
    layer_efficiency: float = 0.985
    noise_fraction: float = 0.1
    resolution_pixel: tuple[float, float] = (0.015, 0.015)
    resolution_short_strip: tuple[float, float] = (0.025, 0.35)
    resolution_long_strip: tuple[float, float] = (0.035, 3.0)
    barrel_only: bool = False

    def __post_init__(self) -> None:
        check(self.num_particles >= 0, "num_particles", "must be >= 0")
        check(self.num_vertices >= 1, "num_vertices", "must be >= 1")
        check(self.pt_min > 0, "pt_min", "must be > 0 (GeV)")
        check(self.pt_max > self.pt_min, "pt_max", "must be > pt_min")
        check(self.pt_slope > 0, "pt_slope", "must be > 0")
        check(self.eta_max > 0, "eta_max", "must be > 0")
        check(self.vertex_sigma_z >= 0, "vertex_sigma_z", "must be >= 0 (mm)")
        check(self.vertex_sigma_xy >= 0, "vertex_sigma_xy", "must be >= 0 (mm)")
        check(self.field_tesla > 0, "field_tesla", "must be > 0 (T)")
        check(self.material_x0 > 0, "material_x0", "must be > 0 (radiation lengths)")
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
      particle_id 0 and weight 0; TrackML weights summing to 1), particles (nhits = hits left
      after acceptance and inefficiency) and cells (one per hit).
    """
    rng = np.random.default_rng([int(seed), int(event_id)])
    particles = _sample_particles(cfg, rng)
    signal = _propagate(cfg, particles, rng)
    noise = _sample_noise(cfg, len(signal["layer"]), rng)
    event = _assemble_event(event_id, particles, signal, noise)
    event.cells = _hit_cells(event.hits, rng)  # drawn last: the hits do not depend on them
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
    write_detectors(detector.module_table(), directory)
    prefixes = []
    for event_id in range(first_event_id, first_event_id + num_events):
        event = generate_event(cfg, event_id, seed)
        prefixes.append(write_event(event, directory, compress=compress))
    return prefixes


# ------------------------------------------------------------------------------------ internals
def _sample_particles(cfg: SyntheticConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Kinematics and production vertex of every particle: dict of float64/int64 arrays [P]."""
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
    # Truncated power law by inverse transform: P(pT > x) = (x / pt_min)^-a on [pt_min, pt_max].
    tail = (cfg.pt_max / cfg.pt_min) ** -cfg.pt_slope
    pt = cfg.pt_min * (1.0 - rng.random(n) * (1.0 - tail)) ** (-1.0 / cfg.pt_slope)
    eta = rng.uniform(-cfg.eta_max, cfg.eta_max, n)
    phi = rng.uniform(-np.pi, np.pi, n)
    charge = rng.choice(np.array([-1, 1]), size=n)
    # TrackML ids: vertex_id = vertex + 1, primary_id = 1, 2, ... within the vertex.
    number_in_vertex = np.zeros(n, dtype=np.int64)
    order = np.argsort(vertex, kind="stable")
    starts = np.searchsorted(vertex[order], vertex[order])
    number_in_vertex[order] = np.arange(n) - starts
    particle_id = encode_particle_id(vertex + 1, number_in_vertex + 1)
    return {
        "particle_id": particle_id,
        "vx": vertex_xyz[:, 0],
        "vy": vertex_xyz[:, 1],
        "vz": vertex_xyz[:, 2],
        "pt": pt,
        "phi": phi,
        "lam": np.sinh(eta),  # pz / pT
        "q": charge,
    }


def _surfaces(cfg: SyntheticConfig) -> np.ndarray:
    """Global indices of the simulated layers."""
    if cfg.barrel_only:
        return np.flatnonzero(detector.LAYER_IS_BARREL)
    return np.arange(detector.NUM_LAYERS)


def _layer_resolution(cfg: SyntheticConfig) -> np.ndarray:
    """float64 [NUM_LAYERS, 2]: (r*phi, z-or-r) resolution of each layer (mm)."""
    resolution = np.zeros((detector.NUM_LAYERS, 2))
    for volumes, value in (
        (detector.PIXEL_VOLUMES, cfg.resolution_pixel),
        (detector.SHORT_STRIP_VOLUMES, cfg.resolution_short_strip),
        (detector.LONG_STRIP_VOLUMES, cfg.resolution_long_strip),
    ):
        resolution[np.isin(detector.LAYER_VOLUME_ID, volumes)] = value
    return resolution


def _propagate(
    cfg: SyntheticConfig, particles: dict[str, np.ndarray], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Finds every particle's surface crossings and turns them into measured hits.

    Helix: radius R = pT / (0.3 |q| B) m, turning sense h = -sign(q B); after turning angle
    alpha the direction is psi = phi0 + h alpha, the transverse position is
    c + h R (sin psi, -cos psi) around the centre c, and z = vz + R alpha lambda.

    Returns:
      Per hit (flat arrays [H]): particle (row into ``particles``), layer, true x/y/z, measured
      x/y/z, truth momentum px/py/pz.
    """
    pt, phi0, lam, q = particles["pt"], particles["phi"], particles["lam"], particles["q"]
    vx, vy, vz = particles["vx"], particles["vy"], particles["vz"]
    radius = pt / (0.3 * cfg.field_tesla) * _MM_PER_M  # mm
    h = -np.sign(q * cfg.field_tesla)
    cx = vx - h * radius * np.sin(phi0)
    cy = vy + h * radius * np.cos(phi0)
    d = np.hypot(cx, cy)
    gamma = np.arctan2(cy, cx)
    two_pi = 2.0 * np.pi
    # The transverse radius grows until the turning point, where h sin(psi - gamma) = 1.
    alpha_turn = np.mod(0.5 * np.pi + h * (gamma - phi0), two_pi)

    surfaces = _surfaces(cfg)
    alpha = np.full((len(pt), len(surfaces)), np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        for k, layer in enumerate(surfaces):
            if detector.LAYER_IS_BARREL[layer]:
                r = detector.LAYER_R_MIN[layer]
                s = h * (r * r - d * d - radius * radius) / (2.0 * radius * d)
                a = np.mod(h * (gamma + np.arcsin(np.clip(s, -1.0, 1.0)) - phi0), two_pi)
                z = vz + radius * a * lam
                ok = (
                    (np.abs(s) <= 1.0)
                    & (a <= alpha_turn)
                    & (np.abs(z) <= detector.LAYER_Z_MAX[layer])
                )
            else:
                a = (detector.LAYER_Z_MIN[layer] - vz) / (radius * lam)
                psi = phi0 + h * a
                rho = np.hypot(cx + h * radius * np.sin(psi), cy - h * radius * np.cos(psi))
                ok = (
                    (a > 0)
                    & (a <= alpha_turn)
                    & (rho >= detector.LAYER_R_MIN[layer])
                    & (rho <= detector.LAYER_R_MAX[layer])
                )
            alpha[:, k] = np.where(ok, a, np.inf)

    # Order each particle's crossings along its path; crossings that do not happen sort last.
    order = np.argsort(alpha, axis=1, kind="stable")
    alpha = np.take_along_axis(alpha, order, axis=1)
    layer = surfaces[order]
    crossed = np.isfinite(alpha)
    alpha = np.where(crossed, alpha, 0.0)
    slope = np.sqrt(1.0 + lam * lam)[:, None]  # 3D path per transverse path, 1 / sin(theta)
    path = radius[:, None] * alpha * slope  # mm
    barrel = detector.LAYER_IS_BARREL[layer]

    # Multiple scattering: Highland angle at each crossing (effective thickness grows with the
    # crossing angle), accumulated as a displacement at every later crossing:
    # delta_k = sum_{j<k} theta_j (L_k - L_j), in two directions across the track.
    momentum = (pt * np.sqrt(1.0 + lam * lam))[:, None]
    beta = momentum / np.sqrt(momentum**2 + PION_MASS**2)
    incidence = np.where(barrel, slope, slope / np.maximum(np.abs(lam)[:, None], 1e-3))
    x_x0 = cfg.material_x0 * np.minimum(incidence, 20.0)
    theta0 = 0.0136 / (beta * momentum) * np.sqrt(x_x0) * (1.0 + 0.038 * np.log(x_x0))
    theta0 = np.where(crossed, theta0, 0.0)
    shifts = []
    for _ in range(2):
        kick = rng.standard_normal(theta0.shape) * theta0
        before = np.cumsum(kick, axis=1) - kick
        before_path = np.cumsum(kick * path, axis=1) - kick * path
        shifts.append(path * before - before_path)
    shift_rphi, shift_long = shifts

    keep = crossed & (rng.random(crossed.shape) < cfg.layer_efficiency)
    row, col = np.nonzero(keep)
    layer = layer[row, col]
    barrel = barrel[row, col]
    a = alpha[row, col]
    psi = phi0[row] + h[row] * a
    x = cx[row] + h[row] * radius[row] * np.sin(psi)
    y = cy[row] - h[row] * radius[row] * np.cos(psi)
    z = vz[row] + radius[row] * a * lam[row]
    rho = np.hypot(x, y)
    # A sideways shift moves the crossing along z on a cylinder (by 1/sin theta) and along r on
    # a disk (by 1/|cos theta|); the r*phi shift moves it around the beam line.
    long_factor = np.where(barrel, slope[row, 0], slope[row, 0] / np.abs(lam[row]))
    true_phi = np.arctan2(y, x) + shift_rphi[row, col] / rho
    true_along = np.where(barrel, z, rho) + shift_long[row, col] * long_factor
    resolution = _layer_resolution(cfg)[layer]
    meas_phi = true_phi + rng.standard_normal(len(row)) * resolution[:, 0] / rho
    meas_along = true_along + rng.standard_normal(len(row)) * resolution[:, 1]

    # Hits stay on their surface: a cylinder fixes r, a disk fixes z.
    lo = np.where(barrel, detector.LAYER_Z_MIN[layer], detector.LAYER_R_MIN[layer])
    hi = np.where(barrel, detector.LAYER_Z_MAX[layer], detector.LAYER_R_MAX[layer])
    inside = (true_along >= lo) & (true_along <= hi)
    meas_along = np.clip(meas_along, lo, hi)
    surface_r = detector.LAYER_R_MIN[layer]
    surface_z = detector.LAYER_Z_MIN[layer]

    def _to_xyz(phi: np.ndarray, along: np.ndarray) -> tuple[np.ndarray, ...]:
        r = np.where(barrel, surface_r, along)
        return r * np.cos(phi), r * np.sin(phi), np.where(barrel, along, surface_z)

    tx, ty, tz = _to_xyz(true_phi, true_along)
    mx, my, mz = _to_xyz(meas_phi, meas_along)
    hits = {
        "particle": row,
        "layer": layer,
        "tx": tx,
        "ty": ty,
        "tz": tz,
        "x": mx,
        "y": my,
        "z": mz,
        "tpx": pt[row] * np.cos(psi),
        "tpy": pt[row] * np.sin(psi),
        "tpz": pt[row] * lam[row],
    }
    return {key: value[inside] for key, value in hits.items()}


def _sample_noise(
    cfg: SyntheticConfig, num_signal: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Noise hits, uniform over the sensitive area, so that they are ``noise_fraction`` of all."""
    num = int(round(cfg.noise_fraction / (1.0 - cfg.noise_fraction) * num_signal))
    surfaces = _surfaces(cfg)
    r_min, r_max = detector.LAYER_R_MIN[surfaces], detector.LAYER_R_MAX[surfaces]
    z_min, z_max = detector.LAYER_Z_MIN[surfaces], detector.LAYER_Z_MAX[surfaces]
    area = np.where(
        detector.LAYER_IS_BARREL[surfaces],
        2.0 * np.pi * r_min * (z_max - z_min),
        np.pi * (r_max**2 - r_min**2),
    )
    layer = surfaces[rng.choice(len(surfaces), size=num, p=area / area.sum())]
    phi = rng.uniform(-np.pi, np.pi, num)
    u = rng.random(num)
    lo, hi = detector.LAYER_R_MIN[layer], detector.LAYER_R_MAX[layer]
    r = np.sqrt(lo**2 + u * (hi**2 - lo**2))  # uniform per unit area on a disk
    z = np.where(
        detector.LAYER_IS_BARREL[layer],
        detector.LAYER_Z_MIN[layer]
        + u * (detector.LAYER_Z_MAX[layer] - detector.LAYER_Z_MIN[layer]),
        detector.LAYER_Z_MIN[layer],
    )
    return {"layer": layer, "x": r * np.cos(phi), "y": r * np.sin(phi), "z": z}


def _hit_cells(hits: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """One cell per hit: the channel under the hit and a deposited charge (arbitrary units,
    gamma-distributed with mean 0.3)."""
    layer = detector.layer_index(hits["volume_id"].to_numpy(), hits["layer_id"].to_numpy())
    ch0, ch1 = detector.module_channels(
        layer, hits["x"].to_numpy(), hits["y"].to_numpy(), hits["z"].to_numpy()
    )
    return pd.DataFrame(
        {
            "hit_id": hits["hit_id"].to_numpy(),
            "ch0": ch0,
            "ch1": ch1,
            "value": rng.gamma(4.0, 0.075, len(hits)),
        }
    ).astype(COLUMNS["cells"])


def _assemble_event(
    event_id: int,
    particles: dict[str, np.ndarray],
    signal: dict[str, np.ndarray],
    noise: dict[str, np.ndarray],
) -> Event:
    num_signal, num_noise = len(signal["layer"]), len(noise["layer"])
    zeros = np.zeros(num_noise)
    layer = np.concatenate([signal["layer"], noise["layer"]])
    x = np.concatenate([signal["x"], noise["x"]])
    y = np.concatenate([signal["y"], noise["y"]])
    z = np.concatenate([signal["z"], noise["z"]])
    module = detector.module_id(layer, x, y, z)
    volume_id = detector.LAYER_VOLUME_ID[layer]
    layer_id = detector.LAYER_LAYER_ID[layer]
    # TrackML lists hits by volume, layer and module.
    order = np.lexsort((module, layer_id, volume_id))
    particle_row = np.concatenate([signal["particle"], np.full(num_noise, -1)])[order]
    is_signal = particle_row >= 0
    particle_id = np.where(is_signal, particles["particle_id"][np.maximum(particle_row, 0)], 0)

    hit_id = np.arange(1, num_signal + num_noise + 1, dtype=np.int64)
    hits = pd.DataFrame(
        {
            "hit_id": hit_id,
            "x": x[order],
            "y": y[order],
            "z": z[order],
            "volume_id": volume_id[order],
            "layer_id": layer_id[order],
            "module_id": module[order],
        }
    ).astype(COLUMNS["hits"])

    pt, phi = particles["pt"], particles["phi"]

    def _truth(key: str, noise_value: np.ndarray) -> np.ndarray:
        return np.concatenate([signal[key], noise_value])[order]

    truth = pd.DataFrame(
        {
            "hit_id": hit_id,
            "particle_id": particle_id,
            "tx": _truth("tx", noise["x"]),
            "ty": _truth("ty", noise["y"]),
            "tz": _truth("tz", noise["z"]),
            "tpx": _truth("tpx", zeros),
            "tpy": _truth("tpy", zeros),
            "tpz": _truth("tpz", zeros),
            "weight": 0.0,
        }
    )
    truth["weight"] = hit_weights(
        particle_id, truth["tz"].to_numpy(), particles["particle_id"], particles["vz"], pt
    )
    truth = truth.astype(COLUMNS["truth"])

    particle_frame = pd.DataFrame(
        {
            "particle_id": particles["particle_id"],
            "vx": particles["vx"],
            "vy": particles["vy"],
            "vz": particles["vz"],
            "px": pt * np.cos(phi),
            "py": pt * np.sin(phi),
            "pz": pt * particles["lam"],
            "q": particles["q"],
            "nhits": np.bincount(signal["particle"], minlength=len(pt)),
            "particle_type": 211 * particles["q"],  # pi+ / pi-
        }
    ).astype(COLUMNS["particles"])
    return Event(int(event_id), hits, truth, particle_frame)
