"""prepare replaces only what it wrote: other files are refused, named, and left in place."""

import pytest

from hvdtrack.config import load_config
from hvdtrack.errors import DataError
from hvdtrack.prepare import prepare_dataset
from tests.launch import REPO


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
