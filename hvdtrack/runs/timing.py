"""Timings of a training run (per step, per epoch, per rank) and their files in the run dir.

The trainer writes them (``hvdtrack.train.loop``) and the scaling package reads them: this module
is the one definition of their format. A run directory holds two files written by the chief
(rank 0) after gathering every rank's timings:

- ``run.json``: the run's description (``info``): worker count, batches, status, metrics, energy,
  the resolved config. Built with ``hvdtrack.runs.runinfo.make_run_info``; extra keys are
  kept and ignored.
- ``timing.jsonl``: one JSON object per line, a header ``{"kind": "header", "schema": 2}`` then
  ``{"kind": "step", ...StepTiming fields}`` and ``{"kind": "epoch", ...EpochTiming fields}``.

Every second of an epoch on a rank is accounted for. The epoch's wall time runs from the end of
the previous epoch's timing to the end of this one's and splits into ``EPOCH_PARTS``: the steps'
data wait, compute and gradient exchange, the input pipeline's start and end, validation,
checkpoints, summaries (TensorBoard, console) and ``records_s`` (gathering and writing the previous
epoch's timings: the field keeps its first name, so run directories stay readable); what is left is ``EpochTiming.rest_s``. The time spent waiting for slower ranks
at the gradient exchange is derived from all ranks' step timings by ``collective_waits``.

``write_run`` may be called at every epoch end with the cumulative lists: both files are replaced
atomically, timing first, so a reader never sees ``status: finished`` before the final timing.

Public symbols: ``StepTiming``, ``EpochTiming``, ``EPOCH_PARTS``, ``PartClock``, ``Run``,
``collective_waits``, ``epoch_accounts``, ``REST_LIMIT``, ``write_run``, ``read_run``,
``RUN_INFO_FILE``, ``TIMING_FILE``, ``SCHEMA_VERSION``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

from hvdtrack.errors import DataError
from hvdtrack.runs.runinfo import (
    check_run_info,
    plain,
    read_bool,
    read_int,
    read_metrics,
    read_number,
    read_seconds,
)
from hvdtrack.utils.io import atomic_write, json_ready, write_json

RUN_INFO_FILE = "run.json"
TIMING_FILE = "timing.jsonl"
SCHEMA_VERSION = 2
# The parts of an epoch's wall time on one rank, in seconds (fields of EpochTiming).
EPOCH_PARTS = (
    "data_s",
    "compute_s",
    "exchange_s",
    "pipeline_s",
    "validation_s",
    "checkpoint_s",
    "summaries_s",
    "records_s",
)
# An epoch whose unaccounted rest exceeds this fraction of its wall time is flagged.
REST_LIMIT = 0.03


class PartClock:
    """Wall time since creation, and the seconds booked to each of ``EPOCH_PARTS``."""

    def __init__(self):
        self.start = time.perf_counter()
        self.parts = dict.fromkeys(EPOCH_PARTS, 0.0)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Books the time spent in the block to ``name``."""
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - begin)

    def add(self, name: str, seconds: float) -> None:
        self.parts[name] += seconds

    def wall(self) -> float:
        return time.perf_counter() - self.start


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """Wall-clock times of one training step on one rank.

    Attributes:
      epoch, step: 0-based epoch and step-within-epoch indices.
      rank: the worker that measured it.
      data_s: time waiting for the next batch from the input pipeline.
      compute_s: forward and backward passes (every accumulated pass) and the optimizer update.
      exchange_s: the gradient exchange (the step's one collective), including the time spent
        waiting there for slower ranks (see ``collective_waits``).
      total_s: the whole step, from asking for its first batch to the end of the update.
      graphs, edges: graphs and edges this rank processed in the step.
      warmup: True for the first ``scaling.timing_warmup_steps`` steps of the rank (excluded from
        statistics).
    """

    epoch: int
    step: int
    rank: int
    data_s: float
    compute_s: float
    exchange_s: float
    total_s: float
    graphs: int
    edges: int
    warmup: bool

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepTiming:
        """Builds a record from a mapping (e.g. a parsed JSON line); ValueError names the field."""
        return _read_record(cls, data)


@dataclasses.dataclass(frozen=True)
class EpochTiming:
    """One epoch on one rank, with its wall time split into ``EPOCH_PARTS``.

    Attributes:
      epoch: 0-based epoch index.
      rank: the worker that measured it.
      time_s: the epoch's training time on this rank: input pipeline and steps, validation and
        checkpoints excluded (the "time per epoch" of the scaling studies).
      wall_s: everything from the end of the previous epoch's record to the end of this one.
      steps, graphs, edges: steps taken and graphs/edges processed by this rank.
      train_loss: mean training loss (the reduced value; the same on every rank).
      val: validation metrics after the epoch (loss, auc, efficiency, purity, ...) or None.
      data_s, compute_s, exchange_s: sums over the epoch's steps (see ``StepTiming``).
      pipeline_s: building input pipelines when the epoch does not continue the open ones
        (they read ``inputs.epochs.EPOCHS_PER_PIPELINE`` epochs), ending the old ones.
      validation_s: validation, including waiting for other ranks' parts.
      checkpoint_s: saving checkpoints, including the barrier after a save.
      summaries_s: TensorBoard summaries, progress and console lines.
      records_s: gathering and writing the previous epoch's timings.
      workers: data-parallel workers that ran the epoch (elastic runs change it; None in
        timings written before it was kept).
      peak_rss_bytes: the highest resident set of this rank's process during the epoch (None
        where /proc is missing).
      peak_gpu_bytes: the most bytes TensorFlow's allocator held on any of this rank's GPUs
        during the epoch (None without GPUs).
    """

    epoch: int
    rank: int
    time_s: float
    wall_s: float
    steps: int
    graphs: int
    edges: int
    train_loss: float
    val: Optional[dict[str, float]]
    data_s: float
    compute_s: float
    exchange_s: float
    pipeline_s: float
    validation_s: float
    checkpoint_s: float
    summaries_s: float
    records_s: float
    workers: Optional[int] = None
    peak_rss_bytes: Optional[int] = None
    peak_gpu_bytes: Optional[int] = None

    @property
    def rest_s(self) -> float:
        """Wall time not accounted for by any part (Python overhead between steps, and gaps)."""
        return self.wall_s - sum(getattr(self, part) for part in EPOCH_PARTS)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpochTiming:
        """Builds a record from a mapping (e.g. a parsed JSON line); ValueError names the field."""
        return _read_record(cls, data)


# A record field's annotation -> its reader (float fields: read_seconds for *_s, >= 0).
_READERS = {
    "int": read_int,
    "bool": read_bool,
    "Optional[int]": functools.partial(read_int, optional=True),
    "Optional[dict[str, float]]": functools.partial(read_metrics, optional=True),
}


def _read_record(cls: type, data: Mapping[str, Any]) -> Any:
    """``cls`` (a record) from ``data``, each field read by its annotation; a field with a
    default may be absent."""
    values = {}
    for field in dataclasses.fields(cls):
        if field.default is dataclasses.MISSING or field.name in data:
            number = read_seconds if field.name.endswith("_s") else read_number
            reader = number if field.type == "float" else _READERS[field.type]
            values[field.name] = reader(data, field.name)
    return cls(**values)


def collective_waits(steps: Sequence[StepTiming]) -> dict[tuple[int, int], float]:
    """Seconds each rank waited at the gradient exchange for slower ranks, per epoch.

    The exchange is one collective per step: it ends at the same moment on every rank, so the
    rank that arrived last spent only the transfer there, and any other rank's excess over it
    is time spent waiting for that rank. Per step: ``wait = exchange_s - min over ranks``
    (clock-free: durations only, so ranks on different hosts need no synchronised clocks).

    Args:
      steps: step timings of every rank (each (epoch, step, rank) once).

    Returns:
      ``{(epoch, rank): seconds}`` summed over the epoch's steps; 0.0 with one rank.
    """
    fastest: dict[tuple[int, int], float] = {}
    for r in steps:
        key = (r.epoch, r.step)
        fastest[key] = min(fastest.get(key, math.inf), r.exchange_s)
    waits: dict[tuple[int, int], float] = {}
    for r in steps:
        key = (r.epoch, r.rank)
        waits[key] = waits.get(key, 0.0) + r.exchange_s - fastest[(r.epoch, r.step)]
    return waits


def epoch_accounts(run: Run) -> list[dict[str, Any]]:
    """Every epoch of every rank as a row of seconds: the parts, the wait, the rest and its flag.

    Returns:
      Rows ordered by (epoch, rank) with keys ``epoch``, ``rank``, ``wall_s``, ``time_s``, the
      ``EPOCH_PARTS``, ``wait_s`` (the part of ``exchange_s`` spent waiting for slower ranks),
      ``rest_s``, ``rest_fraction`` (of ``wall_s``) and ``flagged`` (rest over ``REST_LIMIT``).
    """
    waits = collective_waits(run.steps)
    rows = []
    for e in sorted(run.epochs, key=lambda e: (e.epoch, e.rank)):
        fraction = e.rest_s / e.wall_s if e.wall_s > 0 else 0.0
        rows.append(
            {
                "epoch": e.epoch,
                "rank": e.rank,
                "wall_s": e.wall_s,
                "time_s": e.time_s,
                **{part: getattr(e, part) for part in EPOCH_PARTS},
                "wait_s": waits.get((e.epoch, e.rank), 0.0),
                "rest_s": e.rest_s,
                "rest_fraction": fraction,
                "flagged": abs(fraction) > REST_LIMIT,
            }
        )
    return rows


@dataclasses.dataclass(frozen=True)
class Run:
    """A run directory read back: ``info`` (run.json) and its timings, all validated."""

    path: Path
    info: dict[str, Any]
    steps: list[StepTiming]
    epochs: list[EpochTiming]

    @property
    def finished(self) -> bool:
        """True iff the trainer marked the run finished."""
        return self.info["status"] == "finished"

    @property
    def num_workers(self) -> int:
        return self.info["num_workers"]

    @property
    def name(self) -> str:
        return self.path.name


def write_run(
    run_dir: str | os.PathLike,
    info: Mapping[str, Any],
    steps: Iterable[StepTiming],
    epochs: Iterable[EpochTiming],
) -> None:
    """Writes ``run_dir/timing.jsonl`` then ``run_dir/run.json``, each atomically.

    Call it again (e.g. at each epoch end) with the cumulative lists to replace both files.

    Args:
      run_dir: the run directory (created if missing).
      info: the run description, as made by ``make_run_info``.
      steps: every rank's step timings.
      epochs: every rank's epoch timings.

    Raises:
      DataError: ``info`` is invalid (the message names the key).
    """
    run_dir = Path(run_dir)
    info = dict(info)
    check_run_info(info, f"run info for {run_dir}")
    with atomic_write(run_dir / TIMING_FILE) as f:
        f.write(json.dumps({"kind": "header", "schema": SCHEMA_VERSION}) + "\n")
        # vars() rather than dataclasses.asdict: the records are flat and asdict deep-copies.
        # Strict JSON, as write_json's: a NaN validation metric is null.
        encode = json.JSONEncoder(allow_nan=False).encode
        f.writelines(encode(json_ready({"kind": "step", **vars(r)})) + "\n" for r in steps)
        f.writelines(encode(json_ready({"kind": "epoch", **vars(r)})) + "\n" for r in epochs)
    write_json(run_dir / RUN_INFO_FILE, plain(info))


def read_run(run_dir: str | os.PathLike) -> Run:
    """Reads and validates a run directory written by ``write_run``.

    Args:
      run_dir: the run directory.

    Returns:
      The ``Run``, records in file order. Unfinished runs are returned too (see ``Run.finished``).

    Raises:
      DataError: the directory or a file is missing, a JSON line is malformed, or a record or
        ``run.json`` key is missing or invalid; the message names the directory, file and line.
    """
    path = Path(run_dir)
    info_path, timing_path = _run_files(path)
    info = _read_info(info_path)
    steps: list[StepTiming] = []
    epochs: list[EpochTiming] = []
    try:
        lines = timing_path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{timing_path}: cannot be read ({err})") from None
    num_workers = _most_workers(info)
    for number, line in enumerate(lines, start=1):
        where = f"{timing_path}, line {number}"
        if not line.strip():
            continue
        data = _parse_line(line, where)
        try:
            record = _timing_record(data, num_workers)
        except ValueError as err:
            raise DataError(f"{where}: {err}") from None
        if isinstance(record, StepTiming):
            steps.append(record)
        elif isinstance(record, EpochTiming):
            epochs.append(record)
    return Run(path=path, info=info, steps=steps, epochs=epochs)


# ------------------------------------------------------------------------------------ internals
def _run_files(path: Path) -> tuple[Path, Path]:
    """(run.json, timing.jsonl) of run directory ``path``; DataError if either is missing."""
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise DataError(
            f"run directory {path} {what}; pass directories written by `python -m hvdtrack.train`"
        )
    info_path = path / RUN_INFO_FILE
    timing_path = path / TIMING_FILE
    for file in (info_path, timing_path):
        if not file.is_file():
            raise DataError(
                f"{file} is missing: {path} is not a (complete) run directory; "
                "the trainer writes run.json and timing.jsonl at every epoch end"
            )
    return info_path, timing_path


def _read_info(info_path: Path) -> dict[str, Any]:
    """The run description in ``info_path``, checked; DataError names the file and key."""
    try:
        info = json.loads(info_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{info_path}: not valid JSON ({err})") from None
    if not isinstance(info, dict):
        raise DataError(f"{info_path}: must hold a JSON object, got {type(info).__name__}")
    check_run_info(info, str(info_path))
    return info


def _most_workers(info: Mapping[str, Any]) -> int:
    """The largest worker count the run had: an elastic run's records hold ranks of every worker
    count it had, not only the last."""
    resets = info.get("elastic_resets") or []
    return max([info["num_workers"]] + [r.get("workers_before", 0) for r in resets])


def _parse_line(line: str, where: str) -> dict[str, Any]:
    """The JSON object on one timing line; DataError (naming ``where``) otherwise."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(data).__name__}")
    return data


def _timing_record(data: dict[str, Any], num_workers: int) -> StepTiming | EpochTiming | None:
    """The record of one parsed timing line (None for the header); ValueError says what is
    wrong."""
    kind = data.get("kind")
    if kind == "header":
        schema = data.get("schema")
        if schema != SCHEMA_VERSION:
            older = isinstance(schema, int) and schema < SCHEMA_VERSION
            raise ValueError(
                f"timing schema {schema!r} is not the supported version {SCHEMA_VERSION}"
                + (" (written by an older hvdtrack: train the run again)" if older else "")
            )
        return None
    if kind == "step":
        record: StepTiming | EpochTiming = _fast_step(data) or StepTiming.from_dict(data)
    elif kind == "epoch":
        record = EpochTiming.from_dict(data)
    else:
        raise ValueError(f"'kind' must be 'header', 'step' or 'epoch', got {kind!r}")
    if record.rank >= num_workers:
        raise ValueError(f"rank {record.rank} but run.json says num_workers is {num_workers}")
    return record


def _fast_step(data: dict[str, Any]) -> Optional[StepTiming]:
    # Runs hold up to millions of step lines: accept the common well-formed line with a few
    # exact type checks; anything unusual goes through from_dict, which names the problem.
    try:
        epoch, step, rank = data["epoch"], data["step"], data["rank"]
        graphs, edges, warmup = data["graphs"], data["edges"], data["warmup"]
        data_s, compute_s, total_s = data["data_s"], data["compute_s"], data["total_s"]
        exchange_s = data["exchange_s"]
    except KeyError:
        return None
    ints_ok = type(epoch) is type(step) is type(rank) is type(graphs) is type(edges) is int
    floats_ok = type(data_s) is type(compute_s) is type(exchange_s) is type(total_s) is float
    if not (ints_ok and floats_ok and type(warmup) is bool):
        return None
    if min(epoch, step, rank, graphs, edges) < 0 or not all(
        0 <= x < math.inf for x in (data_s, compute_s, exchange_s, total_s)
    ):
        return None
    return StepTiming(
        epoch, step, rank, data_s, compute_s, exchange_s, total_s, graphs, edges, warmup
    )
