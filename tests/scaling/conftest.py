"""Synthetic run directories with literal timings, written through the real write_run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import pytest

from hvdtrack.runs.runinfo import make_run_info
from hvdtrack.runs.timing import EPOCH_PARTS, EpochTiming, StepTiming, write_run

BASE_CONFIG = {
    "model": {"hidden": 64, "iterations": 4},
    "train": {"run_dir": "x", "batch_graphs": 1, "epochs": 2, "learning_rate": 0.001},
    "distributed": {"strategy": "horovod"},
    "scaling": {"device_kind": "gpu", "price_per_device_hour": 3.0, "device_power_watts": 10.0},
}


def write_synthetic_run(
    run_dir: Path,
    n: int,
    *,
    epoch_s: Sequence[Sequence[float]],
    step_s: Sequence[float],
    batch_graphs: int,
    global_batch_graphs: Optional[int] = None,
    warmup_steps: int = 2,
    status: str = "finished",
    config: Optional[dict[str, Any]] = None,
    energy: Optional[dict[str, Any]] = None,
    metrics: Optional[dict[str, float]] = None,
    exchange_s: float = 0.0,
    gradient_bytes: Optional[int] = 4_000_000,
    info: Optional[dict[str, Any]] = None,
) -> Path:
    """A run of ``n`` ranks.

    epoch_s[e][rank] is rank's time for epoch e; step_s[k] is the k-th step's time on every rank
    (rank r adds r * 0.001 s, so the slowest rank is the last); steps are spread evenly over the
    epochs and the first ``warmup_steps`` of each rank are marked warm-up; ``info``: more run.json
    keys (``input_mode``, ``pipeline``).
    """
    num_epochs = len(epoch_s)
    per_epoch = len(step_s) // num_epochs
    steps = []
    for rank in range(n):
        for k, total in enumerate(step_s):
            steps.append(
                StepTiming(
                    epoch=k // per_epoch,
                    step=k % per_epoch,
                    rank=rank,
                    data_s=0.01,
                    compute_s=total - 0.01 - exchange_s,
                    exchange_s=exchange_s,
                    total_s=total + rank * 0.001,
                    graphs=batch_graphs,
                    edges=batch_graphs * 100,
                    warmup=k < warmup_steps,
                )
            )
    epochs = [
        EpochTiming(
            epoch=e,
            rank=rank,
            time_s=epoch_s[e][rank],
            wall_s=epoch_s[e][rank],
            steps=per_epoch,
            graphs=per_epoch * batch_graphs,
            edges=per_epoch * batch_graphs * 100,
            train_loss=0.5,
            val={"loss": 0.4},
            **{**dict.fromkeys(EPOCH_PARTS, 0.0), "compute_s": epoch_s[e][rank]},
        )
        for e in range(num_epochs)
        for rank in range(n)
    ]
    cfg = {k: dict(v) for k, v in (config or BASE_CONFIG).items()}
    cfg["train"] = {**cfg["train"], "run_dir": str(run_dir), "batch_graphs": batch_graphs}
    info = make_run_info(
        config_name="tiny",
        config_hash="abc123",
        strategy="horovod",
        num_workers=n,
        batch_graphs=batch_graphs,
        global_batch_graphs=global_batch_graphs,
        learning_rate=0.001,
        epochs=num_epochs,
        device_kind="gpu",
        config=cfg,
        status=status,
        gradient_bytes=gradient_bytes,
        metrics=metrics
        if metrics is not None
        else {"loss": 0.0412, "auc": 0.991, "efficiency": 0.958, "purity": 0.957},
        energy=energy,
        **(info or {}),
    )
    write_run(run_dir, info, steps, epochs)
    return run_dir


@pytest.fixture
def strong_runs(tmp_path: Path) -> list[Path]:
    """Strong scaling, global batch 8: epoch times 100 s, 55 s, 30 s after a slower first epoch.

    The N=2 run carries a measured RAPL energy (24 W mean power); the others are estimates.
    """
    return [
        write_synthetic_run(
            tmp_path / "strong-np1",
            1,
            epoch_s=[[150.0], [100.0]],
            step_s=[2.0, 1.5, 1.0, 1.0],
            batch_graphs=8,
        ),
        write_synthetic_run(
            tmp_path / "strong-np2",
            2,
            epoch_s=[[80.0, 81.0], [54.0, 55.0]],
            step_s=[1.0, 0.8, 0.55, 0.55],
            batch_graphs=4,
            energy={"joules": 2640.0, "source": "rapl", "watts": 24.0},
        ),
        write_synthetic_run(
            tmp_path / "strong-np4",
            4,
            epoch_s=[[45.0] * 4, [30.0, 29.0, 28.0, 27.0]],
            step_s=[0.5, 0.4, 0.3, 0.3],
            batch_graphs=2,
        ),
    ]


@pytest.fixture
def synthetic_run():
    """``write_synthetic_run`` for tests that build their own runs."""
    return write_synthetic_run


@pytest.fixture
def base_config() -> dict[str, Any]:
    """The config every synthetic run carries unless told otherwise (a copy)."""
    return {k: dict(v) for k, v in BASE_CONFIG.items()}
