"""Before training: the rank from the launcher's environment, and the dataset prepared on first use
(rank 0 prepares; other ranks wait with a deadline)."""

import json
import subprocess
import sys
import threading
import time

import pytest

from hvdtrack.config import load_config
from hvdtrack.distributed import launch
from hvdtrack.distributed.launch import (
    dataset_status,
    ensure_dataset,
    launcher_rank,
    wait_for_dataset,
)
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.prepare.local import prepare_dataset
from tests.launch import REPO, worker_env


def tf_config(kind, index, chief=0, workers=2):
    cluster = {"worker": [f"w{i}:2222" for i in range(workers)]}
    if chief:
        cluster["chief"] = ["c0:2222"]
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


@pytest.mark.parametrize(
    "env, rank",
    [
        ({}, 0),
        ({"HOROVOD_RANK": "3"}, 3),  # horovodrun --gloo
        ({"OMPI_COMM_WORLD_RANK": "1"}, 1),  # mpirun, horovodrun --mpi (Open MPI)
        ({"PMI_RANK": "2"}, 2),  # MPICH / Intel MPI
        ({"PMIX_RANK": "5"}, 5),
        ({"SLURM_PROCID": "7"}, 7),  # srun
        ({"SLURM_PROCID": "0", "OMPI_COMM_WORLD_RANK": "1"}, 1),  # mpirun inside an sbatch job
        ({"SLURM_PROCID": "0", "HOROVOD_RANK": "2"}, 2),  # horovodrun inside an sbatch job
        ({"SLURM_PROCID": "0", "PMI_RANK": "4", "PMIX_RANK": "4"}, 4),  # srun --mpi=pmi2/pmix
        ({"HOROVOD_RANK": "", "OMPI_COMM_WORLD_RANK": " 6 "}, 6),  # empty is unset
        ({"TF_CONFIG": tf_config("worker", 0)}, 0),
        ({"TF_CONFIG": tf_config("worker", 1)}, 1),
        ({"TF_CONFIG": tf_config("chief", 0, chief=1)}, 0),
        ({"TF_CONFIG": tf_config("worker", 0, chief=1)}, 1),
        ({"TF_CONFIG": tf_config("evaluator", 0)}, 2),
        ({"TF_CONFIG": json.dumps({"cluster": {}})}, 0),
        ({"TF_CONFIG": tf_config("worker", 0), "SLURM_PROCID": "3"}, 3),
    ],
)
def test_launcher_rank(env, rank):
    assert launcher_rank(env) == rank


@pytest.mark.parametrize(
    "env, message",
    [
        ({"PMI_RANK": "one"}, "PMI_RANK='one': the launcher's rank is not an integer >= 0"),
        ({"HOROVOD_RANK": "-1"}, "HOROVOD_RANK='-1': the launcher's rank is not an integer >= 0"),
        ({"TF_CONFIG": "{cluster"}, "TF_CONFIG is not valid JSON"),
    ],
)
def test_launcher_rank_refuses_garbage(env, message):
    with pytest.raises(ConfigError, match=message):
        launcher_rank(env)


def test_launch_module_initialises_nothing():
    # Importing it (and the preparation code) must not load Horovod or MPI.
    code = (
        "import sys, hvdtrack.distributed.launch;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('horovod', 'mpi4py'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=worker_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]


# ----------------------------------------------------------------------------- the dataset


@pytest.fixture
def config(tmp_path):
    def make(*overrides):
        return load_config(
            REPO / "configs/tiny.yaml",
            [f"data.dataset_dir={tmp_path / 'data'}", "train.progress_bar=false", *overrides],
        )

    return make


def test_rank0_prepares_a_missing_dataset_once(config, capsys):
    c = config()
    assert dataset_status(c) == "missing"
    assert ensure_dataset(c, rank=0) == "missing"
    out = capsys.readouterr().out
    assert f"[hvdtrack] dataset {c.data.dataset_dir} not found: preparing it (6 events) ..." in out
    assert dataset_status(c) == "ready"
    assert ensure_dataset(c, rank=0) == "ready"  # second time: nothing to do, nothing said
    assert ensure_dataset(c, rank=1) == "ready"
    assert "[hvdtrack]" not in capsys.readouterr().out
    # The timeout is no part of the dataset: changing it does not make the dataset stale.
    assert dataset_status(config("data.prepare_timeout_s=5")) == "ready"


def test_rank0_rebuilds_a_dataset_of_another_data_config(config, capsys):
    prepare_dataset(config("data.seed=1"), progress=False)
    c = config()
    assert dataset_status(c) == "stale"
    capsys.readouterr()
    ensure_dataset(c, rank=0)
    out = capsys.readouterr().out
    assert "is out of date: it was built from another data config (data.seed" in out
    assert "preparing it (6 events)" in out
    assert dataset_status(c) == "ready"


def test_a_directory_that_is_not_a_dataset_is_never_replaced(config, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("mine")
    c = config()
    assert dataset_status(c) == "other"
    with pytest.raises(DataError, match="exists but holds no dataset"):
        ensure_dataset(c, rank=0)
    assert (tmp_path / "data" / "notes.txt").read_text() == "mine"


def test_a_dataset_not_built_by_prepare_is_used_as_it_is(config, tmp_path, capsys):
    c = config()
    prepare_dataset(c, progress=False)
    (tmp_path / "data" / "prepare.json").unlink()
    assert dataset_status(c) == "foreign"
    capsys.readouterr()
    assert ensure_dataset(c, rank=0) == "foreign"
    assert "not built by hvdtrack prepare): used as it is" in capsys.readouterr().out


def test_other_rank_gives_up_after_the_deadline(config, tmp_path):
    c = config("data.prepare_timeout_s=0.6")
    started = time.monotonic()
    with pytest.raises(DataError) as err:
        ensure_dataset(c, rank=3, poll_seconds=0.1)
    waited = time.monotonic() - started
    # Never before its deadline; the upper bound only catches a wait that does not end
    # (generous: a loaded machine may be slow to wake the poll).
    assert 0.6 <= waited < 60
    message = str(err.value)
    assert message.startswith(f"rank 3: dataset {tmp_path / 'data'} ")
    assert "was not ready after waiting 0.6 s (data.prepare_timeout_s) for rank 0" in message
    assert "Rank 0 may have failed" in message
    assert "not on a filesystem all ranks share" in message
    assert not (tmp_path / "data").exists()  # a waiting rank never prepares


def counted_looks(monkeypatch):
    """Counts ``dataset_status`` calls of ``hvdtrack.distributed.launch`` (the real one runs);
    returns (the count list, an Event set once a rank looks a second time: it is waiting)."""
    looks, waiting = [], threading.Event()
    real = launch.dataset_status

    def status(config):
        looks.append(1)
        if len(looks) >= 2:
            waiting.set()
        return real(config)

    monkeypatch.setattr(launch, "dataset_status", status)
    return looks, waiting


def test_other_rank_proceeds_when_the_dataset_appears(config, capsys, monkeypatch):
    # Had rank 1 not seen the dataset appear, it would raise after this timeout (generous:
    # rank 0 prepares the 6 events in some 2 s here).
    c = config("data.prepare_timeout_s=120")
    _, waiting = counted_looks(monkeypatch)
    errors = []

    def rank0():
        try:
            # Rank 1 found it missing and polls (its second look) before rank 0 prepares.
            assert waiting.wait(timeout=120), "rank 1 never polled"
            prepare_dataset(c, progress=False)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    thread = threading.Thread(target=rank0)
    thread.start()
    try:
        assert ensure_dataset(c, rank=1, poll_seconds=0.1) == "missing"
    finally:
        waiting.set()  # rank 0 no longer waits if rank 1 failed first
        thread.join()
    assert not errors
    assert dataset_status(c) == "ready"
    assert "preparing" not in capsys.readouterr().out  # only rank 0 says it prepares


def test_wait_returns_at_once_when_ready(config, monkeypatch):
    c = config()
    prepare_dataset(c, progress=False)
    looks, _ = counted_looks(monkeypatch)
    wait_for_dataset(c, timeout_s=0.01, poll_seconds=10)
    assert len(looks) == 1  # ready at the first look: no poll
