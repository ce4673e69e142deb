"""A stop signal that comes before the first step (while Python, the dataset check and
TensorFlow start) is kept for it: the run checkpoints after step 1 and exits with 75, instead
of dying of the signal's default action (which had killed SLURM ranks signalled early)."""

import json
import signal
import subprocess
import sys
import time

import pytest

from hvdtrack.distributed.stop import PREEMPTED_EXIT_CODE
from tests.launch import tiny_training


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_signal_before_the_first_step_stops_after_it(tiny_dataset, tmp_path, sig):
    run_dir = tmp_path / "run"
    command = [sys.executable, *tiny_training(tiny_dataset, run_dir, strategy="local")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)  # importing hvdtrack.train, long before TensorFlow has started
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, output
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "stopped" and info["stopped_by"] == "signal"
    assert f"stopped by a signal ({sig.name} here) after global step 1" in output
    assert any((run_dir / "checkpoints").iterdir())
