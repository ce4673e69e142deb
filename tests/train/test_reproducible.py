"""Same seed, same result (issue 27): the tiny config trained twice by the same command gives
bit-identical final weights, as 1 worker and as 2 Horovod workers under horovodrun.

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
def test_two_horovod_workers_trained_twice_give_the_same_weights(tiny_dataset, tmp_path):
    # One graph per worker and step (4 steps an epoch), and a checkpoint requested by the
    # clock at every step (checkpoint_every_minutes): what only a long run does by itself.
    overrides = ("train.epochs=3", "train.batch_graphs=1", "train.checkpoint_every_minutes=0.0001")
    runs = []
    for name in ("first", "second"):
        run_dir = tmp_path / name
        check(horovodrun(2, tiny_training(tiny_dataset, run_dir, *overrides), timeout=600))
        runs.append(checkpoint_weights(run_dir))
    _same_bits(*runs)
