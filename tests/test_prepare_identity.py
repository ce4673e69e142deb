"""A dataset is what it holds, not where it lies: a moved, copied, respelled, symlinked or
read-only dataset is reused; changed TrackML inputs, a broken manifest or a changed data config
make it stale, said as such; a rebuild never replaces what prepare cannot prove it wrote, nor
the dataset a run to be resumed was trained on."""

import json
import os
import shutil
import subprocess

import pytest

from hvdtrack.config import load_config
from hvdtrack.distributed.launch import dataset_status, ensure_dataset
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.prepare.jobs import stale_reason, up_to_date
from hvdtrack.prepare.local import prepare_dataset
from hvdtrack.records.manifest import manifest_digest
from tests.launch import REPO


def tiny(directory, *overrides):
    return load_config(REPO / "configs/tiny.yaml", [f"data.dataset_dir={directory}", *overrides])


def leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_a_respelled_copied_or_moved_dataset_is_reused(tmp_path, capsys):
    prepare_dataset(tiny(tmp_path / "a"), progress=False)
    manifest = (tmp_path / "a/manifest.json").read_bytes()
    assert stale_reason(tiny(f"{tmp_path / 'a'}/")) is None  # a trailing slash
    shutil.copytree(tmp_path / "a", tmp_path / "copy")  # new mtimes, same content
    (tmp_path / "a").rename(tmp_path / "moved")
    for where in ("copy", "moved"):
        assert stale_reason(tiny(tmp_path / where)) is None
        capsys.readouterr()
        prepare_dataset(tiny(tmp_path / where), progress=False)
        assert "is up to date" in capsys.readouterr().out
        assert (tmp_path / where / "manifest.json").read_bytes() == manifest
    assert stale_reason(tiny(tmp_path / "copy", "data.seed=12")) == (
        "it was built from another data config (data.seed differs)"
    )


def test_a_read_only_mounted_dataset_is_reused(tmp_path):
    prepare_dataset(tiny(tmp_path / "a"), progress=False)
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(tmp_path / "a"), str(mount)])
    if done.returncode != 0:
        pytest.skip("a read-only bind mount needs mount(8) and the right to use it")
    try:
        # Root writes anywhere but on a read-only mount: make sure this one is.
        with pytest.raises(OSError):
            (mount / "probe").write_text("x")
        config = tiny(mount)
        assert stale_reason(config) is None and dataset_status(config) == "ready"
        assert ensure_dataset(config, rank=0) == "ready"
        assert prepare_dataset(config, progress=False)["events"] == 6
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_symlinked_dataset_is_reused_or_rebuilt_where_the_link_points(tmp_path):
    real = tmp_path / "store/data"
    prepare_dataset(tiny(real), progress=False)
    link = tmp_path / "data"
    link.symlink_to(real)
    assert stale_reason(tiny(link)) is None
    prepare_dataset(tiny(link, "data.seed=12"), progress=False)  # stale: rebuilt in place
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert up_to_date(tiny(real, "data.seed=12"))
    assert leftovers(tmp_path) == [] and leftovers(real.parent) == []


def trackml_config(dataset, events_dir, *overrides):
    return tiny(
        dataset,
        "data.source=trackml",
        f"data.trackml_dir={events_dir}",
        "data.num_events=null",
        *overrides,
    )


def test_trackml_files_changed_or_added_after_prepare_make_the_dataset_stale(tmp_path):
    prepare_dataset(tiny(tmp_path / "synthetic"), progress=False)  # keep_csv: its events
    events = tmp_path / "events"
    shutil.copytree(tmp_path / "synthetic/events", events)
    config = trackml_config(tmp_path / "data", events)
    prepare_dataset(config, progress=False)
    assert stale_reason(config) is None
    hits = events / "event000001000-hits.csv"
    text = hits.read_text()
    hits.write_text(text)  # touched: another mtime, the same bytes
    assert stale_reason(config) is None
    # One digit changed: same size, same mtime as recorded would be unlikely, content differs.
    hits.write_text(text.replace("1", "2", 1))
    assert stale_reason(config) == f"TrackML file {hits} changed after it was prepared"
    hits.write_text(text)
    for part in ("hits", "truth", "particles"):
        shutil.copy(events / f"event000001005-{part}.csv", events / f"event000001099-{part}.csv")
    assert stale_reason(config) == (
        f"TrackML file event000001099-hits.csv was added to {events} after it was prepared"
    )
    # A copy of the TrackML directory elsewhere is the same input.
    for part in ("hits", "truth", "particles"):
        (events / f"event000001099-{part}.csv").unlink()
    shutil.copytree(events, tmp_path / "events-copy")
    assert stale_reason(trackml_config(tmp_path / "data", tmp_path / "events-copy")) is None


def test_a_broken_manifest_is_named_and_replaced_only_when_prepare_wrote_every_file(
    tmp_path, capsys
):
    target = tmp_path / "data"
    config = tiny(target)
    prepare_dataset(config, progress=False)
    (target / "manifest.json").write_text('{"format": ')
    assert stale_reason(config).startswith(
        f"its manifest is broken: {target / 'manifest.json'} is unreadable (Expecting value"
    )
    assert "another data config" not in stale_reason(config)
    capsys.readouterr()
    prepare_dataset(config, progress=False)  # prepare.json lists every file it wrote
    assert f"rebuilding {target}: its manifest is broken" in capsys.readouterr().out
    assert up_to_date(config)
    # As an older hvdtrack left it: no record of the files written. Not replaced.
    info = json.loads((target / "prepare.json").read_text())
    del info["files"]
    (target / "prepare.json").write_text(json.dumps(info))
    (target / "manifest.json").write_text("[]")
    before = sorted(p.name for p in target.iterdir())
    with pytest.raises(DataError, match=r"holds a broken manifest.json \(.*no record of what"):
        prepare_dataset(config, progress=False)
    assert sorted(p.name for p in target.iterdir()) == before
    assert (target / "manifest.json").read_text() == "[]"


def test_train_refuses_the_resume_before_it_rebuilds_the_dataset_of_the_run(tmp_path):
    target, run_dir = tmp_path / "data", tmp_path / "run"
    prepare_dataset(tiny(target), progress=False)
    manifest = (target / "manifest.json").read_bytes()
    run_dir.mkdir()  # what a run trained on this dataset records
    (run_dir / "run.json").write_text(json.dumps({"dataset_digest": manifest_digest(target)}))
    changed = tiny(target, "data.seed=12", f"train.run_dir={run_dir}")
    with pytest.raises(
        ConfigError,
        match=rf"train.run_dir {run_dir} resumes a run trained on data.dataset_dir {target} "
        r"\(manifest digest \w+\), which is out of date: it was built from another data config "
        r"\(data.seed differs\); .* nothing was changed",
    ):
        ensure_dataset(changed, rank=0)
    assert (target / "manifest.json").read_bytes() == manifest
    # Starting afresh (or with the dataset the run was trained on) is fine.
    assert ensure_dataset(tiny(target, f"train.run_dir={run_dir}"), rank=0) == "ready"
    ensure_dataset(tiny(target, "data.seed=12", f"train.run_dir={run_dir}", "train.resume=false"))
    assert up_to_date(changed)
