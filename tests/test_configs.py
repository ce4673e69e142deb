"""Every config in configs/ prepares and trains for a few steps through the real commands."""

import json
import re
import subprocess
import sys

import pytest

from hvdtrack.config import load_config
from tests.launch import REPO, worker_env

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
# Keep each config's model, cuts and training settings; shrink only the data and the run length.
SMALL = [
    "data.num_events=4",
    "data.records.split_counts=[2, 1, 1]",
    "data.workers=1",
    "data.synthetic.num_particles=300",
    "data.synthetic.num_vertices=10",
    "train.epochs=1",
    "train.max_steps_per_epoch=2",
    "train.progress_bar=false",
    "distributed.strategy=local",
]


def run(*args, **kwargs):
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=600,
        **kwargs,
    )


def test_there_are_configs():
    assert {p.stem for p in CONFIGS} >= {"tiny", "default", "full", "trackml"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_loads(path):
    config = load_config(path)
    assert config.name == path.stem


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_runs_a_few_steps(path, tmp_path):
    overrides = [
        *SMALL,
        f"data.dataset_dir={tmp_path / 'data'}",
        f"train.run_dir={tmp_path / 'run'}",
    ]
    if load_config(path).data.source == "trackml":
        # A TrackML directory: synthetic events written in the TrackML CSV format.
        events = tmp_path / "trackml"
        script = (
            "from hvdtrack.events.synthetic import SyntheticConfig, generate_dataset;"
            f"generate_dataset(SyntheticConfig(num_particles=300, num_vertices=10), '{events}', 4, seed=3)"
        )
        assert run("-c", script).returncode == 0
        overrides += [f"data.trackml_dir={events}", "data.num_events=null"]
    prepared = run("-m", "hvdtrack.prepare", "--config", str(path), "--no-progress", *overrides)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    trained = run("-m", "hvdtrack.train", "--config", str(path), *overrides)
    assert trained.returncode == 0, trained.stderr[-3000:]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "finished" and info["config_name"] == path.stem


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train.lerning_rate=0.1"],
            r"unknown key 'train.lerning_rate' \(did you mean 'train.learning_rate'\?\)",
        ),
        (["train.epochs=0"], r"'train.epochs' must be in \[1, 1000000\]"),
        (
            ["model.num_message_passing_steps=two"],
            r"'model.num_message_passing_steps' must be an integer",
        ),
        (["distributed.strategy=spark"], r"'distributed.strategy' must be one of"),
        (["trainepochs"], r"not of the form section.key=value"),
    ],
)
def test_bad_config_exits_with_a_clear_message(args, message):
    result = run("-m", "hvdtrack.train", "--config", "configs/tiny.yaml", *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("hvdtrack: error: ")
    assert re.search(message, result.stderr), result.stderr


def test_missing_config_file():
    result = run("-m", "hvdtrack.prepare", "--config", "configs/nope.yaml")
    assert result.returncode == 2
    assert "cannot read config file configs/nope.yaml" in result.stderr


def test_hvdtrack_command_dispatches():
    result = run("-m", "hvdtrack", "train", "--config", "configs/tiny.yaml", "--print-config")
    assert result.returncode == 0
    assert json.loads(result.stdout)["name"] == "tiny"
    assert run("-m", "hvdtrack", "fly").returncode == 2


def test_prepare_refuses_bad_trackml_input_and_leaves_nothing(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    (events / "event000000001-hits.csv").write_text(
        "hit_id,x,y,z,volume_id,layer_id,module_id\n1,nan,0,0,8,2,1\n"
    )
    (events / "event000000001-truth.csv").write_text(
        "hit_id,particle_id,tx,ty,tz,tpx,tpy,tpz,weight\n1,0,0,0,0,0,0,0,0\n"
    )
    (events / "event000000001-particles.csv").write_text("particle_id,vx,vy,vz,px,py,pz,q,nhits\n")
    out = tmp_path / "dataset"
    result = run(
        "-m",
        "hvdtrack.prepare",
        "--config",
        "configs/trackml.yaml",
        "--no-progress",
        f"data.trackml_dir={events}",
        f"data.dataset_dir={out}",
        "data.records.split_fractions=[1, 0, 0]",
    )
    assert result.returncode == 2
    assert "event000000001-hits.csv" in result.stderr and "line 2" in result.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".dataset")]
