"""A rank that stops answering ends a ``horovodrun -np 2`` job within the deadline, with a clear
message, instead of stalling the other rank for ever."""

import os
import signal
import time

import pytest

from tests.launch import REPO, rank_pid, start_training

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
DEADLINE = 10


def test_a_stopped_rank_ends_the_job_within_the_deadline(tiny_dataset, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "-m",
        "hvdtrack.train",
        "--config",
        str(REPO / "configs/tiny.yaml"),
        f"data.dataset_dir={tiny_dataset}",
        f"train.run_dir={run_dir}",
        "distributed.strategy=horovod",
        "train.epochs=500",
        "train.progress_bar=false",
        f"distributed.deadline_s={DEADLINE}",
    ]
    job = start_training(2, args, run_dir)
    stopped = rank_pid(run_dir, 1)
    os.kill(stopped, signal.SIGSTOP)  # alive, but answers nothing
    started = time.monotonic()
    try:
        output, _ = job.communicate(timeout=DEADLINE + 110)
    finally:
        try:
            os.kill(stopped, signal.SIGKILL)
        except ProcessLookupError:
            pass
    took = time.monotonic() - started
    assert job.returncode != 0
    assert took < DEADLINE + 100, took  # Horovod's stall inspector checks in coarse intervals
    assert "rank 0: Horovod shut down while this rank waited at a collective" in output, output
    assert f"distributed.deadline_s ({DEADLINE}.0 s)" in output
