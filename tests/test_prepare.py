"""prepare replaces only what it wrote (other files are refused, named, and left in place),
never hangs or half-writes when a worker dies, and keeps its events as a whole TrackML dataset."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdtrack.config import load_config
from hvdtrack.errors import DataError
from hvdtrack.prepare.jobs import stale_reason, up_to_date
from hvdtrack.prepare.local import prepare_dataset
from tests.launch import REPO, worker_env


def tiny(directory):
    return load_config(REPO / "configs/tiny.yaml", [f"data.dataset_dir={directory}"])


def leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_a_directory_of_other_files_is_refused_and_kept(tmp_path):
    target = tmp_path / "events"
    target.mkdir()
    (target / "event000001000-hits.csv").write_text("hit_id,x,y,z\n")
    with pytest.raises(DataError, match=rf"{target} holds no hvdtrack dataset .* nothing was"):
        prepare_dataset(tiny(target), progress=False)
    assert [p.name for p in target.iterdir()] == ["event000001000-hits.csv"]
    assert leftovers(tmp_path) == []


def test_a_file_is_refused(tmp_path):
    target = tmp_path / "data"
    target.write_text("mine")
    with pytest.raises(DataError, match="holds a file, not a directory"):
        prepare_dataset(tiny(target), progress=False)
    assert target.read_text() == "mine"


def test_own_dataset_is_replaced_but_not_with_a_stranger_inside(tmp_path):
    target = tmp_path / "data"
    prepare_dataset(tiny(target), progress=False)
    before = (target / "manifest.json").stat().st_mtime_ns
    prepare_dataset(tiny(target), force=True, progress=False)  # its own: replaced
    assert (target / "manifest.json").stat().st_mtime_ns != before
    (target / "notes.txt").write_text("my notes")
    with pytest.raises(DataError, match=r"files hvdtrack did not write \(notes.txt\)"):
        prepare_dataset(tiny(target), force=True, progress=False)
    assert (target / "notes.txt").read_text() == "my notes"
    assert (target / "manifest.json").is_file() and leftovers(tmp_path) == []


def test_an_empty_directory_is_filled(tmp_path):
    target = tmp_path / "data"
    target.mkdir()
    prepare_dataset(tiny(target), progress=False)
    assert (target / "manifest.json").is_file()


def test_the_kept_events_are_a_trackml_dataset_with_its_detectors_file(tiny_dataset):
    import numpy as np

    from hvdtrack.events import modules, trackml

    events = tiny_dataset / "events"  # data.keep_csv: true
    assert len(trackml.find_events(events)) == 6  # tiny.yaml's events, beside their geometry
    detectors = trackml.read_detectors(events / "detectors.csv")
    for column, values in modules.module_table().items():  # the synthetic detector's modules
        # (pandas reads decimal floats back to within an ulp or so)
        np.testing.assert_allclose(detectors[column], values, rtol=1e-12, err_msg=column)


def children(pid):
    """Process ids of ``pid``'s children, from /proc (every thread's list)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.update(int(c) for c in (task / "children").read_text().split())
    return found


def cmdline(pid):
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return None


@pytest.mark.parametrize(
    "signum, message",
    [
        (signal.SIGKILL, "a preparation worker process died"),  # as the out-of-memory killer does
        (signal.SIGSTOP, "no preparation worker finished an event within 3 s"),  # stuck workers
    ],
)
def test_a_lost_worker_ends_prepare_with_an_error_and_keeps_the_old_dataset(
    tmp_path, signum, message
):
    target = tmp_path / "data"
    prepare_dataset(tiny(target), progress=False)
    old_manifest = (target / "manifest.json").read_bytes()
    # Another seed makes the dataset stale; 100000 events (hours of work) are more than any
    # machine finishes before the fault lands: prepare cannot end first.
    process = subprocess.Popen(
        [sys.executable, "-m", "hvdtrack.prepare", "--config", "tiny", "--no-progress"]
        + [f"data.dataset_dir={target}", "data.seed=12", "data.num_events=100000"]
        + ["data.workers=2", "data.records.split_counts=null", "data.prepare_timeout_s=3"],
        cwd=tmp_path,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        workers, command = set(), None
        while len(workers) < 2 and process.poll() is None and time.monotonic() < deadline:
            # Pool workers are forks of prepare: same command line (unlike a resource tracker).
            command = cmdline(process.pid)
            workers = {c for c in children(process.pid) if cmdline(c) == command}
            time.sleep(0.2)
        assert len(workers) == 2, f"worker processes: {workers}"
        # Events are in flight from the start (submitted before the workers are forked). One
        # killed worker breaks the pool whatever it was doing; with every worker stopped no
        # event can finish, whichever event each one held.
        for pid in [min(workers)] if signum == signal.SIGKILL else sorted(workers):
            os.kill(pid, signum)
        # A bound against a hang only: prepare's own limit is 3 s.
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
        for pid in workers:  # still there only if prepare failed to stop them
            if cmdline(pid) == command:
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == 2, stderr[-2000:]
    assert re.search(rf"{message} .*while events (\d+, )*\d+ were unfinished", stderr), stderr
    assert f"nothing was written to {target}" in stderr
    assert (target / "manifest.json").read_bytes() == old_manifest
    assert leftovers(tmp_path) == [], "staging directory left behind"


# A worker stopped while it sends a result leaves half a message in the result pipe. The worker
# here stops itself once its main thread is inside the write of a 300 MB result (the kernel's
# record of that thread's system call), so the stop always lands inside the send, however fast
# the machine is.
STOPPED_MID_SEND = """
import os, signal, sys, threading, time, types
from pathlib import Path
import hvdtrack.prepare.pool as pool

def writing(pid):
    with open(f"/proc/self/task/{pid}/syscall") as call:
        fields = call.read().split()
    return fields[0] == "1" and int(fields[3], 16) >= 2**20  # write(fd, buffer, count)

def stop_mid_send(pid):
    while not writing(pid):
        time.sleep(0.001)
    time.sleep(0.005)
    os.kill(pid, signal.SIGSTOP)

def send_then_stop(job):
    threading.Thread(target=stop_mid_send, args=(os.getpid(),), daemon=True).start()
    return b"x" * 300_000_000

pool.process_event = send_then_stop  # the forked workers run it
try:
    list(pool.process_events([types.SimpleNamespace(event_id=e) for e in (1, 2)], 2, 5.0, Path("t")))
except pool.DataError as err:
    print(err, flush=True)
    sys.exit(2)
"""


def test_a_worker_stopped_while_it_sends_a_result_does_not_hang_prepare(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-c", STOPPED_MID_SEND],
        cwd=tmp_path,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # A bound against a hang only: the deadline inside is 5 s.
        stdout, stderr = process.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the stopped workers too, if it hung
    assert process.returncode == 2, stderr[-2000:]
    assert "no preparation worker finished an event within 5 s while events 1, 2" in stdout


def test_a_missing_or_truncated_shard_makes_the_dataset_stale(tmp_path, capsys):
    config = tiny(tmp_path / "data")
    prepare_dataset(config, progress=False)
    assert up_to_date(config)
    shard = tmp_path / "data/train-00000-of-00003.tfrecord"
    shard.unlink()
    assert not up_to_date(config)
    assert stale_reason(config).startswith(
        f"shard train-00000-of-00003.tfrecord of split 'train' is missing from {tmp_path / 'data'}"
    )
    capsys.readouterr()
    prepare_dataset(config, progress=False)
    assert "rebuilding" in capsys.readouterr().out and shard.is_file() and up_to_date(config)
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-1])
    assert f"is {size - 1} bytes but the manifest says {size}" in stale_reason(config)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to leave one out")
def test_default_workers_are_the_cpus_this_process_may_use(tmp_path):
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        report = prepare_dataset(
            load_config(
                REPO / "configs/tiny.yaml",
                [f"data.dataset_dir={tmp_path / 'data'}", "data.workers=null"],
            ),
            progress=False,
        )
    finally:
        os.sched_setaffinity(0, allowed)
    assert report["workers"] == 1
