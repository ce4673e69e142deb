"""Scaling maths on run records: step statistics, epoch time and work, speedup, efficiency.

t1: time on 1 worker, tN: on N workers. Speedup = t1 / tN; strong-scaling efficiency
t1 / (N tN) (fixed global batch and data), weak-scaling efficiency t1 / tN (fixed work per
worker). A synchronous step or epoch takes its slowest rank's time; ``epoch_time`` is the median
over the epochs after the first ``warmup_epochs`` (all of them when there are no more); step
statistics leave out the steps any rank marked warm-up.
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
    """``{"mean", "std", "min", "max", "median", "count"}`` of times; ``std`` with ddof=1 (0.0
    for one value). DataError when empty (all steps warm-up)."""
    x = pd.Series(np.asarray(values, dtype=np.float64).ravel())
    if x.empty:
        raise DataError(
            "no timing values to summarise (are all steps marked warm-up? "
            "lower scaling.timing_warmup_steps or run more steps)"
        )
    stats = x.agg(["mean", "std", "min", "max", "median"]).fillna(0.0)
    return {**{k: float(v) for k, v in stats.items()}, "count": int(x.size)}


def step_times(run: Run, field: str = "total_s") -> np.ndarray:
    """The slowest rank's ``field`` (one of ``STEP_FIELDS``) of each non-warm-up step, by
    (epoch, step); DataError naming the run when there is none."""
    if field not in STEP_FIELDS:
        raise ValueError(f"field must be one of {', '.join(STEP_FIELDS)}, got {field!r}")
    steps = _slowest_steps(run)
    times = steps[~steps["warmup"]][field].to_numpy(dtype=np.float64)
    if times.size == 0:
        raise DataError(
            f"{run.path}: no non-warm-up steps in timing.jsonl (N={run.num_workers}); run more "
            "steps than scaling.timing_warmup_steps"
        )
    return times


def epoch_step_time(run: Run, warmup_epochs: int = 1) -> float:
    """Per whole epoch the sum of its steps' slowest-rank times (warm-up included), median over
    the epochs ``epoch_time`` uses: the gap to ``epoch_time`` is what lies outside the steps."""
    whole = sorted(set(_whole_epochs(run)["epoch"]))
    if not whole:
        raise DataError(f"{run.path}: no whole epoch in timing.jsonl")
    sums = _slowest_steps(run).groupby("epoch")["total_s"].sum()
    return float(np.median([sums.get(e, 0.0) for e in _after_warmup(whole, warmup_epochs)]))


def epoch_times(run: Run) -> np.ndarray:
    """Time of each whole epoch (the slowest rank's); an epoch resumed mid-way, with fewer than
    ``steps_per_epoch`` steps, is left out."""
    return _whole_epochs(run).groupby("epoch")["time_s"].max().to_numpy(dtype=np.float64)


def epoch_time(run: Run, warmup_epochs: int = 1) -> float:
    """The median of ``epoch_times`` after ``warmup_epochs`` (see the module docstring)."""
    times = epoch_times(run)
    if times.size == 0:
        raise DataError(f"{run.path}: no epoch records in timing.jsonl; did the run finish one?")
    return float(np.median(_after_warmup(times, warmup_epochs)))


def epoch_time_includes_warmup(run: Run, warmup_epochs: int = 1) -> bool:
    """True when ``epoch_time`` had to use warm-up epochs (the run is too short)."""
    return warmup_epochs > 0 and len({r.epoch for r in run.epochs}) <= warmup_epochs


def epoch_work(run: Run, warmup_epochs: int = 1) -> dict[str, float]:
    """``{"graphs", "edges", "steps"}`` of one epoch (median over the timed epochs), graphs and
    edges summed over ranks, steps per rank."""
    if not run.epochs:
        raise DataError(f"{run.path}: no epoch records in timing.jsonl; did the run finish one?")
    work = {"graphs": "sum", "edges": "sum", "steps": "max"}
    per_epoch = _frame(run.epochs, EpochRecord).groupby("epoch").agg(work).astype(np.float64)
    return {k: float(v) for k, v in _after_warmup(per_epoch, warmup_epochs).median().items()}


def speedup(t1: float, tn: float) -> float:
    """t1 / tN."""
    _positive(t1=t1, tn=tn)
    return t1 / tn


def strong_efficiency(t1: float, tn: float, n: int) -> float:
    """t1 / (N tN): 1 when N workers are N times faster."""
    _positive(n=n)
    return speedup(t1, tn) / n


def efficiency(mode: str, t1: float, tn: float, n: int) -> float:
    """Strong-scaling efficiency, or for ``mode == "weak"`` t1 / tN."""
    return strong_efficiency(t1, tn, n) if mode == "strong" else speedup(t1, tn)


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
