"""`python -m hvdtrack.train --config tiny` in an empty directory prepares data/tiny, then trains."""

import json
import subprocess
import sys

import pytest

from hvdtrack.entry import ALLOCATOR, SUPPLIED
from tests.launch import worker_env

pytestmark = pytest.mark.slow


def train(cwd, *args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "hvdtrack.train", *args],
        cwd=cwd,
        env=env or worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_train_prepares_the_missing_dataset_then_trains(tmp_path):
    result = train(tmp_path, "--config", "tiny", "train.epochs=1", "train.progress_bar=false")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    said = [line for line in lines if "preparing" in line]
    assert said == ["[hvdtrack] dataset data/tiny not found: preparing it (6 events) ..."]
    assert (tmp_path / "data/tiny/manifest.json").is_file()
    assert (tmp_path / "data/tiny/prepare.json").is_file()
    assert not [p for p in (tmp_path / "data").iterdir() if p.name.startswith(".")]  # no staging
    info = json.loads((tmp_path / "runs/tiny/run.json").read_text())
    assert info["status"] == "finished" and info["config_name"] == "tiny"


def test_a_memory_first_model_trains_with_the_system_allocator_and_says_so(tmp_path):
    env = worker_env()
    env.pop(ALLOCATOR, None)  # the test session's own choice would win over the command's
    env.pop(SUPPLIED, None)
    model = ["model.factorized_edge_update=true", "model.recompute=true"]
    # auto: tiny's graphs keep the edge term in this machine's memory (speed first), and the
    # run records the resolved value, which a resume compares (the same as an explicit true,
    # not run again here: one training less in the default run)
    for keep, allocator, kept in [("false", "system", False), ("auto", "caching", True)]:
        run_dir = tmp_path / f"runs/keep-{keep}"
        result = train(
            tmp_path, "--config", "tiny", "train.epochs=1", "train.progress_bar=false",
            f"train.run_dir={run_dir}", *model, f"model.keep_edge_term={keep}", env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        info = json.loads((run_dir / "run.json").read_text())
        assert info["allocator"] == allocator
        assert info["config"]["model"]["keep_edge_term"] is kept
        said = "[hvdtrack] model.keep_edge_term auto: true (speed first): a process training"
        assert (said in result.stdout) == (keep == "auto")


def test_failed_preparation_stops_training_with_the_error(tmp_path):
    missing = tmp_path / "no-events"
    result = train(tmp_path, "--config", "trackml", f"data.trackml_dir={missing}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "[hvdtrack] dataset data/trackml-graphs not found: preparing it" in result.stdout
    assert "Traceback" not in result.stderr
    assert "hvdtrack: error: " in result.stderr and str(missing) in result.stderr
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())
