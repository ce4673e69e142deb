"""SIGTERM to one rank of a running ``horovodrun -np 2`` job: every rank checkpoints after the
same step and exits with the documented code, and the rerun ends with the weights of a run that
was never interrupted."""

import json
import os
import re
import signal

import pytest

from hvdtrack.distributed.stop import PREEMPTED_EXIT_CODE
from tests.launch import (
    assert_same_weights,
    check,
    checkpoint_weights,
    horovodrun,
    start_training,
    tiny_training,
    worker_pid,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def train_args(dataset, run_dir):
    return tiny_training(dataset, run_dir, "train.epochs=40", "train.batch_graphs=1")


def test_sigterm_checkpoints_every_rank_and_the_rerun_resumes_exactly(tiny_dataset, tmp_path):
    run_dir = tmp_path / "preempted"
    job = start_training(2, train_args(tiny_dataset, run_dir), run_dir)
    os.kill(worker_pid(run_dir, 1), signal.SIGTERM)
    output, _ = job.communicate(timeout=120)
    assert job.returncode != 0, output
    # Both ranks stop after the same step with 75; whichever leaves first, horovodrun then
    # terminates the other (143) if it has not exited yet: both outcomes are right.
    codes = {r: re.search(rf"Process {r} exit with status code (\d+)", output) for r in (0, 1)}
    assert all(codes.values()), output
    codes = {r: int(m.group(1)) for r, m in codes.items()}
    assert PREEMPTED_EXIT_CODE in codes.values(), output
    assert set(codes.values()) <= {PREEMPTED_EXIT_CODE, 143}, output
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "stopped" and info["stopped_by"] == "signal"
    assert "stopped by a signal (on another rank)" in output  # rank 0 learnt it at the exchange

    check(horovodrun(2, train_args(tiny_dataset, run_dir)))  # the same command resumes
    straight = tmp_path / "straight"
    check(horovodrun(2, train_args(tiny_dataset, straight)))
    resumed, expected = checkpoint_weights(run_dir), checkpoint_weights(straight)
    assert_same_weights(resumed, expected)
    records = [json.loads(line) for line in open(run_dir / "timing.jsonl")][1:]
    steps = [(r["epoch"], r["step"], r["rank"]) for r in records if r["kind"] == "step"]
    assert len(steps) == len(set(steps)) == 40 * 4 * 2  # every step of both ranks, once
