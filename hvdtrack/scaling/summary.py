"""The report of one training run: epochs, their accounting, step statistics, throughput, cost.

``python -m hvdtrack.scaling report RUN_DIR`` (one run; ``summary`` is the same) writes
``summary.md`` and ``summary.json``; the main job writes it for its run. The accounting table
splits every epoch of every rank into the parts of ``hvdtrack.train.timing.EPOCH_PARTS`` plus the
wait at the gradient exchange, and flags an epoch whose unaccounted rest exceeds
``timing.REST_LIMIT`` of its wall time. Comparing runs of several worker counts is ``report``'s
job with several run directories.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from hvdtrack.scaling import maths
from hvdtrack.train import timing
from hvdtrack.train.timing import Run, read_run
from hvdtrack.utils.io import atomic_write, write_json

STEP_FIELDS_SHOWN = ("data_s", "compute_s", "exchange_s", "total_s")


def summarize(run: Run) -> dict[str, Any]:
    """Plain numbers describing ``run`` (see the module docstring)."""
    info = run.info
    scaling = info.get("config", {}).get("scaling", {})
    warmup_epochs = int(scaling.get("timing_warmup_epochs", 1))
    workers = int(info["num_workers"])
    devices = workers * int(scaling.get("devices_per_worker", 1))
    epoch_s = maths.epoch_time(run, warmup_epochs)
    work = maths.epoch_work(run, warmup_epochs)
    energy = info.get("energy") or {}
    seconds = float(energy.get("seconds") or 0.0)
    watts = (
        float(energy["joules"]) / seconds
        if seconds > 0
        else float(scaling.get("device_power_watts", 0)) * devices
    )
    rank0 = sorted((e for e in run.epochs if e.rank == 0), key=lambda e: e.epoch)
    epoch_rows = [
        {
            "epoch": e.epoch + 1,
            "seconds": e.time_s,
            "edges_per_s": e.edges / e.time_s if e.time_s > 0 else float("nan"),
            "train_loss": e.train_loss,
            **{
                f"val_{k}": v
                for k, v in (e.val or {}).items()
                if k in ("loss", "auc", "efficiency", "purity")
            },
        }
        for e in rank0
    ]
    accounts = timing.epoch_accounts(run)
    return {
        "accounts": accounts,
        "flagged_epochs": sum(1 for row in accounts if row["flagged"]),
        "rest_limit": timing.REST_LIMIT,
        "step_sum_s": maths.epoch_step_time(run, warmup_epochs),
        "run_dir": str(run.path),
        "config_name": info.get("config_name"),
        "status": info.get("status"),
        "strategy": info.get("strategy"),
        "num_workers": workers,
        "threads_per_worker": info.get("threads_per_worker"),
        "global_batch_graphs": info.get("global_batch_graphs"),
        "learning_rate": info.get("learning_rate"),
        "epochs": len(rank0),
        "epoch_s": epoch_s,
        "epoch_s_includes_warmup": maths.epoch_time_includes_warmup(run, warmup_epochs),
        "graphs_per_s": maths.throughput(work["graphs"], epoch_s),
        "edges_per_s": maths.throughput(work["edges"], epoch_s),
        "edges_per_s_per_worker": maths.throughput_per_worker(work["edges"], epoch_s, workers),
        "step_statistics": {
            field: maths.step_statistics(maths.step_times(run, field))
            for field in STEP_FIELDS_SHOWN
        },
        "device_kind": info.get("device_kind"),
        "devices": devices,
        "cost_per_epoch": maths.cost_per_epoch(
            devices, epoch_s, float(scaling.get("price_per_device_hour", 0))
        ),
        "price_per_device_hour": scaling.get("price_per_device_hour"),
        "energy_per_epoch_j": maths.energy_per_epoch(watts, epoch_s),
        "energy_source": energy.get("source", "estimate"),
        "metrics": info.get("metrics", {}),
        "epoch_table": epoch_rows,
    }


def render(summary: dict[str, Any]) -> str:
    """The summary as Markdown."""
    s = summary
    source = s["energy_source"]
    lines = [
        f"# Run {s['run_dir']}",
        "",
        f"`{s['config_name']}`, {s['strategy']} with {s['num_workers']} workers "
        f"({s['threads_per_worker']} threads each), global batch {s['global_batch_graphs']} graphs, "
        f"learning rate {s['learning_rate']:.3g}, {s['epochs']} epochs, status {s['status']}.",
        "",
        "| epoch s | graphs/s | edges/s | edges/s per worker | cost/epoch | energy/epoch |",
        "|---|---|---|---|---|---|",
        f"| {s['epoch_s']:.2f} | {s['graphs_per_s']:.2f} | {s['edges_per_s']:,.0f} | "
        f"{s['edges_per_s_per_worker']:,.0f} | ${s['cost_per_epoch']:.5f} | "
        f"{s['energy_per_epoch_j']:,.0f} J ({source}) |",
        "",
        f"Epoch time: median over epochs{'' if s['epoch_s_includes_warmup'] else ' after the first'}, "
        f"slowest rank. Cost: {s['devices']} {s['device_kind']} x epoch hours x "
        f"${s['price_per_device_hour']}/device-hour. Energy: {source}"
        + (" (configured power, no counter readable here)." if source == "estimate" else "."),
        "",
        "Step times (s, slowest rank per step, warm-up steps excluded):",
        "",
        "| | mean | std | min | median | max | steps |",
        "|---|---|---|---|---|---|---|",
    ]
    if s["step_sum_s"]:
        lines[-4:-4] = [
            f"Epoch time {s['epoch_s']:.2f} s against {s['step_sum_s']:.2f} s in its steps (sum "
            f"of the slowest rank's step times, median over the same epochs): ratio "
            f"{s['epoch_s'] / s['step_sum_s']:.3f}.",
            "",
        ]
    for field, st in s["step_statistics"].items():
        lines.append(
            f"| {field} | {st['mean']:.4f} | {st['std']:.4f} | {st['min']:.4f} | {st['median']:.4f} | "
            f"{st['max']:.4f} | {int(st['count'])} |"
        )
    lines += [
        "",
        "| epoch | s | edges/s | train loss | val loss | AUC | efficiency | purity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in s["epoch_table"]:
        lines.append(
            f"| {row['epoch']} | {row['seconds']:.1f} | {row['edges_per_s']:,.0f} | {row['train_loss']:.4f} | "
            + " | ".join(
                f"{row.get(k, float('nan')):.4f}"
                for k in ("val_loss", "val_auc", "val_efficiency", "val_purity")
            )
            + " |"
        )
    lines += ["", *_accounts_lines(s)]
    m = s["metrics"]
    if m:
        lines += [
            "",
            "Final validation: "
            + ", ".join(
                f"{k} {v:.4f}"
                for k, v in m.items()
                if k != "num_edges" and isinstance(v, float) and np.isfinite(v)
            ),
        ]
    return "\n".join(lines) + "\n"


def write_summary(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Reads ``run_dir``, writes ``summary.md`` and ``summary.json`` into ``out``; returns the .md path."""
    run = read_run(run_dir)
    summary = summarize(run)
    out = Path(out) if out is not None else Path(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "summary.md") as f:
        f.write(render(summary))
    write_json(out / "summary.json", summary)
    return out / "summary.md"


ACCOUNT_COLUMNS = (
    ("wall", "wall_s"),
    ("train", "time_s"),
    ("data", "data_s"),
    ("compute", "compute_s"),
    ("exchange", "exchange_s"),
    ("of it wait", "wait_s"),
    ("pipeline", "pipeline_s"),
    ("validation", "validation_s"),
    ("checkpoint", "checkpoint_s"),
    ("summaries", "summaries_s"),
    ("records", "records_s"),
    ("rest", "rest_s"),
)


def _accounts_lines(summary: dict[str, Any]) -> list[str]:
    """The per-epoch, per-rank accounting table, with a verdict line above it."""
    rows, limit = summary["accounts"], summary["rest_limit"]
    flagged = summary["flagged_epochs"]
    verdict = (
        f"every epoch of every rank accounted for within {limit:.0%} of its wall time"
        if not flagged
        else f"**{flagged} epoch(s) with more than {limit:.0%} of the wall time unaccounted** "
        "(marked below)"
    )
    lines = [
        f"Where the time went (seconds per epoch and rank; {verdict}). Wall: from the previous "
        "epoch's record to this one's; train: the epoch time above (pipeline and steps); the "
        "exchange holds the wait for slower ranks; records: gathering and writing the previous "
        "epoch's records; rest: what no part accounts for.",
        "",
        "| epoch | rank | " + " | ".join(name for name, _ in ACCOUNT_COLUMNS) + " | rest % |",
        "|---|---|" + "---|" * (len(ACCOUNT_COLUMNS) + 1),
    ]
    for row in rows:
        mark = " over" if row["flagged"] else ""
        lines.append(
            f"| {row['epoch'] + 1} | {row['rank']} | "
            + " | ".join(f"{row[key]:.2f}" for _, key in ACCOUNT_COLUMNS)
            + f" | {row['rest_fraction']:.1%}{mark} |"
        )
    return lines
