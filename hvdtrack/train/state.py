"""The trainer's state: model, optimizer, loss scale and position, and their checkpoint.

``TrainState`` builds the segment classifier and its Adam optimizer under the workers' scope,
creates their variables, and holds everything a worker needs to continue a run
(``variables_to_sync``) and what a checkpoint stores. It reads no data and compiles no step
(``data``, ``step``).

Public symbols: ``TrainState``.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from hvdtrack.config import Config
from hvdtrack.distributed.workers import Workers
from hvdtrack.errors import ConfigError
from hvdtrack.inputs import pipeline
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.precision import cpu_flags, unsupported_reason
from hvdtrack.train.optimizer import Adam, LossScale, Schedule


class TrainState:
    """The variables of one run: weights, Adam moments and step, loss scale, position.

    Args:
      config: the run configuration (``model`` and ``train`` sections).
      workers: the distribution seam (its scope places the variables; its rank seeds them).
      schedule: the optimizer's learning-rate schedule.

    Raises:
      ConfigError: ``model.precision`` this machine cannot run.
    """

    def __init__(self, config: Config, workers: Workers, schedule: Schedule):
        self.config = config
        self.workers = workers
        tc = config.train
        has_gpu = bool(tf.config.list_logical_devices("GPU"))
        reason = unsupported_reason(config.model.precision, has_gpu, cpu_flags())
        if reason:
            raise ConfigError(reason)
        # Different initial weights per rank: the broadcast at restore, not the seed, makes
        # them equal.
        tf.random.set_seed(tc.seed + 1000 * workers.rank)
        with workers.scope():
            self.model = SegmentClassifier(config.model)
            self.optimizer = Adam(
                schedule, tc.adam_beta1, tc.adam_beta2, tc.adam_epsilon, tc.grad_clip_norm
            )
            self.model(pipeline.placeholder_graph())  # Sonnet creates variables lazily
            self.variables = list(self.model.trainable_variables)
            self.optimizer.build(self.variables)
            # float16 gradients underflow without it (bfloat16 has float32's range).
            self.loss_scale = LossScale() if config.model.precision == "float16" else None
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")
        scaling = dict(loss_scale=self.loss_scale) if self.loss_scale else {}
        self.checkpoint = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            epoch=self.epoch,
            step_in_epoch=self.step_in_epoch,
            **scaling,
        )

    def position(self) -> tuple[int, int]:
        """(epoch, step in epoch) the state resumes at."""
        return int(self.epoch.numpy()), int(self.step_in_epoch.numpy())

    def variables_to_sync(self) -> list[tf.Variable]:
        """Everything a worker needs to continue the run: weights, Adam, position."""
        scaling = [self.loss_scale.scale, self.loss_scale.finite_steps] if self.loss_scale else []
        return (
            self.variables
            + self.optimizer.m
            + self.optimizer.v
            + [self.optimizer.step, self.epoch, self.step_in_epoch]
            + scaling
        )

    def restore(self, checkpoint: str | None, broadcast: bool = True) -> str | None:
        """Restores ``checkpoint`` (a prefix found intact by ``checkpoints.resume_point``; None:
        keep the fresh state), then makes every replica hold rank 0's values (unless
        ``broadcast`` is False: elastic training syncs its workers itself); returns it.

        Raises:
          ConfigError: the checkpoint was written by another model (it reads intact, so a
            failure to restore it is a mismatch, not damage).
        """
        if checkpoint:
            try:
                self.checkpoint.restore(checkpoint).assert_existing_objects_matched()
            except (AssertionError, ValueError, tf.errors.OpError) as err:
                config_file = Path(checkpoint).parent.parent / "config.yaml"
                raise ConfigError(
                    f"checkpoint {checkpoint} does not fit the configured model "
                    f"({str(err).splitlines()[0]}); it was written with the model settings in "
                    f"{config_file}. Use another train.run_dir, or train.resume=false to start "
                    "afresh"
                ) from None
        # Whatever each rank holds now, rank 0's values win (fresh start: the random init).
        # The position to resume from too: a rank that read another checkpoint (a stale
        # shared-filesystem cache) would otherwise run other steps and hang the collectives.
        if broadcast:
            self.workers.broadcast_variables(self.variables_to_sync())
        return checkpoint
