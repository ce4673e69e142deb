"""TrackML events: detector geometry, CSV reading/writing and the synthetic event generator.

Public symbols: ``Event``, ``find_events``, ``read_event``, ``write_event``, ``SyntheticConfig``,
``generate_event``, ``generate_dataset``; layers live in ``hvdtrack.events.detector``, the
modules tiling them in ``hvdtrack.events.modules``, helices in ``hvdtrack.events.propagation``.
"""

from __future__ import annotations

from hvdtrack.events.synthetic import SyntheticConfig, generate_dataset, generate_event
from hvdtrack.events.trackml import Event, find_events, read_event, write_event

__all__ = [
    "Event",
    "SyntheticConfig",
    "find_events",
    "generate_dataset",
    "generate_event",
    "read_event",
    "write_event",
]
