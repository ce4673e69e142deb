"""The trainer's data side: the dataset's manifest, the epoch plans and the tf.data batches.

``TrainData`` opens ``data.dataset_dir`` (checksums verified, train and val splits required),
sizes an epoch for a worker count (``fit``: global batch, steps per epoch, edge imbalance) and
hands out the epoch's training batches and a split's evaluation batches for this process's
replicas (epochs out of one set of pipelines, ``inputs.epochs``). It runs no step.

Public symbols: ``TrainData``, ``EpochSize``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import tensorflow as tf

from hvdtrack.config import Config
from hvdtrack.distributed.workers import Workers
from hvdtrack.errors import DataError
from hvdtrack.inputs import pipeline
from hvdtrack.inputs.balance import EpochPlan
from hvdtrack.inputs.epochs import EPOCHS_PER_PIPELINE, EpochPipelines
from hvdtrack.model.cost import node_cost
from hvdtrack.records.manifest import manifest_digest, open_dataset
from hvdtrack.records.schema import EDGE_FEATURE_SIZE, NODE_FEATURE_SIZE

Batches = Iterator[list[tuple[Any, tf.Tensor]]]


@dataclasses.dataclass(frozen=True)
class EpochSize:
    """What follows from the worker count: graphs per step over all workers, optimizer steps
    per epoch, and the first plan's mean max/mean edges per worker per step."""

    global_batch: int
    steps_per_epoch: int
    edge_imbalance: float


class TrainData:
    """The training and validation data of one run, planned for the workers.

    Args:
      config: the run configuration (``data``, ``train``, ``distributed`` sections).
      workers: the distribution seam; its replica count and ids shard the data.

    Raises:
      DataError: a missing, damaged or empty dataset (named by directory, split and file).
    """

    def __init__(self, config: Config, workers: Workers):
        self.config = config
        self.workers = workers
        self.dataset_dir = Path(config.data.dataset_dir)
        # Validation runs at least after the last epoch: an empty val split is refused now.
        self.manifest = open_dataset(
            self.dataset_dir, verify=config.train.verify_checksums, required=("train", "val")
        )
        self.digest = manifest_digest(self.dataset_dir)
        table = self.manifest.split_table("train", str(self.dataset_dir))
        self.train_edges = np.asarray(table.num_edges)
        self._plans: dict[int, EpochPlan] = {}
        self._pipelines: Optional[EpochPipelines] = None
        self.pipelines_built = 0  # training pipeline sets built so far

    def fit(self) -> EpochSize:
        """Sizes an epoch for the current worker count (re-planned: elastic runs change it).

        Raises:
          DataError: the training graphs give no full step.
        """
        tc, dc = self.config.train, self.config.distributed
        workers = self.workers.num_replicas
        global_batch = tc.batch_graphs * workers * dc.backward_passes_per_step
        self.close()
        first_plan = self.plan(0)
        steps = first_plan.num_steps // dc.backward_passes_per_step
        if tc.max_steps_per_epoch is not None:
            steps = min(steps, tc.max_steps_per_epoch)
        if steps < 1:
            raise DataError(
                f"{self.dataset_dir}: {len(self.train_edges)} training graphs give no full step of "
                f"{global_batch} graphs ({tc.batch_graphs} per worker x "
                f"{workers} workers x {dc.backward_passes_per_step} passes); "
                "prepare more events or lower train.batch_graphs"
            )
        return EpochSize(global_batch, steps, first_plan.mean_imbalance)

    def plan(self, epoch: int) -> EpochPlan:
        """The balanced assignment of training graphs to workers and steps for ``epoch``.

        Identical on every worker (a function of the seed and the epoch); every worker runs the
        same number of steps, so no collective waits on a worker that ran out of data. Kept
        until ``close`` (asked for several times; ``batches`` makes them ahead).
        """
        if epoch not in self._plans:
            tc = self.config.train
            self._plans[epoch] = pipeline.plan_train_epoch(
                self.manifest,
                self.workers.num_replicas,
                tc.batch_graphs,
                tc.seed,
                epoch,
                dataset=str(self.dataset_dir),
                # train.subgraphs.enabled: units of seed edges with their neighbourhoods
                subgraphs=tc.subgraphs.sampling(
                    self.config.model.num_message_passing_steps, tc.true_weight, tc.fake_weight
                ),
                sort_window=tc.sort_window,
                node_cost=node_cost(self.config.model, NODE_FEATURE_SIZE, EDGE_FEATURE_SIZE),
            )
        return self._plans[epoch]

    def batches(self, epoch: int, first_step: int, steps_per_epoch: int) -> Batches:
        """The batches of ``epoch`` from step ``first_step`` on (per pass one (graphs, labels)
        per local replica, in plan order), out of the open ``EpochPipelines`` if they continue
        to it, else out of ones built now (not in a step's data wait) up to ``train.epochs``."""
        passes = self.config.distributed.backward_passes_per_step
        per_epoch, skip = steps_per_epoch * passes, first_step * passes  # skip: a resume's
        if skip or not (self._pipelines and self._pipelines.continues(epoch, per_epoch)):
            self.close()
            end = min(epoch + EPOCHS_PER_PIPELINE, max(self.config.train.epochs, epoch + 1))
            plans = [self.plan(e) for e in range(epoch, end)]
            self._pipelines = EpochPipelines(
                self.dataset_dir, self.manifest, plans, self.workers.replica_ids, per_epoch, skip
            )
            self.pipelines_built += 1
        return self._pipelines.epoch(epoch, per_epoch - skip)

    def close(self) -> None:
        """Ends the open training pipelines and drops the plans made so far."""
        if self._pipelines is not None:
            self._pipelines.close()
        self._pipelines, self._plans = None, {}

    def eval_batches(self, split: str) -> Iterator[tuple[Any, tf.Tensor]]:
        """(graphs, labels) batches of ``split``, every graph once over all workers: this
        process's replicas' shards, one replica after the other."""
        for worker in self.workers.replica_ids:
            yield from pipeline.eval_dataset(
                self.dataset_dir,
                self.manifest,
                split,
                worker,
                self.workers.num_replicas,
                self.config.train.batch_graphs,
            )
