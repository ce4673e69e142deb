"""Which model.precision this machine can run, decided from its GPU and CPU flags."""

from __future__ import annotations

from hvdtrack.model.precision import cpu_flags, unsupported_reason

CPUINFO = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n"


def test_cpu_flags_are_read_from_the_first_cpu():
    assert cpu_flags(CPUINFO) == {"fpu", "sse", "avx2", "avx512f", "avx512_bf16"}
    assert cpu_flags("processor\t: 0\n") == set()


def test_float32_runs_anywhere_and_a_gpu_runs_everything():
    assert unsupported_reason("float32", False, set()) is None
    assert unsupported_reason("float16", True, set()) is None
    assert unsupported_reason("bfloat16", True, set()) is None


def test_bfloat16_needs_native_cpu_support():
    assert unsupported_reason("bfloat16", False, {"avx512_bf16"}) is None
    assert unsupported_reason("bfloat16", False, {"amx_bf16"}) is None
    reason = unsupported_reason("bfloat16", False, {"avx2", "avx512f"})
    assert reason.startswith("model.precision=bfloat16 needs a GPU or a CPU with native bfloat16")


def test_float16_needs_a_gpu():
    assert unsupported_reason("float16", False, {"avx512_fp16"}).startswith(
        "model.precision=float16 needs a GPU"
    )
