"""Epoch plans: which graphs each worker trains on at each step, with edges balanced per step
and over the epoch.

The plan fixes one global read order per epoch and cuts it into steps of
``num_workers * batch_graphs`` consecutive graphs, sorted by cost within windows of
``sort_window`` steps first (``_sort_windows``). Each step's graphs are packed into
``num_workers`` bins of exactly ``batch_graphs`` graphs by greedy packing on edge count (largest
first, into the bin with the fewest edges that still has room), so a step's bins hold nearly the
same number of edges; the slowest worker gates a synchronous step, so this is the per-step
balance (``step_imbalance``).

Which worker gets which bin is then chosen for the whole epoch, so that every worker also gets
the same share of the epoch's edges and no worker is favoured:

1. Differencing over steps (Karmarkar-Karp style, vectorised): each step is a partial assignment
   of its bins to ``num_workers`` slots, heaviest first. Each round sorts the partials by spread
   (heaviest minus lightest slot) and merges them in pairs, widest with next widest, laying the
   heaviest slot of one onto the lightest of the other, so that their spreads cancel; about
   log2(num_steps) rounds leave one assignment of every step's bins to slots.
2. Exchanges: while a slot's epoch load is more than 0.01% off the mean (at most
   ``4 * num_workers`` moves), the move that most lowers the sum of squared slot loads is made,
   among: swapping the bins of the most (or least) loaded slot and another slot in one step; the
   same swap in two steps; a chain over two steps (most loaded slot <-> slot j in one, slot j <->
   least loaded in the other). Two-step moves are searched among the 16 steps with the widest
   spread; they get out of the local optima of single swaps when an epoch has few steps (three
   steps of 30, 20 and 10 edges for 3 workers need a chain to end at 60 edges each).
3. Slots are given to workers by a random permutation drawn for the epoch, so which worker is
   slightly above the mean changes from epoch to epoch.

On the default dataset's 40 training graphs (7,100-9,200 edges, one graph per worker per step,
read by offset), over 300 seeds x 24 epochs, every worker's epoch share is within 0.02% of the
mean with 2 workers and 0.41% with 8 (the old rule, largest bin of every step to the lowest
worker, gave worker 0 +4.3% and +10.6%); 10,000 graphs plan in about 4 ms. Which graphs share
a step depends on the read order and the global batch only: with the default gradient reduction
(global sums over the step's edges) 1 or N workers train the same steps. With one graph per
worker per step only the sort window balances the steps: on ``data/default``'s 40 graphs
(19,222-25,978 edges) the busier of 2 workers has 4.0% more edges than the mean as drawn, 1.4%
with windows of 8 steps (5 here: a quarter of the epoch); on 1,000 graphs of those sizes, 3.9%
and 0.9% with 2 workers, 10.2% and 1.9% with 8.

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

# Exchanges stop once every worker's epoch edges are within this fraction of the mean.
_EXCHANGE_TOLERANCE = 1e-4
# Two-step exchanges are searched among this many steps (those with the widest spread of bins).
_EXCHANGE_STEPS = 16


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
    sort_window: int = 1,
    cost: Optional[np.ndarray] = None,
) -> EpochPlan:
    """Plans one epoch: equal steps per worker, graphs reshuffled, edges balanced per step and
    per epoch.

    Args:
      num_edges: int [G] edges of each graph.
      num_workers: workers (ranks) training together.
      batch_graphs: graphs per worker per step.
      seed: run seed; with ``epoch`` it fixes the plan, the same on every worker.
      epoch: epoch number; every epoch reads in a new order.
      shard_of: int [G] shard index of each graph (from the manifest), or None.
      record_of: int [G] record index within its shard; given together with ``shard_of``.
      shards_per_group: shards read together (interleaved) when a shard layout is given.
      sort_window: steps of graphs of similar ``cost`` (``_sort_windows``; at most a quarter
        of the epoch, none with a shard layout: a stream cannot be reordered); 1: as drawn.
      cost: float [G] what each graph costs a worker (default: its edges).

    Returns:
      The ``EpochPlan``; ``num_steps = G // (num_workers * batch_graphs)``, the last
      ``G % (num_workers * batch_graphs)`` graphs of the read order are not used this epoch.

    Raises:
      ConfigError: for non-positive counts or a shard layout given by halves.
      DataError: when G < num_workers * batch_graphs (not one full step).
    """
    num_edges = np.asarray(num_edges, dtype=np.int64)
    _check_plan_inputs(
        num_edges, num_workers, batch_graphs, seed, epoch, shard_of, record_of, shards_per_group
    )
    if not isinstance(sort_window, (int, np.integer)) or sort_window < 1:
        raise ConfigError(f"sort_window must be an integer >= 1, got {sort_window!r}")
    cost = num_edges if cost is None else np.asarray(cost, dtype=np.float64)
    if cost.shape != num_edges.shape:
        raise ConfigError(f"cost must have one entry per graph, got shape {cost.shape}")
    rng = np.random.default_rng([seed, epoch])
    order, shard_order = _global_order(num_edges, shard_of, record_of, shards_per_group, rng)
    num_graphs = int(num_edges.shape[0])
    per_step = num_workers * batch_graphs
    # at most a quarter of the epoch: a window of the whole epoch makes the same steps each time
    window = min(sort_window, max(1, num_graphs // per_step // 4))
    if window > 1 and shard_of is None:
        order = _sort_windows(order, cost, per_step, window, rng)
    num_steps = num_graphs // per_step
    step_graphs = order[: num_steps * per_step].reshape(num_steps, per_step)
    step_edges = num_edges[step_graphs]
    graph_ids = _worker_graph_ids(step_graphs, step_edges, num_workers, batch_graphs, rng)
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


def _sort_windows(
    order: np.ndarray, cost: np.ndarray, per_step: int, window: int, rng: np.random.Generator
) -> np.ndarray:
    """``order`` with every ``window`` steps (of ``per_step`` graphs) made of the same graphs
    sorted by ``cost``, cut into steps again and shuffled; the graphs after the last full step
    stay last. A synchronous step waits for its slowest worker: graphs of similar cost finish
    together (bucketing by size, as ``tf.data``'s ``bucket_by_sequence_length``). Which graphs
    share a window is still the epoch's draw, so the steps change from epoch to epoch."""
    num_steps = order.shape[0] // per_step
    used = num_steps * per_step
    head = order[:used]
    # graphs sorted by cost within each window (ties in read order), steps shuffled in it
    by_cost = head[np.lexsort((cost[head], np.arange(used) // (per_step * window)))]
    steps = by_cost.reshape(num_steps, per_step)
    step_order = np.lexsort((rng.random(num_steps), np.arange(num_steps) // window))
    return np.concatenate([steps[step_order].reshape(-1), order[used:]]).astype(np.int64)


def _check_plan_inputs(
    num_edges: np.ndarray,
    num_workers: int,
    batch_graphs: int,
    seed: int,
    epoch: int,
    shard_of: Optional[np.ndarray],
    record_of: Optional[np.ndarray],
    shards_per_group: int,
) -> None:
    """Raises ConfigError or DataError for the arguments ``plan_epoch`` refuses (see there)."""
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


def _global_order(
    num_edges: np.ndarray,
    shard_of: Optional[np.ndarray],
    record_of: Optional[np.ndarray],
    shards_per_group: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """The epoch's read order, int64 [G], and shard order, int64 [num_shards] (None without a
    shard layout); draws one permutation from ``rng``."""
    if shard_of is None:
        return rng.permutation(int(num_edges.shape[0])).astype(np.int64), None
    shard_of = np.asarray(shard_of, dtype=np.int64)
    record_of = np.asarray(record_of, dtype=np.int64)
    if shard_of.shape != num_edges.shape or record_of.shape != num_edges.shape:
        raise ConfigError("shard_of and record_of must have one entry per graph")
    shard_order = rng.permutation(int(shard_of.max()) + 1).astype(np.int64)
    return epoch_read_order(shard_of, record_of, shard_order, shards_per_group), shard_order


def _worker_graph_ids(
    step_graphs: np.ndarray,
    step_edges: np.ndarray,
    num_workers: int,
    batch_graphs: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Packs each step's graphs into bins and gives the bins to workers.

    Args:
      step_graphs: int64 [num_steps, num_workers * batch_graphs] graph ids of each step.
      step_edges: int64 [num_steps, num_workers * batch_graphs] their edges.
      rng: the epoch's generator (see ``_assign_bins``).

    Returns:
      int64 [num_workers, num_steps, batch_graphs] graph ids of each worker's steps, within a
      step in read order (a transposed view).
    """
    num_steps = step_graphs.shape[0]
    bin_of = _pack_greedy(step_edges, num_workers, batch_graphs)
    by_bin = np.argsort(bin_of, axis=1, kind="stable")
    bin_edges = (
        np.take_along_axis(step_edges, by_bin, axis=1)
        .reshape(num_steps, num_workers, batch_graphs)
        .sum(axis=2)
    )
    worker_of_bin = _assign_bins(bin_edges, rng)
    worker_of = np.take_along_axis(worker_of_bin, bin_of, axis=1)
    # Stable sort by worker keeps each worker's graphs in read order within the step.
    by_worker = np.argsort(worker_of, axis=1, kind="stable")
    graph_ids = np.take_along_axis(step_graphs, by_worker, axis=1)
    return graph_ids.reshape(num_steps, num_workers, batch_graphs).transpose(1, 0, 2)


def _pack_greedy(step_edges: np.ndarray, num_workers: int, batch_graphs: int) -> np.ndarray:
    """Greedy packing of every step at once into ``num_workers`` bins of ``batch_graphs`` graphs.

    Args:
      step_edges: int64 [num_steps, num_workers * batch_graphs] edges of each step's graphs.

    Returns:
      int64 [num_steps, num_workers * batch_graphs] bin of each graph. Graphs are placed
      largest first (ties: earlier in read order) in the bin with the fewest edges among those
      with fewer than ``batch_graphs`` graphs (ties: lowest bin index).
    """
    num_steps, per_step = step_edges.shape
    rows = np.arange(num_steps)
    largest_first = np.argsort(-step_edges, axis=1, kind="stable")
    load = np.zeros((num_steps, num_workers), dtype=np.int64)
    count = np.zeros((num_steps, num_workers), dtype=np.int64)
    bin_of = np.empty((num_steps, per_step), dtype=np.int64)
    full = np.iinfo(np.int64).max
    for rank in range(per_step):  # vectorised over steps
        column = largest_first[:, rank]
        chosen = np.argmin(np.where(count < batch_graphs, load, full), axis=1)
        bin_of[rows, column] = chosen
        load[rows, chosen] += step_edges[rows, column]
        count[rows, chosen] += 1
    return bin_of


def _assign_bins(bin_edges: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Gives each step's bins to distinct workers, balancing the workers' epoch edges.

    Args:
      bin_edges: int64 [num_steps, num_workers] edges of each step's bins.
      rng: the epoch's generator (one permutation of the workers is drawn from it).

    Returns:
      int64 [num_steps, num_workers] worker of each bin; every row is a permutation. See the
      module docstring for the rule.
    """
    num_steps, num_workers = bin_edges.shape
    bin_at = _difference_steps(bin_edges)
    _exchange(np.take_along_axis(bin_edges, bin_at, axis=1), bin_at)
    worker_of_slot = np.broadcast_to(rng.permutation(num_workers), bin_at.shape)
    worker_of_bin = np.empty_like(bin_at)
    np.put_along_axis(worker_of_bin, bin_at, worker_of_slot, axis=1)
    return worker_of_bin


def _difference_steps(bin_edges: np.ndarray) -> np.ndarray:
    """Pairwise differencing of steps, log2(num_steps) rounds vectorised over the pairs.

    Args:
      bin_edges: int64 [num_steps, num_workers] edges of each step's bins.

    Returns:
      int64 [num_steps, num_workers] bin of each step at each slot; slot loads summed over the
      steps are nearly equal.
    """
    num_steps, num_workers = bin_edges.shape
    heaviest_first = np.argsort(-bin_edges, axis=1, kind="stable")
    loads = np.take_along_axis(bin_edges, heaviest_first, axis=1)  # partials, slots sorted
    rounds = []  # per round: new slot of each old slot of each partial, and its new partial
    while loads.shape[0] > 1:
        count = loads.shape[0]
        widest_first = np.argsort(loads[:, -1] - loads[:, 0], kind="stable")
        first, second = widest_first[0 : count - 1 : 2], widest_first[1:count:2]
        merged = loads[first] + loads[second, ::-1]
        heaviest = np.argsort(-merged, axis=1, kind="stable")
        new_slot = np.empty_like(heaviest)
        np.put_along_axis(new_slot, heaviest, np.arange(num_workers)[None, :], axis=1)
        remap = np.empty((count, num_workers), dtype=np.int64)
        parent = np.empty(count, dtype=np.int64)
        remap[first], remap[second] = new_slot, new_slot[:, ::-1]
        parent[first] = parent[second] = np.arange(first.shape[0])
        merged = np.take_along_axis(merged, heaviest, axis=1)
        if count % 2:  # the narrowest partial waits for the next round
            remap[widest_first[-1]] = np.arange(num_workers)
            parent[widest_first[-1]] = first.shape[0]
            merged = np.concatenate([merged, loads[widest_first[-1:]]])
        loads = merged
        rounds.append((remap, parent))
    final_slot = np.arange(num_workers)[None, :]
    for remap, parent in reversed(rounds):
        final_slot = np.take_along_axis(final_slot[parent], remap, axis=1)
    bin_at = np.empty_like(heaviest_first)
    np.put_along_axis(bin_at, final_slot, heaviest_first, axis=1)
    return bin_at


def _exchange(slot_edges: np.ndarray, bin_at: np.ndarray) -> None:
    """Swaps bins between slots within steps while that evens the slots' epoch loads.

    Every move takes edges from the most loaded slot or gives edges to the least loaded one, and
    is the one that most lowers the sum of squared slot loads among: one swap in any step; two
    swaps of the same two slots in two of the widest steps; a chain in two of the widest steps
    (the most loaded slot swaps with slot j in one, slot j with the least loaded in the other).

    Args:
      slot_edges: int64 [num_steps, num_workers] edges of the bin at each slot (updated).
      bin_at: int64 [num_steps, num_workers] bin at each slot (updated in place).
    """
    num_steps, num_workers = slot_edges.shape
    if num_steps < 2:  # one step's bins are its slots' loads whichever slot holds which
        return
    load = slot_edges.sum(axis=0)
    mean = load.mean()
    spread = slot_edges.max(axis=1) - slot_edges.min(axis=1)
    widest = np.argsort(-spread, kind="stable")[:_EXCHANGE_STEPS]
    first, second = np.triu_indices(widest.shape[0], 1)
    first, second = widest[first], widest[second]
    # Chains run either way round: from the first step to the second or back.
    chain_from = np.concatenate([first, second])
    chain_to = np.concatenate([second, first])
    slots = np.arange(num_workers)
    for _ in range(4 * num_workers):  # each move lowers the sum of squared slot loads
        if np.abs(load - mean).max() <= _EXCHANGE_TOLERANCE * mean:
            break
        most, least = int(np.argmax(load)), int(np.argmin(load))
        edges = slot_edges.astype(np.float64)
        level = (load - load[least]).astype(np.float64)  # small numbers: moves keep the total
        # Swaps of slots give[c] and take[c]: ``moved`` edges go from give to take.
        give = np.concatenate([np.full(num_workers, most), slots])
        take = np.concatenate([slots, np.full(num_workers, least)])
        moved = edges[:, give] - edges[:, take]
        moved = np.concatenate([moved, moved[first] + moved[second]])
        # Half the change of sum(load^2) (the same for every family below).
        swap_change = moved * (moved - (level[give] - level[take]))
        out = edges[chain_from, most, None] - edges[chain_from]  # most -> j
        back = edges[chain_to] - edges[chain_to, least, None]  # j -> least
        chain_change = (
            -level[most] * out
            + level * (out - back)
            + level[least] * back
            + (out**2 + (out - back) ** 2 + back**2) / 2
        )
        best_swap = int(np.argmin(swap_change))
        best_chain = int(np.argmin(chain_change))
        if min(swap_change.flat[best_swap], chain_change.flat[best_chain]) >= 0:
            break
        if swap_change.flat[best_swap] <= chain_change.flat[best_chain]:
            row, column = divmod(best_swap, give.shape[0])
            pair = (give[column], take[column])
            if row < num_steps:
                swaps = [(row, *pair)]
            else:
                swaps = [(first[row - num_steps], *pair), (second[row - num_steps], *pair)]
        else:
            row, j = divmod(best_chain, num_workers)
            swaps = [(chain_from[row], most, j), (chain_to[row], j, least)]
        for step, a, b in swaps:
            load[a] += slot_edges[step, b] - slot_edges[step, a]
            load[b] += slot_edges[step, a] - slot_edges[step, b]
            slot_edges[step, [a, b]] = slot_edges[step, [b, a]]
            bin_at[step, [a, b]] = bin_at[step, [b, a]]


def _imbalance(edges: np.ndarray) -> np.ndarray:
    """float64 [num_steps] max / mean over workers of edges [num_steps, num_workers]."""
    mean = edges.mean(axis=1)
    return np.where(mean > 0, edges.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
