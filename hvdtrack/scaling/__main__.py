"""Command line of the scaling studies: ``python -m hvdtrack.scaling run|report|predict|energy``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from hvdtrack.entry import QUIET, run
from hvdtrack.errors import ConfigError

EPILOG = """examples:
  python -m hvdtrack.scaling run --mode strong --np 1,2,4 --config tiny.yaml --global-batch 8
  python -m hvdtrack.scaling run --mode weak --np 1,2 --config tiny.yaml train.epochs=3
  python -m hvdtrack.scaling run --mode strong --np 4,8,16 --config c.yaml --launcher slurm \\
      --gpus-per-node 4 --setup "module load openmpi"
  python -m hvdtrack.scaling report runs/scaling/strong-np1 runs/scaling/strong-np2
  python -m hvdtrack.scaling predict runs/scaling/strong-np* --interconnect nvlink
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hvdtrack.scaling",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="launch a strong- or weak-scaling sweep, then report it")
    run.add_argument("--mode", required=True, choices=("strong", "weak"))
    run.add_argument("--np", required=True, help="worker counts, e.g. 1,2,4 (include 1)")
    run.add_argument("--config", required=True, help="the YAML run config")
    run.add_argument("--out", default="runs/scaling", help="output root (default: runs/scaling)")
    run.add_argument("--global-batch", type=int, help="strong: graphs per step over all workers")
    run.add_argument("--batch", type=int, help="weak: graphs per worker per step")
    run.add_argument("--launcher", choices=("local", "slurm"), default="local")
    run.add_argument(
        "--controller",
        choices=("gloo", "mpi"),
        default="gloo",
        help="horovodrun controller for local runs (default gloo)",
    )
    run.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    run.add_argument("--skip-prepare", action="store_true", help="the dataset is prepared already")
    run.add_argument(
        "--skip-finished",
        action="store_true",
        help="do not re-run N whose run directory holds a finished run",
    )
    run.add_argument("--python", default=sys.executable, help="interpreter for the runs")
    slurm = run.add_argument_group("SLURM (--launcher slurm)")
    slurm.add_argument("--tasks-per-node", type=int)
    slurm.add_argument("--gpus-per-node", type=int)
    slurm.add_argument("--cpus-per-task", type=int)
    slurm.add_argument("--time", default="01:00:00")
    slurm.add_argument("--partition")
    slurm.add_argument("--account")
    slurm.add_argument("--srun-mpi", default="pmix", help="srun --mpi plugin (default pmix)")
    slurm.add_argument(
        "--setup",
        action="append",
        default=[],
        help="shell line before srun, e.g. 'module load openmpi' (repeatable)",
    )
    run.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="config overrides for every training run (after the options)",
    )

    report = sub.add_parser(
        "report",
        help="one run: its report (epochs and where their time went); several runs: the "
        "scaling tables (md, csv, json) and plots",
    )
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    report.add_argument(
        "--mode",
        choices=("strong", "weak"),
        help="default: strong if the global batch is the same in all runs, "
        "weak if the per-worker batch is",
    )
    report.add_argument(
        "--out",
        help="output directory (default: RUN_DIR/report for one run, <parent>/report-<mode>)",
    )
    report.add_argument(
        "--price-per-device-hour",
        type=float,
        help="replaces scaling.price_per_device_hour of the runs' config",
    )
    report.add_argument(
        "--device-power-watts",
        type=float,
        help="replaces scaling.device_power_watts (for runs without energy)",
    )
    _measured_network_option(report)

    pred = sub.add_parser("predict", help="predicted efficiency at N = 8..1024 from measured runs")
    pred.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="the sweep's runs (with N=1)")
    pred.add_argument("--mode", choices=("strong", "weak"))
    pred.add_argument(
        "--interconnect",
        choices=("nvlink", "infiniband-hdr", "ethernet-25g", "shared-memory", "custom"),
        help="default: scaling.interconnect of the N=1 run's config",
    )
    pred.add_argument("--bandwidth-gbps", type=float, help="link bandwidth, gigabits/s")
    pred.add_argument("--latency-us", type=float, help="per-message latency, microseconds")
    pred.add_argument("--ns", default="8,16,32,64,128,256,512,1024", help="worker counts")
    _measured_network_option(pred)

    summary = sub.add_parser("summary", help="the report of one run: epochs, steps, cost, energy")
    summary.add_argument("run_dir", metavar="RUN_DIR")
    summary.add_argument("--out", default=None, help="output directory (default: RUN_DIR/report)")

    energy = sub.add_parser("energy", help="which power counters this machine exposes")
    energy.add_argument(
        "--measure",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also meter this many seconds of (idle) time",
    )
    energy.add_argument("--device-kind", default="cpu-core")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs one subcommand; returns its exit code (``hvdtrack.entry.run`` turns errors into one
    message and an exit code)."""
    args = build_parser().parse_args(argv)
    command = {
        "run": _run,
        "report": _report,
        "predict": _predict,
        "summary": _summary,
        "energy": _energy,
    }[args.command]
    return command(args)


def _measured_network_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--measured-network",
        default="shared-memory",
        choices=("nvlink", "infiniband-hdr", "ethernet-25g", "shared-memory"),
        help="the network the measured runs used, to check the model against "
        "them (default shared-memory: one host)",
    )


def _run(args: argparse.Namespace) -> int:
    from hvdtrack.scaling import sweep

    plan = sweep.plan_sweep(
        args.mode,
        sweep.parse_worker_counts(args.np),
        args.config,
        args.out,
        global_batch=args.global_batch,
        batch=args.batch,
        controller="mpi" if args.launcher == "slurm" else args.controller,
        overrides=args.overrides,
        python=args.python,
    )
    if args.launcher == "slurm":
        options = sweep.SlurmOptions(
            tasks_per_node=args.tasks_per_node,
            gpus_per_node=args.gpus_per_node,
            cpus_per_task=args.cpus_per_task,
            time=args.time,
            partition=args.partition,
            account=args.account,
            srun_mpi=args.srun_mpi,
            setup=tuple(args.setup),
        )
        sweep.write_slurm_scripts(plan, options, python=args.python, dry_run=args.dry_run)
        return 0
    sweep.run_sweep(
        plan,
        dry_run=args.dry_run,
        skip_prepare=args.skip_prepare,
        skip_finished=args.skip_finished,
        python=args.python,
    )
    return 0


def _report(args: argparse.Namespace) -> int:
    from hvdtrack.scaling import report

    if len(args.run_dirs) == 1:  # one run: its own report, epoch accounting included
        args.run_dir = args.run_dirs[0]
        return _summary(args)
    runs = report.load_runs(args.run_dirs)
    overrides = {
        key: value
        for key, value in (
            ("price_per_device_hour", args.price_per_device_hour),
            ("device_power_watts", args.device_power_watts),
        )
        if value is not None
    }
    result = report.build_report(
        runs, args.mode, measured_network=args.measured_network, scaling_overrides=overrides
    )
    out = args.out or Path(args.run_dirs[0]).absolute().parent / f"report-{result.mode}"
    paths = report.write_report(result, out)
    print(Path(paths["md"]).read_text())
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    import dataclasses

    from hvdtrack.scaling import predict, report, sweep

    runs = report.load_runs(args.run_dirs)
    built = report.build_report(runs, args.mode, measured_network=args.measured_network)
    baseline = next(r for r in runs if r.num_workers == 1)
    compute_s, gradient_bytes, note = predict.baseline_inputs(baseline)
    scaling = built.scaling
    if args.interconnect is not None:
        if args.interconnect == "custom" and (
            args.bandwidth_gbps is None or args.latency_us is None
        ):
            raise ConfigError("--interconnect custom needs --bandwidth-gbps and --latency-us")
        scaling = dataclasses.replace(scaling, interconnect=args.interconnect)
    scaling = dataclasses.replace(
        scaling,
        bandwidth_gbps=args.bandwidth_gbps
        if args.bandwidth_gbps is not None
        else scaling.bandwidth_gbps,
        latency_us=args.latency_us if args.latency_us is not None else scaling.latency_us,
    )
    network = predict.network_from_config(scaling)
    ns = sweep.parse_worker_counts(args.ns)
    print(
        f"{built.mode} scaling of {built.config_name}: single-worker step {compute_s * 1e3:.2f} ms "
        f"without exchange, {gradient_bytes:,} gradient bytes" + (f" ({note})" if note else "")
    )
    print(f"network {network.name}: {network.bandwidth_gbps:g} Gb/s, {network.latency_us:g} us")
    print(f"{'N':>6} {'compute ms':>11} {'allreduce ms':>13} {'step ms':>9} {'efficiency':>11}")
    for p in predict.predict_scaling(compute_s, gradient_bytes, network, built.mode, ns):
        print(
            f"{p.n:>6} {p.compute_s * 1e3:>11.3f} {p.allreduce_s * 1e3:>13.3f} "
            f"{p.step_s * 1e3:>9.3f} {p.efficiency:>11.3f}"
        )
    print("checked against the runs measured here:")
    for v in built.validation or []:
        print(f"  {v.describe()}")
    if not built.validation:
        print("  (no multi-worker run given)")
    return 0


def _summary(args: argparse.Namespace) -> int:
    from hvdtrack.scaling.report import write_summary

    path = write_summary(args.run_dir, args.out)
    print(path.read_text())
    print(f"written: {path} and {path.with_suffix('.json')}")
    return 0


def _energy(args: argparse.Namespace) -> int:
    import time

    from hvdtrack.scaling.config import ScalingConfig
    from hvdtrack.scaling.energy import EnergyMeter, probe_energy_sources

    for source, state in probe_energy_sources().items():
        print(f"{source}: {state}")
    if args.measure > 0:
        meter = EnergyMeter(ScalingConfig(device_kind=args.device_kind))
        meter.start()
        time.sleep(args.measure)
        reading = meter.stop()
        print(
            f"metered {reading.seconds:.1f} s: {reading.joules:.1f} J, {reading.watts:.1f} W "
            f"({reading.source}: {reading.detail})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(run(main, settings=QUIET))
