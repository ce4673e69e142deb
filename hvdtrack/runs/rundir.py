"""The run directory (resolved config, versions, git revision) and HParams; its one writer.

``claim`` checks that a run directory can be this run's (not a dataset, not a folder of other
files, writable with room for a checkpoint) and locks it (``utils.lock``): the chief of a
training holds the lock for the whole job, the other ranks write nothing there.
"""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from hvdtrack.config import Config, config_to_dict, dump_config
from hvdtrack.errors import ConfigError
from hvdtrack.records.manifest import MANIFEST_NAME
from hvdtrack.runs.runinfo import flatten_config
from hvdtrack.utils.io import write_json
from hvdtrack.utils.lock import DirectoryLock

LOCK_NAME = ".hvdtrack.lock"
# What makes a folder an hvdtrack run directory (rundir.prepare writes them first).
RUN_MARKERS = ("run.json", "versions.json", "config.yaml", "checkpoints")
# The subdirectories training writes, probed before it starts.
WRITTEN_DIRS = ("checkpoints", "best", "tensorboard")
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)

# What a resumed run may change: how long it runs, how it logs, checkpoints and launches. Any
# other setting (data, model, optimiser, batch, seed, exchange) makes it another run.
RESUMABLE_CHANGES = (
    "name",
    "data.workers",
    "data.prepare_timeout_s",
    "train.run_dir",
    "train.epochs",
    "train.stop_after_steps",
    "train.checkpoint_every_steps",
    "train.checkpoint_every_minutes",
    "train.keep_checkpoints",
    "train.resume",
    "train.allow_changed_config",
    "train.validate_every_epochs",
    "train.log_every_steps",
    "train.profile_steps",
    "train.progress_bar",
    "train.progress_interval_s",
    "train.verify_checksums",
    "distributed.strategy",
    "distributed.threads_per_worker",
    "distributed.num_cpu_devices",
    "distributed.horovod_cycle_time_ms",
    "distributed.deadline_s",
    # Same variables, checkpoint and data order; the gradients equal the plain step's to float
    # rounding (tests/train/test_stages*.py): only the speed changes (StagesConfig).
    "distributed.stages",
    "distributed.pipeline",  # its old name, in run directories written before the rename
    "scaling",
)

PACKAGES = (
    "tensorflow",
    "tensorflow-cpu",
    "horovod",
    "dm-sonnet",
    "graph-nets",
    "numpy",
    "mpi4py",
    "tensorboard",
)


def hostname() -> str:
    return socket.gethostname()


def versions() -> dict[str, Any]:
    """Library versions, Python and the git revision of the hvdtrack checkout (if any)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    repo = Path(__file__).resolve().parents[2]
    try:
        revision = subprocess.run(
            ["git", "-C", str(repo), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        revision = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": found,
        "hvdtrack_git_revision": revision,
    }


def prepare(run_dir: Path, config: Config, resumed_from: str | None = None) -> None:
    """Creates ``run_dir`` with ``config.yaml`` (resolved) and ``versions.json`` (chief only).

    A resumed run keeps the versions of its earlier starts: when they differ from this start's,
    they go to ``versions.json``'s ``previous`` list (oldest first). Each entry's
    ``resumed_from`` is the checkpoint its start resumed from (None: from the start), so the
    code of every step is known."""
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, run_dir / "config.yaml")
    path = run_dir / "versions.json"
    current = {**versions(), "resumed_from": resumed_from}
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        earlier = None
    if isinstance(earlier, dict):
        previous = earlier.pop("previous", [])
        same = {k: v for k, v in earlier.items() if k != "resumed_from"} == {
            k: v for k, v in current.items() if k != "resumed_from"
        }
        if same:  # the same code again: the entry keeps where it first started
            current["resumed_from"] = earlier.get("resumed_from")
        else:
            previous = [*previous, earlier]
        if previous:
            current["previous"] = previous
    write_json(path, current)


def write_hparams(writer, config: Config, num_workers: int, global_batch: int) -> None:
    """Records the run's hyperparameters for TensorBoard's HParams dashboard."""
    from tensorboard.plugins.hparams import api as hp

    flat: dict[str, Any] = {"num_workers": num_workers, "global_batch_graphs": global_batch}
    for section in ("model", "train", "distributed"):
        for key, value in config_to_dict(config)[section].items():
            if isinstance(value, (bool, int, float, str)):
                flat[f"{section}.{key}"] = value
            elif isinstance(value, list):
                flat[f"{section}.{key}"] = str(value)
    with writer.as_default():
        hp.hparams(flat, trial_id=Path(config.train.run_dir).name)


def check_resume(
    run_dir: Path,
    previous: dict[str, Any],
    config: Config,
    num_workers: int,
    latest_checkpoint: str | None,
    dataset_digest: str,
    step_in_epoch: int = 0,
) -> None:
    """Refuses a resume that would not continue the same run; call before writing anything.

    ``previous`` is the run's ``run.json``; ``step_in_epoch`` the position the newest checkpoint
    holds (``latest_checkpoint``; 0 at an epoch's end). Refused: another value of any setting outside
    ``RESUMABLE_CHANGES`` (the first one is named), another dataset (manifest digest), and
    another worker count when the checkpoint lies inside an epoch (its plan was made for the
    old count: graphs would be skipped or repeated). ``train.allow_changed_config`` lets the
    first two pass.

    Raises:
      ConfigError: naming the run directory, the setting and both values.
    """
    fix = (
        "Use another train.run_dir, or train.resume=false to start afresh"
        + ", or train.allow_changed_config=true to resume anyway"
    )
    if not config.train.allow_changed_config:
        key, old, new = _first_difference(previous.get("config") or {}, config_to_dict(config))
        if key is not None:
            raise ConfigError(
                f"{run_dir} was trained with {key}={old!r}, this command has {key}={new!r}: "
                f"resuming would not continue the same run. {fix}"
            )
        old_digest = previous.get("dataset_digest")
        if old_digest is not None and old_digest != dataset_digest:
            raise ConfigError(
                f"{run_dir} was trained on another dataset (manifest digest {old_digest}, now "
                f"{dataset_digest} in {config.data.dataset_dir}). {fix}"
            )
    old_workers = previous.get("num_workers")
    if latest_checkpoint and old_workers != num_workers and step_in_epoch:
        raise ConfigError(
            f"{run_dir} stopped inside an epoch (checkpoint {latest_checkpoint}, step "
            f"{step_in_epoch}) with {old_workers} workers; resuming with {num_workers} would "
            f"skip or repeat graphs of that epoch's plan. Resume with {old_workers} workers, or "
            "use another train.run_dir"
        )


def _first_difference(old: dict, new: dict) -> tuple[str | None, Any, Any]:
    flat_old, flat_new = flatten_config(old), flatten_config(new)
    for key in sorted(set(flat_old) | set(flat_new)):
        if any(key == k or key.startswith(f"{k}.") for k in RESUMABLE_CHANGES):
            continue
        if key in flat_old and key in flat_new and flat_old[key] != flat_new[key]:
            return key, flat_old[key], flat_new[key]
    return None, None, None


def claim(
    run_dir: Path, dataset_dir: Path, needed_bytes: int, say=None, job: str = "", wait_s=0.0
) -> DirectoryLock:
    """Locks ``run_dir`` for this run's writer, after checking it can be this run's: not a
    dataset (nor inside ``dataset_dir``), not a folder of files hvdtrack did not write, writable
    where training writes, and with ``needed_bytes`` free. Release the returned lock at the end.
    ``job`` and ``wait_s``: as ``DirectoryLock`` takes them (an elastic job's new chief).

    Raises:
      ConfigError: naming what is there, or the path that cannot be written and what to do.
      DirectoryBusy: another process writes ``run_dir`` (naming it).
    """
    _check_contents(run_dir, dataset_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = DirectoryLock(run_dir / LOCK_NAME, run_dir, "train.run_dir", say, job)
        lock.acquire(wait_s)
    except OSError as err:
        raise ConfigError(disk_error(err, run_dir)) from None
    try:
        _probe(run_dir, needed_bytes)
    except BaseException:
        lock.release()
        raise
    return lock


def _check_contents(run_dir: Path, dataset_dir: Path) -> None:
    fix = "point train.run_dir at a new or an hvdtrack run directory"
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"train.run_dir {run_dir} is a file, not a directory: {fix}")
    resolved, dataset = run_dir.resolve(), dataset_dir.resolve()
    if (run_dir / MANIFEST_NAME).exists() or resolved == dataset or dataset in resolved.parents:
        raise ConfigError(
            f"train.run_dir {run_dir} is (inside) a dataset directory (data.dataset_dir "
            f"{dataset_dir}, or a {MANIFEST_NAME} there): {fix}"
        )
    if not run_dir.is_dir():
        return
    present = sorted(p.name for p in run_dir.iterdir() if not p.name.startswith("."))
    # A lock file is hvdtrack's: a writer holds it (the lock refuses, naming it) or left it.
    # Its writer may be between creating and removing its probes (``best`` alone, say).
    locked = (run_dir / LOCK_NAME).exists()
    if present and not locked and not any(name in present for name in RUN_MARKERS):
        shown = ", ".join(present[:5]) + (
            f" and {len(present) - 5} more" if len(present) > 5 else ""
        )
        raise ConfigError(
            f"train.run_dir {run_dir} holds files that are not an hvdtrack run's ({shown}); "
            f"training will not mix its files in: {fix}"
        )


def _probe(run_dir: Path, needed_bytes: int) -> None:
    """Writes (and removes) a small file where training writes; checks the free space."""
    for name in WRITTEN_DIRS:
        target = run_dir / name
        created = not target.exists()
        probe = target / f".probe-{os.getpid()}"
        try:
            target.mkdir(exist_ok=True)
            try:
                with open(probe, "wb") as f:
                    f.write(b"\0" * 4096)
                    f.flush()
                    os.fsync(f.fileno())
            finally:
                probe.unlink(missing_ok=True)
                if created:
                    target.rmdir()
        except OSError as err:
            raise ConfigError(disk_error(err, target)) from None
    stat = os.statvfs(run_dir)
    free = stat.f_bavail * stat.f_frsize
    if free < needed_bytes:
        raise ConfigError(
            f"{run_dir}: {_size(free)} free, saving checkpoints needs about "
            f"{_size(needed_bytes)}: free space there, or use another train.run_dir"
        )


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def disk_error(err: OSError, path: Path, after: str = "") -> str:
    """One line for a write that failed on a full, read-only or forbidden filesystem."""
    where = Path(err.filename or path)
    while "temp" in where.name and where.parent != where:  # TensorFlow's temporaries: their folder
        where = where.parent
    other = "or use another train.run_dir"
    what = {
        errno.ENOSPC: f"the filesystem is full: free space there, {other}",
        errno.EDQUOT: f"the disk quota is exceeded: free space there, {other}",
        errno.EROFS: "the filesystem is read-only: use another train.run_dir",
    }.get(err.errno, f"{err.strerror or err}: make it writable (not immutable), {other}")
    return f"cannot write {where}: {what}{after}"


def as_disk_error(err: BaseException) -> OSError | None:
    """``err`` as an OSError with the path, when a write failed because the filesystem is full,
    read-only or forbidden (an OSError, or TensorFlow's error for one, which names the path in
    its text: ``PATH; No space left on device``); None for any other error."""
    if isinstance(err, OSError):
        return err if err.errno in DISK_ERRORS else None
    text = str(err)
    for code in DISK_ERRORS:
        at = text.find(os.strerror(code))
        if at >= 0:
            paths = re.findall(r"/[^\s;,'\"]+", text[:at])
            return OSError(code, os.strerror(code), paths[-1] if paths else None)
    return None
