"""A tiny TensorFlow + Horovod program: each rank reduces known tensors and prints what it got."""

import json

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
rank, size = hvd.rank(), hvd.size()
value = tf.constant([1.0, 2.0, 3.0]) * (rank + 1)
summed = hvd.allreduce(value, op=hvd.Sum)
averaged = hvd.allreduce(value, op=hvd.Average)
gathered = hvd.allgather(tf.fill([rank + 1], float(rank)))
root_value = hvd.broadcast(tf.constant(float(rank + 10)), root_rank=0)
print(
    "RESULT "
    + json.dumps(
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
    ),
    flush=True,
)
