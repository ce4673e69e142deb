"""Graph construction on hand-made events with written-out edges, and on synthetic events."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.events import detector
from hvdtrack.events.synthetic import SyntheticConfig, generate_event
from hvdtrack.events.trackml import Event, empty_frame
from hvdtrack.graphs.construction import (
    GraphConfig,
    build_hit_graphs,
    build_hit_graphs_counting_lost,
)
from hvdtrack.graphs.pairs import find_candidate_pairs, layer_adjacency, segment_cut_mask
from hvdtrack.graphs.report import ConstructionReport
from hvdtrack.graphs.truth import (
    count_lost_segments,
    count_true_segments,
    group_hits_along_particles,
    label_edges,
)

from .conftest import make_event

# Two particles from the origin through the first three pixel barrel layers (r = 32, 72, 116),
# plus a noise hit close to particle 1 on the second layer:
#   row 0: hit 1, layer 8:2, particle 1      row 3: hit 4, layer 8:4, particle 2
#   row 1: hit 2, layer 8:2, particle 2      row 4: hit 5, layer 8:4, noise (dphi 0.01 from hit 3)
#   row 2: hit 3, layer 8:4, particle 1      row 5: hit 6, layer 8:6, particle 1
THREE_LAYERS = [
    (1, 8, 2, 32.0, 0.0, 10.0, 1),
    (2, 8, 2, 32.0, 1.0, -5.0, 2),
    (3, 8, 4, 72.0, 0.0, 22.5, 1),
    (4, 8, 4, 72.0, 1.0, -11.25, 2),
    (5, 8, 4, 72.0, 0.01, 20.0, 0),
    (6, 8, 6, 116.0, 0.0, 36.25, 1),
]
PT = {1: 2.0, 2: 5.0}


def _edges(graph):
    return graph.senders.tolist(), graph.receivers.tolist(), graph.labels.tolist()


def test_hand_made_event_without_pt_cut():
    (graph,) = build_hit_graphs(make_event(THREE_LAYERS, PT), GraphConfig(pt_min=0.0))
    # 1->3 true, 1->5 fake (noise inside the window), 2->4 true, 3->6 true, 5->6 fake;
    # 2->5 is 0.99 rad away in phi.
    assert _edges(graph) == ([0, 0, 1, 2, 4], [2, 4, 3, 5, 5], [1.0, 0.0, 1.0, 1.0, 0.0])
    assert graph.hit_id.tolist() == [1, 2, 3, 4, 5, 6]
    assert graph.num_true_segments == 3
    assert (graph.num_nodes, graph.num_edges, graph.event_id, graph.section) == (6, 5, 1, 0)


def test_hand_made_event_with_default_pt_cut_drops_noise():
    (graph,) = build_hit_graphs(make_event(THREE_LAYERS, PT), GraphConfig())
    assert graph.hit_id.tolist() == [1, 2, 3, 4, 6]
    assert _edges(graph) == ([0, 1, 2], [2, 3, 4], [1.0, 1.0, 1.0])
    assert graph.num_true_segments == 3
    (none,) = build_hit_graphs(make_event(THREE_LAYERS, PT), GraphConfig(pt_min=10.0))
    assert (none.num_nodes, none.num_edges, none.num_true_segments) == (0, 0, 0)


def test_graph_arrays_have_the_contract_dtypes_and_features():
    cfg = GraphConfig(pt_min=0.0)
    (graph,) = build_hit_graphs(make_event(THREE_LAYERS, PT), cfg)
    assert graph.nodes.dtype == np.float32 and graph.nodes.shape == (6, 3)
    assert graph.edges.dtype == np.float32 and graph.edges.shape == (5, 4)
    assert graph.senders.dtype == np.int32 and graph.receivers.dtype == np.int32
    assert graph.labels.dtype == np.float32 and graph.hit_id.dtype == np.int64
    np.testing.assert_allclose(graph.nodes[0], [0.032, 0.0, 0.010], rtol=1e-6)
    np.testing.assert_allclose(graph.nodes[1], [0.032, 1.0 / math.pi, -0.005], rtol=1e-6)
    deta = math.asinh(22.5 / 72) - math.asinh(10 / 32)  # 0, same straight line
    np.testing.assert_allclose(graph.edges[0], [0.040, 0.0, 0.0125, deta], atol=1e-7)
    deta = math.asinh(20 / 72) - math.asinh(10 / 32)
    np.testing.assert_allclose(graph.edges[1], [0.040, 0.01 / math.pi, 0.010, deta], atol=1e-7)


def test_phi_window_wraps_around_pi():
    hits = [
        (1, 8, 2, 32.0, math.pi - 0.005, 0.0, 1),
        (2, 8, 4, 72.0, -math.pi + 0.005, 0.0, 1),
        (3, 8, 4, 72.0, 0.0, 0.0, 2),
        (4, 8, 2, 32.0, math.pi - 0.001, 0.0, 2),
    ]
    (graph,) = build_hit_graphs(make_event(hits, {1: 2.0, 2: 2.0}), GraphConfig())
    # Hits 1 and 4 (just below +pi) -> hit 2 (just above -pi): dphi wraps to +0.01 and +0.006.
    assert _edges(graph) == ([0, 3], [1, 1], [1.0, 0.0])
    np.testing.assert_allclose(graph.edges[:, 1] * math.pi, [0.01, 0.006], atol=1e-6)


def test_phi_slope_cut_rejects_a_steep_pair():
    # dphi = 0.03 over dr = 40: slope 0.00075 rad/mm
    hits = [(1, 8, 2, 32.0, 0.0, 0.0, 1), (2, 8, 4, 72.0, 0.03, 0.0, 1)]
    event = make_event(hits, {1: 2.0})
    (graph,) = build_hit_graphs(event, GraphConfig())
    assert graph.num_edges == 0 and graph.num_true_segments == 1
    (graph,) = build_hit_graphs(event, GraphConfig(phi_slope_max=0.0008))
    assert _edges(graph) == ([0], [1], [1.0])


def test_z0_cut_rejects_a_pair_from_outside_the_luminous_region():
    # z0 = z1 - r1 dz / dr = 0 - 32 * (-312.5 / 40) = 250 mm
    hits = [(1, 8, 2, 32.0, 0.0, 0.0, 1), (2, 8, 4, 72.0, 0.0, -312.5, 1)]
    event = make_event(hits, {1: 2.0})
    (graph,) = build_hit_graphs(event, GraphConfig())
    assert graph.num_edges == 0
    (graph,) = build_hit_graphs(event, GraphConfig(z0_max=251.0))
    assert _edges(graph) == ([0], [1], [1.0])
    (graph,) = build_hit_graphs(event, GraphConfig(z0_max=249.0))
    assert graph.num_edges == 0


def test_endcap_pairs_need_outward_dr_and_do_not_divide_by_zero():
    lam = 6.0  # a straight track at cot(theta) = 6 crosses z = 600 at r = 100, z = 700 at 116.67
    hits = [
        (1, 9, 2, 100.0, 0.5, 600.0, 1),
        (2, 9, 4, 700.0 / lam, 0.5, 700.0, 1),
        (3, 9, 4, 100.0, 0.5, 700.0, 2),  # dr = 0 from hit 1
        (4, 9, 4, 90.0, 0.5, 700.0, 2),  # dr < 0 from hit 1
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (graph,) = build_hit_graphs(
            make_event(hits, {1: 2.0, 2: 2.0}), GraphConfig(barrel_only=False)
        )
    assert _edges(graph) == ([0], [1], [1.0])


def test_negative_z_endcap_with_the_real_layer_numbering():
    # A straight track at cot(theta) = -6 from the origin through the three pixel disks nearest
    # z = 0 on the -z side: real TrackML numbers them volume 7 layers 14, 12, 10.
    hits = [
        (1, 8, 2, 32.0, 0.5, -192.0, 1),
        (2, 7, 14, 100.0, 0.5, -600.0, 1),
        (3, 7, 12, 700.0 / 6, 0.5, -700.0, 1),
        (4, 7, 10, 820.0 / 6, 0.5, -820.0, 1),
    ]
    event = make_event(hits, {1: 2.0})
    (graph,), lost = build_hit_graphs_counting_lost(event, GraphConfig(barrel_only=False))
    assert _edges(graph) == ([0, 1, 2], [1, 2, 3], [1.0, 1.0, 1.0])
    assert graph.num_true_segments == 3 and lost.tolist() == [0]


def test_segments_no_layer_pair_can_form_are_counted_as_lost():
    # The same track with the -z disks numbered away from z = 0 (the old, wrong assumption):
    # layers 7:2, 7:4, 7:6 are the disks at z = -1500, -1300, -1100, so no pair of consecutive
    # hits is in the adjacency table. The segments are not silently dropped: all 3 are lost.
    hits = [
        (1, 8, 2, 32.0, 0.5, -192.0, 1),
        (2, 7, 2, 100.0, 0.5, -600.0, 1),
        (3, 7, 4, 700.0 / 6, 0.5, -700.0, 1),
        (4, 7, 6, 820.0 / 6, 0.5, -820.0, 1),
    ]
    event = make_event(hits, {1: 2.0})
    (graph,), lost = build_hit_graphs_counting_lost(event, GraphConfig(barrel_only=False))
    assert (graph.num_edges, graph.num_true_segments, lost.tolist()) == (0, 0, [3])
    report = ConstructionReport.from_graphs([graph], lost)
    assert math.isnan(report.efficiency) and report.efficiency_all_segments == 0.0


def test_a_skipped_barrel_layer_is_a_lost_segment():
    # Particle 1 leaves no hit on layer 8:4; particle 2 has two hits on 8:4 (a double hit):
    # per hit, segments formable by a layer pair and segments lost.
    particle_id = np.array([1, 1, 2, 2, 2, 2])
    layer = np.array([0, 2, 0, 1, 1, 2])
    distance = np.array([32.0, 116.0, 32.0, 72.0, 72.5, 116.0])
    group = group_hits_along_particles(particle_id, layer, distance)
    adjacency = layer_adjacency(True)
    assert count_true_segments(particle_id, layer, group, adjacency).tolist() == [0, 0, 2, 1, 1, 0]
    assert count_lost_segments(particle_id, layer, group, adjacency).tolist() == [1, 0, 0, 0, 0, 0]


def test_barrel_only_ignores_endcap_hits():
    hits = THREE_LAYERS + [(7, 9, 2, 100.0, 0.0, 600.0, 1)]
    (graph,) = build_hit_graphs(make_event(hits, PT), GraphConfig())
    assert 7 not in graph.hit_id.tolist()


def test_sections_keep_a_boundary_edge_exactly_once():
    # Particle 1 crosses phi = 0, the boundary of the two phi sections; particle 2 stays in
    # section 1. Both hits of particle 1 are nodes of section 0, the outer one also of section 1.
    hits = [
        (1, 8, 2, 32.0, -0.002, 0.0, 1),
        (2, 8, 4, 72.0, 0.003, 0.0, 1),
        (3, 8, 2, 32.0, 1.0, 0.0, 2),
        (4, 8, 4, 72.0, 1.0, 0.0, 2),
    ]
    cfg = GraphConfig(n_phi_sections=2)
    low, high = build_hit_graphs(make_event(hits, {1: 2.0, 2: 2.0}), cfg)
    assert (low.section, high.section) == (0, 1)
    assert low.hit_id.tolist() == [1, 2] and _edges(low) == ([0], [1], [1.0])
    assert high.hit_id.tolist() == [2, 3, 4] and _edges(high) == ([1], [2], [1.0])
    assert (low.num_true_segments, high.num_true_segments) == (1, 1)


def test_eta_sections_split_by_the_inner_hit():
    hits = [
        (1, 8, 2, 32.0, 0.0, -1.0, 1),  # eta < 0
        (2, 8, 4, 72.0, 0.0, 1.0, 1),  # eta > 0, outer hit of particle 1
        (3, 8, 2, 32.0, 1.0, 5.0, 2),
        (4, 8, 4, 72.0, 1.0, 11.25, 2),
    ]
    graphs = build_hit_graphs(make_event(hits, {1: 2.0, 2: 2.0}), GraphConfig(n_eta_sections=2))
    assert [g.hit_id.tolist() for g in graphs] == [[1, 2], [2, 3, 4]]
    assert [g.num_edges for g in graphs] == [1, 1]


def test_double_hits_on_a_layer_both_connect_to_the_next_crossing():
    particle_id = np.array([7, 7, 7, 7, 0, 9])
    layer = np.array([0, 1, 1, 2, 1, 0])
    distance = np.array([30.0, 70.0, 71.0, 120.0, 0.0, 30.0])
    group = group_hits_along_particles(particle_id, layer, distance)
    assert group.tolist() == [0, 1, 1, 2, -1, 3]
    segments = count_true_segments(particle_id, layer, group, layer_adjacency(True))
    assert segments.tolist() == [2, 1, 1, 0, 0, 0]
    senders = np.array([0, 0, 1, 2, 4, 5, 0])
    receivers = np.array([1, 2, 3, 3, 3, 1, 3])
    assert label_edges(particle_id, group, senders, receivers).tolist() == [1, 1, 1, 1, 0, 0, 0]


def test_a_segment_across_a_missing_layer_is_not_a_true_segment():
    particle_id = np.array([1, 1, 1])
    layer = np.array([0, 2, 3])  # layer 1 missed
    group = group_hits_along_particles(particle_id, layer, np.array([1.0, 2.0, 3.0]))
    assert count_true_segments(particle_id, layer, group, layer_adjacency(True)).tolist() == [
        0,
        1,
        0,
    ]


def _brute_force_segments(layer, r, phi, z, adjacency, phi_slope_max, z0_max):
    allowed = np.zeros((detector.NUM_LAYERS, detector.NUM_LAYERS), dtype=bool)
    allowed[adjacency[:, 0], adjacency[:, 1]] = True
    i, j = np.meshgrid(np.arange(len(r)), np.arange(len(r)), indexing="ij")
    i, j = i.ravel(), j.ravel()
    dr = r[j] - r[i]
    dphi = np.mod(phi[j] - phi[i] + np.pi, 2 * np.pi) - np.pi
    ok = allowed[layer[i], layer[j]] & (dr > 0) & (np.abs(dphi) <= phi_slope_max * dr)
    ok &= np.abs(z[i] * dr - r[i] * (z[j] - z[i])) <= z0_max * dr
    return set(zip(i[ok].tolist(), j[ok].tolist()))


@pytest.mark.parametrize("phi_slope_max", [0.0006, 0.01, 1.0])
def test_candidate_search_finds_every_pair_passing_the_cuts(phi_slope_max):
    # Random hits on pixel barrel layers and +z disks, the disks staggered by +-5 mm in z as
    # real end-cap modules are; the binned search must miss nothing a brute force keeps.
    rng = np.random.default_rng(0)
    n = 700
    layer = rng.choice([0, 1, 2, 3, 17, 18, 19], n)
    barrel = detector.LAYER_IS_BARREL[layer]
    r = np.where(barrel, detector.LAYER_R_MIN[layer], rng.uniform(25, 200, n))
    z = np.where(
        barrel, rng.uniform(-500, 500, n), detector.LAYER_Z_MIN[layer] + rng.uniform(-5, 5, n)
    )
    phi = rng.uniform(-np.pi, np.pi, n)
    adjacency = layer_adjacency(False)
    senders, receivers = find_candidate_pairs(layer, r, phi, z, adjacency, phi_slope_max, 200.0)
    candidates = list(zip(senders.tolist(), receivers.tolist()))
    assert len(set(candidates)) == len(candidates)  # no pair twice
    keep = segment_cut_mask(r, phi, z, senders, receivers, phi_slope_max, 200.0)
    passed = set(zip(senders[keep].tolist(), receivers[keep].tolist()))
    expected = _brute_force_segments(layer, r, phi, z, adjacency, phi_slope_max, 200.0)
    assert passed == expected and len(expected) > 20


def test_layer_adjacency_tables():
    assert layer_adjacency(True).tolist() == [[i, i + 1] for i in range(9)]
    pairs = layer_adjacency(False)
    named = {
        (
            (detector.LAYERS[a].volume_id, detector.LAYERS[a].layer_id),
            (detector.LAYERS[b].volume_id, detector.LAYERS[b].layer_id),
        )
        for a, b in pairs
    }
    expected = [
        ((8, 8), (13, 2)),  # pixel barrel -> strip barrel
        ((13, 8), (17, 2)),
        ((8, 2), (9, 2)),  # barrel -> first disk, both sides
        ((8, 2), (7, 14)),  # on the -z side layer ids run towards z = 0
        ((9, 2), (9, 4)),  # disk -> next disk
        ((7, 14), (7, 12)),
        ((9, 14), (14, 6)),  # pixel end-cap -> strip end-cap
        ((7, 2), (12, 2)),
        ((12, 12), (12, 10)),
        ((18, 10), (18, 12)),
    ]
    assert all(pair in named for pair in expected)
    assert set(map(tuple, layer_adjacency(True).tolist())) <= set(map(tuple, pairs.tolist()))
    minus, plus = {7, 12, 16}, {9, 14, 18}
    for (va, _), (vb, _) in named:
        assert not (va in minus and vb in plus) and not (va in plus and vb in minus)


def test_truth_is_required():
    event = make_event(THREE_LAYERS, PT)
    no_truth = Event(event.event_id, event.hits, empty_frame("truth"), event.particles)
    with pytest.raises(DataError, match="event 1: no truth"):
        build_hit_graphs(no_truth, GraphConfig())
    partial = Event(event.event_id, event.hits, event.truth.iloc[:-1], event.particles)
    with pytest.raises(DataError, match="event 1: hit_id 6 has no truth row"):
        build_hit_graphs(partial, GraphConfig())


def test_without_truth_pt_min_0_takes_every_hit_unlabelled():
    # Real data: the graph with truth and no pT cut, every edge labelled fake.
    event = make_event(THREE_LAYERS, PT)
    no_truth = Event(event.event_id, event.hits, empty_frame("truth"), event.particles)
    (graph,) = build_hit_graphs(no_truth, GraphConfig(pt_min=0))
    (truth,) = build_hit_graphs(event, GraphConfig(pt_min=0))
    assert graph.hit_id.tolist() == truth.hit_id.tolist() == [1, 2, 3, 4, 5, 6]  # noise 5 too
    np.testing.assert_array_equal(graph.nodes, truth.nodes)
    np.testing.assert_array_equal(graph.edges, truth.edges)
    assert _edges(graph)[:2] == _edges(truth)[:2]
    assert graph.labels.tolist() == [0.0] * graph.num_edges and truth.labels.sum() > 0


def test_config_refuses_bad_values():
    with pytest.raises(ConfigError, match="'n_phi_sections' must be >= 1"):
        GraphConfig(n_phi_sections=0)
    with pytest.raises(ConfigError, match="'pt_min' must be >= 0"):
        GraphConfig(pt_min=-1.0)


def test_a_graph_of_more_than_max_edges_is_refused_naming_event_section_and_key():
    event = make_event(THREE_LAYERS, PT)
    (graph,) = build_hit_graphs(event, GraphConfig(pt_min=0.0, max_edges=5))  # exactly 5
    assert graph.num_edges == 5
    with pytest.raises(
        DataError, match=r"^event 1, section 0: 5 edges, more than data.graph.max_edges=4 - "
    ):
        build_hit_graphs(event, GraphConfig(pt_min=0.0, max_edges=4))
    # More candidates than 4 per allowed edge: refused before they are allocated.
    with pytest.raises(
        DataError,
        match=r"^event 1: more than 4 candidate hit pairs before the cuts \(4 per edge "
        r"data.graph.max_edges=1 allows in each of 1 sections\) - ",
    ):
        build_hit_graphs(event, GraphConfig(pt_min=0.0, max_edges=1))
    with pytest.raises(ConfigError, match="'max_edges' must be >= 1"):
        GraphConfig(max_edges=0)


def test_sections_partition_the_edges_of_a_synthetic_event(small_event):
    cfg = GraphConfig(pt_min=0.0, barrel_only=False)
    (whole,) = build_hit_graphs(small_event, cfg)
    sectioned, lost = build_hit_graphs_counting_lost(
        small_event, GraphConfig(pt_min=0.0, barrel_only=False, n_phi_sections=8, n_eta_sections=2)
    )
    _, whole_lost = build_hit_graphs_counting_lost(small_event, cfg)
    assert lost.shape == (16,) and lost.sum() == whole_lost.sum()
    assert len(sectioned) == 16 and [g.section for g in sectioned] == list(range(16))

    def pairs(graph):
        return list(
            zip(graph.hit_id[graph.senders].tolist(), graph.hit_id[graph.receivers].tolist())
        )

    all_pairs = [p for g in sectioned for p in pairs(g)]
    assert len(all_pairs) == len(set(all_pairs)) == whole.num_edges
    assert set(all_pairs) == set(pairs(whole))
    assert sum(g.num_true_segments for g in sectioned) == whole.num_true_segments
    assert sum(g.labels.sum() for g in sectioned) == whole.labels.sum()


@pytest.mark.parametrize("barrel_only", [True, False])
def test_construction_efficiency_on_synthetic_events(barrel_only):
    # The key physics check: pT > 1 GeV, default cuts, >= 99% of true segments kept in the
    # barrel, 98% in the whole detector (secondaries from interactions fail the z0 cut and
    # staggered end-cap modules shift dr: 0.9868 measured on these events).
    cfg = SyntheticConfig(num_particles=1000)
    graphs = [
        g
        for event_id in (1, 2)
        for g in build_hit_graphs(
            generate_event(cfg, event_id, seed=21), GraphConfig(barrel_only=barrel_only)
        )
    ]
    report = ConstructionReport.from_graphs(graphs)
    assert report.num_true_segments > 500
    assert report.efficiency >= (0.99 if barrel_only else 0.98)
    assert report.purity > 0.2
