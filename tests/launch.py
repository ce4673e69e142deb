"""Launching real worker processes from tests: horovodrun (Gloo or MPI), mpirun, and plain processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def worker_env(**extra: str) -> dict[str, str]:
    """Environment for launched workers: quiet TF, root-friendly Open MPI, one thread per rank."""
    env = dict(os.environ)
    env.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        PATH=str(BIN) + os.pathsep + env.get("PATH", ""),
    )
    env.update(extra)
    return env


def horovodrun(
    np: int, args: list[str], controller: str = "gloo", timeout: float = 300, **env: str
):
    """Runs ``horovodrun -np N --gloo|--mpi python ARGS``; returns the CompletedProcess."""
    return subprocess.run(
        launch_command(np, args, controller),
        cwd=REPO,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def launch_command(np: int, args: list[str], controller: str = "gloo") -> list[str]:
    """``horovodrun -np N --gloo|--mpi python ARGS`` (or plain mpirun) as an argument list."""
    if controller == "mpirun":
        cmd = [
            shutil.which("mpirun") or "mpirun",
            "-np",
            str(np),
            "--oversubscribe",
            "--bind-to",
            "none",
        ]
        cmd += ["-x", "PYTHONPATH", "-x", "PATH", "-x", "TF_CPP_MIN_LOG_LEVEL"]
    else:
        cmd = [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", f"--{controller}"]
    return [*cmd, sys.executable, *args]


def check(result: subprocess.CompletedProcess) -> str:
    """Asserts a launched job succeeded, showing its output if not; returns stdout."""
    assert result.returncode == 0, (
        f"exit {result.returncode}\n--- stdout ---\n{result.stdout[-4000:]}\n"
        f"--- stderr ---\n{result.stderr[-4000:]}"
    )
    return result.stdout
