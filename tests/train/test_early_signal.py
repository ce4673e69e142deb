"""A stop signal that comes before the first step (while Python, the dataset check and
TensorFlow start) is kept for it: the run checkpoints after step 1 and exits with 75, instead
of dying of the signal's default action (which had killed SLURM ranks signalled early)."""

import json
import signal
import subprocess
import sys
import time

import pytest

from hvdtrack.distributed.stop import PREEMPTED_EXIT_CODE, STOP_SIGNALS
from tests.launch import tiny_training


def caught_signals(pid: int) -> int:
    """The signals ``pid`` has handlers for (SigCgt of /proc/PID/status, a bit mask)."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("SigCgt:"))
    return int(line.split()[1], 16)


# SIGUSR1 (SLURM's --signal) in the default run; SIGTERM's handler is the same, and
# tests/distributed/test_preempt.py sends it mid-run.
@pytest.mark.parametrize(
    "sig", [signal.SIGUSR1, pytest.param(signal.SIGTERM, marks=pytest.mark.extended)]
)
def test_a_signal_before_the_first_step_stops_after_it(tiny_dataset, tmp_path, sig):
    run_dir = tmp_path / "run"
    command = [sys.executable, *tiny_training(tiny_dataset, run_dir, strategy="local")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # The signal goes as soon as the kernel shows the stop handlers installed (the first thing
    # `python -m hvdtrack.train` does), not after a sleep: on any machine it lands while the
    # config, dataset check and TensorFlow import are still ahead of step 1.
    wanted = sum(1 << (s - 1) for s in STOP_SIGNALS)
    deadline = time.monotonic() + 120
    while caught_signals(proc.pid) & wanted != wanted:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no stop handlers after 120 s"
        time.sleep(0.005)
    # Frozen at once, so that what it has loaded is what it has when the signal comes (about
    # 2 s of imports lie between the handlers and TensorFlow here; polling takes 5 ms).
    proc.send_signal(signal.SIGSTOP)
    with open(f"/proc/{proc.pid}/maps") as maps:
        loaded = maps.read()
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    assert "tensorflow" not in loaded, "the signal would come after TensorFlow started"
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, output
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "stopped" and info["stopped_by"] == "signal"
    assert f"stopped by a signal ({sig.name} here) after global step 1" in output
    assert any((run_dir / "checkpoints").iterdir())
