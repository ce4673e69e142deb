"""`--config` takes a path or a packaged configuration's name; the package ships the configs and a
checkout's configs/ links to them; train and prepare default to the packaged `default`."""

import configparser
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import hvdtrack
from hvdtrack.config import (
    DEFAULT_CONFIG_NAME,
    PACKAGED_CONFIG_DIR,
    load_config,
    packaged_configs,
    resolve_config_path,
)
from hvdtrack.errors import ConfigError
from tests.launch import REPO, worker_env

NAMES = ["barrel_pt05", "default", "full", "tiny", "trackml"]


def run(*args, cwd):
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,  # ends a hung command; each takes seconds (prepare: 3 tiny events)
    )


# ------------------------------------------------------------------ the packaged configurations


def test_packaged_configs_are_in_the_installed_package():
    files = resources.files("hvdtrack") / "configs"
    assert sorted(p.name for p in files.iterdir() if p.name.endswith(".yaml")) == [
        "barrel_pt05.yaml",
        "default.yaml",
        "full.yaml",
        "tiny.yaml",
        "trackml.yaml",
    ]
    assert list(packaged_configs()) == NAMES
    assert PACKAGED_CONFIG_DIR == Path(hvdtrack.__file__).resolve().parent / "configs"
    for name, path in packaged_configs().items():
        assert path == PACKAGED_CONFIG_DIR / f"{name}.yaml"
        assert path.read_text() == (files / f"{name}.yaml").read_text()
        assert load_config(path).name == name


def test_setup_cfg_ships_them_as_package_data():
    # with the kernel sources and their header that hvdtrack.model.kernels compiles on first use
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    shipped = [p.strip() for p in setup["options.package_data"]["hvdtrack"].split(",")]
    assert shipped == ["configs/*.yaml", "model/*.cc", "model/*.h"]


def test_checkout_configs_link_to_the_packaged_files_once_each():
    # tests/test_configs.py runs every configs/*.yaml: each packaged config exactly once.
    entries = sorted((REPO / "configs").glob("*.yaml"))
    assert [p.stem for p in entries] == NAMES
    for path in entries:
        assert path.is_symlink(), path
        assert os.readlink(path) == f"../hvdtrack/configs/{path.name}"  # relative: any clone
        assert path.resolve() == (PACKAGED_CONFIG_DIR / path.name).resolve()
    assert sorted(p.name for p in (REPO / "configs").iterdir()) == [f"{n}.yaml" for n in NAMES]


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout (e.g. an sdist)")
def test_git_stores_configs_as_symlinks():
    # In a checkout (CI runs on a fresh clone) git must answer: a failing git (not installed,
    # "dubious ownership" of the checkout, a damaged index) fails here rather than skipping.
    assert shutil.which("git"), "git is not on PATH: cannot read the checkout's index"
    listed = subprocess.run(
        ["git", "ls-files", "-s", "configs"], cwd=REPO, capture_output=True, text=True
    )
    assert listed.returncode == 0, f"git ls-files failed: {listed.stderr.strip()}"
    modes = {line.split()[-1]: line.split()[0] for line in listed.stdout.splitlines()}
    assert modes == {f"configs/{n}.yaml": "120000" for n in NAMES}


# ------------------------------------------------------------------------------ name resolution


def test_no_config_is_the_packaged_default():
    assert DEFAULT_CONFIG_NAME == "default"
    assert resolve_config_path(None) == PACKAGED_CONFIG_DIR / "default.yaml"


@pytest.mark.parametrize("name", NAMES)
def test_a_name_is_the_packaged_file(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path(name) == PACKAGED_CONFIG_DIR / f"{name}.yaml"


def test_an_existing_path_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").write_text("name: mine\n")
    assert resolve_config_path("tiny") == Path("tiny")
    assert load_config(resolve_config_path("tiny")).name == "mine"


@pytest.mark.parametrize(
    "given", ["configs/tiny.yaml", "tiny.yaml", "elsewhere/tiny", "nope.yml", "/abs/x.yaml"]
)
def test_paths_stay_paths(given, tmp_path, monkeypatch):
    # Not names (a directory part or a YAML suffix): load_config reports the missing file.
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path(given) == Path(given)


def test_repository_paths_still_work(monkeypatch):
    monkeypatch.chdir(REPO)
    assert resolve_config_path("configs/tiny.yaml") == Path("configs/tiny.yaml")
    assert load_config(resolve_config_path("configs/tiny.yaml")).name == "tiny"


def test_unknown_name_lists_the_packaged_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve_config_path("tinny")
    assert str(err.value) == (
        "--config tinny: no such file, and no packaged configuration of that name "
        "(did you mean 'tiny'?); packaged configurations: barrel_pt05, default, full, tiny, trackml; "
        "or give the path of a YAML file"
    )
    with pytest.raises(
        ConfigError, match=r"packaged configurations: barrel_pt05, default, full, tiny, trackml"
    ):
        resolve_config_path("xyz")


# --------------------------------------------------------------------------- the entry points


def test_train_without_config_uses_the_packaged_default(tmp_path):
    result = run("-m", "hvdtrack.train", "--print-config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"name": "default"' in result.stdout
    assert '"dataset_dir": "data/default"' in result.stdout


def test_names_from_any_directory_and_unknown_name(tmp_path):
    result = run("-m", "hvdtrack", "train", "--config", "tiny", "--print-config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"name": "tiny"' in result.stdout
    bad = run("-m", "hvdtrack.prepare", "--config", "tinny", cwd=tmp_path)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert bad.stderr.startswith("hvdtrack: error: --config tinny: no such file")
    assert "packaged configurations: barrel_pt05, default, full, tiny, trackml" in bad.stderr


def test_prepare_takes_a_name(tmp_path):
    result = run(
        "-m",
        "hvdtrack.prepare",
        "--config",
        "tiny",
        "--no-progress",
        "data.num_events=3",
        "data.records.split_counts=[1, 1, 1]",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "data/tiny/manifest.json").is_file()


def test_train_help_names_the_defaults(tmp_path):
    result = run("-m", "hvdtrack.train", "--help", cwd=tmp_path)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert f"the packaged 'default': {PACKAGED_CONFIG_DIR / 'default.yaml'}" in text
    assert "dataset data/default (its data.dataset_dir, relative to the current directory)" in text
    assert "The dataset is prepared on first use" in text
    assert "data.prepare_timeout_s" in text
    for name in NAMES:
        assert f" {name} dataset data/" in text
