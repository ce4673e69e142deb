"""Shard writing: round trips through files, the manifest, shuffling, atomicity and splits."""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest

from hvdtrack.configtools import from_mapping
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.graphs.construction import HitGraph
from hvdtrack.records import (
    DatasetWriter,
    Manifest,
    RecordsConfig,
    encode_graph,
    split_events,
    write_dataset,
)
from hvdtrack.records.manifest import sha256_of_file
from hvdtrack.records.shards import first_unreadable_record, index_shard_records, read_split_graphs


def small_graph(event: int, section: int, num_nodes: int, labels: list[float]) -> HitGraph:
    num_edges = len(labels)
    return HitGraph(
        nodes=np.zeros((num_nodes, 3), np.float32) + event,
        edges=np.zeros((num_edges, 4), np.float32),
        senders=np.zeros(num_edges, np.int32),
        receivers=np.ones(num_edges, np.int32),
        labels=np.array(labels, np.float32),
        hit_id=np.arange(num_nodes, dtype=np.int64),
        event_id=event,
        section=section,
        num_true_segments=int(sum(labels)),
    )


def tiny_dataset() -> dict[str, list[HitGraph]]:
    return {
        "train": [
            small_graph(1, 0, 3, [1, 0]),
            small_graph(1, 1, 2, [1]),
            small_graph(2, 0, 4, [0, 0, 1]),
        ],
        "val": [small_graph(3, 0, 2, [0])],
    }


def files_in(path) -> list[str]:
    return sorted(os.listdir(path))


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_graphs_round_trip_exactly_through_shard_files(
    tmp_path, make_graph, graphs_equal, compression
):
    rng = np.random.default_rng(3)
    graphs = [
        make_graph(rng, int(rng.integers(1, 60)), int(rng.integers(0, 200)), 7, s) for s in range(9)
    ]
    config = RecordsConfig(graphs_per_shard=4, compression=compression)
    manifest = write_dataset({"train": graphs}, tmp_path, config)
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    assert [s.file for s in manifest.shards] == [
        f"train-0000{i}-of-00003{suffix}" for i in range(3)
    ]
    assert [s.num_graphs for s in manifest.shards] == [3, 3, 3]
    read = list(read_split_graphs(tmp_path, Manifest.load(tmp_path), "train"))
    assert sorted(entry.section for entry, _ in read) == list(range(9))
    for entry, graph in read:
        assert (entry.event_id, entry.section, entry.num_edges) == (
            7,
            graph.section,
            graph.num_edges,
        )
        graphs_equal(graph, graphs[graph.section])


def test_manifest_of_a_tiny_dataset(tmp_path):
    config = RecordsConfig(graphs_per_shard=2, split_fractions=(0.5, 0.5, 0.0))
    write_dataset(tiny_dataset(), tmp_path, config)
    assert files_in(tmp_path) == [
        "manifest.json",
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
        "val-00000-of-00001.tfrecord",
    ]
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data == {
        "format": "hvdtrack-graph-records",
        "schema_version": 1,
        "compression": "none",
        "graphs_per_shard": 2,
        "seed": 0,
        "splits": ["train", "val", "test"],
        "shards": [
            {"file": "train-00000-of-00002.tfrecord", "split": "train", "index": 0, "num_graphs": 2,
             "sha256": "9ca28595c24ff12306fac8560a6678876d829068cb5ca5e5f80544ed7ccd192b", "num_bytes": 694},
            {"file": "train-00001-of-00002.tfrecord", "split": "train", "index": 1, "num_graphs": 1,
             "sha256": "78ff54417fb087d2b2897a6c4f028e437812d10fb8c2359fa9e54e5b6aaaf226", "num_bytes": 275},
            {"file": "val-00000-of-00001.tfrecord", "split": "val", "index": 0, "num_graphs": 1,
             "sha256": "c2ad45aecf70bb69238fb5b307b9a7d442c56a9750289f4bbd1d9603264514ea", "num_bytes": 275},
        ],
        "graphs": [
            {"split": "train", "shard": 0, "record": 0, "event_id": 1, "section": 0,
             "num_nodes": 3, "num_edges": 2, "num_true_edges": 1},
            {"split": "train", "shard": 0, "record": 1, "event_id": 2, "section": 0,
             "num_nodes": 4, "num_edges": 3, "num_true_edges": 1},
            {"split": "train", "shard": 1, "record": 0, "event_id": 1, "section": 1,
             "num_nodes": 2, "num_edges": 1, "num_true_edges": 1},
            {"split": "val", "shard": 0, "record": 0, "event_id": 3, "section": 0,
             "num_nodes": 2, "num_edges": 1, "num_true_edges": 0},
        ],
    }  # fmt: skip
    for shard in data["shards"]:
        path = tmp_path / shard["file"]
        assert (sha256_of_file(path), path.stat().st_size) == (shard["sha256"], shard["num_bytes"])


def test_graphs_are_shuffled_across_shards_deterministically(tmp_path):
    graphs = [small_graph(event, 0, 2, [1]) for event in range(40)]
    config = RecordsConfig(graphs_per_shard=8, seed=5)
    first = write_dataset({"train": graphs}, tmp_path / "a", config)
    again = write_dataset({"train": graphs}, tmp_path / "b", config)
    other = write_dataset(
        {"train": graphs}, tmp_path / "c", RecordsConfig(graphs_per_shard=8, seed=6)
    )
    events = [g.event_id for g in first.graphs]
    assert sorted(events) == list(range(40))
    assert events != list(range(40))
    assert events == [g.event_id for g in again.graphs]
    assert events != [g.event_id for g in other.graphs]


def test_shards_have_near_equal_sizes(tmp_path):
    manifest = write_dataset(
        {"train": [small_graph(e, 0, 2, [1]) for e in range(10)]},
        tmp_path,
        RecordsConfig(graphs_per_shard=4),
    )
    assert [(s.file, s.num_graphs) for s in manifest.shards] == [
        ("train-00000-of-00003.tfrecord", 3),
        ("train-00001-of-00003.tfrecord", 4),
        ("train-00002-of-00003.tfrecord", 3),
    ]
    assert sorted(g.event_id for g in manifest.graphs) == list(range(10))


def test_graph_failing_validation_half_way_leaves_nothing(tmp_path):
    bad = small_graph(9, 0, 2, [1, 0])
    bad.receivers[1] = 5

    def graphs():
        yield small_graph(1, 0, 2, [1])
        yield small_graph(2, 0, 2, [1])
        yield bad
        yield small_graph(3, 0, 2, [1])

    with pytest.raises(
        DataError, match=r"graph of event 9 section 0: field 'receivers' has node indices"
    ):
        write_dataset(
            {"val": [small_graph(4, 0, 2, [1])], "train": graphs()}, tmp_path, RecordsConfig()
        )
    assert files_in(tmp_path) == []


def test_failure_while_writing_shards_leaves_nothing(tmp_path, monkeypatch):
    from hvdtrack.records import shards as shards_module

    calls = []

    def failing_checksum(path):  # fails on the third shard, after two were written
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        return sha256_of_file(path)

    monkeypatch.setattr(shards_module, "sha256_of_file", failing_checksum)
    graphs = {
        "train": [small_graph(e, 0, 2, [1]) for e in range(4)],
        "val": [small_graph(9, 0, 2, [1])],
    }
    with pytest.raises(OSError, match="disk full"):
        write_dataset(graphs, tmp_path, RecordsConfig(graphs_per_shard=2))
    assert files_in(tmp_path) == []


def test_leaving_the_writer_without_finish_leaves_nothing(tmp_path):
    with DatasetWriter(tmp_path, RecordsConfig()) as writer:
        writer.add("train", small_graph(1, 0, 2, [1]))
    assert files_in(tmp_path) == []


def test_writer_accepts_graphs_encoded_elsewhere(tmp_path, graphs_equal):
    graph = small_graph(4, 2, 3, [1, 0, 1])
    with DatasetWriter(tmp_path, RecordsConfig()) as writer:
        writer.add("test", encode_graph(graph))
        manifest = writer.finish()
    assert [(g.split, g.event_id, g.num_true_edges) for g in manifest.graphs] == [("test", 4, 2)]
    ((_, read),) = read_split_graphs(tmp_path, manifest, "test")
    graphs_equal(read, graph)


def test_existing_dataset_is_kept_unless_overwrite(tmp_path):
    write_dataset(tiny_dataset(), tmp_path, RecordsConfig(graphs_per_shard=1))
    with pytest.raises(DataError, match="already holds a dataset"):
        write_dataset(tiny_dataset(), tmp_path, RecordsConfig())
    write_dataset(tiny_dataset(), tmp_path, RecordsConfig(graphs_per_shard=4), overwrite=True)
    assert files_in(tmp_path) == [
        "manifest.json",
        "train-00000-of-00001.tfrecord",
        "val-00000-of-00001.tfrecord",
    ]


def test_unknown_split_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="split 'training' is not one of 'records.split_names'"):
        write_dataset({"training": [small_graph(1, 0, 2, [1])]}, tmp_path, RecordsConfig())
    assert files_in(tmp_path) == []


def test_split_events_by_fractions_and_counts():
    events = np.array([10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 10])
    by_fraction = split_events(events, RecordsConfig(split_fractions=(0.6, 0.25, 0.15), seed=1))
    assert [len(v) for v in by_fraction.values()] == [6, 3, 1]
    assert sorted(np.concatenate(list(by_fraction.values())).tolist()) == list(range(10, 20))
    by_count = split_events(events, RecordsConfig(split_counts=(2, 1, 1), seed=1))
    assert {k: len(v) for k, v in by_count.items()} == {"train": 2, "val": 1, "test": 1}
    again = split_events(events, RecordsConfig(split_counts=(2, 1, 1), seed=1))
    assert all(np.array_equal(by_count[k], again[k]) for k in by_count)
    with pytest.raises(ConfigError, match="asks for 12 events but there are only 10"):
        split_events(events, RecordsConfig(split_counts=(10, 1, 1)))


@pytest.mark.parametrize(
    "mapping, message",
    [
        ({"graphs_per_shard": 0}, r"'records.graphs_per_shard' must be in \[1, 100000\]"),
        ({"compression": "zip"}, "'records.compression' must be one of 'none', 'gzip'"),
        ({"split_fractions": [0.5, 0.2, 0.2]}, "'records.split_fractions' must sum to 1"),
        ({"split_names": ["train", "val-1", "test"]}, "'records.split_names' 'val-1'"),
        ({"split_counts": [3, 1]}, "'records.split_counts' must have one value per split"),
    ],
)
def test_records_config_is_validated(mapping, message):
    with pytest.raises(ConfigError, match=message):
        from_mapping(RecordsConfig, mapping, "records")


def test_record_offsets_come_from_the_shard_framing(tmp_path):
    encoded = [encode_graph(small_graph(e, 0, 2, [1])) for e in range(3)]
    manifest = write_dataset({"train": encoded}, tmp_path, RecordsConfig(graphs_per_shard=4))
    (shard,) = manifest.shards
    lengths = {e.info.event_id: len(e.example) for e in encoded}
    ordered = [lengths[g.event_id] for g in manifest.graphs]  # in record order
    path = tmp_path / shard.file
    offsets = index_shard_records(path, num_records=3)
    assert offsets.tolist() == [0, 16 + ordered[0], 32 + ordered[0] + ordered[1]]
    with pytest.raises(DataError, match=r"holds 3 records but the manifest lists 4"):
        index_shard_records(path, num_records=4)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(
        DataError, match=rf"shard {shard.file}: record 2 at byte {offsets[2]} runs past"
    ):
        index_shard_records(path)


def test_graphs_encoded_in_worker_processes_without_tensorflow(tmp_path, graphs_equal):
    graphs = [small_graph(e, s, 3, [1, 0]) for e in range(2) for s in range(2)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        encoded = list(pool.map(encode_graph, graphs))
    manifest = write_dataset({"train": encoded}, tmp_path, RecordsConfig())
    read = {(e.event_id, e.section): g for e, g in read_split_graphs(tmp_path, manifest, "train")}
    for graph in graphs:
        graphs_equal(read[(graph.event_id, graph.section)], graph)
    code = (
        "import sys, numpy as np; from hvdtrack.records.shards import encode_graph; "
        "from hvdtrack.graphs.construction import HitGraph; "
        "encode_graph(HitGraph(np.zeros((1, 3), np.float32), np.zeros((0, 4), np.float32), "
        "np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32), "
        "np.zeros(1, np.int64), 1, 0, 0)); print('tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# Cutting 30 bytes reaches into record 2 of a plain shard; in a gzip shard (8-byte trailer,
# records compressed together) the lost bytes already held part of record 1.
@pytest.mark.parametrize("compression, record", [("none", 2), ("gzip", 1)])
def test_a_truncated_shard_is_named_by_file_and_record_when_read(tmp_path, compression, record):
    encoded = [encode_graph(small_graph(e, 0, 2, [1])) for e in range(3)]
    config = RecordsConfig(graphs_per_shard=4, compression=compression)
    manifest = write_dataset({"train": encoded}, tmp_path, config)
    path = tmp_path / manifest.shards[0].file
    whole = path.read_bytes()
    assert first_unreadable_record(path, compression) is None
    path.write_bytes(whole[: len(whole) - 30])
    with pytest.raises(
        DataError, match=rf"^shard {path.name}: record {record} cannot be read, the file is trunc"
    ):
        list(read_split_graphs(tmp_path, manifest, "train"))
    assert first_unreadable_record(path, compression) == record


def test_a_changed_byte_is_named_by_file_and_record_when_read(tmp_path):
    encoded = [encode_graph(small_graph(e, 0, 2, [1])) for e in range(3)]
    manifest = write_dataset({"train": encoded}, tmp_path, RecordsConfig(graphs_per_shard=4))
    path = tmp_path / manifest.shards[0].file
    data = bytearray(path.read_bytes())
    data[int(index_shard_records(path)[1]) + 20] ^= 0x01  # in record 1's data: its CRC fails
    path.write_bytes(bytes(data))
    with pytest.raises(
        DataError,
        match=rf"^shard {path.name}: record 1 cannot be read, .* \(corrupted record at \d+\) - re-run",
    ):
        list(read_split_graphs(tmp_path, manifest, "train"))
