"""Elastic Horovod: a run that goes on when workers leave and takes in workers that join.

horovodrun starts an elastic job when given a range of workers and a host discovery script
(Gloo only; the script prints ``host:slots`` lines, one per host that may be used now)::

    horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./hosts.sh \\
        python -m hvdtrack.train distributed.strategy=horovod

It sets ``HOROVOD_ELASTIC=1`` in every worker, and the training loop then runs its epochs
inside Horovod's elastic driver loop (``horovod.common.elastic.run_fn``):

* The state is committed at the end of every epoch, after its checkpoint and records: weights,
  Adam's moments and step, the epoch position, and the run's records, copied to host memory.
  The commit also asks the driver whether hosts changed: a worker added joins there, at the
  start of the next epoch.
* A worker that fails (killed, its host gone) makes the collectives of the others fail. They
  go back to the last commit, Horovod restarts on the workers that are left (no fewer than
  ``--min-np``), and the interrupted epoch runs again on them, from its first step.
* After every restart the trainer follows the new worker count (``Trainer.resize``): a new
  epoch plan, steps per epoch and global batch, the learning rate scaled for the new count,
  the schedule continued at the same point of the run's epochs, the step compiled again.
  Workers that joined get the state and the records from rank 0.

Commits are per epoch because an epoch's plan assigns its graphs to a given number of workers:
resuming mid-epoch on another number would skip or repeat graphs (the resume check refuses
the same thing for a restarted job). The price is that a failure loses the epoch in progress.
Every epoch timing says how many workers ran it, and ``run.json`` lists the restarts
(``elastic_resets``).

Public symbols: ``is_elastic``, ``job_id``, ``run``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable

import tensorflow as tf

from hvdtrack.runs import timing
from hvdtrack.utils import console

log = logging.getLogger(console.LOGGER_NAME)


def is_elastic(strategy: str) -> bool:
    """True when this Horovod worker was started by an elastic horovodrun."""
    return strategy == "horovod" and os.environ.get("HOROVOD_ELASTIC") == "1"


def job_id() -> str:
    """This elastic job, the same in all its workers (its driver's rendezvous server): a
    chief that replaces a dropped one takes over its lock (``utils.lock``). "" outside one."""
    if os.environ.get("HOROVOD_ELASTIC") != "1":
        return ""
    address = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "")
    return f"horovod elastic {address}:{os.environ.get('HOROVOD_GLOO_RENDEZVOUS_PORT', '')}"


def run(fit, train: Callable[[], Any]) -> Any:
    """Runs ``train`` (the epochs of ``fit``, a ``loop._Fit``) under Horovod's elastic driver
    loop, restarting it from the last commit whenever workers leave or join."""
    import horovod.tensorflow as hvd
    from horovod.common.elastic import run_fn
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    def attempt(state):
        try:
            return train()
        except HostsUpdatedInterrupt:  # at a commit: nothing is lost
            state.interrupted(lost=False)
            raise
        except tf.errors.OpError as err:
            # A collective whose peer is gone. Horovod's own wrapper looks for op names that
            # miss the grouped allreduce of the step and swallows any other error.
            if "Horovod" in str(err) or "Gloo" in str(err):
                state.interrupted(lost=True)
                raise HorovodInternalError(err) from err
            raise

    def reset():
        hvd.shutdown()
        hvd.init()

    return run_fn(attempt, reset)(_RunState(fit, hvd))


@dataclasses.dataclass
class _Records:
    """The run's records at a commit (every rank holds all of them)."""

    steps: list
    epochs: list
    graphs_done: int
    edges_done: int
    val_metrics: dict
    best_loss: float
    resets: list


class _RunState:
    """The state Horovod's elastic loop keeps: ``save`` at a commit, ``restore`` after a
    failure, ``reset`` once Horovod restarted, ``sync`` from rank 0 before training again.

    Horovod's ``TensorFlowState`` does not broadcast variables in eager mode, and would not
    carry the records; this is the same protocol (``horovod.common.elastic.State``) for the
    trainer.
    """

    def __init__(self, fit, hvd):
        from horovod.common.elastic import State

        self.fit, self.hvd = fit, hvd
        # The notification plumbing (host updates from the driver) is the base class's.
        self._base = State(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)
        self.interrupted_at: float | None = None
        self.lost_s, self.before = 0.0, fit.workers.num_replicas
        self.save()
        fit.commit = self.commit

    # horovod.common.elastic.State's interface, as run_fn and the notification manager call it
    def on_hosts_updated(self, timestamp, update_res):
        self._base.on_hosts_updated(timestamp, update_res)

    def on_reset(self):
        self._base._host_messages = type(self._base._host_messages)()
        if self.interrupted_at is None:  # interrupted where ``attempt`` did not see it
            self.interrupted(lost=False)
        self.reset()

    def commit(self) -> None:
        self.save()
        self._base.check_host_updates()  # raises HostsUpdatedInterrupt on every rank alike

    def save(self) -> None:
        fit = self.fit
        self._values = [v.numpy() for v in fit.t.state.variables_to_sync()]
        self._records = _Records(
            list(fit.history.steps),
            list(fit.history.epochs),
            fit.history.graphs_done,
            fit.history.edges_done,
            dict(fit.status.val_metrics),
            fit.best_loss,
            list(fit.status.resets),
        )
        self.saved_at = time.monotonic()

    def restore(self) -> None:
        if self.interrupted_at is None:  # a failure that Horovod raised itself
            self.interrupted(lost=True)
        for var, value in zip(self.fit.t.state.variables_to_sync(), self._values):
            var.assign(value)
        self._adopt(self._records)
        self.fit.history.drop_new()  # of the interrupted epoch: it runs again

    def interrupted(self, lost: bool) -> None:
        """Notes when training stopped, and how much of it the restart throws away."""
        self.interrupted_at = time.monotonic()
        self.lost_s = self.interrupted_at - self.saved_at if lost else 0.0

    def reset(self) -> None:
        fit, hvd = self.fit, self.hvd
        workers = fit.workers
        self.before = workers.num_replicas
        workers.rank, workers.num_processes = hvd.rank(), hvd.size()
        workers.local_rank, workers.local_size = hvd.local_rank(), hvd.local_size()
        workers.pin_cores()  # the local ranks may be numbered anew
        fit.follow_workers()
        self._report_restart()  # sync may be skipped (workers only removed: all hold the state)

    def sync(self) -> None:
        """Every worker takes rank 0's state and records (a worker that joined has neither)."""
        fit = self.fit
        fit.workers.broadcast_variables(fit.t.state.variables_to_sync())
        self._records.resets = list(fit.status.resets)  # with the restart that led here
        mine = dataclasses.asdict(self._records) if fit.workers.is_chief else None
        records = self.hvd.broadcast_object(mine, root_rank=0, name="elastic_records")
        records["steps"] = [timing.StepTiming(**r) for r in records["steps"]]
        records["epochs"] = [timing.EpochTiming(**r) for r in records["epochs"]]
        self._adopt(_Records(**records))
        self.save()

    def _report_restart(self) -> None:
        fit = self.fit
        epoch = fit.t.state.position()[0]
        restart = time.monotonic() - self.interrupted_at
        fit.status.resets.append(
            {
                "epoch": epoch,
                "workers_before": self.before,
                "workers_after": fit.workers.num_replicas,
                "lost_s": round(self.lost_s, 3),  # training since the last commit
                "restart_s": round(restart, 3),  # Horovod's restart and the resize
            }
        )
        log.warning(
            f"elastic restart: {self.before} -> {fit.workers.num_replicas} workers, training "
            f"again from the start of epoch {epoch + 1}; lost {self.lost_s:.1f} s of training, "
            f"restart took {restart:.1f} s"
        )
        self.interrupted_at = None

    def _adopt(self, records: _Records) -> None:
        fit = self.fit
        history = fit.history
        history.steps, history.epochs = list(records.steps), list(records.epochs)
        history.graphs_done, history.edges_done = records.graphs_done, records.edges_done
        fit.status.val_metrics, fit.best_loss = dict(records.val_metrics), records.best_loss
        fit.status.resets = list(records.resets)
