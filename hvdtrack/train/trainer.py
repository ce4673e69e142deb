"""One run's training pieces, built together: workers, data, state and compiled step.

``Trainer`` builds them in the order they depend on each other and follows a change of the
worker count (``resize``); each piece does one job:

    workers (``distributed.workers``: the distribution seam)
    data    (``train.data.TrainData``: manifest, epoch plans, tf.data batches)
    state   (``train.state.TrainState``: model, optimizer, position, checkpoint)
    step    (``train.step.TrainStep``: the compiled, timed training step and evaluation)

The epoch loop is ``hvdtrack.train.loop``; ``hvdtrack bench model`` builds a state and a step
from the same classes on graphs it makes, without a dataset.

Public symbols: ``Trainer``, ``make_stage_devices_for``.
"""

from __future__ import annotations

import dataclasses

from hvdtrack.config import Config
from hvdtrack.distributed.stages import make_stage_devices, stage_devices
from hvdtrack.distributed.workers import Workers, make_workers
from hvdtrack.train.data import EpochSize, TrainData
from hvdtrack.train.optimizer import epoch_schedule
from hvdtrack.train.state import TrainState
from hvdtrack.train.step import TrainStep


def make_stage_devices_for(config: Config) -> list[str] | None:
    """The devices of ``distributed.stages`` (None without stages).

    Logical CPU devices for the stages exist only if made before TensorFlow starts: call this
    before making the workers, whose Horovod heartbeats start it. A process that ran ops
    already (a test) shares the devices it has; the results are the same.
    """
    stages = config.distributed.stages.num_stages
    if stages == 1:
        return None
    make_stage_devices(stages)
    return stage_devices(stages)


class Trainer:
    """The pieces of one run, built from its configuration.

    Args:
      config: the resolved run configuration.
      workers: the distribution seam (made from ``config.distributed`` if not given).

    Raises:
      DataError / ConfigError: a missing or too small dataset, a model this machine cannot run.
    """

    def __init__(self, config: Config, workers: Workers | None = None):
        self.config = config
        devices = make_stage_devices_for(config)  # before the workers start TensorFlow
        self.workers = workers or make_workers(config.distributed)
        self.data = TrainData(config, self.workers)
        self.size = self.data.fit()
        self.state = TrainState(config, self.workers, self._schedule(self.size))
        self.step = TrainStep(config, self.workers, self.state, devices)

    def _schedule(self, size: EpochSize):
        return epoch_schedule(self.config.train, self.workers.num_replicas, size.steps_per_epoch)

    @property
    def learning_rate(self) -> float:
        """The peak learning rate after scaling with the worker count."""
        return self.state.optimizer.schedule.peak

    def evaluate(self, split: str = "val") -> dict[str, float]:
        """Loss and edge metrics over the whole split, sharded over workers, reduced exactly."""
        where = f"{self.data.dataset_dir}: the {split} split"
        return self.step.evaluate(self.data.eval_batches(split), where)

    def resize(self) -> bool:
        """Follows a change of the worker count (elastic training) or a state restored from a
        run with another one: re-plans, rescales the learning rate, continues the schedule at
        the epoch position the state holds, and recompiles the step. True when anything changed.
        """
        self.size = self.data.fit()
        epoch, step_in_epoch = self.state.position()
        position = epoch * self.size.steps_per_epoch + step_in_epoch
        optimizer = self.state.optimizer
        schedule = dataclasses.replace(
            self._schedule(self.size), offset=position - int(optimizer.step.numpy())
        )
        if schedule == optimizer.schedule:
            return False
        optimizer.schedule = schedule
        self.step.build()
        self.step.compile()
        return True
