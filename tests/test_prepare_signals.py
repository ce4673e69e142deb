"""prepare under a signal or on a full disk: SIGTERM and Ctrl-C stop it within seconds (its
workers too) and leave nothing behind; what a prepare killed outright left is removed by the
next one (and nothing else); a full disk is one line naming the path, the old dataset kept."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hvdtrack.config import load_config
from hvdtrack.prepare.local import prepare_dataset
from tests.launch import REPO, worker_env
from tests.test_prepare import children, cmdline


def tiny(directory, *overrides):
    return load_config(REPO / "configs/tiny.yaml", [f"data.dataset_dir={directory}", *overrides])


def leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def start_long_prepare(target, cwd):
    """A prepare of 100000 events (hours of work) on 2 workers, once both workers run:
    (process, its worker pids, their command line)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hvdtrack.prepare", "--config", "tiny", "--no-progress"]
        + [f"data.dataset_dir={target}", "data.seed=12", "data.num_events=100000"]
        + ["data.workers=2", "data.records.split_counts=null"],
        cwd=cwd,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    workers, command = set(), None
    while len(workers) < 2 and process.poll() is None and time.monotonic() < deadline:
        command = cmdline(process.pid)
        workers = {c for c in children(process.pid) if cmdline(c) == command}
        time.sleep(0.2)
    return process, workers, command


def stop(process, workers, command):
    process.kill()
    process.wait()
    for pid in workers:  # still there only if prepare failed to stop them
        if cmdline(pid) == command:
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60  # gone (they hold the dataset's lock): a hang guard
    while any(cmdline(pid) == command for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_prepare_and_its_workers_leaving_the_old_dataset_alone(tmp_path, signum):
    target = tmp_path / "data"
    prepare_dataset(tiny(target), progress=False)
    old_manifest = (target / "manifest.json").read_bytes()
    process, workers, command = start_long_prepare(target, tmp_path)
    try:
        assert len(workers) == 2, f"worker processes: {workers}"
        assert leftovers(tmp_path), "no staging directory: not building yet"
        os.kill(process.pid, signum)
        _, stderr = process.communicate(timeout=120)  # a bound against a hang only
        alive = [pid for pid in workers if cmdline(pid) == command]
    finally:
        stop(process, workers, command)
    assert process.returncode == 130, stderr[-2000:]
    name = signal.Signals(signum).name
    assert f"[prepare] stopped by {name}: {target} was left as it was" in stderr
    assert stderr.strip().splitlines()[-1] == "hvdtrack: interrupted"
    assert alive == []
    assert (target / "manifest.json").read_bytes() == old_manifest
    assert leftovers(tmp_path) == [], "staging directory left behind"


def test_what_a_killed_prepare_left_is_removed_by_the_next_one_and_nothing_else(tmp_path):
    target = tmp_path / "data"
    prepare_dataset(tiny(target), progress=False)
    process, workers, command = start_long_prepare(target, tmp_path)
    try:
        assert len(workers) == 2, f"worker processes: {workers}"
        os.kill(process.pid, signal.SIGKILL)  # no chance to clean up
        process.wait(timeout=120)
    finally:
        stop(process, workers, command)
    host = socket.gethostname()
    left = [name for name in leftovers(tmp_path) if name != ".data.lock"]  # taken over later
    assert len(left) == 1 and left[0].startswith(f".data.{host}-{process.pid}-"), left
    # Not hvdtrack's, or of a process still running: kept.
    kept = [
        f".data.{host}-{os.getpid()}-abc.tmp",
        ".data.mine.tmp",
        f".data.other-{process.pid}-x.tmp",
    ]
    for name in kept:
        (tmp_path / name).mkdir()
    prepare_dataset(tiny(target), progress=False)  # up to date: only the dead one's removed
    assert [name for name in leftovers(tmp_path) if name != ".data.lock"] == sorted(kept)


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MB file system (tmpfs), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)])
    if mounted.returncode != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_one_line_naming_the_path_and_the_old_dataset_is_kept(small_disk):
    target = small_disk / "data"
    prepare_dataset(tiny(target), progress=False)  # about 15 MB: no room for a second one
    old_manifest = (target / "manifest.json").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "hvdtrack.prepare", "--config", "tiny", "--no-progress"]
        + [f"data.dataset_dir={target}", "data.seed=12"],
        cwd=small_disk.parent,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"hvdtrack: error: {target}: the file system is full while preparing the dataset; "
        "nothing was changed there - free space"
    )
    assert (target / "manifest.json").read_bytes() == old_manifest
    assert leftovers(small_disk) == []
