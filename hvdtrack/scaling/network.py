"""Links for the ring model of the gradient allreduce (``hvdtrack.scaling.maths``): a bandwidth
and a latency, presets for common interconnects and the one measured here, the link a
``ScalingConfig`` names, and the ring's time over a link.

Public symbols: ``NetworkModel``, ``PRESETS``, ``ring_allreduce_time``, ``network_from_config``.
"""

from __future__ import annotations

import dataclasses

from hvdtrack.scaling.config import ScalingConfig


@dataclasses.dataclass(frozen=True)
class NetworkModel:
    """A link for the ring model: bandwidth in gigabits/s (per direction), latency in us."""

    name: str
    bandwidth_gbps: float
    latency_us: float
    note: str = ""


# shared-memory: the ring model fitted to Horovod 0.28.1 Gloo allreduces of 2 ranks on a 2-core
# VM (eager, 4 KiB-16 MiB, median of 10: 4.33-30.3 ms); its "latency" is mostly eager dispatch
# and the 1 ms cycle, not the wire. With half a 20 ms cycle it gives an exchange alone at N=2
# (run_scripts/shaped_links.py --phase random, whose idle loops stay in phase): 15.2 ms against
# 14.4-15.7 measured. In training the loops' phases wander, and the last rank waits a quarter
# cycle more on average, for the other's loop (maths.cycle_wait; run_scripts/horovod_cycles.py,
# docs/scaling/README.md, 2026-12-03). Too slow for 4 and 8 ranks on this host (24.4 and 42.4
# ms against 21 and 29-31).
PRESETS: dict[str, NetworkModel] = {
    net.name: net
    for net in (
        NetworkModel("nvlink", 2400.0, 3.0, "NVLink 3 through NVSwitch (A100: 300 GB/s each way)"),
        NetworkModel("infiniband-hdr", 200.0, 2.0, "InfiniBand HDR, a 200 Gb/s port per node"),
        NetworkModel("ethernet-25g", 25.0, 25.0, "25 Gb Ethernet with TCP"),
        NetworkModel("shared-memory", 5.15, 2217.0, "measured here: Gloo over loopback, 1 host"),
    )
}


def ring_allreduce_time(num_bytes: float, n: int, network: NetworkModel) -> float:
    """Seconds for a ring allreduce of ``num_bytes`` over ``n`` >= 1 workers (0 for n = 1)."""
    transfer = 2 * (n - 1) / n * num_bytes * 8 / (network.bandwidth_gbps * 1e9)
    return transfer + 2 * (n - 1) * network.latency_us * 1e-6


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
