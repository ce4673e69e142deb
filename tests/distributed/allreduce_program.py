"""A tiny TensorFlow + Horovod program: each rank reduces known tensors and writes what it got.

  python tests/distributed/allreduce_program.py OUT_DIR   -> OUT_DIR/rank{r}.json
(one file per rank: launchers interleave the ranks' stdout).
"""

import json
import sys
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
rank, size = hvd.rank(), hvd.size()
value = tf.constant([1.0, 2.0, 3.0]) * (rank + 1)
summed = hvd.allreduce(value, op=hvd.Sum)
averaged = hvd.allreduce(value, op=hvd.Average)
gathered = hvd.allgather(tf.fill([rank + 1], float(rank)))
root_value = hvd.broadcast(tf.constant(float(rank + 10)), root_rank=0)
(Path(sys.argv[1]) / f"rank{rank}.json").write_text(
    json.dumps(
        {
            "rank": rank,
            "size": size,
            "sum": summed.numpy().tolist(),
            "average": averaged.numpy().tolist(),
            "gathered": gathered.numpy().tolist(),
            "broadcast": float(root_value),
            "mpi": bool(hvd.mpi_enabled()),
            "gloo": bool(hvd.gloo_enabled()),
        }
    )
)
