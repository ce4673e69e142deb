"""A one-node SLURM cluster for the session (run_scripts/slurm_cluster.sh) and helpers to submit
jobs to it and wait for them, every wait with a deadline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch import REPO, free_ports

SCRIPT = REPO / "run_scripts/slurm_cluster.sh"
# Job states after which a job does not run again (a requeued job passes through PENDING).
FINAL_STATES = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}
DAEMONS = ("slurmctld", "slurmd", "sbatch", "munged", "mungekey")


def _have_packages() -> bool:
    return all(
        shutil.which(d, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") for d in DAEMONS
    )


def _install_packages() -> str | None:
    """apt-get installs slurm-wlm and munge; returns why it failed, or None."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "slurm-wlm", "munge"],
    ):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{' '.join(cmd)}: {error}"
        if done.returncode != 0:
            return f"{' '.join(cmd)} failed: {done.stderr[-500:]}"
    return None


class Cluster:
    """The test cluster: ``sbatch`` a script, read a job's fields, wait for a job to end."""

    def __init__(self, directory: Path, env: dict[str, str]):
        self.directory = directory
        self.env = env

    def run(self, *cmd: str, timeout: float = 30, **extra_env: str) -> str:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            env={**self.env, **extra_env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr}"
        return done.stdout

    def sbatch(self, *args: str, **extra_env: str) -> str:
        """Submits ``sbatch --parsable ARGS`` from the repository root; returns the job id."""
        return self.run("sbatch", "--parsable", *args, **extra_env).strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...)."""
        fields = {}
        for item in self.run("scontrol", "show", "job", "--oneliner", job_id).split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    def cancel(self, *job_ids: str) -> None:
        """scancel, quietly: some of the jobs may have ended already."""
        subprocess.run(["scancel", *job_ids], env=self.env, capture_output=True, timeout=30)

    def wait(self, job_id: str, timeout: float, until=None) -> dict[str, str]:
        """Polls the job until ``until(fields)`` (default: a final state); fails after timeout."""
        until = until or (lambda f: f["JobState"] in FINAL_STATES)
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if until(fields):
                return fields
            if time.monotonic() > deadline:
                self.run("scancel", job_id)
                raise AssertionError(f"job {job_id} after {timeout} s: {fields}")
            time.sleep(0.25)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Cluster:
    """Starts a one-node cluster in a fresh directory, on free ports (so that one already running
    on the machine is left alone); stops it at the end of the session."""
    if os.geteuid() != 0:
        pytest.skip("the test SLURM cluster runs as root (run_scripts/slurm_cluster.sh)")
    if not _have_packages():
        why = _install_packages()
        if why or not _have_packages():
            pytest.skip(f"slurm-wlm and munge are missing and could not be installed: {why}")
    directory = tmp_path_factory.mktemp("slurm")
    ctld_port, slurmd_port = free_ports(2)
    env = dict(
        os.environ,
        HVDTRACK_SLURM_DIR=str(directory),
        HVDTRACK_SLURMCTLD_PORT=str(ctld_port),
        HVDTRACK_SLURMD_PORT=str(slurmd_port),
        SLURM_CONF=str(directory / "slurm.conf"),
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHON=sys.executable,  # the ranks run this interpreter
        PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin",
    )
    start = subprocess.run(
        ["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=60
    )
    assert start.returncode == 0, start.stderr
    assert f"export SLURM_CONF={directory}/slurm.conf" in start.stdout
    yield Cluster(directory, env)
    subprocess.run(["bash", str(SCRIPT), "stop"], env=env, timeout=60)
