"""Launcher and strategy agree, or the run is refused before anything is written: the launcher and
its process count from hand-made environments (as horovodrun, mpirun, srun and sbatch set them),
a real ``horovodrun -np 2`` of a local-strategy training that leaves no run directory, and of a
prepare without MPI that leaves no dataset."""

import json

import pytest

from hvdtrack.config import load_config
from hvdtrack.distributed.config import launched_processes
from hvdtrack.distributed.launch import check_launch, tf_config_tasks
from hvdtrack.errors import ConfigError
from tests.launch import REPO, horovodrun

TINY = REPO / "configs/tiny.yaml"
# What a batch script sees (sbatch --ntasks=2, no srun): one process, whatever SLURM_NTASKS says.
SBATCH = {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_PROCID": "0"}
# A task of `srun --ntasks=2` inside that job.
SRUN = {**SBATCH, "SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}


def tf_config(kind="worker", index=0, workers=2, chief=0):
    cluster = {"worker": [f"w{i}:2222" for i in range(workers)]}
    if chief:
        cluster["chief"] = ["c0:2222"]
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


@pytest.mark.parametrize(
    "env, launch",
    [
        ({}, None),
        (SBATCH, None),
        ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}, ("horovodrun", 2)),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "PMIX_RANK": "0"},
         ("Open MPI's mpirun", 4)),
        ({"PMI_RANK": "1", "PMI_SIZE": "2", **SRUN}, ("an MPI launcher (PMI)", 2)),  # --mpi=pmi2
        ({"PMIX_RANK": "1", **SRUN}, ("a PMIx launcher", 2)),  # srun --mpi=pmix
        ({"PMIX_RANK": "1"}, ("a PMIx launcher", None)),  # says no count
        (SRUN, ("srun", 2)),
        ({**SBATCH, "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, ("horovodrun", 2)),  # in sbatch
        ({**SBATCH, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3"},
         ("Open MPI's mpirun", 3)),
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"}, ("horovodrun", 1)),
    ],
)  # fmt: skip
def test_launched_processes(env, launch):
    assert launched_processes(env) == launch


def test_launched_processes_refuses_a_bad_count():
    with pytest.raises(ConfigError, match=r"HOROVOD_SIZE='0': the launcher's process count is not"):
        launched_processes({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "0"})


def tiny(strategy):
    return load_config(TINY, [f"distributed.strategy={strategy}", "train.run_dir=runs/x"])


@pytest.mark.parametrize(
    "strategy, env",
    [
        ("local", {}),
        ("local", SBATCH),  # python -m hvdtrack.train in a batch script: one process
        ("local", {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"}),  # one process of a launch
        ("mirrored", {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}),
        ("horovod", {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}),
        ("horovod", {**SBATCH, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}),
        ("horovod", {"PMIX_RANK": "0"}),
        ("multiworker", SRUN),  # SLURM's cluster resolver: the srun step's tasks
        ("multiworker", {"PMI_RANK": "1", "PMI_SIZE": "2", **SRUN}),
        ("multiworker", {"TF_CONFIG": tf_config(index=1)}),  # no launcher
        ("multiworker", {"TF_CONFIG": tf_config(), "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}),
        ("multiworker", {"TF_CONFIG": tf_config(chief=1, workers=1), **SRUN}),
    ],
)
def test_check_launch_accepts(strategy, env):
    check_launch(tiny(strategy), env)


@pytest.mark.parametrize(
    "strategy, env, message",
    [
        ("local", {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"},
         "started by horovodrun as 2 processes, but 'distributed.strategy' is local: each "
         "process would train on its own, all writing runs/x. Set distributed.strategy=horovod, "
         "or start one process"),
        ("mirrored", {**SBATCH, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8"},
         "started by Open MPI's mpirun as 8 processes, but 'distributed.strategy' is mirrored"),
        ("local", {"PMI_RANK": "0", "PMI_SIZE": "3"},
         "started by an MPI launcher (PMI) as 3 processes, but 'distributed.strategy' is local"),
        ("local", {"PMIX_RANK": "0"},
         "started by a PMIx launcher as several processes (it does not say how many), but"),
        ("local", SRUN, "started by srun as 2 processes, but 'distributed.strategy' is local"),
        ("multiworker", {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"},
         "started by horovodrun as 2 processes, but 'distributed.strategy' is multiworker"),
        ("multiworker", {**SBATCH, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
         "started by Open MPI's mpirun as 2 processes, but"),  # SLURM_PROCID of the batch step
        ("multiworker", {"TF_CONFIG": tf_config(workers=3), "HOROVOD_RANK": "0",
                         "HOROVOD_SIZE": "2"},
         "started by horovodrun as 2 processes while TF_CONFIG's cluster has 3 tasks, but"),
        ("multiworker", {"TF_CONFIG": tf_config(index=2)},
         "TF_CONFIG's task {\"type\": \"worker\", \"index\": 2} is not one of its cluster's "
         "worker 0..1"),
        ("multiworker", {"TF_CONFIG": json.dumps({"cluster": {}})},
         "TF_CONFIG's cluster needs a non-empty \"worker\""),
        ("multiworker", {"TF_CONFIG": "[1]"}, "TF_CONFIG must be a JSON object"),
        ("multiworker", {"TF_CONFIG": '{"cluster": '}, "TF_CONFIG is not valid JSON"),
    ],
)  # fmt: skip
def test_check_launch_refuses(strategy, env, message):
    with pytest.raises(ConfigError) as err:
        check_launch(tiny(strategy), env)
    assert message in str(err.value)


def test_tf_config_tasks_counts_chief_and_workers():
    assert tf_config_tasks(tf_config("chief", 0, workers=3, chief=1)) == 4


def test_local_training_under_horovodrun_is_refused_before_anything_is_written(tmp_path):
    run_dir, dataset = tmp_path / "run", tmp_path / "data"
    args = ["-m", "hvdtrack.train", "--config", str(TINY), f"train.run_dir={run_dir}"]
    args += [f"data.dataset_dir={dataset}", "distributed.strategy=local"]
    done = horovodrun(2, args, timeout=120)  # a hang guard: it ends in seconds
    assert done.returncode != 0, done.stdout + done.stderr
    message = (
        "hvdtrack: error: started by horovodrun as 2 processes, but 'distributed.strategy' is "
        f"local: each process would train on its own, all writing {run_dir}. Set "
        "distributed.strategy=horovod, or start one process"
    )
    assert message in done.stdout + done.stderr, done.stdout + done.stderr
    assert not run_dir.exists() and not dataset.exists()


def test_prepare_under_horovodrun_without_mpi_is_refused_before_anything_is_written(tmp_path):
    dataset = tmp_path / "data"
    args = ["-m", "hvdtrack.prepare", "--config", str(TINY), f"data.dataset_dir={dataset}"]
    done = horovodrun(2, args, timeout=120)  # a hang guard: it ends in seconds
    assert done.returncode != 0, done.stdout + done.stderr
    message = (
        "hvdtrack: error: started by horovodrun as 2 processes without MPI: each would prepare "
        f"{dataset} on its own. Run python -m hvdtrack.prepare as one process, or under mpirun "
        "or srun --mpi=pmix (the ranks share the work)"
    )
    assert message in done.stdout + done.stderr, done.stdout + done.stderr
    assert not dataset.exists()
