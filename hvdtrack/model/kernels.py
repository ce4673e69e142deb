"""The model's C++ CPU kernel library: built, cached and loaded, with the switch to TensorFlow ops.

One library holds the fused kernels (``SOURCES``): ``layer_norm.cc`` (``HvdtrackLayerNorm``,
``HvdtrackLayerNormGrad``, used by ``norm.LayerNorm``; ``HvdtrackLinearNorm``, used by
``mlp.linear_norm``; ``HvdtrackReluMask``, ``HvdtrackMaskedColumn``, used by ``head.lean_head``,
the first only where ``HvdtrackHead`` does not run), ``segment_sum.cc`` (``HvdtrackSegmentSum``,
``HvdtrackSegmentAdd``, ``HvdtrackGatherSumGrad``, used by ``segments.segment_sum``,
``segment_add`` and ``gather_sum``'s gradient), ``gather_sum.cc`` (``HvdtrackGatherSum``, used
by ``segments.gather_sum``), ``rows.cc`` (``HvdtrackWriteRows``, used by ``chunks.write_rows``),
``weight_gradient.cc`` (``HvdtrackWeightGradient``, used by ``mlp.weight_gradient``) and
``head.cc`` (``HvdtrackHead``, used by ``head.lean_head``); the last two, and
``HvdtrackLinearNorm``'s product, run AVX-512 or AVX2 code chosen at run time, at most
``$HVDTRACK_KERNEL_ISA``'s (``vector_code``). Each gives the same result at any number of
intra-op threads. It is compiled on first use against the installed TensorFlow's headers and
cached (``run_scripts/install.sh`` builds it ahead with ``build_kernel()``).
``fused_kernels()`` is None, and its users run the same maths in TensorFlow ops, on GPUs (the
kernels are CPU-only), without a C++ compiler (the reason is logged once), with
``HVDTRACK_FUSED_OPS=0``, and in functions traced under ``plain_ops()`` (an export that
runtimes without the library load).

Cache: ``$HVDTRACK_OPS_CACHE``, else ``$XDG_CACHE_HOME/hvdtrack/ops`` (``~/.cache``), one file
per set of sources, TensorFlow version and compile flags, written beside and renamed into place.

Public symbols: ``SOURCES``, ``HEADER``, ``CXXFLAGS``, ``BUILD_TIMEOUT_S``, ``ops_cache_dir``,
``build_kernel``, ``plain_ops``, ``fused_kernels``, ``vector_code``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import tensorflow as tf

log = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "layer_norm.cc",
        "segment_sum.cc",
        "gather_sum.cc",
        "rows.cc",
        "weight_gradient.cc",
        "head.cc",
    )
)
HEADER = Path(__file__).with_name("kernels.h")  # what the sources share; part of the cache key
BUILD_TIMEOUT_S = 300
# Baseline x86-64 code (no -march=native): a cache in a home directory shared by nodes of
# different CPUs must load on every one of them; the kernels are memory-bound anyway.
CXXFLAGS = ("-O3", "-fopenmp-simd", "-shared", "-fPIC")


def ops_cache_dir() -> Path:
    """Where built kernel libraries are kept (see the module docstring)."""
    if os.environ.get("HVDTRACK_OPS_CACHE"):
        return Path(os.environ["HVDTRACK_OPS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hvdtrack" / "ops"


def build_kernel(cache_dir: Optional[Path] = None) -> Path:
    """The path of the built kernel library (all ``SOURCES`` in one shared object), compiling
    it first if it is not in the cache.

    Raises:
      OSError: no compiler, a failed or timed-out compilation (its output in the message), or
        an unwritable cache directory.
    """
    flags = [*CXXFLAGS, *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    key = hashlib.sha256()
    for source in (*SOURCES, HEADER):
        key.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    key.update(tf.__version__.encode() + " ".join(flags).encode())
    path = (cache_dir or ops_cache_dir()) / f"hvdtrack_kernels-{key.hexdigest()[:16]}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".partial")
    os.close(fd)
    names = ", ".join(source.name for source in SOURCES)
    try:
        command = [os.environ.get("CXX", "g++"), *map(str, SOURCES), "-o", partial, *flags]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise OSError(f"compiling {names} took over {BUILD_TIMEOUT_S} s") from None
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        os.chmod(partial, 0o755)  # mkstemp's 0600 would hide it from other users (images)
        os.replace(partial, path)  # concurrent builders (ranks) each rename a whole file
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


_PLAIN_OPS = contextvars.ContextVar("hvdtrack_plain_ops", default=False)


@contextlib.contextmanager
def plain_ops() -> Iterator[None]:
    """Functions traced in the block use TensorFlow ops only, never the kernel library
    (``fused_kernels()`` is None there): what a SavedModel needs to load where the library is
    not (plain TensorFlow, converters)."""
    token = _PLAIN_OPS.set(True)
    try:
        yield
    finally:
        _PLAIN_OPS.reset(token)


def fused_kernels() -> Optional[Any]:
    """The loaded kernel library (its ops as ``hvdtrack_layer_norm``, ``hvdtrack_segment_sum``,
    ...), or None where the TensorFlow-ops versions must run (module docstring)."""
    if _PLAIN_OPS.get():
        return None
    return _load_library()


def vector_code() -> bool:
    """Whether the loaded kernel library has vector code for this CPU (AVX-512 or AVX2, at
    most ``$HVDTRACK_KERNEL_ISA``'s: ``HvdtrackKernelIsa``). Without it (no library, not
    x86-64, no AVX2) ``HvdtrackWeightGradient`` would take Eigen's product on one thread, and
    ``HvdtrackHead`` and ``HvdtrackLinearNorm`` scalar code: their callers take TensorFlow's ops
    instead."""
    kernels = fused_kernels()
    return kernels is not None and _isa(kernels) != "none"


@functools.cache
def _isa(kernels) -> str:
    with tf.init_scope():  # eager, also when first asked while a function is traced
        return kernels.hvdtrack_kernel_isa().numpy().decode()


@functools.cache
def _load_library() -> Optional[Any]:
    if os.environ.get("HVDTRACK_FUSED_OPS", "1") == "0":
        return None
    if tf.config.list_physical_devices("GPU"):
        return None  # a CPU-only kernel would pull GPU tensors to the host
    try:
        return tf.load_op_library(str(build_kernel()))
    except (OSError, tf.errors.NotFoundError) as err:
        names = ", ".join(source.name for source in SOURCES)
        log.warning(
            "hvdtrack kernel library (%s) unavailable, using TensorFlow ops: %s", names, err
        )
        return None
