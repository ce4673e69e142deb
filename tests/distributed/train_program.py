"""Runs the real training loop under a distribution strategy and prints what the tests check.

  python tests/distributed/train_program.py CONFIG DATASET OUT STRATEGY [overrides...]

Writes, per process, OUT/result-rank{rank}.json with:
  grads: the reduced gradients of step 0 of epoch 0 (saved to OUT/grads-rank0.npz by rank 0,
    with the initial weights and the graph ids every worker used);
  val: validation metrics with the initial weights;
  losses_a / losses_b: per-epoch training losses of two identical fits (determinism);
  weights: a checksum of every variable after training (equal on every rank after broadcast).
Under Horovod also OUT/exchange-rank{rank}.npz: what the step's gradient exchange got and gave
on this rank (``record_exchange``), for the tests of fp16 compression, Adasum and accumulation.
"""

import json
import sys
from pathlib import Path

import numpy as np

from hvdtrack.config import load_config
from hvdtrack.train.loop import fit
from hvdtrack.train.step import REQUESTS, _exchange_inputs
from hvdtrack.train.trainer import Trainer


def main() -> None:
    config_path, dataset, out, strategy, *overrides = sys.argv[1:]
    out = Path(out)

    def config(run: str):
        return load_config(
            config_path,
            [
                f"data.dataset_dir={dataset}",
                f"train.run_dir={out / run}",
                f"distributed.strategy={strategy}",
                "train.progress_bar=false",
                *overrides,
            ],
        )

    trainer = Trainer(config("a"))
    trainer.state.restore(None)  # the broadcast of rank 0's initial weights
    initial = [v.numpy() for v in trainer.state.variables]
    plan = trainer.data.plan(0)
    batches = next(trainer.data.batches(0, 0, trainer.size.steps_per_epoch))
    loss, grads = trainer.step.gradients(batches)
    val = trainer.evaluate("val")
    rank = trainer.workers.rank
    if trainer.workers.name == "horovod":
        np.savez(out / f"exchange-rank{rank}.npz", **record_exchange(trainer))
    if rank == 0:
        np.savez(
            out / "grads-rank0.npz",
            graph_ids=plan.graph_ids[:, 0, :],
            loss=loss,
            **{f"grad{i}": g for i, g in enumerate(grads)},
            **{f"init{i}": w for i, w in enumerate(initial)},
        )
    info_a = fit(trainer)
    losses_a = [e.train_loss for e in _epochs(out / "a")]
    weights = [float(np.abs(v.numpy()).sum()) for v in trainer.state.variables]
    # One set of workers per process, as in ``hvdtrack.train``: Horovod over MPI cannot start
    # again after a shutdown, and a second heartbeat watchdog left running at exit would look
    # like a crashed rank to the other ranks' watchdog.
    trainer_b = Trainer(config("b"), trainer.workers)
    fit(trainer_b)
    losses_b = [e.train_loss for e in _epochs(out / "b")]
    # One file per rank: launchers interleave the ranks' stdout.
    (out / f"result-rank{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "num_workers": trainer.workers.num_replicas,
                "loss0": loss,
                "val": {k: v for k, v in val.items()},
                "status": info_a["status"],
                "losses_a": losses_a,
                "losses_b": losses_b,
                "weights": weights,
            }
        )
    )
    trainer.workers.shutdown()


def record_exchange(trainer) -> dict[str, np.ndarray]:
    """Step 0's parts as ``TrainStep.run`` chains them, with the initial weights:
    ``pass{p}_{i}``: pass p's local terms alone (loss sum, weight sum, gradients of the loss
    sum); ``terms_{i}``: the terms the exchange got (every pass accumulated); ``reduced_{i}``:
    what it gave (global loss, requests, gradients)."""
    step, passes = trainer.step, trainer.config.distributed.backward_passes_per_step
    batches = trainer.data.batches(0, 0, trainer.size.steps_per_epoch)
    flat = [[x for pair in next(batches) for x in pair] for _ in range(passes)]
    alone = [step._local(*f)[0] for f in flat]  # the accumulators are zero: one pass each
    for f in flat[:-1]:
        step._accumulate(*f)
    terms = step._local(*flat[-1])
    reduced = step._exchange(*_exchange_inputs(terms, [0.0] * len(REQUESTS)))[0]

    def per_variable(parts):  # the two scalars (or the scalar and the flags), then the gradients
        return [t.numpy() for t in [*parts[:2], *step.split_gradients(parts[2])]]

    record = {
        f"pass{p}_{i}": t for p, ts in enumerate(alone) for i, t in enumerate(per_variable(ts))
    }
    record.update({f"terms_{i}": t for i, t in enumerate(per_variable(terms[0]))})
    record.update({f"reduced_{i}": t for i, t in enumerate(per_variable(reduced))})
    return record


def _epochs(run_dir: Path):
    from hvdtrack.runs.timing import read_run

    return [e for e in read_run(run_dir).epochs if e.rank == 0]


if __name__ == "__main__":
    main()
