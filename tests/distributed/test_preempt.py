"""SIGTERM to one rank of a running ``horovodrun -np 2`` job: every rank checkpoints after the
same step and exits with the documented code, and the rerun ends with the weights of a run that
was never interrupted."""

import json
import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.train.loop import PREEMPTED_EXIT_CODE
from tests.launch import check, horovodrun, start_training, tiny_training, worker_pid

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def train_args(dataset, run_dir):
    return tiny_training(dataset, run_dir, "train.epochs=40", "train.batch_graphs=1")


def weights(run_dir):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model/"))
    assert names
    return {n: reader.get_tensor(n) for n in names}


def test_sigterm_checkpoints_every_rank_and_the_rerun_resumes_exactly(tiny_dataset, tmp_path):
    run_dir = tmp_path / "preempted"
    job = start_training(2, train_args(tiny_dataset, run_dir), run_dir)
    os.kill(worker_pid(run_dir, 1), signal.SIGTERM)
    output, _ = job.communicate(timeout=120)
    assert job.returncode != 0, output
    assert f"Process 1 exit with status code {PREEMPTED_EXIT_CODE}" in output, output
    assert f"Process 0 exit with status code {PREEMPTED_EXIT_CODE}" in output, output
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "stopped" and info["stopped_by"] == "signal"
    assert "stopped by a signal (on another rank)" in output  # rank 0 learnt it at the exchange

    check(horovodrun(2, train_args(tiny_dataset, run_dir)))  # the same command resumes
    straight = tmp_path / "straight"
    check(horovodrun(2, train_args(tiny_dataset, straight)))
    resumed, expected = weights(run_dir), weights(straight)
    assert resumed.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(resumed[name], expected[name], rtol=1e-6, atol=1e-7)
    records = [json.loads(line) for line in open(run_dir / "timing.jsonl")][1:]
    steps = [(r["epoch"], r["step"], r["rank"]) for r in records if r["kind"] == "step"]
    assert len(steps) == len(set(steps)) == 40 * 4 * 2  # every step of both ranks, once
