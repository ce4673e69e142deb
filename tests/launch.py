"""Launching real worker processes from tests: horovodrun (Gloo or MPI), mpirun, and plain processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
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


def tiny_training(dataset, run_dir, *overrides: str, strategy: str = "horovod") -> list[str]:
    """``-m hvdtrack.train`` on the tiny config, ``dataset`` and ``run_dir``, no progress bar,
    as launched workers run it; ``overrides`` come last."""
    return [
        "-m",
        "hvdtrack.train",
        "--config",
        str(REPO / "configs/tiny.yaml"),
        f"data.dataset_dir={dataset}",
        f"train.run_dir={run_dir}",
        f"distributed.strategy={strategy}",
        "train.progress_bar=false",
        *overrides,
    ]


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


def checkpoint_weights(run_dir: Path) -> dict:
    """The model's variables in the newest intact checkpoint of ``run_dir``, by name."""
    import tensorflow as tf

    from hvdtrack.train.checkpoints import resume_point

    reader = tf.train.load_checkpoint(resume_point(run_dir / "checkpoints").path)
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model/"))
    assert names
    return {n: reader.get_tensor(n) for n in names}


def assert_same_weights(resumed: dict, expected: dict) -> None:
    """A resumed run holds the weights of an uninterrupted one (rtol 1e-6)."""
    import numpy as np

    assert resumed.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(resumed[name], expected[name], rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- jobs under any launcher
# horovodrun with Gloo or MPI, plain mpirun, and MultiWorkerMirroredStrategy (one process per
# worker, TF_CONFIG, no launcher): the fault tests and run_scripts/fault_table.py start the same
# training command under each.
LAUNCHERS = ("gloo", "mpi", "mpirun", "multiworker")


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on this host right now."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Job:
    """A job's processes (the launcher, or every worker when there is none); their output goes
    to ``log`` (one file per process), so nothing blocks on a full pipe."""

    def __init__(self, launcher: str, procs: list[subprocess.Popen], logs: list[Path]):
        self.launcher, self.procs, self.logs = launcher, procs, logs

    def poll(self, besides: int | None = None) -> int | None:
        """None while any process runs; then the first non-zero exit code (or 0).

        ``besides``: a worker to leave out when there is no launcher (multiworker): nothing
        ends a stopped worker there, the job is over when the others have exited."""
        procs = [p for i, p in enumerate(self.procs) if i != besides or len(self.procs) == 1]
        codes = [p.poll() for p in procs]
        if any(c is None for c in codes):
            return None
        return next((c for c in codes if c != 0), 0)

    def wait(self, timeout: float, besides: int | None = None) -> int | None:
        """Waits at most ``timeout`` s for the job to end; returns ``poll(besides)``."""
        deadline = time.monotonic() + timeout
        while self.poll(besides) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.poll(besides)

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def output(self) -> str:
        return "\n".join(log.read_text(errors="replace") for log in self.logs if log.exists())

    def kill(self) -> None:
        """Ends whatever still runs of this job (its process groups), stopped ranks included."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()

    def pid(self, rank: int, run_dir: Path, timeout: float = 120) -> int:
        """The pid of the training process of ``rank``."""
        if self.launcher == "multiworker":
            return self.procs[rank].pid
        return worker_pid(run_dir, rank, timeout)


def start_job(launcher: str, np: int, args: list[str], log_dir: Path, **env: str) -> Job:
    """Starts ``python ARGS`` on ``np`` workers under ``launcher`` (one of ``LAUNCHERS``); every
    process in a new session (so ``Job.kill`` ends all it started)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    if launcher == "multiworker":
        workers = [f"localhost:{p}" for p in free_ports(np)]
        commands, envs = [], []
        for index in range(np):
            spec = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            commands.append([sys.executable, *args])
            envs.append(worker_env(TF_CONFIG=json.dumps(spec), **env))
    else:
        commands, envs = [launch_command(np, args, launcher)], [worker_env(**env)]
    procs, logs = [], []
    for i, (command, environment) in enumerate(zip(commands, envs)):
        log = log_dir / f"{launcher}-{i}.log"
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(
                    command,
                    cwd=REPO,
                    env=environment,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        logs.append(log)
    return Job(launcher, procs, logs)


def wait_for_file(path: Path, job: Job, timeout: float = 180) -> None:
    """Waits until ``path`` exists (e.g. a run's timing.jsonl: its first epoch is recorded)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if job.poll() is not None:
            raise AssertionError(f"the job ended ({job.poll()}) before {path}:\n{job.output()}")
        if time.monotonic() > deadline:
            job.kill()
            raise AssertionError(f"no {path} after {timeout} s:\n{job.output()[-4000:]}")
        time.sleep(0.2)


def _process_rank(environ: list[bytes]) -> int | None:
    """The worker rank a launched process's environment announces (None for launchers)."""
    for entry in environ:
        name, _, value = entry.partition(b"=")
        if name in (b"HOROVOD_RANK", b"OMPI_COMM_WORLD_RANK") and value.isdigit():
            return int(value)
        if name == b"TF_CONFIG":
            try:
                return int(json.loads(value)["task"]["index"])
            except (ValueError, KeyError, TypeError):
                return None
    return None


def worker_pid(run_dir: Path, rank: int, timeout: float = 120) -> int:
    """The pid of the training process of ``rank`` in ``run_dir`` under any of ``LAUNCHERS``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            launched = f"train.run_dir={run_dir}".encode() in cmdline
            if launched and b"horovodrun" not in b" ".join(cmdline):
                if _process_rank(environ) == rank:
                    return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} process for {run_dir}")


# ------------------------------------------------ runs that only their fault or a step ends
# A fault test's run must still be going when its fault (a signal, a kill, a time limit) lands,
# on any machine, however fast: it is given epochs it can never reach, so nothing but the fault
# (or ``train.stop_after_steps``) ends it. The rerun then stops at a fixed optimizer step past
# the checkpoint it resumes from, and is compared with an uninterrupted run stopped at that same
# step. Both runs have the same ``train.epochs``, so the same learning-rate schedule.
UNBOUNDED_EPOCHS = 100_000


def unbounded(*overrides: str) -> tuple[str, ...]:
    """Overrides for a run that only its fault or ``train.stop_after_steps`` can end."""
    return (f"train.epochs={UNBOUNDED_EPOCHS}", *overrides)


def saved_step(run_dir: Path) -> int:
    """The optimizer step held by the newest intact checkpoint of ``run_dir``, the one a resume
    takes, even when the ``checkpoint`` file does not list it yet (0 without one)."""
    import tensorflow as tf

    from hvdtrack.train.checkpoints import resume_point

    latest = resume_point(run_dir / "checkpoints").path
    if latest is None:
        return 0
    reader = tf.train.load_checkpoint(latest)
    return int(reader.get_tensor("optimizer/step/.ATTRIBUTES/VARIABLE_VALUE"))


def stop_at(run_dir: Path, step: int) -> str:
    """The override that makes the next run in ``run_dir`` (a resume, or a fresh start) stop
    at optimizer step ``step`` (``train.stop_after_steps`` counts from where it resumes)."""
    done = saved_step(run_dir)
    assert step > done, f"{run_dir} already holds step {done} >= {step}"
    return f"train.stop_after_steps={step - done}"
