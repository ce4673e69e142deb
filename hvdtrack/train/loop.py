"""The one training loop, for every distribution strategy (local, Horovod, Mirrored, MultiWorker).

Data flow of one run::

    manifest -> balanced epoch plan -> per-worker tf.data (``TrainData``) -> ``TrainStep.run``
    (local gradients, exchange through ``Workers``, Adam) -> validation reduced over workers
    -> TensorBoard, checkpoints and timings (chief only).

The loop runs epochs of steps; what it reads and writes in the run directory besides
checkpoints (resume, run info, timings) is ``train.runfiles``, the timings it keeps
``runs.history.TimingHistory``. Every second of an epoch is booked to a part
(``timing.EPOCH_PARTS``) by a ``timing.PartClock``; what no part claims is the epoch's rest,
which the chief reports when it exceeds ``timing.REST_LIMIT`` of the wall time.

Public symbols: ``fit``, ``train``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from hvdtrack.config import Config
from hvdtrack.distributed import elastic
from hvdtrack.distributed.stop import PREEMPTED_EXIT_CODE, StopSignals
from hvdtrack.errors import TrainingError
from hvdtrack.runs import rundir, timing
from hvdtrack.runs.energy import EnergyMeter
from hvdtrack.runs.history import TimingHistory
from hvdtrack.runs.summaries import Summaries
from hvdtrack.train import runfiles
from hvdtrack.train.checkpoints import Checkpoints, repair_state
from hvdtrack.train.trainer import Trainer
from hvdtrack.utils import console, memory

log = logging.getLogger(console.LOGGER_NAME)
# Parts of an epoch's interval that are bookkeeping, not training time.
BOOKKEEPING_PARTS = ("checkpoint_s", "records_s", "summaries_s")


@dataclasses.dataclass
class _EpochTally:
    """What one rank did in the steps of one epoch."""

    losses: list = dataclasses.field(default_factory=list)
    steps: list = dataclasses.field(default_factory=list)  # this rank's step timings
    edges: int = 0  # over all workers
    stopped: bool = False


class _Fit:
    """One call of ``fit``: epochs of steps, with summaries, checkpoints and timings."""

    def __init__(self, trainer: Trainer):
        self.t = trainer
        self.workers = trainer.workers
        self.chief = self.workers.is_chief
        self.run_dir = Path(trainer.config.train.run_dir)
        self.history = TimingHistory()
        self.elastic = elastic.is_elastic(trainer.config.distributed.strategy)
        self.status = runfiles.RunStatus(resets=[] if self.elastic else None)
        self.signals = StopSignals()
        self.stop_at: Optional[int] = None
        self.commit: Callable[[], None] = lambda: None  # elastic.run sets the state's commit
        self.best_loss = math.inf
        console.setup_logging(self.workers.rank, self.chief)

    @property
    def epochs(self) -> int:
        return self.t.config.train.epochs

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """The run, with its directory locked by the chief (the other ranks write nothing
        there) from before anything is written until the end, also on errors."""
        self.lock = self._claim() if self.chief else None
        try:
            return self._run()
        finally:
            if self.lock is not None:
                self.lock.release()

    def _claim(self, wait_s: float = 0.0):
        return rundir.claim(
            self.run_dir,
            Path(self.t.config.data.dataset_dir),
            runfiles.checkpoint_bytes(self.t),
            say=log.warning,
            job=elastic.job_id() if self.elastic else "",
            wait_s=wait_s,
        )

    def _run(self) -> dict[str, Any]:
        point = runfiles.check_resume(self.t, self.run_dir)  # before anything is written
        if self.chief:
            if point is not None and point.skipped:
                log.warning(
                    f"{self.run_dir}: resuming from {point.path or 'the start'}; skipped "
                    + "; ".join(point.skipped)
                )
            rundir.prepare(self.run_dir, self.t.config, point.name if point else None)
            if point is not None:  # before any CheckpointManager reads the list
                repair_state(self.run_dir / "checkpoints", point)
        if not self.elastic:  # elastic: no collective before the elastic loop (joiners sync)
            self.workers.barrier()
        self.checkpoints = Checkpoints(self.t, self.run_dir)
        previous = runfiles.restore(self.t, point, self.history, not self.elastic)
        self.status.checkpoint = point.name if point else None
        if previous is not None:
            self.status.started = previous.info.get("started") or self.status.started
        self.t.resize()  # a checkpoint of a run that had another worker count (elastic)
        if self.t.state.position()[0] >= self.epochs:
            return self._info("finished", previous.info.get("metrics") if previous else None)
        self.summaries = Summaries(self.t.config, self.workers, self.run_dir)
        self._say_how_it_runs(fresh=previous is None)
        self.meter = EnergyMeter(
            self.t.config.scaling,
            devices=self.workers.local_replicas,
            local_rank=self.workers.local_rank,
            local_size=self.workers.local_size,
        )
        self.meter.start()
        vals = [e.val["loss"] for e in self.history.epochs if e.val]
        self.best_loss = min(vals, default=math.inf)
        if self.t.config.train.stop_after_steps:
            steps = self.t.config.train.stop_after_steps
            self.stop_at = int(self.t.state.optimizer.step.numpy()) + steps
        self.status.compile_s = self.t.step.compile()
        try:
            with self.signals:
                if self.elastic:
                    return elastic.run(self, self._train)
                return self._train()
        except BaseException:
            # No collective here: another rank may already be gone. Rank 0 keeps its own timings.
            if self.chief:
                info = self._info("failed", self.status.val_metrics)
                steps, epochs = self.history.all_steps(), self.history.all_epochs()
                try:
                    timing.write_run(self.run_dir, info, steps, epochs)
                except OSError as err:  # a full disk: the error that stopped the run tells
                    if rundir.as_disk_error(err) is None:
                        raise
            with contextlib.suppress(Exception):  # its event file closed (it may be full)
                self.summaries.close()
            raise

    def _say_how_it_runs(self, fresh: bool) -> None:
        """The run's shape to the console (and hyperparameters to TensorBoard on a fresh start)."""
        workers, t = self.workers, self.t
        if workers.shares_cores:
            yields = os.environ.get("OMPI_MCA_mpi_yield_when_idle") == "1"
            log.info(
                f"{workers.local_size} ranks share {workers.host_cores} cores on this "
                f"host ({workers.threads} thread(s) each"
                + (", Open MPI yields while waiting" if yields else "")
                + "): more ranks than cores add no speed"
            )
        if fresh:
            imbalance = t.data.plan(t.state.position()[0]).mean_imbalance
            self.summaries.start(
                t.size.global_batch, t.learning_rate, t.size.steps_per_epoch, imbalance
            )

    def _train(self) -> dict[str, Any]:
        """The epochs from the position the trainer holds, then the run's end. Elastic
        training calls it again after every restart, from the last commit."""
        self.t.resize()  # elastic: the position may have come from rank 0 since
        start_epoch, start_step = self.t.state.position()
        self.global_step = int(self.t.state.optimizer.step.numpy())
        stopped = False
        clock = timing.PartClock()
        for epoch in range(start_epoch, self.epochs):
            first = start_step if epoch == start_epoch else 0
            stopped, val = self._epoch(epoch, first, clock)
            if stopped:
                break
            clock = timing.PartClock()  # the next epoch's interval starts here
            self._save(epoch + 1, 0, clock, val)
            with clock.part("records_s"):
                self.commit()  # elastic: workers that joined start here
            if self._stop_due() and epoch + 1 < self.epochs:
                stopped = True
                break
        self.t.data.close()  # the training pipelines (an elastic restart re-fits, closing them)
        return self._finish(stopped)

    def follow_workers(self) -> None:
        """After an elastic restart: the trainer, the chief, its lock of the run directory and
        its outputs follow the new worker set (the old chief may be gone: its lock is taken
        over, after waiting out the collectives' deadline of an old chief still running)."""
        self.t.resize()
        chief = self.workers.is_chief
        console.setup_logging(self.workers.rank, chief)
        if chief != self.chief:
            if chief:
                self.lock = self._claim(wait_s=2 * self.t.config.distributed.deadline_s + 30)
            elif self.lock is not None:
                self.lock, lock = None, self.lock
                lock.release()
            self.chief = chief
            self.summaries.close()
            self.summaries = Summaries(self.t.config, self.workers, self.run_dir)

    def _epoch(
        self, epoch: int, first: int, clock: timing.PartClock
    ) -> tuple[bool, Optional[dict]]:
        """Trains one epoch from step ``first`` and validates; times it unless stopped.
        Returns (stopped, validation metrics or None)."""
        t = self.t
        # Already booked to this interval: the previous epoch's timings, checkpoint and commit.
        booked = sum(clock.parts[p] for p in BOOKKEEPING_PARTS)
        memory.reset_peak()
        train_start = time.perf_counter()
        self.history.start_epoch()
        with clock.part("pipeline_s"):
            batches = t.data.batches(epoch, first, t.size.steps_per_epoch)
        tally = self._steps(epoch, first, batches, clock)  # the pipelines stay open after it
        if tally.stopped:
            return True, None
        # Training time: pipeline and steps; step checkpoints, timings and summaries taken out.
        bookkeeping = sum(clock.parts[p] for p in BOOKKEEPING_PARTS) - booked
        train_s = time.perf_counter() - train_start - bookkeeping
        val = None
        validate_every = t.config.train.validate_every_epochs
        if (epoch + 1) % validate_every == 0 or epoch + 1 == self.epochs:
            with clock.part("validation_s"):
                val = self.status.val_metrics = t.evaluate("val")
        with clock.part("summaries_s"):
            self.summaries.epoch(self.global_step, train_s, tally.edges, t.data.plan(epoch), val)
            log.info(console.epoch_line(epoch, self.epochs, train_s, tally.losses, val or {}))
        # The timing's wall time ends here: what follows (its timings and checkpoint) belongs
        # to the next interval.
        self.history.new_epochs.append(
            runfiles.epoch_timing(t, epoch, tally.steps, tally.losses, train_s, val, clock)
        )
        return False, val

    def _save(self, epoch: int, step: int, clock: timing.PartClock, val=None) -> None:
        """Writes the timings, then the checkpoint to resume at (``epoch``, ``step``), and
        ``best/`` when ``val`` improved on every earlier validation.

        In this order a crash between the two resumes from the previous checkpoint, and the
        resume trims the timings to its position: timings and checkpoints always agree."""
        # run.json names the checkpoint about to be saved (numbered by optimizer step).
        name = f"ckpt-{int(self.t.state.optimizer.step.numpy())}"
        saved, self.status.checkpoint = self.status.checkpoint, name
        with clock.part("records_s"):
            self._write_timings("running", epoch - 1 if step == 0 else None)
        with clock.part("checkpoint_s"):
            try:
                self.checkpoints.save(epoch, step)
            except BaseException:
                self.status.checkpoint = saved  # what the failure's run.json names
                raise
            if val and val["loss"] < self.best_loss:
                self.best_loss = val["loss"]
                self.checkpoints.save_best(epoch)

    def _steps(self, epoch: int, first: int, batches, clock: timing.PartClock) -> _EpochTally:
        t, tc = self.t, self.t.config.train
        plan = t.data.plan(epoch)
        passes = t.config.distributed.backward_passes_per_step
        tally = _EpochTally()
        bar = console.progress(
            self.chief and tc.progress_bar,
            t.size.steps_per_epoch,
            first,
            epoch,
            self.epochs,
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
            self.status.preempted = self.status.preempted or times.stop
            for part in ("data_s", "compute_s", "exchange_s"):
                clock.add(part, getattr(times, part))
            self._check_finite(times, epoch, step)
            rows = slice(step * passes, (step + 1) * passes)
            step_edges = int(plan.edges[rows].sum())
            timed = runfiles.step_timing(t, epoch, step, first, times, plan)
            self.history.add_step(timed, t.size.global_batch, step_edges)
            tally.steps.append(timed)
            tally.losses.append(times.loss)
            tally.edges += step_edges
            self.global_step += 1
            with clock.part("summaries_s"):
                imbalance = float(plan.step_imbalance[rows].max())
                self.summaries.step(
                    self.global_step, times, t.size.global_batch, step_edges, imbalance
                )
                bar.update(step, times.loss, step_edges / times.total_s)
            t.state.step_in_epoch.assign(step + 1)
            tally.stopped = self._stop_due() and not last
            every = tc.checkpoint_every_steps
            due = every and self.global_step % every == 0 and not last
            if tally.stopped or times.checkpoint or due:
                self._save(epoch, step + 1, clock)
            if tally.stopped:
                break
        with clock.part("summaries_s"):
            bar.close()
        return tally

    def _check_finite(self, times, epoch: int, step: int) -> None:
        if not (math.isfinite(times.loss) and math.isfinite(times.grad_norm)):
            raise TrainingError(
                f"the training loss is {times.loss} and the gradient norm {times.grad_norm} "
                f"at epoch {epoch} step {step} (global step "
                f"{self.global_step}); stopped without saving. Last good checkpoint: "
                f"{self.checkpoints.latest.latest_checkpoint or 'none'}. Lower "
                "train.learning_rate or set train.grad_clip_norm"
            )

    def _stop_due(self) -> bool:
        reached = self.stop_at is not None and self.global_step >= self.stop_at
        return self.status.preempted or reached

    # -- timings ------------------------------------------------------------------------
    def _write_timings(self, state: str, epoch: Optional[int], energy=None) -> dict[str, Any]:
        """Gathers every rank's new timings and has the chief rewrite run.json and
        timing.jsonl (every rank runs the same steps, so every rank reaches these collectives)."""
        new_epochs = self.history.gather(self.workers.allgather_host)
        info = self._info(state, self.status.val_metrics, energy)
        if self.chief:
            timing.write_run(self.run_dir, info, self.history.steps, self.history.epochs)
            if epoch is not None:  # this epoch's timings only: the cost stays per epoch
                run = self.history.epoch_run(self.run_dir, info, epoch, new_epochs)
                self.summaries.accounts(self.global_step, run, epoch)
        return info

    def _info(self, state: str, metrics, energy=None) -> dict[str, Any]:
        return runfiles.run_info(self.t, self.history, self.status, state, metrics, energy)

    def _finish(self, stopped: bool) -> dict[str, Any]:
        reading = self.meter.stop()
        energy = dataclasses.asdict(reading)
        energy["joules"] = float(self.workers.allreduce_host(np.array([reading.joules]))[0])
        info = self._write_timings("stopped" if stopped else "finished", None, energy)
        note = " (stopped: run the same command again to resume)" if stopped else ""
        if self.status.preempted and stopped:
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
    """Trains for ``train.epochs`` epochs (resuming if a checkpoint exists); returns run info.

    The caller shuts ``trainer.workers`` down at the end, as ``train`` does, and gives the same
    workers to any further ``Trainer`` of this process: a rank whose heartbeats run when it
    exits counts as crashed on the others, and Horovod over MPI cannot start twice."""
    return _Fit(trainer).run()


_RESUMABLE = (
    "; run.json and the checkpoints saved so far are intact: run the same command again to "
    "resume from the last one"
)


def train(config: Config) -> dict[str, Any]:
    """Trains one run as configured; returns the run info written to ``run.json``.

    Raises:
      TrainingError: also when Horovod shut down because a rank stopped answering
        (``distributed.deadline_s``) or failed: the message says so instead of TensorFlow's.
    """
    trainer = Trainer(config)
    try:
        return fit(trainer)
    except (OSError, tf.errors.OpError) as err:
        full = rundir.as_disk_error(err)
        if full is not None:  # a checkpoint, TensorBoard or record write
            raise TrainingError(
                rundir.disk_error(full, Path(config.train.run_dir), _RESUMABLE)
            ) from None
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
