"""The read benchmark times the training pipeline end to end on a tiny dataset."""

from __future__ import annotations

import numpy as np

from hvdtrack.bench import read


def test_array_bytes_follow_the_schema():
    # A node: 3 float32 features + an int64 hit_id = 20 bytes; an edge: 4 float32 features,
    # int32 sender and receiver, float32 label = 28 bytes.
    assert read.array_bytes(np.array([1, 0, 2]), np.array([0, 1, 3])).tolist() == [20, 28, 124]


def test_benchmark_prints_every_setting(capsys):
    args = ["--graphs", "8", "--nodes", "50", "--edges", "200", "--batch-graphs", "2"]
    assert read.main([*args, "--graphs-per-shard", "4", "--repeats", "1"]) == 0
    rows = [line.split()[:3] for line in capsys.readouterr().out.splitlines()]
    for setting in (["none", "offset", "1"], ["none", "stream", "0"], ["gzip", "stream", "1"]):
        assert setting in rows


def test_a_streamed_worker_scans_only_the_shards_holding_its_graphs(tmp_path):
    # One graph per shard: worker 0 of 2 holds half the graphs, so streams half the shards.
    args = read.parse_args(["--graphs", "8", "--nodes", "20", "--edges", "60"])
    args.graphs_per_shard = 1
    manifest = read.write_and_open(read.encoded_dataset(args, 0.0), tmp_path, "none", args)
    result = read.time_epochs(tmp_path, manifest, 2, 0, 1, 1, random_access=False)
    plan = read.plan_train_epoch(manifest, 2, 1, seed=0, epoch=1, random_access=False)
    ids = plan.worker_graph_ids(0)
    assert len(ids) == 4
    shards = manifest.shards_in("train")
    table = manifest.split_table("train")
    expected = sum(shards[s].num_bytes for s in set(table.shard[ids].tolist()))
    assert expected < sum(s.num_bytes for s in shards) * 0.6
    scanned = result["scanned_mb_per_s"] * result["seconds"] * 1e6
    assert np.isclose(scanned, expected, rtol=1e-9)
