"""Same seed, same result (issue 27): the tiny config trained twice by the same command gives
bit-identical final weights, as 1 worker and as 2 Horovod workers under horovodrun (the
second of those with its progress shown: the log of a ``horovodrun -np 2`` run reads like an HPC
log, plain lines, progress from rank 0).

The commands run as users run them (``python -m hvdtrack.train``), so with the process settings
of ``hvdtrack.entry`` (TensorFlow's oneDNN kernels off: with them a process of a 2-rank job
computed one of two gradients for the same batch and weights)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.launch import REPO, check, checkpoint_weights, horovodrun, tiny_training, worker_env


def _same_bits(first: dict, second: dict) -> None:
    assert first.keys() == second.keys()
    for name in first:
        assert np.array_equal(first[name], second[name]), f"{name} differs"


def _train_alone(dataset, run_dir) -> dict:
    done = subprocess.run(
        [sys.executable, *tiny_training(dataset, run_dir, "train.epochs=3", strategy="local")],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    check(done)
    return checkpoint_weights(run_dir)


def test_one_worker_trained_twice_gives_the_same_weights(tiny_dataset, tmp_path):
    first = _train_alone(tiny_dataset, tmp_path / "first")
    second = _train_alone(tiny_dataset, tmp_path / "second")
    _same_bits(first, second)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_horovod_workers_trained_twice_give_the_same_weights(tiny_dataset, tmp_path):
    # One graph per worker and step (4 steps an epoch), and a checkpoint requested by the
    # clock at every step (checkpoint_every_minutes): what only a long run does by itself.
    overrides = ("train.epochs=3", "train.batch_graphs=1", "train.checkpoint_every_minutes=0.0001")
    # The second run shows its progress (a line at every step but an epoch's last): what is
    # printed does not change the numbers, and the log reads like an HPC log.
    progress = ("train.progress_bar=true", "train.progress_interval_s=0.001")
    runs = []
    for name, shown in (("first", ()), ("second", progress)):
        run_dir = tmp_path / name
        job = horovodrun(2, tiny_training(tiny_dataset, run_dir, *overrides, *shown), timeout=600)
        check(job)
        runs.append(checkpoint_weights(run_dir))
    _same_bits(*runs)
    _reads_like_an_hpc_log(job.stdout + job.stderr, epochs=3)


def _reads_like_an_hpc_log(log: str, epochs: int) -> None:
    """Plain lines (no carriage returns), progress and epoch lines from rank 0 only."""
    assert "\r" not in log
    progress = [line for line in log.splitlines() if " step " in line and " eta " in line]
    assert progress, log
    assert all(line.startswith("[0]<stderr>:[hvdtrack] epoch ") for line in progress), progress
    lines = [line for line in log.splitlines() if "train loss" in line]
    assert len(lines) == epochs and all(line.startswith("[0]<") for line in lines), lines
    assert not [line for line in log.splitlines() if line.startswith("[1]<") and "hvdtrack" in line]
