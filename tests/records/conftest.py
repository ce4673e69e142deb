"""Fixtures for the records tests: hand-made and random HitGraphs."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrack.graphs.construction import HitGraph


def random_graph(
    rng: np.random.Generator, num_nodes: int, num_edges: int, event_id: int = 1000, section: int = 0
) -> HitGraph:
    """A HitGraph with random features, valid indices and about 30% true edges."""
    return HitGraph(
        nodes=rng.normal(size=(num_nodes, 3)).astype(np.float32),
        edges=rng.normal(size=(num_edges, 4)).astype(np.float32),
        senders=rng.integers(0, num_nodes, num_edges).astype(np.int32),
        receivers=rng.integers(0, num_nodes, num_edges).astype(np.int32),
        labels=(rng.random(num_edges) < 0.3).astype(np.float32),
        hit_id=(event_id * 100_000 + np.arange(num_nodes)).astype(np.int64),
        event_id=event_id,
        section=section,
        num_true_segments=int(num_edges // 3),
    )


@pytest.fixture(scope="session")
def make_graph():
    """``make_graph(rng, num_nodes, num_edges, event_id, section) -> HitGraph``."""
    return random_graph


def assert_graphs_equal(actual: HitGraph, expected: HitGraph) -> None:
    for name in ("nodes", "edges", "senders", "receivers", "labels", "hit_id"):
        a, e = getattr(actual, name), getattr(expected, name)
        assert a.dtype == e.dtype, name
        np.testing.assert_array_equal(a, e, err_msg=name)
    for name in ("event_id", "section", "num_true_segments"):
        assert getattr(actual, name) == getattr(expected, name), name


@pytest.fixture(scope="session")
def graphs_equal():
    """``graphs_equal(actual, expected)`` asserts every HitGraph field is identical."""
    return assert_graphs_equal
