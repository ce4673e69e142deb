"""The ``scaling:`` config section: device cost and power, timing warm-up, predicted network."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from hvdtrack.configtools import check

#: Interconnects with a preset (bandwidth, latency) in ``hvdtrack.scaling.predict.PRESETS``.
Interconnect = Literal["nvlink", "infiniband-hdr", "ethernet-25g", "shared-memory", "custom"]


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """How runs are timed, priced and charged for energy, and which network predictions assume.

    Attributes:
      device_kind: what one device is, e.g. ``"cpu-core"`` or ``"gpu"``; picks the power meter
        (RAPL for CPUs, NVML for GPUs) and labels the tables.
      devices_per_worker: devices one worker occupies (cores per worker for ``cpu-core``); the
        cost and the estimated power of a run of N workers count ``N * devices_per_worker``.
      price_per_device_hour: dollars per device-hour (the defaults are placeholders of the
        right order: about $0.05 per cloud CPU core-hour, about $3 per A100-hour).
      device_power_watts: power per device used when nothing is measured (the energy is then
        labelled an estimate); about 5 W per server core, 400 W per A100.
      energy_source: ``auto`` measures where the machine allows (RAPL for CPUs, NVML for
        GPUs) and otherwise estimates; the others force one source.
      timing_warmup_steps: steps per rank, from the first, marked warm-up and excluded from
        step statistics (tracing and first-touch allocation make them slow).
      timing_warmup_epochs: epochs, from the first, excluded from the epoch time when the run
        has more epochs than this.
      interconnect: the network assumed for predictions beyond this machine.
      bandwidth_gbps: per-link bandwidth in gigabits per second; required for ``custom``,
        otherwise it replaces the preset's value.
      latency_us: per-message latency in microseconds; as ``bandwidth_gbps``.
    """

    device_kind: str = "cpu-core"
    devices_per_worker: int = 1
    price_per_device_hour: float = 0.05
    device_power_watts: float = 5.0
    energy_source: Literal["auto", "rapl", "nvml", "estimate"] = "auto"
    timing_warmup_steps: int = 2
    timing_warmup_epochs: int = 1
    interconnect: Interconnect = "infiniband-hdr"
    bandwidth_gbps: Optional[float] = None
    latency_us: Optional[float] = None

    def __post_init__(self):
        check(bool(self.device_kind.strip()), "device_kind", "must not be empty")
        check(self.devices_per_worker >= 1, "devices_per_worker", "must be >= 1")
        check(self.price_per_device_hour >= 0, "price_per_device_hour", "must be >= 0")
        check(self.device_power_watts > 0, "device_power_watts", "must be > 0")
        check(self.timing_warmup_steps >= 0, "timing_warmup_steps", "must be >= 0")
        check(self.timing_warmup_epochs >= 0, "timing_warmup_epochs", "must be >= 0")
        check(
            self.bandwidth_gbps is None or self.bandwidth_gbps > 0,
            "bandwidth_gbps",
            "must be > 0 or null",
        )
        check(self.latency_us is None or self.latency_us >= 0, "latency_us", "must be >= 0 or null")
        check(
            self.interconnect != "custom"
            or (self.bandwidth_gbps is not None and self.latency_us is not None),
            "interconnect",
            "is 'custom': set scaling.bandwidth_gbps and scaling.latency_us too",
        )
