"""The PNG plots of a sweep's report: speedup and efficiency, time and cost, predicted efficiency."""

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
    ns = [r.n for r in report.rows]
    fig, (left, right) = _figure(2)
    label = "speedup t1/tN" if report.mode == "strong" else "scaled speedup N t1/tN"
    left.plot(ns, [r.speedup for r in report.rows], "o-", label="measured")
    left.plot(ns, ns, "k--", label="ideal (N)")
    left.set_yscale("log", base=2)
    left.set_yticks(ns)
    left.set_yticklabels([str(n) for n in ns])
    left.set_ylabel(label)
    right.plot(ns, [r.efficiency for r in report.rows], "o-", label="measured")
    right.axhline(1.0, color="k", linestyle="--", label="ideal")
    right.set_ylim(0, max(1.1, max(r.efficiency for r in report.rows) * 1.1))
    right.set_ylabel(f"{report.mode}-scaling efficiency")
    _finish(fig, report, (left, right), ns, path)


def time_cost(report: ScalingReport, path: Path) -> None:
    ns = [r.n for r in report.rows]
    fig, (left, right) = _figure(2)
    left.plot(ns, [r.epoch_s for r in report.rows], "o-", label="measured")
    t1 = report.rows[0].epoch_s
    if report.mode == "strong":
        left.plot(ns, [t1 / n for n in ns], "k--", label="ideal t1/N")
    left.set_ylabel("time per epoch (s)")
    right.plot(ns, [r.cost_per_epoch for r in report.rows], "o-", label="measured")
    if report.mode == "strong":
        right.plot(ns, [report.rows[0].cost_per_epoch] * len(ns), "k--", label="ideal (constant)")
    right.set_ylabel(f"cost per epoch ($; ${report.scaling.price_per_device_hour:g}/device-hour)")
    _finish(fig, report, (left, right), ns, path)


def prediction(report: ScalingReport, path: Path) -> None:
    fig, (ax,) = _figure(1)
    measured = [r.n for r in report.rows]
    ns = list(measured)
    if report.prediction is not None:
        for name, preds in report.prediction["efficiency"].items():
            pn = [p["n"] for p in preds]
            ax.plot(pn, [p["efficiency"] for p in preds], ".-", label=f"model: {name}")
            ns += pn
        val = report.validation
        if val:
            ax.plot(
                [v.n for v in val],
                [v.predicted_efficiency for v in val],
                "x",
                color="C3",
                ms=9,
                label=f"model for the runs here ({val[0].network})",
            )
    ax.plot(measured, [r.efficiency for r in report.rows], "o", color="k", label="measured here")
    ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel(f"{report.mode}-scaling efficiency")
    _log2_axis(ax, sorted(set(ns)))
    ax.legend(fontsize=7)
    ax.set_title("Predicted efficiency (ring allreduce model)")
    _save(fig, path)


PLOTTERS = {
    "speedup_efficiency": speedup_efficiency,
    "time_cost": time_cost,
    "prediction": prediction,
}


def _figure(ncols: int):
    fig = Figure(figsize=(5.0 * ncols, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _finish(fig: Any, report: ScalingReport, axes: Sequence[Any], ns: list[int], path: Path):
    for ax in axes:
        _log2_axis(ax, ns)
        ax.legend()
    fig.suptitle(f"{report.mode.capitalize()} scaling: {report.config_name}")
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)


def _log2_axis(ax: Any, ns: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ns))
    ax.set_xticklabels([str(n) for n in ns])
    ax.set_xlabel("workers N")
    ax.grid(True, alpha=0.3)
