"""Scaling maths on run records: step statistics, epoch time and work, speedup, efficiency.

t1: time on 1 worker, tN: on N workers. Speedup = t1 / tN; strong-scaling efficiency
t1 / (N tN) (fixed global batch and data), weak-scaling efficiency t1 / tN (fixed work per
worker). A synchronous step or epoch takes its slowest rank's time; ``epoch_time`` is the median
over the epochs after the first ``warmup_epochs`` (all of them when there are no more); step
statistics leave out the steps any rank marked warm-up.

Beyond this machine (``predict_scaling``, ``validate_against``): a ring-allreduce cost model fed
by the measured step time.
No overlap of compute and communication, one fused allreduce of B gradient bytes per step (as
Horovod's tensor fusion does for models of this size):

- ring allreduce over N workers: t(N) = 2(N-1)/N * B / bandwidth + 2(N-1) * latency
- strong scaling: step(N) = t_c / N + t(N), efficiency t_c / (N step(N))
- weak scaling:   step(N) = t_c + t(N),     efficiency t_c / step(N)

t_c is the single-worker step without the exchange (median of the N=1 run's non-warm-up
steps). The strong model assumes compute shrinks as 1/N, which stops holding once batches get
small or workers share cores; ``validate_against`` measures how far off it is on the runs here.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import pandas as pd

from hvdtrack.errors import DataError
from hvdtrack.runs.timing import EpochTiming, Run, StepTiming
from hvdtrack.scaling.config import ScalingConfig

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
    """The median of ``epoch_times`` after ``warmup_epochs`` (all of them in a shorter run)."""
    times = epoch_times(run)
    if times.size == 0:
        raise DataError(f"{run.path}: no epoch timings in timing.jsonl; did the run finish one?")
    return float(np.median(_after_warmup(times, warmup_epochs)))


def epoch_work(run: Run, warmup_epochs: int = 1) -> dict[str, float]:
    """``{"graphs", "edges", "steps"}`` of one epoch (median over the timed epochs), graphs and
    edges summed over ranks, steps per rank (``epoch_time`` refuses a run without epochs)."""
    work = {"graphs": "sum", "edges": "sum", "steps": "max"}
    per_epoch = _frame(run.epochs, EpochTiming).groupby("epoch").agg(work).astype(np.float64)
    return {k: float(v) for k, v in _after_warmup(per_epoch, warmup_epochs).median().items()}


def efficiency(mode: str, t1: float, tn: float, n: int) -> float:
    """Strong scaling: t1 / (N tN), 1 when N workers are N times faster; weak: t1 / tN."""
    for name, value in (("t1", t1), ("tN", tn), ("N", n)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    return t1 / tn / (n if mode == "strong" else 1)


DEFAULT_NS = (8, 16, 32, 64, 128, 256, 512, 1024)


@dataclasses.dataclass(frozen=True)
class NetworkModel:
    """A link for the ring model: bandwidth in gigabits/s (per direction), latency in us."""

    name: str
    bandwidth_gbps: float
    latency_us: float
    note: str = ""


# shared-memory: least squares of the ring model to Horovod 0.28.1 Gloo allreduces between 2
# ranks on this 2-core VM (eager hvd.allreduce of 4 KiB, 64 KiB, 1, 4, 16 MiB, median of 10:
# 4.33, 4.02, 5.97, 11.9, 30.3 ms). Its "latency" is mostly Horovod's background cycle and eager
# dispatch, not the wire. (MPI on 2 shared cores was noisier.)
PRESETS: dict[str, NetworkModel] = {
    net.name: net
    for net in (
        NetworkModel("nvlink", 2400.0, 3.0, "NVLink 3 through NVSwitch (A100: 300 GB/s each way)"),
        NetworkModel("infiniband-hdr", 200.0, 2.0, "InfiniBand HDR, a 200 Gb/s port per node"),
        NetworkModel("ethernet-25g", 25.0, 25.0, "25 Gb Ethernet with TCP"),
        NetworkModel("shared-memory", 5.15, 2217.0, "measured here: Gloo over loopback, 1 host"),
    )
}


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The modelled step of N workers: compute per worker, allreduce t(N), their sum, efficiency."""

    n: int
    compute_s: float
    allreduce_s: float
    step_s: float
    efficiency: float


@dataclasses.dataclass(frozen=True)
class Validation:
    """A measured run of N workers against the model over ``network``: step times (median,
    slowest rank), efficiencies on step times, the relative error of the predicted efficiency,
    the model's allreduce and the median measured exchange."""

    n: int
    network: str
    predicted_step_s: float
    measured_step_s: float
    predicted_efficiency: float
    measured_efficiency: float
    relative_error: float
    predicted_allreduce_s: float
    measured_exchange_s: float

    def describe(self) -> str:
        return (
            f"N={self.n} ({self.network}): predicted efficiency {self.predicted_efficiency:.3f}, "
            f"measured {self.measured_efficiency:.3f}, error {self.relative_error:+.1%} "
            f"(step {self.predicted_step_s * 1e3:.2f} ms predicted, "
            f"{self.measured_step_s * 1e3:.2f} ms measured; allreduce predicted "
            f"{self.predicted_allreduce_s * 1e3:.2f} ms, measured "
            f"{self.measured_exchange_s * 1e3:.2f} ms)"
        )


def ring_allreduce_time(num_bytes: float, n: int, network: NetworkModel) -> float:
    """Seconds for a ring allreduce of ``num_bytes`` over ``n`` >= 1 workers (0 for n = 1)."""
    transfer = 2 * (n - 1) / n * num_bytes * 8 / (network.bandwidth_gbps * 1e9)
    return transfer + 2 * (n - 1) * network.latency_us * 1e-6


def predict_scaling(
    step_compute_s: float, gradient_bytes: float, network: NetworkModel, mode: str, ns=DEFAULT_NS
) -> list[Prediction]:
    """One ``Prediction`` per N in ``ns`` for ``mode`` "strong" or "weak"."""
    out = []
    for n in ns:
        compute = step_compute_s / n if mode == "strong" else step_compute_s
        allreduce = ring_allreduce_time(gradient_bytes, n, network)
        modelled = efficiency(mode, step_compute_s, compute + allreduce, n)
        out.append(Prediction(n, compute, allreduce, compute + allreduce, modelled))
    return out


def network_from_config(config: ScalingConfig) -> NetworkModel:
    """The network of ``scaling.interconnect``, with ``bandwidth_gbps``/``latency_us`` overrides."""
    if config.interconnect == "custom":
        return NetworkModel("custom", config.bandwidth_gbps, config.latency_us, "from the config")
    preset = PRESETS[config.interconnect]
    return dataclasses.replace(
        preset,
        bandwidth_gbps=config.bandwidth_gbps or preset.bandwidth_gbps,
        latency_us=preset.latency_us if config.latency_us is None else config.latency_us,
    )


def baseline_inputs(run: Run) -> tuple[float, int, str]:
    """(t_c, gradient bytes, note) of a single-worker run: the median non-warm-up
    ``total_s - exchange_s`` and run.json's gradient bytes (else 4 x num_params, said in the
    note). DataError without timed steps or size information."""
    compute_s = float(np.median(step_times(run) - step_times(run, "exchange_s")))
    if run.info.get("gradient_bytes"):
        return compute_s, int(run.info["gradient_bytes"]), ""
    if run.info.get("num_params"):
        num_bytes = 4 * int(run.info["num_params"])
        return compute_s, num_bytes, "gradient bytes taken as 4 x num_params (float32)"
    raise DataError(
        f"{run.path}/run.json has neither 'gradient_bytes' nor 'num_params': "
        "cannot size the allreduce"
    )


def validate_against(
    runs: Sequence[Run], mode: str, network: NetworkModel = PRESETS["shared-memory"]
) -> list[Validation]:
    """One ``Validation`` per run with N > 1 of a sweep (by N), predicted from its N=1 run (which
    ``runs`` must hold) over ``network``, the link the measured runs used."""
    baseline, *others = sorted(runs, key=lambda r: r.num_workers)
    compute_s, gradient_bytes, _ = baseline_inputs(baseline)
    t1 = float(np.median(step_times(baseline)))
    out = []
    for run in others:
        n = run.num_workers
        (pred,) = predict_scaling(compute_s, gradient_bytes, network, mode, ns=(n,))
        tn = float(np.median(step_times(run)))
        measured = efficiency(mode, t1, tn, n)
        exchange = float(np.median(step_times(run, "exchange_s")))
        error = (pred.efficiency - measured) / measured
        fields = (pred.step_s, tn, pred.efficiency, measured, error, pred.allreduce_s, exchange)
        out.append(Validation(n, network.name, *fields))
    return out


# ------------------------------------------------------------------------------ internals
def _frame(records: Sequence[object], kind: type) -> pd.DataFrame:
    columns = [f.name for f in dataclasses.fields(kind)]
    return pd.DataFrame([vars(r) for r in records], columns=columns)


def _slowest_steps(run: Run) -> pd.DataFrame:
    """One row per (epoch, step), in order: the slowest rank's times, warm if any rank was."""
    steps = _frame(run.steps, StepTiming).astype({"warmup": bool})
    return steps.groupby(["epoch", "step"]).agg(
        {**dict.fromkeys(STEP_FIELDS, "max"), "warmup": "any"}
    )


def _whole_epochs(run: Run) -> pd.DataFrame:
    epochs = _frame(run.epochs, EpochTiming)
    full = run.info.get("steps_per_epoch")
    return epochs if full is None else epochs[epochs["steps"] == full]


def _after_warmup(values, warmup_epochs: int):
    """``values`` without the first ``warmup_epochs`` entries, unless that leaves none."""
    return values[warmup_epochs:] if len(values) > warmup_epochs else values
