"""Reading one split's graphs from its TFRecord shards: whole shards streamed, or single records
by byte offset (found once from the shards' record framing and cached per shard file), parsed
and merged per batch into one GraphsTuple (``merge_graphs``). ``hvdtrack.inputs.pipeline``
builds the datasets on it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import tensorflow as tf
from graph_nets import graphs as gn_graphs

from hvdtrack.records.manifest import Manifest, SplitTable
from hvdtrack.records.schema import parse_example_batch
from hvdtrack.records.shards import index_shard_records

TRAIN_FIELDS = ("nodes", "edges", "senders", "receivers", "labels")
_READ_BUFFER_BYTES = 4 << 20
_PARALLEL_READS = 4


def merge_graphs(
    values: dict[str, tf.Tensor], n_node: tf.Tensor, n_edge: tf.Tensor
) -> tuple[gn_graphs.GraphsTuple, tf.Tensor]:
    """Builds one GraphsTuple from the concatenated fields of a batch of graphs (vectorised).

    Args:
      values: ``TRAIN_FIELDS`` concatenated over the batch: nodes float32 [sum N, 3], edges
        float32 [sum E, 4], senders/receivers int32 [sum E] (indices within their own graph),
        labels float32 [sum E].
      n_node: int32 [B] nodes per graph.
      n_edge: int32 [B] edges per graph.

    Returns:
      ``(graphs, labels)`` (shapes: ``hvdtrack.inputs.pipeline``). Senders and receivers are
      offset by the number of nodes of the graphs before theirs.
    """
    edge_offsets = tf.repeat(tf.cumsum(n_node, exclusive=True), n_edge)
    graphs = gn_graphs.GraphsTuple(
        nodes=values["nodes"],
        edges=values["edges"],
        receivers=values["receivers"] + edge_offsets,
        senders=values["senders"] + edge_offsets,
        globals=tf.zeros([tf.shape(n_node)[0], 1], tf.float32),
        n_node=n_node,
        n_edge=n_edge,
    )
    return graphs, values["labels"]


def checked_endpoints(
    values: dict[str, tf.Tensor], rows: dict[str, tf.Tensor], where: tf.Tensor
) -> dict[str, tf.Tensor]:
    """``values`` of ``parse_example_batch(..., where, fields)``, once every sender and receiver
    is in [0, N) of its own record (fields with ``nodes``; else as they are).

    Raises:
      tf.errors.InvalidArgumentError: (when evaluated) naming the first edge outside by its
        record and its index there. The model's kernels would name it only within its run.
    """
    names = [name for name in ("senders", "receivers") if name in values]
    if not names or "N" not in rows or "E" not in rows:
        return values
    record = tf.repeat(tf.range(tf.size(rows["E"])), rows["E"])
    ends = tf.stack([values[name] for name in names])  # [fields, sum E]
    outside = (ends < 0) | (ends >= tf.gather(rows["N"], record))

    def describe() -> tf.Tensor:  # only when some edge is outside, so sum E > 0
        edge = tf.argmax(tf.cast(tf.reduce_any(outside, 0), tf.int32), output_type=tf.int32)
        field = tf.argmax(tf.cast(outside[:, edge], tf.int32), output_type=tf.int32)
        first, text = record[edge], tf.strings.as_string
        index = edge - tf.cumsum(rows["E"], exclusive=True)[first]
        return tf.strings.join([
            tf.convert_to_tensor(where, tf.string)[first], ": edge ", text(index), " has ",
            tf.constant([name[:-1] for name in names])[field], " ", text(ends[field, edge]),
            ", outside its ", text(rows["N"][first]), " hits - re-run hvdtrack prepare",
        ])  # fmt: skip

    bad = tf.reduce_any(outside)
    message = tf.cond(bad, describe, lambda: tf.constant(""))
    with tf.control_dependencies([tf.debugging.Assert(tf.logical_not(bad), [message])]):
        return {name: tf.identity(value) for name, value in values.items()}


class ShardReader:
    """Reads one split's shards as (shard, record index, serialized record) triples."""

    def __init__(self, dataset_dir: str | os.PathLike, manifest: Manifest, table: SplitTable):
        self.dataset_dir = Path(dataset_dir)
        self.table = table
        self.paths = tf.constant([str(self.dataset_dir / f) for f in table.shard_files])
        self.names = tf.constant(list(table.shard_files))
        self.starts = tf.constant(table.shard_starts, tf.int64)
        self.compression = "GZIP" if manifest.compression == "gzip" else ""

    def records(self, shard: tf.Tensor) -> tf.data.Dataset:
        """Dataset of (shard, record index, serialized record) for one whole shard."""
        data = tf.data.TFRecordDataset(
            tf.gather(self.paths, shard), self.compression, buffer_size=_READ_BUFFER_BYTES
        )
        return data.enumerate().map(lambda record, serialized: (shard, record, serialized))

    def records_streamed(
        self, graph_ids: np.ndarray, shard_order: np.ndarray, shards_per_group: int
    ) -> tf.data.Dataset:
        """The records ``graph_ids`` out of a stream of the shards in ``shard_order``, read
        ``shards_per_group`` at a time round-robin (the plan's global order). Shards holding
        none of them are not opened (a resume's trained steps, another worker's shards):
        round-robin keeps the other shards' records in their order."""
        k = shards_per_group
        wanted = np.zeros(self.table.num_shards, dtype=bool)
        wanted[self.table.shard[graph_ids]] = True
        groups = np.full((-(-len(shard_order) // k), k), -1, dtype=np.int64)
        groups.reshape(-1)[: len(shard_order)] = np.where(wanted[shard_order], shard_order, -1)
        groups = groups[(groups >= 0).any(axis=1)]
        mine = np.zeros(self.table.num_graphs, dtype=bool)
        mine[graph_ids] = True
        is_mine = tf.constant(mine)

        def read_group(group: tf.Tensor) -> tf.data.Dataset:
            shards = tf.data.Dataset.from_tensor_slices(tf.boolean_mask(group, group >= 0))
            # Deterministic parallel interleave = round-robin over the group, as planned.
            return shards.interleave(
                self.records,
                cycle_length=k,
                block_length=1,
                num_parallel_calls=k,
                deterministic=True,
            )

        def keep(shard: tf.Tensor, record: tf.Tensor, serialized: tf.Tensor) -> tf.Tensor:
            return tf.gather(is_mine, tf.gather(self.starts, shard) + record)

        stream = tf.data.Dataset.from_tensor_slices(groups).flat_map(read_group).filter(keep)
        return stream.take(len(graph_ids))  # no reading on after the last one

    def records_by_offset(self, graph_ids: np.ndarray) -> tf.data.Dataset:
        """The records ``graph_ids``, in that order, each read by seeking to its offset."""
        offsets = _record_offsets(self.dataset_dir, self.table)
        slices = (self.table.shard[graph_ids], self.table.record[graph_ids], offsets[graph_ids])

        def read_one(shard: tf.Tensor, record: tf.Tensor, offset: tf.Tensor) -> tf.data.Dataset:
            variant = tf.raw_ops.TFRecordDatasetV2(
                filenames=tf.gather(self.paths, shard),
                compression_type="",
                buffer_size=tf.constant(0, tf.int64),  # read exactly the record, no read-ahead
                byte_offsets=offset,
            )
            data = tf.data.experimental.from_variant(variant, tf.TensorSpec([], tf.string))
            return data.take(1).map(lambda serialized: (shard, record, serialized))

        return tf.data.Dataset.from_tensor_slices(slices).interleave(
            read_one,
            cycle_length=_PARALLEL_READS,
            block_length=1,
            num_parallel_calls=_PARALLEL_READS,
            deterministic=True,
        )

    @tf.autograph.experimental.do_not_convert  # no tensor-valued Python control flow; its
    # conversion took 1 s of a dataset's first batch (1.4 s)
    def parse_and_merge(
        self, shard: tf.Tensor, record: tf.Tensor, serialized: tf.Tensor
    ) -> tuple[gn_graphs.GraphsTuple, tf.Tensor]:
        """Parses a batch of records [B] and merges them into one GraphsTuple."""
        where = tf.strings.join(
            ["record ", tf.strings.as_string(record), " of ", tf.gather(self.names, shard)]
        )
        values, rows = parse_example_batch(serialized, where, TRAIN_FIELDS)
        return merge_graphs(checked_endpoints(values, rows, where), rows["N"], rows["E"])


@functools.lru_cache(maxsize=1 << 16)
def _cached_offsets(path: str, size: int, mtime_ns: int, num_records: int) -> np.ndarray:
    return index_shard_records(path, num_records)


def _record_offsets(dataset_dir: Path, table: SplitTable) -> np.ndarray:
    """int64 [G] byte offset of every graph of the split in its shard (cached per shard file)."""
    sizes = table.shard_sizes
    per_shard = []
    for file, size in zip(table.shard_files, sizes):
        path = dataset_dir / file
        stat = path.stat()
        per_shard.append(_cached_offsets(str(path), stat.st_size, stat.st_mtime_ns, int(size)))
    return np.concatenate(per_shard)  # rows are in (shard, record) order
