"""Where a compiled step's op time goes: TensorFlow profiler events grouped into categories.

``hvdtrack bench model --breakdown`` prints ``breakdown(profile_ops(step), optimizer_scope)``.

Public symbols: ``CATEGORIES``, ``profile_ops``, ``op_category``, ``breakdown``.
"""

from __future__ import annotations

import tempfile
from typing import Callable

from hvdtrack.errors import HvdtrackError

CATEGORIES = ("matmul", "gather", "segment sum", "layer norm", "optimizer", "other")


def profile_ops(fn: Callable[[], object]) -> list[tuple[str, float]]:
    """(op name ``scope/name:Type``, seconds) of every op one call of ``fn`` ran (TF profiler).

    Raises:
      HvdtrackError: when the profiler's trace format cannot be read (not a public API).
    """
    import glob

    import tensorflow as tf

    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        raise HvdtrackError(
            "this TensorFlow has no readable profiler trace; drop --breakdown"
        ) from None
    fn()
    space = xplane_pb2.XSpace()
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            fn()
        finally:
            tf.profiler.experimental.stop()
        for path in glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True):
            with open(path, "rb") as f:
                space.ParseFromString(f.read())
    ops = []
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and "::" not in name:  # executor bookkeeping has no op type
                    ops.append((name, event.duration_ps * 1e-12))
    return ops


def op_category(name: str, optimizer_scope: str) -> str:
    """The class of op ``scope/name:Type`` in the breakdown (one of ``CATEGORIES``).

    >>> op_category("gradient_tape/segment_classifier/edge_update/MatMul_1:MatMul", "adam")
    'matmul'
    """
    scope, _, op_type = name.rpartition(":")
    if "MatMul" in op_type:
        return "matmul"
    if scope.startswith(optimizer_scope + "/") or f"/{optimizer_scope}/" in scope:
        return "optimizer"
    if "layer_norm" in scope:
        return "layer norm"
    if "Gather" in op_type:
        return "gather"
    if "SegmentSum" in op_type:
        return "segment sum"
    return "other"


def breakdown(ops: list[tuple[str, float]], optimizer_scope: str) -> dict[str, float]:
    """Seconds per op class (``CATEGORIES``) of a profiled step."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    for name, duration in ops:
        seconds[op_category(name, optimizer_scope)] += duration
    return seconds


# ----------------------------------------------------------------------------- memory
