"""Runs of several training modes in one report: each scaled on its own, then compared."""

from __future__ import annotations

import csv
import json

import pytest

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.runs.timing import read_run
from hvdtrack.scaling import report
from hvdtrack.scaling.render import render_markdown

SUBGRAPHS = {"loss": 0.05, "auc": 0.98, "efficiency": 0.93, "purity": 0.95}


@pytest.fixture
def mode_runs(tmp_path, synthetic_run, strong_runs, base_config):
    """The strong sweep in whole graphs, subgraph mini-batches at N = 1, 2 and a pipeline of
    2 stages x 5 micro-batches at N = 2 only (no baseline); all with global batch 8."""
    sub = {**base_config, "train": {**base_config["train"], "subgraphs": {"enabled": True}}}
    pipe = {**base_config, "distributed": {"strategy": "horovod", "pipeline": {"stages": 2}}}
    runs = [
        synthetic_run(
            tmp_path / f"sub-np{n}",
            n,
            epoch_s=epoch_s,
            step_s=[1.0] * 4,
            batch_graphs=8 // n,
            config=sub,
            metrics=SUBGRAPHS,
            info={"input_mode": "subgraphs"},
        )
        for n, epoch_s in ((1, [[60.0], [40.0]]), (2, [[30.0, 30.0], [25.0, 24.0]]))
    ]
    runs.append(
        synthetic_run(
            tmp_path / "pipe-np2",
            2,
            epoch_s=[[70.0, 70.0], [50.0, 50.0]],
            step_s=[1.0] * 4,
            batch_graphs=4,
            config=pipe,
            info={"input_mode": "graphs", "pipeline": {"stages": 2, "micro_batches": 5}},
        )
    )
    return [*strong_runs, *runs]


def test_each_mode_against_its_own_baseline_and_one_comparison(mode_runs):
    built = report.build_report(mode_runs)
    assert list(built.table["training_mode"].unique()) == [
        "graphs",
        "graphs, stages 2x5",
        "subgraphs",
    ]
    md = render_markdown(built)
    # Whole graphs as before: 100, 55, 30 s.
    assert "### Training mode: graphs\n\n| N | epoch s | speedup | efficiency |" in md
    assert "| 2 | 55.00 | 1.818 | 0.909 | $0.0917 | 1.32 kJ (rapl) |" in md
    # Subgraphs: 40 s on 1 worker, 25 s on 2: speedup 1.6, efficiency 40 / (2 x 25) = 0.8;
    # cost 2 x 25/3600 x $3 = $0.0417, energy 10 W x 2 x 25 s = 500 J.
    assert "| 2 | 25.00 | 1.600 | 0.800 | $0.0417 | 500 J (estimate) |" in md
    # The pipeline: no N=1 run, so no speedup or efficiency; 2 workers x 2 stages = 4 devices:
    # 4 x 50/3600 x $3 = $0.167, 10 W x 4 x 50 s = 2.00 kJ.
    assert "| 2 | 50.00 | n/a | n/a | $0.167 | 2.00 kJ (estimate) |" in md
    assert "graphs, stages 2x5: no N=1 run, so no speedup or efficiency" in md
    # Compared per (mode, N): edges per epoch 2 steps x 8 graphs x 100 over the workers.
    assert "| mode | N | epoch s | edges/s | cost/epoch | energy/epoch | val loss | AUC |" in md
    assert "| graphs | 1 | 100.00 | 16.0 | $0.0833 | 1.00 kJ (estimate) | 0.0412 | 0.991 |" in md
    assert (
        "| graphs, stages 2x5 | 2 | 50.00 | 32.0 | $0.167 | 2.00 kJ (estimate) | 0.0412 | 0.991 "
        "| 0.958 | 0.957 |" in md
    )
    assert "| subgraphs | 1 | 40.00 | 40.0 | $0.0333 | 400 J (estimate) | 0.0500 | 0.980 " in md
    assert "| subgraphs | 2 | 25.00 | 64.0 | $0.0417 | 500 J (estimate) | 0.0500 | 0.980 " in md


def test_on_cpu_cores_a_pipelines_stages_share_the_workers_devices(mode_runs):
    # The stages are logical devices on the worker's cores: 2 workers x 1 core, not x 2 stages.
    built = report.build_report(mode_runs, overrides={"device_kind": "cpu-core"})
    md = render_markdown(built)
    # 2 x 50/3600 x $3 = $0.0833, 10 W x 2 x 50 s = 1.00 kJ
    assert "| 2 | 50.00 | n/a | n/a | $0.0833 | 1.00 kJ (estimate) |" in md


def test_mode_columns_in_the_files(mode_runs, tmp_path):
    paths = report.write_report(report.build_report(mode_runs), tmp_path / "o")
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [(r["training_mode"], r["n"]) for r in rows][-3:] == [
        ("graphs, stages 2x5", "2"),
        ("subgraphs", "1"),
        ("subgraphs", "2"),
    ]
    data = json.loads(paths["json"].read_text())
    assert data["rows"][3]["efficiency"] is None and data["rows"][3]["devices"] == 4
    assert data["rows"][5]["efficiency"] == pytest.approx(0.8)
    assert "predictions from the 'graphs' runs" in data["notes"]


def test_other_differences_between_modes_are_refused(
    mode_runs, tmp_path, synthetic_run, base_config
):
    config = {**base_config, "model": {"hidden": 128, "iterations": 4}}
    config["train"] = {**config["train"], "subgraphs": {"enabled": True}}
    other = synthetic_run(
        tmp_path / "sub-np4",
        4,
        epoch_s=[[20.0] * 4],
        step_s=[0.2] * 4,
        batch_graphs=2,
        config=config,
        info={"input_mode": "subgraphs"},
    )
    with pytest.raises(ConfigError, match=r"'model.hidden' is 64 in .*strong-np1 .* 128 in"):
        report.build_report([*mode_runs, other])


def test_two_runs_of_one_mode_and_n_are_refused(mode_runs, tmp_path, synthetic_run):
    config = json.loads((mode_runs[-1] / "run.json").read_text())["config"]
    again = synthetic_run(
        tmp_path / "again",
        2,
        epoch_s=[[9.0, 9.0]],
        step_s=[1.0] * 4,
        batch_graphs=4,
        config=config,
        info={"pipeline": {"stages": 2, "micro_batches": 5}},
    )
    with pytest.raises(DataError, match=r"two runs with N=2: .*pipe-np2 and .*again"):
        report.build_report([*mode_runs, again])


def test_the_mode_label_reads_stages_and_the_old_pipeline_field(tmp_path, synthetic_run):
    # run.json records ``stages: {num_stages, micro_batches}``; runs written before the rename
    # recorded ``pipeline: {stages, micro_batches}``: both give the same label.
    infos = {
        "new": {"input_mode": "subgraphs", "stages": {"num_stages": 4, "micro_batches": 8}},
        "old": {"input_mode": "subgraphs", "pipeline": {"stages": 4, "micro_batches": 8}},
        "plain": {"input_mode": "graphs", "stages": None},
    }
    labels = {
        name: report.training_mode(
            read_run(
                synthetic_run(
                    tmp_path / name, 1, epoch_s=[[10.0]], step_s=[1.0], batch_graphs=2, info=info
                )
            )
        )
        for name, info in infos.items()
    }
    assert labels == {
        "new": "subgraphs, stages 4x8",
        "old": "subgraphs, stages 4x8",
        "plain": "graphs",
    }
