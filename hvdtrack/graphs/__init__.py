"""Hit graphs: build them from events (``construction``) and summarise them (``report``).

Public symbols: ``GraphConfig``, ``HitGraph``, ``build_hit_graphs``, ``layer_adjacency``,
``ConstructionReport``.
"""

from __future__ import annotations

from hvdtrack.graphs.construction import GraphConfig, HitGraph, build_hit_graphs, layer_adjacency
from hvdtrack.graphs.report import ConstructionReport

__all__ = ["ConstructionReport", "GraphConfig", "HitGraph", "build_hit_graphs", "layer_adjacency"]
