"""Strong-scaling efficiency and Horovod overhead on this machine, from real training runs.

  python -m hvdtrack.bench.distributed [--config configs/default.yaml] [--epochs 4] [--rounds 3]

Six runs, one thread per worker, five of them of the same global work:
  local      no Horovod, 1 process                                  -> t_local
  np1        horovodrun -np 1, global batch G                       -> t1
  np2        horovodrun -np 2, G/2 graphs per worker                -> t2
  np1-half   horovodrun -np 1, G/2 graphs per step (half the work)  -> the model's fit
  mirrored1  MirroredStrategy, 1 logical CPU device, 1 thread       -> t1
  mirrored2  MirroredStrategy, 2 logical CPU devices, 2 threads     -> t2
and prints the strong-scaling efficiency t1 / (2 * t2) of each strategy and the Horovod overhead
(t1 - t_local) / t_local, from the epoch times (median after the first epoch, slowest rank: the
study's figure) and, as a cross-check, from the median step times, all recorded by the runs
themselves (``timing.jsonl``). With every epoch accounted for, the two agree.

The six runs are trained in turn, ``--rounds`` times in that order (``--out``/round-<k>/), and
each figure is the median of the rounds' own figures, each round's printed beside it: a machine
that drifts by several percent between runs minutes apart (docs/scaling/README.md) moves every
run of a round alike, so a ratio within a round is not the drift between two runs far apart.
The local run comes right before np1, whose difference is the overhead.

Each round also checks the scaling model (``hvdtrack.scaling.maths``, what ``scaling predict``
extrapolates to many workers) where it can be checked: its N = 2 prediction from the round's np1
run, with the step's fixed and per-edge cost fitted on np1's steps and np1-half's (two batch
sizes; one batch size's steps do not determine the fixed cost), against the round's np2, on
median steps, with the ceiling below and the ``shared-memory`` network (Gloo over loopback). The
two fitted runs bracket np2, so the fit and the check see the machine at one speed.

Each efficiency is also stated against this machine's ceiling for 2 ranks (``bench ceiling
--training-graphs``: a rank's step on the G/2 graphs of the training split nearest its mean
size, alone and twice at once, one per core; a synthetic graph until 2026-11-30 morning),
measured in every round between np1-half and mirrored1 (``round-<k>/ceiling.json``), so that it
sees the machine at the speed of the runs it is set against: efficiency / ceiling, each round's
own, is the share of what the hardware allows that the strategy reaches, the figure to compare
between machines, and each round's prediction takes its round's ceiling. Beside it, the
contention the Horovod runs met themselves: np1's compute per edge over np2's (median over every
rank's steps), which is what the ceiling estimates; it cannot stand in for the ceiling in a
prediction of np2, being measured on np2. In the ``--json`` record, "ceiling" is the median of
the rounds' ceilings and "ceiling_measurements" each round's measurement (a bench from before
2026-11-30 measured one ceiling after its rounds, and "ceiling" held that measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from hvdtrack.bench.ceiling import Ceiling, measure_ceiling
from hvdtrack.config import load_config, resolve_config_path
from hvdtrack.errors import DataError
from hvdtrack.runs.timing import Run, read_run
from hvdtrack.scaling import maths
from hvdtrack.scaling.network import PRESETS
from hvdtrack.scaling.sweep import plan_sweep, run_sweep
from hvdtrack.utils.io import write_json

# (strategy, its 1-worker run, its 2-worker run)
STRATEGIES = (("horovod", "np1", "np2"), ("mirrored", "mirrored1", "mirrored2"))
# The runs of a round, in the order they train (the ceiling is measured after np1-half).
RUNS = ("local", "np1", "np2", "np1-half", "mirrored1", "mirrored2")
# Alone / together pairs of each round's ceiling measurement (``measure_ceiling``'s rounds)
# and the steps each side times in a pair. On this Xeon one pair's ratio varied with a standard
# deviation of 0.14 with 5 steps a side and 0.10 with 10 (docs/scaling/README.md): the steps'
# own noise dominates, so the count of timed steps is what counts. 2 pairs of 10 steps left a
# round's ceiling about 0.07 off either way; 8 pairs of 5 (40 timed steps a side, not 20),
# about 0.06; halving it would take 4 times the steps.
CEILING_PAIRS = 8
CEILING_STEPS = 5


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hvdtrack bench distributed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--out", default="runs/bench-distributed")
    parser.add_argument(
        "--epochs", type=int, default=4, help="epochs per run; the first is warm-up"
    )
    parser.add_argument(
        "--global-batch", type=int, default=2, help="graphs per step over all workers"
    )
    parser.add_argument("--max-steps", type=int, default=None, help="cap on steps per epoch")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="the six runs trained this many times in turn; figures are the rounds' medians",
    )
    parser.add_argument("--controller", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: compute the figures from the run directories and each round's "
        "ceiling.json already in --out",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    return args


def common_overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides of every run."""
    common = [
        f"train.epochs={args.epochs}",
        "train.progress_bar=false",
        "distributed.threads_per_worker=1",
        "train.validate_every_epochs=1000",  # validation only after the last epoch
    ]
    if args.max_steps:
        common.append(f"train.max_steps_per_epoch={args.max_steps}")
    return common


def _one_keep_edge_term(args: argparse.Namespace, common: Sequence[str]) -> list[str]:
    """``model.keep_edge_term`` settled once for every run (``launch.one_keep_edge_term``):
    the whole global batch in one process, or half of it in each of two."""
    from hvdtrack.config import load_config, resolve_config_path
    from hvdtrack.distributed.launch import one_keep_edge_term

    config = load_config(resolve_config_path(args.config), list(common))
    half = max(1, args.global_batch // 2)
    keep = one_keep_edge_term(config, [(1, args.global_batch), (2, half)])
    return [] if keep is None else [keep]


def round_dir(args: argparse.Namespace, k: int) -> Path:
    """The run directories of round ``k`` (from 1)."""
    return Path(args.out) / f"round-{k}"


def train(args: argparse.Namespace, common: Sequence[str], run_dir: Path, *overrides: str) -> Path:
    """Trains one run into ``run_dir`` (nothing with --report-only); returns ``run_dir``."""
    command = [sys.executable, "-m", "hvdtrack.train", "--config", args.config, *common]
    command += [*overrides, f"train.run_dir={run_dir}", "train.resume=false"]
    if not args.report_only:
        subprocess.run(command, check=True)
    return run_dir


def round_runs(args: argparse.Namespace, common: Sequence[str], out: Path) -> dict[str, Path]:
    """Trains one round's runs into ``out``, in ``RUNS``'s order, and measures the round's
    ceiling after np1-half (``measure_round_ceiling``; neither with --report-only); their run
    directories."""
    g = args.global_batch
    dirs = {
        "local": train(
            args, common, out / "local", "distributed.strategy=local", f"train.batch_graphs={g}"
        ),
    }
    dirs.update(horovod_runs(args, common, out))
    if not args.report_only:
        measure_round_ceiling(args, common, out)
    for n in (1, 2):
        # One process feeding n replicas: n threads in all, one per replica.
        dirs[f"mirrored{n}"] = train(
            args,
            common,
            out / f"mirrored{n}",
            "distributed.strategy=mirrored",
            f"distributed.num_cpu_devices={n}",
            f"distributed.threads_per_worker={n}",
            f"train.batch_graphs={g // n}",
        )
    assert tuple(dirs) == tuple(n for n in RUNS if n in dirs)
    return dirs


def horovod_runs(args: argparse.Namespace, common: Sequence[str], out: Path) -> dict[str, Path]:
    """The horovodrun -np 1 and -np 2 runs (a strong-scaling sweep), then -np 1 with half the
    global batch (a one-worker weak sweep, in ``out``/fit); their run directories."""
    options = dict(controller=args.controller, overrides=[*common, "train.resume=false"])
    strong = plan_sweep(
        "strong", (1, 2), args.config, out / "sweep", global_batch=args.global_batch, **options
    )
    half = plan_sweep(
        "weak", (1,), args.config, out / "fit", batch=args.global_batch // 2, **options
    )
    if not args.report_only:
        run_sweep(strong, skip_prepare=True)
        run_sweep(half, skip_prepare=True)
    dirs = {"np1": strong.run_dir(1), "np2": strong.run_dir(2), "np1-half": half.run_dir(1)}
    if args.report_only and not half.run_dir(1).exists():
        del dirs["np1-half"]  # a bench from before np1-half: its figures, without the model's
    return dirs


def measure(args: argparse.Namespace, runs: dict[str, Run], ceiling: float) -> dict:
    """One round's figures: epoch, median step and step-sum times, Horovod's overhead, each
    strategy's efficiencies, the round's ``ceiling`` and each strategy's efficiency on epochs
    against it, and the Horovod ranks' own contention."""
    epoch = {name: maths.epoch_time(run) for name, run in runs.items()}
    step = {
        name: float(maths.step_statistics(maths.step_times(run))["median"])
        for name, run in runs.items()
    }
    sums = {name: maths.epoch_step_time(run) for name, run in runs.items()}
    per_edge = {name: compute_per_edge(run) for name, run in runs.items()}
    figures = {
        "epoch_s": epoch,
        "median_step_s": step,
        "edges_per_epoch": runs["np1"].info.get("edges_processed", 0) / max(args.epochs, 1),
        "horovod_overhead_epoch": (epoch["np1"] - epoch["local"]) / epoch["local"],
        "horovod_overhead_step": (step["np1"] - step["local"]) / step["local"],
        "epoch_step_sum_s": sums,
        "compute_per_edge_s": per_edge,
        "horovod_own_contention": per_edge["np1"] / per_edge["np2"],
    }
    for strategy, one, two in STRATEGIES:
        for key, times in (("epoch", epoch), ("step_sum", sums), ("median_step", step)):
            efficiency = maths.efficiency("strong", times[one], times[two], 2)
            figures[f"{strategy}_strong_efficiency_{key}"] = efficiency
    figures["ceiling"] = ceiling
    for strategy, _, _ in STRATEGIES:
        on_epochs = figures[f"{strategy}_strong_efficiency_epoch"]
        figures[f"{strategy}_of_ceiling_epoch"] = on_epochs / ceiling
    return figures


def combine(args: argparse.Namespace, rounds: list[dict]) -> dict:
    """The rounds' figures in one record: each the median over the rounds (per run for the
    times), then the rounds' own under "rounds"."""
    figures: dict = {
        "config": args.config,
        "global_batch_graphs": args.global_batch,
        "epochs": args.epochs,
    }
    for key, first in rounds[0].items():
        if isinstance(first, dict):  # per run: the runs every round has
            names = [n for n in first if all(n in r[key] for r in rounds)]
            figures[key] = {n: float(np.median([r[key][n] for r in rounds])) for n in names}
        else:
            figures[key] = float(np.median([r[key] for r in rounds]))
    figures["rounds"] = rounds
    return figures


def compute_per_edge(run: Run) -> float:
    """Median over every rank's non-warm-up steps of the step's compute seconds per edge."""
    values = [s.compute_s / s.edges for s in run.steps if not s.warmup and s.edges > 0]
    if not values:
        raise DataError(f"{run.path}: no non-warm-up step with edges in timing.jsonl")
    return float(np.median(values))


def by_round(figures: dict, key: str, run: Optional[str] = None, fmt: str = "{:.3f}") -> str:
    """`` (rounds: a b c)``: each round's ``key`` (of ``run``), nothing for one round."""
    rounds = figures["rounds"]
    if len(rounds) < 2:
        return ""
    values = [r[key] if run is None else r[key][run] for r in rounds]
    return f" (rounds: {' '.join(fmt.format(v) for v in values)})"


def table_lines(args: argparse.Namespace, figures: dict) -> list[str]:
    """The heading and the table of times per run."""
    epoch, sums, step = (figures[k] for k in ("epoch_s", "epoch_step_sum_s", "median_step_s"))
    count = len(figures["rounds"])
    rounds = f", {count} rounds in turn, medians" if count > 1 else ""
    return [
        f"\nGlobal batch {args.global_batch} graphs/step (np1-half: {args.global_batch // 2}), "
        "one thread per worker, "
        f"{args.epochs} epochs (first excluded){rounds}:",
        f"  {'run':<10}{'epoch s':>10}{'step sum s':>12}{'median step s':>16}",
        *(
            f"  {name:<10}{epoch[name]:>10.2f}{sums[name]:>12.2f}{step[name]:>16.4f}"
            f"{by_round(figures, 'epoch_s', name, '{:.2f}')}"
            for name in RUNS
            if name in epoch
        ),
    ]


def measure_round_ceiling(args: argparse.Namespace, common: Sequence[str], out: Path) -> None:
    """This machine's ceiling for 2 ranks (``bench ceiling --training-graphs``,
    ``CEILING_PAIRS`` pairs of ``CEILING_STEPS`` steps in turn) on a rank's share of a step,
    G/2 training graphs of mean size, with the runs' model settings (``common``'s ``model.``
    overrides), measured now into ``out``/ceiling.json."""
    config = load_config(resolve_config_path(args.config), [])
    training = (config.data.dataset_dir, args.global_batch / 2)
    model = [o for o in common if o.startswith("model.")]
    result = measure_ceiling(
        args.config, 2, 0, 0, CEILING_STEPS, overrides=model, rounds=CEILING_PAIRS,
        training=training,
    )  # fmt: skip
    write_json(out / "ceiling.json", result.figures())


def read_ceilings(args: argparse.Namespace) -> list[dict]:
    """The ceiling measured in each round (``round-<k>``/ceiling.json); for a bench from before
    per-round ceilings (no round has one), the one measured after all rounds (``--out``/
    ceiling.json) for every round, marked ``"in_round": False``. DataError naming a missing or
    unreadable file."""
    paths = [round_dir(args, k) / "ceiling.json" for k in range(1, args.rounds + 1)]
    in_round = any(p.exists() for p in paths) or not (Path(args.out) / "ceiling.json").exists()
    if not in_round:
        paths = [Path(args.out) / "ceiling.json"] * args.rounds
    ceilings = []
    for path in paths:
        try:
            fields = Ceiling.from_json(json.loads(path.read_text())).figures()
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataError(
                f"{path}: no ceiling measured ({err}); run without --report-only, or measure "
                "the round's alone: python -m hvdtrack.bench ceiling --training-graphs --graphs "
                f"{args.global_batch / 2:g} --rounds {CEILING_PAIRS} --repeats {CEILING_STEPS} "
                f"--json {path}"
            ) from None
        ceilings.append({**fields, "in_round": in_round})
    return ceilings


def efficiency_lines(figures: dict) -> list[str]:
    """The lines of the ceiling, the Horovod ranks' own contention, each strategy's
    efficiencies (and against the ceiling) and Horovod's overhead."""
    measured = figures["ceiling_measurements"]
    c = measured[0]
    when = "in each round, after np1-half" if c["in_round"] else "once, after the rounds"
    pairs = "; ".join(
        f"{', '.join(f'{1e3 * a:.0f}' for a in m['alone_s'])} ms alone, "
        f"{', '.join(f'{1e3 * max(t):.0f}' for t in m['together_s'])} ms two at once"
        for m in (measured if c["in_round"] else measured[:1])
    )
    lines = [
        f"  ceiling for 2 ranks here, measured {when}: a rank's step ({c['nodes']} nodes, "
        f"{c['edges']} edges, {c['graphs']} graphs) {pairs}, in turn -> t_alone/t_together "
        f"{figures['ceiling']:.3f}"
        f"{by_round(figures, 'ceiling') if c['in_round'] else ''}"
    ]
    per_edge = figures["compute_per_edge_s"]
    lines.append(
        "  the Horovod ranks' own contention: np1's compute per edge / np2's "
        f"{figures['horovod_own_contention']:.3f}{by_round(figures, 'horovod_own_contention')} "
        f"({1e6 * per_edge['np1']:.3f} / {1e6 * per_edge['np2']:.3f} us, median steps)"
    )
    for strategy, _, _ in STRATEGIES:
        key = f"{strategy}_strong_efficiency"
        on_epochs, on_sums, on_medians = (
            figures[f"{key}_{k}"] for k in ("epoch", "step_sum", "median_step")
        )
        of_ceiling = figures[f"{strategy}_of_ceiling_epoch"]
        against = f"; {of_ceiling:.3f} of the ceiling on epochs"
        lines.append(
            f"  {strategy} strong-scaling efficiency t1/(2*t2): {on_epochs:.3f} on epochs"
            f"{by_round(figures, f'{key}_epoch')}, "
            f"{on_sums:.3f} on the epochs' step sums ({100 * (on_sums / on_epochs - 1):+.1f}%), "
            f"{on_medians:.3f} on median steps ({100 * (on_medians / on_epochs - 1):+.1f}%)"
            f"{against}{by_round(figures, f'{strategy}_of_ceiling_epoch')}"
        )
    lines.append(
        f"  Horovod overhead on one rank: {100 * figures['horovod_overhead_epoch']:+.1f}% on "
        f"epochs{by_round(figures, 'horovod_overhead_epoch', fmt='{:+.1%}')} "
        f"({100 * figures['horovod_overhead_step']:+.1f}% on steps)"
    )
    return lines


def check_prediction(runs: dict[str, Run], ceiling: float) -> maths.Validation:
    """The scaling model's N = 2 prediction against one round's np2: fitted on its np1 and
    np1-half, with the ``ceiling`` for 2 ranks, over the ``shared-memory`` network."""
    (check,) = maths.validate_against(
        [runs["np1"], runs["np2"]],
        "strong",
        PRESETS["shared-memory"],
        ceilings={2: ceiling},
        also=[runs["np1-half"]],
    )
    return check


def prediction_figures(checks: Sequence[maths.Validation]) -> dict:
    """The rounds' checks of the prediction: the medians of their efficiencies and errors, then
    each round's check under "rounds"."""
    keys = ("predicted_efficiency", "measured_efficiency", "relative_error")
    figures = {k: float(np.median([getattr(c, k) for c in checks])) for k in keys}
    figures["rounds"] = [dataclasses.asdict(c) for c in checks]
    return figures


def prediction_lines(figures: dict, checks: Sequence[maths.Validation]) -> list[str]:
    """The prediction's error (``prediction_figures``' median, and each round's), then each
    round's terms."""
    rounds = f" (rounds: {' '.join(f'{c.relative_error:+.1%}' for c in checks)})"
    return [
        "  the scaling model at N=2, fitted on each round's np1 and np1-half, against np2 on "
        f"median steps: error {figures['relative_error']:+.1%}{rounds if len(checks) > 1 else ''}",
        *(f"    round {k}: {c.describe()}" for k, c in enumerate(checks, 1)),
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    common = common_overrides(args)
    if not args.report_only:
        subprocess.run(
            [sys.executable, "-m", "hvdtrack.prepare", "--config", args.config, "--no-progress"],
            check=True,
        )
    if not args.report_only:
        common += _one_keep_edge_term(args, common)
    runs = []
    for k in range(1, args.rounds + 1):
        dirs = round_runs(args, common, round_dir(args, k))
        runs.append({name: read_run(path) for name, path in dirs.items()})
    ceilings = read_ceilings(args)
    rounds = [measure(args, r, c["ceiling"]) for r, c in zip(runs, ceilings)]
    figures = combine(args, rounds)
    figures["ceiling_measurements"] = ceilings
    lines = [*table_lines(args, figures), *efficiency_lines(figures)]
    if all("np1-half" in r for r in runs):
        checks = [check_prediction(r, c["ceiling"]) for r, c in zip(runs, ceilings)]
        figures["prediction_n2"] = prediction_figures(checks)
        lines += prediction_lines(figures["prediction_n2"], checks)
    else:
        lines.append("  the scaling model at N=2: not checked, these rounds have no np1-half run")
    print("\n".join(lines))
    if args.json:
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
