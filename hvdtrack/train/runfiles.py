"""What the training loop reads from and writes into its run directory besides checkpoints:
the resume check and restore, the run's description (run.json ``info``) and its timings.

Public symbols: ``check_resume``, ``restore``, ``RunStatus``, ``run_info``, ``step_timing``,
``epoch_timing``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from hvdtrack.config import config_to_dict
from hvdtrack.entry import allocator_in_use
from hvdtrack.errors import ConfigError
from hvdtrack.inputs.balance import EpochPlan
from hvdtrack.runs import rundir, runinfo, timing
from hvdtrack.runs.history import TimingHistory
from hvdtrack.train.checkpoints import ResumePoint, number, resume_point
from hvdtrack.train.step import StepTimes
from hvdtrack.train.trainer import Trainer
from hvdtrack.utils import memory
from hvdtrack.utils.console import LOGGER_NAME


def check_resume(trainer: Trainer, run_dir: Path) -> Optional[ResumePoint]:
    """Where a resume starts (None: ``train.resume`` is off), checked against run.json: the newest
    intact checkpoint (``checkpoints.resume_point``), and ``rundir.check_resume``'s checks. Call
    before anything is written: a refused resume changes nothing. The chief warns when the
    intra-op threads per worker differ from run.json's: the resume is exact, but the steps after
    it round differently from an unbroken run (TensorFlow's CPU kernels split some gradient sums
    by thread).

    Raises:
      ConfigError: see ``rundir.check_resume``; or run.json or the folder name checkpoints of
        which none is intact (restarting would lose them silently).
    """
    if not trainer.config.train.resume:
        return None
    info_file = run_dir / timing.RUN_INFO_FILE
    previous = timing.read_run(run_dir).info if info_file.exists() else None
    recorded = (previous or {}).get("checkpoint")
    point = resume_point(run_dir / "checkpoints", recorded)
    if point.path is None and point.skipped:
        said = (
            f"{info_file} names checkpoint {recorded} (optimizer step {number(recorded)})"
            if recorded
            else f"{run_dir} held checkpoints"
        )
        raise ConfigError(
            f"{said}, but none is intact in {run_dir / 'checkpoints'}: "
            f"{'; '.join(point.skipped)}. Resuming would restart at epoch 1: put the checkpoints "
            "back, or use train.resume=false to start afresh there, or another train.run_dir"
        )
    if previous is None:
        return point
    step_in_epoch = 0
    if point.path:  # the position it holds (its number is the optimizer step: elastic runs
        # change the steps per epoch, so the number does not tell)
        reader = tf.train.load_checkpoint(point.path)
        step_in_epoch = int(reader.get_tensor("step_in_epoch/.ATTRIBUTES/VARIABLE_VALUE"))
    rundir.check_resume(
        run_dir,
        previous,
        trainer.config,
        trainer.workers.num_replicas,
        point.path,
        trainer.data.digest,
        step_in_epoch,
    )
    old_threads, threads = previous.get("threads_per_worker"), trainer.workers.threads
    if (
        point.path
        and old_threads is not None
        and old_threads != threads
        and trainer.workers.is_chief
    ):
        logging.getLogger(LOGGER_NAME).warning(
            f"{run_dir} was trained with {old_threads} intra-op thread(s) per worker, this run "
            f"has {threads}: the resume is exact, but TensorFlow's CPU kernels split some sums "
            "(the weight and bias gradients) by thread, so the steps from here round "
            "differently from an unbroken run with the old count (float32 rounding, not a "
            "change of method); set distributed.threads_per_worker to keep them the same"
        )
    return point


def checkpoint_bytes(trainer: Trainer) -> int:
    """About the room training needs to save: two checkpoints (a new one is written before the
    oldest goes, and ``best/``) of the weights and their two Adam moments, and 100 kB of records."""
    weights = sum(int(np.prod(v.shape)) * v.dtype.size for v in trainer.state.variables)
    return 2 * 3 * weights + 100_000


def restore(
    trainer: Trainer, point: Optional[ResumePoint], history: TimingHistory, broadcast: bool
) -> Optional[timing.Run]:
    """Restores the resume point's checkpoint (``check_resume``; None: a fresh start) and the
    timings written so far, trimmed to its position; returns the run read back, or None."""
    run_dir = Path(trainer.config.train.run_dir)
    has_info = (run_dir / timing.RUN_INFO_FILE).exists()
    previous = timing.read_run(run_dir) if point is not None and has_info else None
    restored = trainer.state.restore(point.path if point else None, broadcast)
    if not restored:
        return None
    if previous is not None:
        history.resume_from(previous, trainer.state.position())
    return previous


@dataclasses.dataclass
class RunStatus:
    """How the run stands, for its description: when it started, compile time, elastic
    restarts, whether a signal stopped it, the last validation."""

    started: str = dataclasses.field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))
    compile_s: Optional[float] = None
    resets: Optional[list[dict[str, Any]]] = None  # elastic runs: their restarts
    preempted: bool = False  # a rank got a stop signal: all stop after the same step
    val_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    # The newest checkpoint saved (``ckpt-N``), or the one being saved as run.json is written
    # just before it: a resume checks run.json against the checkpoints with it.
    checkpoint: Optional[str] = None


def run_info(
    trainer: Trainer,
    history: TimingHistory,
    run: RunStatus,
    state: str,
    metrics: Optional[dict] = None,
    energy: Optional[dict] = None,
) -> dict[str, Any]:
    """run.json's ``info`` for the run as it stands (``state``: running, stopped, ...)."""
    config, variables, size = trainer.config, trainer.state.variables, trainer.size
    cfg_dict = config_to_dict(config)
    described = trainer.workers.describe()
    return runinfo.make_run_info(
        config_name=config.name,
        config_hash=runinfo.hash_config(cfg_dict),
        strategy=described.pop("strategy"),
        num_workers=described.pop("num_workers"),
        batch_graphs=config.train.batch_graphs,
        global_batch_graphs=size.global_batch,
        learning_rate=trainer.learning_rate,
        epochs=config.train.epochs,
        device_kind=config.scaling.device_kind,
        config=cfg_dict,
        status=state,
        started=run.started,
        finished=time.strftime("%Y-%m-%dT%H:%M:%S") if state != "running" else None,
        host=rundir.hostname(),
        num_params=int(sum(np.prod(v.shape) for v in variables)),
        gradient_bytes=int(sum(np.prod(v.shape) * v.dtype.size for v in variables)),
        graphs_processed=history.graphs_done,
        edges_processed=history.edges_done,
        metrics=metrics or {},
        energy=energy,
        steps_per_epoch=size.steps_per_epoch,
        # TensorFlow's CPU allocator, "caching" or "system": step times depend on it
        allocator=allocator_in_use(),
        # tracing the step's compiled parts, before the first epoch (seconds, this rank)
        compile_s=run.compile_s,
        # max/mean edges per worker per step, mean over the steps of the first epoch's plan
        edge_imbalance=size.edge_imbalance,
        stopped_by="signal" if run.preempted and state == "stopped" else None,
        dataset_digest=trainer.data.digest,
        elastic_resets=list(run.resets) if run.resets is not None else None,
        # whole graphs, or subgraph mini-batches (train.subgraphs; timings count seed edges)
        input_mode="subgraphs" if config.train.subgraphs.enabled else "graphs",
        # distributed.stages: {"num_stages": S, "micro_batches": M}, None without stages
        stages=config.distributed.stages.run_info(),
        checkpoint=run.checkpoint,
        **described,
    )


def step_timing(
    trainer: Trainer, epoch: int, step: int, first: int, times: StepTimes, plan: EpochPlan
) -> timing.StepTiming:
    """This rank's timing of step ``step`` of ``epoch`` (the epoch's run began at ``first``)."""
    workers, config = trainer.workers, trainer.config
    passes = config.distributed.backward_passes_per_step
    rows = slice(step * passes, (step + 1) * passes)
    return timing.StepTiming(
        epoch=epoch,
        step=step,
        rank=workers.rank,
        data_s=times.data_s,
        compute_s=times.compute_s,
        exchange_s=times.exchange_s,
        total_s=times.total_s,
        graphs=config.train.batch_graphs * passes * workers.local_replicas,
        edges=int(plan.edges[rows][:, workers.replica_ids].sum()),
        warmup=(step - first) < config.scaling.timing_warmup_steps,
    )


def epoch_timing(
    trainer: Trainer,
    epoch: int,
    steps: list[timing.StepTiming],
    losses: list[float],
    train_s: float,
    val: Optional[dict],
    clock: timing.PartClock,
) -> timing.EpochTiming:
    """This rank's timing of ``epoch``, from its ``steps`` here (its share; ranks add up)."""
    gpus = tf.config.list_logical_devices("GPU")
    return timing.EpochTiming(
        epoch=epoch,
        rank=trainer.workers.rank,
        time_s=train_s,
        wall_s=clock.wall(),
        steps=len(steps),
        graphs=sum(s.graphs for s in steps),
        edges=sum(s.edges for s in steps),
        train_loss=float(np.mean(losses)) if losses else float("nan"),
        val=dict(val) if val else None,
        workers=trainer.workers.num_replicas,
        peak_rss_bytes=memory.peak_rss_bytes(),
        peak_gpu_bytes=max((memory.device_peak_bytes(d.name) or 0 for d in gpus), default=None),
        **clock.parts,
    )
