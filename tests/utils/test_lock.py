"""One writer per directory: a second writer is refused naming the holder, a lock left by a
process that is gone is taken over with a message, a holder on another host is never taken over,
and the lock file goes with its holder. Within one (elastic) job, a free lock of another host is
taken over: the job dropped that worker. A held lock can be waited for, up to a deadline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from hvdtrack.utils.lock import DirectoryBusy, DirectoryLock

HOLD = """
import sys
from pathlib import Path
from hvdtrack.utils.lock import DirectoryLock
with DirectoryLock(Path(sys.argv[1]), Path(sys.argv[2]), "train.run_dir"):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it
"""


def record(host: str, pid: int, **more) -> str:
    return json.dumps({"host": host, "pid": pid, "command": "python -m x", "since": "then", **more})


def hold(lock_file, directory) -> subprocess.Popen:
    """Another process holding the lock until its stdin is closed (returned once it holds it)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock_file), str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    return holder


def gone_pid() -> int:
    """The pid of a process of this host that has ended."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    lock_file = tmp_path / ".hvdtrack.lock"
    holder = hold(lock_file, tmp_path)
    try:
        with pytest.raises(DirectoryBusy) as refused:
            DirectoryLock(lock_file, tmp_path, "train.run_dir").acquire()
        message = str(refused.value)
        assert f"{tmp_path} is being written by pid {holder.pid} on " in message
        assert "python -c" in message and "use another train.run_dir" in message
        assert json.loads(lock_file.read_text())["pid"] == holder.pid  # left as it was
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0 and not lock_file.exists()  # gone with its holder
    with DirectoryLock(lock_file, tmp_path, "train.run_dir") as lock:  # free now
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()
        assert lock.took_over is None


def test_a_lock_left_by_a_process_that_is_gone_is_taken_over_with_a_message(tmp_path):
    import socket

    lock_file = tmp_path / ".lock"
    pid = gone_pid()
    lock_file.write_text(record(socket.gethostname(), pid))
    said = []
    with DirectoryLock(lock_file, tmp_path, "data.dataset_dir", say=said.append) as lock:
        assert lock.took_over.pid == pid
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    assert said == [
        f"{tmp_path}: taking over the lock of pid {pid} on {socket.gethostname()} "
        "('python -m x', since then), which is gone"
    ]
    assert not lock_file.exists()


def test_a_lock_of_another_host_is_refused_and_kept(tmp_path):
    lock_file = tmp_path / ".lock"
    lock_file.write_text(record("elsewhere", 4321))
    with pytest.raises(DirectoryBusy, match=rf"pid 4321 on elsewhere .*remove {lock_file}"):
        DirectoryLock(lock_file, tmp_path, "data.dataset_dir").acquire()
    assert json.loads(lock_file.read_text())["host"] == "elsewhere"


def test_a_free_lock_of_another_host_in_the_same_job_is_taken_over(tmp_path):
    lock_file = tmp_path / ".lock"
    lock_file.write_text(record("elsewhere", 4321, job="horovod elastic 10.0.0.1:4000"))
    said = []
    job = "horovod elastic 10.0.0.1:4000"
    with DirectoryLock(lock_file, tmp_path, "train.run_dir", said.append, job) as lock:
        assert (lock.took_over.host, lock.took_over.pid) == ("elsewhere", 4321)
        mine = json.loads(lock_file.read_text())
        assert (mine["pid"], mine["job"]) == (os.getpid(), job)
    assert said == [
        f"{tmp_path}: taking over the lock of pid 4321 on elsewhere ('python -m x', since then), "
        "a worker this job dropped"
    ]
    assert not lock_file.exists()


@pytest.mark.parametrize("job", ["", "horovod elastic 10.0.0.1:4001"])
def test_a_free_lock_of_another_host_and_another_job_is_refused(tmp_path, job):
    lock_file = tmp_path / ".lock"
    lock_file.write_text(record("elsewhere", 4321, job="horovod elastic 10.0.0.1:4000"))
    with pytest.raises(DirectoryBusy, match="pid 4321 on elsewhere"):
        DirectoryLock(lock_file, tmp_path, "train.run_dir", job=job).acquire()
    assert json.loads(lock_file.read_text())["pid"] == 4321


def test_a_held_lock_is_waited_for_until_released_or_the_deadline(tmp_path):
    lock_file = tmp_path / ".hvdtrack.lock"
    holder = hold(lock_file, tmp_path)
    try:
        with pytest.raises(DirectoryBusy, match=f"pid {holder.pid} on "):
            DirectoryLock(lock_file, tmp_path, "train.run_dir").acquire(wait_s=1.0)
        # The holder ends a second later, while the next writer waits (a generous deadline).
        threading.Timer(1.0, holder.stdin.close).start()
        lock = DirectoryLock(lock_file, tmp_path, "train.run_dir")
        lock.acquire(wait_s=600)
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()
        lock.release()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert not lock_file.exists()
