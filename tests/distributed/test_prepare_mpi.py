"""``mpirun -np 2 python -m hvdtrack.prepare`` writes the dataset one process writes, byte for byte,
and a rank that fails or stops ends every rank with an error naming it."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdtrack.config import load_config
from hvdtrack.prepare.local import prepare_dataset
from tests.launch import REPO, launch_command, worker_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def mpirun_prepare(np: int, overrides: list[str], timeout: float = 240):
    command = launch_command(
        np, ["-m", "hvdtrack.prepare", "--config", "tiny", "--no-progress"], "mpirun"
    )
    return subprocess.run(
        command + overrides,
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dataset_files(directory: Path) -> dict[str, bytes]:
    """The manifest and every shard: what must be identical whoever wrote the dataset."""
    names = [MANIFEST] + [p.name for p in directory.glob("*.tfrecord*")]
    return {name: (directory / name).read_bytes() for name in sorted(names)}


MANIFEST = "manifest.json"


def test_two_ranks_write_the_same_shards_and_manifest_as_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    prepare_dataset(
        load_config(REPO / "configs/tiny.yaml", [f"data.dataset_dir={one}"]), progress=False
    )

    result = mpirun_prepare(2, [f"data.dataset_dir={two}"])

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "6 events on 2 MPI ranks" in result.stdout
    # Same content: the same shard files (names, records in the same order, so the same bytes
    # and checksums) and a byte-identical manifest listing the same graphs in the same places.
    expected = dataset_files(one)
    assert len(expected) == 6  # the manifest and 5 shards: both ranks wrote some
    assert dataset_files(two) == expected
    reports = [json.loads((d / "report.json").read_text()) for d in (one, two)]
    assert reports[0]["splits"] == reports[1]["splits"] and reports[0]["all"] == reports[1]["all"]
    assert (reports[0]["ranks"], reports[1]["ranks"]) == (1, 2)
    assert sorted(p.name for p in (one / "events").iterdir()) == sorted(
        p.name for p in (two / "events").iterdir()
    )
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    again = mpirun_prepare(2, [f"data.dataset_dir={two}"])  # up to date: kept, on every rank
    assert again.returncode == 0 and "is up to date" in again.stdout
    assert dataset_files(two) == expected


def test_a_rank_that_fails_ends_every_rank_naming_it(tmp_path):
    events = tmp_path / "events"
    prepare_dataset(
        load_config(REPO / "configs/tiny.yaml", [f"data.dataset_dir={tmp_path / 'first'}"]),
        progress=False,
    )
    shutil.copytree(tmp_path / "first" / "events", events)
    # Events are dealt round robin in order: the second one is rank 1's.
    second = sorted(events.glob("*-hits.csv"))[1]
    second.write_text("not,a,hits,file\n")
    target = tmp_path / "data"

    result = mpirun_prepare(
        2, ["data.source=trackml", f"data.trackml_dir={events}", f"data.dataset_dir={target}"]
    )

    assert result.returncode != 0
    assert f"rank 1 of 2: {second}" in result.stderr, result.stderr[-3000:]
    assert "prepare on 2 MPI ranks stopped" in result.stderr and "rank 1 failed:" in result.stderr
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.extended
def test_a_stopped_rank_is_named_when_its_deadline_passes_and_the_job_ends(tmp_path):
    target = tmp_path / "data"
    command = launch_command(
        2, ["-m", "hvdtrack.prepare", "--config", "tiny", "--no-progress"], "mpirun"
    )
    # Rank 1 must still be building when it is stopped: its scratch file appears as it starts
    # its 3 events, and it is stopped some 0.05 s later; at 4000 particles an event takes
    # seconds (6 s here, loaded), so a machine would have to be ~100x faster for it to finish
    # first - and then rank 0 would name another step's deadline: the message check fails.
    command += [f"data.dataset_dir={target}", "data.prepare_timeout_s=2"]
    command += ["data.synthetic.num_particles=4000"]
    job = subprocess.Popen(
        command,
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        scratch = wait_for(lambda: next(tmp_path.glob(".data.*.tmp/.graphs-rank00001"), None))
        os.kill(rank_pid(1, target), signal.SIGSTOP)  # building its events: past MPI_Init
        stdout, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()

    assert job.returncode != 0
    # Rank 0 waits (3 events of the busiest rank + 1) x 2 s for it, then aborts the job.
    assert "rank 1 of 2 sent nothing within 8 s (rank 0 waited for it)" in stderr, stderr[-3000:]
    assert "aborting every rank" in stderr
    assert not target.exists() and not scratch.parent.exists()  # rank 0 removed its staging


def wait_for(find, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while (found := find()) is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return found


def rank_pid(rank: int, target: Path) -> int:
    """The pid of the prepare process of MPI ``rank`` writing ``target``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            f"data.dataset_dir={target}".encode() in cmdline
            and cmdline[0] == sys.executable.encode()
            and f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ
        ):
            return int(pid)
    raise AssertionError(f"no rank {rank} process for {target}")
