"""The construction report of a prepared dataset: rows, counts per split, report.md, report.json.

A graph's row holds its nodes, edges, true edges, true segments and lost segments; the rows of
a split, gathered column by column (``empty_counts``, ``add_row``), become its
``ConstructionReport``. ``write_report`` writes report.md, report.json and ``PREPARE_INFO``
(what ``stale_reason`` reads) into the dataset being built.

Public symbols: ``Counts``, ``report_row``, ``empty_counts``, ``add_row``, ``write_report``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from hvdtrack.config import Config, DataConfig, config_to_dict
from hvdtrack.graphs.report import ConstructionReport
from hvdtrack.prepare.jobs import PREPARE_INFO, SplitJobs, fingerprint, keep_or_remove_events
from hvdtrack.records.manifest import GraphInfo, Manifest
from hvdtrack.utils.io import atomic_write, write_json

# Split name -> the report's five columns (``report_row``), one value per graph.
Counts = dict[str, list[list[int]]]


def report_row(info: GraphInfo, segments: tuple[int, int]) -> tuple[int, ...]:
    """A graph's counts for the construction report: nodes, edges, true edges, true segments
    and the true segments no layer pair can form (``segments``: the last two)."""
    return info.num_nodes, info.num_edges, info.num_true_edges, *segments


def empty_counts(split_names: Iterable[str]) -> Counts:
    """No graph counted yet in any of the splits."""
    return {name: [[], [], [], [], []] for name in split_names}


def add_row(columns: list[list[int]], row: tuple[int, ...]) -> None:
    """Appends a graph's ``report_row`` to the report's columns of its split."""
    for column, value in zip(columns, row):
        column.append(value)


def write_report(
    config: Config,
    out: Path,
    planned: SplitJobs,
    counts: Counts,
    elapsed: float,
    workers: int,
    ranks: int,
    manifest: Manifest,
) -> dict:
    """Writes report.md, report.json and prepare.json into ``out`` (the events' CSVs removed
    or completed, ``keep_or_remove_events``); prints the markdown and returns the report.

    prepare.json records what ``stale_reason`` compares (the data config, the input files
    ``planned`` read) and the shard files written (``check_replaceable``'s proof when the
    manifest is broken)."""
    data = config.data
    num_events, splits = len(planned.jobs), planned.splits
    keep_or_remove_events(data, out)
    per_split = {name: ConstructionReport.from_counts(*c) for name, c in counts.items() if c[0]}
    total = ConstructionReport.merge(per_split.values())
    report = {
        "dataset_dir": str(Path(data.dataset_dir)),
        "source": data.source,
        "events": num_events,
        "events_per_split": {name: int(len(ids)) for name, ids in splits.items()},
        "seconds": round(elapsed, 3),
        "events_per_second": round(num_events / elapsed, 3) if elapsed > 0 else None,
        "workers": workers,
        "ranks": ranks,
        "all": total.to_dict(),
        "splits": {name: r.to_dict() for name, r in per_split.items()},
        "shards": len(manifest.shards),
    }
    markdown = _markdown(report, per_split, total, data)
    with atomic_write(out / "report.md") as f:
        f.write(markdown)
    write_json(out / "report.json", report)
    write_json(
        out / PREPARE_INFO,
        {
            "data": fingerprint(config),
            "inputs": planned.inputs,
            "files": [s.file for s in manifest.shards],
            "report": report,
            "config": config_to_dict(config),
        },
    )
    print(markdown, flush=True)
    return report


def _markdown(report: dict, per_split: dict, total: ConstructionReport, data: DataConfig) -> str:
    g = data.graph
    lines = [
        f"# Dataset {report['dataset_dir']}",
        "",
        f"{report['events']} {data.source} events -> {total.num_graphs} graphs in "
        f"{report['seconds']:.1f} s ({report['events_per_second']} events/s, {report['workers']} workers"
        + (f" on {report['ranks']} MPI ranks)." if report.get("ranks", 1) > 1 else ")."),
        f"Cuts: pT > {g.pt_min} GeV, {'barrel only' if g.barrel_only else 'whole detector'}, "
        f"|dphi/dr| < {g.phi_slope_max}, |z0| < {g.z0_max} mm, "
        f"{g.n_phi_sections} x {g.n_eta_sections} sections.",
        "",
        "| split | graphs | nodes mean | nodes max | edges mean | edges max | efficiency | purity "
        "| lost segments | efficiency (all) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in [*per_split.items(), ("all", total)]:
        lines.append(
            f"| {name} | {r.num_graphs} | {r.nodes_mean:.0f} | {r.nodes_max} | {r.edges_mean:.0f} | "
            f"{r.edges_max} | {r.efficiency:.4f} | {r.purity:.4f} | {r.num_lost_segments} | "
            f"{r.efficiency_all_segments:.4f} |"
        )
    lines += [
        "",
        "efficiency = true segments kept by the cuts / true consecutive segments on adjacent "
        "layer pairs; lost segments = true consecutive segments on layers that are not an "
        "adjacency pair (a layer skipped), which no edge can hold; efficiency (all) counts them "
        "too; purity = true edges / edges.",
        "",
    ]
    return "\n".join(lines)
