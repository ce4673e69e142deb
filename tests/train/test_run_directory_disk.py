"""A full or read-only run directory (issue 27): refused before training with one line naming
the path and what to do; a checkpoint that fails mid-run for lack of space is one line too, and
leaves run.json and every checkpoint saved before it usable: the run resumes once there is room.

Real filesystems: a small tmpfs mounted here (root only; skipped where mount is refused)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hvdtrack.errors import ConfigError, TrainingError
from hvdtrack.runs import rundir
from hvdtrack.runs.timing import read_run
from hvdtrack.train.checkpoints import damage
from hvdtrack.train.loop import fit, train
from hvdtrack.train.trainer import Trainer


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(size, *options) -> Path``: a tmpfs of ``size`` (e.g. "400k"); unmounted after."""
    mounted = []

    def mount(size: str) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:  # lazily: a process's open file there must not keep it mounted
        subprocess.run(["umount", "-l", str(point)], check=False)


def remount(point: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(point)], check=True)


def test_a_disk_that_fills_up_mid_run_stops_with_one_line_and_resumes(tiny_config, tmpfs, capsys):
    # 400 kB: room for the run's start and four checkpoints (62 kB each), not for eight.
    disk = tmpfs("400k")
    run_dir = disk / "run"
    every_step = ("train.checkpoint_every_steps=1", "train.keep_checkpoints=100")
    with pytest.raises(TrainingError) as stopped:
        train(tiny_config(f"train.run_dir={run_dir}", *every_step))
    assert str(stopped.value).startswith(
        f"cannot write {run_dir / 'checkpoints'}: the filesystem is full: free space there"
    )
    info = read_run(run_dir).info
    saved = info["checkpoint"]
    assert info["status"] == "failed" and saved is not None
    folder = run_dir / "checkpoints"
    assert damage(str(folder / saved)) is None
    assert not list(folder.glob("*_temp")) and not (run_dir / rundir.LOCK_NAME).exists()
    # Still full: refused before training, naming the folder and the room it needs.
    with pytest.raises(ConfigError, match=rf"{run_dir}: \d+ kB free, saving checkpoints needs"):
        fit(Trainer(tiny_config(f"train.run_dir={run_dir}", *every_step)))
    remount(disk, "size=2m")  # room made: the run goes on from where it stopped
    capsys.readouterr()
    info = train(tiny_config(f"train.run_dir={run_dir}", *every_step))
    assert info["status"] == "finished" and info["checkpoint"] == "ckpt-8"
    assert "resuming from" not in capsys.readouterr().err  # nothing was skipped


def test_a_read_only_run_directory_is_refused_before_training(tiny_config, tmpfs):
    disk = tmpfs("2m")
    run_dir = disk / "run"
    fit(Trainer(tiny_config(f"train.run_dir={run_dir}", "train.epochs=1")))
    remount(disk, "ro")
    with pytest.raises(ConfigError) as refused:
        fit(Trainer(tiny_config(f"train.run_dir={run_dir}", "train.epochs=2")))
    assert str(refused.value) == (
        f"cannot write {run_dir / rundir.LOCK_NAME}: the filesystem is read-only: use another "
        "train.run_dir"
    )
    with pytest.raises(
        ConfigError, match=f"cannot write {disk / 'new'}: the filesystem is read-only"
    ):
        fit(Trainer(tiny_config(f"train.run_dir={disk / 'new'}")))
