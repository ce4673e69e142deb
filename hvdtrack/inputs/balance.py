"""Epoch plans: which graphs each worker trains on at each step, with edges balanced per step.

The plan fixes one global read order per epoch and cuts it into steps of
``num_workers * batch_graphs`` consecutive graphs. Within a step the graphs go to workers by
greedy packing on edge count (largest first, to the worker with the fewest edges that still has
room), so every worker gets exactly ``batch_graphs`` graphs and nearly the same number of edges.
A worker's graphs of a step are kept in read order, so a reader that streams the global order
and keeps only this worker's records yields exactly the plan (see ``hvdtrack.inputs.pipeline``).

The global order depends on how the shards are read. Read by record offset (uncompressed
shards) it is a plain permutation of the graphs. Streamed (gzip shards) it follows the files:
the shards are shuffled, taken ``shards_per_group`` at a time, and the records of a group are
interleaved round-robin (record 0 of each shard, then record 1, ...), which is what
``tf.data.Dataset.interleave(cycle_length=shards_per_group, block_length=1)`` produces; new
groups every epoch give new step compositions.

Pure numpy; identical on every worker for the same (seed, epoch).

Public symbols: ``EpochPlan``, ``plan_epoch``, ``epoch_read_order``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from hvdtrack.errors import ConfigError, DataError


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """One epoch's assignment of graphs to workers and steps.

    Attributes:
      epoch: the epoch number the plan was made for.
      num_workers: number of workers.
      batch_graphs: graphs per worker per step.
      num_graphs: graphs in the split (G); ids are 0..G-1.
      order: int64 [G] every graph id in the epoch's global read order.
      graph_ids: int64 [num_workers, num_steps, batch_graphs] graph ids of each worker's steps;
        within a step in read order.
      edges: int64 [num_steps, num_workers] edges each worker gets at each step.
      shard_order: int64 [num_shards] shards in read order (None when planned without shards).
      shards_per_group: how many shards are interleaved together.
      step_imbalance: float64 [num_steps] max over workers / mean over workers of edges.
      unbalanced_step_imbalance: float64 [num_steps] the same for consecutive (unbalanced)
        assignment of each step's graphs, for comparison.
    """

    epoch: int
    num_workers: int
    batch_graphs: int
    num_graphs: int
    order: np.ndarray
    graph_ids: np.ndarray
    edges: np.ndarray
    shard_order: Optional[np.ndarray]
    shards_per_group: int
    step_imbalance: np.ndarray
    unbalanced_step_imbalance: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.graph_ids.shape[1])

    @property
    def num_used_graphs(self) -> int:
        """Graphs trained on this epoch (the rest of ``order`` is left for other epochs)."""
        return self.num_steps * self.num_workers * self.batch_graphs

    @property
    def mean_imbalance(self) -> float:
        """Mean over steps of max/mean edges per worker (1.0 is perfect)."""
        return float(self.step_imbalance.mean())

    @property
    def worst_imbalance(self) -> float:
        """Worst step's max/mean edges per worker."""
        return float(self.step_imbalance.max())

    def worker_graph_ids(self, worker: int) -> np.ndarray:
        """int64 [num_steps * batch_graphs] the worker's graph ids in the order it reads them."""
        if not 0 <= worker < self.num_workers:
            raise ConfigError(f"worker {worker} is not in [0, {self.num_workers})")
        return self.graph_ids[worker].reshape(-1)

    def summary(self) -> dict:
        """Plain numbers for logs and reports."""
        return {
            "epoch": self.epoch,
            "num_workers": self.num_workers,
            "batch_graphs": self.batch_graphs,
            "num_steps": self.num_steps,
            "num_graphs": self.num_graphs,
            "num_used_graphs": self.num_used_graphs,
            "mean_imbalance": self.mean_imbalance,
            "worst_imbalance": self.worst_imbalance,
            "unbalanced_mean_imbalance": float(self.unbalanced_step_imbalance.mean()),
        }


def epoch_read_order(
    shard_of: np.ndarray,
    record_of: np.ndarray,
    shard_order: np.ndarray,
    shards_per_group: int,
) -> np.ndarray:
    """Global read order when shards are read ``shards_per_group`` at a time, round-robin.

    Args:
      shard_of: int [G] shard index of each graph.
      record_of: int [G] record index of each graph within its shard.
      shard_order: int [num_shards] the order in which shards are read.
      shards_per_group: shards interleaved together.

    Returns:
      int64 [G] graph ids sorted by (group, record, position in group).
    """
    position = np.empty(len(shard_order), dtype=np.int64)
    position[np.asarray(shard_order)] = np.arange(len(shard_order))
    shard_position = position[np.asarray(shard_of)]
    group, slot = np.divmod(shard_position, shards_per_group)
    return np.lexsort((slot, np.asarray(record_of), group)).astype(np.int64)


def plan_epoch(
    num_edges: np.ndarray,
    num_workers: int,
    batch_graphs: int,
    seed: int,
    epoch: int,
    shard_of: Optional[np.ndarray] = None,
    record_of: Optional[np.ndarray] = None,
    shards_per_group: int = 4,
) -> EpochPlan:
    """Plans one epoch: equal steps per worker, graphs reshuffled, edges balanced per step.

    Args:
      num_edges: int [G] edges of each graph.
      num_workers: workers (ranks) training together.
      batch_graphs: graphs per worker per step.
      seed: run seed; with ``epoch`` it fixes the plan, the same on every worker.
      epoch: epoch number; every epoch reads in a new order.
      shard_of: int [G] shard index of each graph (from the manifest), or None.
      record_of: int [G] record index within its shard; given together with ``shard_of``.
      shards_per_group: shards read together (interleaved) when a shard layout is given.

    Returns:
      The ``EpochPlan``; ``num_steps = G // (num_workers * batch_graphs)``, the last
      ``G % (num_workers * batch_graphs)`` graphs of the read order are not used this epoch.

    Raises:
      ConfigError: for non-positive counts or a shard layout given by halves.
      DataError: when G < num_workers * batch_graphs (not one full step).
    """
    num_edges = np.asarray(num_edges, dtype=np.int64)
    if num_workers < 1 or batch_graphs < 1 or shards_per_group < 1:
        raise ConfigError(
            f"num_workers ({num_workers}), batch_graphs ({batch_graphs}) and shards_per_group "
            f"({shards_per_group}) must be >= 1"
        )
    if seed < 0 or epoch < 0:
        raise ConfigError(f"seed ({seed}) and epoch ({epoch}) must be >= 0")
    num_graphs = int(num_edges.shape[0])
    per_step = num_workers * batch_graphs
    if num_graphs < per_step:
        raise DataError(
            f"the split has {num_graphs} graphs but one step of {num_workers} workers x "
            f"{batch_graphs} graphs needs {per_step} - prepare more events or lower the number "
            "of workers or batch_graphs"
        )
    if (shard_of is None) != (record_of is None):
        raise ConfigError("plan_epoch needs both shard_of and record_of, or neither")

    rng = np.random.default_rng([seed, epoch])
    if shard_of is None:
        shard_order = None
        order = rng.permutation(num_graphs).astype(np.int64)
    else:
        shard_of = np.asarray(shard_of, dtype=np.int64)
        record_of = np.asarray(record_of, dtype=np.int64)
        if shard_of.shape != num_edges.shape or record_of.shape != num_edges.shape:
            raise ConfigError("shard_of and record_of must have one entry per graph")
        shard_order = rng.permutation(int(shard_of.max()) + 1).astype(np.int64)
        order = epoch_read_order(shard_of, record_of, shard_order, shards_per_group)

    num_steps = num_graphs // per_step
    step_graphs = order[: num_steps * per_step].reshape(num_steps, per_step)
    step_edges = num_edges[step_graphs]
    worker_of = _pack_greedy(step_edges, num_workers, batch_graphs)
    # Stable sort by worker keeps each worker's graphs in read order within the step.
    by_worker = np.argsort(worker_of, axis=1, kind="stable")
    graph_ids = np.take_along_axis(step_graphs, by_worker, axis=1)
    graph_ids = graph_ids.reshape(num_steps, num_workers, batch_graphs).transpose(1, 0, 2)
    edges = num_edges[graph_ids].sum(axis=2).T
    unbalanced = step_edges.reshape(num_steps, num_workers, batch_graphs).sum(axis=2)
    return EpochPlan(
        epoch=epoch,
        num_workers=num_workers,
        batch_graphs=batch_graphs,
        num_graphs=num_graphs,
        order=order,
        graph_ids=np.ascontiguousarray(graph_ids),
        edges=edges,
        shard_order=shard_order,
        shards_per_group=shards_per_group,
        step_imbalance=_imbalance(edges),
        unbalanced_step_imbalance=_imbalance(unbalanced),
    )


def _pack_greedy(step_edges: np.ndarray, num_workers: int, batch_graphs: int) -> np.ndarray:
    """Greedy packing of every step at once.

    Args:
      step_edges: int64 [num_steps, num_workers * batch_graphs] edges of each step's graphs.

    Returns:
      int64 [num_steps, num_workers * batch_graphs] worker of each graph. Graphs are placed
      largest first (ties: earlier in read order) on the worker with the fewest edges among
      those with fewer than ``batch_graphs`` graphs (ties: lowest worker index).
    """
    num_steps, per_step = step_edges.shape
    rows = np.arange(num_steps)
    largest_first = np.argsort(-step_edges, axis=1, kind="stable")
    load = np.zeros((num_steps, num_workers), dtype=np.int64)
    count = np.zeros((num_steps, num_workers), dtype=np.int64)
    worker_of = np.empty((num_steps, per_step), dtype=np.int64)
    full = np.iinfo(np.int64).max
    for rank in range(per_step):  # vectorised over steps
        column = largest_first[:, rank]
        worker = np.argmin(np.where(count < batch_graphs, load, full), axis=1)
        worker_of[rows, column] = worker
        load[rows, worker] += step_edges[rows, column]
        count[rows, worker] += 1
    return worker_of


def _imbalance(edges: np.ndarray) -> np.ndarray:
    """float64 [num_steps] max / mean over workers of edges [num_steps, num_workers]."""
    mean = edges.mean(axis=1)
    return np.where(mean > 0, edges.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
