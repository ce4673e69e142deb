"""Strong-scaling efficiency and Horovod overhead on this machine, from real training runs.

  python -m hvdtrack.bench.distributed [--config configs/default.yaml] [--epochs 3]

Three runs of the same global work, one thread per worker:
  local   no Horovod, 1 process                      -> t_local
  np1     horovodrun -np 1, global batch G           -> t1
  np2     horovodrun -np 2, G/2 graphs per worker    -> t2
and prints the strong-scaling efficiency t1 / (2 * t2) and the overhead (t1 - t_local) / t_local,
from the epoch times (median after the first epoch, slowest rank) and the median step times
recorded by the runs themselves (``timing.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from hvdtrack.scaling import maths
from hvdtrack.scaling.sweep import plan_sweep, run_sweep
from hvdtrack.train.timing import read_run


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hvdtrack bench distributed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--out", default="runs/bench-distributed")
    parser.add_argument(
        "--epochs", type=int, default=3, help="epochs per run; the first is warm-up"
    )
    parser.add_argument(
        "--global-batch", type=int, default=2, help="graphs per step over all workers"
    )
    parser.add_argument("--max-steps", type=int, default=None, help="cap on steps per epoch")
    parser.add_argument("--controller", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    out = Path(args.out)
    common = [
        f"train.epochs={args.epochs}",
        "train.progress_bar=false",
        "distributed.threads_per_worker=1",
        "train.validate_every_epochs=1000",  # validation only after the last epoch
    ]
    if args.max_steps:
        common.append(f"train.max_steps_per_epoch={args.max_steps}")

    subprocess.run(
        [sys.executable, "-m", "hvdtrack.prepare", "--config", args.config, "--no-progress"],
        check=True,
    )
    local_dir = out / "local"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hvdtrack.train",
            "--config",
            args.config,
            *common,
            "distributed.strategy=local",
            f"train.batch_graphs={args.global_batch}",
            f"train.run_dir={local_dir}",
            "train.resume=false",
        ],
        check=True,
    )
    plan = plan_sweep(
        "strong",
        (1, 2),
        args.config,
        out / "sweep",
        global_batch=args.global_batch,
        controller=args.controller,
        overrides=[*common, "train.resume=false"],
    )
    run_sweep(plan, skip_prepare=True)

    runs = {"local": read_run(local_dir)}
    runs.update({f"np{n}": read_run(plan.run_dir(n)) for n in plan.nps})
    epoch = {name: maths.epoch_time(run) for name, run in runs.items()}
    step = {
        name: float(maths.step_statistics(maths.step_times(run))["median"])
        for name, run in runs.items()
    }
    figures = {
        "config": args.config,
        "global_batch_graphs": args.global_batch,
        "epochs": args.epochs,
        "epoch_s": epoch,
        "median_step_s": step,
        "edges_per_epoch": runs["np1"].info.get("edges_processed", 0) / max(args.epochs, 1),
        "strong_efficiency_epoch": maths.strong_efficiency(epoch["np1"], epoch["np2"], 2),
        "strong_efficiency_step": maths.strong_efficiency(step["np1"], step["np2"], 2),
        "horovod_overhead_epoch": (epoch["np1"] - epoch["local"]) / epoch["local"],
        "horovod_overhead_step": (step["np1"] - step["local"]) / step["local"],
    }
    print(
        f"\nSame global work ({args.global_batch} graphs/step), one thread per worker, "
        f"{args.epochs} epochs (first excluded):\n"
        f"  {'run':<8}{'epoch s':>10}{'median step s':>16}\n"
        + "".join(f"  {name:<8}{epoch[name]:>10.2f}{step[name]:>16.4f}\n" for name in runs)
        + f"  strong-scaling efficiency t1/(2*t2): {figures['strong_efficiency_epoch']:.3f} (epochs), "
        f"{figures['strong_efficiency_step']:.3f} (steps)\n"
        f"  Horovod overhead on one rank: {100 * figures['horovod_overhead_epoch']:+.1f}% (epochs), "
        f"{100 * figures['horovod_overhead_step']:+.1f}% (steps)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
