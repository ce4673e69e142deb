"""Data x pipeline parallelism from the config under ``horovodrun -np 2``: each rank a 2-stage
pipeline on its own 2 logical CPU devices, the real loop trains and validates on whole graphs.

This module's program (``python tests/distributed/test_train_stages.py CONFIG DATASET OUT
[overrides]``) trains with ``distributed.stages.num_stages=2 distributed.stages.micro_batches=2``,
as ``python -m hvdtrack.train`` does with those overrides.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # ~1 min on 2 shared cores
PROGRAM = "tests/distributed/test_train_stages.py"


def run_program() -> None:
    from hvdtrack.config import load_config
    from hvdtrack.runs.timing import read_run
    from hvdtrack.train.loop import fit
    from hvdtrack.train.trainer import Trainer

    config_path, dataset, out, *overrides = sys.argv[1:]
    out = Path(out)
    config = load_config(
        config_path,
        [
            f"data.dataset_dir={dataset}",
            f"train.run_dir={out / 'run'}",
            "distributed.strategy=horovod",
            "train.progress_bar=false",
            "distributed.stages.num_stages=2",
            "distributed.stages.micro_batches=2",
            *overrides,
        ],
    )
    trainer = Trainer(config)
    trainer.state.restore(None)  # rank 0's initial weights everywhere
    # The first step's exchanged gradients, staged and (the same trainer without its
    # stages, recompiled) plain: data x stage parallelism gives data parallelism's step.
    batch = next(trainer.data.batches(0, 0, trainer.size.steps_per_epoch))
    piped_loss, piped_grads = trainer.step.gradients(batch)
    stages, trainer.step.stages = trainer.step.stages, None
    trainer.step.build()
    plain_loss, plain_grads = trainer.step.gradients(batch)
    trainer.step.stages = stages
    trainer.step.build()
    difference = max(
        float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))
        for a, b in zip(piped_grads, plain_grads)
    )
    initial_val = trainer.evaluate("val")
    info = fit(trainer)
    rank = trainer.workers.rank
    epochs = [e for e in read_run(out / "run").epochs if e.rank == rank]
    (out / f"result-rank{rank}.json").write_text(
        json.dumps(
            {
                "status": info["status"],
                "stages": info["stages"],
                "input_mode": info["input_mode"],
                "num_workers": trainer.workers.num_replicas,
                "devices": trainer.step.stages.devices,
                "loss_difference": abs(piped_loss - plain_loss) / plain_loss,
                "grad_difference": difference,
                "initial_val": initial_val,
                "epochs": [{"steps": e.steps, "val": e.val} for e in epochs],
                "weights": [float(np.abs(v.numpy()).sum()) for v in trainer.state.variables],
            }
        )
    )
    trainer.workers.shutdown()


def test_training_in_stages_on_two_horovod_workers_validates_on_whole_graphs(
    tiny_dataset, tmp_path
):
    from hvdtrack.records.manifest import open_dataset
    from tests.launch import REPO, check, horovodrun

    args = [PROGRAM, str(REPO / "configs/tiny.yaml"), str(tiny_dataset), str(tmp_path)]
    check(horovodrun(2, [*args, "train.epochs=3"], "gloo", timeout=600))
    rows = [json.loads((tmp_path / f"result-rank{r}.json").read_text()) for r in (0, 1)]
    val = open_dataset(tiny_dataset).split_table("val")
    for row in rows:
        assert row["status"] == "finished" and row["num_workers"] == 2
        assert row["stages"] == {"num_stages": 2, "micro_batches": 2}
        assert row["input_mode"] == "graphs"
        # Each rank's stages on devices of their own, made before TensorFlow started.
        assert [d.split("/")[-1] for d in row["devices"]] == ["device:CPU:0", "device:CPU:1"]
        assert row["loss_difference"] < 1e-6 and row["grad_difference"] < 1e-5
        assert len(row["epochs"]) == 3
        for epoch, on_rank0 in zip(row["epochs"], rows[0]["epochs"]):
            # Validation on whole graphs: every edge of the val split, the same on every rank.
            assert epoch["val"]["num_edges"] == int(val.num_edges.sum())
            assert epoch["val"] == on_rank0["val"]
        assert row["epochs"][-1]["val"]["loss"] < row["initial_val"]["loss"]
        assert row["weights"] == rows[0]["weights"]  # the exchange kept the ranks equal


if __name__ == "__main__":
    run_program()
