"""Reports from finished runs, every file written atomically: one run's, or a sweep's.

- One run (``write_summary``): ``summary.md`` and ``summary.json``: epochs, step statistics,
  throughput, cost, energy and where each epoch of each rank went (``timing.epoch_accounts``).
- Runs of one config (``build_report``, ``write_report``; a ``results.ScalingReport``):
  ``REPORT_FILES``, the strong- or weak-scaling tables in Markdown, CSV and JSON, predictions
  beyond this machine and the plots (``scaling.render``).

The runs may train in different modes (``training_mode``: whole graphs or subgraph mini-batches,
either in S stages x M micro-batches (``distributed.stages``); N is the data-parallel worker count).
Each mode is its own sweep, scaled against its own N=1 run (none: no speedup or efficiency, and
a note); the report then compares the modes per (mode, N). The runs must share the resolved
config (run.json ``config``) except ``VARYING_KEYS`` and ``MODE_KEYS``,
and within a mode the global batch (strong) or the per-worker batch (weak).

Prices and power come from one ``ScalingConfig``: the first baseline's ``scaling`` section with
the command line's overrides; ``render.DEFINITIONS`` says how each measure is computed.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from hvdtrack import configtools
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.runs import timing
from hvdtrack.runs.runinfo import flatten_config
from hvdtrack.runs.timing import Run, read_run
from hvdtrack.scaling import maths, network, render
from hvdtrack.scaling.config import ScalingConfig
from hvdtrack.scaling.results import ScalingReport
from hvdtrack.utils.io import atomic_write, write_json

# Config keys (dotted keys or whole sections) that may differ between the runs of a report.
VARYING_KEYS = ("scaling", "data.prepare_timeout_s", "train.run_dir", "train.batch_graphs")
VARYING_KEYS += ("train.progress_bar", "train.progress_interval_s", "train.log_every_steps")
VARYING_KEYS += ("train.resume", "train.allow_changed_config")
MODE_KEYS = (
    "train.subgraphs",
    "distributed.stages",
    "distributed.pipeline",
)  # what makes the training mode
# Scaling mode -> the batch it holds fixed (run.json key, in words).
FIXED = {
    "strong": ("global_batch_graphs", "global batch"),
    "weak": ("batch_graphs", "per-worker batch"),
}
PLOTS = ("speedup_efficiency", "time_cost", "prediction")
REPORT_FILES = ("report.md", "scaling.csv", "scaling.json", *(f"{p}.png" for p in PLOTS))
# Column of the report's table -> key of run.json's final validation metrics.
METRICS = {"val_loss": "loss", "auc": "auc", "edge_efficiency": "efficiency"}
METRICS |= {"purity": "purity", "accuracy": "accuracy"}


def training_mode(run: Run) -> str:
    """The run's mode from run.json: "graphs" or "subgraphs" (``input_mode``), followed by
    ", stages SxM" when it ran ``distributed.stages.num_stages`` > 1 stages."""
    stages, micro = _stages(run)
    label = run.info.get("input_mode") or "graphs"
    return f"{label}, stages {stages}x{micro}" if stages > 1 else label


def build_report(
    runs: Sequence[Run | str | os.PathLike],
    mode: Optional[str] = None,
    measured_network: str = "shared-memory",
    overrides: Optional[dict[str, Any]] = None,
    ceilings: Optional[Mapping[int, float]] = None,
    fit_also: Sequence[Run | str | os.PathLike] = (),
) -> ScalingReport:
    """Checks that the runs (or run directories) belong together (see the module docstring)
    and computes the table. ``mode`` ("strong", "weak") is inferred from the batches when None;
    ``measured_network`` (a ``network.PRESETS`` name) is the link the runs used; ``overrides``
    replace ``ScalingConfig`` fields; ``ceilings``: the contention ceiling by ranks per host
    (``maths.validate_against``); ``fit_also``: more single-worker runs (or directories) of the
    same model whose steps join the fit of the step's cost (``maths.baseline_inputs``).
    DataError: unfinished runs, two runs of one mode and N, no N=1 run at all."""
    if not runs:
        raise DataError("no runs to report")
    runs = [r if isinstance(r, Run) else read_run(r) for r in runs]  # run directories read
    for run in (r for r in runs if not r.finished):
        raise DataError(
            f"run {run.path} is not finished (status '{run.info['status']}'): "
            "wait for it to end, or leave it out of the report"
        )
    runs = sorted(runs, key=lambda r: (training_mode(r), r.num_workers))
    groups = {k: list(g) for k, g in itertools.groupby(runs, training_mode)}
    mode = _check_comparable(runs, list(groups.values()), mode)
    baselines = {k: g[0] for k, g in groups.items() if g[0].num_workers == 1}
    if not baselines:
        raise DataError(
            f"a {mode}-scaling report needs a single-worker baseline (a run with N=1); got "
            f"N = {', '.join(str(r.num_workers) for r in runs)}. Run the sweep with 1 in --np "
            "(python -m hvdtrack.scaling run --np 1,...)"
        )
    notes: list[str] = []
    baseline = next(iter(baselines.values()))
    scaling = dataclasses.replace(_scaling_of(baseline, notes), **(overrides or {}))
    rows = []
    for label, group in groups.items():
        base = baselines.get(label)
        if base is None:
            notes.append(f"{label}: no N=1 run, so no speedup or efficiency for this mode")
        t1 = base and (maths.epoch_time(base, scaling.timing_warmup_epochs), _median(base))
        rows += [_row(run, mode, scaling, t1) for run in group]
    table = pd.DataFrame(rows)
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
    predicted = groups[training_mode(baseline)]
    if len(groups) > 1:
        notes.append(f"predictions from the '{training_mode(baseline)}' runs")
    also = [r if isinstance(r, Run) else read_run(r) for r in fit_also]
    for run in also:
        _check_same_model(baseline, run)
    prediction, validation = _prediction(
        predicted, mode, scaling, measured_network, notes, ceilings, also
    )
    name = str(baseline.info["config_name"])
    return ScalingReport(mode, name, table, scaling, notes, prediction, validation)


def write_report(report: ScalingReport, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes ``REPORT_FILES`` into ``out_dir``; returns {"md", "csv", "json", plot name: path}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = dict(zip(("md", "csv", "json", *PLOTS), (out / name for name in REPORT_FILES)))
    with atomic_write(paths["csv"]) as f:
        report.table.assign(mode=report.mode).to_csv(f, index=False, lineterminator="\n")
    write_json(paths["json"], _json(report))
    for name in PLOTS:
        getattr(render, name)(report, paths[name])
    with atomic_write(paths["md"]) as f:
        f.write(render.render_markdown(report))
    return paths


def write_summary(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Writes ``summary.md`` and ``summary.json`` of ``run_dir`` into ``out`` (default
    ``run_dir/report``); returns the .md path."""
    run = read_run(run_dir)
    info, scaling = run.info, _scaling_of(run, [])
    accounts = timing.epoch_accounts(run)
    epochs = sorted((e for e in run.epochs if e.rank == 0), key=lambda e: e.epoch)
    shown = ("config_name", "status", "strategy", "threads_per_worker", "global_batch_graphs")
    val = ("loss", "auc", "efficiency", "purity")
    summary = {
        "run_dir": str(run.path),
        **{key: info.get(key) for key in (*shown, "learning_rate", "device_kind")},
        "training_mode": training_mode(run),
        "num_workers": run.num_workers,
        "epochs": len(epochs),
        **_measures(run, scaling),
        "price_per_device_hour": scaling.price_per_device_hour,
        "step_sum_s": maths.epoch_step_time(run, scaling.timing_warmup_epochs),
        "step_statistics": {
            f: maths.step_statistics(maths.step_times(run, f)) for f in maths.STEP_FIELDS
        },
        "metrics": info.get("metrics") or {},
        "epoch_table": [
            {
                "epoch": e.epoch + 1,
                "seconds": e.time_s,
                "edges_per_s": e.edges / e.time_s if e.time_s > 0 else float("nan"),
                "train_loss": e.train_loss,
                **{f"val_{k}": (e.val or {}).get(k) for k in val},
            }
            for e in epochs
        ],
        "accounts": accounts,
        "flagged_epochs": sum(row["flagged"] for row in accounts),
        "rest_limit": timing.REST_LIMIT,
    }
    out = Path(out) if out is not None else Path(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "summary.md") as f:
        f.write(render.render_summary(summary))
    write_json(out / "summary.json", summary)  # NaN metrics: null (write_json)
    return out / "summary.md"


# ------------------------------------------------------------------------------ measures
def _measures(run: Run, scaling: ScalingConfig) -> dict[str, Any]:
    """What every table says of one run: epoch time, throughput, devices, cost, power, energy."""
    n, warmup_epochs = run.num_workers, scaling.timing_warmup_epochs
    epoch_s = maths.epoch_time(run, warmup_epochs)
    if epoch_s <= 0:
        raise DataError(f"{run.path}: epoch time is 0 s in timing.jsonl; the timing is broken")
    work = maths.epoch_work(run, warmup_epochs)
    # Each stage takes a GPU; on CPU the stages share the worker's cores.
    stages = _stages(run)[0] if scaling.device_kind == "gpu" else 1
    devices = n * scaling.devices_per_worker * stages
    estimate = {"watts": scaling.device_power_watts * devices, "source": "estimate"}
    energy = run.info.get("energy") or estimate
    # joules is the run's total over all processes; watts may be one process's mean.
    seconds = energy.get("seconds")
    total = isinstance(seconds, (int, float)) and seconds > 0
    power = energy["joules"] / seconds if total else float(energy["watts"])
    per_s = {f"{k}_per_s": work[k] / epoch_s for k in ("graphs", "edges")}
    return {
        "epoch_s": epoch_s,
        "epoch_includes_warmup": 0 < warmup_epochs >= len({e.epoch for e in run.epochs}),
        **per_s,
        **{f"{k}_per_worker": v / n for k, v in per_s.items()},
        "devices": devices,
        "cost_per_epoch": devices * epoch_s / 3600 * scaling.price_per_device_hour,
        "power_watts": power,
        "energy_per_epoch_j": power * epoch_s,
        "energy_source": str(energy["source"]),
    }


def _row(
    run: Run, mode: str, scaling: ScalingConfig, t1: Optional[tuple[float, float]]
) -> dict[str, Any]:
    """One run's row; ``t1`` is its mode's (epoch s, batch s) at N=1, None without such a run."""
    n, measures = run.num_workers, _measures(run, scaling)
    batch = maths.step_statistics(maths.step_times(run))
    speedup = efficiency = float("nan")
    if t1:  # strong: on epoch times; weak: on step times, and the speedup is the scaled one
        t1, tn = (t1[0], measures["epoch_s"]) if mode == "strong" else (t1[1], batch["median"])
        efficiency = maths.efficiency(mode, t1, tn, n)
        speedup = t1 / tn if mode == "strong" else n * efficiency
    metrics = run.info.get("metrics") or {}
    return {
        "training_mode": training_mode(run),
        "n": n,
        "run_dir": str(run.path),
        "batch_graphs": run.info["batch_graphs"],
        "global_batch_graphs": run.info["global_batch_graphs"],
        **{f"batch_{k}_s": batch[k] for k in ("std", "min", "max")},
        "batch_s": batch["median"],
        "timed_steps": batch["count"],
        "data_s": _median(run, "data_s"),
        "exchange_s": _median(run, "exchange_s"),
        "speedup": speedup,
        "efficiency": efficiency,
        **measures,
        **{k: None if metrics.get(m) is None else float(metrics[m]) for k, m in METRICS.items()},
    }


def _median(run: Run, field: str = "total_s") -> float:
    return float(np.median(maths.step_times(run, field)))


def _stages(run: Run) -> tuple[int, int]:
    """(stages, micro-batches) of run.json's ``stages``; (1, 1) without stages. Runs written
    before the rename recorded ``pipeline: {stages, micro_batches}``."""
    old = run.info.get("pipeline") or {}
    p = run.info.get("stages") or {"num_stages": old.get("stages", 1), **old}
    return int(p.get("num_stages") or 1), int(p.get("micro_batches") or 1)


def _check_comparable(runs: Sequence[Run], groups: list[list[Run]], mode: Optional[str]) -> str:
    """Raises unless the runs may share a report (see the module docstring); returns ``mode``,
    or when None the one whose batch (``FIXED``) each training mode's runs share."""
    for group in groups:
        for a, b in zip(group, group[1:]):
            if a.num_workers == b.num_workers:
                raise DataError(
                    f"two runs with N={a.num_workers}: {a.path} and {b.path}; "
                    "keep one per worker count"
                )
    varying = {  # scaling mode -> a training mode whose runs differ in its fixed batch
        m: next((g for g in groups if len({r.info[key] for r in g}) > 1), None)
        for m, (key, _) in FIXED.items()
    }
    if mode is None:
        mode = next((m for m, group in varying.items() if group is None), None)
        if mode is None:
            raise ConfigError(
                "cannot tell strong from weak scaling: both the per-worker batch and the global "
                f"batch differ between the runs ({_listing(runs, 'batch_graphs')}); "
                "report runs of one sweep, or pass --mode"
            )
    if mode not in FIXED:
        raise ConfigError(f"mode must be 'strong' or 'weak', got {mode!r}")
    first = _comparable_config(runs[0])
    for run in runs[1:]:
        other = _comparable_config(run)
        for key in sorted(set(first) | set(other)):
            a, b = first.get(key, "<absent>"), other.get(key, "<absent>")
            if a != b:
                raise ConfigError(
                    f"runs of different configs in one report: '{key}' is {a!r} in {runs[0].path} "
                    f"(N={runs[0].num_workers}) but {b!r} in {run.path} (N={run.num_workers}); "
                    "report the runs of one config together"
                )
    if varying[mode]:
        (key, what), other = FIXED[mode], "weak" if mode == "strong" else "strong"
        raise ConfigError(
            f"{mode} scaling keeps the {what} fixed, but the runs differ "
            f"({_listing(varying[mode], key)}); did you mean --mode {other}?"
        )
    return mode


def _check_same_model(run: Run, other: Run) -> None:
    """ConfigError unless ``other`` trained the same model on the same data as ``run``."""
    for section in ("model", "data"):
        a, b = ((r.info.get("config") or {}).get(section) for r in (run, other))
        if a != b:
            raise ConfigError(
                f"--fit-also {other.path}: its '{section}' config differs from {run.path}'s; "
                "only runs of the same model and data can join the fit of the step's cost"
            )


def _comparable_config(run: Run) -> dict[str, Any]:
    ignored = (*VARYING_KEYS, *MODE_KEYS)
    flat = flatten_config(run.info.get("config") or {}).items()
    return {k: v for k, v in flat if not any(k == e or k.startswith(f"{e}.") for e in ignored)}


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
    mode: str,
    scaling: ScalingConfig,
    measured_network: str,
    notes: list[str],
    ceilings: Optional[Mapping[int, float]] = None,
    also: Sequence[Run] = (),
) -> tuple[Optional[dict[str, Any]], list[maths.Validation]]:
    try:
        model = maths.baseline_inputs(runs[0], also)
    except DataError as err:
        if also:  # asked for a fit with more runs: that it cannot be made is an error
            raise
        notes.append(f"no prediction beyond this machine: {err}")
        return None, []
    notes += list(model.notes)
    if not ceilings and any(int(r.info.get("local_size") or 1) > 1 for r in runs):
        notes.append(
            "no contention ceiling given (bench distributed's t_alone / t_concurrent): the model "
            "takes ranks that share a host as fast as one alone"
        )
    graphs = runs[0].info.get("global_batch_graphs") or runs[0].info.get("batch_graphs")
    if mode == "strong" and graphs and max(maths.DEFAULT_NS) > graphs:
        notes.append(
            f"strong scaling past N = {graphs} (the global batch, in graphs) splits graphs between "
            "workers: there the model only extrapolates the edges per worker and their spread"
        )
    networks = dict(network.PRESETS)
    configured = network.network_from_config(scaling)
    if configured != networks.get(configured.name):
        networks[f"{configured.name} (config)"] = configured
    inputs = {"step_compute_s": model.step_s, "gradient_bytes": model.gradient_bytes}
    efficiency = {
        k: [dataclasses.asdict(p) for p in maths.predict_scaling(model, v, mode)]
        for k, v in networks.items()
    }
    link = network.PRESETS[measured_network]
    validation = maths.validate_against(runs, mode, link, ceilings, also)
    if not validation:
        notes.append("no multi-worker run measured: the model could not be checked here")
    networks_json = {name: dataclasses.asdict(net) for name, net in networks.items()}
    prediction = {**inputs, "model": dataclasses.asdict(model), "networks": networks_json}
    return {**prediction, "efficiency": efficiency}, validation


def _json(report: ScalingReport) -> dict[str, Any]:
    definitions = {
        k: v if isinstance(v, str) else v[report.mode] for k, v in render.DEFINITIONS.items()
    }
    data = {"mode": report.mode, "config_name": report.config_name}
    data |= {"scaling_config": dataclasses.asdict(report.scaling), "definitions": definitions}
    data |= {"rows": report.table.to_dict("records"), "prediction": report.prediction}
    data |= {"validation": list(map(dataclasses.asdict, report.validation))}
    return {**data, "notes": report.notes}  # NaN metrics become null in write_json
