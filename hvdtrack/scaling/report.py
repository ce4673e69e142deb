"""Scaling reports from finished runs: Markdown, CSV and JSON tables and PNG plots, atomically.

What must match between the runs of one report (else ConfigError naming the key and the runs):

- both modes: the resolved config (run.json ``config``) except ``VARYING_KEYS``: the run
  directory, the per-worker batch (set per N by the sweep), logging/progress/resume switches
  and the ``scaling`` section (it only prices the report). Without ``config`` in run.json the
  ``config_hash`` must match instead.
- strong: the global batch (``global_batch_graphs``) is the same for every N.
- weak: the per-worker batch (``batch_graphs``) is the same for every N.

Measures (see ``hvdtrack.scaling.maths``): epoch s is the median over timed epochs of the
slowest rank's epoch time; batch s the median over non-warm-up steps of the slowest rank's step.
Strong speedup and efficiency use epoch s. Weak efficiency uses batch s, because the work per
worker per step is what weak scaling holds fixed (epoch times also depend on how the data are
sharded); with equal data per worker the two agree.

Public symbols: ``ScalingRow``, ``ScalingReport``, ``build_report``, ``write_report``,
``render_markdown``,
``infer_mode``, ``check_comparable``, ``load_runs``, ``VARYING_KEYS``, ``REPORT_FILES``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from hvdtrack import configtools
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.scaling import maths, predict
from hvdtrack.scaling.config import ScalingConfig
from hvdtrack.train.timing import Run, flatten_config, read_run
from hvdtrack.utils.io import atomic_write, write_json

VARYING_KEYS = (
    "train.run_dir",
    "train.batch_graphs",
    "train.progress_bar",
    "train.progress_interval_s",
    "train.log_every_steps",
    "train.resume",
    "train.allow_changed_config",
    "data.prepare_timeout_s",
    "scaling",
)
REPORT_FILES = (
    "report.md",
    "scaling.csv",
    "scaling.json",
    "speedup_efficiency.png",
    "time_cost.png",
    "prediction.png",
)


@dataclasses.dataclass(frozen=True)
class ScalingRow:
    """One run's line in the tables (times in seconds, cost in dollars, energy in joules)."""

    n: int
    run_dir: str
    batch_graphs: int
    global_batch_graphs: int
    epoch_s: float
    epoch_includes_warmup: bool
    batch_s: float
    batch_std_s: float
    batch_min_s: float
    batch_max_s: float
    timed_steps: int
    data_s: float
    exchange_s: Optional[float]
    speedup: float
    efficiency: float
    graphs_per_s: float
    graphs_per_s_per_worker: float
    edges_per_s: float
    devices: int
    cost_per_epoch: float
    power_watts: float
    energy_per_epoch_j: float
    energy_source: str
    val_loss: Optional[float]
    auc: Optional[float]
    edge_efficiency: Optional[float]
    purity: Optional[float]
    accuracy: Optional[float]


@dataclasses.dataclass(frozen=True)
class ScalingReport:
    """Everything ``write_report`` puts into files."""

    mode: str
    config_name: str
    rows: list[ScalingRow]
    scaling: ScalingConfig
    notes: list[str]
    prediction: Optional[dict[str, Any]]
    validation: list[predict.Validation]


def load_runs(run_dirs: Sequence[str | os.PathLike]) -> list[Run]:
    """Reads every run directory; DataError for missing, malformed or unfinished ones."""
    if not run_dirs:
        raise DataError("no run directories given")
    runs = [read_run(d) for d in run_dirs]
    for run in runs:
        if not run.finished:
            raise DataError(
                f"run {run.path} is not finished (status '{run.info['status']}'): "
                "wait for it to end, or leave it out of the report"
            )
    return runs


def infer_mode(runs: Sequence[Run]) -> str:
    """ "strong" if the global batch is the same for all runs, else "weak" if the per-worker
    batch is, else ConfigError."""
    global_batches = {r.info["global_batch_graphs"] for r in runs}
    if len(global_batches) == 1:
        return "strong"
    if len({r.info["batch_graphs"] for r in runs}) == 1:
        return "weak"
    raise ConfigError(
        "cannot tell strong from weak scaling: both the per-worker batch and the global batch "
        f"differ between the runs ({_listing(runs, 'batch_graphs')}); "
        "report runs of one sweep, or pass --mode"
    )


def check_comparable(runs: Sequence[Run], mode: str) -> None:
    """Raises ConfigError unless the runs may share a ``mode`` table (see the module docstring)."""
    if mode not in ("strong", "weak"):
        raise ConfigError(f"mode must be 'strong' or 'weak', got {mode!r}")
    first = runs[0]
    for run in runs[1:]:
        if first.info.get("config") is not None and run.info.get("config") is not None:
            a = _comparable_config(first)
            b = _comparable_config(run)
            for key in sorted(set(a) | set(b)):
                if a.get(key, "<absent>") != b.get(key, "<absent>"):
                    raise ConfigError(
                        f"runs of different configs in one report: '{key}' is "
                        f"{a.get(key, '<absent>')!r} in {first.path} (N={first.num_workers}) "
                        f"but {b.get(key, '<absent>')!r} in {run.path} (N={run.num_workers}); "
                        "report the runs of one config together"
                    )
        elif first.info["config_hash"] != run.info["config_hash"]:
            raise ConfigError(
                "runs of different configs in one report: config_hash "
                f"{first.info['config_hash']} in {first.path} but {run.info['config_hash']} in "
                f"{run.path} (run.json has no 'config' to say which key differs)"
            )
    key, what = (
        ("global_batch_graphs", "global batch")
        if mode == "strong"
        else ("batch_graphs", "per-worker batch")
    )
    if len({r.info[key] for r in runs}) > 1:
        other = "weak" if mode == "strong" else "strong"
        raise ConfigError(
            f"{mode} scaling keeps the {what} fixed, but the runs differ ({_listing(runs, key)}); "
            f"did you mean --mode {other}?"
        )


def build_report(
    runs: Sequence[Run],
    mode: Optional[str] = None,
    scaling: Optional[ScalingConfig] = None,
    measured_network: str = "shared-memory",
    scaling_overrides: Optional[dict[str, Any]] = None,
) -> ScalingReport:
    """Checks the runs belong together and computes the tables.

    Args:
      runs: finished runs, one per worker count, including N=1.
      mode: "strong" or "weak"; inferred with ``infer_mode`` when None.
      scaling: prices and power; default the ``scaling`` section of the N=1 run's config.
      measured_network: the ``predict.PRESETS`` entry the measured runs communicated over,
        used to check the model against them.
      scaling_overrides: ``ScalingConfig`` fields to replace (e.g. a price per device-hour).

    Returns:
      The ``ScalingReport``; rows sorted by N.

    Raises:
      DataError: unfinished runs, two runs with the same N, no N=1 baseline, no timing.
      ConfigError: runs of different configs, or of the wrong mode.
    """
    if not runs:
        raise DataError("no runs to report")
    for run in runs:
        if not run.finished:
            raise DataError(
                f"run {run.path} is not finished (status '{run.info['status']}'): "
                "wait for it to end, or leave it out of the report"
            )
    runs = sorted(runs, key=lambda r: r.num_workers)
    mode = mode or infer_mode(runs)
    seen: dict[int, Run] = {}
    for run in runs:
        if run.num_workers in seen:
            raise DataError(
                f"two runs with N={run.num_workers}: {seen[run.num_workers].path} and {run.path}; "
                "keep one per worker count"
            )
        seen[run.num_workers] = run
    check_comparable(runs, mode)
    if 1 not in seen:
        raise DataError(
            f"a {mode}-scaling report needs a single-worker baseline (a run with N=1); got "
            f"N = {', '.join(str(n) for n in seen)}. Run the sweep with 1 in --np "
            "(python -m hvdtrack.scaling run --np 1,...)"
        )
    baseline = seen[1]
    notes: list[str] = []
    if scaling is None:
        scaling = _scaling_of(baseline, notes)
    if scaling_overrides:
        scaling = dataclasses.replace(scaling, **scaling_overrides)
    warmup_epochs = scaling.timing_warmup_epochs

    t1_epoch = maths.epoch_time(baseline, warmup_epochs)
    t1_batch = _batch_stats(baseline)["median"]
    rows = []
    for run in runs:
        rows.append(_row(run, mode, scaling, t1_epoch, t1_batch))
        if rows[-1].epoch_includes_warmup:
            notes.append(
                f"N={run.num_workers}: the run has {len(maths.epoch_times(run))} epoch(s), "
                "not more "
                f"than scaling.timing_warmup_epochs={warmup_epochs}, so its epoch time includes "
                "warm-up; run more epochs for a clean figure"
            )
    if any(r.energy_source == "estimate" for r in rows):
        notes.append(
            f"energy marked 'estimate' is {scaling.device_power_watts:g} W per device "
            "(scaling.device_power_watts) x devices x time, not a measurement"
        )
    prediction, validation = _prediction(runs, baseline, mode, scaling, measured_network, notes)
    return ScalingReport(
        mode=mode,
        config_name=str(baseline.info["config_name"]),
        rows=rows,
        scaling=scaling,
        notes=notes,
        prediction=prediction,
        validation=validation,
    )


def write_report(report: ScalingReport, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes ``REPORT_FILES`` into ``out_dir`` (each atomically).

    Returns:
      File kind ("md", "csv", "json", "speedup_efficiency", "time_cost", "prediction") -> path.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "md": out / "report.md",
        "csv": out / "scaling.csv",
        "json": out / "scaling.json",
        "speedup_efficiency": out / "speedup_efficiency.png",
        "time_cost": out / "time_cost.png",
        "prediction": out / "prediction.png",
    }
    with atomic_write(paths["csv"]) as f:
        f.write(_csv(report))
    write_json(paths["json"], _json(report))
    _plot_speedup_efficiency(report, paths["speedup_efficiency"])
    _plot_time_cost(report, paths["time_cost"])
    _plot_prediction(report, paths["prediction"])
    with atomic_write(paths["md"]) as f:
        f.write(render_markdown(report))
    return paths


# ------------------------------------------------------------------------------------ rows
def _row(
    run: Run, mode: str, scaling: ScalingConfig, t1_epoch: float, t1_batch: float
) -> ScalingRow:
    n = run.num_workers
    warmup_epochs = scaling.timing_warmup_epochs
    epoch_s = maths.epoch_time(run, warmup_epochs)
    if epoch_s <= 0:
        raise DataError(f"{run.path}: epoch time is 0 s in timing.jsonl; the timing is broken")
    batch = _batch_stats(run)
    data = maths.step_times(run, "data_s")
    exchange = maths.step_times(run, "exchange_s")
    work = maths.epoch_work(run, warmup_epochs)
    if mode == "strong":
        speed = maths.speedup(t1_epoch, epoch_s)
        efficiency = maths.strong_efficiency(t1_epoch, epoch_s, n)
    else:
        speed = n * maths.weak_efficiency(t1_batch, batch["median"])  # scaled speedup
        efficiency = maths.weak_efficiency(t1_batch, batch["median"])
    devices = n * scaling.devices_per_worker
    energy = run.info.get("energy")
    if energy is not None:
        # joules is the run's total over all processes; watts may be one process's mean.
        seconds = energy.get("seconds")
        total = isinstance(seconds, (int, float)) and seconds > 0
        power = energy["joules"] / seconds if total else float(energy["watts"])
        source = str(energy["source"])
    else:
        power, source = scaling.device_power_watts * devices, "estimate"
    metrics = run.info.get("metrics") or {}
    return ScalingRow(
        n=n,
        run_dir=str(run.path),
        batch_graphs=run.info["batch_graphs"],
        global_batch_graphs=run.info["global_batch_graphs"],
        epoch_s=epoch_s,
        epoch_includes_warmup=maths.epoch_time_includes_warmup(run, warmup_epochs),
        batch_s=batch["median"],
        batch_std_s=batch["std"],
        batch_min_s=batch["min"],
        batch_max_s=batch["max"],
        timed_steps=batch["count"],
        data_s=float(np.median(data)),
        exchange_s=float(np.median(exchange)) if exchange.size else None,
        speedup=speed,
        efficiency=efficiency,
        graphs_per_s=maths.throughput(work["graphs"], epoch_s),
        graphs_per_s_per_worker=maths.throughput_per_worker(work["graphs"], epoch_s, n),
        edges_per_s=maths.throughput(work["edges"], epoch_s),
        devices=devices,
        cost_per_epoch=maths.cost_per_epoch(devices, epoch_s, scaling.price_per_device_hour),
        power_watts=power,
        energy_per_epoch_j=maths.energy_per_epoch(power, epoch_s),
        energy_source=source,
        val_loss=_metric(metrics, "loss"),
        auc=_metric(metrics, "auc"),
        edge_efficiency=_metric(metrics, "efficiency"),
        purity=_metric(metrics, "purity"),
        accuracy=_metric(metrics, "accuracy"),
    )


def _batch_stats(run: Run) -> dict[str, float]:
    times = maths.step_times(run, "total_s")
    if times.size == 0:
        raise DataError(
            f"{run.path}: no non-warm-up steps in timing.jsonl (N={run.num_workers}); run more "
            "steps than scaling.timing_warmup_steps"
        )
    return maths.step_statistics(times)


def _scaling_of(run: Run, notes: list[str]) -> ScalingConfig:
    section = (run.info.get("config") or {}).get("scaling")
    if section is None:
        notes.append("the runs' config has no 'scaling' section: default prices and power used")
        return ScalingConfig()
    return configtools.from_mapping(ScalingConfig, section, "scaling", f"{run.path}/run.json")


def _prediction(
    runs: list[Run],
    baseline: Run,
    mode: str,
    scaling: ScalingConfig,
    measured_network: str,
    notes: list[str],
) -> tuple[Optional[dict[str, Any]], list[predict.Validation]]:
    try:
        compute_s, gradient_bytes, note = predict.baseline_inputs(baseline)
    except DataError as err:
        notes.append(f"no prediction beyond this machine: {err}")
        return None, []
    if note:
        notes.append(note)
    networks = dict(predict.PRESETS)
    configured = predict.network_from_config(scaling)
    if configured != networks.get(configured.name):
        networks[f"{configured.name} (config)"] = configured
    table = {
        name: [
            dataclasses.asdict(p)
            for p in predict.predict_scaling(compute_s, gradient_bytes, net, mode)
        ]
        for name, net in networks.items()
    }
    if measured_network not in predict.PRESETS:
        raise ConfigError(
            f"measured network must be one of {', '.join(predict.PRESETS)}, "
            f"got {measured_network!r}"
        )
    validation = predict.validate_against(runs, mode, predict.PRESETS[measured_network])
    if not validation:
        notes.append("no multi-worker run measured: the model could not be checked here")
    return {
        "step_compute_s": compute_s,
        "gradient_bytes": gradient_bytes,
        "networks": {name: dataclasses.asdict(net) for name, net in networks.items()},
        "efficiency": table,
    }, validation


# ------------------------------------------------------------------------------------ output
def _strong_table(rows: list[ScalingRow]) -> list[list[str]]:
    header = ["N", "epoch s", "speedup", "efficiency", "cost/epoch", "energy/epoch"]
    body = [
        [
            str(r.n),
            _fixed(r.epoch_s, 2),
            _fixed(r.speedup, 3),
            _fixed(r.efficiency, 3),
            _money(r.cost_per_epoch),
            f"{_energy(r.energy_per_epoch_j)} ({r.energy_source})",
        ]
        for r in rows
    ]
    return [header, *body]


def _weak_table(rows: list[ScalingRow]) -> list[list[str]]:
    header = ["N", "efficiency", "edge eff.", "purity", "AUC", "val loss", "epoch s", "batch s"]
    body = [
        [
            str(r.n),
            _fixed(r.efficiency, 3),
            _fixed(r.edge_efficiency, 3),
            _fixed(r.purity, 3),
            _fixed(r.auc, 3),
            _fixed(r.val_loss, 4),
            _fixed(r.epoch_s, 2),
            _fixed(r.batch_s, 4),
        ]
        for r in rows
    ]
    return [header, *body]


def _detail_table(report: ScalingReport) -> list[list[str]]:
    header = [
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
    ]
    body = [
        [
            str(r.n),
            str(r.batch_graphs),
            str(r.global_batch_graphs),
            _fixed(r.batch_s, 4),
            _fixed(r.batch_std_s, 4),
            _fixed(r.batch_min_s, 4),
            _fixed(r.batch_max_s, 4),
            _fixed(r.data_s, 4),
            _fixed(r.exchange_s, 4),
            _sig(r.graphs_per_s),
            _sig(r.graphs_per_s_per_worker),
            _money(r.cost_per_epoch),
            f"{_energy(r.energy_per_epoch_j)} ({r.energy_source})",
        ]
        for r in report.rows
    ]
    return [header, *body]


def _physics_table(rows: list[ScalingRow]) -> list[list[str]]:
    header = ["N", "val loss", "AUC", "edge eff.", "purity", "accuracy"]
    body = [
        [
            str(r.n),
            _fixed(r.val_loss, 4),
            _fixed(r.auc, 3),
            _fixed(r.edge_efficiency, 3),
            _fixed(r.purity, 3),
            _fixed(r.accuracy, 3),
        ]
        for r in rows
    ]
    return [header, *body]


def render_markdown(report: ScalingReport) -> str:
    """The text of report.md."""
    s = report.scaling
    rows = report.rows
    base = rows[0]
    lines = [
        f"# {report.mode.capitalize()} scaling: {report.config_name}",
        "",
        f"Runs: N = {', '.join(str(r.n) for r in rows)} ({s.devices_per_worker} {s.device_kind} "
        f"per worker); "
        + (
            f"global batch {base.global_batch_graphs} graphs per step."
            if report.mode == "strong"
            else f"batch {base.batch_graphs} graphs per worker per step."
        ),
        f"Cost at ${s.price_per_device_hour:g} per {s.device_kind}-hour "
        "(scaling.price_per_device_hour); energy per epoch = mean power x epoch s.",
        "",
    ]
    if report.mode == "strong":
        lines += [
            "Speedup = t1/tN and efficiency = t1/(N tN) on epoch s (median over timed epochs "
            "of the slowest rank).",
            "",
            *_md_table(_strong_table(rows)),
        ]
    else:
        lines += [
            "Efficiency = t1/tN on batch s (median non-warm-up step of the slowest rank); "
            "edge eff., purity, AUC and val loss are the final validation metrics.",
            "",
            *_md_table(_weak_table(rows)),
        ]
    lines += ["", "## Steps and throughput", "", *_md_table(_detail_table(report))]
    if report.mode == "strong":
        lines += ["", "## Physics of each run (final validation)", ""]
        lines += _md_table(_physics_table(rows))
    lines += ["", "## Beyond this machine: predicted efficiency (ring allreduce model)", ""]
    if report.prediction is None:
        lines.append("Not available (see notes).")
    else:
        p = report.prediction
        lines += [
            f"From the single-worker step without exchange, {p['step_compute_s'] * 1e3:.2f} ms, "
            f"and {p['gradient_bytes']:,} gradient bytes per step; allreduce "
            "t(N) = 2(N-1)/N bytes/bandwidth + 2(N-1) latency, no overlap with compute"
            + ("; compute per worker taken as t1/N." if report.mode == "strong" else "."),
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
        lines += _md_table([header, *body])
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


def _md_table(table: list[list[str]]) -> list[str]:
    header, *body = table
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines


def _csv(report: ScalingReport) -> str:
    fields = [f.name for f in dataclasses.fields(ScalingRow)]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["mode", *fields], lineterminator="\n")
    writer.writeheader()
    for row in report.rows:
        values = {k: "" if _missing(v) else v for k, v in dataclasses.asdict(row).items()}
        writer.writerow({"mode": report.mode, **values})
    return buffer.getvalue()


def _json(report: ScalingReport) -> dict[str, Any]:
    return _finite_or_null(
        {
            "mode": report.mode,
            "config_name": report.config_name,
            "scaling_config": dataclasses.asdict(report.scaling),
            "definitions": {
                "epoch_s": "median over timed epochs of the slowest rank's epoch time",
                "batch_s": "median over non-warm-up steps of the slowest rank's step time",
                "speedup": "t1/tN on epoch_s" if report.mode == "strong" else "N * efficiency",
                "efficiency": (
                    "t1/(N tN) on epoch_s" if report.mode == "strong" else "t1/tN on batch_s"
                ),
                "cost_per_epoch": "devices x epoch hours x price per device-hour (dollars)",
                "energy_per_epoch_j": "mean power of the run's devices x epoch_s (joules)",
            },
            "rows": [dataclasses.asdict(r) for r in report.rows],
            "prediction": report.prediction,
            "validation": [dataclasses.asdict(v) for v in report.validation],
            "notes": report.notes,
        }
    )


def _finite_or_null(value: Any) -> Any:
    # NaN metrics (e.g. purity with no edge kept) become null: strict JSON has no NaN.
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(v) for v in value]
    return None if _missing(value) else value


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


# ------------------------------------------------------------------------------------ plots
def _figure(ncols: int):
    # The object-oriented API leaves the process-wide pyplot backend alone (Agg canvas).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0 * ncols, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _save(fig: Any, path: Path) -> None:
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)


def _log2_axis(ax: Any, ns: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ns))
    ax.set_xticklabels([str(n) for n in ns])
    ax.set_xlabel("workers N")
    ax.grid(True, alpha=0.3)


def _plot_speedup_efficiency(report: ScalingReport, path: Path) -> None:
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
    for ax in (left, right):
        _log2_axis(ax, ns)
        ax.legend()
    fig.suptitle(f"{report.mode.capitalize()} scaling: {report.config_name}")
    _save(fig, path)


def _plot_time_cost(report: ScalingReport, path: Path) -> None:
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
    for ax in (left, right):
        _log2_axis(ax, ns)
        ax.legend()
    fig.suptitle(f"{report.mode.capitalize()} scaling: {report.config_name}")
    _save(fig, path)


def _plot_prediction(report: ScalingReport, path: Path) -> None:
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


# ------------------------------------------------------------------------------------ formats
def _metric(metrics: dict[str, Any], key: str) -> Optional[float]:
    value = metrics.get(key)
    return None if value is None else float(value)


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


def _listing(runs: Sequence[Run], key: str) -> str:
    return ", ".join(f"N={r.num_workers}: {r.info[key]}" for r in runs)


def _comparable_config(run: Run) -> dict[str, Any]:
    flat = flatten_config(run.info["config"])
    return {
        k: v
        for k, v in flat.items()
        if not any(k == e or k.startswith(f"{e}.") for e in VARYING_KEYS)
    }
