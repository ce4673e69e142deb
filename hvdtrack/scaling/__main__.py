"""Command line of the scaling studies: ``python -m hvdtrack.scaling run|report|predict|energy``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Optional, Sequence, get_args

from hvdtrack.entry import QUIET, run
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.scaling.config import Interconnect, ScalingConfig

EPILOG = """examples:
  python -m hvdtrack.scaling run --mode strong --np 1,2,4 --config tiny.yaml --global-batch 8
  python -m hvdtrack.scaling run --mode weak --np 1,2 --config tiny.yaml train.epochs=3
  python -m hvdtrack.scaling run --mode strong --np 4,8,16 --config c.yaml --launcher slurm \\
      --gpus-per-node 4 --setup "module load openmpi"
  python -m hvdtrack.scaling report runs/scaling/strong-np1 runs/scaling/strong-np2
  python -m hvdtrack.scaling report runs/tiny          # one run: its own report (also: summary)
  python -m hvdtrack.scaling predict runs/scaling/strong-np* --interconnect nvlink
  python -m hvdtrack.scaling predict runs/scaling/strong-np* --ceiling 2=0.85 --ranks-per-host 2
"""
NETWORKS = get_args(Interconnect)[:-1]  # the presets (not "custom")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hvdtrack.scaling",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    runs = argparse.ArgumentParser(add_help=False)  # what report and predict share
    runs.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="runs of one config, N=1 too")
    runs.add_argument("--mode", choices=("strong", "weak"), help="default: from the batches")
    runs.add_argument("--measured-network", default="shared-memory", choices=NETWORKS)
    runs.add_argument(
        "--ceiling",
        default="",
        metavar="R=C,...",
        help="contention ceiling C (bench distributed's t_alone / t_concurrent) with R ranks per "
        "host, e.g. 2=0.85; default: 1.0 (no contention)",
    )
    runs.add_argument(
        "--fit-also",
        nargs="+",
        default=[],
        metavar="RUN_DIR",
        help="more single-worker runs of the same model with another batch (a weak sweep's N=1): "
        "their steps join the fit of the fixed and per-edge cost",
    )

    def command(name, text, **kwargs):
        return sub.add_parser(name, help=text, description=text, **kwargs)

    run = command("run", "launch a strong- or weak-scaling sweep, then report it")
    run.add_argument("--mode", required=True, choices=("strong", "weak"))
    run.add_argument("--np", required=True, help="worker counts, e.g. 1,2,4 (include 1)")
    run.add_argument("--config", required=True, help="the YAML run config")
    run.add_argument("--out", default="runs/scaling", help="output root (default: runs/scaling)")
    run.add_argument("--global-batch", type=int, help="strong: graphs per step over all workers")
    run.add_argument("--batch", type=int, help="weak: graphs per worker per step")
    run.add_argument("--launcher", choices=("local", "slurm"), default="local")
    run.add_argument("--controller", choices=("gloo", "mpi"), default="gloo", help="horovodrun's")
    run.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    run.add_argument("--skip-prepare", action="store_true", help="the dataset is prepared already")
    run.add_argument("--skip-finished", action="store_true", help="local: keep finished runs")
    run.add_argument("--python", default=sys.executable, help="interpreter for the runs")
    slurm = run.add_argument_group("SLURM (--launcher slurm; unset: the batch scripts' defaults)")
    for flag in ("--tasks-per-node", "--gpus-per-node", "--cpus-per-task"):
        slurm.add_argument(flag, type=int)
    for flag in ("--time", "--partition", "--account"):
        slurm.add_argument(flag)
    slurm.add_argument("--setup", action="append", default=[], help="shell line run before sbatch")
    run.add_argument("overrides", nargs="*", metavar="section.key=value", help="for every run")

    report = command(
        "report",
        "one run: its report (epochs and where their time went); several runs: the scaling "
        "tables (md, csv, json) and plots",
        aliases=["summary"],
        parents=[runs],
    )
    report.add_argument("--out", help="default: RUN_DIR/report for one run, <parent>/report-<mode>")
    report.add_argument("--price-per-device-hour", type=float, help="replaces the runs' config's")
    report.add_argument("--device-power-watts", type=float, help="replaces the runs' config's")

    pred = command(
        "predict", "predicted efficiency at N = 8..1024 from measured runs", parents=[runs]
    )
    pred.add_argument("--interconnect", choices=(*NETWORKS, "custom"), help="default: the config's")
    pred.add_argument("--bandwidth-gbps", type=float, help="link bandwidth, gigabits/s")
    pred.add_argument("--latency-us", type=float, help="per-message latency, microseconds")
    pred.add_argument("--ns", default="8,16,32,64,128,256,512,1024", help="worker counts")
    pred.add_argument(
        "--ranks-per-host", type=int, default=1, help="of the predicted machine (its ceiling)"
    )

    energy = command("energy", "which power counters this machine exposes")
    energy.add_argument("--measure", type=float, default=0.0, metavar="S", help="meter idle time")
    energy.add_argument("--device-kind", default="cpu-core")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs one subcommand; returns its exit code (``hvdtrack.entry.run`` reports errors)."""
    args = build_parser().parse_args(argv)
    commands = {"run": _run, "report": _report, "summary": _report, "predict": _predict}
    {**commands, "energy": _energy}[args.command](args)
    return 0


def _given(args: argparse.Namespace, *names: str) -> dict:
    return {k: getattr(args, k) for k in names if getattr(args, k) is not None}


def _run(args: argparse.Namespace) -> None:
    from hvdtrack.scaling import sweep

    keys = ("global_batch", "batch", "controller", "overrides", "python")
    nps = sweep.parse_worker_counts(args.np)
    plan = sweep.plan_sweep(args.mode, nps, args.config, args.out, **_given(args, *keys))
    if args.launcher == "local":
        skip = {"skip_prepare": args.skip_prepare, "skip_finished": args.skip_finished}
        sweep.run_sweep(plan, dry_run=args.dry_run, **skip)
        return
    fields = [f.name for f in dataclasses.fields(sweep.SlurmOptions)]
    options = sweep.SlurmOptions(**{**{k: getattr(args, k) for k in fields}, "setup": args.setup})
    sweep.write_slurm_scripts(plan, options, skip_prepare=args.skip_prepare, dry_run=args.dry_run)


def _report(args: argparse.Namespace) -> None:
    from hvdtrack.scaling import report

    if len(args.run_dirs) == 1:  # one run: its own report, epoch accounting included
        path = report.write_summary(args.run_dirs[0], args.out)
        print(f"{path.read_text()}\nwritten: {path} and {path.with_suffix('.json')}")
        return
    given = _given(args, "price_per_device_hour", "device_power_watts")
    result = report.build_report(args.run_dirs, args.mode, args.measured_network, given,
                                 ceilings=_ceilings(args.ceiling), fit_also=args.fit_also)  # fmt: skip
    out = args.out or Path(args.run_dirs[0]).absolute().parent / f"report-{result.mode}"
    paths = report.write_report(result, out)
    print(f"{paths['md'].read_text()}\nwrote {', '.join(map(str, paths.values()))}")


def _predict(args: argparse.Namespace) -> None:
    import pandas as pd

    from hvdtrack.scaling import maths, network, report, sweep

    if args.interconnect == "custom" and None in (args.bandwidth_gbps, args.latency_us):
        raise ConfigError("--interconnect custom needs --bandwidth-gbps and --latency-us")
    ceilings = _ceilings(args.ceiling)
    given = _given(args, "interconnect", "bandwidth_gbps", "latency_us")
    built = report.build_report(
        args.run_dirs,
        args.mode,
        args.measured_network,
        given,
        ceilings=ceilings,
        fit_also=args.fit_also,
    )
    if built.prediction is None:  # a note says why
        raise DataError(next(n for n in built.notes if n.startswith("no prediction")))
    model = maths.StepModel(**built.prediction["model"])
    link = network.network_from_config(built.scaling)
    ceiling = ceilings.get(args.ranks_per_host, 1.0)
    print(
        f"{built.mode} scaling of {built.config_name}: single-worker step {model.step_s * 1e3:.2f}"
        f" ms without exchange = fixed {model.fixed_s * 1e3:.2f} ms + "
        f"{model.per_edge_s:.3g} s/edge x {sum(model.edges) / len(model.edges):,.0f} edges;"
        f" {model.gradient_bytes:,} gradient bytes, Horovod cycle {model.cycle_s * 1e3:g} ms, "
        f"fusion {model.fusion_bytes / 2**20:g} MiB; ceiling {ceiling:g} "
        f"({args.ranks_per_host} rank(s) per host)"
    )
    sizes = (model.gradient_bytes, model.cycle_s, model.fusion_bytes)
    own, two = (maths.cycle_wait(*sizes, n) * 1e3 for n in (1, 2))
    print(
        f"N=1 exchange: measured {model.exchange_s * 1e3:.2f} ms (the model's N=1 step holds "
        f"it); N>1: the cycle's wait {own:.2f} ms for the last rank's own loop, {two:.2f} ms in "
        f"all with the latest loop's lag at N=2, tending to {own + model.cycle_s / 2 * 1e3:.2f} "
        "ms as N grows"
    )
    for note in model.notes:
        print(f"  note: {note}")
    print(f"network {link.name}: {link.bandwidth_gbps:g} Gb/s, {link.latency_us:g} us")
    ns = sweep.parse_worker_counts(args.ns)
    preds = maths.predict_scaling(model, link, built.mode, ns, ceiling)
    table = pd.DataFrame(map(dataclasses.asdict, preds))
    terms = ("compute", "fixed", "straggler", "cycle", "allreduce", "step")
    ms = {f"{t}_s": f"{t} ms" for t in terms}
    table[list(ms)] *= 1e3
    print(table.rename(columns={"n": "N", **ms}).to_string(index=False, float_format="%.3f"))
    print("checked against the runs measured here:")
    for line in [v.describe() for v in built.validation] or ["(no multi-worker run given)"]:
        print(f"  {line}")


def _ceilings(text: str) -> dict[int, float]:
    """``"2=0.85,4=0.7"`` -> {2: 0.85, 4: 0.7}; ConfigError naming the bad item."""
    out = {}
    for item in filter(None, text.split(",")):
        ranks, _, value = item.partition("=")
        try:
            out[int(ranks)] = float(value)
        except ValueError:
            raise ConfigError(
                f"--ceiling: '{item}' is not RANKS_PER_HOST=CEILING (e.g. 2=0.85)"
            ) from None
        if not 0 < out[int(ranks)]:
            raise ConfigError(f"--ceiling: '{item}': the ceiling must be > 0")
    return out


def _energy(args: argparse.Namespace) -> None:
    import time

    from hvdtrack.runs.energy import EnergyMeter, probe_energy_sources

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


if __name__ == "__main__":
    sys.exit(run(main, settings=QUIET))
