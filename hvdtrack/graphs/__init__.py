"""Hit graphs: build them from events (``construction``, with ``pairs`` and ``truth``), summarise
them (``report``) and compare synthetic events with real ones (``realism``).

Public symbols: ``GraphConfig``, ``HitGraph``, ``build_hit_graphs``, ``layer_adjacency``,
``ConstructionReport``.
"""

from __future__ import annotations

from hvdtrack.graphs.construction import GraphConfig, HitGraph, build_hit_graphs
from hvdtrack.graphs.pairs import layer_adjacency
from hvdtrack.graphs.report import ConstructionReport

__all__ = ["ConstructionReport", "GraphConfig", "HitGraph", "build_hit_graphs", "layer_adjacency"]
