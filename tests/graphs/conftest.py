"""Helpers for the graph tests: hand-made events of a few hits, and a small synthetic event."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hvdtrack.events.synthetic import SyntheticConfig, generate_event
from hvdtrack.events.trackml import COLUMNS, Event


def make_event(hits, particles, event_id=1):
    """An event from literal hits and particles.

    Args:
      hits: rows (hit_id, volume_id, layer_id, r, phi, z, particle_id); truth positions equal the
        hit positions.
      particles: {particle_id: pt}; particles come from the origin.
    """
    rows = np.array(hits, dtype=np.float64).reshape(-1, 7)
    hit_id, volume, layer, r, phi, z, pid = rows.T
    x, y = r * np.cos(phi), r * np.sin(phi)
    pt = np.array([particles.get(int(p), 0.0) for p in pid])
    hits_frame = pd.DataFrame(
        {
            "hit_id": hit_id,
            "x": x,
            "y": y,
            "z": z,
            "volume_id": volume,
            "layer_id": layer,
            "module_id": 1,
        }
    ).astype(COLUMNS["hits"])
    truth = pd.DataFrame(
        {
            "hit_id": hit_id,
            "particle_id": pid,
            "tx": x,
            "ty": y,
            "tz": z,
            "tpx": pt * np.cos(phi),
            "tpy": pt * np.sin(phi),
            "tpz": 0.0,
            "weight": 0.0,
        }
    ).astype(COLUMNS["truth"])
    ids = np.array(sorted(particles), dtype=np.int64)
    particles_frame = pd.DataFrame(
        {
            "particle_id": ids,
            "vx": 0.0,
            "vy": 0.0,
            "vz": 0.0,
            "px": [particles[i] for i in ids],
            "py": 0.0,
            "pz": 0.0,
            "q": 1,
            "nhits": 0,
            "particle_type": 211,
        }
    ).astype(COLUMNS["particles"])
    return Event(event_id, hits_frame, truth, particles_frame)


@pytest.fixture(scope="session")
def small_event() -> Event:
    """About 50 particles, whole detector."""
    return generate_event(SyntheticConfig(num_particles=50, num_vertices=5), event_id=1000, seed=3)
