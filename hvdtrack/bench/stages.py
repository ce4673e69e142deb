"""Stages (pipeline parallelism): time per mini-batch for S stages x M micro-batches, and the bubble.

  python -m hvdtrack.bench.stages [--stages 1 2 4] [--micro-batches 1 5 10]
      [--graphs 10] [--nodes 2000] [--edges 4000] [--threads-per-stage 1] [--repeats 5]

One process with max(S) logical CPU devices (GPUs when present), each stage's ops on one intra-op
thread by default, so that a stage behaves like one worker. For every (S, M) the compiled
forward + backward of ``distributed.stages.StagedClassifier`` on one batch of ``--graphs``
random graphs is timed (median of ``--repeats`` after one warm-up call; the trace is excluded),
with the default model (8 message-passing steps). Printed per (S, M):

  time_s       median seconds per mini-batch;
  speedup      T(1, 1) / T(S, M);
  idle         measured idle fraction of the stages, 1 - T(1, M) / (S * T(S, M)) (the same
               micro-batches run sequentially, spread over S stages with no loss);
  gpipe        GPipe's prediction (S - 1) / (M + S - 1) for equal stages and free transfers.

On CPU the stages share the cores: with C cores, no S > C can beat T/C, so ``idle`` there is at
least 1 - C/S whatever M is; the prediction is a GPU figure (one stage per device).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Optional, Sequence


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hvdtrack bench stages", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 5, 10])
    parser.add_argument("--graphs", type=int, default=10, help="graphs per mini-batch")
    parser.add_argument("--nodes", type=int, default=2000, help="nodes per graph")
    parser.add_argument("--edges", type=int, default=4000, help="edges per graph")
    parser.add_argument("--threads-per-stage", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if min(args.stages) < 1 or min(args.micro_batches) < 1 or args.repeats < 1:
        parser.error("--stages, --micro-batches and --repeats must be >= 1")
    return args


def _batch(num_graphs: int, nodes: int, edges: int):
    """One merged batch of ``num_graphs`` random graphs (seeded) and 10% true labels."""
    import numpy as np
    import tensorflow as tf

    from hvdtrack.inputs.pipeline import merge_graphs

    rng = np.random.default_rng(0)
    b, n, e = num_graphs, nodes, edges
    values = {
        "nodes": tf.constant(rng.normal(size=(b * n, 3)).astype(np.float32)),
        "edges": tf.constant(rng.normal(size=(b * e, 4)).astype(np.float32)),
        "senders": tf.constant(rng.integers(0, n, b * e).astype(np.int32)),
        "receivers": tf.constant(rng.integers(0, n, b * e).astype(np.int32)),
        "labels": tf.constant((rng.random(b * e) < 0.1).astype(np.float32)),
    }
    return merge_graphs(values, tf.fill([b], n), tf.fill([b], e))


def _seconds(net, batch, devices: list[str], stages: int, micro_batches: int, repeats: int):
    """Median seconds of a compiled forward + backward through S stages x M micro-batches."""
    import tensorflow as tf

    from hvdtrack.distributed.config import StagesConfig
    from hvdtrack.distributed.stages import StagedClassifier

    staged = StagedClassifier(net, StagesConfig(stages, micro_batches), devices[:stages])

    @tf.function(autograph=False)  # as the training step: no rewriting of what it calls
    def step(graphs, labels):
        _, _, grads = staged.local_terms(graphs, labels, net.trainable_variables, 2.0, 1.0)
        return tf.add_n([tf.reduce_sum(g) for g in grads])

    float(step(*batch))  # trace and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        float(step(*batch))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    import tensorflow as tf

    from hvdtrack.distributed.stages import bubble_fraction, stage_devices
    from hvdtrack.model.classifier import SegmentClassifier
    from hvdtrack.model.config import ModelConfig
    from hvdtrack.utils.io import write_json

    tf.config.threading.set_intra_op_parallelism_threads(args.threads_per_stage)
    tf.config.threading.set_inter_op_parallelism_threads(max(args.stages) + 1)
    devices = stage_devices(max(args.stages))
    net = SegmentClassifier(ModelConfig())
    batch = _batch(args.graphs, args.nodes, args.edges)
    net(batch[0])  # variables
    print(
        f"devices {', '.join(devices)}; {args.graphs} graphs x ({args.nodes} nodes, "
        f"{args.edges} edges), {args.threads_per_stage} intra-op thread(s) per stage"
    )
    seconds, rows = {}, []
    sizes = sorted({(1, m) for m in args.micro_batches} | {(1, 1)})
    sizes += [(s, m) for s in sorted(args.stages) if s > 1 for m in args.micro_batches]
    print(f"{'S':>2} {'M':>3} {'time_s':>8} {'speedup':>8} {'idle':>6} {'gpipe':>6}")
    for stages, micro in sizes:
        t = seconds[stages, micro] = _seconds(net, batch, devices, stages, micro, args.repeats)
        row = {
            "stages": stages,
            "micro_batches": micro,
            "time_s": t,
            "speedup": seconds[1, 1] / t,
            "idle": 1 - seconds[1, micro] / (stages * t),
            "gpipe": bubble_fraction(stages, micro),
        }
        rows.append(row)
        print(
            f"{stages:>2} {micro:>3} {t:>8.3f} {row['speedup']:>8.2f} "
            f"{row['idle']:>6.2f} {row['gpipe']:>6.2f}",
            flush=True,
        )
    if args.json:
        write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    import sys

    from hvdtrack.entry import QUIET, run

    sys.exit(run(main, settings=QUIET))
