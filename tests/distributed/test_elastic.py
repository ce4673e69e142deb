"""Elastic Horovod under a real elastic ``horovodrun`` (Gloo, a host discovery script): a worker
removed mid-run, the run goes on with the other; a worker added, it joins at the next commit;
the run finishes with the metrics of its final model, and every epoch's records say how many
workers ran it."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from hvdtrack.evaluate.inference import evaluate_split
from tests.launch import BIN, REPO, tiny_training, worker_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

EPOCHS = 80


def train_args(dataset, run_dir, epochs=EPOCHS):
    return tiny_training(dataset, run_dir, f"train.epochs={epochs}", "train.batch_graphs=1")


def epoch_records(run_dir):
    try:
        lines = (run_dir / "timing.jsonl").read_text().splitlines()[1:]
    except FileNotFoundError:
        return []
    return [r for r in map(json.loads, filter(None, lines)) if r["kind"] == "epoch"]


def wait_for(condition, job, what, timeout=240):
    deadline = time.monotonic() + timeout
    while not condition():
        assert job.poll() is None, f"the job ended before {what}:\n{job.communicate()[0][-4000:]}"
        if time.monotonic() > deadline:
            job.kill()
            raise AssertionError(f"no {what} after {timeout} s:\n{job.communicate()[0][-6000:]}")
        time.sleep(0.2)


def check_records(run_dir, info):
    """Every epoch recorded once per worker that ran it; every step once per rank."""
    epochs = epoch_records(run_dir)
    by_epoch = {}
    for r in epochs:
        by_epoch.setdefault(r["epoch"], []).append(r)
    assert sorted(by_epoch) == list(range(info["epochs"]))
    for epoch, rows in by_epoch.items():
        workers = {r["workers"] for r in rows}
        assert len(workers) == 1, (epoch, rows)
        assert sorted(r["rank"] for r in rows) == list(range(workers.pop())), epoch
    lines = (run_dir / "timing.jsonl").read_text().splitlines()[1:]
    steps = [
        (r["epoch"], r["step"], r["rank"]) for r in map(json.loads, lines) if r["kind"] == "step"
    ]
    assert len(steps) == len(set(steps))
    return [by_epoch[e][0]["workers"] for e in sorted(by_epoch)]


def check_metrics(run_dir, info):
    """The run's final validation metrics are those of the model it saved."""
    final = evaluate_split(str(run_dir), "val", "latest")
    for key in ("auc", "efficiency", "purity"):
        np.testing.assert_allclose(info["metrics"][key], final[key], rtol=1e-5, err_msg=key)
    assert info["metrics"]["auc"] > 0.8  # it learnt (tiny config: about 0.99 after 150 epochs)


def elastic_command(discovery: str, interface: str, run_args: list[str]) -> list[str]:
    return [
        str(BIN / "horovodrun"),
        "-np", "2", "--min-np", "1", "--max-np", "2",
        "--network-interface", interface,
        "--host-discovery-script", discovery,
        # A host whose worker failed may come back after this many seconds (min, max).
        "--blacklist-cooldown-range", "5", "10",
        sys.executable, *run_args,
    ]  # fmt: skip


def lose_and_regain(command, env, run_dir, lose, regain) -> tuple[str, dict]:
    """Runs the elastic job; ``lose()`` after two epochs on 2 workers, ``regain()`` after two
    on 1; returns the output and run.json once the job ended."""
    job = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(lambda: len(epoch_records(run_dir)) >= 4, job, "two epochs on 2 workers")
        lose()
        one = lambda: sum(r["workers"] == 1 for r in epoch_records(run_dir)) >= 2  # noqa: E731
        wait_for(one, job, "epochs on 1 worker")
        regain()
        output, _ = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, output[-6000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished"
    changes = [(r["workers_before"], r["workers_after"]) for r in info["elastic_resets"]]
    assert changes == [(2, 1), (1, 2)], info["elastic_resets"]
    workers = check_records(run_dir, info)
    first_one, last_one = workers.index(1), len(workers) - 1 - workers[::-1].index(1)
    assert set(workers[:first_one]) == {2} and set(workers[first_one : last_one + 1]) == {1}
    assert set(workers[last_one + 1 :]) == {2} and workers[-1] == 2  # the added worker joined
    assert "elastic restart: 2 -> 1 workers" in output and "1 -> 2 workers" in output
    check_metrics(run_dir, info)
    return output, info


@pytest.mark.extended
def test_a_worker_removed_then_added_by_discovery_the_run_goes_on_and_finishes(
    tiny_dataset, tmp_path
):
    slots = tmp_path / "hosts"
    slots.write_text("localhost:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {slots}\n")
    discover.chmod(0o755)
    run_dir = tmp_path / "run"
    # One host: no second host to find a common interface with, hence lo.
    command = elastic_command(str(discover), "lo", train_args(tiny_dataset, run_dir))
    _, info = lose_and_regain(
        command,
        worker_env(),
        run_dir,
        lose=lambda: slots.write_text("localhost:1\n"),
        regain=lambda: slots.write_text("localhost:2\n"),
    )
    assert all(r["lost_s"] == 0 for r in info["elastic_resets"])  # both at a commit


@pytest.mark.hosts
def test_a_host_lost_mid_epoch_then_back_the_run_goes_on_and_finishes(
    hosts,
    tiny_dataset,
    tmp_path,
):
    run_dir = tmp_path / "run"
    # A silent host (link down): the survivor's collective fails after the deadline.
    args = train_args(tiny_dataset, run_dir, epochs=100) + ["distributed.deadline_s=20"]
    command = elastic_command(hosts.discovery_command(1), hosts.interface, args)
    # The driver counts a worker as failed when its ssh session ends: with keepalives, a few
    # seconds after its host went silent (without, only when the link comes back).
    ssh = tmp_path / "bin/ssh"
    ssh.parent.mkdir()
    ssh.write_text(
        f'#!/bin/sh\nexec "{hosts.ssh}" -o ServerAliveInterval=2 -o ServerAliveCountMax=3 "$@"\n'
    )
    ssh.chmod(0o755)
    env = hosts.env()
    env["PATH"] = f"{ssh.parent}:{env['PATH']}"
    output, info = lose_and_regain(
        command,
        env,
        run_dir,
        lose=lambda: hosts.down("h2"),
        regain=lambda: hosts.up("h2"),
    )
    lost, back = info["elastic_resets"]
    print(f"lost h2: {lost}; h2 back: {back}")
    assert back["lost_s"] == 0  # joined at a commit
