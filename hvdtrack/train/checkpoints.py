"""The run's checkpoints: the newest in RUN/checkpoints, the best by validation loss in RUN/best.

Public symbols: ``Checkpoints``.
"""

from __future__ import annotations

import time
from pathlib import Path

import tensorflow as tf

from hvdtrack.train.trainer import Trainer


class Checkpoints:
    """The run's checkpoints: the newest in RUN/checkpoints, the best by validation loss in RUN/best."""

    def __init__(self, trainer: Trainer, run_dir: Path):
        self.trainer = trainer
        self.directory = run_dir / "checkpoints"
        keep = trainer.config.train.keep_checkpoints
        self.latest = tf.train.CheckpointManager(
            trainer.state.checkpoint, str(self.directory), max_to_keep=keep
        )
        self.best = tf.train.CheckpointManager(
            trainer.state.checkpoint, str(run_dir / "best"), max_to_keep=1
        )
        self.saved_at = time.monotonic()

    def due(self) -> bool:
        """True when ``train.checkpoint_every_minutes`` have passed since the last save."""
        minutes = self.trainer.config.train.checkpoint_every_minutes
        return minutes is not None and time.monotonic() - self.saved_at >= 60 * minutes

    def save(self, epoch: int, step: int) -> None:
        """Saves the state to resume at (epoch, step); every rank returns after the chief wrote."""
        self.saved_at = time.monotonic()
        t = self.trainer
        t.state.epoch.assign(epoch)
        t.state.step_in_epoch.assign(step)
        if t.workers.is_chief:
            # Numbered by optimizer step: steps per epoch change in an elastic run.
            self.latest.save(checkpoint_number=int(t.state.optimizer.step.numpy()))
        t.workers.barrier()

    def save_best(self, number: int) -> None:
        if self.trainer.workers.is_chief:
            self.best.save(checkpoint_number=number)
