"""Training batches of several epochs out of one tf.data pipeline per replica.

Building a training pipeline (``pipeline.train_dataset``: its datasets, the tracing of their
functions, their iterators and threads) takes about a quarter of a second here, a cost the
worker count does not divide. ``EpochPipelines`` builds one per local replica over the plans of
up to ``EPOCHS_PER_PIPELINE`` epochs and hands their batches out epoch by epoch. An epoch that
does not continue them (a resume mid-epoch, an epoch stopped early, another worker count or
epoch length) needs new ones (``continues``).

Public symbols: ``EpochPipelines``, ``EPOCHS_PER_PIPELINE``.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Sequence

from hvdtrack.inputs import pipeline
from hvdtrack.inputs.balance import EpochPlan
from hvdtrack.records.manifest import Manifest

# Epochs one set of training pipelines reads (their plans are made when it is built).
EPOCHS_PER_PIPELINE = 8


class EpochPipelines:
    """One training pipeline per replica over consecutive epochs' plans.

    Args:
      dataset_dir, manifest: the dataset the plans were made for.
      plans: the plans of consecutive epochs, the first epoch's first.
      replicas: the workers whose batches this process reads (one pipeline each).
      batches_per_epoch: batches read of each plan (its first ones).
      skip: batches of the first epoch already trained (a resume mid-epoch). When at least
        ``batches_per_epoch`` (that epoch made shorter since its checkpoint), nothing of it is
        read: the pipelines start at the next epoch.

    Raises:
      ConfigError / DataError: as ``pipeline.train_dataset``.
    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike,
        manifest: Manifest,
        plans: Sequence[EpochPlan],
        replicas: Sequence[int],
        batches_per_epoch: int,
        skip: int = 0,
    ):
        self.dataset_dir, self.manifest = dataset_dir, manifest
        self.end = plans[0].epoch + len(plans)
        self.batches_per_epoch = batches_per_epoch
        # The epoch whose first batch the pipelines read next (None inside an epoch).
        self.next_epoch: Optional[int] = None if skip else plans[0].epoch
        if skip >= batches_per_epoch:  # a resume past the end (train.allow_changed_config)
            plans, skip = plans[1:], 0
        datasets = [
            pipeline.train_dataset(
                dataset_dir, manifest, plans, r, steps=batches_per_epoch, skip=skip
            )
            for r in replicas
            if plans
        ]
        with pipeline.read_errors_as_data_error(dataset_dir, manifest):
            self._iterators: Optional[list] = [iter(d) for d in datasets]

    def continues(self, epoch: int, batches_per_epoch: int) -> bool:
        """Whether the pipelines stand at the first batch of ``epoch``, of that length."""
        open_ = self._iterators is not None and self.next_epoch == epoch
        return open_ and batches_per_epoch == self.batches_per_epoch

    def epoch(self, epoch: int, limit: int) -> Iterator[list[Any]]:
        """The next ``limit`` batches, of ``epoch``: per pass one per replica (none when
        ``limit <= 0``, a resume past its end: the pipelines then stand at the next epoch)."""
        self.next_epoch = None  # until its last batch is read
        if limit <= 0:
            self.next_epoch = epoch + 1 if epoch + 1 < self.end else None
            return iter(())
        return self._read(epoch, limit)

    def _read(self, epoch: int, limit: int) -> Iterator[list[Any]]:
        with pipeline.read_errors_as_data_error(self.dataset_dir, self.manifest):
            for i in range(limit):
                batch = [next(it) for it in self._iterators]
                if i + 1 == limit and epoch + 1 < self.end:
                    self.next_epoch = epoch + 1
                yield batch

    def close(self) -> None:
        """Ends the pipelines (their threads and prefetched batches)."""
        self._iterators = None
