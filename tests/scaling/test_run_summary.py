"""The one-run summary, on a synthetic run with literal timings."""

import json

import pytest

from hvdtrack.scaling.report import write_summary
from tests.scaling.conftest import write_synthetic_run


def test_summary_by_hand(tmp_path):
    # 2 ranks, 3 epochs; epoch 1 is warm-up: epoch time = median(max(11, 12), max(9, 10)) = 11.
    run = write_synthetic_run(
        tmp_path / "run",
        2,
        epoch_s=[[30, 31], [11, 12], [9, 10]],
        step_s=[5, 5, 1, 1, 1, 2],
        batch_graphs=2,
        energy={"joules": 1100.0, "seconds": 110.0, "source": "estimate", "watts": 10.0},
    )
    md = write_summary(run)
    s = json.loads(md.with_suffix(".json").read_text())
    assert s["epoch_s"] == 11.0
    # Per epoch each rank did 2 steps x 2 graphs x 100 edges: 800 edges over both ranks.
    assert s["edges_per_s"] == pytest.approx(800 / 11)
    assert s["edges_per_s_per_worker"] == pytest.approx(400 / 11)
    # 2 GPUs x 11 s at $3/h; energy 1100 J / 110 s = 10 W x 11 s.
    assert s["cost_per_epoch"] == pytest.approx(2 * 11 / 3600 * 3.0)
    assert s["energy_per_epoch_j"] == pytest.approx(110.0)
    # Warm-up steps (first 2 of every rank) left out; slowest rank adds 0.001 s.
    assert s["step_statistics"]["total_s"]["count"] == 4
    assert s["step_statistics"]["total_s"]["max"] == pytest.approx(2.001)
    text = md.read_text()
    assert "| 11.00 |" in text and "(estimate)" in text
    assert [row["epoch"] for row in s["epoch_table"]] == [1, 2, 3]
