"""Peak memory: the /proc reading behind ``hvdtrack.utils.memory`` and the bench's memory table."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from hvdtrack.bench import model as bench
from hvdtrack.utils import memory

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_status_fields_are_read_in_bytes():
    text = "Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t4\n"
    assert memory._status_bytes("VmHWM", text) == 2048 * 1024
    assert memory._status_bytes("VmRSS", text) == 1024 * 1024
    assert memory._status_bytes("VmSwap", text) is None


@linux_only
def test_reset_lowers_the_peak_to_what_is_resident_now():
    block = np.ones(256 * 2**20 // 8)  # 256 MiB, touched
    assert memory.peak_rss_bytes() >= memory.rss_bytes() >= block.nbytes
    del block
    assert memory.reset_peak()
    assert memory.peak_rss_bytes() < memory.rss_bytes() + 64 * 2**20


@pytest.mark.slow  # a fresh TensorFlow process: ~10 s, more on a loaded machine
def test_memory_table_measures_each_size_in_a_fresh_process(tmp_path, capsys):
    out = tmp_path / "memory.json"
    code = bench.main(
        ["--config", "tiny", "--memory", "--nodes", "20", "--edges", "60", "--json", str(out)]
    )
    assert code == 0
    assert "peak memory of one training step" in capsys.readouterr().out
    [record] = json.loads(out.read_text())["records"]
    assert (record["nodes"], record["edges"]) == (20, 60)
    assert record["peak_rss"] >= record["rss_before"] > 0 and record["allocator_peak"] > 0


@pytest.mark.slow  # one fresh TensorFlow process
def test_a_budget_below_the_smallest_graph_is_reported(capsys):
    code = bench.main(["--config", "tiny", "--memory-budget", "100MiB"])
    assert code == 2
    captured = capsys.readouterr()
    assert "10000 edges: over budget, stopped -> too big" in captured.out
    assert "--memory-budget: not even 10000 edges fit in 104857600 bytes" in captured.err
