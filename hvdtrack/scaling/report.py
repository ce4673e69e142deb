"""Reports from finished runs, every file written atomically: one run's report, or a sweep's.

- One run (``write_summary``; the main job writes it for its run): ``summary.md`` and
  ``summary.json`` with the epochs, step statistics, throughput, cost and energy, and where each
  epoch's time went: every epoch of every rank split into ``hvdtrack.train.timing.EPOCH_PARTS``
  plus the wait at the gradient exchange, an epoch flagged when its unaccounted rest exceeds
  ``timing.REST_LIMIT`` of its wall time.
- Several runs of one sweep (``build_report``, ``write_report``): ``REPORT_FILES``, the
  strong- or weak-scaling tables in Markdown, CSV and JSON, the predictions beyond this machine
  and the PNG plots (the text is drawn by ``scaling.tables``, the plots by ``scaling.plots``).

Both price and power the runs with one ``ScalingConfig``: the ``scaling`` section of the
(baseline) run's config, whose defaults are the only ones. What must match between the runs of
one sweep report (else ConfigError naming the key and the runs):

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

Public symbols: ``ScalingRow``, ``ScalingReport``, ``load_runs``, ``build_report``,
``write_report``, ``render_markdown``, ``summarize``, ``write_summary``, ``VARYING_KEYS``,
``REPORT_FILES``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from hvdtrack import configtools
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.scaling import maths, predict
from hvdtrack.scaling.config import ScalingConfig
from hvdtrack.scaling.tables import render_markdown, render_summary
from hvdtrack.train import timing
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
PLOTS = ("speedup_efficiency", "time_cost", "prediction")
REPORT_FILES = ("report.md", "scaling.csv", "scaling.json", *(f"{p}.png" for p in PLOTS))


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
    exchange_s: float
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
    return _finished([read_run(d) for d in run_dirs])


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
      mode: "strong" or "weak"; inferred from the batches when None.
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
    runs = sorted(_finished(runs), key=lambda r: r.num_workers)
    mode = mode or _infer_mode(runs)
    seen: dict[int, Run] = {}
    for run in runs:
        if run.num_workers in seen:
            raise DataError(
                f"two runs with N={run.num_workers}: {seen[run.num_workers].path} and {run.path}; "
                "keep one per worker count"
            )
        seen[run.num_workers] = run
    _check_comparable(runs, mode)
    if 1 not in seen:
        raise DataError(
            f"a {mode}-scaling report needs a single-worker baseline (a run with N=1); got "
            f"N = {', '.join(str(n) for n in seen)}. Run the sweep with 1 in --np "
            "(python -m hvdtrack.scaling run --np 1,...)"
        )
    baseline = seen[1]
    notes: list[str] = []
    scaling = dataclasses.replace(
        scaling or _scaling_of(baseline, notes), **(scaling_overrides or {})
    )
    warmup_epochs = scaling.timing_warmup_epochs
    t1_epoch = maths.epoch_time(baseline, warmup_epochs)
    t1_batch = maths.run_step_statistics(baseline)["median"]
    rows = []
    for run in runs:
        rows.append(_row(run, mode, scaling, t1_epoch, t1_batch))
        if rows[-1].epoch_includes_warmup:
            notes.append(
                f"N={run.num_workers}: the run has {len(maths.epoch_times(run))} epoch(s), "
                f"not more than scaling.timing_warmup_epochs={warmup_epochs}, so its epoch time "
                "includes warm-up; run more epochs for a clean figure"
            )
    if any(r.energy_source == "estimate" for r in rows):
        notes.append(
            f"energy marked 'estimate' is {scaling.device_power_watts:g} W per device "
            "(scaling.device_power_watts) x devices x time, not a measurement"
        )
    prediction, validation = _prediction(runs, baseline, mode, scaling, measured_network, notes)
    return ScalingReport(
        mode, str(baseline.info["config_name"]), rows, scaling, notes, prediction, validation
    )


def write_report(report: ScalingReport, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes ``REPORT_FILES`` into ``out_dir`` (each atomically).

    Returns:
      File kind ("md", "csv", "json", "speedup_efficiency", "time_cost", "prediction") -> path.
    """
    from hvdtrack.scaling import plots  # matplotlib only when plots are drawn

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = dict(zip(("md", "csv", "json", *PLOTS), (out / name for name in REPORT_FILES)))
    table = pd.DataFrame([dataclasses.asdict(r) for r in report.rows])
    with atomic_write(paths["csv"]) as f:
        table.insert(0, "mode", report.mode)
        table.to_csv(f, index=False, lineterminator="\n")
    write_json(paths["json"], _json(report))
    for name in PLOTS:
        plots.PLOTTERS[name](report, paths[name])
    with atomic_write(paths["md"]) as f:
        f.write(render_markdown(report))
    return paths


def summarize(run: Run) -> dict[str, Any]:
    """Plain numbers describing one run (see the module docstring)."""
    info = run.info
    scaling = _scaling_of(run, [])
    measures = _measures(run, scaling)
    accounts = timing.epoch_accounts(run)
    epochs = sorted((e for e in run.epochs if e.rank == 0), key=lambda e: e.epoch)
    return {
        "accounts": accounts,
        "flagged_epochs": sum(1 for row in accounts if row["flagged"]),
        "rest_limit": timing.REST_LIMIT,
        "step_sum_s": maths.epoch_step_time(run, scaling.timing_warmup_epochs),
        "run_dir": str(run.path),
        "config_name": info.get("config_name"),
        "status": info.get("status"),
        "strategy": info.get("strategy"),
        "num_workers": run.num_workers,
        "threads_per_worker": info.get("threads_per_worker"),
        "global_batch_graphs": info.get("global_batch_graphs"),
        "learning_rate": info.get("learning_rate"),
        "epochs": len(epochs),
        "epoch_s": measures["epoch_s"],
        "epoch_s_includes_warmup": measures["epoch_includes_warmup"],
        **{k: measures[k] for k in ("graphs_per_s", "edges_per_s", "edges_per_s_per_worker")},
        "step_statistics": {
            field: maths.run_step_statistics(run, field) for field in maths.STEP_FIELDS
        },
        "device_kind": info.get("device_kind"),
        "devices": measures["devices"],
        "cost_per_epoch": measures["cost_per_epoch"],
        "price_per_device_hour": scaling.price_per_device_hour,
        "energy_per_epoch_j": measures["energy_per_epoch_j"],
        "energy_source": measures["energy_source"],
        "metrics": info.get("metrics") or {},
        "epoch_table": [
            {
                "epoch": e.epoch + 1,
                "seconds": e.time_s,
                "edges_per_s": e.edges / e.time_s if e.time_s > 0 else float("nan"),
                "train_loss": e.train_loss,
                **{f"val_{k}": v for k, v in (e.val or {}).items() if k in VAL_SHOWN},
            }
            for e in epochs
        ],
    }


def write_summary(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Reads ``run_dir``, writes ``summary.md`` and ``summary.json`` into ``out`` (default
    ``run_dir/report``); returns the .md path."""
    summary = summarize(read_run(run_dir))
    out = Path(out) if out is not None else Path(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "summary.md") as f:
        f.write(render_summary(summary))
    write_json(out / "summary.json", summary)
    return out / "summary.md"


# ------------------------------------------------------------------------------ measures
def _measures(run: Run, scaling: ScalingConfig) -> dict[str, Any]:
    """What every table says of one run: epoch time, throughput, devices, cost, power, energy."""
    n, warmup_epochs = run.num_workers, scaling.timing_warmup_epochs
    epoch_s = maths.epoch_time(run, warmup_epochs)
    if epoch_s <= 0:
        raise DataError(f"{run.path}: epoch time is 0 s in timing.jsonl; the timing is broken")
    work = maths.epoch_work(run, warmup_epochs)
    devices = n * scaling.devices_per_worker
    energy = run.info.get("energy")
    if energy is None:
        power, source = scaling.device_power_watts * devices, "estimate"
    else:
        # joules is the run's total over all processes; watts may be one process's mean.
        seconds = energy.get("seconds")
        total = isinstance(seconds, (int, float)) and seconds > 0
        power = energy["joules"] / seconds if total else float(energy["watts"])
        source = str(energy["source"])
    return {
        "epoch_s": epoch_s,
        "epoch_includes_warmup": maths.epoch_time_includes_warmup(run, warmup_epochs),
        "graphs_per_s": maths.throughput(work["graphs"], epoch_s),
        "graphs_per_s_per_worker": maths.throughput_per_worker(work["graphs"], epoch_s, n),
        "edges_per_s": maths.throughput(work["edges"], epoch_s),
        "edges_per_s_per_worker": maths.throughput_per_worker(work["edges"], epoch_s, n),
        "devices": devices,
        "cost_per_epoch": maths.cost_per_epoch(devices, epoch_s, scaling.price_per_device_hour),
        "power_watts": power,
        "energy_per_epoch_j": maths.energy_per_epoch(power, epoch_s),
        "energy_source": source,
    }


def _row(
    run: Run, mode: str, scaling: ScalingConfig, t1_epoch: float, t1_batch: float
) -> ScalingRow:
    n = run.num_workers
    measures = _measures(run, scaling)
    del measures["edges_per_s_per_worker"]
    batch = maths.run_step_statistics(run)
    if mode == "strong":
        speed = maths.speedup(t1_epoch, measures["epoch_s"])
        efficiency = maths.strong_efficiency(t1_epoch, measures["epoch_s"], n)
    else:
        efficiency = maths.weak_efficiency(t1_batch, batch["median"])
        speed = n * efficiency  # scaled speedup
    metrics = run.info.get("metrics") or {}
    return ScalingRow(
        n=n,
        run_dir=str(run.path),
        batch_graphs=run.info["batch_graphs"],
        global_batch_graphs=run.info["global_batch_graphs"],
        batch_s=batch["median"],
        batch_std_s=batch["std"],
        batch_min_s=batch["min"],
        batch_max_s=batch["max"],
        timed_steps=batch["count"],
        data_s=float(np.median(maths.step_times(run, "data_s"))),
        exchange_s=float(np.median(maths.step_times(run, "exchange_s"))),
        speedup=speed,
        efficiency=efficiency,
        **measures,
        **{
            field: None if metrics.get(key) is None else float(metrics[key])
            for field, key in METRIC_FIELDS.items()
        },
    )


METRIC_FIELDS = {
    "val_loss": "loss",
    "auc": "auc",
    "edge_efficiency": "efficiency",
    "purity": "purity",
    "accuracy": "accuracy",
}
VAL_SHOWN = ("loss", "auc", "efficiency", "purity")


def _finished(runs: Sequence[Run]) -> list[Run]:
    for run in runs:
        if not run.finished:
            raise DataError(
                f"run {run.path} is not finished (status '{run.info['status']}'): "
                "wait for it to end, or leave it out of the report"
            )
    return list(runs)


def _infer_mode(runs: Sequence[Run]) -> str:
    """ "strong" if the global batch is the same for all runs, else "weak" if the per-worker
    batch is, else ConfigError."""
    if len({r.info["global_batch_graphs"] for r in runs}) == 1:
        return "strong"
    if len({r.info["batch_graphs"] for r in runs}) == 1:
        return "weak"
    raise ConfigError(
        "cannot tell strong from weak scaling: both the per-worker batch and the global batch "
        f"differ between the runs ({_listing(runs, 'batch_graphs')}); "
        "report runs of one sweep, or pass --mode"
    )


def _check_comparable(runs: Sequence[Run], mode: str) -> None:
    """Raises ConfigError unless the runs may share a ``mode`` table (see the module docstring)."""
    if mode not in ("strong", "weak"):
        raise ConfigError(f"mode must be 'strong' or 'weak', got {mode!r}")
    first = runs[0]
    for run in runs[1:]:
        if first.info.get("config") is not None and run.info.get("config") is not None:
            a, b = _comparable_config(first), _comparable_config(run)
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


def _comparable_config(run: Run) -> dict[str, Any]:
    flat = flatten_config(run.info["config"])
    return {
        k: v
        for k, v in flat.items()
        if not any(k == e or k.startswith(f"{e}.") for e in VARYING_KEYS)
    }


def _listing(runs: Sequence[Run], key: str) -> str:
    return ", ".join(f"N={r.num_workers}: {r.info[key]}" for r in runs)


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


# ------------------------------------------------------------------------------ files
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
    return (
        None if value is None or (isinstance(value, float) and not math.isfinite(value)) else value
    )
