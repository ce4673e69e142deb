"""What a run writes to TensorBoard and the console besides its timings (the chief
writes, the other ranks stay quiet): hyperparameters, step and epoch scalars, each rank's time
accounts and memory, the profiler window.

Public symbols: ``Summaries``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import tensorflow as tf

from hvdtrack.config import Config
from hvdtrack.runs import rundir, timing
from hvdtrack.utils import console

log = logging.getLogger(console.LOGGER_NAME)


class Summaries:
    """TensorBoard and console output: the chief writes, the other ranks stay quiet."""

    def __init__(self, config: Config, workers, run_dir: Path):
        self.config = config
        self.tc = config.train
        self.workers = workers  # the distribution seam (``hvdtrack.distributed.workers``)
        self.chief = workers.is_chief
        self.writer = (
            tf.summary.create_file_writer(str(run_dir / "tensorboard"))
            if self.chief
            else tf.summary.create_noop_writer()
        )
        self.profile_dir = str(run_dir / "tensorboard")
        self.profiling = False

    def start(self, global_batch: int, learning_rate: float, steps: int, imbalance: float) -> None:
        """The run's hyperparameters to TensorBoard and its shape to the console: graphs per
        step over all workers, the scaled learning rate, steps per epoch and the first epoch's
        mean max/mean edges per worker per step."""
        tc, workers = self.tc, self.workers
        rundir.write_hparams(self.writer, self.config, workers.num_replicas, global_batch)
        log.info(
            f"{workers.name}: {workers.num_replicas} workers ({workers.threads} threads each), "
            f"global batch {global_batch} graphs, learning rate {learning_rate:.3g} "
            f"({tc.lr_scaling} scaling of {tc.learning_rate:g}), {steps} steps/epoch, "
            f"edge imbalance max/mean per step {imbalance:.3f}"
        )

    def profile(self, global_step: int) -> None:
        """Starts or stops the TF profiler at the configured steps (chief only)."""
        if self.tc.profile_steps and self.chief:
            if global_step == self.tc.profile_steps[0] and not self.profiling:
                tf.profiler.experimental.start(self.profile_dir)
                self.profiling = True
            elif global_step == self.tc.profile_steps[1]:
                self.stop_profiling()

    def stop_profiling(self) -> None:
        if self.profiling:
            self.profiling = False
            tf.profiler.experimental.stop()

    def step(self, global_step: int, times, graphs: int, edges: int, imbalance: float) -> None:
        """One optimizer step (``times``: a ``train.step.StepTimes``) over ``graphs`` graphs
        and ``edges`` edges of all workers, every ``train.log_every_steps`` steps."""
        if not (self.chief and global_step % self.tc.log_every_steps == 0):
            return
        workers = self.workers.num_replicas
        step_edges = edges
        with self.writer.as_default(step=global_step):
            tf.summary.scalar("train/loss", times.loss)
            tf.summary.scalar("train/learning_rate", times.learning_rate)
            tf.summary.scalar("train/grad_norm", times.grad_norm)
            tf.summary.scalar("throughput/graphs_per_s", graphs / times.total_s)
            tf.summary.scalar("throughput/edges_per_s", step_edges / times.total_s)
            tf.summary.scalar(
                "throughput/edges_per_s_per_worker", step_edges / times.total_s / workers
            )
            tf.summary.scalar("time/step_s", times.total_s)
            tf.summary.scalar("time/data_wait_s", times.data_s)
            tf.summary.scalar("time/compute_s", times.compute_s)
            tf.summary.scalar("time/exchange_s", times.exchange_s)
            tf.summary.scalar("balance/edge_imbalance", imbalance)

    def epoch(self, global_step: int, train_s: float, edges: int, plan, val) -> None:
        """The chief's view of an epoch: training time, throughput, balance, validation."""
        if not self.chief:
            return
        with self.writer.as_default(step=global_step):
            tf.summary.scalar("time/epoch_s", train_s)
            tf.summary.scalar("throughput/epoch_edges_per_s", edges / train_s)
            tf.summary.scalar("balance/epoch_edge_imbalance", plan.mean_imbalance)
            for key, value in (val or {}).items():
                if key != "num_edges":
                    tf.summary.scalar(f"val/{key}", value)
        self.writer.flush()

    def accounts(self, global_step: int, run: timing.Run, epoch: int) -> None:
        """Every rank's split of ``epoch`` (gathered records) and its peak memory to
        TensorBoard; a rest over the limit is also a console warning."""
        if not self.chief:
            return
        rows = [r for r in timing.epoch_accounts(run) if r["epoch"] == epoch]
        with self.writer.as_default(step=global_step):
            for row in rows:
                for key in ("wall_s", *timing.EPOCH_PARTS, "wait_s", "rest_s"):
                    tf.summary.scalar(f"epoch_time/rank{row['rank']}/{key}", row[key])
            for record in run.epochs:
                for key in ("peak_rss_bytes", "peak_gpu_bytes"):
                    if getattr(record, key) is not None:
                        name = f"memory/rank{record.rank}/{key.replace('_bytes', '_gib')}"
                        tf.summary.scalar(name, getattr(record, key) / 2**30)
        self.writer.flush()
        for row in rows:
            if row["flagged"]:
                log.warning(
                    f"epoch {epoch + 1} rank {row['rank']}: {row['rest_s']:.2f} s "
                    f"({row['rest_fraction']:.1%}) of {row['wall_s']:.2f} s not accounted for"
                )

    def close(self) -> None:
        self.stop_profiling()
        self.writer.close()
