"""Layer normalisation of the model's latents: ``snt.LayerNorm``'s function and variables, with
a fused CPU kernel.

On CPU the normalisation runs as two fused kernels (``layer_norm.cc``: one pass over [rows,
width] forward, one backward), compiled on first use against the installed TensorFlow's
headers and cached (``run_scripts/install.sh`` builds it ahead with ``build_kernel()``). With
them the training step on 10k nodes / 80k edges takes 2.0 s instead of 2.6 s (1 thread,
docs/performance.md). The same maths in TensorFlow ops (``_layer_norm_ops``) runs where the
kernel cannot: on GPUs (it has no GPU kernel), without a C++ compiler (the reason is logged
once), with ``HVDTRACK_FUSED_OPS=0``, and in functions traced under ``plain_ops()`` (an export
that runtimes without the kernel load). Both give the same values to float32 rounding
(tests/model/test_layer_norm.py).

Cache: ``$HVDTRACK_OPS_CACHE``, else ``$XDG_CACHE_HOME/hvdtrack/ops`` (``~/.cache``), one file
per source, TensorFlow version and compile flags, written beside and renamed into place.
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

import sonnet as snt
import tensorflow as tf

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("layer_norm.cc")
BUILD_TIMEOUT_S = 300
# Baseline x86-64 code (no -march=native): a cache in a home directory shared by nodes of
# different CPUs must load on every one of them; the kernels are memory-bound anyway.
CXXFLAGS = ("-O3", "-fopenmp-simd", "-shared", "-fPIC")


def ops_cache_dir() -> Path:
    """Where built kernels are kept (see the module docstring)."""
    if os.environ.get("HVDTRACK_OPS_CACHE"):
        return Path(os.environ["HVDTRACK_OPS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hvdtrack" / "ops"


def build_kernel(cache_dir: Optional[Path] = None) -> Path:
    """The path of the built kernel library, compiling it first if it is not in the cache.

    Raises:
      OSError: no compiler, a failed or timed-out compilation (its output in the message), or
        an unwritable cache directory.
    """
    flags = [*CXXFLAGS, *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    key = hashlib.sha256(SOURCE.read_bytes() + tf.__version__.encode() + " ".join(flags).encode())
    path = (cache_dir or ops_cache_dir()) / f"layer_norm-{key.hexdigest()[:16]}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".partial")
    os.close(fd)
    try:
        command = [os.environ.get("CXX", "g++"), str(SOURCE), "-o", partial, *flags]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise OSError(f"compiling {SOURCE.name} took over {BUILD_TIMEOUT_S} s") from None
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
    """Layer norms traced in the block use TensorFlow ops only, never the fused kernel: what a
    SavedModel needs to load where the kernel library is not (plain TensorFlow, converters)."""
    token = _PLAIN_OPS.set(True)
    try:
        yield
    finally:
        _PLAIN_OPS.reset(token)


@functools.cache
def fused_kernels() -> Optional[Any]:
    """The loaded kernel library, or None where the TensorFlow-ops version must run."""
    if os.environ.get("HVDTRACK_FUSED_OPS", "1") == "0":
        return None
    if tf.config.list_physical_devices("GPU"):
        return None  # a CPU-only kernel would pull GPU tensors to the host
    try:
        return tf.load_op_library(str(build_kernel()))
    except (OSError, tf.errors.NotFoundError) as err:
        log.warning("fused layer norm unavailable, using TensorFlow ops: %s", err)
        return None


class LayerNorm(snt.Module):
    """Layer normalisation over the last axis: ``snt.LayerNorm``'s function and variables
    (``layer_norm/scale``, ``layer_norm/offset``, eps 1e-5), fused on CPU (module docstring).
    """

    def __init__(self, eps: float = 1e-5, name: str = "layer_norm"):
        super().__init__(name=name)
        self.eps = eps

    @snt.once
    def _create(self, width: int) -> None:
        self.scale = tf.Variable(tf.ones([width]), name="scale")
        self.offset = tf.Variable(tf.zeros([width]), name="offset")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """float32 [rows, width] -> normalised per row, then scaled and offset per column."""
        self._create(x.shape[-1])
        # Read as tensors (their gradients come from ``grad``), and in float32: statistics of
        # a 64-wide row in bfloat16 or float16 would lose most of their digits.
        scale, offset = (tf.cast(v, tf.float32) for v in (self.scale, self.offset))
        kernels = fused_kernels() if x.shape.rank == 2 and not _PLAIN_OPS.get() else None
        norm = functools.partial(_layer_norm_fused, kernels) if kernels else _layer_norm_ops
        if x.dtype == tf.float32:
            return norm(x, scale, offset, self.eps)
        return tf.cast(norm(tf.cast(x, tf.float32), scale, offset, self.eps), x.dtype)


def _layer_norm_fused(kernels, x, scale, offset, eps: float) -> tf.Tensor:
    @tf.custom_gradient
    def norm(x, scale, offset):
        y, mean, rstd = kernels.hvdtrack_layer_norm(x, scale, offset, epsilon=eps)

        def grad(upstream):
            with tf.name_scope("layer_norm_grad"):  # named for the step's op breakdown
                return kernels.hvdtrack_layer_norm_grad(upstream, x, scale, mean, rstd)

        return y, grad

    return norm(x, scale, offset)


def _layer_norm_ops(x: tf.Tensor, scale: tf.Tensor, offset: tf.Tensor, eps: float) -> tf.Tensor:
    """The same maths in TensorFlow ops, with a hand-written gradient that reuses the forward's
    normalised input instead of differentiating ``tf.nn.moments`` op by op."""

    @tf.custom_gradient
    def norm(x, scale, offset):
        centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        inverse_std = tf.math.rsqrt(
            tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True) + eps
        )
        normed = centred * inverse_std

        def grad(upstream):
            with tf.name_scope("layer_norm_grad"):  # named for the step's op breakdown
                g = upstream * scale
                mean_g = tf.reduce_mean(g, axis=-1, keepdims=True)
                mean_gx = tf.reduce_mean(g * normed, axis=-1, keepdims=True)
                dx = inverse_std * (g - mean_g - normed * mean_gx)
                d_scale = tf.reduce_sum(upstream * normed, axis=0)
                return dx, d_scale, tf.reduce_sum(upstream, axis=0)

        return normed * scale + offset, grad

    return norm(x, scale, offset)
