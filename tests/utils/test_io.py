"""Atomic writes: all or nothing, with ordinary permissions."""

import os

import pytest

from hvdtrack.utils.io import atomic_write, write_json


def test_written_whole_with_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "a" / "x.json", {"k": 1})
    finally:
        os.umask(old)
    path = tmp_path / "a" / "x.json"
    assert path.read_text() == '{\n  "k": 1\n}\n'
    assert path.stat().st_mode & 0o777 == 0o644


def test_failure_leaves_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(path) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]
