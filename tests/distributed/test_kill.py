"""``kill -9`` of a rank of a running ``horovodrun -np 2`` job, at several moments: the job ends
with an error within the deadline, and running it again (to a fixed step) ends with the weights
of a run that was never interrupted, every step recorded once. Killing the chief
(which writes the checkpoints and run.json) checks that what it leaves is always a consistent
place to resume from."""

import json
import os
import random
import signal
import time

import pytest

from tests.launch import (
    assert_same_weights,
    check,
    checkpoint_weights,
    horovodrun,
    saved_step,
    start_job,
    stop_at,
    tiny_training,
    unbounded,
    wait_for_file,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
# distributed.deadline_s of the faulted run: 20 s, not the smallest allowed (10 s), because a
# healthy rank's heartbeat once went unanswered for 10 s on this 2-core machine at load 13.
DEADLINE = 20
# Past the deadline for the launcher's teardown and the workers' exit: on this loaded 2-core
# machine the job ended within 1 s of the kill; 70 s in all leaves room for one three times
# slower. A bound on ending the job, not a timing goal: past it the job is killed, the test fails.
MARGIN = 50
STEPS_PER_EPOCH = 4  # tiny: 8 training graphs, 2 workers x 1 graph
EVERY = 3  # step checkpoints that fall inside epochs (global steps 3, 6, 9, ...)
# The rerun stops at STEP (six epochs), or MORE steps past its checkpoint if that is later: one
# uninterrupted run to compare with serves the tests whose kill came before STEP - MORE.
STEP, MORE = 6 * STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH


def train_args(dataset, run_dir, *overrides):
    # Unbounded epochs: only the kill (or stop_after_steps) ends the run, however fast.
    return tiny_training(
        dataset,
        run_dir,
        *unbounded("train.batch_graphs=1", f"train.checkpoint_every_steps={EVERY}", *overrides),
    )


def killed_args(dataset, run_dir):
    """The run to kill: the short deadline ends it. Its rerun and the uninterrupted run keep
    the default (60 s): a 10 s silence can happen on a loaded machine, failing a healthy run."""
    return train_args(dataset, run_dir, f"distributed.deadline_s={DEADLINE}")


def checkpoint_numbers(run_dir):
    """Numbers (optimizer steps) of the complete checkpoints (index written) in RUN/checkpoints."""
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return set()
    return {int(p.name[5:-6]) for p in directory.glob("ckpt-*.index")}


@pytest.fixture(scope="module")
def straight(tiny_dataset, tmp_path_factory):
    """``straight(step)``: the weights of the same run, never interrupted, stopped at ``step``."""
    weights = {}

    def at(step):
        if step not in weights:
            run_dir = tmp_path_factory.mktemp("straight") / "run"
            check(horovodrun(2, train_args(tiny_dataset, run_dir, stop_at(run_dir, step))))
            assert saved_step(run_dir) == step
            weights[step] = checkpoint_weights(run_dir)
        return weights[step]

    return at


def wait_for_moment(moment, run_dir, job, rng):
    """Returns once ``moment`` has come in the running job ``job`` (which holds a checkpoint)."""
    wait_for_file(run_dir / "timing.jsonl", job)  # the first epoch is recorded
    deadline = time.monotonic() + 120
    while not checkpoint_numbers(run_dir):  # something to resume from
        assert time.monotonic() < deadline and job.poll() is None, "no checkpoint"
        time.sleep(0.01)
    if moment == "random":
        time.sleep(rng.uniform(0.0, 3.0))
        return
    if moment == "after-run-json":
        seen = (run_dir / "run.json").stat().st_mtime_ns
        while (run_dir / "run.json").stat().st_mtime_ns == seen:
            assert time.monotonic() < deadline and job.poll() is None, "run.json not rewritten"
            time.sleep(0.002)
        return
    # after a step checkpoint one step into an epoch: three steps before the next save
    seen = checkpoint_numbers(run_dir)
    while True:
        new = checkpoint_numbers(run_dir) - seen
        if any(n % STEPS_PER_EPOCH == 1 for n in new):
            return
        assert time.monotonic() < deadline and job.poll() is None, "no step checkpoint"
        time.sleep(0.002)


def kill_and_resume(rank, moment, tiny_dataset, tmp_path, straight, seed=0):
    run_dir = tmp_path / "run"
    job = start_job("gloo", 2, killed_args(tiny_dataset, run_dir), tmp_path / "logs")
    rng = random.Random(seed)
    try:
        victim = job.pid(rank, run_dir)  # found first: the kill follows the moment at once
        wait_for_moment(moment, run_dir, job, rng)
        os.kill(victim, signal.SIGKILL)
        started = time.monotonic()
        code = job.wait(DEADLINE + MARGIN)
        took = time.monotonic() - started
    finally:
        job.kill()
    output = job.output()
    assert code not in (None, 0), f"exit {code} after {took:.0f} s\n{output[-3000:]}"
    assert f"Process {rank} exit with status code" in output, output[-3000:]
    kept = saved_step(run_dir)  # what the rerun resumes from
    assert kept > 0, checkpoint_numbers(run_dir)

    step = max(STEP, kept + MORE)
    check(horovodrun(2, train_args(tiny_dataset, run_dir, stop_at(run_dir, step))))
    assert saved_step(run_dir) == step
    assert_same_weights(checkpoint_weights(run_dir), straight(step))
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "stopped" and info["stopped_by"] is None  # at the step asked
    records = [json.loads(line) for line in open(run_dir / "timing.jsonl")][1:]
    steps = [(r["epoch"], r["step"], r["rank"]) for r in records if r["kind"] == "step"]
    epochs = [(r["epoch"], r["rank"]) for r in records if r["kind"] == "epoch"]
    assert len(steps) == len(set(steps)), "a step recorded twice"
    assert len(epochs) == len(set(epochs)), "an epoch recorded twice"
    every = {(g // STEPS_PER_EPOCH, g % STEPS_PER_EPOCH, r) for g in range(step) for r in (0, 1)}
    # Records are written before every checkpoint: none is lost between the two.
    missing = sorted(every - set(steps))
    assert not missing, f"killed with checkpoint {kept}: steps never recorded {missing}"
    assert set(steps) == every
    print(f"rank {rank} killed ({moment}): job ended after {took:.1f} s; resumed from {kept}")
    return took, kept


def test_kill_9_of_a_rank_mid_epoch_then_the_rerun_resumes_exactly(
    tiny_dataset, tmp_path, straight
):
    took, kept = kill_and_resume(1, "after-step-checkpoint", tiny_dataset, tmp_path, straight)
    assert kept % STEPS_PER_EPOCH, kept  # resumed inside an epoch
    assert took < DEADLINE + MARGIN


@pytest.mark.parametrize(
    "moment",
    [
        pytest.param("after-step-checkpoint", marks=pytest.mark.extended),
        pytest.param("after-run-json", marks=pytest.mark.extended),
        "random",
    ],
)
def test_kill_9_of_the_chief_leaves_a_consistent_run(moment, tiny_dataset, tmp_path, straight):
    kill_and_resume(0, moment, tiny_dataset, tmp_path, straight, seed=11)
