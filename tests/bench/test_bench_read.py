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
