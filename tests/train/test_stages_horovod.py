"""Data x pipeline parallelism: 2 Horovod workers, each a 2-stage pipeline on its own 2 logical
CPU devices; the allreduced pipelined gradients equal the sequential gradients of both batches.

Runs this file as the workers' program: ``horovodrun -np 2 python tests/train/test_stages_horovod.py OUT``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # horovodrun + traces: ~1 min


def program() -> None:
    import numpy as np
    import tensorflow as tf

    from hvdtrack.distributed.config import DistributedConfig, StagesConfig
    from hvdtrack.distributed.stages import StagedClassifier, stage_devices
    from hvdtrack.distributed.workers import make_workers
    from tests.train.test_stages import FAKE_WEIGHT, TRUE_WEIGHT, batch, model, sequential

    workers = make_workers(DistributedConfig(strategy="horovod", deadline_s=None))
    devices = stage_devices(2)  # before anything else starts TensorFlow
    rank = workers.rank
    tf.random.set_seed(100 + rank)  # different initial weights: the broadcast makes them equal
    net = model(4)
    sizes = [(14, 25), (9, 12), (20, 31), (6, 7)]
    batches = [batch(sizes, seed=10 + r) for r in range(workers.num_replicas)]
    net(batches[0][0])
    workers.broadcast_variables(net.trainable_variables)
    piped = StagedClassifier(net, StagesConfig(num_stages=2, micro_batches=4), devices)

    @tf.function
    def local(graphs, labels):
        return piped.local_terms(graphs, labels, net.trainable_variables, TRUE_WEIGHT, FAKE_WEIGHT)

    loss, weight, grads = local(*batches[rank])
    # The trainer's exchange: one allreduce of (gradient sums, loss sum, weight sum), divided once.
    *total_grads, total_loss, total_weight = workers.reduce_gradients([*grads, loss, weight])
    mean_grads = [g / total_weight for g in total_grads]
    # Reference: sequential gradients of every worker's batch, computed here, summed.
    terms = [sequential(net, *b) for b in batches]
    ref_weight = sum(float(t[1]) for t in terms)
    ref_grads = [sum(t[2][i] for t in terms) / ref_weight for i in range(len(mean_grads))]
    difference = max(
        float(np.abs(g.numpy() - r.numpy()).max() / max(np.abs(r.numpy()).max(), 1e-12))
        for g, r in zip(mean_grads, ref_grads)
    )
    graph = local.get_concrete_function(*batches[rank]).graph
    used = sorted({op.device.split("/")[-1] for op in graph.get_operations() if op.device})
    Path(sys.argv[1], f"rank{rank}.json").write_text(
        json.dumps(
            {
                "workers": workers.num_replicas,
                "grad_difference": difference,
                "weight": [float(total_weight), ref_weight],
                "loss": [float(total_loss), sum(float(t[0]) for t in terms)],
                "op_devices": used,
            }
        )
    )
    workers.shutdown()


def test_two_pipelines_under_horovod_give_the_sequential_mean_gradient(tmp_path):
    from tests.launch import check, horovodrun

    check(horovodrun(2, ["tests/train/test_stages_horovod.py", str(tmp_path)], "gloo", 400))
    for rank in (0, 1):
        row = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert row["workers"] == 2
        assert row["weight"][0] == row["weight"][1]
        assert row["loss"][0] == pytest.approx(row["loss"][1], rel=1e-6)
        assert row["grad_difference"] < 1e-5
        assert row["op_devices"] == ["device:CPU:0", "device:CPU:1"]


if __name__ == "__main__":
    program()
