"""Whether this machine computes in a ``model.precision``: bfloat16 and float16 need hardware.

Public symbols: ``unsupported_reason``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

# CPU flags (Linux /proc/cpuinfo) of native bfloat16 arithmetic: without them TensorFlow emulates
# bfloat16 in float32 at a loss.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: Optional[str] = None) -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (or in ``cpuinfo``, its text); empty if absent."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return set(value.split())
    return set()


def unsupported_reason(precision: str, has_gpu: bool, flags: set[str]) -> Optional[str]:
    """Why ``precision`` cannot run here (a sentence naming the key), or None if it can."""
    if precision == "float32" or has_gpu:
        return None
    if precision == "bfloat16":
        if flags & set(BF16_CPU_FLAGS):
            return None
        return (
            "model.precision=bfloat16 needs a GPU or a CPU with native bfloat16 "
            f"({' or '.join(BF16_CPU_FLAGS)}); this CPU has neither: use model.precision=float32"
        )
    return (
        f"model.precision={precision} needs a GPU (on CPUs float16 is emulated and slower than "
        "float32): use model.precision=bfloat16 on CPUs that support it, or float32"
    )
