"""One writer per directory (issue 27): a second `train` on a run directory being trained, or a
second `prepare` of a dataset being built, is refused at once naming the first, which finishes
unharmed; a run directory that is a dataset or a folder of other files is refused, untouched."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdtrack.errors import ConfigError
from hvdtrack.records.manifest import Manifest
from hvdtrack.runs import rundir
from hvdtrack.utils.lock import DirectoryBusy, DirectoryLock
from tests.launch import REPO, tiny_training


def frozen_when_locked(command: list[str], lock_file: Path) -> subprocess.Popen:
    """Starts ``command`` and stops it (SIGSTOP) as soon as its lock file names it: it holds the
    lock however fast the machine is, until the caller sends SIGCONT."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300  # a hang guard only
    while True:
        try:
            if json.loads(lock_file.read_text())["pid"] == proc.pid:
                break
        except (OSError, ValueError, KeyError):
            pass
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the first writer took no lock in 300 s"
        time.sleep(0.002)
    proc.send_signal(signal.SIGSTOP)
    return proc


def second_is_refused(first: subprocess.Popen, command: list[str], directory: Path) -> str:
    """Runs ``command`` while ``first`` holds the lock; returns the first's output after it
    was let go on."""
    try:
        second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    finally:
        first.send_signal(signal.SIGCONT)
    output, _ = first.communicate(timeout=300)
    assert second.returncode == 2, second.stderr
    assert (
        f"hvdtrack: error: {directory} is being written by pid {first.pid} on "
        in second.stderr.strip().splitlines()[-1]
    )
    assert first.returncode == 0, output
    return output


@pytest.mark.slow
def test_a_second_training_of_a_run_directory_is_refused_and_the_first_finishes(
    tiny_dataset, tmp_path
):
    run_dir = tmp_path / "run"
    command = [sys.executable, *tiny_training(tiny_dataset, run_dir, strategy="local")]
    first = frozen_when_locked(command, run_dir / rundir.LOCK_NAME)
    second_is_refused(first, command, run_dir)
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["status"], info["graphs_processed"]) == ("finished", 2 * 8)
    assert not (run_dir / rundir.LOCK_NAME).exists()
    assert len(list((run_dir / "tensorboard").glob("events.*"))) == 1  # one run wrote here


def test_a_second_prepare_of_a_dataset_is_refused_and_the_first_finishes(tmp_path):
    dataset = tmp_path / "data"
    command = [
        sys.executable,
        "-m",
        "hvdtrack.prepare",
        "--config",
        str(REPO / "configs/tiny.yaml"),
    ]
    command += [f"data.dataset_dir={dataset}", "--no-progress"]
    first = frozen_when_locked(command, tmp_path / ".data.lock")
    second_is_refused(first, command, dataset)
    assert len(Manifest.load(dataset).shards) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no lock, no temporaries


def test_a_run_directory_that_is_a_dataset_or_holds_other_files_is_refused(tiny_dataset, tmp_path):
    with pytest.raises(ConfigError, match=rf"train.run_dir {tiny_dataset} is \(inside\) a dataset"):
        rundir.claim(tiny_dataset, tiny_dataset, 0)
    with pytest.raises(ConfigError, match="is \\(inside\\) a dataset"):
        rundir.claim(tiny_dataset / "run", tiny_dataset, 0)
    assert not (tiny_dataset / "run").exists()
    csvs = tmp_path / "csvs"
    csvs.mkdir()
    for name in ("event000001000-hits.csv", "event000001000-truth.csv"):
        (csvs / name).write_text("hit_id\n1\n")
    with pytest.raises(ConfigError, match=r"holds files that are not an hvdtrack run's \(event0"):
        rundir.claim(csvs, tiny_dataset, 0)
    assert sorted(p.name for p in csvs.iterdir()) == [
        "event000001000-hits.csv",
        "event000001000-truth.csv",
    ]
    lock = rundir.claim(tmp_path / "new", tiny_dataset, 0)  # a new one is fine
    lock.release()
    assert list((tmp_path / "new").iterdir()) == []


def test_a_writer_between_its_probes_is_named_not_taken_for_other_files(tiny_dataset, tmp_path):
    """The first writer holds the lock while its probe folder (``best``) exists alone: a second
    claim is refused as busy, naming the holder, not as a folder of foreign files."""
    run_dir = tmp_path / "run"
    (run_dir / "best").mkdir(parents=True)
    with DirectoryLock(run_dir / rundir.LOCK_NAME, run_dir, "train.run_dir"):
        with pytest.raises(DirectoryBusy, match=rf"{run_dir} is being written by pid "):
            rundir.claim(run_dir, tiny_dataset, 0)
    assert sorted(p.name for p in run_dir.iterdir()) == ["best"]
