"""Peak memory: the /proc reading behind ``hvdtrack.utils.memory`` and the bench's memory table
(``hvdtrack.bench.memory``, run as ``bench model --memory``)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from hvdtrack.bench import model as bench
from hvdtrack.bench.memory import memory_per_edge_png, parse_bytes, training_caveat
from hvdtrack.bench.profile import shape_groups
from hvdtrack.utils import memory

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_parse_bytes():
    assert parse_bytes("4GiB") == 4 * 2**30
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes("100") == 100
    with pytest.raises(ValueError, match="'4 parsecs' is not a size"):
        parse_bytes("4 parsecs")


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
    argv = ["--config", "tiny", "--memory", "--breakdown", "--nodes", "20", "--edges", "60"]
    assert bench.main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "peak memory of one training step" in printed
    assert "held at the allocator's peak" in printed
    [record] = json.loads(out.read_text())["records"]
    assert (record["nodes"], record["edges"]) == (20, 60)
    assert record["peak_rss"] >= record["rss_before"] > 0 and record["allocator_peak"] > 0
    # --breakdown: the tensors held at the peak of a traced step, the graph's among them
    live = record["live_at_peak"]
    assert live["allocated"] >= live["requested"] > 0
    shapes = {shape for _, shape, _, _ in live["tensors"]}
    # rows per hit (20), per edge (60) or per edge end (120: both ends gathered at once); which
    # of them are live at the peak depends on the order the step's ops ran in
    rows = {shape.strip("[]").split(",")[0] for shape in shapes}
    assert rows & {"20", "60", "120"}, shapes
    assert live["allocated"] == sum(t[3] for t in live["tensors"])


def test_shape_groups_add_up_tensors_of_one_shape_largest_first():
    tensors = [
        ["step/a", "[8,64]", 2048, 2048],
        ["step/b", "[8,64]", 2048, 4096],  # given a larger free block than it asked for
        ["step/c", "[8]", 32, 32],
        ["step/d", "[2,128]", 1024, 1024],
    ]
    assert shape_groups(tensors) == [
        ("[8,64]", 2, 4096, 6144),
        ("[2,128]", 1, 1024, 1024),
        ("[8]", 1, 32, 32),
    ]
    assert shape_groups(tensors, top=1) == [("[8,64]", 2, 4096, 6144)]


@pytest.mark.slow  # one fresh TensorFlow process
def test_a_budget_below_the_smallest_graph_is_reported(capsys):
    code = bench.main(["--config", "tiny", "--memory-budget", "100MiB"])
    assert code == 2
    captured = capsys.readouterr()
    assert "10000 edges: over budget, stopped -> too big" in captured.out
    assert "--memory-budget: not even 10000 edges fit in 104857600 bytes" in captured.err


def test_memory_per_edge_is_drawn_for_both_modes_without_missing_values():
    def record(edges, allocator_peak):
        return dict(edges=edges, rss_growth=2048 * edges, allocator_peak=allocator_peak)

    series = {
        "plain": [record(100, 4096 * 100), record(1000, None)],
        "recompute": [record(100, 1024 * 100), record(1000, 1024 * 1000)],
    }
    assert memory_per_edge_png(series, "training step of the tiny model").startswith(PNG_SIGNATURE)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--plot", "x.png"], "--plot draws --memory's tables: give --memory"),
        (["--memory", "--memory-budget", "1GiB", "--plot", "x.png"], "(without --memory-budget)"),
        (["--memory", "--plot", "no/such/dir/x.png"], "--plot no/such/dir/x.png: no directory"),
    ],
)
def test_a_plot_without_its_table_or_directory_is_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err


# Four fresh TensorFlow processes (65 s on a slow day): the plot draws what memory_table
# measures (tested above); extended to keep the default run under CI's 45 minutes.
@pytest.mark.slow
@pytest.mark.extended
def test_the_plot_measures_plain_and_recompute_in_fresh_processes(tmp_path, capsys, monkeypatch):
    # The allocator as a user's shell leaves it: each probe's model chooses (hvdtrack.entry).
    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC")
    monkeypatch.delenv("HVDTRACK_SUPPLIED_SETTINGS", raising=False)
    png, out = tmp_path / "memory_per_edge.png", tmp_path / "memory.json"
    argv = ["--config", "tiny", "--memory", "--nodes", "50", "100", "--edges", "400", "800"]
    code = bench.main(argv + ["--repeats", "1", "--plot", str(png), "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.count("peak memory of one training step") == 2
    assert "recompute=False" in printed and "recompute=True" in printed
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([png.name, out.name])  # no temporary left beside them
    series = json.loads(out.read_text())["series"]
    assert list(series) == ["plain", "recompute"]
    for mode, run in series.items():
        assert run["config"]["model"]["recompute"] == (mode == "recompute")
        assert [(r["nodes"], r["edges"]) for r in run["records"]] == [(50, 400), (100, 800)]
        assert all(r["rss_growth"] > 0 for r in run["records"])
        # plain: the caching allocator and its figures; recompute: the system's, without them
        peaks = [r["allocator_peak"] for r in run["records"]]
        assert all(p > 0 for p in peaks) if mode == "plain" else peaks == [None, None]


def test_the_bisection_says_what_it_does_not_measure_under_the_caching_allocator():
    assert training_caveat("system") is None
    caveat = training_caveat("caching")
    assert caveat.startswith("note: one step on graphs of one size.")
    assert "TF_CPU_ALLOCATOR_USE_BFC=false" in caveat


def test_usable_memory_is_the_tightest_control_group_limit_below_physical(tmp_path):
    physical = memory.usable_memory_bytes(tmp_path / "no-cgroup-file", tmp_path)
    assert physical > 2**20  # the machine's, from sysconf
    # cgroup v2: the group's "max" is no limit, its parent's 1 GiB is
    (tmp_path / "job/step").mkdir(parents=True)
    (tmp_path / "job/step/memory.max").write_text("max\n")
    (tmp_path / "job/memory.max").write_text(f"{2**30}\n")
    (tmp_path / "cgroup").write_text("0::/job/step\n")
    assert memory.usable_memory_bytes(tmp_path / "cgroup", tmp_path) == min(physical, 2**30)
    # cgroup v1: the memory controller's hierarchy; its "unlimited" (2**63 - page) is none
    (tmp_path / "memory/slurm").mkdir(parents=True)
    (tmp_path / "memory/slurm/memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "cgroup").write_text("4:memory:/slurm\n3:cpuset:/\n")
    assert memory.usable_memory_bytes(tmp_path / "cgroup", tmp_path) == physical
    (tmp_path / "memory/slurm/memory.limit_in_bytes").write_text(f"{3 * 2**20}\n")
    assert memory.usable_memory_bytes(tmp_path / "cgroup", tmp_path) == 3 * 2**20
