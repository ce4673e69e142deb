"""Energy of a training run: RAPL (CPU packages), NVML (NVIDIA GPUs), or a labelled estimate.

Sources (``scaling.energy_source``; ``auto`` picks NVML for ``device_kind == "gpu"``, RAPL
otherwise, and the estimate when that one is not available):

- ``nvml``: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load, Volta and newer)
  summed over this process's GPUs; needs the ``pynvml`` module (``nvidia-ml-py``) and a GPU.
- ``rapl``: the package zones ``/sys/class/powercap/intel-rapl:<n>/energy_uj`` (AMD CPUs use the
  same interface). Counters wrap at ``max_energy_range_uj``, which ``sample()`` handles when
  called more often than one wrap period (minutes to hours). A package counter measures the
  whole socket (all its cores, idle ones and other processes included); each of the node's
  ``local_size`` processes books an equal share. Recent kernels make ``energy_uj`` root-only;
  unreadable counters fall back to the estimate.
- ``estimate``: ``scaling.device_power_watts * devices * seconds``, labelled ``"estimate"``.

Usage in a trainer: on every process ``EnergyMeter(cfg.scaling, devices=local_replicas,
local_rank=..., local_size=...)``, ``start()`` before the first epoch, ``sample()`` at each epoch
end, ``stop()`` at the end; the sum of the readings' joules over processes is the run's energy
and that sum divided by the run's seconds its mean power.

Public symbols: ``EnergyMeter``, ``EnergyReading``, ``probe_energy_sources``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from pathlib import Path
from typing import Any, Callable, Optional

from hvdtrack.errors import ConfigError
from hvdtrack.scaling.config import ScalingConfig

POWERCAP_ROOT = "/sys/class/powercap"
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")


@dataclasses.dataclass(frozen=True)
class EnergyReading:
    """Energy used between ``start()`` and ``stop()``.

    Attributes:
      joules: energy over all metered devices.
      seconds: wall-clock time metered.
      source: "rapl", "nvml" or "estimate".
      watts: mean power, joules / seconds.
      detail: which counters were read, or why the estimate was used.
    """

    joules: float
    seconds: float
    source: str
    watts: float
    detail: str = ""


class EnergyMeter:
    """Measures the energy of this process's devices over an interval.

    Every process of a run meters its own share, so that the sum over processes (e.g. a host
    allreduce of ``EnergyReading.joules``) is the run's energy:

    - estimate: ``device_power_watts * devices * seconds``;
    - NVML: the GPUs ``local_rank * devices ... + devices - 1`` of the node (Horovod: one GPU per
      process, the one at the local rank; MirroredStrategy: all local GPUs);
    - RAPL: the node's CPU packages divided by ``local_size``, the processes on the node, because
      every one of them sees the same package counters.

    Args:
      config: a ``ScalingConfig``: its device_kind ("gpu" selects NVML, anything else RAPL),
        device_power_watts (for the estimate) and energy_source ("auto", "rapl", "nvml" or
        "estimate"; a forced measured source that is not available raises ConfigError at
        ``start()``).
      devices: devices (replicas) this process drives.
      local_rank, local_size: this process's index and the process count on its node.
      powercap_root: where the RAPL zones live (a test can point it at a made-up tree).
      clock: monotonic clock in seconds.
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
        config = config or ScalingConfig()
        if devices < 1:
            raise ConfigError(f"EnergyMeter: devices must be >= 1, got {devices}")
        if not 0 <= local_rank < local_size:
            raise ConfigError(
                f"EnergyMeter: need 0 <= local_rank < local_size, got {local_rank}, {local_size}"
            )
        self.device_kind = config.device_kind
        self.num_devices = devices
        self.watts_per_device = config.device_power_watts
        self.requested = config.energy_source
        self.local_size = local_size
        self.gpu_indices = list(range(local_rank * devices, (local_rank + 1) * devices))
        self.powercap_root = Path(powercap_root)
        self._clock = clock
        self._counter: Optional[_Counter] = None
        self._start_time: Optional[float] = None
        self._estimate_since = 0.0
        self._joules = 0.0
        self.source = "estimate"
        self.detail = ""

    def start(self) -> None:
        """Picks the source and reads the first counter values."""
        self._counter, self.source, self.detail = self._open()
        self._joules = 0.0
        self._start_time = self._estimate_since = self._clock()
        if self._counter is not None:
            self._counter.read()

    def sample(self) -> float:
        """Accumulates the counters since the last read (call it often enough to catch wraps).

        Returns:
          Joules since ``start()`` (measured sources), or the estimate so far.
        """
        if self._start_time is None:
            raise RuntimeError("EnergyMeter.sample() before start()")
        if self._counter is not None:
            try:
                now = self._clock()
                self._joules += self._counter.read()
                self._estimate_since = now
                return self._joules
            except Exception as err:  # a counter failing mid-run must not stop training
                self._fall_back(f"{self.source} counter failed mid-run ({err})")
        seconds = self._clock() - self._estimate_since
        return self._joules + self.watts_per_device * self.num_devices * seconds

    def stop(self) -> EnergyReading:
        """Reads the counters a last time and returns the energy since ``start()``."""
        joules = self.sample()
        seconds = self._clock() - self._start_time
        self._start_time = None
        if self._counter is not None:
            self._counter.close()
            self._counter = None
        watts = joules / seconds if seconds > 0 else 0.0
        return EnergyReading(
            joules=joules, seconds=seconds, source=self.source, watts=watts, detail=self.detail
        )

    # ---------------------------------------------------------------------------- internals
    def _open(self) -> tuple[Optional[_Counter], str, str]:
        estimate = (
            f"{self.watts_per_device:g} W x {self.num_devices} {self.device_kind}"
            " (scaling.device_power_watts)"
        )
        if self.requested == "estimate":
            return None, "estimate", estimate
        want_nvml = self.requested == "nvml" or (
            self.requested == "auto" and self.device_kind == "gpu"
        )
        opener = _NvmlCounter if want_nvml else _RaplCounter
        try:
            counter = opener(self) if want_nvml else opener(self.powercap_root, self.local_size)
        except _Unavailable as why:
            if self.requested != "auto":
                raise ConfigError(
                    f"scaling.energy_source is '{self.requested}' but {why}; "
                    "use 'auto' or 'estimate'"
                ) from None
            return None, "estimate", f"{estimate}; {why}"
        return counter, counter.source, counter.describe()

    def _fall_back(self, why: str) -> None:
        # Keep the joules measured up to the last good read; estimate from that read on.
        if self._counter is not None:
            with contextlib.suppress(Exception):
                self._counter.close()
        self._counter = None
        self.source = "estimate"
        self.detail = f"{self.detail}; {why}; estimated from the last good read on"


class _Unavailable(Exception):
    """The source cannot be used on this machine; the message says why."""


class _Counter:
    source = ""

    def read(self) -> float:
        """Joules since the previous read."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _RaplCounter(_Counter):
    source = "rapl"

    def __init__(self, root: Path, local_size: int = 1):
        self.share = 1.0 / local_size
        if not root.is_dir():
            raise _Unavailable(f"{root} does not exist (no powercap/RAPL in this kernel or VM)")
        zones = sorted(p for p in root.iterdir() if _PACKAGE_ZONE.match(p.name))
        if not zones:
            raise _Unavailable(f"{root} has no intel-rapl:<n> package zones")
        self.zones = zones
        self.max_range = []
        self.last = []
        for zone in zones:
            try:
                self.last.append(int((zone / "energy_uj").read_text()))
                self.max_range.append(int((zone / "max_energy_range_uj").read_text()))
            except (OSError, ValueError) as err:
                raise _Unavailable(f"{zone}/energy_uj is not readable ({err})") from None

    def read(self) -> float:
        total_uj = 0
        for i, zone in enumerate(self.zones):
            now = int((zone / "energy_uj").read_text())
            delta = now - self.last[i]
            if delta < 0:  # the counter wrapped past max_energy_range_uj
                delta += self.max_range[i]
            total_uj += delta
            self.last[i] = now
        return total_uj * 1e-6 * self.share

    def describe(self) -> str:
        names = []
        for zone in self.zones:
            try:
                names.append((zone / "name").read_text().strip())
            except OSError:
                names.append(zone.name)
        share = f", 1/{round(1 / self.share)} share per process" if self.share < 1 else ""
        return f"RAPL {', '.join(names)} ({', '.join(z.name for z in self.zones)}{share})"


class _NvmlCounter(_Counter):
    source = "nvml"

    def __init__(self, meter: EnergyMeter):
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
            if count == 0:
                raise _Unavailable("NVML sees no GPUs")
            missing = [i for i in meter.gpu_indices if i >= count]
            if missing:
                raise _Unavailable(f"GPU indices {missing} requested but NVML sees {count} GPUs")
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in meter.gpu_indices]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self.handles]
            self.last = [pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles]
        except pynvml.NVMLError as err:
            pynvml.nvmlShutdown()
            raise _Unavailable(f"NVML total energy is not supported here ({err})") from None
        except _Unavailable:
            pynvml.nvmlShutdown()
            raise

    def read(self) -> float:
        total_mj = 0
        for i, handle in enumerate(self.handles):
            now = self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            total_mj += now - self.last[i]
            self.last[i] = now
        return total_mj * 1e-3

    def describe(self) -> str:
        return f"NVML total energy of {len(self.handles)} GPU(s): {', '.join(self.names)}"

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def probe_energy_sources(powercap_root: str = POWERCAP_ROOT) -> dict[str, str]:
    """What this machine exposes: ``{"rapl": ..., "nvml": ...}``, "available: ..." or why not."""
    result = {}
    try:
        result["rapl"] = f"available: {_RaplCounter(Path(powercap_root)).describe()}"
    except _Unavailable as why:
        result["rapl"] = f"unavailable: {why}"
    meter = EnergyMeter(ScalingConfig(device_kind="gpu", energy_source="nvml"))
    try:
        counter = _NvmlCounter(meter)
        result["nvml"] = f"available: {counter.describe()}"
        counter.close()
    except _Unavailable as why:
        result["nvml"] = f"unavailable: {why}"
    return result


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
