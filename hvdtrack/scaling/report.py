"""Reports from finished runs, every file written atomically: one run's report, or a sweep's.

- One run (``write_summary``): ``summary.md`` and ``summary.json``: epochs, step statistics,
  throughput, cost, energy, and where each epoch of each rank went
  (``hvdtrack.train.timing.epoch_accounts``, flagged over ``timing.REST_LIMIT`` unaccounted).
- A sweep (``build_report``, ``write_report``): ``REPORT_FILES``, the strong- or weak-scaling
  table in Markdown (``scaling.tables``), CSV and JSON, predictions beyond this machine and the
  plots (``scaling.plots``).

Prices and power come from one ``ScalingConfig``: the (baseline) run's ``scaling`` section with
the command line's overrides. The runs of one sweep report must share the resolved config (run.json
``config``, else ``config_hash``) except ``VARYING_KEYS``, and the global batch (strong) or the
per-worker batch (weak); else ConfigError naming the key and the runs.

Measures (``hvdtrack.scaling.maths``): epoch s is the median over timed epochs of the slowest
rank's epoch time, batch s the median over non-warm-up steps of the slowest rank's step. Strong
speedup and efficiency use epoch s; weak efficiency uses batch s, as the work per worker per step
is what weak scaling holds fixed (epoch times also depend on the sharding).

Public symbols: ``ScalingReport``, ``load_runs``, ``build_report``, ``write_report``,
``summarize``, ``write_summary``, ``VARYING_KEYS``, ``REPORT_FILES``.
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
from hvdtrack.train import timing
from hvdtrack.train.runinfo import flatten_config
from hvdtrack.train.timing import Run, read_run
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
# Column of the report's table -> key of run.json's final validation metrics.
METRICS = {
    "val_loss": "loss",
    "auc": "auc",
    "edge_efficiency": "efficiency",
    "purity": "purity",
    "accuracy": "accuracy",
}
DEFINITIONS = {
    "epoch_s": "median over timed epochs of the slowest rank's epoch time",
    "batch_s": "median over non-warm-up steps of the slowest rank's step time",
    "speedup": {"strong": "t1/tN on epoch_s", "weak": "N * efficiency"},
    "efficiency": {"strong": "t1/(N tN) on epoch_s", "weak": "t1/tN on batch_s"},
    "cost_per_epoch": "devices x epoch hours x price per device-hour (dollars)",
    "energy_per_epoch_j": "mean power of the run's devices x epoch_s (joules)",
}


@dataclasses.dataclass(frozen=True)
class ScalingReport:
    """Everything ``write_report`` puts into files. ``table`` has one row per run by N (the
    columns of ``_row``: times in s, cost in $, energy in J, the final validation ``METRICS``);
    ``prediction`` holds the ring model's inputs and efficiency per network (None without
    inputs); ``validation`` the model against each measured multi-worker run."""

    mode: str
    config_name: str
    table: pd.DataFrame
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
    measured_network: str = "shared-memory",
    overrides: Optional[dict[str, Any]] = None,
) -> ScalingReport:
    """Checks that the runs (one per N, N=1 included) belong together and computes the table.

    ``mode`` is inferred from the batches when None; ``measured_network`` (a ``predict.PRESETS``
    name) is what the runs communicated over, to check the model against them; ``overrides``
    replace ``ScalingConfig`` fields (e.g. the price). DataError: unfinished runs, two runs with
    one N, no N=1, no timing; ConfigError: runs of different configs or of the wrong mode.
    """
    if not runs:
        raise DataError("no runs to report")
    runs = sorted(_finished(runs), key=lambda r: r.num_workers)
    mode = mode or _infer_mode(runs)
    for a, b in zip(runs, runs[1:]):
        if a.num_workers == b.num_workers:
            raise DataError(
                f"two runs with N={a.num_workers}: {a.path} and {b.path}; "
                "keep one per worker count"
            )
    _check_comparable(runs, mode)
    baseline = runs[0]
    if baseline.num_workers != 1:
        raise DataError(
            f"a {mode}-scaling report needs a single-worker baseline (a run with N=1); got "
            f"N = {', '.join(str(r.num_workers) for r in runs)}. Run the sweep with 1 in --np "
            "(python -m hvdtrack.scaling run --np 1,...)"
        )
    notes: list[str] = []
    scaling = dataclasses.replace(_scaling_of(baseline, notes), **(overrides or {}))
    t1_epoch = maths.epoch_time(baseline, scaling.timing_warmup_epochs)
    t1_batch = maths.run_step_statistics(baseline)["median"]
    table = pd.DataFrame([_row(run, mode, scaling, t1_epoch, t1_batch) for run in runs])
    for row in table[table["epoch_includes_warmup"]].itertuples():
        notes.append(
            f"N={row.n}: the run has no more epochs than scaling.timing_warmup_epochs="
            f"{scaling.timing_warmup_epochs}, so its epoch time includes warm-up; run more "
            "epochs for a clean figure"
        )
    if (table["energy_source"] == "estimate").any():
        notes.append(
            f"energy marked 'estimate' is {scaling.device_power_watts:g} W per device "
            "(scaling.device_power_watts) x devices x time, not a measurement"
        )
    prediction, validation = _prediction(runs, mode, scaling, measured_network, notes)
    name = str(baseline.info["config_name"])
    return ScalingReport(mode, name, table, scaling, notes, prediction, validation)


def write_report(report: ScalingReport, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes ``REPORT_FILES`` into ``out_dir``; returns kind ("md", "csv", "json" or a plot's
    name) -> path."""
    from hvdtrack.scaling import plots  # matplotlib only when plots are drawn
    from hvdtrack.scaling.tables import render_markdown

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = dict(zip(("md", "csv", "json", *PLOTS), (out / name for name in REPORT_FILES)))
    with atomic_write(paths["csv"]) as f:
        report.table.assign(mode=report.mode).to_csv(f, index=False, lineterminator="\n")
    write_json(paths["json"], _json(report))
    for name in PLOTS:
        getattr(plots, name)(report, paths[name])
    with atomic_write(paths["md"]) as f:
        f.write(render_markdown(report))
    return paths


def summarize(run: Run) -> dict[str, Any]:
    """Plain numbers describing one run (see the module docstring)."""
    info, scaling = run.info, _scaling_of(run, [])
    accounts = timing.epoch_accounts(run)
    epochs = sorted((e for e in run.epochs if e.rank == 0), key=lambda e: e.epoch)
    shown = ("config_name", "status", "strategy", "threads_per_worker", "global_batch_graphs")
    return {
        "run_dir": str(run.path),
        **{key: info.get(key) for key in (*shown, "learning_rate", "device_kind")},
        "num_workers": run.num_workers,
        "epochs": len(epochs),
        **_measures(run, scaling),
        "price_per_device_hour": scaling.price_per_device_hour,
        "step_sum_s": maths.epoch_step_time(run, scaling.timing_warmup_epochs),
        "step_statistics": {f: maths.run_step_statistics(run, f) for f in maths.STEP_FIELDS},
        "metrics": info.get("metrics") or {},
        "epoch_table": [
            {
                "epoch": e.epoch + 1,
                "seconds": e.time_s,
                "edges_per_s": e.edges / e.time_s if e.time_s > 0 else float("nan"),
                "train_loss": e.train_loss,
                **{
                    f"val_{k}": (e.val or {}).get(k)
                    for k in ("loss", "auc", "efficiency", "purity")
                },
            }
            for e in epochs
        ],
        "accounts": accounts,
        "flagged_epochs": sum(row["flagged"] for row in accounts),
        "rest_limit": timing.REST_LIMIT,
    }


def write_summary(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Reads ``run_dir``, writes ``summary.md`` and ``summary.json`` into ``out`` (default
    ``run_dir/report``); returns the .md path."""
    from hvdtrack.scaling.tables import render_summary

    summary = summarize(read_run(run_dir))
    out = Path(out) if out is not None else Path(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "summary.md") as f:
        f.write(render_summary(summary))
    write_json(out / "summary.json", _finite_or_null(summary))
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
        "graphs_per_s_per_worker": maths.throughput(work["graphs"], epoch_s, n),
        "edges_per_s": maths.throughput(work["edges"], epoch_s),
        "edges_per_s_per_worker": maths.throughput(work["edges"], epoch_s, n),
        "devices": devices,
        "cost_per_epoch": maths.cost_per_epoch(devices, epoch_s, scaling.price_per_device_hour),
        "power_watts": power,
        "energy_per_epoch_j": maths.energy_per_epoch(power, epoch_s),
        "energy_source": source,
    }


def _row(
    run: Run, mode: str, scaling: ScalingConfig, t1_epoch: float, t1_batch: float
) -> dict[str, Any]:
    n, measures = run.num_workers, _measures(run, scaling)
    batch = maths.run_step_statistics(run)
    # Strong: on epoch times; weak: on step times, and the speedup is the scaled one.
    t1, tn = (t1_epoch, measures["epoch_s"]) if mode == "strong" else (t1_batch, batch["median"])
    efficiency = maths.efficiency(mode, t1, tn, n)
    speedup = maths.speedup(t1, tn) if mode == "strong" else n * efficiency
    metrics = run.info.get("metrics") or {}
    return {
        "n": n,
        "run_dir": str(run.path),
        "batch_graphs": run.info["batch_graphs"],
        "global_batch_graphs": run.info["global_batch_graphs"],
        **{f"batch_{k}_s": batch[k] for k in ("std", "min", "max")},
        "batch_s": batch["median"],
        "timed_steps": batch["count"],
        "data_s": float(np.median(maths.step_times(run, "data_s"))),
        "exchange_s": float(np.median(maths.step_times(run, "exchange_s"))),
        "speedup": speedup,
        "efficiency": efficiency,
        **measures,
        **{k: None if metrics.get(m) is None else float(metrics[m]) for k, m in METRICS.items()},
    }


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
    for key, mode in (("global_batch_graphs", "strong"), ("batch_graphs", "weak")):
        if len({r.info[key] for r in runs}) == 1:
            return mode
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
    key, what, other = {
        "strong": ("global_batch_graphs", "global batch", "weak"),
        "weak": ("batch_graphs", "per-worker batch", "strong"),
    }[mode]
    if len({r.info[key] for r in runs}) > 1:
        raise ConfigError(
            f"{mode} scaling keeps the {what} fixed, but the runs differ ({_listing(runs, key)}); "
            f"did you mean --mode {other}?"
        )


def _comparable_config(run: Run) -> dict[str, Any]:
    return {
        k: v
        for k, v in flatten_config(run.info["config"]).items()
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
    runs: list[Run], mode: str, scaling: ScalingConfig, measured_network: str, notes: list[str]
) -> tuple[Optional[dict[str, Any]], list[predict.Validation]]:
    try:
        compute_s, gradient_bytes, note = predict.baseline_inputs(runs[0])
    except DataError as err:
        notes.append(f"no prediction beyond this machine: {err}")
        return None, []
    if note:
        notes.append(note)
    networks = dict(predict.PRESETS)
    configured = predict.network_from_config(scaling)
    if configured != networks.get(configured.name):
        networks[f"{configured.name} (config)"] = configured
    efficiency = {
        name: [
            dataclasses.asdict(p)
            for p in predict.predict_scaling(compute_s, gradient_bytes, net, mode)
        ]
        for name, net in networks.items()
    }
    validation = predict.validate_against(runs, mode, predict.PRESETS[measured_network])
    if not validation:
        notes.append("no multi-worker run measured: the model could not be checked here")
    return {
        "step_compute_s": compute_s,
        "gradient_bytes": gradient_bytes,
        "networks": {name: dataclasses.asdict(net) for name, net in networks.items()},
        "efficiency": efficiency,
    }, validation


# ------------------------------------------------------------------------------ files
def _json(report: ScalingReport) -> dict[str, Any]:
    definitions = {k: v if isinstance(v, str) else v[report.mode] for k, v in DEFINITIONS.items()}
    return _finite_or_null(
        {
            "mode": report.mode,
            "config_name": report.config_name,
            "scaling_config": dataclasses.asdict(report.scaling),
            "definitions": definitions,
            "rows": report.table.to_dict("records"),
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
    if isinstance(value, np.generic):
        value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value
