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
    saved_step,
    start_training,
    stop_at,
    tiny_training,
    unbounded,
    worker_pid,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
MORE = 8  # optimizer steps the rerun goes past the signal's checkpoint (two epochs)


def train_args(dataset, run_dir, *overrides):
    # Unbounded epochs: only the signal (or stop_after_steps) ends the run, however fast.
    return tiny_training(dataset, run_dir, *unbounded("train.batch_graphs=1", *overrides))


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
    stopped = saved_step(run_dir)
    assert f"after global step {stopped}," in output  # the checkpoint holds the signal's step

    # The same command resumes; it and an uninterrupted run stop at the same step.
    step = stopped + MORE
    check(horovodrun(2, train_args(tiny_dataset, run_dir, stop_at(run_dir, step))))
    straight = tmp_path / "straight"
    check(horovodrun(2, train_args(tiny_dataset, straight, stop_at(straight, step))))
    assert saved_step(run_dir) == saved_step(straight) == step
    assert_same_weights(checkpoint_weights(run_dir), checkpoint_weights(straight))
    records = [json.loads(line) for line in open(run_dir / "timing.jsonl")][1:]
    steps = [(r["epoch"], r["step"], r["rank"]) for r in records if r["kind"] == "step"]
    assert len(steps) == len(set(steps)) == step * 2  # every step of both ranks, once
