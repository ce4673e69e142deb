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
import json
import statistics
import time
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
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

    import numpy as np
    import tensorflow as tf

    from hvdtrack.distributed.config import StagesConfig
    from hvdtrack.distributed.stages import StagedClassifier, bubble_fraction, stage_devices
    from hvdtrack.inputs.pipeline import merge_graphs
    from hvdtrack.model.classifier import SegmentClassifier
    from hvdtrack.model.config import ModelConfig

    tf.config.threading.set_intra_op_parallelism_threads(args.threads_per_stage)
    tf.config.threading.set_inter_op_parallelism_threads(max(args.stages) + 1)
    devices = stage_devices(max(args.stages))
    net = SegmentClassifier(ModelConfig())
    rng = np.random.default_rng(0)
    b, n, e = args.graphs, args.nodes, args.edges
    values = {
        "nodes": tf.constant(rng.normal(size=(b * n, 3)).astype(np.float32)),
        "edges": tf.constant(rng.normal(size=(b * e, 4)).astype(np.float32)),
        "senders": tf.constant(rng.integers(0, n, b * e).astype(np.int32)),
        "receivers": tf.constant(rng.integers(0, n, b * e).astype(np.int32)),
        "labels": tf.constant((rng.random(b * e) < 0.1).astype(np.float32)),
    }
    graphs, labels = merge_graphs(values, tf.fill([b], n), tf.fill([b], e))
    net(graphs)  # variables

    def measure(stages: int, micro_batches: int) -> float:
        piped = StagedClassifier(net, StagesConfig(stages, micro_batches), devices[:stages])

        @tf.function
        def step(graphs, labels):
            _, _, grads = piped.local_terms(graphs, labels, net.trainable_variables, 2.0, 1.0)
            return tf.add_n([tf.reduce_sum(g) for g in grads])

        float(step(graphs, labels))  # trace and warm up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            float(step(graphs, labels))
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    print(
        f"devices {', '.join(devices)}; {b} graphs x ({n} nodes, {e} edges), "
        f"{args.threads_per_stage} intra-op thread(s) per stage"
    )
    seconds = {}
    sizes = sorted({(1, m) for m in args.micro_batches} | {(1, 1)})
    sizes += [(s, m) for s in sorted(args.stages) if s > 1 for m in args.micro_batches]
    rows = []
    print(f"{'S':>2} {'M':>3} {'time_s':>8} {'speedup':>8} {'idle':>6} {'gpipe':>6}")
    for stages, micro_batches in sizes:
        seconds[stages, micro_batches] = measure(stages, micro_batches)
        t = seconds[stages, micro_batches]
        row = {
            "stages": stages,
            "micro_batches": micro_batches,
            "time_s": t,
            "speedup": seconds[1, 1] / t,
            "idle": 1 - seconds[1, micro_batches] / (stages * t),
            "gpipe": bubble_fraction(stages, micro_batches),
        }
        rows.append(row)
        print(
            f"{stages:>2} {micro_batches:>3} {t:>8.3f} {row['speedup']:>8.2f} "
            f"{row['idle']:>6.2f} {row['gpipe']:>6.2f}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    import sys

    from hvdtrack.entry import QUIET, run

    sys.exit(run(main, settings=QUIET))
