"""The kernels bench times each kernel and what it replaced in turn, from the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hvdtrack.bench import kernels as bench
from hvdtrack.model.kernels import fused_kernels


@pytest.mark.skipif(fused_kernels() is None, reason="no kernel library here")
def test_every_case_is_timed_against_what_it_replaced(tmp_path):
    out = tmp_path / "kernels.json"
    done = subprocess.run(
        [sys.executable, "-m", "hvdtrack.bench", "kernels", "--rows", "40", "--calls", "3",
         "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    printed = done.stdout
    assert "40 rows, 1 thread(s)" in printed and "3 calls of each in turn" in printed
    figures = json.loads(out.read_text())
    assert figures["isa"] in ("avx512", "avx2", "none")
    assert f"vector code {figures['isa']}" in printed
    assert [r["case"] for r in figures["records"]] == list(bench.CASES)
    for record in figures["records"]:
        assert f"{record['case']} " in printed
        for side in ("kernel_ms", "before_ms"):
            assert 0 < record[side]["min"] <= record[side]["median"]
        ratio = record["ratio"]
        assert 0 < ratio["q25"] <= ratio["median"] <= ratio["q75"]


def test_bad_arguments_are_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--rows", "4"])
    assert exit_.value.code == 2
    assert "--rows must be >= 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--cases", "softmax"])
    assert "invalid choice: 'softmax'" in capsys.readouterr().err
