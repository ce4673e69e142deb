"""tf.data pipelines: merged GraphsTuples that follow the plan, eval parts, signatures, errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.graphs.construction import HitGraph
from hvdtrack.inputs.balance import plan_epoch
from hvdtrack.inputs.pipeline import (
    eval_dataset,
    input_signature,
    iterate_batches,
    plan_train_epoch,
    train_dataset,
)
from hvdtrack.records import RecordsConfig, encode_graph, open_dataset, write_dataset
from hvdtrack.records.manifest import GraphInfo
from hvdtrack.records.shards import EncodedGraph, index_shard_records
from tests.records.test_schema import hand_made_record, tiny_graph


@pytest.fixture(scope="module", params=["none", "gzip"])
def dataset(request, tmp_path_factory, make_graph):
    """13 train graphs in 4 shards, 7 val graphs; returns (dir, manifest, {(event, section): graph})."""
    rng = np.random.default_rng(11)
    graphs = {
        split: [
            make_graph(rng, int(rng.integers(2, 30)), int(rng.integers(0, 80)), event, s)
            for s in range(count)
        ]
        for split, event, count in (("train", 1, 13), ("val", 2, 7))
    }
    path = tmp_path_factory.mktemp(f"dataset-{request.param}")
    config = RecordsConfig(graphs_per_shard=4, compression=request.param)
    write_dataset(graphs, path, config)
    by_key = {(g.event_id, g.section): g for split in graphs.values() for g in split}
    return path, open_dataset(path), by_key


def merged(graphs: list[HitGraph]) -> dict[str, np.ndarray]:
    """What a batch of ``graphs`` must look like, merged by hand."""
    n_node = np.array([g.num_nodes for g in graphs], np.int32)
    offsets = np.concatenate([[0], np.cumsum(n_node)[:-1]]).astype(np.int32)
    return {
        "nodes": np.concatenate([g.nodes for g in graphs]),
        "edges": np.concatenate([g.edges for g in graphs]),
        "senders": np.concatenate([g.senders + o for g, o in zip(graphs, offsets)]),
        "receivers": np.concatenate([g.receivers + o for g, o in zip(graphs, offsets)]),
        "n_node": n_node,
        "n_edge": np.array([g.num_edges for g in graphs], np.int32),
        "globals": np.zeros((len(graphs), 1), np.float32),
        "labels": np.concatenate([g.labels for g in graphs]),
    }


def assert_batch(batch, graphs: list[HitGraph]) -> None:
    gt, labels = batch
    expected = merged(graphs)
    for name in ("nodes", "edges", "senders", "receivers", "n_node", "n_edge", "globals"):
        value = getattr(gt, name).numpy()
        assert value.dtype == expected[name].dtype, name
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
    np.testing.assert_array_equal(labels.numpy(), expected["labels"])


def graphs_of(manifest, split, ids, by_key) -> list[HitGraph]:
    table = manifest.split_table(split)
    return [by_key[(int(table.event_id[i]), int(table.section[i]))] for i in ids]


@pytest.mark.parametrize("random_access", [None, False])
@pytest.mark.parametrize("num_workers, batch_graphs", [(1, 3), (2, 2)])
def test_train_batches_follow_the_plan_and_merge_graphs(
    dataset, num_workers, batch_graphs, random_access
):
    path, manifest, by_key = dataset
    for epoch in (0, 1):
        plan = plan_train_epoch(
            manifest,
            num_workers,
            batch_graphs,
            seed=4,
            epoch=epoch,
            random_access=random_access,
            shards_per_group=3,
        )
        assert (plan.shard_order is None) == (
            manifest.compression == "none" and random_access is None
        )
        for worker in range(num_workers):
            batches = list(train_dataset(path, manifest, plan, worker))
            assert len(batches) == plan.num_steps == 13 // (num_workers * batch_graphs)
            for step, batch in enumerate(batches):
                assert_batch(
                    batch, graphs_of(manifest, "train", plan.graph_ids[worker, step], by_key)
                )


@pytest.mark.parametrize("random_access", [None, False])
def test_several_epochs_are_read_back_to_back_by_one_dataset(dataset, random_access):
    path, manifest, by_key = dataset
    plans = [
        plan_train_epoch(manifest, 2, 2, seed=1, epoch=e, random_access=random_access)
        for e in range(3)
    ]
    batches = list(train_dataset(path, manifest, plans, worker=1))
    expected = [ids for plan in plans for ids in plan.graph_ids[1]]
    assert len(batches) == len(expected) == 9
    for batch, ids in zip(batches, expected):
        assert_batch(batch, graphs_of(manifest, "train", ids, by_key))
    # the first steps of each plan (train.max_steps_per_epoch)
    first = list(train_dataset(path, manifest, plans, worker=1, steps=2))
    expected = [ids for plan in plans for ids in plan.graph_ids[1, :2]]
    assert len(first) == len(expected) == 6
    for batch, ids in zip(first, expected):
        assert_batch(batch, graphs_of(manifest, "train", ids, by_key))
    # a resume after the first epoch's first step: the rest of that epoch, then the others
    resumed = list(train_dataset(path, manifest, plans, worker=1, steps=2, skip=1))
    assert len(resumed) == len(expected) - 1
    for batch, ids in zip(resumed, expected[1:]):
        assert_batch(batch, graphs_of(manifest, "train", ids, by_key))
    with pytest.raises(ConfigError, match="skip=2 needs 0 <= skip < 2, the steps read of epoch 0"):
        train_dataset(path, manifest, plans, worker=1, steps=2, skip=2)
    other = plan_train_epoch(manifest, 2, 3, seed=1, epoch=3, random_access=random_access)
    with pytest.raises(ConfigError, match="plans with equal num_workers and batch_graphs"):
        train_dataset(path, manifest, plans + [other], worker=1)


def test_plan_for_another_split_is_refused(dataset):
    path, manifest, _ = dataset
    plan = plan_train_epoch(manifest, 1, 2, seed=0, epoch=0, split="val")
    with pytest.raises(
        ConfigError,
        match=r"the epoch plan \(7 graphs (read by offset|in 2 shards)\) was not made for split 'train'",
    ):
        train_dataset(path, manifest, plan, 0)


def test_random_access_is_refused_for_gzip(tmp_path, make_graph):
    manifest = write_small(tmp_path, make_graph, "gzip")
    with pytest.raises(
        ConfigError, match="has gzip-compressed shards, which cannot be read by offset"
    ):
        plan_train_epoch(manifest, 1, 2, seed=0, epoch=0, random_access=True)


@pytest.mark.parametrize("num_workers", [2, 3])
def test_eval_parts_are_disjoint_cover_the_split_and_keep_order(dataset, num_workers):
    path, manifest, by_key = dataset
    table = manifest.split_table("val")
    seen = []
    for worker in range(num_workers):
        part = [
            (table.event_id[i], table.section[i])
            for i in range(worker * 7 // num_workers, (worker + 1) * 7 // num_workers)
        ]
        batches = list(eval_dataset(path, manifest, "val", worker, num_workers, batch_graphs=2))
        assert [int(b[0].n_node.shape[0]) for b in batches] == [2] * (len(part) // 2) + [1] * (
            len(part) % 2
        )
        for i, batch in enumerate(batches):
            assert_batch(batch, [by_key[key] for key in part[2 * i : 2 * i + 2]])
        seen += part
    assert sorted(seen) == sorted(zip(table.event_id, table.section))
    assert len(seen) == 7


def test_element_spec_is_the_input_signature(dataset):
    path, manifest, _ = dataset
    plan = plan_train_epoch(manifest, 1, 2, seed=0, epoch=0)
    signature = input_signature()
    assert train_dataset(path, manifest, plan, 0).element_spec == signature
    assert eval_dataset(path, manifest, "val", 0, 1, 3).element_spec == signature


def test_signature_compiles_once_for_every_batch_size(dataset):
    path, manifest, _ = dataset
    traces = []

    @tf.function(input_signature=input_signature())
    def count_edges(graphs, labels):
        traces.append(1)
        return tf.reduce_sum(graphs.n_edge) + tf.shape(labels)[0] + tf.shape(graphs.nodes)[0]

    small = next(iter(eval_dataset(path, manifest, "val", 0, 1, batch_graphs=1)))
    large = next(iter(eval_dataset(path, manifest, "train", 0, 1, batch_graphs=5)))
    assert small[0].n_node.shape[0] == 1 and large[0].n_node.shape[0] == 5
    count_edges(*small)
    count_edges(*large)
    assert len(traces) == 1


def test_empty_split_is_refused_naming_dataset_and_split(dataset):
    path, manifest, _ = dataset
    with pytest.raises(DataError, match=rf"{path} has no graphs in split 'test'"):
        eval_dataset(path, manifest, "test", 0, 1, 2)
    with pytest.raises(DataError, match=rf"{path} has no graphs in split 'test'"):
        plan_train_epoch(manifest, 1, 2, 0, 0, split="test", dataset=str(path))


def write_small(tmp_path, make_graph, compression="none", extra=()):
    rng = np.random.default_rng(2)
    graphs = [make_graph(rng, 10, 30, 5, s) for s in range(6)]
    config = RecordsConfig(graphs_per_shard=3, compression=compression)
    write_dataset({"train": list(graphs) + list(extra)}, tmp_path, config)
    return open_dataset(tmp_path)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_truncated_shard_read_without_checks_is_a_data_error_naming_file_and_record(
    tmp_path, make_graph, compression
):
    manifest = write_small(tmp_path, make_graph, compression)
    victim = tmp_path / manifest.shards[1].file
    data = eval_dataset(tmp_path, manifest, "train", 0, 1, 2)  # built while the sizes were right
    victim.write_bytes(victim.read_bytes()[: manifest.shards[1].num_bytes // 2])
    with pytest.raises(
        DataError, match=rf"shard {victim.name} of split 'train' in .* is \d+ bytes"
    ):
        eval_dataset(tmp_path, manifest, "train", 0, 1, 2)  # now refused before reading
    # Uncompressed: records 0..2 of equal size, cut in half -> record 1 is the first cut short.
    record = "1" if compression == "none" else r"\d"
    with pytest.raises(
        DataError,
        match=rf"reading failed at record {record} of {victim.name} \(.*\): shard {victim.name} "
        rf"of split 'train' in {tmp_path} is \d+ bytes but the manifest says",
    ):
        list(iterate_batches(data, tmp_path, manifest))


def flip_byte_in_record(path, record):
    """Changes one byte in the data of ``record`` (an uncompressed shard): same size, bad CRC."""
    offset = int(index_shard_records(path)[record]) + 12 + 5  # past length + its CRC
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("random_access", [True, False])
def test_changed_shard_bytes_are_a_data_error_naming_file_and_record(
    tmp_path, make_graph, random_access
):
    manifest = write_small(tmp_path, make_graph)
    victim = tmp_path / manifest.shards[1].file
    flip_byte_in_record(victim, 2)
    with pytest.raises(DataError, match=rf"shard {victim.name} .* does not match its checksum"):
        open_dataset(tmp_path)
    unchecked = open_dataset(tmp_path, verify=False)  # same size: only reading can tell
    plan = plan_train_epoch(unchecked, 1, 6, seed=0, epoch=0, random_access=random_access)
    with pytest.raises(
        DataError,
        match=rf"^reading failed at record 2 of {victim.name} \(corrupted record at \d+\): "
        rf"shard {victim.name} of split 'train' in {tmp_path} does not match its checksum",
    ):
        list(iterate_batches(train_dataset(tmp_path, unchecked, plan, 0), tmp_path, unchecked))


def test_a_missing_shard_is_refused_when_the_pipeline_is_built(tmp_path, make_graph):
    manifest = write_small(tmp_path, make_graph)
    plan = plan_train_epoch(manifest, 1, 2, seed=0, epoch=0)
    (tmp_path / manifest.shards[1].file).unlink()
    missing = rf"^shard {manifest.shards[1].file} of split 'train' is missing from {tmp_path} "
    with pytest.raises(DataError, match=missing):
        train_dataset(tmp_path, manifest, plan, 0)
    with pytest.raises(DataError, match=missing):
        eval_dataset(tmp_path, manifest, "train", 0, 1, 2)


def test_truncated_shard_is_named_when_reading_by_offset(tmp_path, make_graph):
    manifest = write_small(tmp_path, make_graph)
    victim = tmp_path / manifest.shards[1].file
    victim.write_bytes(victim.read_bytes()[:-7])
    plan = plan_train_epoch(manifest, 1, 2, seed=0, epoch=0)
    with pytest.raises(
        DataError, match=rf"shard {victim.name} of split 'train' in {tmp_path} is \d+ bytes but"
    ):
        train_dataset(tmp_path, manifest, plan, 0)
    # Had the size been right, the offsets (read from the framing) would name the record.
    with pytest.raises(
        DataError, match=rf"shard {victim.name}: record 2 at byte \d+ runs past the end"
    ):
        index_shard_records(victim, 3)


def test_record_of_another_schema_version_is_a_data_error_naming_it(tmp_path, make_graph):
    good = encode_graph(make_graph(np.random.default_rng(0), 4, 5, 8, 0))
    # Version 1 -> 2 in the record's schema_version feature: same length, so a hand-made record.
    marker = b"\n\x0eschema_version\x12\x05\x1a\x03\n\x01\x01"
    assert good.example.count(marker) == 1
    future = EncodedGraph(
        good.example.replace(marker, marker[:-1] + b"\x02"), GraphInfo(8, 0, 4, 5, 0)
    )
    manifest = write_small(tmp_path, make_graph, extra=[future])
    ((shard, record),) = [(g.shard, g.record) for g in manifest.graphs if g.event_id == 8]
    name = manifest.shards[shard].file
    data = eval_dataset(tmp_path, manifest, "train", 0, 1, 7)
    with pytest.raises(
        DataError,
        match=rf"record {record} of {name} has schema version 2; this hvdtrack reads version 1 - "
        "re-run hvdtrack prepare",
    ):
        list(iterate_batches(data, tmp_path, manifest))


def test_an_edge_outside_its_record_is_a_data_error_naming_record_and_edge(tmp_path, make_graph):
    # A record that parses (the schema's sizes agree) but whose edge 1 ends on hit 3 of 3: read
    # by offset with the other graphs of a step, its hits would be another graph's.
    graph = tiny_graph()
    broken = dataclasses.replace(graph, event_id=8, receivers=np.array([1, 3], np.int32))
    info = GraphInfo(8, 3, graph.num_nodes, graph.num_edges, int(graph.labels.sum()))
    manifest = write_small(
        tmp_path, make_graph, extra=[EncodedGraph(hand_made_record(1, broken), info)]
    )
    ((shard, record),) = [(g.shard, g.record) for g in manifest.graphs if g.event_id == 8]
    plan = plan_train_epoch(manifest, 1, 7, seed=0, epoch=0)  # all 7 graphs in one step
    with pytest.raises(
        DataError,
        match=rf"record {record} of {manifest.shards[shard].file}: edge 1 has receiver 3, "
        "outside its 3 hits - re-run hvdtrack prepare",
    ):
        list(iterate_batches(train_dataset(tmp_path, manifest, plan, 0), tmp_path, manifest))


@pytest.mark.parametrize("random_access", [True, False])
def test_the_skipped_steps_of_a_resume_are_not_parsed(tmp_path, make_graph, random_access):
    # The broken record of the test above, in a step that a resume skips, in a shard it still
    # reads (streamed: from its start): no error shows that its record was not parsed.
    graph = tiny_graph()
    broken = dataclasses.replace(graph, event_id=8, receivers=np.array([1, 3], np.int32))
    extra = [  # with write_small's shuffle, (8, 4) is record 0 of a shard of 2 records
        EncodedGraph(hand_made_record(1, g), GraphInfo(8, g.section, 3, 2, 1))
        for g in (dataclasses.replace(graph, event_id=8), dataclasses.replace(broken, section=4))
    ]
    manifest = write_small(tmp_path, make_graph, extra=extra)
    (victim,) = [i for i, g in enumerate(manifest.graphs) if (g.event_id, g.section) == (8, 4)]
    shard_of = manifest.split_table("train", str(tmp_path)).shard
    for seed in range(40):  # 8 one-graph steps, a later one from the broken graph's shard
        plan = plan_train_epoch(manifest, 1, 1, seed, epoch=0, random_access=random_access)
        order = plan.graph_ids[0, :, 0]
        (step,) = np.flatnonzero(order == victim)
        if (shard_of[order[step + 1 :]] == shard_of[victim]).any():
            break
    else:
        pytest.fail("no seed reads the broken graph's shard after the broken graph's step")
    with pytest.raises(DataError, match="edge 1 has receiver 3"):
        list(iterate_batches(train_dataset(tmp_path, manifest, plan, 0), tmp_path, manifest))
    rest = train_dataset(tmp_path, manifest, plan, 0, skip=int(step) + 1)
    assert len(list(iterate_batches(rest, tmp_path, manifest))) == plan.num_steps - step - 1


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_streamed_resume_does_not_open_the_shards_it_has_trained(
    tmp_path, make_graph, compression
):
    manifest = write_small(tmp_path, make_graph, compression)  # 6 graphs, 2 shards of 3
    plan = plan_train_epoch(manifest, 1, 1, seed=0, epoch=0, random_access=False)
    expected = list(train_dataset(tmp_path, manifest, plan, 0))[-1]
    [last] = plan.graph_ids[0, -1]
    trained = manifest.shards[1 - manifest.split_table("train", str(tmp_path)).shard[last]]
    victim = tmp_path / trained.file  # garbage of its size: reading it is an error
    victim.write_bytes(
        bytes(range(256)) * (trained.num_bytes // 256) + b"\0" * (trained.num_bytes % 256)
    )
    with pytest.raises(DataError, match=f"reading failed at record 0 of {victim.name}"):
        list(iterate_batches(train_dataset(tmp_path, manifest, plan, 0), tmp_path, manifest))
    rest = train_dataset(tmp_path, manifest, plan, 0, skip=plan.num_steps - 1)
    [batch] = list(iterate_batches(rest, tmp_path, manifest))
    for got, want in zip(tf.nest.flatten(batch), tf.nest.flatten(expected)):
        np.testing.assert_array_equal(got, want)


def test_record_that_cannot_be_parsed_is_a_data_error(tmp_path, make_graph):
    garbage = EncodedGraph(b"\x0a\x05\x0a\x03\x0a\x01", GraphInfo(9, 0, 1, 1, 0))
    manifest = write_small(tmp_path, make_graph, extra=[garbage])
    plan = plan_train_epoch(manifest, 1, 7, seed=0, epoch=0)
    with pytest.raises(DataError, match=rf"a shard of {tmp_path} is truncated or corrupt"):
        list(iterate_batches(train_dataset(tmp_path, manifest, plan, 0), tmp_path, manifest))


def test_the_sort_window_orders_by_edges_and_nodes_and_only_read_by_offset(dataset):
    path, manifest, _ = dataset
    table = manifest.split_table("train")
    # 13 steps of 1 graph: windows of 3 steps (at most a quarter of the epoch)
    plan = plan_train_epoch(manifest, 1, 1, seed=2, epoch=1, sort_window=3, node_cost=1000.0)
    as_read = plan_train_epoch(manifest, 1, 1, seed=2, epoch=1)
    if manifest.compression == "gzip":  # streamed: the shards' order, whatever the window
        np.testing.assert_array_equal(plan.order, as_read.order)
        return
    cost = table.num_edges + table.num_nodes * 1000.0  # a graph: its edges, 1000 per node
    by_cost = plan_epoch(table.num_edges, 1, 1, seed=2, epoch=1, sort_window=3, cost=cost)
    np.testing.assert_array_equal(plan.order, by_cost.order)
    by_edges = plan_train_epoch(manifest, 1, 1, seed=2, epoch=1, sort_window=3)
    assert not np.array_equal(by_edges.order, plan.order)
    assert not np.array_equal(as_read.order, plan.order)
