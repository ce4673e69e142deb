"""The dataset manifest (manifest.json): which shards and graphs a prepared dataset holds.

A dataset directory holds TFRecord shards named ``<split>-00003-of-00016.tfrecord[.gz]`` and one
``manifest.json`` listing the schema version, the compression, every shard (file, split, index,
number of graphs, sha256, bytes) and every graph (split, shard index within the split, record
index within the shard, event_id, section, num_nodes, num_edges, num_true_edges). Readers plan
from the manifest alone; shards are opened only to read graphs.

Public symbols: ``MANIFEST_NAME``, ``FORMAT_NAME``, ``ShardInfo``, ``GraphInfo``,
``SplitTable``, ``Manifest``, ``shard_file_name``, ``shard_problem``, ``check_shard_files``,
``verify_checksums``, ``check_splits``, ``open_dataset``, ``sha256_of_file``,
``manifest_digest``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import typing
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from hvdtrack.errors import DataError
from hvdtrack.records.schema import SCHEMA_VERSION, version_mismatch_message
from hvdtrack.utils.io import atomic_write

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "hvdtrack-graph-records"
COMPRESSIONS = ("none", "gzip")
SHARD_SUFFIX = {"none": ".tfrecord", "gzip": ".tfrecord.gz"}
SPLIT_NAME = re.compile(r"^[A-Za-z0-9_]+$")
PREPARE_AGAIN = "re-run hvdtrack prepare"


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    """One graph of a dataset: where it is stored and what it holds (a manifest row).

    ``split``, ``shard`` (index within the split) and ``record`` (index within the shard) are
    known once the graph is written; until then (``encode_graph``) they are "", -1 and -1.
    """

    split: str = dataclasses.field(default="", kw_only=True)
    shard: int = dataclasses.field(default=-1, kw_only=True)
    record: int = dataclasses.field(default=-1, kw_only=True)
    event_id: int
    section: int
    num_nodes: int
    num_edges: int
    num_true_edges: int


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One written shard file.

    Attributes:
      file: file name inside the dataset directory, e.g. ``train-00003-of-00016.tfrecord``.
      split: the split it belongs to.
      index: shard index within the split (the 00003).
      num_graphs: records in the file.
      sha256: hex digest of the file bytes.
      num_bytes: file size.
      graphs: the stored graphs in record order (only on freshly written shards; the manifest
        keeps them in ``Manifest.graphs``).
    """

    file: str
    split: str
    index: int
    num_graphs: int
    sha256: str
    num_bytes: int
    graphs: tuple[GraphInfo, ...] = dataclasses.field(default=(), compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class SplitTable:
    """The graphs of one split as columns; row i is graph id i of the split (shard-major order).

    Attributes:
      split: split name.
      shard_files: file names of the split's shards, by shard index.
      shard: int64 [G] shard index of each graph.
      record: int64 [G] record index within its shard.
      event_id, section, num_nodes, num_edges, num_true_edges: int64 [G].
    """

    split: str
    shard_files: tuple[str, ...]
    shard: np.ndarray
    record: np.ndarray
    event_id: np.ndarray
    section: np.ndarray
    num_nodes: np.ndarray
    num_edges: np.ndarray
    num_true_edges: np.ndarray

    @property
    def num_graphs(self) -> int:
        return int(self.shard.shape[0])

    @property
    def num_shards(self) -> int:
        return len(self.shard_files)

    @property
    def shard_sizes(self) -> np.ndarray:
        """int64 [num_shards] number of graphs in each shard."""
        return np.bincount(self.shard, minlength=self.num_shards).astype(np.int64)

    @property
    def shard_starts(self) -> np.ndarray:
        """int64 [num_shards] graph id of each shard's record 0."""
        sizes = self.shard_sizes
        return np.cumsum(sizes) - sizes


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A prepared dataset's contents.

    Shards are ordered by split (in ``splits`` order) then index; graphs by split, shard, record.
    """

    schema_version: int
    compression: str
    splits: tuple[str, ...]
    shards: tuple[ShardInfo, ...]
    graphs: tuple[GraphInfo, ...]
    graphs_per_shard: int = 0
    seed: int = 0

    @classmethod
    def from_shards(
        cls,
        shards: Sequence[ShardInfo],
        compression: str,
        graphs_per_shard: int = 0,
        seed: int = 0,
        splits: Optional[Sequence[str]] = None,
    ) -> Manifest:
        """Builds the manifest of freshly written shards (which carry their ``graphs``)."""
        names = list(splits or [])
        for shard in shards:
            if shard.split not in names:
                names.append(shard.split)
        ordered = sorted(shards, key=lambda s: (names.index(s.split), s.index))
        graphs = tuple(
            dataclasses.replace(info, split=s.split, shard=s.index, record=record)
            for s in ordered
            for record, info in enumerate(s.graphs)
        )
        plain = tuple(dataclasses.replace(s, graphs=()) for s in ordered)
        manifest = cls(
            SCHEMA_VERSION, compression, tuple(names), plain, graphs, graphs_per_shard, seed
        )
        manifest.validate("new manifest")
        return manifest

    # ----------------------------------------------------------------------------- queries
    def shards_in(self, split: str) -> tuple[ShardInfo, ...]:
        """The split's shards, by index."""
        return tuple(s for s in self.shards if s.split == split)

    def split_table(self, split: str, dataset: str = "the dataset") -> SplitTable:
        """The split's graphs as columns.

        Raises:
          DataError: naming ``dataset`` and the split when it holds no graphs.
        """
        rows = [g for g in self.graphs if g.split == split]
        if not rows:
            raise DataError(_empty_split_message(self, split, dataset))
        columns = {
            name: np.array([getattr(g, name) for g in rows], dtype=np.int64)
            for name in (
                "shard",
                "record",
                "event_id",
                "section",
                "num_nodes",
                "num_edges",
                "num_true_edges",
            )
        }
        files = tuple(s.file for s in self.shards_in(split))
        return SplitTable(split=split, shard_files=files, **columns)

    def num_graphs(self, split: Optional[str] = None) -> int:
        return sum(1 for g in self.graphs if split is None or g.split == split)

    # ------------------------------------------------------------------------ file format
    def to_json(self) -> str:
        """manifest.json text: one shard / graph per line so that large manifests stay readable."""
        head = {
            "format": FORMAT_NAME,
            "schema_version": self.schema_version,
            "compression": self.compression,
            "graphs_per_shard": self.graphs_per_shard,
            "seed": self.seed,
            "splits": list(self.splits),
        }
        lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        lines.append('  "shards": [')
        shard_rows = [dataclasses.asdict(dataclasses.replace(s, graphs=())) for s in self.shards]
        for row in shard_rows:
            row.pop("graphs")
        lines += _json_rows(shard_rows)
        lines.append("  ],")
        lines.append('  "graphs": [')
        lines += _json_rows([dataclasses.asdict(g) for g in self.graphs])
        lines.append("  ]")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def write(self, dataset_dir: str | os.PathLike) -> Path:
        """Writes ``<dataset_dir>/manifest.json`` atomically; returns its path."""
        path = Path(dataset_dir) / MANIFEST_NAME
        with atomic_write(path) as f:
            f.write(self.to_json())
        return path

    @classmethod
    def load(cls, dataset_dir: str | os.PathLike) -> Manifest:
        """Reads and validates ``<dataset_dir>/manifest.json``.

        Raises:
          DataError: naming the file when it is missing, not JSON, of another format or schema
            version, or inconsistent (a graph pointing at a missing shard, record counts that do
            not match, duplicate records).
        """
        path = Path(dataset_dir) / MANIFEST_NAME
        if not path.is_file():
            raise DataError(
                f"{dataset_dir} has no {MANIFEST_NAME}: it is not a prepared dataset - "
                "run hvdtrack prepare to make one"
            )
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataError(f"{path} is unreadable ({err}) - {PREPARE_AGAIN}") from None
        return cls.from_json_dict(data, str(path))

    @classmethod
    def from_json_dict(cls, data: Any, where: str = MANIFEST_NAME) -> Manifest:
        """Builds and validates a manifest from its parsed JSON.

        Every field is type-checked first, so a hand-edited or damaged manifest is refused with
        the file and key named (``shards[3].num_bytes``) rather than failing later.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise DataError(f"{where} is not an hvdtrack dataset manifest (format '{FORMAT_NAME}')")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise DataError(
                version_mismatch_message(where, version if isinstance(version, int) else -1)
            )
        for key in ("compression", "splits", "shards", "graphs"):
            if key not in data:
                raise DataError(f"{where}: key '{key}' is missing - {PREPARE_AGAIN}")
        manifest = cls(
            schema_version=version,
            compression=_typed(data["compression"], str, "compression", where),
            splits=tuple(
                _typed(name, str, f"splits[{i}]", where)
                for i, name in enumerate(_typed(data["splits"], list, "splits", where))
            ),
            shards=_rows(ShardInfo, data["shards"], "shards", where),
            graphs=_rows(GraphInfo, data["graphs"], "graphs", where),
            graphs_per_shard=_typed(
                data.get("graphs_per_shard", 0), int, "graphs_per_shard", where
            ),
            seed=_typed(data.get("seed", 0), int, "seed", where),
        )
        manifest.validate(where)
        return manifest

    def validate(self, where: str = MANIFEST_NAME) -> None:
        """Checks internal consistency; raises DataError naming ``where`` and the bad entry."""

        def fail(what: str) -> None:
            raise DataError(f"{where}: {what} - the manifest is damaged; {PREPARE_AGAIN}")

        if self.compression not in COMPRESSIONS:
            fail(f"compression '{self.compression}' is not one of {', '.join(COMPRESSIONS)}")
        for split in self.splits:
            if not SPLIT_NAME.match(split):
                fail(f"split name '{split}' is not letters, digits and underscores")
        shard_keys: dict[tuple[str, int], ShardInfo] = {}
        files = set()
        num_shards = {split: 0 for split in self.splits}
        for shard in self.shards:
            if shard.split not in self.splits:
                fail(f"shard {shard.file} belongs to split '{shard.split}', which is not listed")
            num_shards[shard.split] += 1
        for shard in self.shards:
            expected = shard_file_name(
                shard.split, shard.index, num_shards[shard.split], self.compression
            )
            if shard.file != expected:
                fail(f"shard {shard.file} should be named {expected}")
            if shard.file in files:
                fail(f"shard {shard.file} is listed twice")
            files.add(shard.file)
            shard_keys[(shard.split, shard.index)] = shard
        for split in self.splits:
            indices = [s.index for s in self.shards if s.split == split]
            if indices != list(range(len(indices))):
                fail(
                    f"split '{split}' lists shard indices {indices}, not 0..{len(indices) - 1} in order"
                )
        records: dict[tuple[str, int], list[int]] = {key: [] for key in shard_keys}
        previous = None
        for i, graph in enumerate(self.graphs):
            key = (graph.split, graph.shard)
            if key not in shard_keys:
                fail(
                    f"graph {i} refers to shard {graph.shard} of split '{graph.split}', which is not listed"
                )
            order = (self.splits.index(graph.split), graph.shard, graph.record)
            if previous is not None and order <= previous:
                fail(f"graph {i} is out of (split, shard, record) order")
            previous = order
            records[key].append(graph.record)
        for key, shard in shard_keys.items():
            if records[key] != list(range(shard.num_graphs)):
                fail(
                    f"shard {shard.file} holds {shard.num_graphs} graphs but the manifest lists "
                    f"records {records[key][:5]}{'...' if len(records[key]) > 5 else ''}"
                )


_TYPE_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "an object"}


def _typed(value: Any, kind: type, key: str, where: str) -> Any:
    """``value`` if it is a JSON value of type ``kind`` (true/false are not integers)."""
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    got = "null" if value is None else f"{type(value).__name__} {json.dumps(value)[:40]}"
    raise DataError(f"{where}: '{key}' must be {_TYPE_NAMES[kind]}, got {got} - {PREPARE_AGAIN}")


def _rows(cls: type, rows: Any, key: str, where: str) -> tuple:
    """``cls`` made from each JSON object of the list ``rows``, every field type-checked."""
    kinds = {
        name: kind
        for name, kind in typing.get_type_hints(cls).items()
        if name != "graphs"  # ShardInfo.graphs: only on freshly written shards
    }
    names, types = tuple(kinds), tuple(kinds.values())
    made = []
    for i, row in enumerate(_typed(rows, list, key, where)):
        # Exact types in field order (as written; JSON makes true/false bools, not ints): a
        # cheap check per row, as manifests list every graph. The slow path names the culprit.
        if type(row) is not dict or tuple(row) != names or tuple(map(type, row.values())) != types:
            _explain_row(row, kinds, f"{key}[{i}]", where)
        made.append(cls(**row))
    return tuple(made)


def _explain_row(row: Any, kinds: dict[str, type], key: str, where: str) -> None:
    """Raises DataError naming the first missing, unknown or mistyped key (keys in another
    order pass)."""
    _typed(row, dict, key, where)
    missing = [name for name in kinds if name not in row]
    if missing:
        raise DataError(f"{where}: '{key}' has no '{missing[0]}' - {PREPARE_AGAIN}")
    unknown = sorted(row.keys() - kinds.keys())
    if unknown:
        raise DataError(f"{where}: '{key}' has unknown keys {unknown} - {PREPARE_AGAIN}")
    for name, kind in kinds.items():
        _typed(row[name], kind, f"{key}.{name}", where)


def shard_file_name(split: str, index: int, num_shards: int, compression: str) -> str:
    """``train-00003-of-00016.tfrecord`` (``.tfrecord.gz`` when gzip-compressed)."""
    return f"{split}-{index:05d}-of-{num_shards:05d}{SHARD_SUFFIX[compression]}"


def sha256_of_file(path: str | os.PathLike) -> str:
    """Hex sha256 digest of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest_digest(dataset_dir: str | os.PathLike) -> str:
    """A dataset's identity as a run records it (``run.json``'s ``dataset_digest``): the first 16
    hex digits of its manifest file's sha256 (the manifest holds every shard's checksum)."""
    return hashlib.sha256((Path(dataset_dir) / MANIFEST_NAME).read_bytes()).hexdigest()[:16]


def shard_problem(
    shard: ShardInfo, dataset_dir: str | os.PathLike, checksum: bool = False
) -> Optional[str]:
    """What is wrong with a shard file: missing, not the manifest's size or (with ``checksum``,
    which reads every byte) not its sha256. None when nothing is."""
    path = Path(dataset_dir) / shard.file
    where = f"shard {shard.file} of split '{shard.split}'"
    if not path.is_file():
        return f"{where} is missing from {dataset_dir} - {PREPARE_AGAIN}"
    size = path.stat().st_size
    if size != shard.num_bytes:
        return (
            f"{where} in {dataset_dir} is {size} bytes but the manifest says "
            f"{shard.num_bytes}: it is truncated or was changed - {PREPARE_AGAIN}"
        )
    if checksum:
        digest = sha256_of_file(path)
        if digest != shard.sha256:
            return (
                f"{where} in {dataset_dir} does not match its checksum in the manifest "
                f"(sha256 {digest[:12]}... instead of {shard.sha256[:12]}...): the file was "
                f"changed or damaged - {PREPARE_AGAIN}"
            )
    return None


def check_shard_files(
    manifest: Manifest, dataset_dir: str | os.PathLike, splits: Optional[Iterable[str]] = None
) -> None:
    """Checks that every shard (of ``splits``, default all) exists with the manifest's size;
    DataError naming the missing or wrongly sized (truncated) shard, its split and directory."""
    _raise_first_problem(manifest, dataset_dir, splits, checksum=False)


def verify_checksums(
    manifest: Manifest, dataset_dir: str | os.PathLike, splits: Optional[Iterable[str]] = None
) -> None:
    """Checks size and sha256 of every shard (of ``splits``, default all) against the manifest;
    DataError naming the first shard missing, of the wrong size or not matching its checksum."""
    check_shard_files(manifest, dataset_dir, splits)  # every size first: no hashing in vain
    _raise_first_problem(manifest, dataset_dir, splits, checksum=True)


def check_splits(manifest: Manifest, dataset_dir: str | os.PathLike, splits: Iterable[str]) -> None:
    """Refuses, before anything is read, a split of ``splits`` that holds no graphs or whose
    shard files are missing or of the wrong size (a training run needs train, and val to
    validate: an empty or broken one would otherwise fail only when first read, an epoch in).
    DataError names the dataset directory, the split and (for a shard) the file."""
    splits = list(splits)
    for split in splits:
        if not manifest.num_graphs(split):
            raise DataError(_empty_split_message(manifest, split, str(dataset_dir)))
    check_shard_files(manifest, dataset_dir, splits)


def open_dataset(
    dataset_dir: str | os.PathLike,
    verify: bool = True,
    splits: Optional[Iterable[str]] = None,
    required: Sequence[str] = (),
) -> Manifest:
    """Loads a dataset's manifest and checks its shards; call once before reading.

    Args:
      dataset_dir: the directory ``hvdtrack prepare`` wrote.
      verify: also compare every shard's sha256 with the manifest (reads all bytes once);
        without it only presence and sizes are checked.
      splits: only check the shards of these splits (default: all).
      required: splits that must hold graphs (``check_splits``), e.g. train and val for training.

    Returns the validated ``Manifest``; DataError: see ``Manifest.load``, ``check_splits``,
    ``check_shard_files`` and ``verify_checksums``.
    """
    manifest = Manifest.load(dataset_dir)
    check_splits(manifest, dataset_dir, required)
    if verify:
        verify_checksums(manifest, dataset_dir, splits)
    else:
        check_shard_files(manifest, dataset_dir, splits)
    return manifest


def _raise_first_problem(manifest: Manifest, dataset_dir, splits, checksum: bool) -> None:
    wanted = set(manifest.splits if splits is None else splits)
    for shard in manifest.shards:
        problem = shard.split in wanted and shard_problem(shard, dataset_dir, checksum)
        if problem:
            raise DataError(problem)


def _empty_split_message(manifest: Manifest, split: str, dataset: str) -> str:
    have = ", ".join(f"'{s}'" for s in manifest.splits if manifest.num_graphs(s)) or "none"
    return (
        f"{dataset} has no graphs in split '{split}' (splits with graphs: {have}) - "
        f"prepare the dataset with a non-empty '{split}' split or pick another split"
    )


def _json_rows(rows: list[dict]) -> list[str]:
    return [
        f"    {json.dumps(row)}{',' if i < len(rows) - 1 else ''}" for i, row in enumerate(rows)
    ]
