"""Scaling maths as pure functions: step statistics, epoch time, speedup, efficiency, cost, energy.

Definitions (t1: time on 1 worker, tN: time on N workers):

- speedup = t1 / tN; strong-scaling efficiency = t1 / (N * tN) (fixed global batch and data);
  weak-scaling efficiency = t1 / tN (fixed work per worker, so ideal tN = t1).
- A synchronous step is gated by its slowest rank: the time of step (epoch, step) is the
  maximum over ranks, and the time of an epoch the maximum of the ranks' epoch times.
- ``epoch_time``: the median over epochs after the first ``warmup_epochs`` (tracing, caches)
  of those epoch times; a run with no more epochs than that uses all of them (the report notes it).
- Step statistics leave out steps any rank marked warm-up.
- cost per epoch = devices * epoch hours * price per device-hour; energy per epoch = mean
  power of the run's devices * epoch seconds.

Public symbols: ``step_statistics``, ``run_step_statistics``, ``step_times``,
``epoch_step_time``, ``epoch_times``, ``epoch_time``, ``epoch_time_includes_warmup``,
``epoch_work``, ``speedup``, ``strong_efficiency``, ``weak_efficiency``, ``efficiency``,
``throughput``, ``cost_per_epoch``, ``energy_per_epoch``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import pandas as pd

from hvdtrack.errors import DataError
from hvdtrack.train.timing import EpochRecord, Run, StepRecord

STEP_FIELDS = ("data_s", "compute_s", "exchange_s", "total_s")


def step_statistics(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """``{"mean", "std", "min", "max", "median", "count"}`` of times [n]; ``std`` is the sample
    standard deviation (ddof=1), 0.0 for one value. DataError when empty (all steps warm-up)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise DataError(
            "no timing values to summarise (are all steps marked warm-up? "
            "lower scaling.timing_warmup_steps or run more steps)"
        )
    return {
        "mean": float(x.mean()),
        "std": float(x.std(ddof=1)) if x.size > 1 else 0.0,
        "min": float(x.min()),
        "max": float(x.max()),
        "median": float(np.median(x)),
        "count": int(x.size),
    }


def run_step_statistics(run: Run, field: str = "total_s") -> dict[str, float]:
    """``step_statistics`` of ``step_times(run, field)``; DataError naming the run if it has none."""
    times = step_times(run, field)
    if times.size == 0:
        raise DataError(
            f"{run.path}: no non-warm-up steps in timing.jsonl (N={run.num_workers}); run more "
            "steps than scaling.timing_warmup_steps"
        )
    return step_statistics(times)


def step_times(run: Run, field: str = "total_s") -> np.ndarray:
    """The slowest rank's ``field`` (one of ``STEP_FIELDS``) of each step, float64 [num_steps]
    by (epoch, step), without the steps any rank marked warm-up."""
    if field not in STEP_FIELDS:
        raise ValueError(f"field must be one of {', '.join(STEP_FIELDS)}, got {field!r}")
    steps = _slowest_steps(run)
    return steps[~steps["warmup"]][field].to_numpy(dtype=np.float64)


def epoch_step_time(run: Run, warmup_epochs: int = 1) -> float:
    """The epoch time as the steps tell it: per whole epoch, the sum of its steps' slowest-rank
    times (warm-up included), median over the epochs ``epoch_time`` uses. The gap to
    ``epoch_time`` is what lies outside the steps (the pipeline's start and end)."""
    whole = sorted(set(_whole_epochs(run)["epoch"]))
    if not whole:
        raise DataError(f"{run.path}: no whole epoch in timing.jsonl")
    sums = _slowest_steps(run).groupby("epoch")["total_s"].sum()
    return float(np.median([sums.get(e, 0.0) for e in _after_warmup(whole, warmup_epochs)]))


def epoch_times(run: Run) -> np.ndarray:
    """Time of each whole epoch, float64 [num_epochs]: the maximum over ranks of their epoch
    times (an epoch resumed mid-way, with fewer than ``steps_per_epoch`` steps, is left out)."""
    return _whole_epochs(run).groupby("epoch")["time_s"].max().to_numpy(dtype=np.float64)


def epoch_time(run: Run, warmup_epochs: int = 1) -> float:
    """The median of ``epoch_times`` after ``warmup_epochs`` epochs (all of them when there are
    no more: ``epoch_time_includes_warmup``); DataError without epoch records."""
    times = epoch_times(run)
    if times.size == 0:
        raise DataError(
            f"{run.path}: no epoch records in timing.jsonl; did the run finish an epoch?"
        )
    return float(np.median(_after_warmup(times, warmup_epochs)))


def epoch_time_includes_warmup(run: Run, warmup_epochs: int = 1) -> bool:
    """True when ``epoch_time`` had to use warm-up epochs (the run is too short)."""
    return warmup_epochs > 0 and len({r.epoch for r in run.epochs}) <= warmup_epochs


def epoch_work(run: Run, warmup_epochs: int = 1) -> dict[str, float]:
    """``{"graphs", "edges", "steps"}`` of one epoch (median over the timed epochs), graphs and
    edges summed over ranks, steps per rank (the maximum)."""
    if not run.epochs:
        raise DataError(
            f"{run.path}: no epoch records in timing.jsonl; did the run finish an epoch?"
        )
    per_epoch = (
        _frame(run.epochs, EpochRecord)
        .groupby("epoch")
        .agg({"graphs": "sum", "edges": "sum", "steps": "max"})
    )
    kept = _after_warmup(per_epoch.astype(np.float64), warmup_epochs)
    return {name: float(value) for name, value in kept.median().items()}


def speedup(t1: float, tn: float) -> float:
    """t1 / tN."""
    _positive(t1=t1, tn=tn)
    return t1 / tn


def strong_efficiency(t1: float, tn: float, n: int) -> float:
    """Strong-scaling efficiency t1 / (N * tN): 1 when N workers are N times faster."""
    _positive(t1=t1, tn=tn, n=n)
    return t1 / (n * tn)


def weak_efficiency(t1: float, tn: float) -> float:
    """Weak-scaling efficiency t1 / tN: 1 when N workers do N times the work in the same time."""
    _positive(t1=t1, tn=tn)
    return t1 / tn


def efficiency(mode: str, t1: float, tn: float, n: int) -> float:
    """``strong_efficiency`` or ``weak_efficiency`` as ``mode`` says."""
    return strong_efficiency(t1, tn, n) if mode == "strong" else weak_efficiency(t1, tn)


def throughput(items: float, seconds: float, num_workers: int = 1) -> float:
    """Items (graphs, edges) per second over all workers, or per worker of ``num_workers``."""
    _positive(seconds=seconds, num_workers=num_workers)
    return items / seconds / num_workers


def cost_per_epoch(devices: int, epoch_s: float, price_per_device_hour: float) -> float:
    """Dollars per epoch: devices x epoch hours x price per device-hour."""
    _positive(devices=devices)
    if epoch_s < 0 or price_per_device_hour < 0:
        raise ValueError(
            "epoch_s and price_per_device_hour must be >= 0, "
            f"got {epoch_s}, {price_per_device_hour}"
        )
    return devices * (epoch_s / 3600.0) * price_per_device_hour


def energy_per_epoch(power_watts: float, epoch_s: float) -> float:
    """Joules per epoch from the mean power of all the run's devices (W) and the epoch time (s)."""
    if power_watts < 0 or epoch_s < 0:
        raise ValueError(f"power_watts and epoch_s must be >= 0, got {power_watts}, {epoch_s}")
    return power_watts * epoch_s


def _frame(records: Sequence[object], kind: type) -> pd.DataFrame:
    columns = [f.name for f in dataclasses.fields(kind)]
    return pd.DataFrame([vars(r) for r in records], columns=columns)


def _slowest_steps(run: Run) -> pd.DataFrame:
    """One row per (epoch, step), in order: the slowest rank's times, warm if any rank was."""
    steps = _frame(run.steps, StepRecord).astype({"warmup": bool})
    return steps.groupby(["epoch", "step"]).agg(
        {**dict.fromkeys(STEP_FIELDS, "max"), "warmup": "any"}
    )


def _whole_epochs(run: Run) -> pd.DataFrame:
    # An epoch resumed mid-way ran only part of its steps in its record: not an epoch's time.
    epochs = _frame(run.epochs, EpochRecord)
    full = run.info.get("steps_per_epoch")
    return epochs if full is None else epochs[epochs["steps"] == full]


def _after_warmup(values, warmup_epochs: int):
    """``values`` without the first ``warmup_epochs`` entries, unless that leaves none."""
    return values[warmup_epochs:] if len(values) > warmup_epochs else values


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
