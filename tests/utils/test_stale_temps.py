"""remove_stale_temps: what a Staged of a dead process of this host left is removed (an old
directory moved back when its final name is gone); anything else is kept."""

import os
import socket
import subprocess

from hvdtrack.utils.io import Staged, remove_stale_temps


def finished_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_only_a_dead_writers_temporaries_are_removed(tmp_path):
    host, dead = socket.gethostname(), finished_pid()
    (tmp_path / "data").mkdir()
    removed = [f".data.{host}-{dead}-k2j_x9.tmp", f".data.old-{host}-{dead}"]
    kept = [
        f".data.{host}-{os.getpid()}-abc.tmp",  # a live writer's (this one)
        f".data.otherhost-{dead}-abc.tmp",  # another host's: its pid says nothing here
        ".data.mine.tmp",  # not hvdtrack's naming
        f".notes.{host}-{dead}-abc.tmp",  # another final name's
        "data",
    ]
    for name in removed + kept:
        (tmp_path / name).mkdir(exist_ok=True)
    assert sorted(p.name for p in remove_stale_temps(tmp_path / "data")) == sorted(removed)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_an_old_directory_whose_final_name_is_gone_is_moved_back(tmp_path):
    host, dead = socket.gethostname(), finished_pid()
    old = tmp_path / f".data.old-{host}-{dead}"
    old.mkdir()
    (old / "manifest.json").write_text("{}")
    remove_stale_temps(tmp_path / "data")
    assert (tmp_path / "data/manifest.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["data"]


def test_staged_temporaries_carry_host_and_pid(tmp_path):
    with Staged() as staged:
        tmp = staged.path(tmp_path / "data", directory=True)
        assert tmp.name.startswith(f".data.{socket.gethostname()}-{os.getpid()}-")
        assert tmp.name.endswith(".tmp")
        assert remove_stale_temps(tmp_path / "data") == []  # its writer runs
