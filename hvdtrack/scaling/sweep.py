"""Scaling sweeps: one training run per worker count, launched locally or submitted to SLURM.

Local: ``python -m hvdtrack.prepare`` once, then for each N in ``--np`` (1 too, so every run
pays the same launcher costs) ``horovodrun -np N -H localhost:N --gloo python -m hvdtrack.train
--config CONFIG distributed.strategy=horovod train.batch_graphs=B
train.run_dir=OUT/<mode>-np<N> [overrides]``, then the report into ``OUT/report-<mode>``. Strong
scaling keeps the global batch G fixed (B = G / N: every N must divide G); weak keeps B fixed.

SLURM: ``run_scripts/slurm/prepare.sbatch`` and ``train.sbatch`` are copied into ``OUT/slurm/``
beside a ``submit_all.sh`` that submits prepare, train.sbatch once per N and a report job,
chained with ``--dependency=afterok``: the sweep's runs get the single run's MPI plugin check,
``--kill-on-bad-exit`` and signal/requeue round trip.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import IO, Optional, Sequence

from hvdtrack import configtools
from hvdtrack.errors import ConfigError, DataError, TrainingError
from hvdtrack.runs.timing import read_run
from hvdtrack.scaling import report
from hvdtrack.utils.io import Staged

# Keys the sweep sets itself for every run; an override of them would break the comparison.
SWEEP_KEYS = ("distributed.strategy", "train.batch_graphs", "train.run_dir")
# mode -> its batch option: strong splits a fixed global batch over N workers, weak fixes B.
BATCH_OPTIONS = {"strong": "--global-batch", "weak": "--batch"}
# The repository's batch scripts, which a SLURM sweep copies and submits.
SLURM_SCRIPTS = Path(__file__).resolve().parents[2] / "run_scripts" / "slurm"
_RANK_LINE = re.compile(r"^\[\d+(,\d+)?\]<std(err|out)>:")


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """What one sweep runs: ``batches`` maps N to graphs per worker per step; ``overrides``
    apply to the preparation and every run; paths are absolute; ``controller`` is horovodrun's
    (local runs)."""

    mode: str
    nps: tuple[int, ...]
    config: Path
    out_dir: Path
    batches: dict[int, int]
    overrides: tuple[str, ...] = ()
    python: str = sys.executable
    controller: str = "gloo"

    def run_dir(self, n: int) -> Path:
        return self.out_dir / f"{self.mode}-np{n}"

    @property
    def report_dir(self) -> Path:
        return self.out_dir / f"report-{self.mode}"

    @property
    def prepare(self) -> list[str]:
        prepare = ["-m", "hvdtrack.prepare", "--config", str(self.config), *self.overrides]
        return [self.python, *prepare]

    def run_overrides(self, n: int) -> list[str]:
        """Run N's batch and run directory, then the user's overrides."""
        run = [f"train.batch_graphs={self.batches[n]}", f"train.run_dir={self.run_dir(n)}"]
        return run + list(self.overrides)

    def local_command(self, n: int) -> list[str]:
        beside = Path(self.python).parent / "horovodrun"
        horovodrun = str(beside) if beside.exists() else "horovodrun"
        launch = [horovodrun, "-np", str(n), "-H", f"localhost:{n}", f"--{self.controller}"]
        train = [self.python, "-m", "hvdtrack.train", "--config", str(self.config)]
        return [*launch, *train, "distributed.strategy=horovod", *self.run_overrides(n)]

    @property
    def report_command(self) -> list[str]:
        dirs = [str(self.run_dir(n)) for n in self.nps]
        report = ["report", *dirs, "--mode", self.mode, "--out", str(self.report_dir)]
        return [self.python, "-m", "hvdtrack.scaling", *report]

    @property
    def env(self) -> dict[str, str]:
        """Extra environment of the local launcher: Open MPI refuses root without these two."""
        if self.controller == "mpi" and os.geteuid() == 0:
            return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        return {}


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    """sbatch options of a SLURM sweep; None keeps the scripts' ``#SBATCH`` default.
    ``tasks_per_node`` defaults to ``gpus_per_node``, else all N on one node; ``time``,
    ``partition`` and ``account`` apply to every job; ``setup`` lines (``module load ...``) run
    before submitting, and sbatch passes the environment they make on to the jobs."""

    tasks_per_node: Optional[int] = None
    gpus_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    time: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    setup: tuple[str, ...] = ()

    def __post_init__(self):
        for key in ("tasks_per_node", "gpus_per_node", "cpus_per_task"):
            value = getattr(self, key)
            configtools.check(value is None or value >= 1, f"--{key.replace('_', '-')}", ">= 1")

    def layout(self, n: int) -> tuple[int, int]:
        """(nodes, tasks per node) for N workers."""
        per_node = self.tasks_per_node or self.gpus_per_node or n
        if n <= per_node:
            return 1, n
        if n % per_node:
            raise ConfigError(
                f"N={n} workers do not fill nodes of {per_node} tasks; choose --np values that "
                "are multiples of --tasks-per-node (or --gpus-per-node)"
            )
        return n // per_node, per_node

    def options(self, n: Optional[int] = None) -> list[str]:
        """sbatch options of every job, or (given N) the resources of the training job of N."""
        given = {"time": self.time, "partition": self.partition, "account": self.account}
        if n is not None:
            nodes, per_node = self.layout(n)
            gpus = self.gpus_per_node and min(self.gpus_per_node, per_node)  # one per rank
            given = {"nodes": nodes, "ntasks-per-node": per_node}
            given |= {"cpus-per-task": self.cpus_per_task, "gpus-per-node": gpus}
        return [f"--{key}={value}" for key, value in given.items() if value is not None]


def parse_worker_counts(text: str) -> tuple[int, ...]:
    """ "1,2,4" -> (1, 2, 4); ConfigError for anything else."""
    values = [int(p) if p.strip().isdigit() else 0 for p in text.split(",") if p.strip()]
    if not values or min(values) < 1:
        raise ConfigError(f"--np must be comma-separated worker counts >= 1 like 1,2,4: {text!r}")
    if len(set(values)) != len(values):
        raise ConfigError(f"--np lists a worker count twice: {text!r}")
    return tuple(sorted(values))


def plan_sweep(
    mode: str,
    nps: Sequence[int],
    config: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    global_batch: Optional[int] = None,
    batch: Optional[int] = None,
    controller: str = "gloo",
    overrides: Sequence[str] = (),
    python: str = sys.executable,
) -> SweepPlan:
    """Works out a sweep: ``global_batch`` (strong) or ``batch`` (weak, per worker), default
    the config's ``train.batch_graphs``. ConfigError for a global batch some N does not divide,
    an override of a key the sweep sets, a config (with the overrides) ``load_config`` refuses;
    ``mode`` is "strong" or "weak" (the command line's choices)."""
    nps, config = tuple(sorted(nps)), Path(config).absolute()
    for text in overrides:
        key = ".".join(configtools.parse_override(text)[0])
        if key in SWEEP_KEYS:
            raise ConfigError(
                f"override '{text}': the sweep sets {key} itself "
                "(use --global-batch / --batch for the batch and --out for the run directories)"
            )
    other_mode = "weak" if mode == "strong" else "strong"
    given, other = (global_batch, batch) if mode == "strong" else (batch, global_batch)
    if other is not None:
        option, other_option = BATCH_OPTIONS[mode], BATCH_OPTIONS[other_mode]
        raise ConfigError(f"{other_option} is for {other_mode} scaling; {mode} takes {option}")
    value = given or _config_batch(config, overrides)
    bad = [n for n in nps if mode == "strong" and value % n]
    if bad:
        raise ConfigError(
            f"strong scaling keeps the global batch fixed: {value} graphs cannot be split "
            f"evenly over N = {', '.join(map(str, bad))} workers; choose a --global-batch that "
            f"is a multiple of {math.lcm(*nps)}"
        )
    batches = {n: value // n if mode == "strong" else value for n in nps}
    out = Path(out_dir).absolute()
    return SweepPlan(mode, nps, config, out, batches, tuple(overrides), python, controller)


def run_sweep(
    plan: SweepPlan,
    *,
    dry_run: bool = False,
    skip_prepare: bool = False,
    skip_finished: bool = False,
    out: Optional[IO[str]] = None,
) -> Optional[dict[str, Path]]:
    """Runs the sweep locally (or prints its commands), then writes the report; returns its
    files (None for a dry run). ``skip_finished`` leaves out N whose run directory holds a
    finished run; ``out`` gets the progress (default stdout). TrainingError names a failed
    command and ends with the tail of its log in ``OUT/logs``."""
    out = out or sys.stdout
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.env.items())
    commands = {n: f"{env} {shlex.join(plan.local_command(n))}".strip() for n in plan.nps}
    if dry_run:
        prepare = [] if skip_prepare else [shlex.join(plan.prepare)]
        print(*prepare, *commands.values(), shlex.join(plan.report_command), sep="\n", file=out)
        return None

    logs = plan.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not skip_prepare:
        print(f"[sweep] preparing the dataset: {shlex.join(plan.prepare)}", file=out, flush=True)
        _run(plan.prepare, logs / "prepare.log", {}, "dataset preparation", out)
    if (keep := _one_keep_edge_term(plan)) is not None:
        print(f"[sweep] every run: {keep}", file=out, flush=True)
        plan = dataclasses.replace(plan, overrides=(*plan.overrides, keep))
        commands = {n: f"{env} {shlex.join(plan.local_command(n))}".strip() for n in plan.nps}
    for n in plan.nps:
        run_dir, log = plan.run_dir(n), logs / f"{plan.mode}-np{n}.log"
        if skip_finished and _finished(run_dir):
            print(f"[sweep] N={n}: {run_dir} is finished already, skipped", file=out, flush=True)
            continue
        print(f"[sweep] N={n}: {commands[n]}\n[sweep] N={n}: log {log}", file=out, flush=True)
        _run(plan.local_command(n), log, plan.env, f"training run N={n}", out)
        if not _finished(run_dir):
            raise TrainingError(
                f"training run N={n} exited cleanly but {run_dir} holds no finished run "
                f"(run.json status is not 'finished'); see {log}"
            )
    built = report.build_report([plan.run_dir(n) for n in plan.nps], plan.mode)
    paths = report.write_report(built, plan.report_dir)
    print(f"[sweep] report: {paths['md']}", file=out, flush=True)
    return paths


def write_slurm_scripts(
    plan: SweepPlan,
    options: SlurmOptions,
    *,
    workdir: Optional[str | os.PathLike] = None,
    skip_prepare: bool = False,
    dry_run: bool = False,
    out: Optional[IO[str]] = None,
) -> dict[str, Path]:
    """Writes ``OUT/slurm/`` (all or nothing; printed instead when ``dry_run``): copies of
    prepare.sbatch and train.sbatch and submit_all.sh, which submits from ``workdir`` (default
    the current directory); returns file name -> path. ConfigError when the repository's scripts
    are missing or some N does not fill whole nodes."""
    out = out or sys.stdout
    slurm_dir = plan.out_dir / "slurm"
    paths = {name: slurm_dir / name for name in ("prepare.sbatch", "train.sbatch", "submit_all.sh")}
    for source in (SLURM_SCRIPTS / name for name in ("prepare.sbatch", "train.sbatch")):
        if not source.is_file():
            raise ConfigError(
                f"{source} not found: a SLURM sweep submits the repository's batch scripts; "
                "run it from a checkout of hvdtrack (pip install -e .)"
            )
    submit = _submit_all(plan, options, Path(workdir or os.getcwd()).absolute(), skip_prepare)
    if dry_run:
        print(
            f"# ---- {paths['submit_all.sh']} (beside copies of {SLURM_SCRIPTS}/*)\n{submit}",
            file=out,
        )
        return paths
    with Staged() as staged:  # all three files or none
        for name, path in paths.items():
            text = submit if name == "submit_all.sh" else (SLURM_SCRIPTS / name).read_text()
            staged.path(path).write_text(text)
        for path in staged.commit():
            path.chmod(0o755)
    print(f"[sweep] wrote {slurm_dir}: prepare.sbatch, train.sbatch, submit_all.sh", file=out)
    print("[sweep] submit all (prepare -> runs -> report): bash", paths["submit_all.sh"], file=out)
    return paths


# ------------------------------------------------------------------------------------ internals
def _submit_all(plan: SweepPlan, options: SlurmOptions, workdir: Path, skip_prepare: bool) -> str:
    def job(name: str, *rest: str) -> str:
        named = [f"--job-name=hvdtrack-{plan.mode}-{name}", *options.options()]
        return " ".join(['submit "${after[@]}"', *map(shlex.quote, named), *rest])

    def script(name: str, arguments: list[str]) -> list[str]:
        return [f'"$here/{name}"', *map(shlex.quote, [str(plan.config), *arguments])]

    # The report job runs the interpreter the jobs are given (PYTHON, exported below).
    report = '"$PYTHON" ' + shlex.join(plan.report_command[1:])
    lines = [
        "#!/bin/bash",
        "# Written by `python -m hvdtrack.scaling run --launcher slurm`: the "
        f"{plan.mode}-scaling sweep for N = {', '.join(map(str, plan.nps))}.",
        "# Submits prepare.sbatch, then train.sbatch once per N (in parallel) and the report once",
        "# every run has succeeded (--dependency=afterok). Both scripts are copies of the",
        "# repository's run_scripts/slurm/ (docs/slurm.md); sbatch options here win over theirs.",
        "set -euo pipefail",
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f"cd {shlex.quote(str(workdir))}",
        *options.setup,
        f"default_python={shlex.quote(plan.python)}",
        'export PYTHON="${PYTHON:-$default_python}"',
        'submit() { local id; id="$(sbatch --parsable --output="$here/%x-%j.out" "$@")"; '
        'echo "${id%%;*}"; }',
        "after=()",
    ]
    if not skip_prepare:
        lines += [
            f'prepare="$({job("prepare", *script("prepare.sbatch", list(plan.overrides)))})"',
            'after=(--dependency=afterok:"$prepare")',
        ]
    lines.append("runs=()")
    for n in plan.nps:
        sized = map(shlex.quote, options.options(n))
        train = job(f"np{n}", *sized, *script("train.sbatch", plan.run_overrides(n)))
        lines.append(f'runs+=("$({train})")')
    lines += [
        'after=(--dependency=afterok:"$(IFS=:; echo "${runs[*]}")")',
        f'report="$({job("report", shlex.quote(f"--wrap={report}"))})"',
        'echo "submitted: ${prepare:+prepare $prepare; }runs ${runs[*]}; report $report"',
        f"echo {shlex.quote(f'the report will be in {plan.report_dir}')}",
        "",
    ]
    return "\n".join(lines)


def _one_keep_edge_term(plan: SweepPlan) -> Optional[str]:
    """One ``model.keep_edge_term`` for every run (``launch.one_keep_edge_term``): N ranks on
    this host, N's batch each."""
    from hvdtrack.config import load_config
    from hvdtrack.distributed.launch import one_keep_edge_term

    config = load_config(plan.config, list(plan.overrides))
    return one_keep_edge_term(config, [(n, plan.batches[n]) for n in plan.nps])


def _config_batch(config: Path, overrides: Sequence[str]) -> int:
    from hvdtrack.config import load_config  # checks the config and overrides before any run

    return load_config(config, list(overrides)).train.batch_graphs


def _finished(run_dir: Path) -> bool:
    with contextlib.suppress(DataError):
        return read_run(run_dir).finished
    return False


def _run(command: list[str], log: Path, env: dict[str, str], what: str, out: IO[str]) -> None:
    lines: collections.deque[str] = collections.deque(maxlen=400)
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    try:
        with open(log, "w") as f, subprocess.Popen(command, env=os.environ | env, **pipe) as proc:
            for line in proc.stdout:
                f.write(line)
                out.write(line)
                lines.append(line)
    except FileNotFoundError as err:
        raise TrainingError(
            f"{what}: cannot start {command[0]!r} ({err.strerror}); is Horovod installed in this "
            "environment (run_scripts/install.sh)?"
        ) from None
    if proc.returncode != 0:
        raise TrainingError(
            f"{what} failed with exit code {proc.returncode}: {shlex.join(command)}; log {log}, "
            f"last lines:\n{_failure_tail(list(lines))}"
        )


def _failure_tail(lines: list[str], count: int = 15) -> str:
    # horovodrun ends with its own traceback about a rank failing; the cause is in the ranks'
    # output (lines prefixed "[0]<stderr>:" by Gloo, "[1,0]<stderr>:" by MPI).
    ranks = [line for line in lines if _RANK_LINE.match(line)]
    return "".join((ranks or lines)[-count:])
