"""Six of the kernel library's kernels against the TensorFlow ops they replace.

    python -m hvdtrack.bench kernels --rows 40000 --threads 1 --calls 150

Each case is a kernel of ``hvdtrack/model`` and the ops it replaced in the training step, on
random inputs of the default model's widths (the edges' rows; nodes: rows / 8). The other
kernels (most gradients' kernels, the layer norm's own) have no such case.

- ``linear_norm``: ``HvdtrackLinearNorm``, the edge update's last layer [rows, 128] @ [128, 64]
  with its bias and layer norm (with the ReLU), against TensorFlow's product and
  ``HvdtrackLayerNorm``;
- ``head``: ``HvdtrackHead``, relu(e @ w1 + b1) @ w2 + b2 with the ReLU's bits ([rows, 64],
  64 hidden units), against a ``_FusedMatMul``, ``HvdtrackReluMask`` and a product;
- ``weight_gradient``: ``HvdtrackWeightGradient``, x^T @ d ([rows, 128] and [rows, 64]),
  against TensorFlow's product as ``mlp.weight_gradient`` takes it without the kernel
  (``transpose(matmul(d, x, transpose_a=True))``, its faster form for this shape);
- ``gather_sum``: ``HvdtrackGatherSum``, the edge update's first layer's gathers, sum and ReLU
  ([rows, 128]), against two gathers, an ``AddN`` and a ``Relu``;
- ``segment_sum``: ``HvdtrackSegmentSum``, the node update's sum of the edge latents per
  receiver ([rows, 64]), against TensorFlow's ``UnsortedSegmentSum``;
- ``gather_sum_grad``: ``HvdtrackGatherSumGrad``, the gather-sum's gradient from its ReLU's bits
  ([rows, 128]): the masked upstream and its sums per receiver and per sender, against a
  ``ReluGrad`` and two ``UnsortedSegmentSum``s.

The two sides are called in turn, one call each, ``--calls`` times (after a warm-up; which
side goes first alternates), so that their ratio, taken call pair by call pair, holds while
this machine's speed drifts; the figures are the minimum and median of each side's calls and
the median of the ratios (with its quartiles). A call's time is its compiled function's, its
result fetched: what a step pays for it, not an op's own time in a profile. The process runs
with training's settings (``entry.TRAINING``: TensorFlow's oneDNN kernels off unless
``TF_ENABLE_ONEDNN_OPTS`` is set; inter-op threads as a rank's, ``distributed.cores``), as the
step does. Only the forward
passes are timed (and x^T @ d and the gather-sum's gradient, themselves backward passes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

from hvdtrack.entry import TRAINING, start

CASES = ("linear_norm", "head", "weight_gradient", "gather_sum", "segment_sum", "gather_sum_grad")
# The default model's widths: edge latents 64, the edge update's hidden layer 128.
LATENT, HIDDEN = 64, 128


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the benchmark; returns the process exit code."""
    args = parse_args(argv)
    # Training's process settings (oneDNN off, the caching allocator) before TensorFlow starts:
    # "before" is what the training step ran. Explicit values in the environment win.
    start(TRAINING)
    import tensorflow as tf

    from hvdtrack.bench.workload import write_figures
    from hvdtrack.model.kernels import fused_kernels

    threads = args.threads or len(os.sched_getaffinity(0))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    except RuntimeError:  # TensorFlow already started in this process: its threads stay
        threads = tf.config.threading.get_intra_op_parallelism_threads()  # 0: TensorFlow's
    kernels = fused_kernels()
    if kernels is None:
        print(
            "error: the kernel library is not loaded here (see the warning above)", file=sys.stderr
        )
        return 1
    isa = kernels.hvdtrack_kernel_isa().numpy().decode()
    print(
        f"kernels against what they replaced: {args.rows:,} rows, {threads} thread(s), vector "
        f"code {isa}, {args.calls} calls of each in turn; {_load()}"
    )
    records = []
    for name in args.cases:
        kernel, before = _case(tf, kernels, name, args.rows, np.random.default_rng(args.seed))
        record = dict(case=name, **_in_turn(kernel, before, args.calls))
        records.append(record)
        print(
            f"{name:16s} kernel {record['kernel_ms']['min']:7.2f} ms (median "
            f"{record['kernel_ms']['median']:.2f})  before {record['before_ms']['min']:7.2f} ms "
            f"(median {record['before_ms']['median']:.2f})  kernel / before "
            f"{record['ratio']['median']:.3f} ({record['ratio']['q25']:.3f}-"
            f"{record['ratio']['q75']:.3f})"
        )
    print(_load())
    write_figures(args.json, dict(rows=args.rows, threads=threads, isa=isa, records=records))
    return 0


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The bench's command line (``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m hvdtrack.bench kernels", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("--rows", type=int, default=40000, help="edges (rows of the edge tensors; 40000)")
    add("--threads", type=int, default=1, help="intra-op threads, 0 = all cores (default: 1)")
    add("--calls", type=int, default=150, help="timed calls of each side (default: 150)")
    add("--cases", nargs="+", choices=CASES, default=list(CASES), help="which kernels (all)")
    add("--seed", type=int, default=0)
    add("--json", default=None, help="write all figures to this JSON file")
    args = parser.parse_args(argv)
    if args.rows < 8 or args.calls < 1 or args.threads < 0:
        parser.error("--rows must be >= 8, --calls >= 1 and --threads >= 0")
    return args


def _case(tf, kernels, name: str, rows: int, rng) -> tuple[Callable, Callable]:
    """The compiled kernel and what it replaced, each returning one element of its output."""

    def constant(*shape):
        return tf.constant(rng.standard_normal(shape) / np.sqrt(shape[0]), tf.float32)

    nodes = max(1, rows // 8)

    def node_ids():  # each edge's receiver and sender
        return [tf.constant(rng.integers(0, nodes, rows), tf.int32) for _ in range(2)]

    if name == "linear_norm":
        x, w, b = constant(rows, HIDDEN), constant(HIDDEN, LATENT), constant(LATENT)
        scale, offset = 1 + constant(LATENT), constant(LATENT)

        def kernel():  # (an op makes all its outputs: y stands for them)
            return kernels.hvdtrack_linear_norm(x, w, b, scale, offset, epsilon=1e-5, relu=True)[:1]

        def before():
            z = tf.nn.bias_add(x @ w, b)
            return kernels.hvdtrack_layer_norm(z, scale, offset, epsilon=1e-5, relu=True)[:1]

    elif name == "head":
        e, w1, b1 = constant(rows, LATENT), constant(LATENT, LATENT), constant(LATENT)
        w2, b2 = constant(LATENT, 1), constant(1)

        def kernel():
            return kernels.hvdtrack_head(e, w1, b1, w2, b2)

        def before():  # head._forward without the kernel: the bits first, as the step orders them
            hidden = tf.nn.relu(tf.nn.bias_add(e @ w1, b1))
            bits = kernels.hvdtrack_relu_mask(hidden)
            with tf.control_dependencies([bits]):
                return tf.nn.bias_add(hidden @ w2, b2), bits

    elif name == "weight_gradient":
        x, d = constant(rows, HIDDEN), constant(rows, LATENT)

        def kernel():
            return (kernels.hvdtrack_weight_gradient(x, d),)

        def before():  # mlp.weight_gradient's product for [a, b] with a > b, kernel aside
            return (tf.transpose(tf.matmul(d, x, transpose_a=True)),)

    elif name == "gather_sum":
        a, b = constant(rows, HIDDEN), constant(rows, HIDDEN)
        r, s = constant(nodes, HIDDEN), constant(nodes, HIDDEN)
        receivers, senders = node_ids()

        def kernel():
            return kernels.hvdtrack_gather_sum(a, b, r, s, receivers, senders, relu=True)

        def before():
            summed = tf.add_n([a, b, tf.gather(r, receivers), tf.gather(s, senders)])
            return (tf.nn.relu(summed),)

    elif name == "segment_sum":
        latents, (receivers, _) = constant(rows, LATENT), node_ids()

        def kernel():
            return (kernels.hvdtrack_segment_sum(latents, receivers, nodes),)

        def before():
            return (tf.math.unsorted_segment_sum(latents, receivers, nodes),)

    else:  # gather_sum_grad
        upstream, (receivers, senders) = constant(rows, HIDDEN), node_ids()
        out = tf.nn.relu(constant(rows, HIDDEN))  # the gather-sum's output, and its bits
        bits, empty = kernels.hvdtrack_relu_mask(out), tf.zeros([0, HIDDEN])

        def kernel():
            return kernels.hvdtrack_gather_sum_grad(
                upstream, bits, receivers, senders, nodes, empty, empty, relu=True
            )

        def before():
            g = tf.raw_ops.ReluGrad(gradients=upstream, features=out)
            sums = [tf.math.unsorted_segment_sum(g, ids, nodes) for ids in (receivers, senders)]
            return (g, *sums)

    def first(fn):  # one number of each tensor fetched: the ops that make them all run
        return tf.function(lambda: tf.add_n([tf.cast(tf.reshape(t, [-1])[0], tf.float32)
                                             for t in fn()]))  # fmt: skip

    return first(kernel), first(before)


def _in_turn(kernel: Callable, before: Callable, calls: int) -> dict:
    """Each side called in turn ``calls`` times after two warm-up calls; their times in ms."""
    for fn in (kernel, before, kernel, before):
        fn().numpy()
    times = {"kernel": [], "before": []}
    sides = (("kernel", kernel), ("before", before))
    for call in range(calls):
        for side, fn in sides if call % 2 == 0 else sides[::-1]:
            start = time.perf_counter()
            fn().numpy()
            times[side].append(1e3 * (time.perf_counter() - start))
    ours, theirs = np.array(times["kernel"]), np.array(times["before"])
    ratio = ours / theirs

    def summary(values):
        return dict(min=float(values.min()), median=float(np.median(values)))

    return dict(
        kernel_ms=summary(ours),
        before_ms=summary(theirs),
        ratio=dict(
            median=float(np.median(ratio)),
            q25=float(np.quantile(ratio, 0.25)),
            q75=float(np.quantile(ratio, 0.75)),
        ),
    )


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    from hvdtrack.entry import QUIET, run

    sys.exit(run(main, settings=QUIET))
