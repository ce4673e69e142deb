"""Energy of a training run: RAPL (CPU packages), NVML (NVIDIA GPUs), or a labelled estimate.

Sources (``scaling.energy_source``; ``auto`` picks NVML for ``device_kind == "gpu"``, RAPL
otherwise, and the estimate when that one is not available):

- ``nvml``: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load, Volta and newer)
  summed over this process's GPUs; needs ``pynvml`` (``nvidia-ml-py``) and a GPU.
- ``rapl``: the package zones ``/sys/class/powercap/intel-rapl:<n>/energy_uj`` (AMD CPUs use the
  same interface). Counters wrap at ``max_energy_range_uj``, which each read unwraps when reads
  come more often than one wrap period (minutes to hours). A package counter measures the whole
  socket (idle cores and other processes included); each of the node's ``local_size`` processes
  books an equal share. Counters that are root-only on recent kernels fall back to the estimate.
- ``estimate``: ``scaling.device_power_watts * devices * seconds``, labelled ``"estimate"``.

Every process meters its share (``start()``, ``sample()`` at will, ``stop()``); the sum of the
readings' joules over processes is the run's energy, over the run's seconds its mean power.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from pathlib import Path
from typing import Callable, Optional

from hvdtrack.errors import ConfigError
from hvdtrack.scaling.config import ScalingConfig

POWERCAP_ROOT = "/sys/class/powercap"
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")


@dataclasses.dataclass(frozen=True)
class EnergyReading:
    """Energy between ``start()`` and ``stop()``: joules over all metered devices, seconds of
    wall-clock time, source ("rapl", "nvml" or "estimate"), mean watts, and which counters were
    read or why the estimate was used (detail)."""

    joules: float
    seconds: float
    source: str
    watts: float
    detail: str = ""


class EnergyMeter:
    """Measures the energy of this process's devices over an interval.

    ``config`` picks the source (a forced one that is not available raises ConfigError at
    ``start()``); ``devices``: the devices (replicas) this process drives, for NVML the node's
    GPUs ``local_rank * devices`` on; RAPL books 1/``local_size`` of the packages to each
    process of the node; ``powercap_root``: where the RAPL zones live; ``clock`` in seconds.
    """

    def __init__(
        self,
        config: Optional[ScalingConfig] = None,
        devices: int = 1,
        *,
        local_rank: int = 0,
        local_size: int = 1,
        powercap_root: str = POWERCAP_ROOT,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config or ScalingConfig()
        if devices < 1 or not 0 <= local_rank < local_size:
            raise ConfigError(
                f"EnergyMeter: need devices >= 1 and 0 <= local_rank < local_size, got {devices}, "
                f"{local_rank}, {local_size}"
            )
        self.num_devices = devices
        self.local_size = local_size
        self.gpu_indices = list(range(local_rank * devices, (local_rank + 1) * devices))
        self.powercap_root = Path(powercap_root)
        self._clock = clock
        self._counter = None
        self._start_time: Optional[float] = None
        self._estimate_since = 0.0
        self._joules = 0.0
        self.source, self.detail = "estimate", ""

    def start(self) -> None:
        """Picks the source and reads the first counter values."""
        c, self._counter, self.source = self.config, None, "estimate"
        self.detail = f"{c.device_power_watts:g} W x {self.num_devices} {c.device_kind}"
        self.detail += " (scaling.device_power_watts)"
        nvml = c.energy_source == "nvml" or (c.energy_source == "auto" and c.device_kind == "gpu")
        try:
            if c.energy_source != "estimate":
                self._counter = (
                    _NvmlCounter(self.gpu_indices)
                    if nvml
                    else _RaplCounter(self.powercap_root, self.local_size)
                )
                self.source, self.detail = self._counter.source, self._counter.detail
        except _Unavailable as why:
            if c.energy_source != "auto":
                raise ConfigError(
                    f"scaling.energy_source is '{c.energy_source}' but {why}; "
                    "use 'auto' or 'estimate'"
                ) from None
            self.detail += f"; {why}"
        self._joules = 0.0
        self._start_time = self._estimate_since = self._clock()

    def sample(self) -> float:
        """Joules since ``start()``, measured (counters read now) or estimated so far."""
        if self._start_time is None:
            raise RuntimeError("EnergyMeter.sample() before start()")
        if self._counter is not None:
            try:
                now = self._clock()
                self._joules += self._counter.read()
                self._estimate_since = now
                return self._joules
            except Exception as err:  # a counter failing mid-run must not stop training
                # Keep the joules measured up to the last good read; estimate from there on.
                with contextlib.suppress(Exception):
                    self._counter.close()
                self.detail += f"; {self.source} counter failed mid-run ({err}); "
                self.detail += "estimated from the last good read on"
                self._counter, self.source = None, "estimate"
        watts = self.config.device_power_watts * self.num_devices
        return self._joules + watts * (self._clock() - self._estimate_since)

    def stop(self) -> EnergyReading:
        """Reads the counters a last time and returns the energy since ``start()``."""
        joules = self.sample()
        seconds = self._clock() - self._start_time
        self._start_time = None
        if self._counter is not None:
            self._counter.close()
            self._counter = None
        watts = joules / seconds if seconds > 0 else 0.0
        return EnergyReading(joules, seconds, self.source, watts, self.detail)


class _Unavailable(Exception):
    """The source cannot be used on this machine; the message says why."""


class _RaplCounter:
    """The node's RAPL package counters; ``read()`` gives this process's joules since the last."""

    source = "rapl"

    def __init__(self, root: Path, local_size: int = 1):
        self.share = 1.0 / local_size
        if not root.is_dir():
            raise _Unavailable(f"{root} does not exist (no powercap/RAPL in this kernel or VM)")
        self.zones = sorted(p for p in root.iterdir() if _PACKAGE_ZONE.match(p.name))
        if not self.zones:
            raise _Unavailable(f"{root} has no intel-rapl:<n> package zones")
        try:
            self.last = [int((z / "energy_uj").read_text()) for z in self.zones]
            self.max_range = [int((z / "max_energy_range_uj").read_text()) for z in self.zones]
        except (OSError, ValueError) as err:
            raise _Unavailable(f"a RAPL energy_uj in {root} is not readable ({err})") from None
        names = [
            (z / "name").read_text().strip() if (z / "name").is_file() else z.name
            for z in self.zones
        ]
        share = f", 1/{local_size} share per process" if local_size > 1 else ""
        zones = ", ".join(z.name for z in self.zones)
        self.detail = f"RAPL {', '.join(names)} ({zones}{share})"

    def read(self) -> float:
        total_uj = 0
        for i, zone in enumerate(self.zones):
            now = int((zone / "energy_uj").read_text())
            total_uj += now - self.last[i] + (self.max_range[i] if now < self.last[i] else 0)
            self.last[i] = now
        return total_uj * 1e-6 * self.share

    def close(self) -> None:
        pass


class _NvmlCounter:
    """Total energy of some of the node's GPUs through NVML."""

    source = "nvml"

    def __init__(self, gpu_indices: list[int]):
        try:
            import pynvml  # optional: only GPU machines have it
        except ImportError:
            raise _Unavailable("pynvml is not installed (pip install nvidia-ml-py)") from None
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise _Unavailable(f"NVML cannot start ({err}): no NVIDIA driver or GPU") from None
        try:
            count = pynvml.nvmlDeviceGetCount()
            if max(gpu_indices) >= count:
                raise _Unavailable(f"GPU indices {gpu_indices} requested but NVML sees {count}")
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in gpu_indices]
            self.last = [pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles]
            names = [pynvml.nvmlDeviceGetName(h) for h in self.handles]
        except pynvml.NVMLError as err:
            pynvml.nvmlShutdown()
            raise _Unavailable(f"NVML total energy is not supported here ({err})") from None
        except _Unavailable:
            pynvml.nvmlShutdown()
            raise
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        self.detail = f"NVML total energy of {len(names)} GPU(s): {', '.join(names)}"

    def read(self) -> float:
        now = [self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles]
        total_mj, self.last = sum(now) - sum(self.last), now
        return total_mj * 1e-3

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def probe_energy_sources(powercap_root: str = POWERCAP_ROOT) -> dict[str, str]:
    """What this machine exposes: ``{"rapl": ..., "nvml": ...}``, "available: ..." or why not."""
    result = {}
    for name, open_counter in (
        ("rapl", lambda: _RaplCounter(Path(powercap_root))),
        ("nvml", lambda: _NvmlCounter([0])),
    ):
        try:
            counter = open_counter()
            result[name] = f"available: {counter.detail}"
            counter.close()
        except _Unavailable as why:
            result[name] = f"unavailable: {why}"
    return result
