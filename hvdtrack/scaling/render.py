"""What the reports show: the Markdown of a sweep (``render_markdown``) and of one run
(``render_summary``), and a sweep's PNG plots (``report.PLOTS``: speedup and efficiency, time and
cost, predicted efficiency; one line per training mode).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from hvdtrack.runs.timing import EPOCH_PARTS
from hvdtrack.scaling.results import ScalingReport
from hvdtrack.utils.io import atomic_write

DEFINITIONS: dict[str, Any] = {  # of the measures in a sweep's tables (also in scaling.json)
    "epoch_s": "median over timed epochs of the slowest rank's epoch time",
    "batch_s": "median over non-warm-up steps of the slowest rank's step time",
    "speedup": {"strong": "t1/tN on epoch s", "weak": "N * efficiency"},
    "efficiency": {"strong": "t1/(N tN) on epoch s", "weak": "t1/tN on batch s"},
    "t1": "the N=1 run of the same training mode",
    "devices": "N x devices_per_worker (x stages on GPUs)",
    "cost_per_epoch": "devices x epoch hours x price per device-hour (dollars)",
    "energy_per_epoch_j": "mean power of the run's devices x epoch s (joules)",
}


def _fixed(digits: int) -> Callable[[Any], str]:
    return lambda v: "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _sig(value: float, digits: int = 3) -> str:
    """``value`` to about ``digits`` significant figures, never in exponent form."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    return f"{value:,.{max(0, digits - 1 - math.floor(math.log10(abs(value))))}f}"


# Column title -> (column of the sweep report's table, how its cells are written).
COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "mode": ("training_mode", str),
    "N": ("n", str),
    "batch/worker": ("batch_graphs", str),
    "global batch": ("global_batch_graphs", str),
    "epoch s": ("epoch_s", _fixed(2)),
    "speedup": ("speedup", _fixed(3)),
    "efficiency": ("efficiency", _fixed(3)),
    "batch s": ("batch_s", _fixed(4)),
    **{k: (f"batch_{k}_s", _fixed(4)) for k in ("std", "min", "max")},
    "data wait s": ("data_s", _fixed(4)),
    "exchange s": ("exchange_s", _fixed(4)),
    "graphs/s": ("graphs_per_s", _sig),
    "graphs/s/worker": ("graphs_per_s_per_worker", _sig),
    "edges/s": ("edges_per_s", _sig),
    "edges/s/worker": ("edges_per_s_per_worker", _sig),
    "cost/epoch": ("cost_per_epoch", lambda d: f"${d:,.2f}" if d >= 1 else f"${_sig(d)}"),
    "energy/epoch": (
        "energy_per_epoch_j",
        lambda j: _sig(j / 1e3) + " kJ" if j >= 1e3 else _sig(j) + " J",
    ),
    "val loss": ("val_loss", _fixed(4)),
    "AUC": ("auc", _fixed(3)),
    "edge eff.": ("edge_efficiency", _fixed(3)),
    "purity": ("purity", _fixed(3)),
    "accuracy": ("accuracy", _fixed(3)),
}
DETAIL = ["N", "batch/worker", "global batch", "batch s", "std", "min", "max", "data wait s"]
TABLES = {
    "strong": ["N", "epoch s", "speedup", "efficiency", "cost/epoch", "energy/epoch"],
    "weak": ["N", "efficiency", "edge eff.", "purity", "AUC", "val loss", "epoch s", "batch s"],
    "detail": [*DETAIL, "exchange s", "graphs/s", "graphs/s/worker", "cost/epoch", "energy/epoch"],
    "run": ["epoch s", "graphs/s", "edges/s", "edges/s/worker", "cost/epoch", "energy/epoch"],
    "runs": ["N", "epoch s", "edges/s", "cost/epoch", "energy/epoch", "val loss", "AUC"]
    + ["edge eff.", "purity", "accuracy"],
}
# The per-epoch accounting of one run: column title -> key of timing.epoch_accounts' rows.
ACCOUNT_COLUMNS = {"wall": "wall_s", "train": "time_s"}
ACCOUNT_COLUMNS |= {p.removesuffix("_s"): p for p in EPOCH_PARTS} | {"exchange wait": "wait_s"}
ACCOUNT_COLUMNS["rest"] = "rest_s"


# The epochs of one run: column title -> (key of the summary's epoch_table, cell format).
EPOCH_COLUMNS = {
    "epoch": ("epoch", str),
    "s": ("seconds", "{:.1f}".format),
    "edges/s": ("edges_per_s", "{:,.0f}".format),
    "train loss": ("train_loss", _fixed(4)),
    **{t: (f"val_{k}", _fixed(4)) for t, k in (("val loss", "loss"), ("AUC", "auc"))},
    **{k: (f"val_{k}", _fixed(4)) for k in ("efficiency", "purity")},
}


def markdown_table(frame: pd.DataFrame, align: str = "---:") -> list[str]:
    """The lines of a Markdown table of ``frame``'s cells (as text) under its column names."""
    rows = [frame.columns, *frame.astype(str).values]
    lines = ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return [lines[0], f"|{align}" * frame.shape[1] + "|", *lines[1:]]


def _cells(table: pd.DataFrame) -> pd.DataFrame:
    """The ``COLUMNS`` of ``table`` (those it has) as text, under their titles."""
    present = {title: (col, fmt) for title, (col, fmt) in COLUMNS.items() if col in table}
    cells = pd.DataFrame({title: table[col].map(fmt) for title, (col, fmt) in present.items()})
    cells["energy/epoch"] += " (" + table["energy_source"] + ")"
    return cells


def render_markdown(report: ScalingReport) -> str:
    """The text of a sweep's report.md."""
    s, t, mode = report.scaling, report.table, report.mode
    cells = _cells(t)
    batch = (
        f"global batch {t['global_batch_graphs'][0]} graphs per step."
        if mode == "strong"
        else f"batch {t['batch_graphs'][0]} graphs per worker per step."
    )
    d = {k: v if isinstance(v, str) else v[mode] for k, v in DEFINITIONS.items()}
    lines = [
        f"# {mode.capitalize()} scaling: {report.config_name}",
        "",
        f"Runs: N = {', '.join(map(str, sorted(set(t['n']))))} ({s.devices_per_worker} "
        f"{s.device_kind} per worker); {batch}",
        f"Cost at ${s.price_per_device_hour:g} per {s.device_kind}-hour "
        "(scaling.price_per_device_hour); energy per epoch = mean power x epoch s.",
        "",
        f"Speedup = {d['speedup']}, efficiency = {d['efficiency']}; t1: {d['t1']}; epoch s: "
        f"{d['epoch_s']}; batch s: {d['batch_s']}; val loss, AUC, edge eff. and purity: the "
        "final validation metrics.",
        "",
    ]
    modes = t["training_mode"].unique()
    for label, rows in cells.groupby(t["training_mode"], sort=False):
        heading = [f"### Training mode: {label}", ""] if len(modes) > 1 else []
        lines += [*heading, *markdown_table(rows[TABLES[mode]]), ""]
    # With several modes a mode column, and the last table compares them per (mode, N).
    detail, runs = ([*(["mode"] if len(modes) > 1 else []), *TABLES[k]] for k in ("detail", "runs"))
    lines += ["## Steps and throughput", "", *markdown_table(cells[detail]), ""]
    lines += ["## Each run: time, cost and final validation", "", *markdown_table(cells[runs])]
    lines += ["", "## Beyond this machine: predicted efficiency (ring allreduce model)", ""]
    p = report.prediction
    if p is None:
        lines.append("Not available (see notes).")
    else:
        m = p["model"]
        lines += [
            f"From the single-worker run: step without exchange {p['step_compute_s'] * 1e3:.2f} ms "
            f"= fixed {m['fixed_s'] * 1e3:.2f} ms + {m['per_edge_s'] * 1e9:.1f} ns per edge, "
            f"{p['gradient_bytes']:,} gradient bytes per step. Step(N) = compute of the rank's "
            "share + fixed + straggler wait (expected slowest of N, from the measured spread), "
            "over the contention ceiling, + Horovod's loop (half a cycle per fusion round, then "
            "cycle (N-1)/(2N) for the latest rank's loop; at N=1 the single-worker run's "
            "measured exchange) + ring allreduce "
            "2(N-1)/N bytes/bandwidth + 2(N-1) latency; no overlap with compute.",
            "",
        ]
        predicted = {"N": [q["n"] for q in next(iter(p["efficiency"].values()))]}
        for name, preds in p["efficiency"].items():
            net = p["networks"][name]
            title = f"{name} ({net['bandwidth_gbps']:g} Gb/s, {net['latency_us']:g} us)"
            predicted[title] = [f"{q['efficiency']:.3f}" for q in preds]
        lines += markdown_table(pd.DataFrame(predicted))
        lines += ["", "Checked against the runs measured here:", ""]
        lines += [f"- {v.describe()}" for v in report.validation] or ["- (no multi-worker run)"]
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report.notes]
    plots = "Plots: speedup_efficiency.png, time_cost.png, prediction.png. "
    return "\n".join([*lines, "", plots + "Data: scaling.csv, scaling.json.", ""])


def render_summary(s: dict[str, Any]) -> str:
    """The text of one run's summary.md, from the dict of ``report.write_summary``."""
    source = s["energy_source"]
    headline = _cells(pd.DataFrame([s]))[TABLES["run"]]
    steps = pd.DataFrame(s["step_statistics"]).T
    steps = steps[["mean", "std", "min", "median", "max"]].map("{:.4f}".format)
    steps["steps"] = pd.DataFrame(s["step_statistics"]).T["count"].astype(int)
    epochs = pd.DataFrame(s["epoch_table"])
    epochs = pd.DataFrame({t: epochs[k].map(f) for t, (k, f) in EPOCH_COLUMNS.items()})
    lines = [
        f"# Run {s['run_dir']}",
        "",
        f"`{s['config_name']}` ({s['training_mode']}), {s['strategy']} with {s['num_workers']} "
        f"workers ({s['threads_per_worker']} threads each), global batch "
        f"{s['global_batch_graphs']} graphs, learning rate {s['learning_rate']:.3g}, "
        f"{s['epochs']} epochs, status {s['status']}.",
        "",
        *markdown_table(headline),
        "",
        f"Epoch time: median over epochs{'' if s['epoch_includes_warmup'] else ' after the first'}, "
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
    lines += [
        "Step times (s, slowest rank per step, warm-up steps excluded):",
        "",
        *markdown_table(steps.rename_axis("").reset_index()),
        "",
        *markdown_table(epochs),
        "",
        *_accounts_lines(s),
    ]
    metrics = {k: v for k, v in s["metrics"].items() if k != "num_edges"}.items()
    shown = [f"{k} {v:.4f}" for k, v in metrics if isinstance(v, float) and math.isfinite(v)]
    if shown:
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
    accounts = pd.DataFrame(summary["accounts"])
    table = pd.DataFrame({"epoch": accounts["epoch"] + 1, "rank": accounts["rank"]})
    table[list(ACCOUNT_COLUMNS)] = accounts[list(ACCOUNT_COLUMNS.values())].map("{:.2f}".format)
    over = accounts["flagged"].map({True: " over", False: ""})
    table["rest %"] = accounts["rest_fraction"].map("{:.1%}".format) + over
    return [
        f"Where the time went (seconds per epoch and rank; {verdict}). Wall: from the previous "
        "epoch's record to this one's; train: the epoch time above (pipeline and steps); the "
        "exchange holds the wait for slower ranks; records: gathering and writing the previous "
        "epoch's records; rest: what no part accounts for.",
        "",
        *markdown_table(table),
    ]


# ------------------------------------------------------------------------------ plots
def speedup_efficiency(report: ScalingReport, path: Path) -> None:
    left, right, ns = _measured(report, "speedup", "efficiency")
    left.plot(ns, ns, "k--", label="ideal (N)")
    left.set_yscale("log", base=2)
    left.set_yticks(ns, [str(n) for n in ns])
    left.set_ylabel("speedup t1/tN" if report.mode == "strong" else "scaled speedup N t1/tN")
    right.axhline(1.0, color="k", linestyle="--", label="ideal")
    right.set_ylim(0, max(1.1, report.table["efficiency"].max() * 1.1))
    right.set_ylabel(f"{report.mode}-scaling efficiency")
    _finish(report, (left, right), ns, path)


def time_cost(report: ScalingReport, path: Path) -> None:
    left, right, ns = _measured(report, "epoch_s", "cost_per_epoch")
    first = report.table.iloc[0]
    if report.mode == "strong" and first["n"] == 1:
        left.plot(ns, [first["epoch_s"] / n for n in ns], "k--", label="ideal t1/N")
        right.plot(ns, [first["cost_per_epoch"]] * len(ns), "k--", label="ideal (constant)")
    left.set_ylabel("time per epoch (s)")
    right.set_ylabel(f"cost per epoch ($; ${report.scaling.price_per_device_hour:g}/device-hour)")
    _finish(report, (left, right), ns, path)


def prediction(report: ScalingReport, path: Path) -> None:
    (ax,) = _figure(1)
    ns = list(report.table["n"])
    for name, preds in (report.prediction or {}).get("efficiency", {}).items():
        ns += [p["n"] for p in preds]
        ax.plot([p["n"] for p in preds], [p["efficiency"] for p in preds], ".-", label=name)
    if report.validation:
        v = report.validation
        label = f"model for the runs here ({v[0].network})"
        ax.plot([x.n for x in v], [x.predicted_efficiency for x in v], "x", ms=9, label=label)
    for label, t in _by_mode(report, "measured here"):
        ax.plot(t["n"], t["efficiency"], "o", label=label)
    ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel(f"{report.mode}-scaling efficiency")
    ax.set_title("Predicted efficiency (ring allreduce model)")
    _finish(report, (ax,), sorted(set(ns)), path, fontsize=7)


def _by_mode(report: ScalingReport, one: str = "measured"):
    """(label, rows) per training mode; the label is ``one`` when there is a single mode."""
    groups = list(report.table.groupby("training_mode", sort=False))
    return [(one if len(groups) == 1 else f"{one}: {k}", t) for k, t in groups]


def _measured(report: ScalingReport, left: str, right: str):
    """Two panels with columns ``left`` and ``right`` by N, a line per training mode; and N."""
    axes = _figure(2)
    for label, t in _by_mode(report):
        for ax, column in zip(axes, (left, right)):
            ax.plot(t["n"], t[column], "o-", label=label)
    return *axes, sorted(set(report.table["n"]))


def _figure(ncols: int):
    # The object-oriented API leaves the process-wide pyplot backend alone (Agg canvas).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0 * ncols, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    return fig.subplots(1, ncols, squeeze=False)[0]


def _finish(report: ScalingReport, axes: Sequence[Any], ns: list, path: Path, fontsize=None):
    fig = axes[0].figure
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("workers N")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=fontsize)
    fig.suptitle(f"{report.mode.capitalize()} scaling: {report.config_name}")
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
