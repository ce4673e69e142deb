"""Benchmark of the data side on one core: event generation, TrackML CSV write/read, graph building.

    python -m hvdtrack.bench.construct                       # full default event, 5 repeats
    python -m hvdtrack.bench.construct --repeats 7 --json construct.json
    python -m hvdtrack.bench construct --compare-real [--events 2]   # synthetic vs real table

Generates one full default synthetic event (6,000 primaries, ~100k hits), then times, each as
the median (min, max) of ``--repeats`` runs after one warm-up run: ``generate_event``;
``write_event`` and ``read_event`` for plain and gzip CSVs; and ``build_hit_graphs`` for
(a) the default construction (barrel only, pT > 1 GeV), also cut into 8 x 2 sections, and
(b) the whole detector with no pT cut (every hit, noise included), at the default cuts and with
a phi-slope cut loose enough for low-pT particles; the whole detector at pT > 1 GeV sits in
between. For each construction it prints nodes, edges, efficiency and purity.
The issue's goal is a full ~100k-hit event turned into graphs in <= 2 s on one core.

``--compare-real`` instead prints the figures of default synthetic events beside the real-event
figures of ``shared/design/physics.md`` (``hvdtrack.graphs.realism``), as a Markdown table.

The process pins itself to one thread (OMP/OpenBLAS/MKL variables set before numpy is imported);
the code measured is plain numpy and pandas anyway.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Optional, Sequence  # noqa: E402

from hvdtrack.events.synthetic import SyntheticConfig, generate_event  # noqa: E402
from hvdtrack.events.trackml import Event, read_event, write_event  # noqa: E402
from hvdtrack.graphs import realism  # noqa: E402
from hvdtrack.graphs.construction import GraphConfig, build_hit_graphs  # noqa: E402
from hvdtrack.graphs.report import ConstructionReport  # noqa: E402
from hvdtrack.utils.io import write_json  # noqa: E402

GOAL_SECONDS = 2.0
CONSTRUCTIONS = {
    "barrel, pT > 1 GeV (default)": GraphConfig(),
    "barrel, pT > 1 GeV, 8 x 2 sections": GraphConfig(n_phi_sections=8, n_eta_sections=2),
    # configs/barrel_pt05.yaml: the looser phi slope keeps 99% of the pT > 0.5 GeV segments.
    "barrel, pT > 0.5 GeV, phi slope 0.0008": GraphConfig(pt_min=0.5, phi_slope_max=0.0008),
    "whole detector, pT > 1 GeV": GraphConfig(barrel_only=False),
    "whole detector, no pT cut (all hits)": GraphConfig(barrel_only=False, pt_min=0.0),
    # A looser phi slope (pT >~ 0.2 GeV at the first layers) for graphs meant for all particles.
    "whole detector, no pT cut, phi slope 0.0015": GraphConfig(
        barrel_only=False, pt_min=0.0, phi_slope_max=0.0015
    ),
}


@dataclasses.dataclass
class Timing:
    """Seconds of each timed run (the warm-up run excluded): wall clock, and the process's CPU
    time (steadier on a machine shared with other work)."""

    seconds: list[float]
    cpu_seconds: list[float] = dataclasses.field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def text(self) -> str:
        cpu = f", cpu {statistics.median(self.cpu_seconds):.3f} s" if self.cpu_seconds else ""
        return (
            f"{self.median:8.3f} s  (min {min(self.seconds):.3f}, max {max(self.seconds):.3f}, "
            f"n={len(self.seconds)}{cpu})"
        )


def time_runs(fn: Callable[[], Any], repeats: int) -> tuple[Timing, Any]:
    """Runs ``fn`` once to warm up, then ``repeats`` times; returns the timings and last result."""
    result = fn()
    seconds, cpu_seconds = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        result = fn()
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)
    return Timing(seconds, cpu_seconds), result


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line; a usage error (exit status 2) if ``--repeats`` is below 1."""
    parser = argparse.ArgumentParser(
        prog="python -m hvdtrack.bench.construct", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs after one warm-up")
    parser.add_argument("--num-particles", type=int, default=SyntheticConfig.num_particles)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None, help="write every timing and figure here")
    parser.add_argument(
        "--compare-real",
        action="store_true",
        help="print default synthetic events beside the real-event figures instead",
    )
    parser.add_argument("--events", type=int, default=2, help="events for --compare-real")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def compare_real(args: argparse.Namespace, cfg: SyntheticConfig) -> None:
    """Prints ``--events`` synthetic events beside the real-event figures, as a Markdown table."""
    events = (generate_event(cfg, 1000 + i, args.seed) for i in range(args.events))
    print(
        f"{args.events} synthetic event(s) of {args.num_particles} primaries, seed "
        f"{args.seed}; barrel graphs, default cuts, double hits removed unless stated"
    )
    print(realism.markdown_table(realism.compare(events)))


def record(records: dict[str, Any], name: str, timing: Timing) -> None:
    """Keeps the seconds of ``timing`` under ``name`` in ``records`` and prints its line."""
    records["timings"][name] = timing.seconds
    print(f"  {name:<44s} {timing.text()}")


def time_generation(
    cfg: SyntheticConfig, seed: int, repeats: int, records: dict[str, Any]
) -> Event:
    """Times ``generate_event``; prints the event's size and the timing; returns the event."""
    timing, event = time_runs(lambda: generate_event(cfg, 1000, seed), repeats)
    num_noise = int((event.truth.particle_id == 0).sum())
    print(
        f"event: {len(event.hits):,} hits ({num_noise:,} noise), {len(event.particles):,} particles"
    )
    record(records, "generate_event", timing)
    return event


def time_csv(event: Event, repeats: int, records: dict[str, Any]) -> None:
    """Times ``write_event`` then ``read_event`` for plain and gzip CSVs in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="hvdtrack-bench-") as tmp:
        for compress in (False, True):
            kind = "csv.gz" if compress else "csv"
            timing, prefix = time_runs(
                lambda c=compress: write_event(event, tmp, compress=c), repeats
            )
            record(records, f"write_event ({kind})", timing)
            timing, _ = time_runs(lambda p=prefix: read_event(p), repeats)
            record(records, f"read_event ({kind})", timing)


def time_constructions(event: Event, repeats: int, records: dict[str, Any]) -> None:
    """Times ``build_hit_graphs`` for each of ``CONSTRUCTIONS``; prints and keeps its graphs'
    figures and whether it meets the goal."""
    print(f"build_hit_graphs (goal: <= {GOAL_SECONDS:.0f} s per ~100k-hit event, one core):")
    for name, graph_cfg in CONSTRUCTIONS.items():
        timing, graphs = time_runs(lambda g=graph_cfg: build_hit_graphs(event, g), repeats)
        report = ConstructionReport.from_graphs(graphs)
        verdict = "meets" if timing.median <= GOAL_SECONDS else "MISSES"
        record(records, f"{name}", timing)
        print(
            f"      {report.num_graphs} graph(s), nodes {report.num_nodes:,} (max {report.nodes_max:,}), "
            f"edges {report.num_edges:,} (max {report.edges_max:,}), "
            f"efficiency {report.efficiency:.4f}, purity {report.purity:.4f}; {verdict} the goal"
        )
        records["graphs"][name] = report.to_dict()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the benchmark (or ``--compare-real``) described in the module docstring."""
    args = parse_args(argv)
    cfg = SyntheticConfig(num_particles=args.num_particles)
    if args.compare_real:
        compare_real(args, cfg)
        return 0
    threads = {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    print(
        f"hvdtrack.bench.construct: {args.num_particles} particles, seed {args.seed}, "
        f"{args.repeats} repeats after 1 warm-up, threads {threads}"
    )
    records: dict[str, Any] = {"args": vars(args), "timings": {}, "graphs": {}}
    event = time_generation(cfg, args.seed, args.repeats, records)
    time_csv(event, args.repeats, records)
    time_constructions(event, args.repeats, records)
    if args.json:
        write_json(args.json, records)
        print(f"timings written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
