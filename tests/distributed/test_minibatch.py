"""Subgraph mini-batch training under ``horovodrun -np 2``: the real loop trains on sampled
subgraphs and validates on whole graphs.

This module's program (``python tests/distributed/test_minibatch.py CONFIG DATASET OUT
SEED_EDGES [overrides]``) trains with ``train.subgraphs.enabled=true``, as
``python -m hvdtrack.train`` does with that override.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # ~80 s on 2 shared cores
PROGRAM = "tests/distributed/test_minibatch.py"


def run_program() -> None:
    from hvdtrack.config import load_config
    from hvdtrack.runs.timing import read_run
    from hvdtrack.train.loop import fit
    from hvdtrack.train.trainer import Trainer

    config_path, dataset, out, seed_edges, *overrides = sys.argv[1:]
    out = Path(out)
    config = load_config(
        config_path,
        [
            f"data.dataset_dir={dataset}",
            f"train.run_dir={out / 'run'}",
            "distributed.strategy=horovod",
            "train.progress_bar=false",
            "train.subgraphs.enabled=true",
            f"train.subgraphs.seed_edges={seed_edges}",
            *overrides,
        ],
    )
    trainer = Trainer(config)
    trainer.state.restore(None)  # rank 0's initial weights everywhere
    plan = trainer.data.plan(0)
    first = next(trainer.data.batches(0, 0, trainer.size.steps_per_epoch))[0]
    initial_val = trainer.evaluate("val")
    info = fit(trainer)
    rank = trainer.workers.rank
    epochs = [e for e in read_run(out / "run").epochs if e.rank == rank]
    (out / f"result-rank{rank}.json").write_text(
        json.dumps(
            {
                "status": info["status"],
                "input_mode": info["input_mode"],
                "num_workers": trainer.workers.num_replicas,
                "steps_per_epoch": trainer.size.steps_per_epoch,
                "plan_steps": plan.num_steps,
                "plan_units": plan.num_graphs,
                "plan_seed_edges": [int(x) for x in plan.edges.sum(axis=0)],
                "first_n_edge": first[0].n_edge.numpy().tolist(),
                "first_loss_edges": int((first[1].numpy() != -1.0).sum()),
                "initial_val": initial_val,
                "epochs": [
                    {"edges": e.edges, "steps": e.steps, "loss": e.train_loss, "val": e.val}
                    for e in epochs
                ],
                "weights": [float(np.abs(v.numpy()).sum()) for v in trainer.state.variables],
            }
        )
    )
    trainer.workers.shutdown()


def test_minibatch_training_on_two_horovod_workers_validates_on_whole_graphs(
    tiny_dataset, tmp_path
):
    from hvdtrack.records.manifest import open_dataset
    from tests.launch import REPO, check, horovodrun

    args = [PROGRAM, str(REPO / "configs/tiny.yaml"), str(tiny_dataset), str(tmp_path), "32"]
    check(horovodrun(2, [*args, "train.epochs=3"], "gloo", timeout=600))
    rows = [json.loads((tmp_path / f"result-rank{r}.json").read_text()) for r in (0, 1)]
    manifest = open_dataset(tiny_dataset)
    train, val = manifest.split_table("train"), manifest.split_table("val")
    # 32 seed edges per subgraph: every training graph gives ceil(E / 32) subgraphs.
    units = int(np.sum(-(-train.num_edges // 32)))
    for row in rows:
        assert row["status"] == "finished" and row["num_workers"] == 2
        assert row["input_mode"] == "subgraphs"
        assert row["plan_units"] == units and row["plan_steps"] == units // (2 * 2)
        assert row["steps_per_epoch"] == row["plan_steps"]  # more steps than whole graphs (2)
        # A step's batch: 2 subgraphs, each smaller than a whole graph, loss on its seeds only.
        assert len(row["first_n_edge"]) == 2 and sum(row["first_n_edge"]) > row["first_loss_edges"]
        assert max(row["first_n_edge"]) < int(train.num_edges.max())
        assert len(row["epochs"]) == 3
        for epoch, on_rank0 in zip(row["epochs"], rows[0]["epochs"]):
            assert epoch["steps"] == row["plan_steps"]
            # Validation on whole graphs: every edge of the val split, the same on every rank.
            assert epoch["val"]["num_edges"] == int(val.num_edges.sum())
            assert epoch["val"] == on_rank0["val"]
        # The trained model is better on the whole val graphs than the initial one.
        assert row["epochs"][-1]["val"]["loss"] < row["initial_val"]["loss"]
        assert row["weights"] == rows[0]["weights"]
    # The seed edges of an epoch are split over the workers, none trained twice.
    epoch0 = [row["epochs"][0]["edges"] for row in rows]
    assert epoch0 == rows[0]["plan_seed_edges"]
    assert sum(epoch0) <= int(train.num_edges.sum())


if __name__ == "__main__":
    run_program()
