"""Subgraph mini-batches: seed edges, their k-hop neighbourhoods, and the epoch plan over them.

Mini-batch training replaces a step's whole graphs by subgraphs: every epoch each training
graph's edges are ordered anew and cut into *units* of about ``seed_edges`` seed edges; a unit
becomes one subgraph, the seeds plus the neighbourhood the model reads to score them. The loss
counts only the seed edges, so an epoch's loss terms are the whole-graph loss terms, each edge
counted once, and a step's gradients are those of the sampled objective.

The neighbourhood. After ``k`` message-passing steps an edge's logit reads the current latents of
its two endpoints, which read the edges and nodes one hop further at the step before, and so on:
the logit depends on the nodes within ``k - 1`` hops of the endpoints (undirected: the node
update sums received and sent edges) and on the edges among them. ``sample_subgraph`` takes the
seeds' endpoints, adds ``hops - 1`` hops of neighbours, and keeps every edge between kept nodes
(the induced subgraph), so with ``hops = k`` the seed edges' logits equal their whole-graph
logits. ``max_nodes_per_hop`` optionally keeps a random subset of at most that many new nodes
per hop (then the logits are approximate and the subgraph's size is bounded: at most
``2 * seed_edges + (hops - 1) * max_nodes_per_hop`` nodes, whatever the event).

The plan (``plan_subgraph_epoch``) is ``balance.plan_epoch`` over units instead of graphs: a
unit's size is its seed count, so steps and workers are balanced on trained edges, every worker
runs the same number of steps, and each unit goes to exactly one worker per epoch. A unit's
seeds are a slice of an order of its graph's edges drawn from (run seed, epoch, graph) by
stateless random ops (``unit_seed_edges``): identical on every worker, so the workers' seeds
are disjoint and, over an epoch, cover every edge once; reproducible from the seed. By default
(``seed_order: local``) the order is by the azimuth of the edge's sender, from a random angle:
a unit's seeds then lie in one phi wedge and share most of their neighbourhood. Random seeds
spread over the graph: on the default config (8 steps; graphs of ~8,000 hits and ~22,000 edges),
the 7-hop neighbourhood of 256 random seed edges held 94% of a graph's hits, while 256
azimuth-ordered seeds gave subgraphs of ~680 hits and ~2,000 edges, 1,024 of them ~950 hits
and ~2,840 edges (the halo: edges the model reads but the loss does not count).

The loss mask rides in the labels. The trainer's loss (``model.loss``) weights an edge by
``fake_weight + (true_weight - fake_weight) * label``; non-seed edges get the label
``ignored_label(true_weight, fake_weight)`` that makes this weight 0, so they add nothing to the
loss sum, the weight sum or the gradients (exactly, for weights whose ratio float32 holds, such
as the default 2 and 1), and the trainer's step needs no change. Validation and evaluation read
whole graphs with their true labels.

Sampling runs inside ``tf.data`` (``pipeline.train_dataset`` on a ``SubgraphPlan``) as TensorFlow
ops vectorised over the edges of a graph, one unit per call, in parallel ahead of the model.

Public symbols: ``SubgraphConfig``, ``SubgraphSampling``, ``SubgraphPlan``, ``ignored_label``,
``plan_subgraph_epoch``, ``unit_seed_edges``, ``unit_key``, ``sample_subgraph``,
``NODE_PHI_COLUMN``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

import numpy as np

from hvdtrack.configtools import check
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.inputs.balance import EpochPlan, plan_epoch

# Column of the node features holding phi / pi (records.schema: [r/1000, phi/pi, z/1000]).
NODE_PHI_COLUMN = 1


@dataclasses.dataclass(frozen=True)
class SubgraphConfig:
    """Settings of subgraph mini-batches (the ``train.subgraphs`` section).

    Attributes:
      enabled: train on subgraphs instead of whole graphs (validation stays on whole graphs).
        ``train.batch_graphs`` then counts subgraphs per worker per step.
      seed_edges: seed edges per subgraph (a graph with E edges gives ceil(E / seed_edges)
        subgraphs per epoch, seeds split as evenly as possible).
      seed_order: how a graph's edges are ordered before they are cut into units. ``local``:
        by the azimuth of their sender hit, from a random angle per (seed, epoch, graph), so a
        unit's seeds lie in one phi wedge and share their neighbourhood; ``random``: a random
        permutation (seeds spread over the graph: their union of neighbourhoods is large).
      hops: message-passing steps the neighbourhood must serve exactly; null: the model's
        ``num_message_passing_steps``.
      max_nodes_per_hop: keep at most this many new nodes (drawn at random) at each hop; null:
        all of them (exact logits for the seeds).
    """

    enabled: bool = False
    seed_edges: int = 256
    seed_order: Literal["local", "random"] = "local"
    hops: Optional[int] = None
    max_nodes_per_hop: Optional[int] = None

    def __post_init__(self) -> None:
        check(isinstance(self.enabled, bool), "enabled", "must be true or false")
        check(
            _positive_int(self.seed_edges),
            "seed_edges",
            f"must be an integer >= 1, got {self.seed_edges!r}",
        )
        check(
            self.seed_order in ("local", "random"),
            "seed_order",
            f"must be 'local' or 'random', got {self.seed_order!r}",
        )
        check(
            self.hops is None or _positive_int(self.hops),
            "hops",
            f"must be an integer >= 1 or null (the model's message-passing steps), got {self.hops!r}",
        )
        check(
            self.max_nodes_per_hop is None or _positive_int(self.max_nodes_per_hop),
            "max_nodes_per_hop",
            f"must be an integer >= 1 or null (no cap), got {self.max_nodes_per_hop!r}",
        )

    def sampling(
        self, num_message_passing_steps: int, true_weight: float, fake_weight: float
    ) -> Optional[SubgraphSampling]:
        """The resolved settings the plan carries, or None when mini-batches are off.

        Raises:
          ConfigError: for equal class weights (no label then gives a zero loss weight).
        """
        if not self.enabled:
            return None
        return SubgraphSampling(
            seed_edges=self.seed_edges,
            seed_order=self.seed_order,
            hops=self.hops if self.hops is not None else int(num_message_passing_steps),
            max_nodes_per_hop=self.max_nodes_per_hop,
            ignored_label=ignored_label(true_weight, fake_weight),
        )


@dataclasses.dataclass(frozen=True)
class SubgraphSampling:
    """Resolved sampling settings: ``SubgraphConfig`` with ``hops`` set and the label that
    leaves an edge out of the loss."""

    seed_edges: int
    hops: int
    max_nodes_per_hop: Optional[int]
    ignored_label: float
    seed_order: str = "local"


@dataclasses.dataclass(frozen=True)
class SubgraphPlan(EpochPlan):
    """An ``EpochPlan`` whose "graphs" are units (seed groups of the split's graphs).

    ``graph_ids`` hold unit ids, ``num_graphs`` the number of units, ``edges`` the seed edges
    of each worker's step (the edges the loss counts). Extra attributes:

      seed: the run seed (with ``epoch`` it fixes every unit's seeds).
      sampling: the resolved settings.
      num_split_graphs: graphs in the split.
      unit_graph: int64 [U] graph of each unit.
      unit_index: int64 [U] index of the unit among its graph's units.
      unit_count: int64 [U] units of the unit's graph.
    """

    seed: int
    sampling: SubgraphSampling
    num_split_graphs: int
    unit_graph: np.ndarray
    unit_index: np.ndarray
    unit_count: np.ndarray

    def summary(self) -> dict:
        return {
            **super().summary(),
            "mode": "subgraphs",
            "num_units": self.num_graphs,
            "seed_edges": self.sampling.seed_edges,
            "hops": self.sampling.hops,
            "max_nodes_per_hop": self.sampling.max_nodes_per_hop,
        }


def ignored_label(true_weight: float, fake_weight: float) -> float:
    """The label whose loss weight ``fake + (true - fake) * label`` is 0: ``-fake / (true - fake)``.

    Raises:
      ConfigError: when ``true_weight == fake_weight`` (every label then has the same weight).
    """
    if true_weight == fake_weight:
        raise ConfigError(
            f"'train.true_weight' ({true_weight}) equals 'train.fake_weight': subgraph "
            "mini-batches leave non-seed edges out of the loss through the class weights, which "
            "must differ (or set train.subgraphs.enabled=false)"
        )
    return float(-fake_weight / (true_weight - fake_weight))


def plan_subgraph_epoch(
    num_edges: np.ndarray,
    num_workers: int,
    batch_subgraphs: int,
    seed: int,
    epoch: int,
    sampling: SubgraphSampling,
) -> SubgraphPlan:
    """Plans one epoch of subgraph mini-batches.

    Args:
      num_edges: int [G] edges of each graph of the split.
      num_workers: workers training together.
      batch_subgraphs: subgraphs per worker per step.
      seed, epoch: fix the plan and every unit's seeds, the same on every worker.
      sampling: the resolved settings.

    Returns:
      The ``SubgraphPlan``: units shuffled and packed as ``balance.plan_epoch`` packs graphs,
      balanced on seed edges; the last ``U % (num_workers * batch_subgraphs)`` units of the
      epoch's order are not trained on that epoch (a new order every epoch).

    Raises:
      DataError: when the split gives fewer units than one step needs.
    """
    num_edges = np.asarray(num_edges, dtype=np.int64)
    unit_count = -(-num_edges // sampling.seed_edges)  # ceil; 0 for a graph without edges
    unit_graph = np.repeat(np.arange(num_edges.shape[0], dtype=np.int64), unit_count)
    first = np.repeat(np.cumsum(unit_count) - unit_count, unit_count)
    unit_index = np.arange(unit_graph.shape[0], dtype=np.int64) - first
    count = unit_count[unit_graph]
    edges = num_edges[unit_graph]
    seeds = (unit_index + 1) * edges // count - unit_index * edges // count
    per_step = num_workers * batch_subgraphs
    if unit_graph.shape[0] < per_step:
        raise DataError(
            f"the split's {int(num_edges.sum())} edges give {unit_graph.shape[0]} subgraphs of "
            f"{sampling.seed_edges} seed edges, but one step of {num_workers} workers x "
            f"{batch_subgraphs} subgraphs needs {per_step} - lower train.subgraphs.seed_edges "
            "or train.batch_graphs"
        )
    base = plan_epoch(seeds, num_workers, batch_subgraphs, seed, epoch)
    return SubgraphPlan(
        **{f.name: getattr(base, f.name) for f in dataclasses.fields(EpochPlan)},
        seed=int(seed),
        sampling=sampling,
        num_split_graphs=int(num_edges.shape[0]),
        unit_graph=unit_graph,
        unit_index=unit_index,
        unit_count=count,
    )


def unit_seed_edges(num_edges, seed, epoch, graph, unit_index, unit_count, sender_phi=None):
    """Seed edge ids of one unit: a slice of the graph's edges ordered by (seed, epoch, graph).

    Args:
      num_edges: scalar int, E of the graph.
      seed, epoch, graph: scalar ints; the order depends on these (and ``sender_phi``) only.
      unit_index, unit_count: scalar ints; the unit takes positions
        [i * E // n, (i + 1) * E // n) of the order.
      sender_phi: optional float [E], phi / pi of each edge's sender hit. Given: edges are
        ordered by azimuth starting from a random angle (``local`` seeds); None: a random
        permutation.

    Returns:
      int32 [about E / n] edge ids (in that order). The units of a graph partition its edges.
    """
    import tensorflow as tf

    num_edges = tf.cast(num_edges, tf.int64)
    key = _graph_key(seed, epoch, graph)
    if sender_phi is None:
        draws = tf.random.stateless_uniform(
            tf.reshape(num_edges, [1]), key, minval=None, maxval=None, dtype=tf.int64
        )
    else:
        start = tf.random.stateless_uniform([], key, dtype=tf.float64)
        turns = (tf.cast(sender_phi, tf.float64) + 1.0) / 2.0 + start  # phi / 2 pi, rotated
        draws = turns - tf.floor(turns)
    permutation = tf.argsort(draws, stable=True)
    i, n = tf.cast(unit_index, tf.int64), tf.cast(unit_count, tf.int64)
    start, stop = i * num_edges // n, (i + 1) * num_edges // n
    return tf.cast(permutation[start:stop], tf.int32)


def sample_subgraph(
    senders,
    receivers,
    num_nodes,
    seed_edges,
    hops: int,
    max_nodes_per_hop: Optional[int] = None,
    key=None,
):
    """The neighbourhood of ``seed_edges`` that ``hops`` message-passing steps read.

    Args:
      senders, receivers: int32 [E] endpoints of the graph's edges.
      num_nodes: scalar int, N.
      seed_edges: int32 [S] seed edge ids.
      hops: message-passing steps to serve (>= 1): keeps the seeds' endpoints and the nodes
        within ``hops - 1`` hops of them (both edge directions), and every edge between kept
        nodes.
      max_nodes_per_hop: optional cap on the new nodes of each hop (a random subset is kept).
      key: int64 [2] stateless seed of that random choice (needed with a cap).

    Returns:
      ``(node_ids, edge_ids, is_seed)``: int32 [n] kept nodes and int32 [e] kept edges, both in
      increasing order; bool [e], which kept edges are seeds.
    """
    import tensorflow as tf

    if hops < 1:
        raise ConfigError(f"sample_subgraph: hops must be >= 1, got {hops}")
    senders = tf.convert_to_tensor(senders, tf.int32)
    receivers = tf.convert_to_tensor(receivers, tf.int32)
    num_nodes = tf.cast(num_nodes, tf.int32)
    seed_edges = tf.convert_to_tensor(seed_edges, tf.int32)
    num_edges = tf.shape(senders)[0]
    is_seed = _scatter_true(seed_edges, num_edges)
    endpoints = tf.concat([tf.gather(senders, seed_edges), tf.gather(receivers, seed_edges)], 0)
    inside = _scatter_true(endpoints, num_nodes)
    for hop in range(hops - 1):
        touched = tf.cast(
            tf.logical_or(tf.gather(inside, senders), tf.gather(inside, receivers)), tf.int32
        )
        # Empty segments get the lowest int32: compare each to 0 before combining.
        reached = tf.logical_or(
            tf.math.unsorted_segment_max(touched, senders, num_nodes) > 0,
            tf.math.unsorted_segment_max(touched, receivers, num_nodes) > 0,
        )
        new = tf.logical_and(reached, tf.logical_not(inside))
        if max_nodes_per_hop is not None:
            new = _random_subset(
                new, max_nodes_per_hop, tf.random.experimental.stateless_fold_in(key, hop)
            )
        inside = tf.logical_or(inside, new)
    kept_edges = tf.logical_and(tf.gather(inside, senders), tf.gather(inside, receivers))
    edge_ids = tf.cast(tf.reshape(tf.where(kept_edges), [-1]), tf.int32)
    node_ids = tf.cast(tf.reshape(tf.where(inside), [-1]), tf.int32)
    return node_ids, edge_ids, tf.gather(is_seed, edge_ids)


def unit_key(seed, epoch, graph, unit_index):
    """int64 [2] stateless key of a unit's random choices other than its seeds (the hop caps)."""
    import tensorflow as tf

    return tf.random.experimental.stateless_fold_in(
        tf.random.experimental.stateless_fold_in(_graph_key(seed, epoch, graph), -1),
        tf.cast(unit_index, tf.int64),
    )


# ---------------------------------------------------------------------------- internals
def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _graph_key(seed, epoch, graph):
    import tensorflow as tf

    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.experimental.stateless_fold_in(key, tf.cast(graph, tf.int64))


def _scatter_true(ids, size):
    """bool [size], True at ``ids``."""
    import tensorflow as tf

    hits = tf.math.unsorted_segment_max(tf.ones_like(ids), ids, size)
    return hits > 0


def _random_subset(mask, limit: int, key):
    """``mask`` with at most ``limit`` of its True entries kept, chosen at random by ``key``."""
    import tensorflow as tf

    scores = tf.random.stateless_uniform(tf.shape(mask), key)
    scores = tf.where(mask, scores, -1.0)
    size = tf.shape(mask)[0]
    _, top = tf.math.top_k(scores, k=tf.minimum(limit, size))
    chosen = tf.gather(scores, top) >= 0.0
    return _scatter_true(tf.boolean_mask(top, chosen), size)
