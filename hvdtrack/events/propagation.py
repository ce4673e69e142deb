"""Helices through the detector: where each particle crosses the layers, with multiple scattering.

A particle of charge q and transverse momentum pT in a field B along z moves on a helix of
radius R = pT / (0.3 |q| B) m with turning sense h = -sign(q B): after turning angle alpha its
direction is psi = phi0 + h alpha, its transverse position c + h R (sin psi, -cos psi) around
the centre c, and z = vz + R alpha lambda (lambda = pz / pT).

Crossings are found on the nominal surfaces (cylinders of radius r, disks at z), where the
module planes of ``hvdtrack.events.modules`` then take the hits. A particle whose circle stays
inside the tracker (max radius below ``EXIT_RADIUS``) is a looper: it is followed for one whole
turn, so it crosses the barrel layers outwards and back inwards (no energy loss); any other
particle stops at its turning point or where it leaves the tracker.

Public symbols: ``EXIT_RADIUS``, ``PION_MASS``, ``Helices``, ``helices``, ``find_crossings``,
``crossing_states``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hvdtrack.events import detector

PION_MASS = 0.13957  # GeV; every particle is treated as a pion for beta in the Highland formula.
EXIT_RADIUS = 1100.0  # mm: a circle reaching beyond this leaves the tracker
_MM_PER_M = 1000.0
_TWO_PI = 2.0 * np.pi


@dataclasses.dataclass
class Helices:
    """Helix parameters per particle, float64 arrays [P]: vertex (vx, vy, vz), pt, phi0, lam
    (pz / pT), radius (mm), h (turning sense), centre (cx, cy), its distance d and angle gamma
    from the beam line, and alpha_max, the last turning angle followed."""

    vx: np.ndarray
    vy: np.ndarray
    vz: np.ndarray
    pt: np.ndarray
    phi0: np.ndarray
    lam: np.ndarray
    radius: np.ndarray
    h: np.ndarray
    cx: np.ndarray
    cy: np.ndarray
    d: np.ndarray
    gamma: np.ndarray
    alpha_max: np.ndarray

    def position(self, rows: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        """float64 [C, 3]: the point of particle ``rows`` after turning ``alpha``."""
        psi = self.phi0[rows] + self.h[rows] * alpha
        hr = self.h[rows] * self.radius[rows]
        return np.stack(
            [
                self.cx[rows] + hr * np.sin(psi),
                self.cy[rows] - hr * np.cos(psi),
                self.vz[rows] + self.radius[rows] * alpha * self.lam[rows],
            ],
            axis=1,
        )

    def direction(self, rows: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        """float64 [C, 3]: unit direction of motion of particle ``rows`` after turning ``alpha``."""
        psi = self.phi0[rows] + self.h[rows] * alpha
        lam = self.lam[rows]
        return np.stack([np.cos(psi), np.sin(psi), lam], axis=1) / np.sqrt(1.0 + lam * lam)[:, None]


def helices(particles: dict[str, np.ndarray], field_tesla: float) -> Helices:
    """Helix parameters of ``particles`` (vx, vy, vz, pt, phi, lam, q arrays [P])."""
    pt, phi0, lam, q = particles["pt"], particles["phi"], particles["lam"], particles["q"]
    vx, vy, vz = particles["vx"], particles["vy"], particles["vz"]
    radius = pt / (0.3 * field_tesla) * _MM_PER_M
    h = -np.sign(q * field_tesla).astype(np.float64)
    cx = vx - h * radius * np.sin(phi0)
    cy = vy + h * radius * np.cos(phi0)
    d = np.hypot(cx, cy)
    gamma = np.arctan2(cy, cx)
    # The transverse radius grows until the turning point, where h sin(psi - gamma) = 1.
    alpha_turn = np.mod(0.5 * np.pi + h * (gamma - phi0), _TWO_PI)
    loops = d + radius < EXIT_RADIUS
    alpha_max = np.where(loops, _TWO_PI, alpha_turn)
    return Helices(vx, vy, vz, pt, phi0, lam, radius, h, cx, cy, d, gamma, alpha_max)


def find_crossings(helix: Helices, surfaces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every particle's crossings of the nominal surfaces, in order along its path.

    A cylinder is crossed where the circle meets it (twice per turn: outwards and inwards), a
    disk where z reaches it; a crossing counts for 0 < alpha <= alpha_max inside the surface.

    Args:
      helix: the particles' helices; surfaces: int64 [S] global layer indices.

    Returns:
      (alpha, layer): float64 [P, K] turning angles sorted along each row (inf where there is
      no crossing: those sort last) and int64 [P, K] the layer of each; K = 2 S at most.
    """
    columns, layers = [], []
    r_h, d, h, gamma, phi0 = helix.radius, helix.d, helix.h, helix.gamma, helix.phi0
    with np.errstate(divide="ignore", invalid="ignore"):
        for layer in surfaces:
            if detector.LAYER_IS_BARREL[layer]:
                r = detector.LAYER_R_MIN[layer]
                s = h * (r * r - d * d - r_h * r_h) / (2.0 * r_h * d)
                asin = np.arcsin(np.clip(s, -1.0, 1.0))
                for branch in (gamma + asin, gamma + np.pi - asin):
                    a = np.mod(h * (branch - phi0), _TWO_PI)
                    z = helix.vz + r_h * a * helix.lam
                    ok = (np.abs(s) <= 1.0) & (np.abs(z) <= detector.LAYER_Z_MAX[layer])
                    columns.append(np.where(ok, a, np.inf))
                    layers.append(layer)
            else:
                a = (detector.LAYER_Z_MIN[layer] - helix.vz) / (r_h * helix.lam)
                psi = phi0 + h * a
                rho = np.hypot(helix.cx + h * r_h * np.sin(psi), helix.cy - h * r_h * np.cos(psi))
                ok = (
                    (a > 0)
                    & (rho >= detector.LAYER_R_MIN[layer])
                    & (rho <= detector.LAYER_R_MAX[layer])
                )
                columns.append(np.where(ok, a, np.inf))
                layers.append(layer)
    alpha = np.stack(columns, axis=1)
    alpha = np.where((alpha > 0) & (alpha <= helix.alpha_max[:, None]), alpha, np.inf)
    order = np.argsort(alpha, axis=1, kind="stable")
    return np.take_along_axis(alpha, order, axis=1), np.asarray(layers, dtype=np.int64)[order]


def crossing_states(
    helix: Helices,
    alpha: np.ndarray,
    layer: np.ndarray,
    crossed: np.ndarray,
    material_x0: float,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Positions and directions at the crossings, displaced by multiple scattering.

    Highland angle at each crossing (the effective thickness grows with the crossing angle),
    accumulated as a displacement at every later crossing, delta_k = sum_{j<k} theta_j (L_k -
    L_j), in two directions across the track: one moves the crossing around the beam line, the
    other along the surface (z on a cylinder, r on a disk). The direction and the momentum are
    those of the unscattered helix.

    Args:
      helix: the particles' helices; alpha, layer: [P, K] from ``find_crossings``; crossed:
        bool [P, K], the crossings to keep; material_x0: a layer's thickness in radiation lengths.

    Returns:
      Flat arrays [C] over the kept crossings in particle order, then along the path: particle
      (row), layer, alpha, point [C, 3], direction [C, 3], momentum [C, 3] (GeV).
    """
    lam = helix.lam[:, None]
    slope = np.sqrt(1.0 + lam * lam)  # 3D path per transverse path, 1 / sin(theta)
    alpha = np.where(crossed, alpha, 0.0)
    path = helix.radius[:, None] * alpha * slope  # mm
    barrel = detector.LAYER_IS_BARREL[layer]
    momentum = helix.pt[:, None] * slope
    beta = momentum / np.sqrt(momentum**2 + PION_MASS**2)
    incidence = np.where(barrel, slope, slope / np.maximum(np.abs(lam), 1e-3))
    x_x0 = material_x0 * np.minimum(incidence, 20.0)
    theta0 = 0.0136 / (beta * momentum) * np.sqrt(x_x0) * (1.0 + 0.038 * np.log(x_x0))
    theta0 = np.where(crossed, theta0, 0.0)
    shifts = []
    for _ in range(2):
        kick = rng.standard_normal(theta0.shape) * theta0
        before = np.cumsum(kick, axis=1) - kick
        before_path = np.cumsum(kick * path, axis=1) - kick * path
        shifts.append(path * before - before_path)
    row, col = np.nonzero(crossed)
    a = alpha[row, col]
    lay = layer[row, col]
    on_barrel = barrel[row, col]
    point = helix.position(row, a)
    rho = np.hypot(point[:, 0], point[:, 1])
    long_factor = np.where(on_barrel, slope[row, 0], slope[row, 0] / np.abs(lam[row, 0]))
    phi = np.arctan2(point[:, 1], point[:, 0]) + shifts[0][row, col] / rho
    along = np.where(on_barrel, point[:, 2], rho) + shifts[1][row, col] * long_factor
    r = np.where(on_barrel, detector.LAYER_R_MIN[lay], along)
    z = np.where(on_barrel, along, detector.LAYER_Z_MIN[lay])
    direction = helix.direction(row, a)
    return {
        "particle": row,
        "layer": lay,
        "alpha": a,
        "point": np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1),
        "direction": direction,
        "momentum": direction * (helix.pt[row] * slope[row, 0])[:, None],
    }
