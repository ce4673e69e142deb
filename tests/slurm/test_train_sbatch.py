"""run_scripts/slurm/prepare.sbatch and train.sbatch, unchanged and with their default sizes, on a
real one-node SLURM cluster: prepare, then 2 Horovod ranks started by ``srun --mpi=pmix``
(``--dependency=afterok``); a job with ``--time=1`` gets USR1 from SLURM before its limit
(``--signal=B:USR1@N``), checkpoints, requeues itself, and the rerun (its limit then raised, so
that it ends in one go on a loaded machine) resumes to the weights of a run never stopped;
``scancel`` checkpoints and ends the job without requeue; ``kill -9`` of one rank ends the job
within seconds (``--kill-on-bad-exit``)."""

import json
import os
import signal
import time
from datetime import datetime

import pytest

from tests.launch import REPO, assert_same_weights, checkpoint_weights
from tests.slurm.conftest import FINAL_STATES

pytestmark = [pytest.mark.slurm, pytest.mark.distributed, pytest.mark.slow]
# Deadlines below are for a machine shared with other work (with a load of 13 on the 2 cores an
# epoch of the run below took ~5 s).
SCRIPT = str(REPO / "run_scripts/slurm/train.sbatch")
# tiny: 8 training graphs, 2 ranks x 1 graph. SLURM checks time limits every 30 s and signals at
# the first check within N + 30 s of the limit: with --time=1 and --signal=B:USR1@10, 20-50 s
# after the start, while the 40 epochs still run (the batch shell holds the signal back until
# the ranks, maybe still starting, have installed their handler).
EPOCHS, STEPS_PER_EPOCH = 40, 4
LEAD_S = 10


def train_args(dataset, run_dir, epochs=EPOCHS):
    return [
        SCRIPT,
        "configs/tiny.yaml",
        f"data.dataset_dir={dataset}",
        f"train.run_dir={run_dir}",
        f"train.epochs={epochs}",
        "train.batch_graphs=1",
        "train.progress_bar=false",
        "distributed.deadline_s=300",  # a rank stalled a minute by other work is not dead
    ]


def submit(slurm, out, *args, **env):
    """train.sbatch's own #SBATCH lines size the job: 1 node, 2 ranks x 1 CPU."""
    return slurm.sbatch(f"--output={out}", *args, **env)


def when(text, pattern):
    """The wall-clock time of the first line holding ``pattern`` (the scripts print %T)."""
    line = next(line for line in text.splitlines() if pattern in line)
    return line.split("] ", 1)[1].split(" ", 1)[0]


def epoch_seconds(stamp):
    """scontrol's local time (2026-11-23T17:45:12) as seconds since the epoch."""
    return datetime.fromisoformat(stamp).timestamp()


def wait_for(path, job, slurm, timeout=240):
    deadline = time.monotonic() + timeout
    while not path.exists():
        fields = slurm.job(job)
        assert fields["JobState"] in ("PENDING", "RUNNING"), fields
        assert time.monotonic() < deadline, f"no {path} after {timeout} s: {fields}"
        time.sleep(0.2)


def rank_pid(run_dir, rank, timeout=60):
    """The pid of the training process of SLURM task ``rank`` writing to ``run_dir``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if (
                f"train.run_dir={run_dir}".encode() in cmdline
                and b"hvdtrack.train" in cmdline
                and f"SLURM_PROCID={rank}".encode() in environ
            ):
                return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"no task {rank} process for {run_dir}")


@pytest.fixture(scope="module")
def chain(slurm, tmp_path_factory):
    """prepare.sbatch, then a 2-rank train.sbatch run never stopped, submitted with
    ``--dependency=afterok`` on it: the dataset, the run directory and the jobs' output."""
    base = tmp_path_factory.mktemp("chain")
    dataset, run_dir = base / "data", base / "run"
    started = time.monotonic()
    prepare = slurm.sbatch(
        f"--output={base / 'prepare.out'}",
        str(REPO / "run_scripts/slurm/prepare.sbatch"),
        "configs/tiny.yaml",
        f"data.dataset_dir={dataset}",
    )
    train = submit(
        slurm, base / "train.out", f"--dependency=afterok:{prepare}", *train_args(dataset, run_dir)
    )
    fields = slurm.wait(prepare, timeout=240)
    assert fields["JobState"] == "COMPLETED", (base / "prepare.out").read_text()
    fields = slurm.wait(train, timeout=600)
    print(f"prepare -> train chain: {time.monotonic() - started:.1f} s from sbatch to the end")
    output = (base / "train.out").read_text()
    assert fields["JobState"] == "COMPLETED", output
    return dataset, run_dir, output


def test_prepare_then_two_horovod_ranks_started_by_srun_pmix(chain):
    dataset, run_dir, output = chain
    assert (dataset / "manifest.json").is_file()
    assert "srun --kill-on-bad-exit=1 --mpi=pmix" in output, output
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished", info
    assert (info["strategy"], info["num_workers"]) == ("horovod", 2)


def test_time_limit_signal_checkpoints_requeues_and_the_rerun_resumes_exactly(
    slurm, tmp_path, chain
):
    dataset, straight, _ = chain
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    job = submit(slurm, out, "--time=1", f"--signal=B:USR1@{LEAD_S}", *train_args(dataset, run_dir))
    first = slurm.wait(job, timeout=240, until=lambda f: f["JobState"] == "RUNNING")
    limit = epoch_seconds(first["EndTime"])  # StartTime + 1 minute
    signalled = slurm.wait(
        job,
        timeout=limit - time.time() + 90,
        until=lambda f: f["JobState"] in FINAL_STATES
        or (out.exists() and "SIGUSR1 received" in out.read_text()),
    )
    arrived = time.time()
    assert (
        signalled["JobState"] not in FINAL_STATES
    ), f"the run ended before SLURM signalled it: raise EPOCHS\n{out.read_text()}"
    requeued = slurm.wait(
        job, timeout=180, until=lambda f: f["Restarts"] != "0" or f["JobState"] in FINAL_STATES
    )
    requeued_at = time.time()
    assert requeued["Restarts"] == "1", (requeued, out.read_text())
    # The rerun may take minutes on a loaded machine: give it time to finish in one go rather
    # than be signalled and requeued again every minute.
    slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")
    slurm.wait(job, timeout=180, until=lambda f: "SLURM_RESTART_COUNT=1" in out.read_text())
    rerun_at = time.time()
    fields = slurm.wait(job, timeout=600)
    output = out.read_text()
    print(
        f"--time=1 --signal=B:USR1@{LEAD_S}: USR1 {limit - arrived:.1f} s before the limit "
        f"({arrived - epoch_seconds(first['StartTime']):.1f} s after the start; batch shell at "
        f"{when(output, 'SIGUSR1 received')}); signal -> requeued {requeued_at - arrived:.1f} s, "
        f"requeued -> rerun started {rerun_at - requeued_at:.1f} s, rerun "
        f"{time.time() - rerun_at:.1f} s"
    )
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, output)
    assert "stopped by a signal (SIGUSR1 here)" in output, output
    assert f"requeueing job {job}" in output, output
    assert "DUE TO TIME LIMIT" not in output, output  # stopped and requeued before it
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["stopped_by"] is None, info

    resumed, expected = checkpoint_weights(run_dir), checkpoint_weights(straight)
    assert_same_weights(resumed, expected)
    records = [json.loads(line) for line in open(run_dir / "timing.jsonl")][1:]
    steps = [(r["epoch"], r["step"], r["rank"]) for r in records if r["kind"] == "step"]
    assert len(steps) == len(set(steps)) == EPOCHS * STEPS_PER_EPOCH * 2  # each step once


def test_kill_9_of_one_rank_ends_the_job_within_seconds(slurm, tiny_dataset, tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    job = submit(slurm, out, *train_args(tiny_dataset, run_dir, epochs=200))
    wait_for(run_dir / "timing.jsonl", job, slurm)
    killed = time.monotonic()
    os.kill(rank_pid(run_dir, 1), signal.SIGKILL)
    fields = slurm.wait(job, timeout=30)
    print(f"kill -9 of task 1 -> job ended {time.monotonic() - killed:.1f} s")
    output = out.read_text()
    assert fields["JobState"] == "FAILED" and fields["Restarts"] == "0", (fields, output)
    assert "requeueing" not in output, output
    assert "task 1: Killed" in output, output


@pytest.mark.extended
def test_scancel_checkpoints_and_ends_the_job_without_requeue(slurm, tiny_dataset, tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    job = submit(slurm, out, *train_args(tiny_dataset, run_dir, epochs=200))
    wait_for(run_dir / "timing.jsonl", job, slurm)
    slurm.run("scancel", job)  # TERM to the batch shell and the ranks
    fields = slurm.wait(job, timeout=60)
    output = out.read_text()
    assert fields["JobState"] == "CANCELLED" and fields["Restarts"] == "0", (fields, output)
    assert "requeueing" not in output, output
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "stopped" and info["stopped_by"] == "signal", info
