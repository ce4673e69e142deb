"""tf.data pipelines from TFRecord shards to merged graph_nets GraphsTuples, one per step.

Training (``train_dataset``) yields exactly one worker's steps of an ``EpochPlan``, reading the
graphs in one of two ways, chosen by ``plan_train_epoch``:

- random access (uncompressed shards, the default for them): the plan is a fresh permutation of
  all graphs every epoch, and the worker reads only its own records, each by seeking to its byte
  offset (found once from the shards' record framing; CRCs are still checked). Reading cost per
  worker does not grow with the number of workers.
- streaming (gzip shards, which cannot seek): the plan reads shards in a shuffled order,
  ``shards_per_group`` files at a time interleaved round-robin (deterministically, so the stream
  is the plan's global order); the worker keeps only its own records before parsing them. Every
  worker reads the epoch's shards that hold any of its records up to its last record, so
  reading cost grows with the number of workers.

Subgraph mini-batches (a ``SubgraphPlan``, from ``plan_train_epoch(..., subgraphs=...)``): each
planned unit's graph is read by offset, its seeds' neighbourhood sampled by TensorFlow ops
(``inputs.subgraphs``; parallel over units, order kept), and ``batch_graphs`` subgraphs merged
per step; non-seed edges carry the label that gives them zero loss weight.

In both, every ``batch_graphs`` records are parsed and merged into one GraphsTuple by one
vectorised map per batch (parallel over batches, order kept). Measured figures:
``python -m hvdtrack.bench.read``.

Evaluation (``eval_dataset``) gives worker w the contiguous slice [w*G/W, (w+1)*G/W) of the
split in manifest order, reading only the shards that slice touches.

Elements are ``(GraphsTuple, labels)``: nodes float32 [sum N, 3], edges float32 [sum E, 4],
senders/receivers int32 [sum E] (offset into the merged nodes), globals float32 zeros
[num_graphs, 1], n_node/n_edge int32 [num_graphs], labels float32 [sum E]. ``input_signature()``
describes them with dynamic sizes, so one ``tf.function`` trace serves every batch.

Both check, when built, that the split holds graphs and its shard files are all there with the
manifest's sizes (``records.check_splits``). TensorFlow reports a damaged shard as a DataLossError
that names neither file nor record, and a record of another schema version as an
InvalidArgumentError; iterate through ``iterate_batches`` or inside ``read_errors_as_data_error``
to get a DataError naming the shard and record instead.

Random-access datasets build their readers from a raw TFRecordDatasetV2 op (the public
``tf.data.TFRecordDataset`` cannot seek); TensorFlow cannot serialize that op, so their
iterators cannot be checkpointed (make a new dataset from the plan instead).

Reading and merging records: ``hvdtrack.inputs.reader`` (``merge_graphs`` is imported from
there). Public symbols: ``plan_train_epoch``, ``train_dataset``, ``eval_dataset``,
``graph_signature``, ``input_signature``, ``placeholder_graph``, ``read_errors_as_data_error``,
``iterate_batches``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from graph_nets import graphs as gn_graphs
from graph_nets import utils_tf

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.inputs.balance import EpochPlan, plan_epoch
from hvdtrack.inputs.reader import TRAIN_FIELDS, ShardReader, checked_endpoints, merge_graphs
from hvdtrack.inputs.subgraphs import (
    NODE_PHI_COLUMN,
    SubgraphPlan,
    SubgraphSampling,
    plan_subgraph_epoch,
    sample_subgraph,
    unit_key,
    unit_seed_edges,
)
from hvdtrack.records.manifest import Manifest, SplitTable, check_splits, shard_problem
from hvdtrack.records.schema import EDGE_FEATURE_SIZE, NODE_FEATURE_SIZE, parse_example_batch
from hvdtrack.records.shards import first_unreadable_record

_PARALLEL_PARSES = 2
_PREFETCH_BATCHES = 2
# No tf.data autotuning. Its model thread runs Model::Optimize in the background, and an
# iterator's destructor waits for a running optimisation: with every core busy training, that
# took 2-9 s at the end of an epoch (seen with py-spy in RootDataset::Iterator::~Iterator), a
# third of the epoch. Fixed parallelism keeps the pipeline ahead (data wait ~3% of a step here)
# and ends at once.
_FIXED_PARALLELISM = tf.data.Options()
_FIXED_PARALLELISM.autotune.enabled = False
_RECORD_MESSAGE = re.compile(r"\[?((?:record \d+ of \S+|a record)[^\[\]]*?re-run hvdtrack prepare)")
_UNPARSABLE = re.compile(r"Could not parse example input|ParseExample", re.IGNORECASE)


def plan_train_epoch(
    manifest: Manifest,
    num_workers: int,
    batch_graphs: int,
    seed: int,
    epoch: int,
    split: str = "train",
    random_access: Optional[bool] = None,
    shards_per_group: int = 4,
    dataset: str = "the dataset",
    subgraphs: Optional[SubgraphSampling] = None,
    sort_window: int = 1,
    node_cost: float = 0.0,
) -> EpochPlan:
    """``balance.plan_epoch`` over a split of the manifest (``subgraphs.plan_subgraph_epoch``
    with ``subgraphs``).

    Args:
      manifest: the dataset's manifest.
      num_workers, batch_graphs, seed, epoch: see ``balance.plan_epoch``.
      split: the split to train on.
      random_access: plan for reading records by offset (a full shuffle every epoch); default:
        when the shards are uncompressed. False plans for streaming whole shards.
      shards_per_group: shards interleaved together when streaming.
      dataset: names the dataset in error messages.
      subgraphs: plan subgraph mini-batches with these settings (``batch_graphs`` then counts
        subgraphs); they are read by offset, so the shards must be uncompressed.
      sort_window: steps of graphs of similar cost (``balance.plan_epoch``) when read by
        offset; streamed shards keep their order.
      node_cost: what a node costs a worker, in edges: a graph costs its edges plus
        ``node_cost`` times its nodes.

    Raises:
      ConfigError: random access (or subgraphs) asked for gzip-compressed shards.
      DataError: for an empty split (naming ``dataset`` and the split) or too few graphs.
    """
    table = manifest.split_table(split, dataset)
    if subgraphs is not None:
        if manifest.compression != "none":
            raise ConfigError(
                f"{dataset} has {manifest.compression}-compressed shards, but subgraph "
                "mini-batches (train.subgraphs.enabled) read graphs by offset: prepare with "
                "records.compression=none"
            )
        return plan_subgraph_epoch(
            table.num_edges, num_workers, batch_graphs, seed, epoch, subgraphs
        )
    if random_access is None:
        random_access = manifest.compression == "none"
    if random_access and manifest.compression != "none":
        raise ConfigError(
            f"{dataset} has {manifest.compression}-compressed shards, which cannot be read by "
            "offset: plan with random_access=False (or prepare with records.compression=none)"
        )
    layout = {} if random_access else {"shard_of": table.shard, "record_of": table.record}
    cost = np.asarray(table.num_edges) + node_cost * np.asarray(table.num_nodes, np.float64)
    return plan_epoch(
        table.num_edges,
        num_workers,
        batch_graphs,
        seed,
        epoch,
        shards_per_group=shards_per_group,
        sort_window=sort_window if random_access else 1,
        cost=cost,
        **layout,
    )


def train_dataset(
    dataset_dir: str | os.PathLike,
    manifest: Manifest,
    plan: Union[EpochPlan, Sequence[EpochPlan]],
    worker: int,
    split: str = "train",
    steps: Optional[int] = None,
    skip: int = 0,
) -> tf.data.Dataset:
    """The worker's steps of the plan, in plan order.

    Args:
      dataset_dir: the dataset directory (checked once with ``open_dataset``).
      manifest: its manifest.
      plan: the epoch plan, from ``plan_train_epoch`` on the same manifest and split; a plan
        without shard layout is read by random access, one with it by streaming shards. Several
        plans (e.g. one per epoch, same ``num_workers`` and ``batch_graphs``) are read back to
        back by one dataset, which saves building and tearing down a pipeline per epoch
        (0.23-0.25 s here; training reads ``inputs.epochs.EPOCHS_PER_PIPELINE`` epochs per
        pipeline).
      worker: this worker's rank in [0, plan.num_workers).
      split: the split the plan was made for.
      steps: read only each plan's first ``steps`` steps (training: ``train.max_steps_per_epoch``
        or the whole optimizer steps of ``distributed.backward_passes_per_step``).
      skip: leave out the first plan's first ``skip`` steps (a resume mid-epoch); their
        records are not parsed, nor read by offset; streamed, a shard holding none of the
        remaining steps' records is not opened, one holding some is streamed from its start
        and the left-out records dropped before parsing.

    Returns:
      A dataset of exactly ``plan.num_steps`` elements ``(GraphsTuple, labels)`` (``steps`` per
      plan when given; summed over the plans, less ``skip``); step s merges the graphs
      ``plan.graph_ids[worker, s]`` in that order (``s + skip`` in the first plan). For a
      ``SubgraphPlan`` it merges the subgraphs of those units (``subgraphs.sample_subgraph``,
      nodes and edges in graph order), non-seed edges labelled ``sampling.ignored_label``.

    Raises:
      ConfigError: when a plan was not made for this split, plans differ in batch_graphs or
        num_workers (subgraph plans: or in seed or sampling), a plan has fewer than ``steps``
        steps, ``skip`` is not less than the first plan's steps, or for a bad worker.
      DataError: for an empty split, a missing or wrongly sized shard, or (random access) a
        shard whose records do not match the manifest.
    """
    plans = [plan] if isinstance(plan, EpochPlan) else list(plan)
    if not plans or len({(p.num_workers, p.batch_graphs) for p in plans}) != 1:
        raise ConfigError(
            "train_dataset needs one or more plans with equal num_workers and batch_graphs"
        )
    check_splits(manifest, dataset_dir, [split])
    table = manifest.split_table(split, str(dataset_dir))
    for each in plans:
        _check_plan(each, table, manifest, dataset_dir, split)
        if steps is not None and not 0 < steps <= each.num_steps:
            raise ConfigError(
                f"the plan of epoch {each.epoch} has {each.num_steps} steps; "
                f"{steps} were asked for"
            )
    batch_graphs = plans[0].batch_graphs
    per_plan = [steps or p.num_steps for p in plans]
    if not 0 <= skip < per_plan[0]:
        raise ConfigError(
            f"skip={skip} needs 0 <= skip < {per_plan[0]}, the steps read of epoch {plans[0].epoch}"
        )
    # Each plan's first steps: its reading order, cut after that many batches of graphs.
    ids = [p.worker_graph_ids(worker)[: n * batch_graphs] for p, n in zip(plans, per_plan)]
    ids[0] = ids[0][skip * batch_graphs :]
    reader = ShardReader(dataset_dir, manifest, table)
    if any(isinstance(p, SubgraphPlan) for p in plans):
        if not all(isinstance(p, SubgraphPlan) for p in plans):
            raise ConfigError("train_dataset cannot mix whole-graph plans and subgraph plans")
        if len({(p.seed, p.sampling) for p in plans}) > 1:
            raise ConfigError(
                f"the subgraph plans of epochs {[p.epoch for p in plans]} differ in seed or "
                "sampling: train_dataset reads the plans of one training run"
            )
        return _subgraph_batches(reader, plans, ids)
    if all(p.shard_order is None for p in plans):
        records = reader.records_by_offset(np.concatenate(ids))
    else:
        parts = [
            reader.records_by_offset(mine)
            if p.shard_order is None
            else reader.records_streamed(mine, p.shard_order, p.shards_per_group)
            for p, mine in zip(plans, ids)
        ]
        records = functools.reduce(tf.data.Dataset.concatenate, parts)
    return _batches(records, reader, batch_graphs, num_steps=sum(per_plan) - skip)


def _check_plan(
    plan: EpochPlan, table: SplitTable, manifest: Manifest, dataset_dir: Any, split: str
) -> None:
    if isinstance(plan, SubgraphPlan):
        if plan.num_split_graphs != table.num_graphs or manifest.compression != "none":
            raise ConfigError(
                f"the subgraph plan ({plan.num_split_graphs} graphs) was not made for split "
                f"'{split}' of {dataset_dir} ({table.num_graphs} graphs, "
                f"{manifest.compression} compression) - make it with plan_train_epoch(manifest, ...)"
            )
        return
    num_shards = None if plan.shard_order is None else plan.shard_order.shape[0]
    if plan.num_graphs != table.num_graphs or num_shards not in (None, table.num_shards):
        layout = "read by offset" if num_shards is None else f"in {num_shards} shards"
        raise ConfigError(
            f"the epoch plan ({plan.num_graphs} graphs {layout}) was not made for split '{split}' "
            f"of {dataset_dir} ({table.num_graphs} graphs in {table.num_shards} shards) - make it "
            "with plan_train_epoch(manifest, ...)"
        )
    if plan.shard_order is None and manifest.compression != "none":
        raise ConfigError(
            f"the epoch plan reads records by offset but {dataset_dir} has "
            f"{manifest.compression}-compressed shards - make it with plan_train_epoch(manifest, ...)"
        )


def eval_dataset(
    dataset_dir: str | os.PathLike,
    manifest: Manifest,
    split: str,
    worker: int,
    num_workers: int,
    batch_graphs: int,
) -> tf.data.Dataset:
    """The worker's part of a split: graphs [w*G/W, (w+1)*G/W) in manifest order.

    Over all workers every graph comes exactly once; parts differ by at most one graph and the
    last batch of a part may hold fewer than ``batch_graphs`` graphs (a part may be empty when
    G < num_workers).

    Raises:
      ConfigError: for a worker outside [0, num_workers) or batch_graphs < 1.
      DataError: for an empty split or a missing or wrongly sized shard.
    """
    if not 0 <= worker < num_workers or batch_graphs < 1:
        raise ConfigError(
            f"worker {worker} of {num_workers} workers with batch_graphs {batch_graphs}: need "
            "0 <= worker < num_workers and batch_graphs >= 1"
        )
    check_splits(manifest, dataset_dir, [split])
    table = manifest.split_table(split, str(dataset_dir))
    first = worker * table.num_graphs // num_workers
    last = (worker + 1) * table.num_graphs // num_workers
    starts = table.shard_starts
    sizes = table.shard_sizes
    skip = np.clip(first - starts, 0, sizes)
    take = np.clip(last - starts, 0, sizes) - skip
    used = np.flatnonzero(take > 0)
    reader = ShardReader(dataset_dir, manifest, table)

    def read_slice(shard: tf.Tensor, skip: tf.Tensor, take: tf.Tensor) -> tf.data.Dataset:
        return reader.records(shard).skip(skip).take(take)

    records = tf.data.Dataset.from_tensor_slices(
        (used.astype(np.int64), skip[used].astype(np.int64), take[used].astype(np.int64))
    ).flat_map(read_slice)
    return _batches(records, reader, batch_graphs)


def graph_signature(graphs: Any) -> gn_graphs.GraphsTuple:
    """TensorSpecs for GraphsTuples like ``graphs`` (tensors or specs) with every size dynamic."""
    return utils_tf.specs_from_graphs_tuple(
        graphs, dynamic_num_graphs=True, dynamic_num_nodes=True, dynamic_num_edges=True
    )


def input_signature() -> tuple[gn_graphs.GraphsTuple, tf.TensorSpec]:
    """``(GraphsTuple specs, labels spec)`` of the pipelines' elements, for ``tf.function``."""
    return graph_signature(placeholder_graph()), tf.TensorSpec([None], tf.float32)


def placeholder_graph() -> gn_graphs.GraphsTuple:
    """A one-edge graph with the pipelines' field sizes and dtypes: creates a Sonnet model's
    variables before a compiled step or a checkpoint restore needs them."""
    return gn_graphs.GraphsTuple(
        nodes=tf.zeros([2, NODE_FEATURE_SIZE], tf.float32),
        edges=tf.zeros([1, EDGE_FEATURE_SIZE], tf.float32),
        receivers=tf.constant([1], tf.int32),
        senders=tf.constant([0], tf.int32),
        globals=tf.zeros([1, 1], tf.float32),
        n_node=tf.constant([2], tf.int32),
        n_edge=tf.constant([1], tf.int32),
    )


@contextlib.contextmanager
def read_errors_as_data_error(
    dataset_dir: str | os.PathLike, manifest: Optional[Manifest] = None
) -> Iterator[None]:
    """Turns TensorFlow read errors raised in the block into DataErrors naming the shard.

    A DataLossError (truncated or corrupt record) or a record that cannot be parsed does not
    say which file it came from: the shards are then checked against the manifest's sizes and
    checksums to name the bad one, which is read again to name its first unreadable record.
    An InvalidArgumentError carrying the schema-version message
    becomes a DataError with that message. Other errors pass unchanged.
    """
    try:
        yield
    except tf.errors.DataLossError as err:
        raise _damaged_shard_error(dataset_dir, manifest, err) from None
    except tf.errors.InvalidArgumentError as err:
        message = getattr(err, "message", str(err))
        found = _RECORD_MESSAGE.search(message)
        if found is not None:
            raise DataError(f"{dataset_dir}: {found.group(1)}") from None
        if _UNPARSABLE.search(message):  # damaged bytes that still passed the record CRC
            raise _damaged_shard_error(dataset_dir, manifest, err) from None
        raise


def iterate_batches(
    dataset: tf.data.Dataset, dataset_dir: str | os.PathLike, manifest: Optional[Manifest] = None
) -> Iterator[Any]:
    """Iterates ``dataset`` with read errors turned into DataErrors naming the shard."""
    with read_errors_as_data_error(dataset_dir, manifest):
        yield from dataset


# ---------------------------------------------------------------------------- internals
def _batches(
    records: tf.data.Dataset,
    reader: ShardReader,
    batch_graphs: int,
    num_steps: Optional[int] = None,
) -> tf.data.Dataset:
    """Batches serialized records, then parses and merges each batch in parallel.

    Parsing a batch at once (fields joined as bytes, decoded once) copies the graph data fewer
    times than parsing records one by one and ragged-batching them: about 20% faster here, the
    pipeline being bound by memory copies. ``drop_remainder`` stays off (training streams hold
    whole batches anyway) so that the number of graphs is dynamic in the element spec, which
    then equals ``input_signature()``. With ``num_steps`` at most that many batches are taken.
    Parallelism is fixed (``_FIXED_PARALLELISM``: autotuning stalls iterator teardown).
    """
    batched = records.batch(batch_graphs)
    if num_steps is not None:
        batched = batched.take(num_steps)
    merged = batched.map(
        reader.parse_and_merge, num_parallel_calls=_PARALLEL_PARSES, deterministic=True
    )
    return merged.prefetch(_PREFETCH_BATCHES).with_options(_FIXED_PARALLELISM)


def _subgraph_batches(
    reader: ShardReader, plans: Sequence[SubgraphPlan], units: Sequence[np.ndarray]
) -> tf.data.Dataset:
    """Steps of subgraph plans (one seed and sampling), the units ``units[i]`` of plan i (whole
    steps): each unit's graph read by offset, its subgraph sampled (in parallel, order kept),
    ``batch_graphs`` subgraphs merged per step. One dataset (one trace of its functions) over
    every plan: a unit's epoch is one of its elements."""

    def column(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name)[u] for p, u in zip(plans, units)]).astype(np.int64)

    graphs = column("unit_graph")
    epochs = np.concatenate([np.full(len(u), p.epoch, np.int64) for p, u in zip(plans, units)])
    info = tf.data.Dataset.from_tensor_slices(
        (graphs, column("unit_index"), column("unit_count"), epochs)
    )
    sampling, seed, batch_graphs = plans[0].sampling, plans[0].seed, plans[0].batch_graphs

    @tf.autograph.experimental.do_not_convert  # as ShardReader.parse_and_merge
    def sample(record: tuple, unit: tuple) -> dict[str, tf.Tensor]:
        shard, index, serialized = record
        graph, unit_index, unit_count, epoch = unit
        where = tf.strings.join(
            ["record ", tf.strings.as_string(index), " of ", tf.gather(reader.names, shard)]
        )
        values, rows = parse_example_batch(serialized[None], where[None], TRAIN_FIELDS)
        values = checked_endpoints(values, rows, where[None])
        sender_phi = (
            tf.gather(values["nodes"][:, NODE_PHI_COLUMN], values["senders"])
            if sampling.seed_order == "local"
            else None
        )
        seeds = unit_seed_edges(
            rows["E"][0], seed, epoch, graph, unit_index, unit_count, sender_phi
        )
        node_ids, edge_ids, is_seed = sample_subgraph(
            values["senders"],
            values["receivers"],
            rows["N"][0],
            seeds,
            sampling.hops,
            sampling.max_nodes_per_hop,
            unit_key(seed, epoch, graph, unit_index),
        )
        # Old node id -> position in the subgraph (only kept nodes are looked up).
        new_index = tf.math.unsorted_segment_max(
            tf.range(tf.shape(node_ids)[0]), node_ids, rows["N"][0]
        )
        labels = tf.gather(values["labels"], edge_ids)
        return {
            "nodes": tf.gather(values["nodes"], node_ids),
            "edges": tf.gather(values["edges"], edge_ids),
            "senders": tf.gather(new_index, tf.gather(values["senders"], edge_ids)),
            "receivers": tf.gather(new_index, tf.gather(values["receivers"], edge_ids)),
            "labels": tf.where(is_seed, labels, sampling.ignored_label),
        }

    @tf.autograph.experimental.do_not_convert
    def merge(batch: dict[str, tf.RaggedTensor]) -> tuple[gn_graphs.GraphsTuple, tf.Tensor]:
        n_node = tf.cast(batch["nodes"].row_lengths(), tf.int32)
        n_edge = tf.cast(batch["edges"].row_lengths(), tf.int32)
        return merge_graphs({k: v.flat_values for k, v in batch.items()}, n_node, n_edge)

    records = tf.data.Dataset.zip(reader.records_by_offset(graphs), info)
    sampled = records.map(sample, num_parallel_calls=_PARALLEL_PARSES, deterministic=True)
    batched = sampled.ragged_batch(batch_graphs)  # whole steps: no batch spans two plans
    merged = batched.map(merge, num_parallel_calls=_PARALLEL_PARSES, deterministic=True)
    return merged.prefetch(_PREFETCH_BATCHES).with_options(_FIXED_PARALLELISM)


def _damaged_shard_error(
    dataset_dir: str | os.PathLike, manifest: Optional[Manifest], err: Exception
) -> DataError:
    """Names the shard (by size and checksum) and its first unreadable record, which
    TensorFlow's error does not."""
    text = getattr(err, "message", str(err)).split("}} ", 1)[-1].split(" [Op:", 1)[0].strip()
    for shard in manifest.shards if manifest is not None else ():
        problem = shard_problem(shard, dataset_dir, checksum=True)
        if problem is not None:
            path = Path(dataset_dir) / shard.file
            record = first_unreadable_record(path, manifest.compression) if path.is_file() else None
            at = "" if record is None else f" at record {record} of {shard.file}"
            return DataError(f"reading failed{at} ({text}): {problem}")
    return DataError(
        f"a shard of {dataset_dir} is truncated or corrupt ({text}) - check it with "
        "open_dataset(verify=True) or re-run hvdtrack prepare"
    )
