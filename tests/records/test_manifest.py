"""The manifest: loading, validation, and shard checks by size and checksum."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hvdtrack.errors import DataError
from hvdtrack.records import (
    Manifest,
    RecordsConfig,
    check_shard_files,
    check_splits,
    open_dataset,
    write_dataset,
)
from hvdtrack.records.manifest import verify_checksums


@pytest.fixture
def dataset(tmp_path, make_graph):
    rng = np.random.default_rng(0)
    graphs = [make_graph(rng, 20, 50, event, 0) for event in range(6)]
    write_dataset(
        {"train": graphs[:4], "val": graphs[4:]}, tmp_path, RecordsConfig(graphs_per_shard=2)
    )
    return tmp_path


def edit_manifest(path, change) -> None:
    data = json.loads((path / "manifest.json").read_text())
    change(data)
    (path / "manifest.json").write_text(json.dumps(data))


def test_load_gives_the_written_manifest(dataset):
    manifest = open_dataset(dataset)
    assert manifest.splits == ("train", "val", "test")
    assert [s.file for s in manifest.shards_in("val")] == ["val-00000-of-00001.tfrecord"]
    table = manifest.split_table("train")
    assert table.shard.tolist() == [0, 0, 1, 1] and table.record.tolist() == [0, 1, 0, 1]
    assert table.shard_starts.tolist() == [0, 2] and table.num_edges.tolist() == [50] * 4
    assert Manifest.load(dataset) == manifest


def test_missing_manifest_is_named(tmp_path):
    with pytest.raises(DataError, match=r"has no manifest\.json: it is not a prepared dataset"):
        Manifest.load(tmp_path)


def test_manifest_of_another_schema_version_is_refused(dataset):
    edit_manifest(dataset, lambda d: d.update(schema_version=2))
    with pytest.raises(
        DataError,
        match=r"manifest\.json has schema version 2; this hvdtrack reads version 1 - re-run",
    ):
        Manifest.load(dataset)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d["graphs"].pop(1),
            r"shard train-00000-of-00002\.tfrecord holds 2 graphs but the manifest lists records \[0\]",
        ),
        (
            lambda d: d["graphs"][0].update(shard=7),
            "graph 0 refers to shard 7 of split 'train', which is not listed",
        ),
        (
            lambda d: d["shards"][0].update(file="x.tfrecord"),
            r"shard x\.tfrecord should be named train-00000-of-00002\.tfrecord",
        ),
        (lambda d: d.update(compression="lz4"), "compression 'lz4' is not one of none, gzip"),
        (lambda d: d["shards"][0].pop("sha256"), r"'shards\[0\]' has no 'sha256'"),
    ],
)
def test_damaged_manifest_is_refused_naming_the_entry(dataset, change, message):
    edit_manifest(dataset, change)
    with pytest.raises(DataError, match=message):
        Manifest.load(dataset)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d["shards"][1].update(num_bytes="1000"),
            r"'shards\[1\].num_bytes' must be an integer, got str \"1000\"",
        ),
        (
            lambda d: d["graphs"][2].update(event_id=True),
            r"'graphs\[2\].event_id' must be an integer, got bool true",
        ),
        (
            lambda d: d["graphs"][3].update(split=3),
            r"'graphs\[3\].split' must be a string, got int 3",
        ),
        (
            lambda d: d["graphs"].__setitem__(0, [1]),
            r"'graphs\[0\]' must be an object, got list \[1\]",
        ),
        (lambda d: d["shards"][0].update(extra=1), r"'shards\[0\]' has unknown keys \['extra'\]"),
        (lambda d: d.update(shards={}), r"'shards' must be a list, got dict \{\}"),
        (lambda d: d.update(splits="train"), r"'splits' must be a list, got str \"train\""),
        (lambda d: d["splits"].__setitem__(1, None), r"'splits\[1\]' must be a string, got null"),
        (lambda d: d.update(compression=1), r"'compression' must be a string, got int 1"),
        (lambda d: d.update(seed=1.5), r"'seed' must be an integer, got float 1.5"),
        (lambda d: d.pop("graphs"), r"key 'graphs' is missing"),
    ],
)
def test_wrong_types_in_the_manifest_are_named_by_file_and_key(dataset, change, message):
    edit_manifest(dataset, change)
    with pytest.raises(DataError, match=rf"^{dataset / 'manifest.json'}: {message} - re-run"):
        Manifest.load(dataset)


def test_keys_in_another_order_are_read(dataset):
    written = Manifest.load(dataset)
    edit_manifest(
        dataset, lambda d: d["graphs"].__setitem__(0, dict(reversed(d["graphs"][0].items())))
    )
    assert Manifest.load(dataset) == written


def test_changed_shard_bytes_are_refused_by_checksum(dataset):
    path = dataset / "train-00001-of-00002.tfrecord"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    manifest = Manifest.load(dataset)
    check_shard_files(manifest, dataset)  # same size: only the checksum can tell
    with pytest.raises(
        DataError,
        match=r"shard train-00001-of-00002\.tfrecord of split 'train' in .* does not match its checksum in the manifest",
    ):
        verify_checksums(manifest, dataset)
    verify_checksums(manifest, dataset, splits=["val"])
    with pytest.raises(DataError, match="train-00001-of-00002.tfrecord"):
        open_dataset(dataset)


def test_truncated_shard_is_refused_naming_it(dataset):
    path = dataset / "val-00000-of-00001.tfrecord"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(
        DataError,
        match=rf"shard val-00000-of-00001\.tfrecord of split 'val' in .* is {size - 10} bytes but the manifest "
        rf"says {size}: it is truncated",
    ):
        open_dataset(dataset, verify=False)


def test_missing_shard_is_named(dataset):
    (dataset / "train-00000-of-00002.tfrecord").unlink()
    with pytest.raises(
        DataError,
        match=rf"^shard train-00000-of-00002\.tfrecord of split 'train' is missing from {dataset} ",
    ):
        open_dataset(dataset, verify=False)


def test_required_splits_are_checked_before_anything_is_read(dataset):
    manifest = Manifest.load(dataset)
    check_splits(manifest, dataset, ["train", "val"])
    with pytest.raises(
        DataError, match=rf"^{dataset} has no graphs in split 'test' \(splits with graphs: 'train'"
    ):
        open_dataset(dataset, required=["train", "test"])
    (dataset / "val-00000-of-00001.tfrecord").unlink()
    check_splits(manifest, dataset, ["train"])  # only the splits asked for
    with pytest.raises(
        DataError,
        match=rf"^shard val-00000-of-00001\.tfrecord of split 'val' is missing from {dataset} ",
    ):
        check_splits(manifest, dataset, ["train", "val"])


def test_empty_split_is_named(dataset):
    with pytest.raises(
        DataError,
        match=r"data/set has no graphs in split 'test' \(splits with graphs: 'train', 'val'\)",
    ):
        Manifest.load(dataset).split_table("test", "data/set")
