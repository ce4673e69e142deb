"""The Markdown of the reports: ``render_summary`` (one run) and ``render_markdown`` (a sweep)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from hvdtrack.scaling.report import ScalingReport, ScalingRow


def _fixed_column(attribute: str, digits: int) -> Callable[[ScalingRow], str]:
    return lambda row: _fixed(getattr(row, attribute), digits)


# Column title -> the cell of a ScalingRow; the sweep report's tables pick from these.
COLUMNS: dict[str, Callable[[ScalingRow], str]] = {
    "N": lambda r: str(r.n),
    "batch/worker": lambda r: str(r.batch_graphs),
    "global batch": lambda r: str(r.global_batch_graphs),
    "epoch s": _fixed_column("epoch_s", 2),
    "speedup": _fixed_column("speedup", 3),
    "efficiency": _fixed_column("efficiency", 3),
    "batch s": _fixed_column("batch_s", 4),
    "batch s (median)": _fixed_column("batch_s", 4),
    "std": _fixed_column("batch_std_s", 4),
    "min": _fixed_column("batch_min_s", 4),
    "max": _fixed_column("batch_max_s", 4),
    "data wait s": _fixed_column("data_s", 4),
    "exchange s": _fixed_column("exchange_s", 4),
    "graphs/s": lambda r: _sig(r.graphs_per_s),
    "graphs/s/worker": lambda r: _sig(r.graphs_per_s_per_worker),
    "cost/epoch": lambda r: _money(r.cost_per_epoch),
    "energy/epoch": lambda r: f"{_energy(r.energy_per_epoch_j)} ({r.energy_source})",
    "val loss": _fixed_column("val_loss", 4),
    "AUC": _fixed_column("auc", 3),
    "edge eff.": _fixed_column("edge_efficiency", 3),
    "purity": _fixed_column("purity", 3),
    "accuracy": _fixed_column("accuracy", 3),
}
TABLES = {
    "strong": ("N", "epoch s", "speedup", "efficiency", "cost/epoch", "energy/epoch"),
    "weak": ("N", "efficiency", "edge eff.", "purity", "AUC", "val loss", "epoch s", "batch s"),
    "detail": (
        "N",
        "batch/worker",
        "global batch",
        "batch s (median)",
        "std",
        "min",
        "max",
        "data wait s",
        "exchange s",
        "graphs/s",
        "graphs/s/worker",
        "cost/epoch",
        "energy/epoch",
    ),
    "physics": ("N", "val loss", "AUC", "edge eff.", "purity", "accuracy"),
}
# The per-epoch accounting of one run: column title -> key of timing.epoch_accounts' rows.
ACCOUNT_COLUMNS = {
    "wall": "wall_s",
    "train": "time_s",
    "data": "data_s",
    "compute": "compute_s",
    "exchange": "exchange_s",
    "of it wait": "wait_s",
    "pipeline": "pipeline_s",
    "validation": "validation_s",
    "checkpoint": "checkpoint_s",
    "summaries": "summaries_s",
    "records": "records_s",
    "rest": "rest_s",
}


def render_markdown(report: ScalingReport) -> str:
    """The text of a sweep's report.md."""
    s, rows, mode = report.scaling, report.rows, report.mode
    lines = [
        f"# {mode.capitalize()} scaling: {report.config_name}",
        "",
        f"Runs: N = {', '.join(str(r.n) for r in rows)} ({s.devices_per_worker} {s.device_kind} "
        "per worker); "
        + (
            f"global batch {rows[0].global_batch_graphs} graphs per step."
            if mode == "strong"
            else f"batch {rows[0].batch_graphs} graphs per worker per step."
        ),
        f"Cost at ${s.price_per_device_hour:g} per {s.device_kind}-hour "
        "(scaling.price_per_device_hour); energy per epoch = mean power x epoch s.",
        "",
        "Speedup = t1/tN and efficiency = t1/(N tN) on epoch s (median over timed epochs "
        "of the slowest rank)."
        if mode == "strong"
        else "Efficiency = t1/tN on batch s (median non-warm-up step of the slowest rank); "
        "edge eff., purity, AUC and val loss are the final validation metrics.",
        "",
        *_rows_table(rows, TABLES[mode]),
        "",
        "## Steps and throughput",
        "",
        *_rows_table(rows, TABLES["detail"]),
    ]
    if mode == "strong":
        lines += ["", "## Physics of each run (final validation)", ""]
        lines += _rows_table(rows, TABLES["physics"])
    lines += ["", "## Beyond this machine: predicted efficiency (ring allreduce model)", ""]
    p = report.prediction
    if p is None:
        lines.append("Not available (see notes).")
    else:
        lines += [
            f"From the single-worker step without exchange, {p['step_compute_s'] * 1e3:.2f} ms, "
            f"and {p['gradient_bytes']:,} gradient bytes per step; allreduce "
            "t(N) = 2(N-1)/N bytes/bandwidth + 2(N-1) latency, no overlap with compute"
            + ("; compute per worker taken as t1/N." if mode == "strong" else "."),
            "",
        ]
        names = list(p["efficiency"])
        header = ["N"] + [
            f"{name} ({p['networks'][name]['bandwidth_gbps']:g} Gb/s, "
            f"{p['networks'][name]['latency_us']:g} us)"
            for name in names
        ]
        body = [
            [str(pred["n"])] + [_fixed(p["efficiency"][name][i]["efficiency"], 3) for name in names]
            for i, pred in enumerate(p["efficiency"][names[0]])
        ]
        lines += _md_table(header, body, "---:")
        lines += ["", "Checked against the runs measured here:", ""]
        lines += [f"- {v.describe()}" for v in report.validation] or ["- (no multi-worker run)"]
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report.notes]
    lines += [
        "",
        "Plots: speedup_efficiency.png, time_cost.png, prediction.png. "
        "Data: scaling.csv, scaling.json.",
        "",
    ]
    return "\n".join(lines)


def render_summary(summary: dict[str, Any]) -> str:
    """The text of one run's summary.md, from ``report.summarize``."""
    s = summary
    source = s["energy_source"]
    lines = [
        f"# Run {s['run_dir']}",
        "",
        f"`{s['config_name']}`, {s['strategy']} with {s['num_workers']} workers "
        f"({s['threads_per_worker']} threads each), global batch {s['global_batch_graphs']} graphs, "
        f"learning rate {s['learning_rate']:.3g}, {s['epochs']} epochs, status {s['status']}.",
        "",
        *_md_table(
            ["epoch s", "graphs/s", "edges/s", "edges/s per worker", "cost/epoch", "energy/epoch"],
            [
                [
                    f"{s['epoch_s']:.2f}",
                    f"{s['graphs_per_s']:.2f}",
                    f"{s['edges_per_s']:,.0f}",
                    f"{s['edges_per_s_per_worker']:,.0f}",
                    f"${s['cost_per_epoch']:.5f}",
                    f"{s['energy_per_epoch_j']:,.0f} J ({source})",
                ]
            ],
        ),
        "",
        f"Epoch time: median over epochs{'' if s['epoch_s_includes_warmup'] else ' after the first'}, "
        f"slowest rank. Cost: {s['devices']} {s['device_kind']} x epoch hours x "
        f"${s['price_per_device_hour']}/device-hour. Energy: {source}"
        + (" (configured power, no counter readable here)." if source == "estimate" else "."),
        "",
    ]
    if s["step_sum_s"]:
        lines += [
            f"Epoch time {s['epoch_s']:.2f} s against {s['step_sum_s']:.2f} s in its steps (sum "
            f"of the slowest rank's step times, median over the same epochs): ratio "
            f"{s['epoch_s'] / s['step_sum_s']:.3f}.",
            "",
        ]
    statistics = ("mean", "std", "min", "median", "max")
    lines += [
        "Step times (s, slowest rank per step, warm-up steps excluded):",
        "",
        "| | mean | std | min | median | max | steps |",
        "|---|---|---|---|---|---|---|",
        *(
            _md_row([field, *(f"{st[k]:.4f}" for k in statistics), str(int(st["count"]))])
            for field, st in s["step_statistics"].items()
        ),
        "",
    ]
    val = ("val_loss", "val_auc", "val_efficiency", "val_purity")
    lines += _md_table(
        ["epoch", "s", "edges/s", "train loss", "val loss", "AUC", "efficiency", "purity"],
        [
            [str(row["epoch"]), f"{row['seconds']:.1f}", f"{row['edges_per_s']:,.0f}"]
            + [f"{row.get(k, float('nan')):.4f}" for k in ("train_loss", *val)]
            for row in s["epoch_table"]
        ],
    )
    lines += ["", *_accounts_lines(s)]
    if s["metrics"]:
        shown = (
            f"{k} {v:.4f}"
            for k, v in s["metrics"].items()
            if k != "num_edges" and isinstance(v, float) and np.isfinite(v)
        )
        lines += ["", "Final validation: " + ", ".join(shown)]
    return "\n".join(lines) + "\n"


def _accounts_lines(summary: dict[str, Any]) -> list[str]:
    """The per-epoch, per-rank accounting table, with a verdict line above it."""
    limit, flagged = summary["rest_limit"], summary["flagged_epochs"]
    verdict = (
        f"every epoch of every rank accounted for within {limit:.0%} of its wall time"
        if not flagged
        else f"**{flagged} epoch(s) with more than {limit:.0%} of the wall time unaccounted** "
        "(marked below)"
    )
    return [
        f"Where the time went (seconds per epoch and rank; {verdict}). Wall: from the previous "
        "epoch's record to this one's; train: the epoch time above (pipeline and steps); the "
        "exchange holds the wait for slower ranks; records: gathering and writing the previous "
        "epoch's records; rest: what no part accounts for.",
        "",
        *_md_table(
            ["epoch", "rank", *ACCOUNT_COLUMNS, "rest %"],
            [
                [str(row["epoch"] + 1), str(row["rank"])]
                + [f"{row[key]:.2f}" for key in ACCOUNT_COLUMNS.values()]
                + [f"{row['rest_fraction']:.1%}" + (" over" if row["flagged"] else "")]
                for row in summary["accounts"]
            ],
        ),
    ]


def _rows_table(rows: Sequence[ScalingRow], columns: Sequence[str]) -> list[str]:
    return _md_table(list(columns), [[COLUMNS[c](r) for c in columns] for r in rows], "---:")


def _md_table(header: list[str], body: list[list[str]], rule: str = "---") -> list[str]:
    return [_md_row(header), "|" + "|".join(rule for _ in header) + "|", *map(_md_row, body)]


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _fixed(value: Optional[float], digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _sig(value: float, digits: int = 3) -> str:
    """``value`` to about ``digits`` significant figures, never in exponent form."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))
    return f"{value:,.{decimals}f}"


def _money(dollars: float) -> str:
    return f"${dollars:,.2f}" if dollars >= 1 else f"${_sig(dollars)}"


def _energy(joules: float) -> str:
    return f"{_sig(joules / 1e3)} kJ" if joules >= 1e3 else f"{_sig(joules)} J"
