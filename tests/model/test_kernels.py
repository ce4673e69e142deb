"""The C++ kernel library (``hvdtrack.model.kernels``): one build of every source, readable by
every user, cached; without it (no compiler, ``plain_ops``) the TensorFlow-ops versions run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hvdtrack.model import kernels
from hvdtrack.model.kernels import SOURCES, build_kernel, fused_kernels, plain_ops

# Ends a hung subprocess; not a speed goal (10-20 s on a loaded 2-core machine).
HANG_S = 300


def test_the_library_builds_and_loads_on_this_cpu_with_every_op():
    # install.sh installs g++; a machine without one runs the ops versions (last test)
    library = fused_kernels()
    assert library is not None
    for op in ("hvdtrack_layer_norm", "hvdtrack_layer_norm_grad", "hvdtrack_segment_sum"):
        assert callable(getattr(library, op)), op


def test_under_plain_ops_there_is_no_library():
    with plain_ops():
        assert fused_kernels() is None
    assert fused_kernels() is not None


def test_a_build_is_readable_by_every_user(tmp_path, monkeypatch):
    # An image builds it as root and runs as another user. One source (the smallest, one op)
    # keeps the build short: the whole library is built and loaded by the first test.
    rows = [s for s in SOURCES if s.name == "rows.cc"]
    monkeypatch.setattr(kernels, "SOURCES", tuple(rows))
    path = build_kernel(tmp_path)
    assert path.parent == tmp_path and path.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    built = path.stat().st_mtime_ns
    assert build_kernel(tmp_path) == path and path.stat().st_mtime_ns == built  # cached
    # a shared object registering the op (loading it here would register it twice)
    assert path.read_bytes()[:4] == b"\x7fELF" and b"HvdtrackWriteRows" in path.read_bytes()


def test_a_failed_build_names_the_command_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")
    assert [s.name for s in SOURCES] == [
        "layer_norm.cc",
        "segment_sum.cc",
        "gather_sum.cc",
        "rows.cc",
        "weight_gradient.cc",
        "head.cc",
    ]
    with pytest.raises(
        OSError, match="false .*layer_norm.cc .*segment_sum.cc .*gather_sum.cc .* failed"
    ):
        build_kernel(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_without_a_compiler_the_ops_versions_run_and_say_why(tmp_path):
    program = (
        "import tensorflow as tf\n"
        "from hvdtrack.model.segments import segment_sum\n"
        "from hvdtrack.model.kernels import fused_kernels\n"
        "from hvdtrack.model.norm import LayerNorm\n"
        "assert fused_kernels() is None\n"
        "print(LayerNorm()(tf.constant([[1.0, 3.0]])).numpy().tolist())\n"
        "print(segment_sum(tf.constant([[1.0], [2.0]]), tf.constant([1, 1]), 2).numpy().tolist())\n"
    )
    env = dict(os.environ, CXX=str(tmp_path / "no-compiler"), HVDTRACK_OPS_CACHE=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=HANG_S
    )
    assert done.returncode == 0, done.stderr
    assert "[[-0.99999" in done.stdout and "[[0.0], [3.0]]" in done.stdout
    assert (
        "hvdtrack kernel library (layer_norm.cc, segment_sum.cc, gather_sum.cc, rows.cc, "
        "weight_gradient.cc, head.cc) unavailable, using TensorFlow ops" in done.stderr
    )
    assert "no-compiler" in done.stderr
