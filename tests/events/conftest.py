"""Fixtures for the events tests: a small synthetic event and one written to disk."""

from __future__ import annotations

import pytest

from hvdtrack.events.synthetic import SyntheticConfig, generate_event
from hvdtrack.events.trackml import Event, write_event

SMALL = SyntheticConfig(num_particles=50, num_vertices=5)


@pytest.fixture
def small_event() -> Event:
    """About 50 particles (a few hundred hits, 10% noise), whole detector."""
    return generate_event(SMALL, event_id=1000, seed=3)


@pytest.fixture
def written_event(tmp_path, small_event) -> str:
    """The small event written as plain CSVs; returns its prefix."""
    return write_event(small_event, tmp_path)
