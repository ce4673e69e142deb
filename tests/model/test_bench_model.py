"""The model benchmark times the Trainer's step end to end on tiny sizes and keeps its figures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hvdtrack.bench import model as bench
from hvdtrack.bench import profile
from hvdtrack.bench.workload import Timing, round_ratios, time_calls, time_in_turn
from hvdtrack.model.kernels import vector_code


def test_benchmark_times_the_trainers_step_and_writes_records(tmp_path, capsys):
    out = tmp_path / "figures.json"
    code = bench.main(
        [
            "--config", "tiny", "--nodes", "20", "40", "--edges", "60", "--repeats", "1",
            "--warmup", "1", "--breakdown", "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "--- 20 nodes, 60 edges:" in printed and "--- 40 nodes, 60 edges:" in printed
    assert "% of the matmul rate" in printed
    records = json.loads(out.read_text())["records"]
    assert [(r["nodes"], r["edges"]) for r in records] == [(20, 60), (40, 60)]
    assert len(records[0]["step"]["seconds"]) == 1
    assert len(records[0]["step"]["page_faults"]) == 1
    assert records[0]["share_rounds"] == [
        records[0]["matmuls"]["seconds"][0] / records[0]["step"]["seconds"][0]
    ]
    # 8 memory passes over four [60 edges, 16] float32 tensors (tiny's edge latent: 16)
    assert records[0]["memory_pass_bytes"] == 8 * 4 * 60 * 16 * 4
    assert len(records[0]["memory_passes"]["seconds"]) == 1
    assert "memory passes: " in printed and " FLOP per byte (rounds: " in printed
    shares = records[0]["breakdown"]
    assert set(shares) == set(profile.CATEGORIES)
    assert shares["matmul"] > 0 and shares["optimizer"] > 0 and shares["segment sum"] > 0
    # the op types: the step's head (tiny's: one hidden ReLU layer) in one kernel where it runs
    types = {t["type"] for t in records[0]["op_types"]}
    assert "op types with the most time (ms, calls):" in printed
    assert any("MatMul" in t for t in types), types
    if vector_code():
        assert "HvdtrackHead" in types and "HvdtrackReluMask" not in types, types


def test_a_recomputed_step_says_what_it_computes_again(tmp_path, capsys):
    out = tmp_path / "figures.json"
    args = ["--config", "tiny", "--nodes", "20", "--edges", "60", "--repeats", "1"]
    code = bench.main([*args, "--warmup", "1", "--set", "model.recompute=true", "--json", str(out)])
    assert code == 0
    (record,) = json.loads(out.read_text())["records"]
    ratio = record["recomputed_flops"] / record["flops"]
    assert ratio > 1
    assert f"of matmuls: {ratio:.2f}x the plain step's" in capsys.readouterr().out


def test_the_in_cache_rate_runs_the_same_rows_in_blocks(capsys):
    assert bench.row_blocks(5000, 2048) == [(2048, 2), (904, 1)]
    assert bench.row_blocks(4096, 2048) == [(2048, 2)]
    assert bench.row_blocks(100, 2048) == [(100, 1)]
    assert bench.row_blocks(100, 0) == [(100, 1)]
    args = ["--config", "tiny", "--nodes", "20", "--edges", "60", "--repeats", "1"]
    assert bench.main([*args, "--warmup", "1", "--in-cache"]) == 0
    assert "matmul rate with inputs in cache:" in capsys.readouterr().out


def test_a_timing_says_its_median_call_and_page_faults():
    timing = Timing([0.3, 0.1, 0.2], [0.2, 0.1, 0.3], [3000, 1000, 2000])
    assert timing.describe() == "200.0 ms (min 100.0, max 300.0; CPU 200.0; 2,000 page faults)"
    assert Timing([0.1], [0.1]).describe() == "100.0 ms (min 100.0, max 100.0; CPU 100.0)"


def test_time_calls_counts_the_pages_a_call_faults_in():
    # 64 MiB written afresh per call: glibc maps a block that large and unmaps it on free, so
    # each call faults in at least its 16,384 pages of 4 KiB (fewer with huge pages).
    timing = time_calls(lambda: len(b"x" * (64 << 20)), warmup=1, repeats=2)
    assert len(timing.page_faults) == 2
    assert all(faults >= 32 for faults in timing.page_faults)
    assert all(faults <= 10 * 16384 for faults in timing.page_faults)


@pytest.mark.parametrize(
    "name, category",
    [
        ("gradient_tape/segment_classifier/edge_update/MatMul_1:MatMul", "matmul"),
        ("segment_classifier/node_update/mlp/linear_0/MatMul:_FusedMatMul", "matmul"),
        ("segment_classifier/edge_update/HvdtrackWeightGradient:HvdtrackWeightGradient", "matmul"),
        ("segment_classifier/HvdtrackHead_3:HvdtrackHead", "matmul"),
        ("segment_classifier/edge_update/HvdtrackLinearNorm:HvdtrackLinearNorm", "matmul"),
        ("segment_classifier/edge_update/GatherV2_1:GatherV2", "gather"),
        ("segment_classifier/node_update/UnsortedSegmentSum:UnsortedSegmentSum", "segment sum"),
        ("segment_classifier/edge_update/layer_norm/moments/mean:Mean", "layer norm"),
        ("gradient_tape/segment_classifier/node_update/layer_norm/mul:Mul", "layer norm"),
        ("adam/mul_3:Mul", "optimizer"),
        ("replica_1/adam/Sqrt:Sqrt", "optimizer"),
        ("segment_classifier/edge_update/add:AddV2", "other"),
    ],
)
def test_op_categories(name, category):
    assert profile.op_category(name, "adam") == category


def test_op_types_by_time_and_calls():
    ops = [
        ("a/MatMul:MatMul", 1.0),
        ("b:GatherV2", 0.5),
        ("c/MatMul_1:MatMul", 0.25),
        ("d:Add", 0.5),
    ]
    assert profile.by_type(ops) == [("MatMul", 1.25, 2), ("Add", 0.5, 1), ("GatherV2", 0.5, 1)]


def test_breakdown_sums_by_category():
    ops = [("a/MatMul:MatMul", 1.0), ("adam/x:Mul", 0.25), ("b:GatherV2", 0.5), ("c:Add", 2.0)]
    seconds = profile.breakdown(ops, "adam")
    assert seconds == {
        "matmul": 1.0, "gather": 0.5, "segment sum": 0.0, "layer norm": 0.0,
        "optimizer": 0.25, "other": 2.0,
    }  # fmt: skip


def test_bad_model_override_is_reported_with_its_key(capsys):
    code = bench.main(["--nodes", "10", "--set", "num_message_passing_steps=0"])
    assert code == 2
    assert "'model.num_message_passing_steps' must be an integer >= 1" in capsys.readouterr().err


def test_bad_memory_budget_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--memory-budget", "lots"])
    assert "--memory-budget: 'lots' is not a size like 4GiB" in capsys.readouterr().err


def test_functions_timed_in_turn_alternate_round_by_round():
    calls = []
    timings = time_in_turn([lambda: calls.append("a"), lambda: calls.append("b")], 1, 3)
    assert "".join(calls) == "abababab"  # one warm-up round, then three timed ones
    assert [len(t.seconds) for t in timings] == [3, 3]
    assert all(len(t.page_faults) == 3 for t in timings)


def test_round_ratios_divide_the_same_rounds():
    a = Timing([0.2, 0.3, 0.9], [0.1, 0.3, 0.8])
    b = Timing([0.4, 0.6, 1.0], [0.4, 0.3, 1.0])
    assert round_ratios(a, b) == pytest.approx([0.5, 0.5, 0.9])
    assert round_ratios(a, b, cpu=True) == pytest.approx([0.25, 1.0, 0.8])
    with pytest.raises(ValueError, match="3 rounds against 1"):
        round_ratios(a, Timing([0.1], [0.1]))


def test_a_recomputed_step_is_timed_against_the_plain_one_round_by_round(tmp_path, capsys):
    out = tmp_path / "figures.json"
    args = ["--config", "tiny", "--nodes", "20", "--edges", "60", "--repeats", "2"]
    recompute = ["--set", "model.recompute=true", "--set", "model.factorized_edge_update=true"]
    recompute += ["--set", "model.keep_edge_term=true"]
    assert (
        bench.main([*args, "--warmup", "1", *recompute, "--against-plain", "--json", str(out)]) == 0
    )
    (record,) = json.loads(out.read_text())["records"]
    step, plain = record["step"]["seconds"], record["plain_step"]["seconds"]
    assert record["against_plain"] == pytest.approx([a / b for a, b in zip(step, plain)])
    assert "x it (rounds: " in capsys.readouterr().out


def test_against_plain_needs_a_recomputed_step_and_the_caching_allocator(capsys, monkeypatch):
    args = ["--config", "tiny", "--nodes", "20", "--edges", "60", "--repeats", "1"]
    assert bench.main([*args, "--warmup", "1", "--against-plain"]) == 2
    assert "give --set model.recompute=true" in capsys.readouterr().err
    # memory first: this process runs the system allocator, under which the plain step is not
    # the one training runs
    memory_first = ["--set", "model.recompute=true", "--against-plain"]
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "false")
    assert bench.main([*args, "--warmup", "1", *memory_first]) == 2
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--against-plain", "--memory"])
    assert "without --memory" in capsys.readouterr().err


def test_memory_passes_add_two_tensors_onto_the_last_pass():
    passes = bench.memory_passes_fn(rows=3, width=2, passes=5)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((3, 2), dtype=np.float32) for _ in "ab")
    assert passes.fn() == pytest.approx(5 * (a[0, 0] + b[0, 0]), rel=1e-5)
    assert passes.bytes == 5 * 4 * 3 * 2 * 4  # three tensors read and one written, a pass
    assert passes.what == "5 AddNs of three [3, 2] float32 tensors"
