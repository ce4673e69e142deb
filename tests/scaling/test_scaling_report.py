"""Reports from synthetic run directories: literal tables, files written, every bad input named."""

from __future__ import annotations

import csv
import json

import pytest

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.runs.timing import read_run
from hvdtrack.scaling import report
from hvdtrack.scaling.render import render_markdown
from hvdtrack.utils.io import write_json


def from_dirs(run_dirs):
    return [read_run(d) for d in run_dirs]


def test_strong_table_has_hand_computed_numbers(strong_runs, tmp_path):
    built = report.build_report(from_dirs(strong_runs))
    assert built.mode == "strong"
    # Epoch s: the slowest rank of the second epoch: 100, 55, 30 s.
    # Cost at $3 per GPU-hour: 1 x 100/3600 x 3 = $0.0833; 2 x 55/3600 x 3 = $0.0917;
    # 4 x 30/3600 x 3 = $0.100.
    # Energy: estimate 10 W x 1 x 100 s = 1.00 kJ; measured 24 W x 55 s = 1.32 kJ;
    # estimate 10 W x 4 x 30 s = 1.20 kJ.
    md = render_markdown(built)
    assert "| N | epoch s | speedup | efficiency | cost/epoch | energy/epoch |" in md
    assert "| 1 | 100.00 | 1.000 | 1.000 | $0.0833 | 1.00 kJ (estimate) |" in md
    assert "| 2 | 55.00 | 1.818 | 0.909 | $0.0917 | 1.32 kJ (rapl) |" in md
    assert "| 4 | 30.00 | 3.333 | 0.833 | $0.100 | 1.20 kJ (estimate) |" in md
    assert "energy marked 'estimate' is 10 W per device" in md


def test_step_detail_and_physics_tables(strong_runs):
    md = render_markdown(report.build_report(from_dirs(strong_runs)))
    # Non-warm-up steps: 1.0 s (N=1); 0.55 s + 1 ms of rank 1 (N=2).
    # Graphs per epoch: 2 steps x 8 graphs = 16 in 100 s (N=1); 2 ranks x 2 x 4 = 16 in 55 s (N=2).
    assert (
        "| 1 | 8 | 8 | 1.0000 | 0.0000 | 1.0000 | 1.0000 | 0.0100 | 0.0000 | 0.160 | 0.160 |" in md
    )
    assert (
        "| 2 | 4 | 8 | 0.5510 | 0.0000 | 0.5510 | 0.5510 | 0.0100 | 0.0000 | 0.291 | 0.145 |" in md
    )
    assert (
        "| 1 | 100.00 | 16.0 | $0.0833 | 1.00 kJ (estimate) | 0.0412 | 0.991 | 0.958 | 0.957 | n/a |"
        in md
    )


def test_every_file_is_written(strong_runs, tmp_path):
    paths = report.write_report(report.build_report(from_dirs(strong_runs)), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(report.REPORT_FILES)
    for kind in ("speedup_efficiency", "time_cost", "prediction"):
        assert paths[kind].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["n"] for r in rows] == ["1", "2", "4"]
    assert float(rows[1]["efficiency"]) == pytest.approx(100 / 110)
    assert float(rows[2]["cost_per_epoch"]) == pytest.approx(0.1)
    assert float(rows[0]["exchange_s"]) == 0.0
    data = json.loads(paths["json"].read_text())
    assert data["mode"] == "strong" and data["rows"][1]["speedup"] == pytest.approx(100 / 55)
    assert data["scaling_config"]["price_per_device_hour"] == 3.0
    assert [p["n"] for p in data["prediction"]["efficiency"]["nvlink"]] == [
        8,
        16,
        32,
        64,
        128,
        256,
        512,
        1024,
    ]
    assert [v["n"] for v in data["validation"]] == [2, 4]


def test_prediction_section_is_in_the_markdown(strong_runs):
    md = render_markdown(report.build_report(from_dirs(strong_runs)))
    assert "## Beyond this machine: predicted efficiency" in md
    assert "From the single-worker run: step without exchange 1000.00 ms = fixed " in md
    assert "4,000,000 gradient bytes per step. Step(N) = compute of the rank's share" in md
    assert "| N | nvlink (2400 Gb/s, 3 us) | infiniband-hdr (200 Gb/s, 2 us) |" in md
    assert "- N=2 (shared-memory): predicted efficiency" in md


def test_weak_table_with_the_studies_figures(tmp_path, synthetic_run):
    # Batch s 0.3436 on 1 worker and 0.476 on 32 (as the 2024 study's 34.36 s / 47.6 s epochs).
    one = synthetic_run(
        tmp_path / "weak-np1",
        1,
        epoch_s=[[40.0], [34.36]],
        step_s=[0.9, 0.9, 0.3436, 0.3436],
        batch_graphs=2,
    )
    many = synthetic_run(
        tmp_path / "weak-np32",
        32,
        epoch_s=[[50.0] * 32, [47.6] * 32],
        step_s=[0.9, 0.9, 0.445, 0.445],
        batch_graphs=2,
        metrics={"loss": 0.05, "auc": 0.99, "efficiency": 0.989, "purity": 0.956},
    )
    built = report.build_report(from_dirs([many, one]))  # order does not matter
    assert built.mode == "weak"
    # The slowest of 32 ranks adds 31 ms: 0.445 + 0.031 = 0.476 s; 0.3436 / 0.476 = 0.722.
    md = render_markdown(built)
    assert "| N | efficiency | edge eff. | purity | AUC | val loss | epoch s | batch s |" in md
    assert "| 1 | 1.000 | 0.958 | 0.957 | 0.991 | 0.0412 | 34.36 | 0.3436 |" in md
    assert "| 32 | 0.722 | 0.989 | 0.956 | 0.990 | 0.0500 | 47.60 | 0.4760 |" in md


def test_energy_power_is_total_joules_over_seconds(tmp_path, synthetic_run):
    # Two processes summed their joules (4800 J in 120 s: 40 W); watts is one process's 20 W.
    energy = {"joules": 4800.0, "seconds": 120.0, "watts": 20.0, "source": "rapl"}
    run = synthetic_run(
        tmp_path / "a",
        1,
        epoch_s=[[110.0], [100.0]],
        step_s=[1.0] * 4,
        batch_graphs=2,
        energy=energy,
    )
    (row,) = report.build_report(from_dirs([run])).table.itertuples()
    assert row.power_watts == 40.0 and row.energy_per_epoch_j == 4000.0  # 40 W x 100 s


def test_overrides_replace_the_runs_scaling_section(strong_runs):
    built = report.build_report(from_dirs(strong_runs), overrides={"price_per_device_hour": 36.0})
    assert [round(c, 6) for c in built.table["cost_per_epoch"]] == [1.0, 1.1, 1.2]


def test_short_runs_are_noted(tmp_path, synthetic_run):
    dirs = [
        synthetic_run(tmp_path / "a", 1, epoch_s=[[10.0]], step_s=[1.0] * 3, batch_graphs=2),
        synthetic_run(
            tmp_path / "b",
            2,
            epoch_s=[[6.0, 6.0]],
            step_s=[0.6] * 3,
            batch_graphs=1,
            global_batch_graphs=2,
        ),
    ]
    built = report.build_report(from_dirs(dirs))
    assert built.table["efficiency"][1] == pytest.approx(10 / 12)
    assert any("N=1: the run has no more epochs than" in note for note in built.notes)


# ------------------------------------------------------------------------------------ bad input
def test_missing_run_directory(strong_runs, tmp_path):
    with pytest.raises(DataError, match=r"run directory .*strong-np8 does not exist"):
        from_dirs([*strong_runs, tmp_path / "strong-np8"])


def test_unfinished_run(tmp_path, synthetic_run, strong_runs):
    running = synthetic_run(
        tmp_path / "strong-np8",
        8,
        epoch_s=[[20.0] * 8],
        step_s=[0.2] * 4,
        batch_graphs=1,
        status="running",
    )
    with pytest.raises(DataError, match=r"run .*strong-np8 is not finished \(status 'running'\)"):
        report.build_report([*strong_runs, running])


def test_mixed_configs_name_the_key(tmp_path, synthetic_run, strong_runs, base_config):
    config = {**base_config, "model": {"hidden": 128, "iterations": 4}}
    other = synthetic_run(
        tmp_path / "other-np8",
        8,
        epoch_s=[[20.0] * 8],
        step_s=[0.2] * 4,
        batch_graphs=1,
        config=config,
    )
    with pytest.raises(
        ConfigError,
        match=r"runs of different configs in one report: 'model.hidden' is 64 in .*strong-np1 "
        r"\(N=1\) but 128 in .*other-np8 \(N=8\)",
    ):
        report.build_report(from_dirs([*strong_runs, other]))


def test_runs_differing_only_in_varying_keys_are_comparable(
    tmp_path, synthetic_run, strong_runs, base_config
):
    # The run directory, the per-worker batch and the scaling section may differ.
    config = {**base_config, "scaling": {"price_per_device_hour": 9.0}}
    other = synthetic_run(
        tmp_path / "other-np8",
        8,
        epoch_s=[[20.0] * 8],
        step_s=[0.2] * 4,
        batch_graphs=1,
        config=config,
    )
    assert list(report.build_report(from_dirs([*strong_runs, other])).table["n"]) == [1, 2, 4, 8]


def test_a_run_without_config_is_refused(strong_runs):
    runs = from_dirs(strong_runs)
    runs[1].info["config"] = None
    with pytest.raises(
        ConfigError,
        match=r"'distributed.strategy' is 'horovod' in .*strong-np1 \(N=1\) but '<absent>'",
    ):
        report.build_report(runs)


def test_no_single_worker_baseline(strong_runs):
    with pytest.raises(
        DataError, match=r"strong-scaling report needs a single-worker baseline .*got N = 2, 4"
    ):
        report.build_report(from_dirs(strong_runs[1:]))


def test_two_runs_with_the_same_worker_count(strong_runs, tmp_path, synthetic_run):
    again = synthetic_run(
        tmp_path / "again", 2, epoch_s=[[60.0, 60.0]], step_s=[0.6] * 4, batch_graphs=4
    )
    with pytest.raises(DataError, match=r"two runs with N=2: .*strong-np2 and .*again"):
        report.build_report(from_dirs([*strong_runs, again]))


def test_strong_mode_with_different_global_batches(tmp_path, synthetic_run):
    dirs = [
        synthetic_run(tmp_path / "a", 1, epoch_s=[[10.0]], step_s=[1.0] * 4, batch_graphs=2),
        synthetic_run(tmp_path / "b", 2, epoch_s=[[10.0, 10.0]], step_s=[1.0] * 4, batch_graphs=2),
    ]
    with pytest.raises(
        ConfigError,
        match=r"strong scaling keeps the global batch fixed, .*did you mean --mode weak",
    ):
        report.build_report(from_dirs(dirs), mode="strong")


def test_mode_cannot_be_inferred(tmp_path, synthetic_run):
    dirs = [
        synthetic_run(tmp_path / "a", 1, epoch_s=[[10.0]], step_s=[1.0] * 4, batch_graphs=2),
        synthetic_run(tmp_path / "b", 2, epoch_s=[[10.0, 10.0]], step_s=[1.0] * 4, batch_graphs=3),
    ]
    with pytest.raises(ConfigError, match="cannot tell strong from weak scaling"):
        report.build_report(from_dirs(dirs))


def test_nan_metrics_are_na_in_markdown_and_null_in_json(tmp_path, synthetic_run):
    metrics = {"loss": 0.3, "auc": 0.5, "efficiency": 0.0, "purity": float("nan")}
    run = synthetic_run(
        tmp_path / "a", 1, epoch_s=[[10.0]], step_s=[1.0] * 4, batch_graphs=2, metrics=metrics
    )
    built = report.build_report(from_dirs([run]))
    assert "| 0.3000 | 0.500 | 0.000 | n/a | n/a |" in render_markdown(built)
    write_json(tmp_path / "report.json", report._json(built))  # as write_report writes it
    with open(tmp_path / "report.json") as f:  # a strict parser: NaN or Infinity raise
        data = json.load(f, parse_constant=lambda c: 1 / 0)
    assert data["rows"][0]["purity"] is None and data["rows"][0]["edge_efficiency"] == 0.0
