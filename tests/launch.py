"""Launching real worker processes from tests: horovodrun (Gloo or MPI), mpirun, and plain processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
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


def start_training(np: int, args: list[str], run_dir: Path, timeout: float = 120):
    """Starts ``horovodrun -np N python ARGS`` (output in ``.communicate()``) and returns the
    Popen once the run's first epoch is recorded: training is under way."""
    job = subprocess.Popen(
        launch_command(np, args),
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout
    while not (run_dir / "timing.jsonl").exists() and job.poll() is None:
        assert time.monotonic() < deadline, f"{run_dir}: no epoch after {timeout} s"
        time.sleep(0.2)
    return job


def rank_pid(run_dir: Path, rank: int, timeout: float = 120) -> int:
    """The pid of the training process of ``rank`` in ``run_dir`` (from /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if (
                f"train.run_dir={run_dir}".encode() in cmdline
                and b"horovodrun" not in b" ".join(cmdline)
                and f"HOROVOD_RANK={rank}".encode() in environ
            ):
                return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} process for {run_dir}")
