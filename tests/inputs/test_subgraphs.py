"""Subgraph mini-batches: k-hop neighbourhoods of seed edges, the loss on seeds only, the plan
(disjoint seeds over workers, reproducible) and the pipeline that samples them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.graphs.construction import HitGraph
from hvdtrack.inputs.pipeline import eval_dataset, plan_train_epoch, train_dataset
from hvdtrack.inputs.subgraphs import (
    SubgraphConfig,
    SubgraphSampling,
    ignored_label,
    plan_subgraph_epoch,
    sample_subgraph,
    unit_seed_edges,
)
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.config import ModelConfig
from hvdtrack.model.loss import weighted_bce_terms
from hvdtrack.records import RecordsConfig, open_dataset, write_dataset

# A hand-made graph of 8 nodes:  0 -e0-> 1 -e1-> 2 -e2-> 3 -e3-> 4 -e6-> 7
#                                         ^e4                          ^e7
#                                         5 <-e5- 6 ------------------'
SENDERS = [0, 1, 2, 3, 5, 6, 4, 6]
RECEIVERS = [1, 2, 3, 4, 1, 5, 7, 7]


def sampled(seeds, hops, cap=None, key=(0, 0)):
    nodes, edges, is_seed = sample_subgraph(
        SENDERS, RECEIVERS, 8, seeds, hops, cap, tf.constant(key, tf.int64)
    )
    return nodes.numpy().tolist(), edges.numpy().tolist(), is_seed.numpy().tolist()


@pytest.mark.parametrize(
    "seeds, hops, nodes, edges",
    [
        ([1], 1, [1, 2], [1]),
        ([1], 2, [0, 1, 2, 3, 5], [0, 1, 2, 4]),
        ([1], 3, [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5]),
        ([0, 7], 2, [0, 1, 2, 4, 5, 6, 7], [0, 1, 4, 5, 6, 7]),
        ([1], 5, list(range(8)), list(range(8))),
    ],
    ids=["1-hop", "2-hops", "3-hops", "two-seeds", "whole-graph"],
)
def test_subgraph_holds_exactly_the_k_hop_neighbourhood(seeds, hops, nodes, edges):
    got_nodes, got_edges, is_seed = sampled(seeds, hops)
    assert got_nodes == nodes
    assert got_edges == edges
    assert is_seed == [e in seeds for e in edges]


def test_cap_per_hop_keeps_a_reproducible_subset():
    full_nodes, _, _ = sampled([1], 3)
    for key in [(0, 0), (0, 1), (5, 3)]:
        nodes, edges, is_seed = sampled([1], 3, cap=1, key=key)
        assert set(nodes) <= set(full_nodes) and {1, 2} <= set(nodes)
        assert len(nodes) <= 2 + 2 * 1  # endpoints + one new node per hop
        assert sum(is_seed) == 1 and all(
            SENDERS[e] in nodes and RECEIVERS[e] in nodes for e in edges
        )
        assert sampled([1], 3, cap=1, key=key) == (nodes, edges, is_seed)
    assert sampled([1], 3, cap=10) == sampled([1], 3)  # a cap above the hop's size changes nothing


def random_graph(rng, num_nodes, num_edges):
    return (
        rng.normal(size=(num_nodes, 3)).astype(np.float32),
        rng.normal(size=(num_edges, 4)).astype(np.float32),
        rng.integers(0, num_nodes, num_edges).astype(np.int32),
        rng.integers(0, num_nodes, num_edges).astype(np.int32),
    )


def graphs_tuple(nodes, edges, senders, receivers):
    from graph_nets.graphs import GraphsTuple

    return GraphsTuple(
        nodes=tf.constant(nodes),
        edges=tf.constant(edges),
        senders=tf.constant(senders),
        receivers=tf.constant(receivers),
        globals=tf.zeros([1, 1]),
        n_node=tf.constant([len(nodes)], tf.int32),
        n_edge=tf.constant([len(edges)], tf.int32),
    )


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_seed_logits_on_the_subgraph_equal_whole_graph_logits(steps):
    rng = np.random.default_rng(3)
    nodes, edges, senders, receivers = random_graph(rng, 60, 90)
    size = 8
    model = SegmentClassifier(
        ModelConfig(
            node_encoder=(size,),
            edge_encoder=(size,),
            edge_update=(size,),
            node_update=(size,),
            output_head=(size,),
            num_message_passing_steps=steps,
        )
    )
    whole = model(graphs_tuple(nodes, edges, senders, receivers))
    seeds = np.array([3, 17, 40], np.int32)
    node_ids, edge_ids, is_seed = (
        t.numpy() for t in sample_subgraph(senders, receivers, 60, seeds, hops=steps)
    )
    assert len(edge_ids) < 90  # a true subgraph, not the whole graph
    position = np.full(60, -1)
    position[node_ids] = np.arange(len(node_ids))
    sub = model(
        graphs_tuple(
            nodes[node_ids],
            edges[edge_ids],
            position[senders[edge_ids]].astype(np.int32),
            position[receivers[edge_ids]].astype(np.int32),
        )
    )
    assert sorted(edge_ids[is_seed]) == sorted(seeds)
    for on_sub, on_whole in zip(sub, whole):
        np.testing.assert_allclose(
            on_sub.numpy()[is_seed], on_whole.numpy()[edge_ids[is_seed]], rtol=1e-5, atol=1e-6
        )
    if steps > 1:  # one hop fewer than the model's steps is not enough
        _, short_ids, short_seed = (
            t.numpy() for t in sample_subgraph(senders, receivers, 60, seeds, hops=steps - 1)
        )
        short = model(graphs_tuple(*_subgraph_arrays(nodes, edges, senders, receivers, short_ids)))
        assert not np.allclose(
            short[-1].numpy()[short_seed], whole[-1].numpy()[short_ids[short_seed]]
        )


def _subgraph_arrays(nodes, edges, senders, receivers, edge_ids):
    node_ids = np.unique(np.concatenate([senders[edge_ids], receivers[edge_ids]]))
    position = np.full(len(nodes), -1)
    position[node_ids] = np.arange(len(node_ids))
    return (
        nodes[node_ids],
        edges[edge_ids],
        position[senders[edge_ids]].astype(np.int32),
        position[receivers[edge_ids]].astype(np.int32),
    )


@pytest.mark.parametrize("true_weight, fake_weight", [(2.0, 1.0), (3.0, 1.0), (1.0, 2.0)])
def test_loss_counts_only_seed_edges(true_weight, fake_weight):
    labels = tf.constant([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    is_seed = tf.constant([True, True, False, False, True, False])
    logits = tf.Variable([0.3, -1.2, 2.0, 0.7, -0.1, 1.5])
    masked = tf.where(is_seed, labels, ignored_label(true_weight, fake_weight))
    with tf.GradientTape() as tape:
        loss_sum, weight_sum = weighted_bce_terms([logits], masked, true_weight, fake_weight)
    grad = tape.gradient(loss_sum, logits).numpy()
    seed_loss, seed_weight = weighted_bce_terms(
        [tf.boolean_mask(logits, is_seed)],
        tf.boolean_mask(labels, is_seed),
        true_weight,
        fake_weight,
    )
    assert float(weight_sum) == float(seed_weight) == 2 * fake_weight + true_weight
    assert float(loss_sum) == pytest.approx(float(seed_loss), rel=1e-7)
    assert grad[~is_seed.numpy()].tolist() == [0.0, 0.0, 0.0]
    assert np.all(grad[is_seed.numpy()] != 0)


def test_equal_class_weights_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="'train.true_weight'"):
        ignored_label(1.0, 1.0)


@pytest.mark.parametrize(
    "key, value",
    [
        ("seed_edges", 0),
        ("hops", 0),
        ("max_nodes_per_hop", -1),
        ("enabled", "yes"),
        ("seed_order", "nearest"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        SubgraphConfig(**{key: value})


def test_settings_resolve_hops_from_the_model():
    assert SubgraphConfig().sampling(4, 2.0, 1.0) is None
    on = SubgraphConfig(enabled=True, seed_edges=5)
    assert on.sampling(4, 2.0, 1.0) == SubgraphSampling(5, 4, None, -1.0)
    assert SubgraphConfig(enabled=True, hops=2).sampling(4, 3.0, 1.0).hops == 2


SAMPLING = SubgraphSampling(seed_edges=4, hops=2, max_nodes_per_hop=None, ignored_label=-1.0)


def test_plan_cuts_graphs_into_units_and_balances_seed_edges():
    plan = plan_subgraph_epoch(np.array([9, 0, 4, 3]), 2, 1, seed=1, epoch=0, sampling=SAMPLING)
    # 9 edges -> 3 units of 3, 0 -> none, 4 -> 1 unit, 3 -> 1 unit.
    assert plan.unit_graph.tolist() == [0, 0, 0, 2, 3]
    assert plan.unit_index.tolist() == [0, 1, 2, 0, 0]
    assert plan.unit_count.tolist() == [3, 3, 3, 1, 1]
    assert plan.num_graphs == 5 and plan.num_steps == 2 and plan.num_split_graphs == 4
    seeds = np.array([3, 3, 3, 4, 3])
    np.testing.assert_array_equal(plan.edges, seeds[plan.graph_ids[:, :, 0]].T)
    with pytest.raises(DataError, match="lower train.subgraphs.seed_edges"):
        plan_subgraph_epoch(np.array([3, 2]), 2, 2, seed=1, epoch=0, sampling=SAMPLING)


def test_units_of_a_graph_partition_its_edges_reproducibly():
    parts = [unit_seed_edges(10, 7, 2, 5, i, 3).numpy() for i in range(3)]
    assert [len(p) for p in parts] == [3, 3, 4]
    assert sorted(np.concatenate(parts).tolist()) == list(range(10))
    again = [unit_seed_edges(10, 7, 2, 5, i, 3).numpy() for i in range(3)]
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other_epoch = np.concatenate([unit_seed_edges(10, 7, 3, 5, i, 3).numpy() for i in range(3)])
    assert not np.array_equal(np.concatenate(parts), other_epoch)


def test_local_units_are_azimuth_wedges_that_move_every_epoch():
    rng = np.random.default_rng(2)
    phi = rng.permutation(np.linspace(-0.95, 0.95, 12))  # sender phi / pi of 12 edges
    rank = np.argsort(np.argsort(phi))  # position of each edge in azimuth order
    firsts = set()
    for epoch in range(4):
        parts = [unit_seed_edges(12, 1, epoch, 0, i, 3, phi).numpy() for i in range(3)]
        assert sorted(np.concatenate(parts).tolist()) == list(range(12))
        for part in parts:
            # 4 consecutive edges in azimuth, around the circle.
            offsets = sorted((rank[part] - rank[part[0]]) % 12)
            assert offsets == [0, 1, 2, 3]
        firsts.add(int(rank[parts[0][0]]))
    assert len(firsts) > 1  # the cut points move from epoch to epoch


# ------------------------------------------------------------------------ the pipeline
@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(5)

    def graph(event, section, num_nodes, num_edges):
        nodes, edges, senders, receivers = random_graph(rng, num_nodes, num_edges)
        return HitGraph(
            nodes=nodes,
            edges=edges,
            senders=senders,
            receivers=receivers,
            labels=(rng.random(num_edges) < 0.3).astype(np.float32),
            hit_id=np.arange(num_nodes, dtype=np.int64) + 1000 * event,
            event_id=event,
            section=section,
            num_true_segments=0,
        )

    graphs = {
        "train": [graph(1, s, 20 + 3 * s, 15 + 4 * s) for s in range(5)],
        "val": [graph(2, s, 12, 14) for s in range(3)],
    }
    path = tmp_path_factory.mktemp("subgraphs")
    write_dataset(graphs, path, RecordsConfig(graphs_per_shard=2))
    manifest = open_dataset(path)
    table = manifest.split_table("train")
    by_id = {
        i: next(g for g in graphs["train"] if g.section == table.section[i])
        for i in range(table.num_graphs)
    }
    return path, manifest, by_id


def expected_subgraph(graph: HitGraph, plan, unit):
    g, i, n = (int(a[unit]) for a in (plan.unit_graph, plan.unit_index, plan.unit_count))
    phi = graph.nodes[graph.senders, 1] if plan.sampling.seed_order == "local" else None
    seeds = unit_seed_edges(graph.num_edges, plan.seed, plan.epoch, g, i, n, phi)
    node_ids, edge_ids, is_seed = (
        t.numpy()
        for t in sample_subgraph(graph.senders, graph.receivers, graph.num_nodes, seeds, 2)
    )
    position = np.full(graph.num_nodes, -1, np.int32)
    position[node_ids] = np.arange(len(node_ids))
    labels = np.where(is_seed, graph.labels[edge_ids], plan.sampling.ignored_label)
    return {
        "nodes": graph.nodes[node_ids],
        "edges": graph.edges[edge_ids],
        "senders": position[graph.senders[edge_ids]],
        "receivers": position[graph.receivers[edge_ids]],
        "labels": labels.astype(np.float32),
    }, {(g, int(e)) for e in seeds.numpy()}


def test_pipeline_batches_hold_the_planned_subgraphs_and_workers_draw_disjoint_seeds(dataset):
    path, manifest, by_id = dataset
    sampling = SubgraphConfig(enabled=True, seed_edges=6).sampling(2, 2.0, 1.0)
    plan = plan_train_epoch(manifest, 2, 2, seed=3, epoch=1, subgraphs=sampling)
    seen = []
    for worker in range(2):
        batches = list(train_dataset(path, manifest, plan, worker))
        assert len(batches) == plan.num_steps >= 2
        mine = set()
        for step, (graphs, labels) in enumerate(batches):
            parts = [
                expected_subgraph(by_id[int(plan.unit_graph[u])], plan, u)
                for u in plan.graph_ids[worker, step]
            ]
            assert graphs.n_node.numpy().tolist() == [len(p["nodes"]) for p, _ in parts]
            assert graphs.n_edge.numpy().tolist() == [len(p["edges"]) for p, _ in parts]
            offsets = np.cumsum([0] + [len(p["nodes"]) for p, _ in parts])[:-1]
            for name in ("nodes", "edges"):
                np.testing.assert_array_equal(
                    getattr(graphs, name).numpy(), np.concatenate([p[name] for p, _ in parts])
                )
            for name in ("senders", "receivers"):
                np.testing.assert_array_equal(
                    getattr(graphs, name).numpy(),
                    np.concatenate([p[name] + o for (p, _), o in zip(parts, offsets)]),
                )
            np.testing.assert_array_equal(
                labels.numpy(), np.concatenate([p["labels"] for p, _ in parts])
            )
            # The loss sees exactly the planned seed edges.
            assert int((labels.numpy() != -1.0).sum()) == int(plan.edges[step, worker])
            for _, seeds in parts:
                assert not seeds & mine
                mine |= seeds
        seen.append(mine)
    assert not seen[0] & seen[1]  # disjoint seeds over the workers
    trained = plan.graph_ids.reshape(-1)
    assert (
        len(seen[0] | seen[1])
        == int(plan.edges.sum())
        == sum(int(plan.edges[s, w]) for s in range(plan.num_steps) for w in range(2))
    )
    assert {g for g, _ in seen[0] | seen[1]} == {int(plan.unit_graph[u]) for u in trained}


def test_pipeline_is_reproducible_and_reshuffles_every_epoch(dataset):
    path, manifest, _ = dataset
    sampling = SubgraphConfig(enabled=True, seed_edges=6, max_nodes_per_hop=3).sampling(2, 2.0, 1.0)

    def epoch_labels(epoch):
        plan = plan_train_epoch(manifest, 1, 2, seed=3, epoch=epoch, subgraphs=sampling)
        return [
            (g.nodes.numpy(), labels.numpy())
            for g, labels in train_dataset(path, manifest, plan, 0)
        ]

    first, again, other = epoch_labels(0), epoch_labels(0), epoch_labels(1)
    assert all(
        np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(first, again)
    )
    assert any(
        a[0].shape != b[0].shape or not np.array_equal(a[0], b[0]) for a, b in zip(first, other)
    )


def test_several_epochs_of_subgraphs_come_out_of_one_dataset_cut_and_resumed(dataset):
    path, manifest, _ = dataset
    sampling = SubgraphConfig(enabled=True, seed_edges=6, max_nodes_per_hop=3).sampling(2, 2.0, 1.0)
    plans = [
        plan_train_epoch(manifest, 2, 2, seed=3, epoch=e, subgraphs=sampling) for e in range(3)
    ]
    assert plans[0].num_steps >= 3

    def read(dataset):
        return [(g.nodes.numpy().tobytes(), labels.numpy().tobytes()) for g, labels in dataset]

    alone = [read(train_dataset(path, manifest, p, 1).take(2)) for p in plans]
    # The epoch drives the sampling: epoch 1's units sampled as epoch 0's differ, so a unit
    # read under the wrong epoch would show.
    relabelled = dataclasses.replace(plans[1], epoch=0)
    assert read(train_dataset(path, manifest, relabelled, 1).take(2)) != alone[1]
    together = read(train_dataset(path, manifest, plans, 1, steps=2))
    assert together == alone[0] + alone[1] + alone[2]
    resumed = read(train_dataset(path, manifest, plans, 1, steps=2, skip=1))
    assert resumed == together[1:]
    reseeded = plan_train_epoch(manifest, 2, 2, seed=4, epoch=3, subgraphs=sampling)
    whole = plan_train_epoch(manifest, 2, 2, seed=3, epoch=3)
    with pytest.raises(
        ConfigError, match=r"subgraph plans of epochs \[0, 1, 2, 3\] differ in seed"
    ):
        train_dataset(path, manifest, plans + [reseeded], 1)
    whole = plan_train_epoch(manifest, 2, 2, seed=3, epoch=3)
    with pytest.raises(ConfigError, match="cannot mix whole-graph plans and subgraph plans"):
        train_dataset(path, manifest, plans + [whole], 1)


def test_evaluation_stays_on_whole_graphs(dataset):
    path, manifest, _ = dataset
    total = sum(
        int(g.n_edge.numpy().sum()) for g, _ in eval_dataset(path, manifest, "val", 0, 1, 2)
    )
    assert total == 3 * 14


def test_subgraphs_need_uncompressed_shards(tmp_path):
    rng = np.random.default_rng(0)
    graph = HitGraph(
        *random_graph(rng, 5, 4),
        labels=np.zeros(4, np.float32),
        hit_id=np.arange(5, dtype=np.int64),
        event_id=1,
        section=0,
        num_true_segments=0,
    )
    write_dataset({"train": [graph]}, tmp_path, RecordsConfig(compression="gzip"))
    with pytest.raises(ConfigError, match="records.compression=none"):
        plan_train_epoch(open_dataset(tmp_path), 1, 1, 0, 0, subgraphs=SAMPLING)
