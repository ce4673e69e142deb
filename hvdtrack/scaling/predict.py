"""Efficiency beyond this machine: a ring-allreduce cost model fed by the measured step time.

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

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.scaling import maths
from hvdtrack.scaling.config import ScalingConfig
from hvdtrack.train.timing import Run

DEFAULT_NS = (8, 16, 32, 64, 128, 256, 512, 1024)


@dataclasses.dataclass(frozen=True)
class NetworkModel:
    """A link for the ring model: bandwidth in gigabits/s (per direction), latency in us."""

    name: str
    bandwidth_gbps: float
    latency_us: float
    note: str = ""

    def __post_init__(self):
        if not self.bandwidth_gbps > 0 or not self.latency_us >= 0:
            raise ConfigError(
                f"network '{self.name}': bandwidth_gbps must be > 0 and latency_us >= 0, "
                f"got {self.bandwidth_gbps} and {self.latency_us}"
            )


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
    """Seconds for a ring allreduce of ``num_bytes`` over ``n`` workers (0 for n = 1)."""
    if n < 1 or num_bytes < 0:
        raise ValueError(f"need n >= 1 and num_bytes >= 0, got n={n}, num_bytes={num_bytes}")
    transfer = 2 * (n - 1) / n * num_bytes * 8 / (network.bandwidth_gbps * 1e9)
    return transfer + 2 * (n - 1) * network.latency_us * 1e-6


def predict_scaling(
    step_compute_s: float,
    gradient_bytes: float,
    network: NetworkModel,
    mode: str,
    ns: Sequence[int] = DEFAULT_NS,
) -> list[Prediction]:
    """One ``Prediction`` per N in ``ns`` for ``mode`` "strong" or "weak"."""
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    if not step_compute_s > 0:
        raise ValueError(f"step_compute_s must be > 0, got {step_compute_s}")
    out = []
    for n in ns:
        compute = step_compute_s / n if mode == "strong" else step_compute_s
        allreduce = ring_allreduce_time(gradient_bytes, n, network)
        efficiency = maths.efficiency(mode, step_compute_s, compute + allreduce, n)
        out.append(Prediction(n, compute, allreduce, compute + allreduce, efficiency))
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
    note). DataError for a multi-worker run, no timed steps or no size information."""
    if run.num_workers != 1:
        raise DataError(
            f"{run.path}: the model needs the single-worker run, this one has N={run.num_workers}"
        )
    compute_s = float(np.median(maths.step_times(run) - maths.step_times(run, "exchange_s")))
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
    """One ``Validation`` per run with N > 1 (by N), predicted from the N=1 run over
    ``network``, the link the measured runs used. DataError without an N=1 run."""
    baseline = [r for r in runs if r.num_workers == 1]
    if not baseline:
        raise DataError(
            "validating the model needs the single-worker (N=1) run of the sweep; "
            f"got N = {', '.join(str(r.num_workers) for r in runs)}"
        )
    compute_s, gradient_bytes, _ = baseline_inputs(baseline[0])
    t1 = float(np.median(maths.step_times(baseline[0])))
    out = []
    for run in sorted((r for r in runs if r.num_workers > 1), key=lambda r: r.num_workers):
        n = run.num_workers
        (pred,) = predict_scaling(compute_s, gradient_bytes, network, mode, ns=(n,))
        tn = float(np.median(maths.step_times(run)))
        measured = maths.efficiency(mode, t1, tn, n)
        exchange = float(np.median(maths.step_times(run, "exchange_s")))
        error = (pred.efficiency - measured) / measured
        fields = (pred.step_s, tn, pred.efficiency, measured, error, pred.allreduce_s, exchange)
        out.append(Validation(n, network.name, *fields))
    return out
