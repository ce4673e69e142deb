"""``hvdtrack bench stages`` (pipeline parallelism): the rows it measures and writes, and its
old name ``pipeline`` still accepted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_the_stages_bench_writes_one_row_per_stage_and_micro_batch_count(tmp_path):
    out = tmp_path / "rows.json"
    args = ["--stages", "1", "2", "--micro-batches", "1", "2", "--graphs", "2", "--nodes", "40"]
    args += ["--edges", "80", "--repeats", "1", "--json", str(out)]
    # The old name of the bench: accepted, with a line saying the new one.
    result = subprocess.run(
        [sys.executable, "-m", "hvdtrack.bench", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "hvdtrack bench: 'pipeline' is now 'stages'" in result.stderr
    rows = json.loads(out.read_text())
    assert [(r["stages"], r["micro_batches"]) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert rows[0]["speedup"] == 1.0 and rows[0]["idle"] == 0.0
    assert [r["gpipe"] for r in rows] == pytest.approx([0.0, 0.0, 0.5, 1 / 3])
    assert all(r["time_s"] > 0 for r in rows)
    assert "devices " in result.stdout and " S   M   time_s" in result.stdout
