"""Track building on tiny hand-made graphs: components, joined sections, submissions (the chain
builder: test_chains.py)."""

import numpy as np
import pytest

from hvdtrack.tracks.building import build_tracks, component_tracks, submission
from hvdtrack.tracks.graph import EventGraph, connected_components, join_sections


def test_connected_components():
    # 0-1-2, 3-4, 5 alone; edges given in both directions and out of order.
    labels = connected_components(6, np.array([2, 4, 0]), np.array([1, 3, 1]))
    assert labels.tolist() == [0, 0, 0, 1, 1, 2]
    # A long chain in reverse order needs several hooking rounds.
    chain = connected_components(8, np.arange(7)[::-1], np.arange(1, 8)[::-1])
    assert chain.tolist() == [0] * 8
    assert connected_components(3, np.array([], int), np.array([], int)).tolist() == [0, 1, 2]


def test_component_tracks_cut_low_scores_and_short_tracks():
    # Chain 0-1-2-3 with one weak link (1-2), chain 4-5-6.
    senders = np.array([0, 1, 2, 4, 5])
    receivers = np.array([1, 2, 3, 5, 6])
    scores = np.array([0.9, 0.2, 0.9, 0.8, 0.7])
    assert component_tracks(7, senders, receivers, scores, 0.5, min_hits=2).tolist() == [
        1, 1, 2, 2, 3, 3, 3,
    ]  # fmt: skip
    assert component_tracks(7, senders, receivers, scores, 0.5, min_hits=3).tolist() == [
        0, 0, 0, 0, 1, 1, 1,
    ]  # fmt: skip


def test_join_sections_shares_boundary_hits_and_keeps_an_edge_once():
    # Section 0 holds hits 10, 11, 12; section 1 holds 12, 13 and again the edge 11 -> 12.
    graph = join_sections(
        1000,
        hit_ids=[np.array([10, 11, 12]), np.array([12, 13, 11])],
        senders=[np.array([0, 1]), np.array([0, 2])],
        receivers=[np.array([1, 2]), np.array([1, 0])],
        scores=[np.array([0.9, 0.6]), np.array([0.8, 0.7])],
        labels=[np.array([1.0, 1.0]), np.array([1.0, 1.0])],
        xyz=[
            np.array([[30.0, 0, 0], [70, 0, 0], [110, 0, 0]]),
            np.array([[110.0, 0, 0], [170, 0, 0], [70, 0, 0]]),
        ],
    )
    assert graph.hit_id.tolist() == [10, 11, 12, 13]
    assert graph.xyz[:, 0].tolist() == [30, 70, 110, 170]
    assert list(zip(graph.senders.tolist(), graph.receivers.tolist())) == [(0, 1), (1, 2), (2, 3)]
    assert graph.scores.tolist() == pytest.approx([0.9, 0.7, 0.8])
    for method in ("chains", "components"):
        assert build_tracks(graph, 0.5, method, min_hits=3).tolist() == [1, 1, 1, 1]


def test_build_tracks_refuses_an_unknown_method():
    graph = EventGraph(1, np.zeros(0, np.int64), *(np.zeros(0),) * 4, np.zeros((0, 3)))
    with pytest.raises(ValueError, match="unknown track building method 'dbscan'"):
        build_tracks(graph, method="dbscan")


def test_submission_lists_every_hit():
    frame = submission(1000, np.array([3, 1, 2, 4]), np.array([1, 2, 3]), np.array([5, 5, 0]))
    assert frame.columns.tolist() == ["event_id", "hit_id", "track_id"]
    assert frame.values.tolist() == [[1000, 3, 0], [1000, 1, 5], [1000, 2, 5], [1000, 4, 0]]
