"""Peak memory of this process: resident set (CPU, Linux /proc) and TensorFlow's device allocator.

Per-interval peaks, e.g. one per epoch::

    reset_peak()                 # start of the interval
    ...                          # train
    peak_rss_bytes()             # highest resident set since the reset (bytes; None off Linux)
    device_peak_bytes("GPU:0")   # highest bytes TensorFlow's allocator held on the GPU since the reset

``reset_peak`` lowers the kernel's high-water mark (VmHWM) to the current resident set by writing
"5" to /proc/self/clear_refs (Linux >= 4.0), and resets TensorFlow's per-device peaks of every
visible GPU when TensorFlow is already imported. Without that file (not Linux, or a container
that forbids the write) the peak is the highest since the process started, and ``reset_peak``
returns False.

``trim_heap`` hands the C heap's free pages back to the system (glibc's ``malloc_trim``), so that
memory a phase freed (the graph optimizer's, say) no longer counts in the resident set.

``usable_memory_bytes`` is what this process may use at most: the machine's physical memory or
its control group's limit (SLURM's ``--mem``, a container's ``--memory``), whichever is smaller.

Public symbols: ``rss_bytes``, ``peak_rss_bytes``, ``reset_peak``, ``device_peak_bytes``,
``trim_heap``, ``usable_memory_bytes``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path
from typing import Optional

_STATUS = Path("/proc/self/status")
_CGROUPS = Path("/proc/self/cgroup")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(
    field: str, text: Optional[str] = None, pid: Optional[int] = None
) -> Optional[int]:
    """A ``kB`` field of /proc/<pid or self>/status (or of ``text``, its contents) in bytes."""
    if text is None:
        try:
            text = (_STATUS if pid is None else Path(f"/proc/{pid}/status")).read_text()
        except OSError:
            return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            number, _, unit = value.strip().partition(" ")
            return int(number) * (1024 if unit.strip() == "kB" else 1)
    return None


def rss_bytes(pid: Optional[int] = None) -> Optional[int]:
    """The resident set of this process (or of process ``pid``) now (VmRSS), in bytes; None
    where /proc is missing or the process has ended."""
    return _status_bytes("VmRSS", pid=pid)


def peak_rss_bytes() -> Optional[int]:
    """The highest resident set since the last ``reset_peak`` (VmHWM), in bytes."""
    return _status_bytes("VmHWM")


def reset_peak() -> bool:
    """Starts a new peak interval (resident set and GPU allocators); True if the RSS peak reset."""
    if "tensorflow" in sys.modules:
        tf = sys.modules["tensorflow"]
        for index, _ in enumerate(tf.config.list_logical_devices("GPU")):
            tf.config.experimental.reset_memory_stats(f"GPU:{index}")
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def device_peak_bytes(device: str = "GPU:0") -> Optional[int]:
    """Peak bytes TensorFlow's allocator held on ``device`` since the last reset (None if the
    device does not exist or does not keep the figure)."""
    import tensorflow as tf

    try:
        return int(tf.config.experimental.get_memory_info(device)["peak"])
    except (ValueError, RuntimeError):
        return None


def trim_heap() -> bool:
    """Returns the C heap's free memory to the system (glibc ``malloc_trim(0)``: the free top of
    every arena and the free pages inside them). True if glibc gave any back; False where the C
    library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def usable_memory_bytes(cgroups: Path = _CGROUPS, root: Path = _CGROUP_ROOT) -> Optional[int]:
    """The most memory this process may use: physical memory, or the tightest memory limit of
    its control group and the groups above it (cgroup v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) when smaller. None where the system says neither."""
    import os

    try:
        physical: Optional[int] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = None
    limits = [x for x in [physical, *_cgroup_limits(cgroups, root)] if x]
    return min(limits, default=None)


def _cgroup_limits(cgroups: Path, root: Path) -> list[int]:
    """The memory limits of this process's control group and its ancestors (bytes; "max" and
    v1's unlimited value, a number above 2**60, left out)."""
    try:
        lines = cgroups.read_text().splitlines()
    except OSError:
        return []
    limits = []
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy, memory.max in each group
            where, name = root, "memory.max"
        elif "memory" in controllers.split(","):  # v1: the memory controller's hierarchy
            where, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        group = where / path.lstrip("/")
        for directory in [group, *group.parents]:
            try:
                value = (directory / name).read_text().strip()
            except OSError:
                value = ""
            if value.isdigit() and int(value) < 2**60:
                limits.append(int(value))
            if directory == where:
                break
    return limits
