"""Atomic writes: all or nothing, with ordinary permissions."""

import json
import os

import numpy as np
import pytest

from hvdtrack.utils.io import Staged, atomic_write, write_json


def test_written_whole_with_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "a" / "x.json", {"k": 1})
    finally:
        os.umask(old)
    path = tmp_path / "a" / "x.json"
    assert path.read_text() == '{\n  "k": 1\n}\n'
    assert path.stat().st_mode & 0o777 == 0o644


def test_json_is_strict_with_null_for_what_is_not_a_finite_number(tmp_path):
    # An empty bin's efficiency is 0/0 (NaN), as numpy and Python floats, in lists and arrays.
    data = {
        "efficiency": [float("nan"), 0.5],
        "rate": np.float64("inf"),
        "bins": np.array([np.nan, -np.inf, 1.0], np.float32),
        "counts": (np.int64(3), np.bool_(True)),
    }
    write_json(tmp_path / "x.json", data)
    with open(tmp_path / "x.json") as f:  # a strict parser: NaN or Infinity raise
        parsed = json.load(f, parse_constant=lambda c: 1 / 0)
    assert parsed == {
        "efficiency": [None, 0.5],
        "rate": None,
        "bins": [None, None, 1.0],
        "counts": [3, True],
    }


def test_failure_leaves_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(path) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def test_staged_files_appear_together_on_commit_and_not_before(tmp_path):
    with Staged() as staged:
        first, second = staged.path(tmp_path / "a.bin"), staged.path(tmp_path / "b.bin")
        first.write_bytes(b"1")
        second.write_bytes(b"2")
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == []
        assert staged.commit() == [tmp_path / "a.bin", tmp_path / "b.bin"]
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["a.bin", "b.bin"]


def test_staged_files_not_committed_are_removed(tmp_path):
    with pytest.raises(RuntimeError):
        with Staged() as staged:
            staged.path(tmp_path / "a.bin").write_bytes(b"1")
            staged.path(tmp_path / "d", directory=True).joinpath("x").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_a_staged_directory_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "data"
    target.mkdir()
    (target / "old.txt").write_text("old")
    old = os.umask(0o022)
    try:
        with Staged() as staged:
            new = staged.path(target, directory=True)
            (new / "new.txt").write_text("new")
            staged.commit()
    finally:
        os.umask(old)
    assert [p.name for p in tmp_path.iterdir()] == ["data"]
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert target.stat().st_mode & 0o777 == 0o755


def test_a_failed_commit_removes_what_it_renamed(tmp_path, monkeypatch):
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk gone")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with Staged() as staged:
        staged.path(tmp_path / "a.bin").write_bytes(b"1")
        staged.path(tmp_path / "b.bin").write_bytes(b"2")
        with pytest.raises(OSError, match="disk gone"):
            staged.commit()
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []
