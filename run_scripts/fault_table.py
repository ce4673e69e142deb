"""Runs every fault under real launchers on the tiny config and writes the table to docs/faults.md.

    .venv/bin/python run_scripts/fault_table.py                 # every case, ~15 min on 2 cores
    .venv/bin/python run_scripts/fault_table.py --only kill-9   # the cases whose name has it
    .venv/bin/python run_scripts/fault_table.py --out -         # print, write nothing

Each case is a ``Case`` in ``CASES``: a fault, the launcher it runs under, and a function that
injects it and says what was kept. Add a row by adding a case. A case that resumes is compared
with a run that was never interrupted (weights to rtol 1e-6, every step recorded once).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.launch import Job, start_job, wait_for_file, worker_env  # noqa: E402

COMMAND = "python run_scripts/fault_table.py"
DEADLINE = 10  # distributed.deadline_s in every case (the smallest allowed)
EPOCHS, STEPS_PER_EPOCH = 6, 4  # tiny, 2 workers x 1 graph per step
CHECKPOINT_EVERY = 3


@dataclasses.dataclass
class Row:
    """One line of the table."""

    fault: str
    launcher: str
    exit_code: Optional[int] = None
    message: str = ""
    exit_s: Optional[float] = None
    checkpoint: str = "-"
    run_status: str = "-"
    records: str = "-"
    resume: str = "-"


@dataclasses.dataclass
class Case:
    """A fault under a launcher; ``run(case, work)`` injects it and returns the row."""

    fault: str
    launcher: str
    run: Callable[[Case, Path], Row]
    rank: int = 1  # the rank the fault hits, where it hits one
    resume: bool = False  # rerun the same command and compare with an uninterrupted run

    @property
    def name(self) -> str:
        return f"{self.fault} / {self.launcher}"


# ---------------------------------------------------------------------------- helpers
class Context:
    """What the cases share: the tiny dataset and the weights of an uninterrupted run."""

    def __init__(self, work: Path):
        self.work = work
        self.dataset = work / "data"
        self._straight = None

    def prepare(self) -> None:
        run(["-m", "hvdtrack.prepare", "--config", "tiny", f"data.dataset_dir={self.dataset}"])

    def straight(self):
        if self._straight is None:
            run_dir = self.work / "straight"
            launched(train_args(self, run_dir, "gloo"))
            self._straight = weights(run_dir)
        return self._straight


CONTEXT: Context


def run(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=worker_env(), capture_output=True, text=True
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{args} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def launched(args: list[str], launcher: str = "gloo") -> int:
    """Runs a job to its end under ``launcher``; returns its exit code."""
    logs = Path(tempfile.mkdtemp(dir=CONTEXT.work, prefix="logs-"))
    job = start_job(launcher, 2, args, logs)
    code = job.wait(900)
    job.kill()
    if code != 0:
        raise RuntimeError(f"job failed ({code}):\n{job.output()[-3000:]}")
    return code


def train_args(ctx: Context, run_dir: Path, launcher: str, *extra: str) -> list[str]:
    strategy = {"local": "local", "multiworker": "multiworker"}.get(launcher, "horovod")
    return [
        "-m",
        "hvdtrack.train",
        "--config",
        "tiny",
        f"data.dataset_dir={ctx.dataset}",
        f"train.run_dir={run_dir}",
        f"distributed.strategy={strategy}",
        f"train.epochs={EPOCHS}",
        "train.batch_graphs=1",
        "train.progress_bar=false",
        f"train.checkpoint_every_steps={CHECKPOINT_EVERY}",
        f"distributed.deadline_s={DEADLINE}",
        *extra,
    ]


def weights(run_dir: Path) -> dict:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model/"))
    return {n: reader.get_tensor(n) for n in names}


def latest_checkpoint(run_dir: Path) -> str:
    numbers = [int(p.name[5:-6]) for p in (run_dir / "checkpoints").glob("ckpt-*.index")]
    if not numbers:
        return "none"
    n = max(numbers)
    try:
        per_epoch = json.loads((run_dir / "run.json").read_text())["steps_per_epoch"]
    except (OSError, ValueError, KeyError):
        return f"global step {n}"
    return f"global step {n} (epoch {n // per_epoch}, step {n % per_epoch})"


def run_status(run_dir: Path) -> str:
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError) as err:
        return f"unreadable ({type(err).__name__})" if (run_dir / "run.json").exists() else "none"
    return info["status"] + (f" ({info['stopped_by']})" if info.get("stopped_by") else "")


def records_check(run_dir: Path, complete: bool) -> str:
    """'intact' when timing.jsonl parses with no step twice (and, when ``complete``, every step
    of every rank once); else what is wrong."""
    try:
        lines = [json.loads(line) for line in open(run_dir / "timing.jsonl")][1:]
    except FileNotFoundError:
        return "none"
    except ValueError:
        return "unreadable"
    steps = [(r["epoch"], r["step"], r["rank"]) for r in lines if r["kind"] == "step"]
    if len(steps) != len(set(steps)):
        return "duplicated steps"
    if complete:
        every = {(e, s, r) for e in range(EPOCHS) for s in range(STEPS_PER_EPOCH) for r in (0, 1)}
        missing = every - set(steps)
        if missing:
            return f"{len(missing)} step records missing"
    return "intact"


def message_line(output: str, launcher: str) -> str:
    """The line that tells the user what happened: ours, else the launcher's."""
    lines = [line.split("<stderr>:")[-1].strip() for line in output.splitlines()]
    for marker in (
        "hvdtrack: error:",
        "hvdtrack: ",
        "[hvdtrack] WARNING",
        "[hvdtrack] run directory",
    ):
        found = [line for line in lines if line.startswith(marker)]
        if found:
            return found[0]
    for marker in ("Process 1 exit", "process rank", "Error", "error"):
        found = [line for line in lines if marker in line]
        if found:
            return found[0]
    return lines[-1] if lines else ""


def compare(resumed: dict, expected: dict) -> str:
    import numpy as np

    if resumed.keys() != expected.keys():
        return "no (other variables)"
    worst = max(
        float(np.max(np.abs(resumed[n] - expected[n]) / (np.abs(expected[n]) + 1e-7)))
        for n in expected
    )
    return "yes" if worst <= 1e-6 else f"no (relative difference {worst:.1e})"


def digest(directory: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(directory)).encode() + path.read_bytes())
    return h.hexdigest()


# ------------------------------------------------------------------- the kinds of fault
SIGNALS = {"kill -9": signal.SIGKILL, "SIGSTOP": signal.SIGSTOP, "SIGTERM": signal.SIGTERM}


def signal_a_rank(case: Case, work: Path) -> Row:
    """Sends the case's signal to one rank once records exist; the job's exit, what it left,
    and (``case.resume``) whether rerunning the same command resumes exactly."""
    ctx, row = CONTEXT, Row(case.fault, case.launcher)
    run_dir = work / "run"
    args = train_args(ctx, run_dir, case.launcher)
    job = start_job(case.launcher, 2, args, work / "logs")
    try:
        wait_for_file(run_dir / "timing.jsonl", job, timeout=300)
        victim = job.pid(case.rank, run_dir)
        time.sleep(0.5)  # training is under way: records exist from the first checkpoint on
        os.kill(victim, SIGNALS[case.fault.split(" of ")[0]])
        started = time.monotonic()
        row.exit_code = job.wait(DEADLINE + 120, besides=case.rank)
        row.exit_s = time.monotonic() - started
    finally:
        job.kill()
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass
    row.message = message_line(job.output(), case.launcher)
    row.checkpoint, row.run_status = latest_checkpoint(run_dir), run_status(run_dir)
    row.records = records_check(run_dir, complete=False)
    if case.resume:
        rerun = start_job(case.launcher, 2, args, work / "logs-resume")
        code = rerun.wait(900)
        rerun.kill()
        if code != 0:
            row.resume = f"no (rerun exit {code})"
        else:
            row.resume = compare(weights(run_dir), ctx.straight())
            row.records = records_check(run_dir, complete=True) + " after resume"
    return row


@contextlib.contextmanager
def test_hosts():
    """Two network-namespace hosts (run_scripts/test_hosts.sh), stopped after unless they
    were up before."""
    from tests.hosts import Hosts, _checked, _script

    already_up = _script("status", timeout=60).returncode == 0
    _checked("start", "2")
    try:
        yield Hosts.read()
    finally:
        if not already_up:
            _checked("stop", timeout=60)


def start_on_hosts(command: list[str], env: dict, log: Path) -> Job:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Job("gloo", [proc], [log])


def host_goes_silent(case: Case, work: Path) -> Row:
    """h2's link goes down and its processes die without a word (a crashed node); rerunning
    the same command once h2 is back resumes."""
    ctx, row = CONTEXT, Row(case.fault, case.launcher)
    run_dir = work / "run"
    with test_hosts() as hosts:
        command = hosts.horovodrun_command(train_args(ctx, run_dir, "gloo"), "gloo")
        job = start_on_hosts(command, hosts.env(), work / "logs/job.log")
        try:
            wait_for_file(run_dir / "timing.jsonl", job, timeout=300)
            time.sleep(0.5)
            hosts.down("h2")
            started = time.monotonic()
            row.exit_code = job.wait(DEADLINE + 120)
            row.exit_s = time.monotonic() - started
        finally:
            job.kill()
            hosts.up("h2")
        row.message = message_line(job.output(), "gloo")
        row.checkpoint, row.run_status = latest_checkpoint(run_dir), run_status(run_dir)
        row.records = records_check(run_dir, complete=False)
        rerun = start_on_hosts(command, hosts.env(), work / "logs/rerun.log")
        code = rerun.wait(900)
        rerun.kill()
    if code != 0:
        row.resume = f"no (rerun exit {code})"
    else:
        row.resume = compare(weights(run_dir), ctx.straight())
        row.records = records_check(run_dir, complete=True) + " after resume"
    return row


def elastic_host_back(case: Case, work: Path) -> Row:
    """An elastic job (--min-np 1, discovery by the hosts that are up) loses h2 mid-epoch and
    takes it back after the blacklist cooldown. Time: from the fault to the first epoch on one
    worker. 60 epochs: h2 needs time to come back."""
    ctx, row = CONTEXT, Row(case.fault, case.launcher)
    run_dir = work / "run"
    epochs = 60

    def epochs_on(workers: int) -> int:
        try:
            lines = (run_dir / "timing.jsonl").read_text().splitlines()[1:]
        except FileNotFoundError:
            return 0
        rows = [json.loads(line) for line in lines if line.strip()]
        return len({r["epoch"] for r in rows if r["kind"] == "epoch" and r["workers"] == workers})

    def wait_until(condition, job: Job, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if job.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"elastic job: gave up waiting\n{job.output()[-2000:]}")
            time.sleep(0.2)

    with test_hosts() as hosts:
        args = train_args(ctx, run_dir, "gloo", f"train.epochs={epochs}")
        command = [
            str(REPO / ".venv/bin/horovodrun"),
            "-np", "2", "--min-np", "1", "--max-np", "2",
            "--network-interface", hosts.interface,
            "--host-discovery-script", hosts.discovery_command(1),
            "--blacklist-cooldown-range", "5", "10",
            sys.executable, *args,
        ]  # fmt: skip
        env = hosts.env()
        # ssh keepalives: the driver sees h2's session end a few seconds after its link went.
        ssh = work / "bin/ssh"
        ssh.parent.mkdir(parents=True)
        ssh.write_text(
            f'#!/bin/sh\nexec "{hosts.ssh}" -o ServerAliveInterval=2 -o ServerAliveCountMax=3 "$@"\n'
        )
        ssh.chmod(0o755)
        env["PATH"] = f"{ssh.parent}:{env['PATH']}"
        job = start_on_hosts(command, env, work / "logs/job.log")
        try:
            wait_until(lambda: epochs_on(2) >= 2, job, 300)
            hosts.down("h2")
            started = time.monotonic()
            wait_until(lambda: epochs_on(1) >= 1, job, 300)
            row.exit_s = time.monotonic() - started
            hosts.up("h2")
            row.exit_code = job.wait(900)
        finally:
            job.kill()
            hosts.up("h2")
    output = [line.split("<stderr>:")[-1].strip() for line in job.output().splitlines()]
    restarts = [line for line in output if "elastic restart" in line]
    row.message = " / ".join(line.removeprefix("[hvdtrack] WARNING: ") for line in restarts)
    info = json.loads((run_dir / "run.json").read_text())
    row.run_status = run_status(run_dir)
    numbers = [int(p.name[5:-6]) for p in (run_dir / "checkpoints").glob("ckpt-*.index")]
    row.checkpoint = f"global step {max(numbers)} (end of epoch {epochs})"
    by_workers = {w: epochs_on(w) for w in (1, 2)}
    row.records = (
        f"{by_workers[2]} epochs on 2 workers, {by_workers[1]} on 1; "
        f"val AUC {info['metrics'].get('auc', float('nan')):.3f}"
    )
    row.resume = "- (went on)"
    return row


def own_dataset(work: Path) -> Path:
    """A dataset prepared for this case alone (a copy would count as stale, prepared afresh)."""
    data = work / "data"
    run(["-m", "hvdtrack.prepare", "--config", "tiny", f"data.dataset_dir={data}"])
    return data


def corrupt_shard(case: Case, work: Path) -> Row:
    """Flips bytes in the middle of a training shard of a copy of the dataset, then trains."""
    row = Row(case.fault, case.launcher)
    data = own_dataset(work)
    shard = sorted(data.glob("train-*.tfrecord"))[1]
    raw = bytearray(shard.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 16] = bytes(b ^ 0xFF for b in raw[middle : middle + 16])
    shard.write_bytes(bytes(raw))
    return _single_run(row, work, [f"data.dataset_dir={data}"])


def delete_shard(case: Case, work: Path) -> Row:
    row = Row(case.fault, case.launcher)
    data = own_dataset(work)
    sorted(data.glob("train-*.tfrecord"))[-1].unlink()
    return _single_run(row, work, [f"data.dataset_dir={data}"])


def _single_run(row: Row, work: Path, overrides: list[str]) -> Row:
    run_dir = work / "run"
    started = time.monotonic()
    done = run([*train_args(CONTEXT, run_dir, "local"), *overrides], check=False)
    row.exit_s, row.exit_code = time.monotonic() - started, done.returncode
    row.message = message_line(done.stdout + done.stderr, "local")
    row.checkpoint, row.run_status = latest_checkpoint(run_dir), run_status(run_dir)
    row.records = records_check(run_dir, complete=False)
    return row


def prepare_elsewhere(case: Case, work: Path) -> Row:
    """``prepare`` pointed at a directory of someone's files: refused, every file in place."""
    row = Row(case.fault, case.launcher)
    target = work / "events"
    target.mkdir()
    for i in range(3):
        (target / f"event00000100{i}-hits.csv").write_text("hit_id,x,y,z\n1,0,0,0\n")
    before = digest(target)
    started = time.monotonic()
    done = run(
        ["-m", "hvdtrack.prepare", "--config", "tiny", f"data.dataset_dir={target}"], check=False
    )
    row.exit_s, row.exit_code = time.monotonic() - started, done.returncode
    row.message = message_line(done.stdout + done.stderr, "local")
    row.records = "files unchanged" if digest(target) == before else "FILES CHANGED"
    return row


def resume_changed_model(case: Case, work: Path) -> Row:
    """A finished-epoch run resumed with another model width: refused, run directory unchanged."""
    row = Row(case.fault, case.launcher)
    run_dir = work / "run"
    run([*train_args(CONTEXT, run_dir, "local"), "train.epochs=1"])
    before = digest(run_dir)
    started = time.monotonic()
    done = run(
        [*train_args(CONTEXT, run_dir, "local"), "train.epochs=2", "model.node_encoder=[32,16]"],
        check=False,
    )
    row.exit_s, row.exit_code = time.monotonic() - started, done.returncode
    row.message = message_line(done.stdout + done.stderr, "local")
    row.checkpoint, row.run_status = latest_checkpoint(run_dir), run_status(run_dir)
    row.records = "run dir unchanged" if digest(run_dir) == before else "RUN DIR CHANGED"
    return row


# ------------------------------------------------ misuse, damage and full or read-only disks
def spawn(args: list[str], log: Path) -> Job:
    """``python ARGS`` as one plain process in its own session (no launcher)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=REPO, env=worker_env(), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return Job("local", [proc], [log])


def timed(row: Row, args: list[str]) -> subprocess.CompletedProcess:
    """Runs ``python ARGS`` to its end; exit code, seconds and message into ``row``."""
    started = time.monotonic()
    done = run(args, check=False)
    row.exit_s, row.exit_code = time.monotonic() - started, done.returncode
    row.message = message_line(done.stdout + done.stderr, "local")
    return done


def kept(row: Row, run_dir: Path) -> Row:
    row.checkpoint, row.run_status = latest_checkpoint(run_dir), run_status(run_dir)
    row.records = records_check(run_dir, complete=False)
    return row


def local_straight(epochs: int = EPOCHS) -> dict:
    """Final weights of an uninterrupted one-process run of ``epochs`` (cached)."""
    cache = CONTEXT.__dict__.setdefault("_local", {})
    if epochs not in cache:
        run_dir = CONTEXT.work / f"straight-local-{epochs}"
        run([*train_args(CONTEXT, run_dir, "local"), f"train.epochs={epochs}"])
        cache[epochs] = weights(run_dir)
    return cache[epochs]


def resumed_exactly(row: Row, args: list[str], run_dir: Path, epochs: int = EPOCHS) -> Row:
    """Reruns ``args``; the resume column says whether it ends with a lone run's weights."""
    done = run(args, check=False)
    if done.returncode != 0:
        row.resume = f"no (rerun exit {done.returncode}: {message_line(done.stderr, 'local')[:80]})"
    else:
        row.resume = compare(weights(run_dir), local_straight(epochs))
    return row


@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A tmpfs of ``size`` at ``path`` (needs root), unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Fills ``disk`` to the last byte with one file; returns it."""
    filler = disk / "filler"
    with open(filler, "wb") as out:
        with contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * 65536)
                out.flush()
    return filler


def strategy_mismatch(case: Case, work: Path) -> Row:
    """``distributed.strategy=local`` under ``horovodrun -np 2``: two separate trainings would
    share one run directory."""
    row, run_dir = Row(case.fault, case.launcher), work / "run"
    args = [*train_args(CONTEXT, run_dir, case.launcher), "distributed.strategy=local"]
    job = start_job(case.launcher, 2, args, work / "logs")
    started = time.monotonic()
    row.exit_code = job.wait(300)
    row.exit_s = time.monotonic() - started
    job.kill()
    row.message = message_line(job.output(), case.launcher)
    row.records = "no run directory" if not run_dir.exists() else "RUN DIRECTORY WRITTEN"
    return row


def second_train(case: Case, work: Path) -> Row:
    """A second ``train`` on the run directory of a live one; the first must end unharmed."""
    row, run_dir, epochs = Row(case.fault, case.launcher), work / "run", 3 * EPOCHS
    args = [*train_args(CONTEXT, run_dir, "local"), f"train.epochs={epochs}"]
    first = spawn(args, work / "logs/first.log")
    try:
        wait_for_file(run_dir / "timing.jsonl", first, timeout=300)
        timed(row, args)
        code = first.wait(900)
    finally:
        first.kill()
    kept(row, run_dir)
    row.resume = "first run: " + (
        compare(weights(run_dir), local_straight(epochs)) if code == 0 else f"exit {code}"
    )
    return row


def second_prepare(case: Case, work: Path) -> Row:
    """A second ``prepare`` on a dataset directory being written."""
    row, data = Row(case.fault, case.launcher), work / "data"
    args = ["-m", "hvdtrack.prepare", "--config", "tiny", f"data.dataset_dir={data}"]
    first = spawn([*args, "data.num_events=60"], work / "logs/first.log")
    try:
        deadline = time.monotonic() + 120
        while not [p for p in work.iterdir() if p.name not in ("logs",)]:
            if first.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the first prepare wrote nothing:\n{first.output()[-2000:]}")
            time.sleep(0.05)
        timed(row, [*args, "data.num_events=60"])
        code = first.wait(900)
    finally:
        first.kill()
    ok = code == 0 and (data / "manifest.json").exists()
    row.records = f"first prepare: exit {code}, " + ("dataset complete" if ok else "NO DATASET")
    return row


def disk_full_prepare(case: Case, work: Path) -> Row:
    """``prepare --force`` of a dataset on a disk with room for one copy only."""
    row = Row(case.fault, case.launcher)
    with small_disk(work / "disk", "16m") as disk:
        args = ["-m", "hvdtrack.prepare", "--config", "tiny", f"data.dataset_dir={disk / 'data'}"]
        run(args)
        before = digest(disk / "data")
        fill(disk)
        timed(row, [*args, "--force"])
        left = sorted(p.name for p in disk.iterdir() if p.name not in ("data", "filler"))
        row.records = "dataset unchanged" if digest(disk / "data") == before else "DATASET CHANGED"
        row.records += f", left beside it: {', '.join(left) or 'nothing'}"
    return row


def disk_full_checkpoint(case: Case, work: Path) -> Row:
    """The run directory's disk fills up while training; rerun after freeing it."""
    row = Row(case.fault, case.launcher)
    with small_disk(work / "disk", "64m") as disk:
        run_dir = disk / "run"
        args = train_args(CONTEXT, run_dir, "local")
        job = spawn(args, work / "logs/job.log")
        try:
            wait_for_file(run_dir / "timing.jsonl", job, timeout=300)
            filler = fill(disk)
            started = time.monotonic()
            row.exit_code = job.wait(300)
            row.exit_s = time.monotonic() - started
        finally:
            job.kill()
        row.message = message_line(job.output(), "local")
        kept(row, run_dir)
        filler.unlink()
        return resumed_exactly(row, args, run_dir)


def read_only_run(case: Case, work: Path) -> Row:
    """A run directory on a filesystem mounted read-only, trained further."""
    row = Row(case.fault, case.launcher)
    with small_disk(work / "disk", "64m") as disk:
        run_dir = disk / "run"
        args = train_args(CONTEXT, run_dir, "local")
        run([*args, "train.stop_after_steps=16"])  # 2 of the 6 epochs
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            timed(row, args)
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        kept(row, run_dir)
        return resumed_exactly(row, args, run_dir)


def damaged_checkpoint(case: Case, work: Path) -> Row:
    """A run stopped after 2 of its epochs, its checkpoint state damaged (case.fault says how),
    then trained to the end."""
    row, run_dir = Row(case.fault, case.launcher), work / "run"
    args = train_args(CONTEXT, run_dir, "local")
    run([*args, "train.stop_after_steps=16"])  # 2 of the 6 epochs
    folder = run_dir / "checkpoints"
    if "deleted" in case.fault:
        (folder / "checkpoint").unlink()
    elif "missing" in case.fault:
        (folder / "checkpoint").write_text('model_checkpoint_path: "ckpt-99"\n')
    else:  # the newest checkpoint's data file cut in half
        newest = max(folder.glob("ckpt-*.index"), key=lambda p: int(p.name[5:-6]))
        data = next(folder.glob(newest.name[:-6] + ".data-*"))
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    timed(row, args)
    kept(row, run_dir)
    row.resume = compare(weights(run_dir), local_straight()) if row.exit_code == 0 else "-"
    return row


BAD_CONFIGS = {
    "empty config file": "",
    "YAML alias bomb": "a: &a [x,x,x,x,x,x,x,x,x]\n"
    + "".join(f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi")),
    "duplicate YAML key": "name: tiny\ntrain:\n  epochs: 2\ntrain:\n  epochs: 3\n",
}


def bad_config(case: Case, work: Path) -> Row:
    row = Row(case.fault, case.launcher)
    path = work / "config.yaml"
    path.write_text(BAD_CONFIGS[case.fault])
    timed(row, ["-m", "hvdtrack.train", "--config", str(path), f"train.run_dir={work / 'run'}"])
    row.records = "nothing written" if not (work / "run").exists() else "RUN DIRECTORY WRITTEN"
    return row


def trailing_slash(case: Case, work: Path) -> Row:
    """``data.dataset_dir=DIR/`` on a prepared dataset."""
    row, data = Row(case.fault, case.launcher), own_dataset(work)
    before = digest(data)
    timed(row, ["-m", "hvdtrack.prepare", "--config", "tiny", f"data.dataset_dir={data}/"])
    row.records = "dataset reused" if digest(data) == before else "DATASET REBUILT"
    return row


def evaluate_threshold(case: Case, work: Path) -> Row:
    row, run_dir = Row(case.fault, case.launcher), work / "run"
    run([*train_args(CONTEXT, run_dir, "local"), "train.epochs=1"])
    timed(row, ["-m", "hvdtrack.evaluate", "--run", str(run_dir), "--threshold", "2"])
    row.records = "no output" if not (run_dir / "evaluate-test").exists() else "OUTPUT WRITTEN"
    return row


def sigterm_prepare(case: Case, work: Path) -> Row:
    """SIGTERM to a ``prepare`` once it has started writing."""
    row, data = Row(case.fault, case.launcher), work / "data"
    args = ["-m", "hvdtrack.prepare", "--config", "tiny", f"data.dataset_dir={data}"]
    job = spawn([*args, "data.num_events=60"], work / "logs/job.log")
    try:
        deadline = time.monotonic() + 120
        while not [p for p in work.iterdir() if p.name.startswith(".")]:
            if job.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prepare wrote nothing:\n{job.output()[-2000:]}")
            time.sleep(0.05)
        time.sleep(1.0)
        job.procs[0].send_signal(signal.SIGTERM)
        started = time.monotonic()
        row.exit_code = job.wait(120)
        row.exit_s = time.monotonic() - started
    finally:
        job.kill()
    row.message = message_line(job.output(), "local")
    left = sorted(p.name for p in work.iterdir() if p.name != "logs")
    row.records = f"left: {', '.join(left) or 'nothing'}"
    return row


def run_dir_at_dataset(case: Case, work: Path) -> Row:
    row, data = Row(case.fault, case.launcher), own_dataset(work)
    before = digest(data)
    timed(row, [*train_args(CONTEXT, data, "local"), f"data.dataset_dir={data}"])
    row.records = "dataset unchanged" if digest(data) == before else "DATASET CHANGED"
    return row


CASES: list[Case] = [
    Case("kill -9 of rank 1", "gloo", signal_a_rank, resume=True),
    Case("kill -9 of rank 1", "mpi", signal_a_rank, resume=True),
    Case("kill -9 of rank 1", "mpirun", signal_a_rank),
    Case("kill -9 of rank 1", "multiworker", signal_a_rank),
    Case("kill -9 of rank 0", "gloo", signal_a_rank, rank=0, resume=True),
    Case("SIGSTOP of rank 1", "gloo", signal_a_rank, resume=True),
    Case("SIGSTOP of rank 1", "mpi", signal_a_rank),
    Case("SIGSTOP of rank 1", "mpirun", signal_a_rank),
    Case("SIGSTOP of rank 1", "multiworker", signal_a_rank),
    Case("SIGSTOP of rank 0", "mpi", signal_a_rank, rank=0),
    Case("SIGTERM of rank 1", "gloo", signal_a_rank, resume=True),
    Case("SIGTERM of rank 1", "mpirun", signal_a_rank),
    Case("host h2 goes silent (link down)", "gloo, 2 hosts", host_goes_silent, resume=True),
    Case("elastic: h2 goes silent, then back", "gloo elastic, 2 hosts", elastic_host_back),
    Case("corrupted training shard", "local", corrupt_shard),
    Case("training shard deleted", "local", delete_shard),
    Case("prepare at a folder of CSVs", "local", prepare_elsewhere),
    Case("resume with model.node_encoder changed", "local", resume_changed_model),
    Case("strategy local under horovodrun -np 2", "gloo", strategy_mismatch),
    Case("second train on a live run directory", "local", second_train),
    Case("second prepare on a dataset being written", "local", second_prepare),
    Case("disk full during prepare --force", "local", disk_full_prepare),
    Case("disk full during training", "local", disk_full_checkpoint),
    Case("run directory on a read-only filesystem", "local", read_only_run),
    Case("checkpoints/checkpoint deleted", "local", damaged_checkpoint),
    Case("checkpoints/checkpoint names a missing ckpt", "local", damaged_checkpoint),
    Case("newest checkpoint truncated", "local", damaged_checkpoint),
    Case("empty config file", "local", bad_config),
    Case("YAML alias bomb", "local", bad_config),
    Case("duplicate YAML key", "local", bad_config),
    Case("data.dataset_dir with a trailing slash", "local", trailing_slash),
    Case("evaluate --threshold 2", "local", evaluate_threshold),
    Case("SIGTERM during prepare", "local", sigterm_prepare),
    Case("run directory at a dataset directory", "local", run_dir_at_dataset),
]

HEADER = """# What happens when things go wrong

Generated by `{command}` (last run {date}, {host}, {cores} cores; every case on the tiny config with
`distributed.deadline_s={deadline}`, {epochs} epochs of {steps} steps, a step checkpoint every
{every} steps). Do not edit by hand: rerun the command. A run with `--only` replaces the rows it
ran and keeps the others. The rows on two hosts run in network namespaces
(`run_scripts/test_hosts.sh`, root). The misuse rows after the first 18 run one process
(`local`); a resume there is compared with a one-process run never interrupted.

* **exit**: the job's exit code (the launcher's; MultiWorker: the first non-zero of the workers
  still running) and the line that says what happened.
* **time to exit**: seconds from the fault to the end of the job (MultiWorker: of the workers
  not stopped, as nothing stops a stopped worker without a launcher); for a misuse row, from the
  command's start (a train command spends most of it importing TensorFlow).
* **kept**: the newest checkpoint, run.json's status, and the timing records (no step twice;
  after a resume, every step of every rank once).
* **resume exact**: the same command run again ends with the weights of an uninterrupted run
  (rtol 1e-6); `-` where not tried.

| fault | launcher | exit | message | time to exit | checkpoint | run.json | records | resume exact |
|---|---|---|---|---|---|---|---|---|
"""


def markdown_row(row: Row) -> str:
    message = row.message.replace("|", "\\|")
    if len(message) > 240:
        message = message[:237] + "..."
    exit_s = f"{row.exit_s:.1f} s" if row.exit_s is not None else "-"
    cells = [row.fault, row.launcher, str(row.exit_code), f"`{message}`" if message else "-"]
    cells += [exit_s, row.checkpoint, row.run_status, row.records, row.resume]
    return "| " + " | ".join(cells) + " |"


def merged_rows(previous: str, lines: list[str]) -> list[str]:
    """The table's rows after an ``--only`` run: its rows replace those of the same fault and
    launcher, the others stay, in the order of ``CASES``."""

    def key(line: str) -> tuple[str, str]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        return cells[0], cells[1]

    table = [line for line in previous.splitlines() if line.startswith("| ") and "---" not in line]
    rows = {key(line): line for line in table}
    rows.pop(("fault", "launcher"), None)
    rows.update({key(line): line for line in lines})
    order = [(c.fault, c.launcher) for c in CASES]
    return sorted(rows.values(), key=lambda r: order.index(key(r)) if key(r) in order else 999)


def main(argv=None) -> int:
    global CONTEXT
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "docs/faults.md"), help="'-' prints only")
    p.add_argument("--only", nargs="*", default=None, help="cases whose name contains any")
    p.add_argument("--work", default=None, help="keep the runs in this folder")
    args = p.parse_args(argv)
    cases = [c for c in CASES if not args.only or any(s in c.name for s in args.only)]
    work = Path(args.work or tempfile.mkdtemp(prefix="hvdtrack-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    CONTEXT = Context(work)
    CONTEXT.prepare()
    lines = []
    for i, case in enumerate(cases):
        case_dir = work / f"case{i:02d}"
        case_dir.mkdir()
        print(f"[{i + 1}/{len(cases)}] {case.name} ...", file=sys.stderr, flush=True)
        try:
            row = case.run(case, case_dir)
        except Exception as err:  # a case that cannot run is a row that says so
            row = Row(case.fault, case.launcher, message=f"CASE FAILED: {err}"[:240])
        line = markdown_row(row)
        print(line, flush=True)
        lines.append(line)
    header = HEADER.format(
        command=COMMAND,
        date=time.strftime("%Y-%m-%d"),
        host=os.uname().nodename,
        cores=os.cpu_count(),
        deadline=DEADLINE,
        epochs=EPOCHS,
        steps=STEPS_PER_EPOCH,
        every=CHECKPOINT_EVERY,
    )
    if args.only and args.out != "-" and Path(args.out).exists():
        lines = merged_rows(Path(args.out).read_text(), lines)
    text = header + "\n".join(lines) + "\n"
    if args.out != "-":
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
