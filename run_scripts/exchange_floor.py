"""What one rank's gradient exchange costs besides the wait for Horovod's cycle.

    .venv/bin/python run_scripts/exchange_floor.py --cycle-ms 20 [--calls 200] [--flat]

One process (``hvd.init()``, one rank) builds the default model (``configs/default.yaml``'s
``model:``) and calls, ``--calls`` times each, two compiled functions on its gradients' shapes:
``grouped_allreduce`` then a division (what the step's exchange does), and the division alone.
Before each call the host busy-waits 30 ms plus a draw uniform in [0, 2 cycles), so that the
call starts at a random point of Horovod's cycle, as a training step's exchange does when its
compute ends. ``--flat``: the gradients as one vector (``TrainStep`` passes it with its two sums
and flags), else one tensor per variable. A one-rank training run skips the loop altogether
(``HorovodWorkers.alone``); the script times what each exchange of N >= 2 ranks goes through.
Prints, per function, the mean and median of the calls after the first 5.
Through the loop, the call takes half a cycle on average plus what every exchange does: the
difference from half a cycle is that floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

WARMUP = 5  # first calls left out: tracing and the runtime's first instantiation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycle-ms", type=float, required=True, help="HOROVOD_CYCLE_TIME")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--flat", action="store_true", help="the gradients as one vector")
    args = parser.parse_args(argv)
    if args.cycle_ms <= 0 or args.calls <= WARMUP:
        parser.error(f"--cycle-ms must be > 0 and --calls > {WARMUP}")
    os.environ["HOROVOD_CYCLE_TIME"] = str(args.cycle_ms)  # read by hvd.init()

    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from hvdtrack.bench.workload import synthetic_graph
    from hvdtrack.config import load_config
    from hvdtrack.model.classifier import SegmentClassifier

    hvd.init()
    config = load_config(REPO / "configs" / "default.yaml")
    model = SegmentClassifier(config.model)
    model(synthetic_graph(50, 400)[0])
    grads = [tf.ones(v.shape, v.dtype) for v in model.trainable_variables]
    if args.flat:
        grads = [tf.ones([sum(v.shape.num_elements() for v in grads)], tf.float32)]

    @tf.function(autograph=False)
    def through_loop(*g):
        return [x / 2.0 for x in hvd.grouped_allreduce(list(g), op=hvd.Sum, name="gradients")]

    @tf.function(autograph=False)
    def without(*g):
        return [x / 2.0 for x in g]

    rng = np.random.default_rng(0)
    what = f"{len(grads)} tensor(s), cycle {args.cycle_ms:g} ms"
    for name, fn in (("through Horovod's loop", through_loop), ("without the collective", without)):
        times = []
        for _ in range(args.calls):
            end = time.perf_counter() + 0.03 + rng.uniform(0, 2 * args.cycle_ms) / 1e3
            while time.perf_counter() < end:
                pass
            start = time.perf_counter()
            fn(*grads)[0].numpy()
            times.append((time.perf_counter() - start) * 1e3)
        times = times[WARMUP:]
        print(
            f"{what}, {name}: mean {statistics.mean(times):.2f} ms, "
            f"median {statistics.median(times):.2f} ms ({len(times)} calls)"
        )
    print(f"half a cycle: {args.cycle_ms / 2:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
