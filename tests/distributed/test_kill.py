"""``kill -9`` of a rank of a running ``horovodrun -np 2`` job, at several moments: the job ends
with an error within the deadline, and running the same command again ends with the weights of a
run that was never interrupted, every step recorded once. Killing the chief (which writes the
checkpoints and run.json) checks that what it leaves is always a consistent place to resume from."""

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
    start_job,
    tiny_training,
    wait_for_file,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
DEADLINE = 10
EPOCHS, STEPS_PER_EPOCH = 6, 4  # tiny: 8 training graphs, 2 workers x 1 graph
EVERY = 3  # step checkpoints that fall inside epochs (global steps 3, 6, 9, ...)


def train_args(dataset, run_dir):
    return tiny_training(
        dataset,
        run_dir,
        f"train.epochs={EPOCHS}",
        "train.batch_graphs=1",
        f"train.checkpoint_every_steps={EVERY}",
        f"distributed.deadline_s={DEADLINE}",
    )


def checkpoint_numbers(run_dir):
    """Numbers of the complete checkpoints (their index written) in RUN/checkpoints."""
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return set()
    return {int(p.name[5:-6]) for p in directory.glob("ckpt-*.index")}


@pytest.fixture(scope="module")
def straight(tiny_dataset, tmp_path_factory):
    """The weights of the same run, never interrupted."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    check(horovodrun(2, train_args(tiny_dataset, run_dir)))
    return checkpoint_weights(run_dir)


def wait_for_moment(moment, run_dir, job, rng):
    """Returns once ``moment`` has come in the running job ``job``."""
    wait_for_file(run_dir / "timing.jsonl", job)  # the first epoch is recorded
    deadline = time.monotonic() + 120
    if moment == "random":
        time.sleep(rng.uniform(0.0, 3.0))
        return
    if moment == "after-run-json":
        seen = (run_dir / "run.json").stat().st_mtime_ns
        while (run_dir / "run.json").stat().st_mtime_ns == seen:
            assert time.monotonic() < deadline and job.poll() is None, "run.json not rewritten"
            time.sleep(0.002)
        return
    # after a step checkpoint inside an epoch: the newest checkpoint is mid-epoch
    seen = checkpoint_numbers(run_dir)
    while True:
        new = checkpoint_numbers(run_dir) - seen
        if any(n % STEPS_PER_EPOCH for n in new):
            return
        assert time.monotonic() < deadline and job.poll() is None, "no step checkpoint"
        time.sleep(0.002)


def kill_and_resume(rank, moment, tiny_dataset, tmp_path, straight, seed=0):
    run_dir = tmp_path / "run"
    args = train_args(tiny_dataset, run_dir)
    job = start_job("gloo", 2, args, tmp_path / "logs")
    rng = random.Random(seed)
    try:
        wait_for_moment(moment, run_dir, job, rng)
        os.kill(job.pid(rank, run_dir), signal.SIGKILL)
        started = time.monotonic()
        code = job.wait(DEADLINE + 50)
        took = time.monotonic() - started
    finally:
        job.kill()
    output = job.output()
    assert code not in (None, 0), f"exit {code} after {took:.0f} s\n{output[-3000:]}"
    assert f"Process {rank} exit with status code" in output, output[-3000:]
    numbers = checkpoint_numbers(run_dir)
    if not numbers or max(numbers) >= EPOCHS * STEPS_PER_EPOCH:
        pytest.skip(f"the kill came before the first or after the last checkpoint ({numbers})")
    kept = max(numbers)

    check(horovodrun(2, args))  # the same command resumes
    resumed = checkpoint_weights(run_dir)
    assert_same_weights(resumed, straight)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished"
    records = [json.loads(line) for line in open(run_dir / "timing.jsonl")][1:]
    steps = [(r["epoch"], r["step"], r["rank"]) for r in records if r["kind"] == "step"]
    epochs = [(r["epoch"], r["rank"]) for r in records if r["kind"] == "epoch"]
    assert len(steps) == len(set(steps)), "a step recorded twice"
    assert len(epochs) == len(set(epochs)), "an epoch recorded twice"
    missing = {(e, s, r) for e in range(EPOCHS) for s in range(STEPS_PER_EPOCH) for r in (0, 1)}
    missing -= set(steps)
    # Records are written before every checkpoint: none is lost between the two.
    assert not missing, f"killed with checkpoint {kept}: steps never recorded {sorted(missing)}"
    return took, kept


def test_kill_9_of_a_rank_mid_epoch_then_the_rerun_resumes_exactly(
    tiny_dataset, tmp_path, straight
):
    took, kept = kill_and_resume(1, "after-step-checkpoint", tiny_dataset, tmp_path, straight)
    assert kept % STEPS_PER_EPOCH, kept  # resumed inside an epoch
    assert took < DEADLINE + 50


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
