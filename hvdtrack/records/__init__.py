"""Graph records: the stored graph format (``schema``), shard writing (``shards``), ``manifest``.

Nothing here imports TensorFlow at import time (the shard writer and readers import it when
called), so processes that only encode graphs stay light.
"""

from __future__ import annotations

from hvdtrack.records.manifest import (
    Manifest,
    ShardInfo,
    check_shard_files,
    check_splits,
    open_dataset,
    verify_checksums,
)
from hvdtrack.records.schema import SCHEMA_VERSION, example_to_graph, graph_to_example
from hvdtrack.records.shards import (
    DatasetWriter,
    EncodedGraph,
    RecordsConfig,
    encode_graph,
    split_events,
    write_dataset,
)

__all__ = [
    "SCHEMA_VERSION",
    "DatasetWriter",
    "EncodedGraph",
    "Manifest",
    "RecordsConfig",
    "ShardInfo",
    "check_shard_files",
    "check_splits",
    "encode_graph",
    "example_to_graph",
    "graph_to_example",
    "open_dataset",
    "split_events",
    "verify_checksums",
    "write_dataset",
]
