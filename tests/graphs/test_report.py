"""The construction report: counts, ratios, merging across workers, Markdown and dict forms."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hvdtrack.graphs.construction import HitGraph
from hvdtrack.graphs.report import ConstructionReport


def _graph(num_nodes, labels, num_true_segments):
    labels = np.asarray(labels, dtype=np.float32)
    return HitGraph(
        nodes=np.zeros((num_nodes, 3), np.float32),
        edges=np.zeros((len(labels), 4), np.float32),
        senders=np.zeros(len(labels), np.int32),
        receivers=np.zeros(len(labels), np.int32),
        labels=labels,
        hit_id=np.arange(num_nodes, dtype=np.int64),
        event_id=1,
        section=0,
        num_true_segments=num_true_segments,
    )


def test_from_counts():
    report = ConstructionReport.from_counts([10, 30], [20, 60], [8, 16], [10, 15])
    assert (report.num_graphs, report.num_nodes, report.nodes_max) == (2, 40, 30)
    assert (report.num_edges, report.edges_max) == (80, 60)
    assert (report.num_true_segments, report.num_true_edges) == (25, 24)
    assert (report.nodes_mean, report.edges_mean) == (20.0, 40.0)
    assert report.efficiency == 24 / 25 and report.purity == 24 / 80


def test_from_graphs_counts_true_labels():
    graphs = [_graph(4, [1, 0, 1], 3), _graph(2, [0], 0)]
    assert ConstructionReport.from_graphs(graphs) == ConstructionReport.from_counts(
        [4, 2], [3, 1], [2, 0], [3, 0]
    )


def test_merge_equals_report_of_all_graphs():
    first = ConstructionReport.from_counts([10, 30], [20, 60], [8, 16], [10, 15])
    second = ConstructionReport.from_counts([50], [5], [5], [5])
    assert ConstructionReport.merge([first, second]) == ConstructionReport.from_counts(
        [10, 30, 50], [20, 60, 5], [8, 16, 5], [10, 15, 5]
    )
    assert ConstructionReport.merge([]) == ConstructionReport()


def test_empty_report_has_undefined_ratios():
    report = ConstructionReport.from_counts([], [], [], [])
    assert math.isnan(report.efficiency) and math.isnan(report.purity)
    as_dict = report.to_dict()
    assert as_dict["efficiency"] is None and as_dict["nodes_mean"] is None
    json.dumps(as_dict)
    assert "| efficiency (true kept / true segments) | n/a |" in report.to_markdown()


def test_to_dict_and_markdown():
    report = ConstructionReport.from_counts([1000, 3000], [4000, 8000], [3000, 2000], [5000, 1])
    assert report.to_dict() == {
        "num_graphs": 2,
        "num_nodes": 4000,
        "nodes_max": 3000,
        "num_edges": 12000,
        "edges_max": 8000,
        "num_true_segments": 5001,
        "num_true_edges": 5000,
        "nodes_mean": 2000.0,
        "edges_mean": 6000.0,
        "num_lost_segments": None,
        "efficiency": 5000 / 5001,
        "efficiency_all_segments": None,
        "purity": 5000 / 12000,
    }
    assert report.to_markdown().splitlines() == [
        "| quantity | value |",
        "|---|---|",
        "| graphs | 2 |",
        "| nodes mean / max | 2,000.0 / 3,000 |",
        "| edges mean / max | 6,000.0 / 8,000 |",
        "| true segments (before cuts) | 5,001 |",
        "| true edges kept | 5,000 |",
        "| efficiency (true kept / true segments) | 0.9998 |",
        "| true segments no layer pair can form (lost) | not counted |",
        "| efficiency over all true segments (lost included) | n/a |",
        "| purity (true edges / edges) | 0.4167 |",
    ]


def test_lost_segments_lower_the_efficiency_over_all_segments():
    report = ConstructionReport.from_counts([10, 30], [20, 60], [8, 16], [10, 15], [5, 0])
    assert report.num_lost_segments == 5
    assert report.efficiency == 24 / 25
    assert report.efficiency_all_segments == 24 / 30
    assert report.to_dict()["efficiency_all_segments"] == 24 / 30
    lines = report.to_markdown().splitlines()
    assert "| true segments no layer pair can form (lost) | 5 |" in lines
    assert "| efficiency over all true segments (lost included) | 0.8000 |" in lines


def test_merge_counts_lost_segments_only_when_every_report_did():
    counted = ConstructionReport.from_counts([1], [1], [1], [2], [3])
    also = ConstructionReport.from_counts([1], [1], [1], [2], [1])
    uncounted = ConstructionReport.from_counts([1], [1], [1], [2])
    assert ConstructionReport.merge([counted, also]).num_lost_segments == 4
    assert ConstructionReport.merge([counted, uncounted]).num_lost_segments is None


def test_from_counts_refuses_a_lost_count_per_graph_missing():
    with pytest.raises(ValueError, match=r"one entry per graph, got lengths \[1, 1, 1, 1, 2\]"):
        ConstructionReport.from_counts([1], [1], [1], [1], [0, 0])
