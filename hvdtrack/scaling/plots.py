"""The PNG plots of a sweep's report: speedup and efficiency, time and cost, predicted efficiency;
one line per training mode."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

# The object-oriented API leaves the process-wide pyplot backend alone (Agg canvas).
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from hvdtrack.utils.io import atomic_write

if TYPE_CHECKING:
    from hvdtrack.scaling.report import ScalingReport


def speedup_efficiency(report: ScalingReport, path: Path) -> None:
    ns = sorted(set(report.table["n"]))
    fig, (left, right) = _figure(2)
    for label, t in _by_mode(report):
        left.plot(t["n"], t["speedup"], "o-", label=label)
        right.plot(t["n"], t["efficiency"], "o-", label=label)
    left.plot(ns, ns, "k--", label="ideal (N)")
    left.set_yscale("log", base=2)
    left.set_yticks(ns, [str(n) for n in ns])
    left.set_ylabel("speedup t1/tN" if report.mode == "strong" else "scaled speedup N t1/tN")
    right.axhline(1.0, color="k", linestyle="--", label="ideal")
    right.set_ylim(0, max(1.1, report.table["efficiency"].max() * 1.1))
    right.set_ylabel(f"{report.mode}-scaling efficiency")
    _finish(fig, report, (left, right), ns, path)


def time_cost(report: ScalingReport, path: Path) -> None:
    ns = sorted(set(report.table["n"]))
    fig, (left, right) = _figure(2)
    for label, t in _by_mode(report):
        left.plot(t["n"], t["epoch_s"], "o-", label=label)
        right.plot(t["n"], t["cost_per_epoch"], "o-", label=label)
    first = report.table.iloc[0]
    if report.mode == "strong" and first["n"] == 1:
        left.plot(ns, [first["epoch_s"] / n for n in ns], "k--", label="ideal t1/N")
        right.plot(ns, [first["cost_per_epoch"]] * len(ns), "k--", label="ideal (constant)")
    left.set_ylabel("time per epoch (s)")
    right.set_ylabel(f"cost per epoch ($; ${report.scaling.price_per_device_hour:g}/device-hour)")
    _finish(fig, report, (left, right), ns, path)


def prediction(report: ScalingReport, path: Path) -> None:
    fig, (ax,) = _figure(1)
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
    _finish(fig, report, (ax,), sorted(set(ns)), path, fontsize=7)


def _by_mode(report: ScalingReport, one: str = "measured"):
    """(label, rows) per training mode; the label is ``one`` when there is a single mode."""
    groups = list(report.table.groupby("training_mode", sort=False))
    return [(one if len(groups) == 1 else f"{one}: {k}", t) for k, t in groups]


def _figure(ncols: int):
    fig = Figure(figsize=(5.0 * ncols, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _finish(
    fig: Any, report: ScalingReport, axes: Sequence[Any], ns: list, path: Path, fontsize=None
) -> None:
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("workers N")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=fontsize)
    fig.suptitle(f"{report.mode.capitalize()} scaling: {report.config_name}")
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
