"""The run directory (resolved config, versions, git revision) and HParams."""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from hvdtrack.config import Config, config_to_dict, dump_config
from hvdtrack.utils.io import write_json

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


def prepare(run_dir: Path, config: Config) -> None:
    """Creates ``run_dir`` with ``config.yaml`` (resolved) and ``versions.json`` (chief only)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, run_dir / "config.yaml")
    write_json(run_dir / "versions.json", versions())


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
