"""Scaling sweeps: one training run per worker count, launched locally or as SLURM job scripts.

Local (``horovodrun``), for each N in ``--np``::

    python -m hvdtrack.prepare --config CONFIG                       # once
    horovodrun -np N -H localhost:N --gloo python -m hvdtrack.train --config CONFIG \\
        distributed.strategy=horovod train.batch_graphs=B train.run_dir=OUT/<mode>-np<N> [overrides]

then the report into ``OUT/report-<mode>``. Strong scaling keeps the global batch G fixed
(B = G / N, refused unless every N divides G); weak scaling keeps B fixed. N=1 also runs under
horovodrun, so every run pays the same launcher and framework costs.

SLURM: one sbatch script per N (``srun --mpi=pmix python -m hvdtrack.train ...``; Gloo cannot be
started by srun, so the cluster runs use Horovod's MPI controller), a prepare and a report job,
and ``submit_all.sh`` chaining them with ``--dependency=afterok``.

Public symbols: ``SweepPlan``, ``SlurmOptions``, ``plan_sweep``, ``parse_worker_counts``,
``run_sweep``, ``write_slurm_scripts``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import IO, Optional, Sequence

import yaml

from hvdtrack import configtools
from hvdtrack.errors import ConfigError, DataError, TrainingError
from hvdtrack.train.timing import read_run

# Keys the sweep sets itself for every run; an override of them would break the comparison.
SWEEP_KEYS = ("distributed.strategy", "train.batch_graphs", "train.run_dir")
# Strong scaling splits a fixed global batch over N workers, weak scaling keeps the batch per
# worker: mode -> (its option, what it fixes).
BATCH_OPTIONS = {
    "strong": ("--global-batch", "global batch"),
    "weak": ("--batch", "batch per worker"),
}
_RANK_LINE = re.compile(r"^\[\d+(,\d+)?\]<std(err|out)>:")


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """The commands of one sweep (argument lists, not shell strings).

    Attributes:
      mode: "strong" or "weak".
      nps: worker counts, ascending.
      config: the config file (absolute).
      out_dir: where run directories, logs and the report go (absolute).
      batches: N -> graphs per worker per step.
      prepare: the dataset preparation command.
      train: N -> ``python -m hvdtrack.train ...`` (without the launcher).
      launcher: N -> the local launcher prefix (``horovodrun -np N -H localhost:N --gloo``).
      env: extra environment for the local launcher (e.g. Open MPI's run-as-root switches).
    """

    mode: str
    nps: tuple[int, ...]
    config: Path
    out_dir: Path
    batches: dict[int, int]
    prepare: list[str]
    train: dict[int, list[str]]
    launcher: dict[int, list[str]]
    env: dict[str, str]

    def run_dir(self, n: int) -> Path:
        return self.out_dir / f"{self.mode}-np{n}"

    @property
    def report_dir(self) -> Path:
        return self.out_dir / f"report-{self.mode}"

    def local_command(self, n: int) -> list[str]:
        return [*self.launcher[n], *self.train[n]]

    def report_command(self, python: str) -> list[str]:
        dirs = [str(self.run_dir(n)) for n in self.nps]
        return [
            python,
            "-m",
            "hvdtrack.scaling",
            "report",
            *dirs,
            "--mode",
            self.mode,
            "--out",
            str(self.report_dir),
        ]


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    """Resources of the generated sbatch scripts.

    Attributes:
      tasks_per_node: workers per node; default ``gpus_per_node`` if set, else all N on one node.
      gpus_per_node: ``#SBATCH --gpus-per-node``; None for CPU runs.
      cpus_per_task: ``#SBATCH --cpus-per-task`` (threads per worker).
      time: ``#SBATCH --time``.
      partition, account: passed through when set.
      srun_mpi: the ``srun --mpi=`` plugin (pmix, pmi2, ...).
      setup: shell lines run before srun (``module load ...``, ``source .venv/bin/activate``).
    """

    tasks_per_node: Optional[int] = None
    gpus_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    time: str = "01:00:00"
    partition: Optional[str] = None
    account: Optional[str] = None
    srun_mpi: str = "pmix"
    setup: tuple[str, ...] = ()

    def __post_init__(self):
        for key in ("tasks_per_node", "gpus_per_node", "cpus_per_task"):
            value = getattr(self, key)
            configtools.check(
                value is None or value >= 1, f"--{key.replace('_', '-')}", "must be >= 1"
            )

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


def parse_worker_counts(text: str) -> tuple[int, ...]:
    """ "1,2,4" -> (1, 2, 4); ConfigError for anything else."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            f"--np must be comma-separated worker counts like 1,2,4, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"--np must be comma-separated worker counts >= 1, got {text!r}")
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
    """Works out every command of a sweep, checking the batch arithmetic first.

    Args:
      mode: "strong" or "weak".
      nps: worker counts.
      config: the YAML config file.
      out_dir: output root.
      global_batch: strong scaling: graphs per step over all workers (default: the config's
        ``train.batch_graphs``, i.e. the single-worker batch).
      batch: weak scaling: graphs per worker per step (default: the config's
        ``train.batch_graphs``).
      controller: horovodrun's "gloo" or "mpi".
      overrides: extra ``section.key=value`` for every training run.
      python: the interpreter for the prepare and training commands.

    Raises:
      ConfigError: bad mode, a global batch not divisible by some N (with the smallest batch
        that would be), an override of a key the sweep sets, a missing config file.
    """
    if mode not in ("strong", "weak"):
        raise ConfigError(f"--mode must be strong or weak, got {mode!r}")
    if controller not in ("gloo", "mpi"):
        raise ConfigError(f"--controller must be gloo or mpi, got {controller!r}")
    nps = tuple(sorted(nps))
    config = Path(config).absolute()
    out_dir = Path(out_dir).absolute()
    for text in overrides:
        path, _ = configtools.parse_override(text)
        key = ".".join(path)
        if key in SWEEP_KEYS:
            raise ConfigError(
                f"override '{text}': the sweep sets {key} itself "
                "(use --global-batch / --batch for the batch and --out for the run directories)"
            )
    option, what = BATCH_OPTIONS[mode]
    other_mode = "weak" if mode == "strong" else "strong"
    given, other = (global_batch, batch) if mode == "strong" else (batch, global_batch)
    if other is not None:
        raise ConfigError(
            f"{BATCH_OPTIONS[other_mode][0]} is for {other_mode} scaling; "
            f"{mode} scaling takes {option}"
        )
    config_batch = _config_batch(config)
    value = given or config_batch
    if value is None or value < 1:
        raise ConfigError(
            f"{mode} scaling needs the {what}: pass {option} (the config {config} "
            "sets no train.batch_graphs)"
        )
    bad = [n for n in nps if mode == "strong" and value % n]
    if bad:
        raise ConfigError(
            f"strong scaling keeps the global batch fixed: {value} graphs cannot be split "
            f"evenly over N = {', '.join(map(str, bad))} workers; choose a --global-batch that "
            f"is a multiple of {math.lcm(*nps)}"
        )
    batches = {n: value // n if mode == "strong" else value for n in nps}

    prepare = [python, "-m", "hvdtrack.prepare", "--config", str(config)]
    horovodrun = Path(python).parent / "horovodrun"
    horovodrun_cmd = str(horovodrun) if horovodrun.exists() else "horovodrun"
    train, launcher = {}, {}
    for n in nps:
        train[n] = [
            python,
            "-m",
            "hvdtrack.train",
            "--config",
            str(config),
            "distributed.strategy=horovod",
            f"train.batch_graphs={batches[n]}",
            f"train.run_dir={out_dir / f'{mode}-np{n}'}",
            *overrides,
        ]
        launcher[n] = [horovodrun_cmd, "-np", str(n), "-H", f"localhost:{n}", f"--{controller}"]
    env = {}
    if controller == "mpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        # Open MPI refuses to start as root without these two.
        env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return SweepPlan(mode, nps, config, out_dir, batches, prepare, train, launcher, env)


def run_sweep(
    plan: SweepPlan,
    *,
    dry_run: bool = False,
    skip_prepare: bool = False,
    skip_finished: bool = False,
    python: str = sys.executable,
    out: Optional[IO[str]] = None,
) -> Optional[dict[str, Path]]:
    """Runs the sweep locally (or prints it), then writes the report.

    Args:
      plan: from ``plan_sweep``.
      dry_run: print the commands only.
      skip_prepare: do not run the dataset preparation.
      skip_finished: leave out N whose run directory already holds a finished run.
      python: the interpreter for the report command.
      out: where progress goes (default stdout).

    Returns:
      The report's files, or None for a dry run.

    Raises:
      TrainingError: a command failed (the message names it and ends with its log's tail).
    """
    out = out or sys.stdout
    env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.env.items())
    if dry_run:
        if not skip_prepare:
            print(shlex.join(plan.prepare), file=out)
        for n in plan.nps:
            print(f"{env_prefix} {shlex.join(plan.local_command(n))}".strip(), file=out)
        print(shlex.join(plan.report_command(python)), file=out)
        return None

    if not skip_prepare:
        print(f"[sweep] preparing the dataset: {shlex.join(plan.prepare)}", file=out, flush=True)
        _run(plan.prepare, None, dict(os.environ), "dataset preparation", out)
    logs = plan.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for n in plan.nps:
        run_dir = plan.run_dir(n)
        if skip_finished and _finished(run_dir):
            print(f"[sweep] N={n}: {run_dir} is finished already, skipped", file=out, flush=True)
            continue
        log = logs / f"{plan.mode}-np{n}.log"
        command = plan.local_command(n)
        print(f"[sweep] N={n}: {env_prefix} {shlex.join(command)}".replace("  ", " "), file=out)
        print(f"[sweep] N={n}: log {log}", file=out, flush=True)
        _run(command, log, {**os.environ, **plan.env}, f"training run N={n}", out)
        if not _finished(run_dir):
            raise TrainingError(
                f"training run N={n} exited cleanly but {run_dir} holds no finished run "
                f"(run.json status is not 'finished'); see {log}"
            )

    from hvdtrack.scaling import report  # matplotlib only when a report is made

    runs = report.load_runs([plan.run_dir(n) for n in plan.nps])
    paths = report.write_report(report.build_report(runs, plan.mode), plan.report_dir)
    print(f"[sweep] report: {paths['md']}", file=out, flush=True)
    return paths


def write_slurm_scripts(
    plan: SweepPlan,
    options: SlurmOptions,
    *,
    python: str = sys.executable,
    workdir: Optional[str | os.PathLike] = None,
    dry_run: bool = False,
    out: Optional[IO[str]] = None,
) -> dict[str, Path]:
    """Writes ``OUT/slurm/``: prepare.sbatch, <mode>-np<N>.sbatch, report.sbatch, submit_all.sh.

    Args:
      plan: from ``plan_sweep`` (its controller is ignored: srun starts MPI ranks).
      options: resources.
      python: the interpreter on the compute nodes.
      workdir: the jobs' working directory (default: the current one).
      dry_run: print the scripts instead of writing them.
      out: where the instructions go (default stdout).

    Returns:
      Script name -> path (the paths are not written when ``dry_run``).
    """
    out = out or sys.stdout
    from hvdtrack.utils.io import atomic_write

    slurm_dir = plan.out_dir / "slurm"
    workdir = Path(workdir or os.getcwd()).absolute()
    # script name -> (job name, nodes, tasks per node, GPUs per node, command)
    jobs = {"prepare.sbatch": ("prepare", 1, 1, None, plan.prepare)}
    for n in plan.nps:
        srun = ["srun", f"--mpi={options.srun_mpi}", *plan.train[n]]
        jobs[f"{plan.mode}-np{n}.sbatch"] = (
            f"np{n}",
            *options.layout(n),
            options.gpus_per_node,
            srun,
        )
    jobs["report.sbatch"] = ("report", 1, 1, None, plan.report_command(python))
    scripts = {
        name: _sbatch(
            f"hvdtrack-{plan.mode}-{job}",
            nodes,
            per_node,
            gpus,
            options,
            slurm_dir,
            workdir,
            shlex.join(command),
        )
        for name, (job, nodes, per_node, gpus, command) in jobs.items()
    }
    names = list(jobs)[1:-1]
    scripts["submit_all.sh"] = _submit_all(plan, names)

    paths = {name: slurm_dir / name for name in scripts}
    if dry_run:
        for name, text in scripts.items():
            print(f"# ---- {paths[name]}\n{text}", file=out)
        return paths
    for name, text in scripts.items():
        with atomic_write(paths[name]) as f:
            f.write(text)
        paths[name].chmod(0o755)
    print(f"[sweep] wrote {len(scripts)} SLURM scripts to {slurm_dir}", file=out)
    print(
        f"[sweep] submit all (prepare -> runs -> report): bash {paths['submit_all.sh']}", file=out
    )
    print(f"[sweep] or one run: sbatch {paths[names[0]]}", file=out)
    return paths


# ------------------------------------------------------------------------------------ internals
def _config_batch(config: Path) -> Optional[int]:
    if not config.is_file():
        raise ConfigError(f"config file {config} not found")
    try:
        data = yaml.safe_load(config.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{config}: not valid YAML ({err})") from None
    train = data.get("train") if isinstance(data, dict) else None
    value = train.get("batch_graphs") if isinstance(train, dict) else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{config}: 'train.batch_graphs' must be an integer, got {value!r}")
    return value


def _finished(run_dir: Path) -> bool:
    try:
        return read_run(run_dir).finished
    except DataError:
        return False


def _run(
    command: list[str], log: Optional[Path], env: dict[str, str], what: str, out: IO[str]
) -> None:
    try:
        if log is None:
            code = subprocess.run(command, env=env, check=False).returncode
            tail = ""
        else:
            with open(log, "w") as f:
                proc = subprocess.Popen(
                    command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
                lines: collections.deque[str] = collections.deque(maxlen=400)
                for line in proc.stdout:
                    f.write(line)
                    out.write(line)
                    lines.append(line)
                code = proc.wait()
            tail = _failure_tail(list(lines))
    except FileNotFoundError as err:
        raise TrainingError(
            f"{what}: cannot start {command[0]!r} ({err.strerror}); is Horovod installed in this "
            "environment (run_scripts/install.sh)?"
        ) from None
    if code != 0:
        where = f"; log {log}, last lines:\n{tail}" if log is not None else ""
        raise TrainingError(f"{what} failed with exit code {code}: {shlex.join(command)}{where}")


def _failure_tail(lines: list[str], count: int = 15) -> str:
    # horovodrun ends with its own traceback about a rank failing; the cause is in the ranks'
    # output (lines prefixed "[0]<stderr>:" by Gloo, "[1,0]<stderr>:" by MPI).
    ranks = [line for line in lines if _RANK_LINE.match(line)]
    return "".join((ranks or lines)[-count:])


def _sbatch(
    job: str,
    nodes: int,
    tasks_per_node: int,
    gpus_per_node: Optional[int],
    options: SlurmOptions,
    slurm_dir: Path,
    workdir: Path,
    command: str,
) -> str:
    lines = [
        "#!/bin/bash",
        "# Written by `python -m hvdtrack.scaling run --launcher slurm`; submit with sbatch.",
        f"#SBATCH --job-name={job}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks={nodes * tasks_per_node}",
        f"#SBATCH --ntasks-per-node={tasks_per_node}",
    ]
    if options.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={options.cpus_per_task}")
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    lines.append(f"#SBATCH --time={options.time}")
    if options.partition:
        lines.append(f"#SBATCH --partition={options.partition}")
    if options.account:
        lines.append(f"#SBATCH --account={options.account}")
    lines += [
        f"#SBATCH --output={slurm_dir / job}-%j.out",
        "set -euo pipefail",
        f"cd {shlex.quote(str(workdir))}",
        *options.setup,
        command,
        "",
    ]
    return "\n".join(lines)


def _submit_all(plan: SweepPlan, names: list[str]) -> str:
    lines = [
        "#!/bin/bash",
        f"# Submits the {plan.mode}-scaling sweep: dataset preparation, then the runs for",
        f"# N = {', '.join(map(str, plan.nps))} (in parallel), then the report once all succeeded.",
        "set -euo pipefail",
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'submit() { local id; id="$(sbatch --parsable "$@")"; echo "${id%%;*}"; }',
        'prepare="$(submit "$here/prepare.sbatch")"',
        "runs=()",
    ]
    for name in names:
        lines.append(f'runs+=("$(submit --dependency=afterok:"$prepare" "$here/{name}")")')
    lines += [
        'deps="$(IFS=:; echo "${runs[*]}")"',
        'report="$(submit --dependency=afterok:"$deps" "$here/report.sbatch")"',
        'echo "submitted: prepare $prepare; runs ${runs[*]}; report $report"',
        f'echo "the report will be in {plan.report_dir}"',
        "",
    ]
    return "\n".join(lines)
