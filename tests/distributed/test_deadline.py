"""A rank that dies (kill -9) or stops answering (SIGSTOP) ends a two-worker job within the
deadline, with a message naming it, under every launcher: horovodrun with Gloo or MPI, plain
mpirun, and MultiWorkerMirroredStrategy (two processes and TF_CONFIG, no launcher)."""

import os
import signal
import time

import pytest

from tests.launch import start_job, tiny_training, wait_for_file

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
extended = pytest.mark.extended
DEADLINE = 10
# Past the deadline: the launcher's teardown (mpirun waits a few seconds before SIGKILL) and a
# loaded machine. Without a deadline a stopped rank holds MPI jobs for ever.
MARGIN = 50
FAULTS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def train_args(dataset, run_dir, launcher):
    strategy = "multiworker" if launcher == "multiworker" else "horovod"
    return tiny_training(
        dataset,
        run_dir,
        "train.epochs=500",
        f"distributed.deadline_s={DEADLINE}",
        strategy=strategy,
    )


# What names the lost rank: our heartbeat (Horovod), TensorFlow's (MultiWorker), or the launcher
# when it ends the job first (a killed rank under horovodrun or mpirun).
NAMED = (
    "rank 1 has not answered",
    "rank 1 ended without finishing",
    "worker 1 sent no heartbeat",
    "worker 1 is gone",
    "Process 1 exit with status code",
    "process rank 1 with PID",
)


# The default run covers each launcher once and each fault twice; the rest are extended.
DEFAULT_CASES = {("gloo", "kill"), ("mpirun", "kill"), ("mpi", "stop"), ("multiworker", "stop")}
CASES = [
    pytest.param(launcher, fault, marks=() if (launcher, fault) in DEFAULT_CASES else extended)
    for launcher in ("gloo", "mpi", "mpirun", "multiworker")
    for fault in sorted(FAULTS)
]


@pytest.mark.parametrize("launcher,fault", CASES)
def test_a_lost_rank_ends_the_job_within_the_deadline(launcher, fault, tiny_dataset, tmp_path):
    run_dir = tmp_path / "run"
    job = start_job(launcher, 2, train_args(tiny_dataset, run_dir, launcher), tmp_path / "logs")
    try:
        wait_for_file(run_dir / "timing.jsonl", job)  # training is under way
        victim = job.pid(1, run_dir)
        os.kill(victim, FAULTS[fault])
        started = time.monotonic()
        code = job.wait(DEADLINE + MARGIN, besides=1)  # no launcher stops a stopped worker
        took = time.monotonic() - started
    finally:
        job.kill()
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass
    output = job.output()
    assert code not in (None, 0), f"exit {code} after {took:.0f} s\n{output[-3000:]}"
    assert any(name in output for name in NAMED), output[-3000:]
    if fault == "stop":  # only our heartbeats see a silent rank: their one-line error
        assert "hvdtrack: error: rank 0:" in output, output[-3000:]
