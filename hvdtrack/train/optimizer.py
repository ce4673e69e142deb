"""Adam with a warm-up + decay learning-rate schedule, as a ``tf.Module`` usable under any strategy.

Sonnet's optimizers refuse ``MirroredStrategy``/``MultiWorkerMirroredStrategy``; this one updates
each replica's own copy of a variable in replica context and leaves gradient reduction to the
caller (``hvdtrack.distributed.workers``), so one optimizer serves every distribution strategy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import tensorflow as tf

from hvdtrack.train.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Learning rate at optimizer step ``t`` (0-based): linear warm-up, then decay.

    Attributes:
      peak: the rate reached at the end of warm-up (already scaled for the worker count).
      warmup_steps: steps of linear warm-up from ``peak / warmup_start_divisor`` to ``peak``.
      total_steps: steps of the whole run; decay runs from the end of warm-up to here.
      decay: "none", "cosine" (to ``min_fraction * peak``) or "exponential" (to
        ``decay_rate * peak`` at ``total_steps``, floored at ``min_fraction * peak``).
      offset: added to the optimizer's step counter before the schedule reads it. 0 unless the
        worker count changed during the run (elastic training): steps per epoch change with it,
        and the offset keeps the schedule where the run is in its epochs.
    """

    peak: float
    warmup_steps: int
    total_steps: int
    decay: str = "cosine"
    decay_rate: float = 0.1
    min_fraction: float = 0.01
    warmup_start_divisor: float = 1.0
    offset: int = 0

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        step = tf.cast(step + self.offset, tf.float32)
        peak = tf.constant(self.peak, tf.float32)
        warm = float(max(self.warmup_steps, 0))
        start = self.peak / self.warmup_start_divisor
        if warm > 0:
            warm_lr = start + (self.peak - start) * tf.minimum(step + 1.0, warm) / warm
        else:
            warm_lr = peak
        span = float(max(self.total_steps - self.warmup_steps, 1))
        progress = tf.clip_by_value((step - warm) / span, 0.0, 1.0)
        floor = self.min_fraction * self.peak
        if self.decay == "cosine":
            decayed = floor + (self.peak - floor) * 0.5 * (1.0 + tf.cos(math.pi * progress))
        elif self.decay == "exponential":
            decayed = tf.maximum(peak * tf.pow(self.decay_rate, progress), floor)
        else:
            decayed = peak
        return tf.where(step < warm, warm_lr, decayed)


def scaled_learning_rate(base: float, num_workers: int, rule: str) -> float:
    """The learning-rate scaling rule: ``none``, ``linear`` (x N) or ``sqrt`` (x sqrt N)."""
    if rule == "linear":
        return base * num_workers
    if rule == "sqrt":
        return base * math.sqrt(num_workers)
    return base


def epoch_schedule(train: TrainConfig, num_workers: int, steps_per_epoch: int) -> Schedule:
    """The ``train:`` section's schedule for ``num_workers`` workers and epochs of
    ``steps_per_epoch`` optimizer steps (warm-up and decay counted in epochs)."""
    return Schedule(
        peak=scaled_learning_rate(train.learning_rate, num_workers, train.lr_scaling),
        warmup_steps=int(round(train.warmup_epochs * steps_per_epoch)),
        total_steps=train.epochs * steps_per_epoch,
        decay=train.decay,
        decay_rate=train.decay_rate,
        min_fraction=train.min_learning_rate_fraction,
        warmup_start_divisor=float(num_workers) if train.lr_scaling != "none" else 1.0,
    )


class Adam(tf.Module):
    """Adam (Kingma & Ba) with optional global-norm clipping.

    Call ``build(variables)`` once, eagerly, before any compiled step (slot variables must exist
    before tracing under a distribution strategy), then ``apply(grads, variables)`` inside it.
    """

    def __init__(
        self,
        schedule: Schedule,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        clip_norm: float | None = None,
        name: str = "adam",
    ):
        super().__init__(name=name)
        self.schedule = schedule
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.clip_norm = clip_norm
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.m: list[tf.Variable] = []
        self.v: list[tf.Variable] = []

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """Creates the first- and second-moment slots for ``variables``."""
        if self.m:
            return
        with self.name_scope:
            for var in variables:
                slot = var.name.split(":")[0].replace("/", "_")
                self.m.append(
                    tf.Variable(tf.zeros(var.shape, var.dtype), trainable=False, name=f"m_{slot}")
                )
                self.v.append(
                    tf.Variable(tf.zeros(var.shape, var.dtype), trainable=False, name=f"v_{slot}")
                )

    def learning_rate(self) -> tf.Tensor:
        """The rate the next ``apply`` will use."""
        return self.schedule(self.step)

    def apply(self, grads: Sequence[tf.Tensor], variables: Sequence[tf.Variable]) -> tf.Tensor:
        """Applies one update; returns the global gradient norm (before clipping)."""
        if len(grads) != len(self.m):
            raise ValueError(
                f"Adam was built for {len(self.m)} variables, got {len(grads)} gradients"
            )
        with tf.name_scope(self.name):  # the scope the step's op breakdown counts as optimizer
            norm = tf.linalg.global_norm(grads)
            if self.clip_norm is not None:
                grads, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=norm)
            lr = self.schedule(self.step)
            t = tf.cast(self.step + 1, tf.float32)
            lr_t = lr * tf.sqrt(1.0 - tf.pow(self.beta2, t)) / (1.0 - tf.pow(self.beta1, t))
            for g, var, m, v in zip(grads, variables, self.m, self.v):
                m.assign(self.beta1 * m + (1.0 - self.beta1) * g)
                v.assign(self.beta2 * v + (1.0 - self.beta2) * tf.square(g))
                var.assign_sub(lr_t * m / (tf.sqrt(v) + self.epsilon))
            self.step.assign_add(1)
        return norm


class LossScale(tf.Module):
    """Dynamic loss scaling for float16 compute: gradients of ``loss * scale`` keep small values
    representable; a step whose gradients overflow is skipped and the scale halved, and after
    ``period`` finite steps in a row the scale doubles.
    """

    def __init__(self, initial: float = 2.0**15, period: int = 2000, name: str = "loss_scale"):
        super().__init__(name=name)
        self.period = period
        self.scale = tf.Variable(initial, dtype=tf.float32, trainable=False, name="scale")
        self.finite_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="finite_steps")

    def update(self, grads: Sequence[tf.Tensor]) -> tf.Tensor:
        """Adjusts the scale after a step's (unscaled) ``grads``; True if they were all finite."""
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        grown = self.finite_steps + 1 >= self.period
        self.scale.assign(
            tf.where(finite, tf.where(grown, 2.0 * self.scale, self.scale), 0.5 * self.scale)
        )
        self.finite_steps.assign(tf.where(finite & ~grown, self.finite_steps + 1, 0))
        return finite
