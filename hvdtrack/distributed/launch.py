"""Before training starts: this process's rank, read from the launcher's environment, and the dataset
prepared on first use - by exactly one rank, before Horovod, MPI or tf.distribute is initialised.

Forking the preparation's process pool after ``hvd.init`` (or MPI_Init) is unsafe, and a rank that
waits minutes at a Horovod collective triggers stall warnings; so the rank comes from the
environment variables the launchers set (nothing is initialised), rank 0 prepares the dataset with
``hvdtrack.prepare.local.prepare_dataset``, and the other ranks poll the file system until it is
complete.

Public symbols: ``launcher_rank``, ``dataset_status``, ``ensure_dataset``, ``wait_for_dataset``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Mapping

from hvdtrack.config import Config
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.prepare.jobs import PREPARE_INFO, up_to_date
from hvdtrack.prepare.local import prepare_dataset
from hvdtrack.records.manifest import MANIFEST_NAME

# In order: horovodrun --gloo; mpirun / horovodrun --mpi with Open MPI; MPICH / Intel MPI (Hydra)
# and PMIx launchers; srun. The first one set wins (horovodrun or mpirun inside a SLURM job still
# see the batch step's SLURM_PROCID, hence SLURM last). TF_CONFIG (multiworker) comes after them.
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
POLL_SECONDS = 2.0


def launcher_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's global rank as its launcher announced it; 0 when not launched by one.

    Reads ``RANK_VARIABLES``, then ``TF_CONFIG`` (chief is rank 0, then workers in index order;
    worker 0 is rank 0 when there is no chief). Initialises nothing.

    Raises:
      ConfigError: a rank variable that is not a non-negative integer, or TF_CONFIG not JSON.
    """
    env = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            if not value.isdigit():
                raise ConfigError(f"{name}={value!r}: the launcher's rank is not an integer >= 0")
            return int(value)
    if env.get("TF_CONFIG", "").strip():
        return _tf_config_rank(env["TF_CONFIG"])
    return 0


def _tf_config_rank(text: str) -> int:
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({err})") from None
    task = spec.get("task") or {}
    cluster = spec.get("cluster") or {}
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    chiefs, workers = len(cluster.get("chief", [])), len(cluster.get("worker", []))
    if kind == "chief":
        return index
    if kind == "worker":
        return chiefs + index
    return max(1, chiefs + workers + index)  # evaluator / ps: never the one that prepares


def dataset_status(config: Config) -> str:
    """``ready`` (built by ``hvdtrack prepare`` from this data config), ``foreign`` (a dataset with
    no ``prepare.json``, e.g. from ``records.write_dataset``: used as it is), ``missing`` (absent
    or an empty directory), ``stale`` (built from another data config, or incomplete), ``other``
    (a directory holding something else, which is never replaced)."""
    target = Path(config.data.dataset_dir)
    if not target.exists():
        return "missing"
    has_manifest = (target / MANIFEST_NAME).is_file()
    if (target / PREPARE_INFO).is_file():
        return "ready" if has_manifest and up_to_date(config) else "stale"
    if has_manifest:
        return "foreign"
    if target.is_dir() and not any(target.iterdir()):
        return "missing"
    return "other"


def ensure_dataset(
    config: Config, rank: int | None = None, poll_seconds: float = POLL_SECONDS
) -> str:
    """Makes sure ``config.data.dataset_dir`` holds this config's dataset before training.

    Rank 0 prepares a missing or stale dataset (saying so); the other ranks wait for it, at most
    ``data.prepare_timeout_s``. Call it before anything initialises Horovod / MPI / TensorFlow's
    distribution. Returns the status it found (see ``dataset_status``).

    Raises:
      DataError: rank 0's preparation failed, ``dataset_dir`` holds something that is not a
        dataset, or (other ranks) the dataset was not ready in time.
    """
    rank = launcher_rank() if rank is None else rank
    status = dataset_status(config)
    target = config.data.dataset_dir
    if status == "other":
        raise DataError(
            f"data.dataset_dir {target} exists but holds no dataset (no {MANIFEST_NAME}); training "
            "will not replace it: remove it, or point data.dataset_dir elsewhere"
        )
    if status == "foreign" and rank == 0:
        _say(
            f"dataset {target} has no {PREPARE_INFO} (not built by hvdtrack prepare): used as it is"
        )
    if status in ("ready", "foreign"):
        return status
    if rank != 0:
        wait_for_dataset(config, config.data.prepare_timeout_s, poll_seconds, rank)
        return status
    reason = "not found" if status == "missing" else "is out of date (another data config)"
    _say(f"dataset {target} {reason}: preparing it ({_what(config)}) ...")
    started = time.perf_counter()
    prepare_dataset(config, progress=config.train.progress_bar)
    _say(f"dataset {target} prepared in {time.perf_counter() - started:.1f} s")
    return status


def wait_for_dataset(
    config: Config, timeout_s: float, poll_seconds: float = POLL_SECONDS, rank: int = 1
) -> None:
    """Polls until rank 0 has put a complete, up-to-date dataset in place (its manifest and
    ``prepare.json`` appear together, by an atomic rename); after ``timeout_s`` raises DataError."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = dataset_status(config)
        if status in ("ready", "foreign"):
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(poll_seconds, remaining))
    target = config.data.dataset_dir
    raise DataError(
        f"rank {rank}: dataset {target} ({Path(target).resolve()}) was not ready after waiting "
        f"{timeout_s:g} s (data.prepare_timeout_s) for rank 0 to prepare it. Rank 0 may have "
        "failed (see its output), or the dataset directory is not on a filesystem all ranks "
        "share: put data.dataset_dir on a shared filesystem, or run `python -m hvdtrack.prepare` "
        "with the same config where every rank can see the result"
    )


def _what(config: Config) -> str:
    data = config.data
    if data.source == "synthetic":
        return f"{data.num_events} events"
    if data.num_events is None:
        return f"every event of {data.trackml_dir}"
    return f"{data.num_events} events of {data.trackml_dir}"


def _say(message: str) -> None:
    print(f"[hvdtrack] {message}", flush=True)
