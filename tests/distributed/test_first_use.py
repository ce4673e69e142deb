"""The design card's command under real horovodrun, in a fresh directory: exactly one rank prepares
the missing dataset (before Horovod starts), the other waits for it, and the run finishes."""

import json
import subprocess
import sys

import pytest

from tests.launch import BIN, worker_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_horovodrun_two_ranks_prepare_once_then_train(tmp_path):
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo"]
    cmd += [sys.executable, "-m", "hvdtrack.train", "--config", "tiny"]
    cmd += ["distributed.strategy=horovod", "train.epochs=1", "train.progress_bar=false"]
    result = subprocess.run(
        cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = (result.stdout + result.stderr).splitlines()
    said = [line for line in output if "preparing" in line]
    # horovodrun prefixes each line with [rank]<stream>: rank 0 prepared, once.
    assert said == [
        "[0]<stdout>:[hvdtrack] dataset data/tiny not found: preparing it (6 events) ..."
    ], said
    assert len([line for line in output if "dataset data/tiny prepared in" in line]) == 1
    assert (tmp_path / "data/tiny/manifest.json").is_file()
    info = json.loads((tmp_path / "runs/tiny/run.json").read_text())
    assert info["status"] == "finished" and info["num_workers"] == 2


def test_rank0_failing_to_prepare_ends_the_job(tmp_path):
    missing = tmp_path / "no-events"
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo"]
    cmd += [sys.executable, "-m", "hvdtrack.train", "--config", "trackml"]
    cmd += [f"data.trackml_dir={missing}", "distributed.strategy=horovod"]
    result = subprocess.run(
        cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0
    assert (
        f"[0]<stderr>:hvdtrack: error: {missing}: event directory does not exist" in result.stderr
    )
    # The waiting rank did not time out on its own: the launcher ended it after rank 0 failed.
    assert "was not ready after waiting" not in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()
