"""The ``scaling:`` config section: device cost and power, timing warm-up, predicted network."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from hvdtrack.configtools import check

#: Interconnects with a preset (bandwidth, latency) in ``hvdtrack.scaling.network.PRESETS``.
Interconnect = Literal["nvlink", "infiniband-hdr", "ethernet-25g", "shared-memory", "custom"]


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """How runs are timed, priced and charged for energy, and which network predictions assume.

    Attributes:
      device_kind: what one device is (``"cpu-core"``, ``"gpu"``): picks the power meter (RAPL
        for CPUs, NVML for GPUs) and labels the tables.
      devices_per_worker: devices one worker occupies (cores per worker for ``cpu-core``); a
        run of N workers (with S stages each on GPUs: N x S) is priced and powered on
        them; on CPU the stages share the worker's cores.
      price_per_device_hour: dollars (placeholders of the right order: about $0.05 per cloud
        CPU core-hour, $3 per A100-hour).
      device_power_watts: power per device when nothing is measured (then labelled an
        estimate): about 5 W per server core, 400 W per A100.
      energy_source: ``auto`` measures where the machine allows, else estimates; the others
        force one source.
      timing_warmup_steps, timing_warmup_epochs: steps per rank and epochs, from the first,
        left out of the step statistics and the epoch time (tracing, first-touch allocation).
      interconnect, bandwidth_gbps, latency_us: the network of predictions beyond this machine;
        the numbers (Gb/s, us) replace the preset's and are required for ``custom``.
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
        check(self.device_power_watts > 0, "device_power_watts", "must be > 0")
        for key in ("price_per_device_hour", "timing_warmup_steps", "timing_warmup_epochs"):
            check(getattr(self, key) >= 0, key, "must be >= 0")
        bandwidth, latency = self.bandwidth_gbps, self.latency_us
        check(bandwidth is None or bandwidth > 0, "bandwidth_gbps", "must be > 0 or null")
        check(latency is None or latency >= 0, "latency_us", "must be >= 0 or null")
        check(
            self.interconnect != "custom" or None not in (bandwidth, latency),
            "interconnect",
            "is 'custom': set scaling.bandwidth_gbps and scaling.latency_us too",
        )
