"""Secondary particles: hadronic interactions in the layers and decays in flight.

A primary that interacts at a layer crossing stops there and emits one to four hadrons
(process 121, Geant4's hadronic inelastic subtype); a charged pion or kaon that decays in flight
(exponential decay length beta gamma c tau) stops there and emits its muon (process 201,
Geant4's decay subtype; pi -> mu nu and K -> mu nu, the neutrino unseen), which leaves with a
kink. Secondaries keep their parent's vertex_id and primary_id, with generation 1 and
secondary_id 1, 2, ... per parent (TrackML's bit layout, ``particle_ids``).

Public symbols: ``HADRONIC_PROCESS``, ``DECAY_PROCESS``, ``decay_alpha``,
``hadronic_products``, ``decay_products``.
"""

from __future__ import annotations

import numpy as np

from hvdtrack.events.particle_ids import decode_particle_id, encode_particle_id
from hvdtrack.events.propagation import Helices

HADRONIC_PROCESS = 121
DECAY_PROCESS = 201
# PDG codes of positive hadrons from interactions, with their shares (negatives: minus the code).
HADRON_TYPES = ((211, 0.70), (2212, 0.20), (321, 0.10))
_MUON = 13  # PDG: mu- is +13, mu+ is -13
# (PDG code, mass in GeV, c tau in mm, lowest muon momentum fraction in the two-body decay)
_UNSTABLE = ((211, 0.13957, 7804.5, 0.573), (321, 0.49368, 3711.0, 0.046))


def particle_types(charge: np.ndarray, table: tuple, rng: np.random.Generator) -> np.ndarray:
    """int64 [N]: PDG codes drawn from ``table`` ((code, share), ...), signed by the charge."""
    codes = np.array([code for code, _ in table])
    shares = np.array([share for _, share in table])
    return codes[rng.choice(len(codes), size=len(charge), p=shares / shares.sum())] * charge


def decay_alpha(helix: Helices, particle_type: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """float64 [P]: the turning angle at which each particle decays (inf for stable ones)."""
    momentum = helix.pt * np.sqrt(1.0 + helix.lam**2)
    length = rng.exponential(1.0, len(momentum))
    alpha = np.full(len(momentum), np.inf)
    for code, mass, c_tau, _ in _UNSTABLE:
        is_type = np.abs(particle_type) == code
        path = length * momentum / mass * c_tau  # mm
        alpha = np.where(is_type, path / (helix.radius * np.sqrt(1.0 + helix.lam**2)), alpha)
    return alpha


def hadronic_products(
    primaries: dict[str, np.ndarray],
    helix: Helices,
    parents: np.ndarray,
    alpha: np.ndarray,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """One to four hadrons per interacting parent, sharing 70% of its momentum (flat random
    fractions), at a polar angle of |N(0, 0.35)| rad around its direction, from 1 mm beyond the
    interaction point.

    Args:
      primaries: the primaries' arrays (particle_id, ...); helix: their helices;
      parents: int64 [I] rows of the interacting primaries; alpha: float64 [I] where.
    """
    count = np.minimum(1 + rng.poisson(1.0, len(parents)), 4)
    parent = np.repeat(parents, count)
    at = np.repeat(alpha, count)
    n = len(parent)
    share = rng.random(n)
    starts = np.cumsum(count) - count
    group_total = np.repeat(np.add.reduceat(share, starts), count) if n else share
    momentum = helix.pt[parent] * np.sqrt(1.0 + helix.lam[parent] ** 2) * 0.7 * share / group_total
    theta = np.abs(rng.normal(0.0, 0.35, n))
    charge = rng.choice(np.array([-1, 1]), size=n)
    types = particle_types(charge, HADRON_TYPES, rng)
    number = np.arange(n) - np.repeat(starts, count) + 1
    return _emit(
        primaries, helix, parent, at, number, momentum, theta, charge, types, HADRONIC_PROCESS, rng
    )


def decay_products(
    primaries: dict[str, np.ndarray],
    helix: Helices,
    parents: np.ndarray,
    alpha: np.ndarray,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The muon of each decaying parent: same charge, a momentum fraction flat between the
    two-body decay's lowest and 1, at a polar angle of |N(0, 0.03 GeV / p)| rad.

    Args: as ``hadronic_products``, for the decaying primaries.
    """
    n = len(parents)
    code = np.abs(primaries["particle_type"][parents])
    lowest = np.ones(n)
    for pdg, _, _, fraction in _UNSTABLE:
        lowest = np.where(code == pdg, fraction, lowest)
    parent_momentum = helix.pt[parents] * np.sqrt(1.0 + helix.lam[parents] ** 2)
    momentum = parent_momentum * rng.uniform(lowest, 1.0)
    theta = np.abs(rng.normal(0.0, 1.0, n)) * 0.03 / parent_momentum
    charge = primaries["q"][parents]
    return _emit(
        primaries,
        helix,
        parents,
        alpha,
        np.ones(n, dtype=np.int64),
        momentum,
        theta,
        charge,
        -_MUON * charge,
        DECAY_PROCESS,
        rng,
    )


def _emit(
    primaries: dict[str, np.ndarray],
    helix: Helices,
    parent: np.ndarray,
    alpha: np.ndarray,
    number: np.ndarray,
    momentum: np.ndarray,
    theta: np.ndarray,
    charge: np.ndarray,
    types: np.ndarray,
    process: int,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Secondaries leaving the parents' helices at ``alpha``, turned by ``theta`` (random
    azimuth) from the parent's direction; hadrons start 1 mm further along their own direction,
    clear of the layer the interaction happened in."""
    n = len(parent)
    forward = helix.direction(parent, alpha)
    side = np.cross(forward, np.array([0.0, 0.0, 1.0]))
    side_norm = np.linalg.norm(side, axis=1, keepdims=True)
    side = np.where(side_norm > 1e-9, side / np.maximum(side_norm, 1e-12), [1.0, 0.0, 0.0])
    other = np.cross(forward, side)
    azimuth = rng.uniform(-np.pi, np.pi, n)[:, None]
    theta = theta[:, None]
    direction = np.cos(theta) * forward + np.sin(theta) * (
        np.cos(azimuth) * side + np.sin(azimuth) * other
    )
    step = 1.0 if process == HADRONIC_PROCESS else 0.0
    vertex = helix.position(parent, alpha) + step * direction
    transverse = np.maximum(np.hypot(direction[:, 0], direction[:, 1]), 1e-6)
    fields = decode_particle_id(primaries["particle_id"][parent])
    return {
        "particle_id": encode_particle_id(
            fields["vertex_id"], fields["primary_id"], 1, number, process
        ),
        "vx": vertex[:, 0],
        "vy": vertex[:, 1],
        "vz": vertex[:, 2],
        "pt": momentum * transverse,
        "phi": np.arctan2(direction[:, 1], direction[:, 0]),
        "lam": direction[:, 2] / transverse,
        "q": charge,
        "particle_type": types.astype(np.int64),
    }
