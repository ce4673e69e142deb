"""The sweep's commands (dry run) and SLURM scripts (checked with bash -n)."""

from __future__ import annotations

import io
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrack.errors import ConfigError, TrainingError
from hvdtrack.scaling import sweep
from hvdtrack.train.config import TrainConfig


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("train:\n  batch_graphs: 8\n  epochs: 2\n")
    return path


def test_worker_counts():
    assert sweep.parse_worker_counts("4,1,2") == (1, 2, 4)
    with pytest.raises(ConfigError, match="comma-separated worker counts >= 1 like 1,2,4"):
        sweep.parse_worker_counts("1,two")
    with pytest.raises(ConfigError, match="worker counts >= 1"):
        sweep.parse_worker_counts("0,1")
    with pytest.raises(ConfigError, match="lists a worker count twice"):
        sweep.parse_worker_counts("1,2,2")


def test_strong_plan_splits_the_global_batch(config, tmp_path):
    plan = sweep.plan_sweep("strong", (1, 2, 4), config, tmp_path / "out", python="/py/bin/python")
    assert plan.batches == {1: 8, 2: 4, 4: 2}  # the config's batch is the global batch
    assert plan.prepare == ["/py/bin/python", "-m", "hvdtrack.prepare", "--config", str(config)]
    assert shlex.join(plan.local_command(2)) == (
        "horovodrun -np 2 -H localhost:2 --gloo /py/bin/python -m hvdtrack.train "
        f"--config {config} distributed.strategy=horovod train.batch_graphs=4 "
        f"train.run_dir={tmp_path / 'out' / 'strong-np2'}"
    )
    assert plan.report_dir == tmp_path / "out" / "report-strong"


def test_strong_plan_refuses_an_indivisible_global_batch(config, tmp_path):
    with pytest.raises(
        ConfigError, match=r"6 graphs cannot be split evenly over N = 4 workers; .* multiple of 4"
    ):
        sweep.plan_sweep("strong", (1, 2, 4), config, tmp_path, global_batch=6)


def test_weak_plan_keeps_the_batch_and_passes_overrides(config, tmp_path):
    plan = sweep.plan_sweep(
        "weak",
        (1, 2),
        config,
        tmp_path,
        batch=3,
        controller="mpi",
        overrides=["train.epochs=3"],
        python="/py/bin/python",
    )
    assert plan.batches == {1: 3, 2: 3}
    command = plan.local_command(2)
    assert command[:6] == ["horovodrun", "-np", "2", "-H", "localhost:2", "--mpi"]
    assert command[-2:] == [f"train.run_dir={tmp_path / 'weak-np2'}", "train.epochs=3"]
    assert plan.prepare[-1] == "train.epochs=3"  # the preparation sees the same config


def test_horovodrun_beside_the_interpreter_is_preferred(config, tmp_path):
    plan = sweep.plan_sweep("weak", (1,), config, tmp_path, python=sys.executable)
    beside = shutil.which("horovodrun", path=str(Path(sys.executable).parent))
    assert plan.local_command(1)[0] == (beside or "horovodrun")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overrides": ["train.batch_graphs=2"]}, "the sweep sets train.batch_graphs itself"),
        ({"overrides": ["epochs"]}, "is not of the form section.key=value"),
        ({"batch": 2}, "--batch is for weak scaling"),
        ({"mode": "weak", "global_batch": 2}, "--global-batch is for strong scaling"),
    ],
)
def test_bad_sweep_arguments(config, tmp_path, kwargs, message):
    args = {"mode": "strong", **kwargs}
    with pytest.raises(ConfigError, match=message):
        sweep.plan_sweep(args.pop("mode"), (1, 2), config, tmp_path, **args)


def test_the_config_and_overrides_are_checked_and_give_the_default_batch(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope.yaml"):
        sweep.plan_sweep("strong", (1,), tmp_path / "nope.yaml", tmp_path)
    bare = tmp_path / "bare.yaml"
    bare.write_text("model:\n  num_message_passing_steps: 2\n")
    with pytest.raises(ConfigError, match="train.epoch"):  # a typo, before any run starts
        sweep.plan_sweep("strong", (1,), bare, tmp_path, overrides=["train.epoch=2"])
    plan = sweep.plan_sweep("weak", (1, 2), bare, tmp_path)
    assert plan.batches == {n: TrainConfig().batch_graphs for n in (1, 2)}


def test_dry_run_prints_every_command_and_runs_nothing(config, tmp_path):
    plan = sweep.plan_sweep("strong", (1, 2), config, tmp_path / "out", python="/py/bin/python")
    out = io.StringIO()
    assert sweep.run_sweep(plan, dry_run=True, out=out) is None
    lines = out.getvalue().splitlines()
    assert lines[0] == f"/py/bin/python -m hvdtrack.prepare --config {config}"
    assert lines[1].startswith(
        "horovodrun -np 1 -H localhost:1 --gloo /py/bin/python -m hvdtrack.train"
    )
    assert "train.batch_graphs=4" in lines[2]
    assert lines[3].startswith("/py/bin/python -m hvdtrack.scaling report ")
    assert lines[3].endswith(f"--mode strong --out {tmp_path / 'out' / 'report-strong'}")
    assert not (tmp_path / "out").exists()


def test_slurm_sweep_copies_the_scripts_and_submits_them_quoted(config, tmp_path):
    plan = sweep.plan_sweep(
        "strong", (4, 8), config, tmp_path / "out", overrides=["data.dataset_dir=my data"]
    )
    options = sweep.SlurmOptions(
        gpus_per_node=4, cpus_per_task=8, partition="gpu", setup=("module load openmpi",)
    )
    paths = sweep.write_slurm_scripts(plan, options, workdir=tmp_path, out=io.StringIO())
    assert sorted(paths) == ["prepare.sbatch", "submit_all.sh", "train.sbatch"]
    for name in ("prepare.sbatch", "train.sbatch"):
        assert paths[name].read_text() == (sweep.SLURM_SCRIPTS / name).read_text()
    result = subprocess.run(["bash", "-n", str(paths["submit_all.sh"])], capture_output=True)
    assert result.returncode == 0, result.stderr
    lines = paths["submit_all.sh"].read_text().splitlines()
    assert f"cd {shlex.quote(str(tmp_path))}" in lines and "module load openmpi" in lines
    assert (
        'runs+=("$(submit "${after[@]}" --job-name=hvdtrack-strong-np8 --partition=gpu '
        "--nodes=2 --ntasks-per-node=4 --cpus-per-task=8 --gpus-per-node=4 "
        f'"$here/train.sbatch" {config} train.batch_graphs=1 '
        f"train.run_dir={tmp_path / 'out' / 'strong-np8'} 'data.dataset_dir=my data')\")"
    ) in lines
    assert 'after=(--dependency=afterok:"$prepare")' in lines
    assert options.options(4)[-1] == "--gpus-per-node=4"
    assert sweep.SlurmOptions(gpus_per_node=4).options(2)[-1] == "--gpus-per-node=2"
    assert any(line.startswith('report="$(submit "${after[@]}" --job-name=') for line in lines)
    assert not any("#SBATCH" in line for line in lines)  # the scripts' own lines apply


def test_slurm_sweep_without_the_repository_scripts_is_refused(config, tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "SLURM_SCRIPTS", tmp_path / "nowhere")
    plan = sweep.plan_sweep("strong", (1,), config, tmp_path / "out")
    with pytest.raises(ConfigError, match=r"nowhere/prepare.sbatch not found: .*checkout"):
        sweep.write_slurm_scripts(plan, sweep.SlurmOptions(), out=io.StringIO())
    assert not (tmp_path / "out").exists()


def test_slurm_layout_must_fill_nodes():
    assert sweep.SlurmOptions(tasks_per_node=4).layout(2) == (1, 2)
    assert sweep.SlurmOptions(tasks_per_node=4).layout(16) == (4, 4)
    assert sweep.SlurmOptions().layout(6) == (1, 6)
    with pytest.raises(ConfigError, match="N=6 workers do not fill nodes of 4 tasks"):
        sweep.SlurmOptions(tasks_per_node=4).layout(6)


def test_failure_tail_prefers_the_ranks_output():
    lines = [
        "launching\n",
        "[0]<stderr>:error: dataset missing\n",
        "[1,0]<stdout>:bye\n",
        "Traceback (most recent call last):\n",
        "RuntimeError: a process failed\n",
    ]
    assert sweep._failure_tail(lines) == "[0]<stderr>:error: dataset missing\n[1,0]<stdout>:bye\n"
    assert sweep._failure_tail(["only\n", "horovodrun\n"], count=1) == "horovodrun\n"


TINY = """\
name: scaling-e2e
data:
  source: synthetic
  dataset_dir: {data}
  num_events: 6
  synthetic: {{num_particles: 200, num_vertices: 8}}
  records: {{split_counts: [4, 1, 1]}}
model:
  node_encoder: [16, 8]
  edge_encoder: [16, 8]
  edge_update: [16, 8]
  node_update: [16, 8]
  num_message_passing_steps: 1
  output_head: [8]
train: {{epochs: 2, batch_graphs: 2, progress_bar: false}}
distributed: {{strategy: horovod, threads_per_worker: 1}}
scaling: {{price_per_device_hour: 0.05, device_power_watts: 5.0, timing_warmup_steps: 1}}
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_failed_training_run_is_reported_with_the_ranks_lines(tmp_path):
    config = tmp_path / "tiny.yaml"
    # A dataset directory holding something else: training refuses it (and touches nothing).
    (tmp_path / "not-a-dataset").mkdir()
    (tmp_path / "not-a-dataset" / "notes.txt").write_text("mine")
    config.write_text(TINY.format(data=tmp_path / "not-a-dataset"))
    plan = sweep.plan_sweep("strong", (1,), config, tmp_path / "out")
    with pytest.raises(
        TrainingError, match=r"(?s)training run N=1 failed with exit code \d+: .*\[0\]<std"
    ):
        sweep.run_sweep(plan, skip_prepare=True, out=io.StringIO())
    assert (tmp_path / "out" / "logs" / "strong-np1.log").is_file()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.extended
def test_local_strong_sweep_end_to_end(tmp_path):
    # prepare once, horovodrun -np 1 and -np 2 (Gloo), then the report: a few minutes on 2 cores.
    # Extended: the default run has the same sweep (N = 1, 2, then the report) under SLURM
    # (tests/slurm/test_scaling_sweep.py), the local commands (dry run above) and a local
    # training run that fails (above).
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY.format(data=tmp_path / "data"))
    plan = sweep.plan_sweep("strong", (1, 2), config, tmp_path / "out")
    paths = sweep.run_sweep(plan, out=io.StringIO())
    md = paths["md"].read_text()
    assert "| 1 | " in md and "| 2 | " in md and "Checked against the runs measured here" in md
