"""evaluate's threshold, output and run status (issue 27): the threshold reaches every
thresholded figure and is range-checked; a read-only run is refused at once at its default
output and evaluates with --output; an unfinished run is evaluated with a warning. reconstruct
and export refuse an output they cannot write before any work."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hvdtrack.errors import ConfigError
from hvdtrack.evaluate.__main__ import main as evaluate
from hvdtrack.evaluate.run import evaluate_run


@contextlib.contextmanager
def immutable(directory: Path):
    """``directory`` cannot be written while in the block, even by root (chattr +i)."""
    done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {done.stderr.decode().strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    """A copy of the trained tiny run without its evaluations (another test's may be there)."""
    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy, ignore=shutil.ignore_patterns("evaluate-*"))
    return copy


def test_the_threshold_reaches_edge_and_track_figures(tiny_run, tmp_path):
    low = evaluate_run(tiny_run, threshold=0.5, output=tmp_path / "at05")
    high = evaluate_run(tiny_run, threshold=0.9, output=tmp_path / "at09")
    assert (low["threshold"], high["threshold"]) == (0.5, 0.9)
    # The unsuffixed figures are the threshold's own, and equal its suffixed ones.
    assert high["edges"]["efficiency"] == high["edges"]["efficiency@0.9"]
    # (the tiny run's scores stay below 0.9: no edge kept, purity undefined)
    assert str(high["edges"]["purity"]) == str(high["edges"]["purity@0.9"])
    assert low["edges"]["efficiency"] == low["edges"]["efficiency@0.5"]
    assert high["edges"]["efficiency"] < low["edges"]["efficiency"]
    assert high["edges"]["purity"] != low["edges"]["purity"]
    # Tracks are built from the edges above the threshold too: fewer edges, other tracks.
    assert high["tracks"] != low["tracks"]
    written = json.loads((tmp_path / "at09/metrics.json").read_text())
    assert written["edges"]["efficiency"] == high["edges"]["efficiency"]


@pytest.mark.parametrize("value", ["2", "-1", "nan", "0", "1", "inf"])
def test_a_threshold_outside_0_1_is_refused_naming_the_option(tiny_run, tmp_path, value):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"^--threshold must be .* got "):
        evaluate(["--run", str(tiny_run), "--threshold", value, "--output", str(out)])
    assert not out.exists()


def test_a_read_only_run_is_refused_at_once_and_evaluates_with_output(run_copy, tmp_path):
    with immutable(run_copy):
        with pytest.raises(ConfigError, match=r"cannot write .*evaluate-test.* give --output DIR"):
            evaluate_run(run_copy)
        assert not (run_copy / "evaluate-test").exists()
        result = evaluate_run(run_copy, output=tmp_path / "elsewhere")
    out = tmp_path / "elsewhere"
    assert result["out"] == str(out)
    assert json.loads((out / "metrics.json").read_text())["edges"] == result["edges"]
    assert any((out / "tensorboard").iterdir()) and (out / "roc.png").exists()
    assert not (run_copy / "evaluate-test").exists()


def test_an_unfinished_run_is_evaluated_with_a_warning(run_copy, tmp_path, capsys):
    info = json.loads((run_copy / "run.json").read_text())
    assert info["status"] == "finished"
    out = ["--output", str(tmp_path / "out")]
    assert evaluate(["--run", str(run_copy), *out]) == 0
    assert "warning" not in capsys.readouterr().err
    info["status"] = "stopped"
    (run_copy / "run.json").write_text(json.dumps(info))
    best = next((run_copy / "best").glob("ckpt-*.index"))
    step = int(best.name.split(".")[0].split("-")[1])
    assert evaluate(["--run", str(run_copy), *out]) == 0
    err = capsys.readouterr().err
    assert "has not finished (run.json status: stopped)" in err
    assert f"evaluating its 'best' checkpoint of step {step}" in err


def test_reconstruct_and_export_refuse_an_output_they_cannot_write(run_copy, tmp_path):
    from hvdtrack.export.savedmodel import export_run
    from hvdtrack.reconstruct.run import reconstruct

    events = tmp_path / "no-events-read"  # refused before the events are looked at
    with immutable(run_copy):
        with pytest.raises(ConfigError, match=r"cannot write .*reconstruct.* give --out DIR"):
            reconstruct(run_copy, [str(events)])
        with pytest.raises(ConfigError, match=r"^--threshold must be"):
            reconstruct(run_copy, [str(events)], out=tmp_path / "r", threshold=1.5)
        with pytest.raises(ConfigError, match=r"cannot write .* give --out DIR"):
            export_run(run_copy, run_copy / "model")
    assert not (run_copy / "reconstruct").exists() and not (run_copy / "model").exists()
