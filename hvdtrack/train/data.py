"""The trainer's data side: the dataset's manifest, the epoch plans and the tf.data batches.

``TrainData`` opens ``data.dataset_dir`` (checksums verified, train and val splits required),
sizes an epoch for a worker count (``fit``: global batch, steps per epoch, edge imbalance) and
hands out the epoch's training batches and a split's evaluation batches for this process's
replicas. It builds no model and runs no step (``state``, ``step``).

Public symbols: ``TrainData``, ``EpochSize``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from hvdtrack.config import Config
from hvdtrack.distributed.workers import Workers
from hvdtrack.errors import DataError
from hvdtrack.inputs import pipeline
from hvdtrack.inputs.balance import EpochPlan
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
        self._plan: EpochPlan | None = None

    def fit(self) -> EpochSize:
        """Sizes an epoch for the current worker count (re-planned: elastic runs change it).

        Raises:
          DataError: the training graphs give no full step.
        """
        tc, dc = self.config.train, self.config.distributed
        workers = self.workers.num_replicas
        global_batch = tc.batch_graphs * workers * dc.backward_passes_per_step
        self._plan = None
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
        same number of steps, so no collective waits on a worker that ran out of data. The
        last plan made is kept (the loop asks for the epoch's plan several times).
        """
        if self._plan is None or self._plan.epoch != epoch:
            tc = self.config.train
            self._plan = pipeline.plan_train_epoch(
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
        return self._plan

    def batches(self, epoch: int, first_step: int, steps_per_epoch: int) -> Batches:
        """The epoch's pipelines from step ``first_step`` on, built now (so that the time to
        build them is not the first step's data wait); the iterator yields, per pass, one
        (graphs, labels) batch per local replica, in plan order."""
        plan = self.plan(epoch)
        passes = self.config.distributed.backward_passes_per_step
        limit = (steps_per_epoch - first_step) * passes
        # Resuming mid-epoch: the plan is the one made before the interruption; skip what ran.
        datasets = [
            pipeline.train_dataset(self.dataset_dir, self.manifest, plan, worker)
            .skip(first_step * passes)
            .take(limit)
            for worker in self.workers.replica_ids
        ]
        with pipeline.read_errors_as_data_error(self.dataset_dir, self.manifest):
            iterators = [iter(d) for d in datasets]
        return self._read(iterators, limit)

    def _read(self, iterators: list, limit: int) -> Batches:
        with pipeline.read_errors_as_data_error(self.dataset_dir, self.manifest):
            for _ in range(limit):
                yield [next(it) for it in iterators]

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
