"""The one training loop, for every distribution strategy (local, Horovod, Mirrored, MultiWorker).

Data flow of one run::

    manifest -> balanced epoch plan -> per-worker tf.data -> Trainer.step (local gradients,
    exchange through ``Workers``, Adam) -> validation reduced over workers -> TensorBoard,
    checkpoints and timing records (chief only).

Every second of an epoch is booked to a part (``timing.EPOCH_PARTS``) by a ``timing.PartClock``;
what no part claims is the epoch's rest, which the chief reports when it exceeds
``timing.REST_LIMIT`` of the wall time.

Public symbols: ``fit``, ``train``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from hvdtrack.config import Config, config_to_dict
from hvdtrack.distributed import elastic
from hvdtrack.distributed.stop import PREEMPTED_EXIT_CODE, StopSignals
from hvdtrack.errors import TrainingError
from hvdtrack.runs import rundir, runinfo, timing
from hvdtrack.runs.energy import EnergyMeter
from hvdtrack.runs.summaries import Summaries
from hvdtrack.train.checkpoints import Checkpoints
from hvdtrack.train.trainer import Trainer
from hvdtrack.utils import console, memory

log = logging.getLogger(console.LOGGER_NAME)


@dataclasses.dataclass
class _EpochTally:
    """What one rank did in the steps of one epoch."""

    losses: list = dataclasses.field(default_factory=list)
    edges: int = 0  # over all workers
    my_graphs: int = 0  # this rank's share
    my_edges: int = 0
    stopped: bool = False


class _Fit:
    """One call of ``fit``: epochs of steps, with summaries, checkpoints and timing records."""

    def __init__(self, trainer: Trainer):
        self.t = trainer
        self.cfg = trainer.config
        self.tc = trainer.config.train
        self.workers = trainer.workers
        self.chief = self.workers.is_chief
        self.run_dir = Path(self.tc.run_dir)
        self.steps: list[timing.StepTiming] = []  # this rank's, not yet gathered
        self.epochs: list[timing.EpochTiming] = []
        self.prior_steps: list[timing.StepTiming] = []  # every rank's, gathered
        self.prior_epochs: list[timing.EpochTiming] = []
        self.graphs_done = self.edges_done = 0
        self.val_metrics: dict[str, float] = {}
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.stop_at: Optional[int] = None
        self.compile_s: Optional[float] = None
        self.signals = StopSignals()
        self.preempted = False  # a rank got a stop signal: all stop after the same step
        self.elastic = elastic.is_elastic(self.cfg.distributed.strategy)
        self.commit: Callable[[], None] = lambda: None  # elastic.run sets the state's commit
        self.resets: list[dict[str, Any]] = []  # elastic restarts
        self.best_loss = math.inf
        self.epoch_timings_from = 0  # index in prior_steps of the current epoch's first step
        console.setup_logging(self.workers.rank, self.chief)

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self._check_resume()  # before anything is written: a refused resume changes nothing
        if self.chief:
            rundir.prepare(self.run_dir, self.cfg)
        if not self.elastic:  # elastic: no collective before the elastic loop (joiners sync)
            self.workers.barrier()
        self.checkpoints = Checkpoints(self.t, self.run_dir)
        previous = self._restore()
        self.t.resize()  # a checkpoint of a run that had another worker count (elastic)
        if int(self.t.state.epoch.numpy()) >= self.tc.epochs:
            return self._info("finished", previous.info.get("metrics") if previous else None)
        self.summaries = Summaries(self.cfg, self.workers, self.run_dir)
        if self.workers.shares_cores:
            yields = os.environ.get("OMPI_MCA_mpi_yield_when_idle") == "1"
            log.info(
                f"{self.workers.local_size} ranks share {self.workers.host_cores} cores on this "
                f"host ({self.workers.threads} thread(s) each"
                + (", Open MPI yields while waiting" if yields else "")
                + "): more ranks than cores add no speed"
            )
        if previous is None:
            t = self.t
            imbalance = t.data.plan(t.state.position()[0]).mean_imbalance
            self.summaries.start(
                t.size.global_batch, t.learning_rate, t.size.steps_per_epoch, imbalance
            )
        self.meter = EnergyMeter(
            self.cfg.scaling,
            devices=self.workers.local_replicas,
            local_rank=self.workers.local_rank,
            local_size=self.workers.local_size,
        )
        self.meter.start()
        self.best_loss = min((e.val["loss"] for e in self.prior_epochs if e.val), default=math.inf)
        if self.tc.stop_after_steps:
            self.stop_at = int(self.t.state.optimizer.step.numpy()) + self.tc.stop_after_steps
        self.compile_s = self.t.step.compile()
        try:
            with self.signals:
                if self.elastic:
                    return elastic.run(self, self._train)
                return self._train()
        except BaseException:
            # No collective here: another rank may already be gone. Rank 0 keeps its own records.
            if self.chief:
                timing.write_run(
                    self.run_dir,
                    self._info("failed", self.val_metrics),
                    self.prior_steps + self.steps,
                    self.prior_epochs + self.epochs,
                )
            raise

    def _train(self) -> dict[str, Any]:
        """The epochs from the position the trainer holds, then the run's end. Elastic
        training calls it again after every restart, from the last commit."""
        self.t.resize()  # elastic: the position may have come from rank 0 since
        start_epoch, start_step = (
            int(self.t.state.epoch.numpy()),
            int(self.t.state.step_in_epoch.numpy()),
        )
        self.global_step = int(self.t.state.optimizer.step.numpy())
        stopped = False
        clock = timing.PartClock()
        for epoch in range(start_epoch, self.tc.epochs):
            first = start_step if epoch == start_epoch else 0
            stopped, val = self._epoch(epoch, first, clock)
            if stopped:
                break
            clock = timing.PartClock()  # the next epoch's interval starts here
            self._save(epoch + 1, 0, clock, val)
            with clock.part("records_s"):
                self.commit()  # elastic: workers that joined start here
            if self._stop_due() and epoch + 1 < self.tc.epochs:
                stopped = True
                break
        return self._finish(stopped)

    def follow_workers(self) -> None:
        """After an elastic restart: the trainer, the chief and its outputs follow the new
        worker set (the old chief may be gone)."""
        self.t.resize()
        chief = self.workers.is_chief
        console.setup_logging(self.workers.rank, chief)
        if chief != self.chief:
            self.chief = chief
            self.summaries.close()
            self.summaries = Summaries(self.cfg, self.workers, self.run_dir)

    def _epoch(
        self, epoch: int, first: int, clock: timing.PartClock
    ) -> tuple[bool, Optional[dict]]:
        """Trains one epoch from step ``first`` and validates; records it unless stopped.
        Returns (stopped, validation metrics or None)."""
        t = self.t
        bookkeeping_parts = ("checkpoint_s", "records_s", "summaries_s")
        # Already booked to this interval: the previous epoch's records, checkpoint and commit.
        booked = sum(clock.parts[p] for p in bookkeeping_parts)
        memory.reset_peak()
        train_start = time.perf_counter()
        self.epoch_timings_from = len(self.prior_steps)  # this epoch's steps, once gathered
        with clock.part("pipeline_s"):
            batches = t.data.batches(epoch, first, t.size.steps_per_epoch)
        tally = self._steps(epoch, first, batches, clock)
        with clock.part("pipeline_s"):
            batches.close()  # ends the epoch's pipelines
        if tally.stopped:
            return True, None
        # Training time: pipeline and steps; step checkpoints, records and summaries taken out.
        bookkeeping = sum(clock.parts[p] for p in bookkeeping_parts) - booked
        train_s = time.perf_counter() - train_start - bookkeeping
        val = None
        if (epoch + 1) % self.tc.validate_every_epochs == 0 or epoch + 1 == self.tc.epochs:
            with clock.part("validation_s"):
                val = self.val_metrics = t.evaluate("val")
        with clock.part("summaries_s"):
            self.summaries.epoch(self.global_step, train_s, tally.edges, t.data.plan(epoch), val)
            log.info(console.epoch_line(epoch, self.tc.epochs, train_s, tally.losses, val or {}))
        # The record's wall time ends here: what follows (its records and checkpoint) belongs
        # to the next interval.
        self.epochs.append(self._epoch_timing(epoch, first, train_s, tally, val, clock))
        return False, val

    def _save(self, epoch: int, step: int, clock: timing.PartClock, val=None) -> None:
        """Writes the records, then the checkpoint to resume at (``epoch``, ``step``), and
        ``best/`` when ``val`` improved on every earlier validation.

        In this order a crash between the two resumes from the previous checkpoint, and the
        resume trims the records to its position: records and checkpoints always agree."""
        with clock.part("records_s"):
            self._write_timings("running", epoch - 1 if step == 0 else None)
        with clock.part("checkpoint_s"):
            self.checkpoints.save(epoch, step)
            if val and val["loss"] < self.best_loss:
                self.best_loss = val["loss"]
                self.checkpoints.save_best(epoch)

    def _steps(self, epoch: int, first: int, batches, clock: timing.PartClock) -> _EpochTally:
        t, tc = self.t, self.tc
        plan = t.data.plan(epoch)
        passes = self.cfg.distributed.backward_passes_per_step
        tally = _EpochTally()
        bar = console.progress(
            self.chief and tc.progress_bar,
            t.size.steps_per_epoch,
            first,
            epoch,
            tc.epochs,
            interval=tc.progress_interval_s,
        )
        for step in range(first, t.size.steps_per_epoch):
            with clock.part("summaries_s"):
                self.summaries.profile(self.global_step)
            last = step + 1 == t.size.steps_per_epoch  # the epoch's end saves anyway
            times = t.step.run(
                batches,
                stop=self.signals.received is not None,
                checkpoint=self.chief and not last and self.checkpoints.due(),
            )
            self.preempted = self.preempted or times.stop
            for part in ("data_s", "compute_s", "exchange_s"):
                clock.add(part, getattr(times, part))
            if not (math.isfinite(times.loss) and math.isfinite(times.grad_norm)):
                raise TrainingError(
                    f"the training loss is {times.loss} and the gradient norm {times.grad_norm} "
                    f"at epoch {epoch} step {step} (global step "
                    f"{self.global_step}); stopped without saving. Last good checkpoint: "
                    f"{self.checkpoints.latest.latest_checkpoint or 'none'}. Lower "
                    "train.learning_rate or set train.grad_clip_norm"
                )
            rows = slice(step * passes, (step + 1) * passes)
            step_edges = int(plan.edges[rows].sum())
            self._step_timing(epoch, step, first, times, plan, rows, tally, step_edges)
            self.global_step += 1
            with clock.part("summaries_s"):
                imbalance = float(plan.step_imbalance[rows].max())
                self.summaries.step(
                    self.global_step, times, t.size.global_batch, step_edges, imbalance
                )
                bar.update(step, times.loss, step_edges / times.total_s)
            t.state.step_in_epoch.assign(step + 1)
            every = tc.checkpoint_every_steps
            tally.stopped = self._stop_due() and not last
            if (
                tally.stopped
                or times.checkpoint
                or (every and self.global_step % every == 0 and not last)
            ):
                self._save(epoch, step + 1, clock)
            if tally.stopped:
                break
        with clock.part("summaries_s"):
            bar.close()
        return tally

    def _stop_due(self) -> bool:
        return self.preempted or (self.stop_at is not None and self.global_step >= self.stop_at)

    # -- records ------------------------------------------------------------------------
    def _step_timing(self, epoch, step, first, times, plan, rows, tally, step_edges) -> None:
        t, workers = self.t, self.workers
        passes = self.cfg.distributed.backward_passes_per_step
        my_graphs = self.tc.batch_graphs * passes * workers.local_replicas
        my_edges = int(plan.edges[rows][:, workers.replica_ids].sum())
        self.steps.append(
            timing.StepTiming(
                epoch=epoch,
                step=step,
                rank=workers.rank,
                data_s=times.data_s,
                compute_s=times.compute_s,
                exchange_s=times.exchange_s,
                total_s=times.total_s,
                graphs=my_graphs,
                edges=my_edges,
                warmup=(step - first) < self.cfg.scaling.timing_warmup_steps,
            )
        )
        tally.losses.append(times.loss)
        tally.edges += step_edges
        self.graphs_done += t.size.global_batch
        self.edges_done += step_edges
        tally.my_graphs += my_graphs
        tally.my_edges += my_edges

    def _epoch_timing(self, epoch, first, train_s, tally, val, clock) -> timing.EpochTiming:
        return timing.EpochTiming(
            epoch=epoch,
            rank=self.workers.rank,
            time_s=train_s,
            wall_s=clock.wall(),
            steps=self.t.size.steps_per_epoch - first,
            graphs=tally.my_graphs,  # this rank's share; ranks add up
            edges=tally.my_edges,
            train_loss=float(np.mean(tally.losses)) if tally.losses else float("nan"),
            val=dict(val) if val else None,
            workers=self.workers.num_replicas,
            peak_rss_bytes=memory.peak_rss_bytes(),
            peak_gpu_bytes=max(
                (
                    memory.device_peak_bytes(d.name) or 0
                    for d in tf.config.list_logical_devices("GPU")
                ),
                default=None,
            ),
            **clock.parts,
        )

    def _gather(self, records: list, cls: type) -> list:
        """``records`` (dataclasses) of every rank, concatenated in rank order, on every rank."""
        payload = np.frombuffer(
            json.dumps([dataclasses.asdict(r) for r in records]).encode(), np.uint8
        )
        sizes = self.workers.allgather_host(np.array([payload.size], np.int64))
        joined = self.workers.allgather_host(payload).tobytes()
        out, start = [], 0
        for size in sizes:
            out += [cls(**d) for d in json.loads(joined[start : start + int(size)])]
            start += int(size)
        return out

    def _write_timings(self, status: str, epoch: Optional[int], energy=None) -> dict[str, Any]:
        """Gathers every rank's new records and has the chief rewrite run.json and timing.jsonl
        (every rank runs the same steps, so every rank reaches these collectives)."""
        new_steps = self._gather(self.steps, timing.StepTiming)
        new_epochs = self._gather(self.epochs, timing.EpochTiming)
        self.prior_steps += new_steps
        self.prior_epochs += new_epochs
        self.steps, self.epochs = [], []
        info = self._info(status, self.val_metrics, energy)
        if self.chief:
            timing.write_run(self.run_dir, info, self.prior_steps, self.prior_epochs)
            if epoch is not None:  # this epoch's records only: the cost stays per epoch
                steps = [r for r in self.prior_steps[self.epoch_timings_from :] if r.epoch == epoch]
                epochs = [r for r in new_epochs if r.epoch == epoch]
                run = timing.Run(self.run_dir, info, steps, epochs)
                self.summaries.accounts(self.global_step, run, epoch)
        return info

    def _info(self, status: str, metrics, energy=None) -> dict[str, Any]:
        cfg_dict = config_to_dict(self.cfg)
        described = self.workers.describe()
        return runinfo.make_run_info(
            config_name=self.cfg.name,
            config_hash=runinfo.hash_config(cfg_dict),
            strategy=described.pop("strategy"),
            num_workers=described.pop("num_workers"),
            batch_graphs=self.tc.batch_graphs,
            global_batch_graphs=self.t.size.global_batch,
            learning_rate=self.t.learning_rate,
            epochs=self.tc.epochs,
            device_kind=self.cfg.scaling.device_kind,
            config=cfg_dict,
            status=status,
            started=self.started,
            finished=time.strftime("%Y-%m-%dT%H:%M:%S") if status != "running" else None,
            host=rundir.hostname(),
            num_params=int(sum(np.prod(v.shape) for v in self.t.state.variables)),
            gradient_bytes=int(
                sum(np.prod(v.shape) * v.dtype.size for v in self.t.state.variables)
            ),
            graphs_processed=self.graphs_done,
            edges_processed=self.edges_done,
            metrics=metrics or {},
            energy=energy,
            steps_per_epoch=self.t.size.steps_per_epoch,
            # tracing the step's compiled parts, before the first epoch (seconds, this rank)
            compile_s=self.compile_s,
            # max/mean edges per worker per step, mean over the steps of the first epoch's plan
            edge_imbalance=self.t.size.edge_imbalance,
            stopped_by="signal" if self.preempted and status == "stopped" else None,
            dataset_digest=self.t.data.digest,
            elastic_resets=list(self.resets) if self.elastic else None,
            # whole graphs, or subgraph mini-batches (train.subgraphs; records count seed edges)
            input_mode="subgraphs" if self.tc.subgraphs.enabled else "graphs",
            # distributed.stages: {"num_stages": S, "micro_batches": M}, None without stages
            stages=self.cfg.distributed.stages.run_info(),
            **described,
        )

    # -- start and end ------------------------------------------------------------------
    def _check_resume(self) -> None:
        info_file = self.run_dir / timing.RUN_INFO_FILE
        if not (self.tc.resume and info_file.exists()):
            return
        latest = tf.train.latest_checkpoint(str(self.run_dir / "checkpoints"))
        step_in_epoch = 0
        if latest:  # the position it holds (its number is the optimizer step: elastic runs
            # change the steps per epoch, so the number does not tell)
            reader = tf.train.load_checkpoint(latest)
            step_in_epoch = int(reader.get_tensor("step_in_epoch/.ATTRIBUTES/VARIABLE_VALUE"))
        rundir.check_resume(
            self.run_dir,
            timing.read_run(self.run_dir).info,
            self.cfg,
            self.workers.num_replicas,
            latest,
            self.t.data.digest,
            step_in_epoch,
        )

    def _restore(self) -> Optional[timing.Run]:
        """Restores the newest checkpoint (when resuming) and the records written so far."""
        resume = self.tc.resume
        previous = (
            timing.read_run(self.run_dir)
            if resume and (self.run_dir / timing.RUN_INFO_FILE).exists()
            else None
        )
        restored = self.t.state.restore(
            self.checkpoints.directory if resume else None, broadcast=not self.elastic
        )
        if not restored:
            return None
        if previous is not None:
            # Only what the checkpoint holds: steps that ran after it (before a crash) run again.
            at = (int(self.t.state.epoch.numpy()), int(self.t.state.step_in_epoch.numpy()))
            self.prior_steps = [r for r in previous.steps if (r.epoch, r.step) < at]
            self.prior_epochs = [r for r in previous.epochs if r.epoch < at[0]]
            self.graphs_done = sum(r.graphs for r in self.prior_steps)
            self.edges_done = sum(r.edges for r in self.prior_steps)
            self.started = previous.info.get("started") or self.started
        return previous

    def _finish(self, stopped: bool) -> dict[str, Any]:
        reading = self.meter.stop()
        energy = dataclasses.asdict(reading)
        energy["joules"] = float(self.workers.allreduce_host(np.array([reading.joules]))[0])
        info = self._write_timings("stopped" if stopped else "finished", None, energy)
        note = " (stopped: run the same command again to resume)" if stopped else ""
        if self.preempted and stopped:
            got = f"{self.signals.received} here" if self.signals.received else "on another rank"
            note = (
                f" (stopped by a signal ({got}) after global step {self.global_step}, "
                f"checkpoint saved: run the same command again to resume; exit code "
                f"{PREEMPTED_EXIT_CODE})"
            )
        log.info(f"run directory: {self.run_dir}{note}")
        self.summaries.close()
        # No rank leaves before the chief's files are complete: a launcher ends the other ranks
        # as soon as one exits with a non-zero code (75 after a signal).
        self.workers.barrier()
        return info


def fit(trainer: Trainer) -> dict[str, Any]:
    """Trains for ``train.epochs`` epochs (resuming if a checkpoint exists); returns run info."""
    return _Fit(trainer).run()


def train(config: Config) -> dict[str, Any]:
    """Trains one run as configured; returns the run info written to ``run.json``.

    Raises:
      TrainingError: also when Horovod shut down because a rank stopped answering
        (``distributed.deadline_s``) or failed: the message says so instead of TensorFlow's.
    """
    trainer = Trainer(config)
    try:
        return fit(trainer)
    except tf.errors.OpError as err:
        if "Horovod has been shut down" not in str(err):
            raise
        raise TrainingError(
            f"rank {trainer.workers.rank}: Horovod shut down while this rank waited at a "
            "collective: another rank failed, or did not join it for distributed.deadline_s "
            f"({config.distributed.deadline_s} s). See the other ranks' output; rerun the same "
            "command to resume from the last checkpoint"
        ) from None
    finally:
        trainer.workers.shutdown()
