"""Graph-construction summary: graph sizes, construction efficiency and purity, mergeable across workers.

Public symbols: ``ConstructionReport``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import numpy as np

from hvdtrack.graphs.construction import HitGraph


@dataclasses.dataclass(frozen=True)
class ConstructionReport:
    """Sizes and truth figures of a set of hit graphs.

    efficiency = true edges kept / true segments (before the cuts); purity = true edges / edges.
    True segments that no layer pair of the adjacency table can form (a skipped layer, or a
    detector description that orders layers wrongly) are not in that denominator: they are
    counted apart, as ``num_lost_segments``, and ``efficiency_all_segments`` includes them, so an
    efficiency can never hide lost segments. Reports are built from per-graph counts, so workers
    can each report on their own graphs and the results ``merge`` into the report of all graphs.

    Attributes:
      num_graphs: number of graphs.
      num_nodes: total nodes; nodes_max: nodes of the largest graph.
      num_edges: total edges; edges_max: edges of the largest graph.
      num_true_segments: true consecutive segments before the cuts (efficiency denominator).
      num_true_edges: true edges kept after the cuts.
      num_lost_segments: true segments no layer pair can form; None when not counted.
    """

    num_graphs: int = 0
    num_nodes: int = 0
    nodes_max: int = 0
    num_edges: int = 0
    edges_max: int = 0
    num_true_segments: int = 0
    num_true_edges: int = 0
    num_lost_segments: int | None = None

    @classmethod
    def from_counts(
        cls,
        nodes: Sequence[int],
        edges: Sequence[int],
        true_edges: Sequence[int],
        true_segments: Sequence[int],
        lost_segments: Sequence[int] | None = None,
    ) -> ConstructionReport:
        """Builds a report from per-graph counts (sequences of equal length [G]);
        ``lost_segments`` None leaves the lost segments uncounted."""
        counts = [nodes, edges, true_edges, true_segments]
        if lost_segments is not None:
            counts.append(lost_segments)
        arrays = [np.asarray(v, dtype=np.int64).reshape(-1) for v in counts]
        if len({len(a) for a in arrays}) != 1:
            raise ValueError(
                "from_counts: nodes, edges, true_edges, true_segments (and lost_segments) must "
                f"have one entry per graph, got lengths {[len(a) for a in arrays]}"
            )
        nodes_a, edges_a, true_a, segments_a = arrays[:4]
        return cls(
            num_graphs=len(nodes_a),
            num_nodes=int(nodes_a.sum()),
            nodes_max=int(nodes_a.max(initial=0)),
            num_edges=int(edges_a.sum()),
            edges_max=int(edges_a.max(initial=0)),
            num_true_segments=int(segments_a.sum()),
            num_true_edges=int(true_a.sum()),
            num_lost_segments=None if lost_segments is None else int(arrays[4].sum()),
        )

    @classmethod
    def from_graphs(
        cls, graphs: Iterable[HitGraph], lost_segments: Sequence[int] | None = None
    ) -> ConstructionReport:
        """Builds a report from hit graphs and, when given, their lost segments (one count per
        graph, from ``build_hit_graphs_counting_lost``)."""
        graphs = list(graphs)
        return cls.from_counts(
            [g.num_nodes for g in graphs],
            [g.num_edges for g in graphs],
            [int(np.count_nonzero(g.labels > 0.5)) for g in graphs],
            [g.num_true_segments for g in graphs],
            lost_segments,
        )

    @classmethod
    def merge(cls, reports: Iterable[ConstructionReport]) -> ConstructionReport:
        """The report of the union of the graphs of several reports (e.g. one per worker); the
        lost segments stay uncounted unless every report counted them."""
        reports = list(reports)
        counted = bool(reports) and all(r.num_lost_segments is not None for r in reports)
        return cls(
            num_graphs=sum(r.num_graphs for r in reports),
            num_nodes=sum(r.num_nodes for r in reports),
            nodes_max=max((r.nodes_max for r in reports), default=0),
            num_edges=sum(r.num_edges for r in reports),
            edges_max=max((r.edges_max for r in reports), default=0),
            num_true_segments=sum(r.num_true_segments for r in reports),
            num_true_edges=sum(r.num_true_edges for r in reports),
            num_lost_segments=sum(r.num_lost_segments or 0 for r in reports) if counted else None,
        )

    @property
    def nodes_mean(self) -> float:
        return self.num_nodes / self.num_graphs if self.num_graphs else float("nan")

    @property
    def edges_mean(self) -> float:
        return self.num_edges / self.num_graphs if self.num_graphs else float("nan")

    @property
    def efficiency(self) -> float:
        """True edges kept / true segments; NaN when there are no true segments."""
        if not self.num_true_segments:
            return float("nan")
        return self.num_true_edges / self.num_true_segments

    @property
    def efficiency_all_segments(self) -> float:
        """True edges kept / (true segments + lost segments); NaN when the lost segments were
        not counted or there are no segments."""
        if self.num_lost_segments is None:
            return float("nan")
        total = self.num_true_segments + self.num_lost_segments
        return self.num_true_edges / total if total else float("nan")

    @property
    def purity(self) -> float:
        """True edges / edges; NaN when there are no edges."""
        return self.num_true_edges / self.num_edges if self.num_edges else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """Counts and derived figures as plain JSON-ready values (undefined ratios are None)."""
        result: dict[str, Any] = dataclasses.asdict(self)
        for name in ("nodes_mean", "edges_mean", "efficiency", "efficiency_all_segments", "purity"):
            value = getattr(self, name)
            result[name] = None if np.isnan(value) else float(value)
        return result

    def to_markdown(self) -> str:
        """A two-column Markdown table of the report."""

        def ratio(value: float) -> str:
            return "n/a" if np.isnan(value) else f"{value:.4f}"

        def mean(value: float) -> str:
            return "n/a" if np.isnan(value) else f"{value:,.1f}"

        lost = "not counted" if self.num_lost_segments is None else f"{self.num_lost_segments:,}"
        rows = [
            ("graphs", f"{self.num_graphs:,}"),
            ("nodes mean / max", f"{mean(self.nodes_mean)} / {self.nodes_max:,}"),
            ("edges mean / max", f"{mean(self.edges_mean)} / {self.edges_max:,}"),
            ("true segments (before cuts)", f"{self.num_true_segments:,}"),
            ("true edges kept", f"{self.num_true_edges:,}"),
            ("efficiency (true kept / true segments)", ratio(self.efficiency)),
            ("true segments no layer pair can form (lost)", lost),
            (
                "efficiency over all true segments (lost included)",
                ratio(self.efficiency_all_segments),
            ),
            ("purity (true edges / edges)", ratio(self.purity)),
        ]
        lines = ["| quantity | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in rows]
        return "\n".join(lines)
