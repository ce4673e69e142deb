"""Where a compiled step's op time and memory go, from TensorFlow profiler events.

``hvdtrack bench model --breakdown`` prints ``breakdown(profile_ops(step), optimizer_scope)``
and the op types that took the most time (``by_type``);
``bench model --memory --breakdown`` prints ``live_at_peak(step)``: the tensors the allocator
held at its peak, grouped by shape (``shape_groups``).

Public symbols: ``CATEGORIES``, ``profile_ops``, ``op_category``, ``breakdown``, ``by_type``,
``live_at_peak``, ``shape_groups``.
"""

from __future__ import annotations

import tempfile
from typing import Callable

from hvdtrack.errors import HvdtrackError

CATEGORIES = ("matmul", "gather", "segment sum", "layer norm", "optimizer", "other")


def _trace(fn: Callable[[], object]):
    """The profiler's trace (an ``XSpace``) of one call of ``fn``, after an untraced one.

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
    return space


def profile_ops(fn: Callable[[], object]) -> list[tuple[str, float]]:
    """(op name ``scope/name:Type``, seconds) of every op one call of ``fn`` ran (TF profiler).

    Raises:
      HvdtrackError: when the profiler's trace format cannot be read (not a public API).
    """
    ops = []
    for plane in _trace(fn).planes:
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
    # the kernels' x^T @ d, the head's products with their bias, ReLU, bits and logit (as a
    # _FusedMatMul's bias and ReLU), and the edge and node updates' last products with their
    # layer norms: the norm's time (about a quarter of the kernel's here) goes with the
    # product's into matmul
    kernels = ("HvdtrackWeightGradient", "HvdtrackHead", "HvdtrackLinearNorm")
    if "MatMul" in op_type or op_type in kernels:
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


def by_type(ops: list[tuple[str, float]]) -> list[tuple[str, float, int]]:
    """(op type, seconds, calls) of a profiled step, by op type, most time first (ties by
    type).

    >>> by_type([("a:MatMul", 1.0), ("b:Add", 0.5), ("c:MatMul", 0.25)])
    [('MatMul', 1.25, 2), ('Add', 0.5, 1)]
    """
    totals: dict[str, list] = {}
    for name, duration in ops:
        total = totals.setdefault(name.rpartition(":")[2], [0.0, 0])
        total[0] += duration
        total[1] += 1
    return sorted(((t, s, n) for t, (s, n) in totals.items()), key=lambda x: (-x[1], x[0]))


# ----------------------------------------------------------------------------- memory


def live_at_peak(fn: Callable[[], object]) -> dict:
    """The tensors TensorFlow's allocator held when one call of ``fn`` peaked (TF profiler's
    allocation events, replayed in time order; the tensors that lived before the call, such as
    the inputs and variables, are not in it).

    Returns:
      ``{"allocated": bytes, "requested": bytes, "tensors": [[op, shape, requested, allocated],
      ...]}``, largest first. ``allocated`` above ``requested`` is what the allocator gave more
      than asked (a free block it did not split).
    """
    events = []
    for plane in _trace(fn).planes:
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                kind = plane.event_metadata[event.metadata_id].name
                if kind not in ("MemoryAllocation", "MemoryDeallocation"):
                    continue
                stats = {}
                for stat in event.stats:
                    value = stat.str_value or stat.int64_value or stat.uint64_value
                    if stat.ref_value:
                        value = stat_names.get(stat.ref_value, "")
                    stats[stat_names.get(stat.metadata_id)] = value
                time_ps = line.timestamp_ns * 1000 + event.offset_ps
                events.append((time_ps, kind == "MemoryAllocation", stats))
    events.sort(key=lambda e: e[0])
    live, total, peak, at_peak = {}, 0, 0, {}
    for _, allocation, stats in events:
        if allocation:
            size = int(stats.get("allocation_bytes") or 0)
            live[stats.get("addr")] = (
                str(stats.get("tf_op") or "?"),
                str(stats.get("shape") or "?"),
                int(stats.get("requested_bytes") or 0),
                size,
            )
            total += size
            if total > peak:
                peak, at_peak = total, dict(live)
        else:
            freed = live.pop(stats.get("addr"), None)
            total -= freed[3] if freed else 0
    tensors = sorted(at_peak.values(), key=lambda t: -t[3])
    return dict(
        allocated=sum(t[3] for t in tensors),
        requested=sum(t[2] for t in tensors),
        tensors=[list(t) for t in tensors],
    )


def shape_groups(tensors: list, top: int = 8) -> list[tuple[str, int, int, int]]:
    """``live_at_peak``'s tensors grouped by shape: (shape, count, requested, allocated bytes),
    the ``top`` largest groups by allocated bytes.

    >>> shape_groups([["a", "[8,64]", 2048, 2048], ["b", "[8,64]", 2048, 4096], ["c", "[8]", 32, 32]])
    [('[8,64]', 2, 4096, 6144), ('[8]', 1, 32, 32)]
    """
    groups: dict[str, list[int]] = {}
    for _, shape, requested, allocated in tensors:
        group = groups.setdefault(shape, [0, 0, 0])
        group[0] += 1
        group[1] += requested
        group[2] += allocated
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][2])[:top]
    return [(shape, *numbers) for shape, numbers in ranked]
