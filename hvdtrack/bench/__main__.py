"""``python -m hvdtrack.bench NAME [ARGS]`` (or ``hvdtrack bench NAME``): run one benchmark.

construct    graph construction time for a full-size event (numpy, one core)
read         TFRecord read throughput of the training pipeline (graphs/s, edges/s)
model        the Trainer's training step: time, share of the matmul rate, op breakdown, memory
kernels      the kernel library's kernels against the ops they replaced, called in turn
ceiling      the step alone and once per core at the same time: what 2 ranks can reach here
distributed  strong-scaling efficiency of horovodrun -np 2 vs -np 1, Horovod's overhead, the model at N=2
stages       pipeline parallelism in stages: time per mini-batch for S stages x M micro-batches, idle fraction vs GPipe
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

NAMES = ("construct", "read", "model", "kernels", "ceiling", "distributed", "stages")
# Old names still accepted: the stages bench was called "pipeline" before the rename.
RENAMED = {"pipeline": "stages"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in RENAMED:
        print(f"hvdtrack bench: '{argv[0]}' is now '{RENAMED[argv[0]]}'", file=sys.stderr)
        argv[0] = RENAMED[argv[0]]
    if not argv or argv[0] not in NAMES:
        print(__doc__, file=sys.stderr if argv else sys.stdout)
        return 2 if argv else 0
    module = importlib.import_module(f"hvdtrack.bench.{argv[0]}")
    return module.main(argv[1:])


if __name__ == "__main__":
    from hvdtrack.entry import QUIET, run

    sys.exit(run(main, settings=QUIET))  # the model bench applies training's allocator itself
