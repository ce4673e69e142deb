"""The shared steps of preparation: event jobs, the replace and up-to-date checks.

``prepare_dataset`` (``hvdtrack.prepare.local``, one process) and ``prepare_dataset_mpi``
(``hvdtrack.prepare.mpi``, the ranks of an MPI job) are built from these steps, so both list the
same events, build the same graphs and refuse the same directories.

The events run in a pool of worker processes (``hvdtrack.prepare.pool``).

Public symbols: ``PREPARE_INFO``, ``CSV_DIR``, ``FIRST_EVENT_ID``, ``EventJob``, ``process_event``,
``event_jobs``, ``SplitJobs``, ``split_jobs``, ``keep_or_remove_events``, ``fingerprint``, ``input_files``, ``prepared_data``, ``up_to_date``,
``stale_reason``, ``check_replaceable``, ``kept_report``, ``build_target``,
``stopped_by_signals``, ``disk_errors``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

from hvdtrack.config import Config, DataConfig
from hvdtrack.configtools import from_mapping, to_mapping
from hvdtrack.errors import DataError
from hvdtrack.events import modules, synthetic, trackml
from hvdtrack.graphs.construction import build_hit_graphs_counting_lost
from hvdtrack.records.manifest import (
    MANIFEST_NAME,
    Manifest,
    check_shard_files,
    sha256_of_file,
)
from hvdtrack.records.shards import EncodedGraph, encode_graph, split_events
from hvdtrack.utils.io import remove_stale_temps

PREPARE_INFO = "prepare.json"
CSV_DIR = "events"  # in the dataset directory: the synthetic events' CSVs and detectors.csv
FIRST_EVENT_ID = 1000

# What one event becomes: its id, its encoded graphs and per graph (true segments, lost ones).
EventResult = tuple[int, list[EncodedGraph], list[tuple[int, int]]]


@dataclasses.dataclass(frozen=True)
class EventJob:
    """One event to turn into graphs (picklable, for worker processes)."""

    data: DataConfig
    event_id: int
    prefix: str | None  # a TrackML event to read; None: generate it into csv_dir first
    csv_dir: str


def process_event(job: EventJob) -> EventResult:
    """Reads (or generates, writes and reads back) one event and builds its encoded graphs."""
    prefix = job.prefix
    if prefix is None:
        event = synthetic.generate_event(job.data.synthetic, job.event_id, job.data.seed)
        prefix = trackml.write_event(event, job.csv_dir)
    event = trackml.read_event(prefix)
    graphs, lost = build_hit_graphs_counting_lost(event, job.data.graph)
    segments = [(g.num_true_segments, int(n)) for g, n in zip(graphs, lost)]
    return job.event_id, [encode_graph(g) for g in graphs], segments


def event_jobs(data: DataConfig, csv_dir: Path) -> list[EventJob]:
    """Every event of ``data`` in order: synthetic ids from ``FIRST_EVENT_ID``, or the first
    ``data.num_events`` events of the TrackML directory.

    Raises:
      DataError: the TrackML directory holds fewer events than ``data.num_events``.
    """
    if data.source == "synthetic":
        ids = range(FIRST_EVENT_ID, FIRST_EVENT_ID + data.num_events)
        return [EventJob(data, i, None, str(csv_dir)) for i in ids]
    prefixes = trackml.find_events(data.trackml_dir)
    if data.num_events is not None:
        if len(prefixes) < data.num_events:
            raise DataError(
                f"{data.trackml_dir}: 'data.num_events' asks for {data.num_events} events but the "
                f"directory holds {len(prefixes)}"
            )
        prefixes = prefixes[: data.num_events]
    return [EventJob(data, trackml.event_id_from_prefix(p), p, str(csv_dir)) for p in prefixes]


def keep_or_remove_events(data: DataConfig, out: Path) -> None:
    """The generated events' CSVs in ``out/CSV_DIR`` removed, or (``data.keep_csv``) completed
    with the detector's ``detectors.csv``: a whole TrackML dataset, which the TrackML library
    and ``trackml.read_detectors`` read. ``out`` is the dataset's staging directory, renamed
    into place only when complete. A TrackML source's events are read where they are: no
    ``CSV_DIR``, nothing to do."""
    csv_dir = out / CSV_DIR
    if not data.keep_csv:
        shutil.rmtree(csv_dir, ignore_errors=True)
    elif csv_dir.is_dir():
        trackml.write_detectors(modules.module_table(), csv_dir)


@dataclasses.dataclass(frozen=True)
class SplitJobs:
    """The events a dataset is built from, and the split each belongs to."""

    jobs: list[EventJob]  # in order; only events some split holds
    splits: dict  # split name -> its event ids (``split_events``)
    split_of: dict[int, str]  # event id -> split name
    inputs: list[dict]  # the TrackML files read (``input_files``), as listed before reading


def split_jobs(data: DataConfig, out: Path) -> SplitJobs:
    """The event jobs of a dataset built in ``out``, split as ``data.records`` says."""
    jobs = event_jobs(data, out / CSV_DIR)
    splits = split_events([j.event_id for j in jobs], data.records)
    split_of = {int(e): name for name, ids in splits.items() for e in ids}
    return SplitJobs(
        [j for j in jobs if j.event_id in split_of], splits, split_of, input_files(data, jobs)
    )


def fingerprint(config: Config) -> dict:
    """The data config a dataset is built from, as ``PREPARE_INFO`` stores it: the settings that
    change the dataset (not how many processes built it, nor how long ranks wait for it)."""
    data = to_mapping(config.data)
    data.pop("workers", None)
    data.pop("prepare_timeout_s", None)
    return data


# Recorded, but not what a dataset is: where it lies and where its events were read (a copied
# or moved dataset or TrackML directory is the same one; its input files are compared
# instead), and a bound that only refuses graphs.
_NOT_IDENTITY = ("dataset_dir", "trackml_dir", "graph.max_edges")


def _identity(data: dict) -> dict:
    """The flat keys of a recorded (``fingerprint``) data config that make the dataset."""
    flat, todo = {}, [("", data)]
    while todo:
        prefix, mapping = todo.pop()
        for key, value in mapping.items():
            if isinstance(value, dict):
                todo.append((f"{prefix}{key}.", value))
            else:
                flat[f"{prefix}{key}"] = value
    return {k: v for k, v in flat.items() if k not in _NOT_IDENTITY}


def input_files(data: DataConfig, jobs: list[EventJob] | None = None) -> list[dict]:
    """The TrackML files a dataset of ``data`` is read from (every file of its events, or of
    ``jobs``): name, bytes, mtime_ns and sha256 each, as ``PREPARE_INFO`` records them. None
    (an empty list) for synthetic events: their config is their input.

    Raises:
      DataError: see ``event_jobs``.
    """
    paths = _input_paths(data, jobs)
    return [{**_file_stat(p), "sha256": sha256_of_file(p)} for p in paths.values()]


def _input_paths(data: DataConfig, jobs: list[EventJob] | None = None) -> dict[str, Path]:
    """Name -> path of every file of the events a TrackML dataset reads, in name order."""
    if data.source != "trackml":
        return {}
    events = {Path(j.prefix).name + "-" for j in (jobs or event_jobs(data, Path()))}
    paths = [
        p for p in Path(data.trackml_dir).iterdir() if p.name[: p.name.find("-") + 1] in events
    ]
    return {p.name: p for p in sorted(paths)}


def _file_stat(path: Path) -> dict:
    stat = path.stat()
    return {"name": path.name, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _inputs_changed(data: DataConfig, recorded: Any) -> str | None:
    """What differs between the recorded input files and those of ``data.trackml_dir`` now (a
    file whose size and mtime are unchanged is taken as unchanged; another mtime is hashed)."""
    try:
        now = _input_paths(data)
    except (DataError, OSError) as err:
        return f"its TrackML input cannot be listed ({err})"
    if now and not isinstance(recorded, list):
        return f"its {PREPARE_INFO} records no input files (prepared by an older hvdtrack)"
    before = {f.get("name"): f for f in recorded or [] if isinstance(f, dict)}
    differ = sorted(now.keys() ^ before.keys())
    if differ:
        change = "added to" if differ[0] in now else "removed from"
        return f"TrackML file {differ[0]} was {change} {data.trackml_dir} after it was prepared"
    for name, path in now.items():
        old, stat = before[name], _file_stat(path)
        if old.get("bytes") != stat["bytes"] or (
            old.get("mtime_ns") != stat["mtime_ns"] and old.get("sha256") != sha256_of_file(path)
        ):
            return f"TrackML file {path} changed after it was prepared"
    return None


def prepared_data(dataset_dir: str | os.PathLike) -> DataConfig | None:
    """The data config a dataset was prepared from (the ``data`` of its ``PREPARE_INFO``), with
    ``dataset_dir`` the directory given (a dataset may have moved). None when it has no
    ``PREPARE_INFO``: written by ``records.write_dataset``, not by prepare.

    Raises:
      DataError: an unreadable ``PREPARE_INFO`` or one without ``data``; ConfigError: a ``data``
        that is not a valid data config (the file and key named).
    """
    path = Path(dataset_dir) / PREPARE_INFO
    if not path.exists():
        return None
    try:
        recorded = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path} is unreadable ({err}) - re-run hvdtrack prepare") from None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("data"), dict):
        raise DataError(f"{path} holds no 'data' section - re-run hvdtrack prepare")
    data = from_mapping(DataConfig, recorded["data"], where="data", source=str(path))
    return dataclasses.replace(data, dataset_dir=str(dataset_dir))


def up_to_date(config: Config) -> bool:
    """True when ``data.dataset_dir`` holds a complete dataset built from this data config."""
    return stale_reason(config) is None


def stale_reason(config: Config) -> str | None:
    """Why ``data.dataset_dir`` does not hold this data config's complete dataset (None: it does).

    A dataset is what it holds, wherever it lies: its ``PREPARE_INFO`` must record this data
    config (``_identity``: not the paths) and the TrackML files it read must be unchanged; its
    manifest must be valid and every shard it names there with its recorded size (no hashing:
    cheap), so a deleted or truncated shard means preparing again rather than failing in the
    middle of training.
    """
    target = Path(config.data.dataset_dir)
    try:
        recorded = json.loads((target / PREPARE_INFO).read_text())
        built_from = recorded["data"]
        key = _first_difference(_identity(built_from), _identity(fingerprint(config)))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return f"it has no readable {PREPARE_INFO}"
    try:
        manifest = Manifest.load(target)
    except DataError as err:
        return f"its manifest is broken: {err}"
    if key is not None:
        return f"it was built from another data config (data.{key} differs)"
    changed = _inputs_changed(config.data, recorded.get("inputs"))
    if changed:
        return changed
    try:
        check_shard_files(manifest, target)
    except DataError as err:
        return str(err)
    return None


def _first_difference(old: dict, new: dict) -> str | None:
    return next((k for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)), None)


# What prepare writes into a dataset directory besides the manifest's shards.
_OWN_FILES = {MANIFEST_NAME, PREPARE_INFO, "report.md", "report.json", CSV_DIR}


def check_replaceable(target: Path) -> None:
    """Refuses to replace anything prepare did not write: ``target`` must be absent, empty, or
    a dataset of hvdtrack's holding nothing but its own files: those its manifest names, or
    when the manifest is broken, those its ``PREPARE_INFO`` lists (checked before any work).

    Raises:
      DataError: naming what ``target`` holds; nothing was changed.
    """
    if not target.exists():
        return
    if not target.is_dir():
        _refuse(target, "a file, not a directory")
    names = {p.name for p in target.iterdir()}
    if not names:
        return
    try:
        written = {s.file for s in Manifest.load(target).shards}
    except DataError as err:
        written = _listed_files(target)
        if written is None and not (target / MANIFEST_NAME).exists():
            _refuse(
                target, f"no hvdtrack dataset (no {MANIFEST_NAME}) but {len(names)} other entries"
            )
        if written is None:
            _refuse(target, f"a broken {MANIFEST_NAME} ({err}) and no record of what prepare wrote")
    stray = sorted(names - _OWN_FILES - written)
    if stray:
        _refuse(target, f"files hvdtrack did not write ({', '.join(stray[:3])})")


def _listed_files(target: Path) -> set[str] | None:
    """The shard files ``PREPARE_INFO`` says prepare wrote into ``target`` (None: unknown)."""
    try:
        files = json.loads((target / PREPARE_INFO).read_text())["files"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return None
    if isinstance(files, list) and all(isinstance(f, str) for f in files):
        return set(files)
    return None


def _refuse(target: Path, what: str) -> None:
    raise DataError(
        f"data.dataset_dir {target} holds {what}: prepare replaces only datasets it wrote, so "
        "nothing was changed. Point data.dataset_dir at a new or empty directory, or move the "
        "files away yourself"
    )


def kept_report(config: Config, force: bool, hint: str = "") -> dict | None:
    """The stored construction report when ``data.dataset_dir`` is up to date and not ``force``d
    (said so, with ``hint``); otherwise None, once ``check_replaceable`` has passed (and the
    reason for rebuilding a dataset of this hvdtrack's was said). Either way, what a prepare
    killed outright left beside the dataset is removed first (``remove_stale_temps``).

    Raises:
      DataError: the target holds what prepare did not write.
    """
    target = Path(config.data.dataset_dir)
    remove_stale_temps(build_target(config))
    reason = stale_reason(config)
    if not force and reason is None:
        print(f"[prepare] {target} is up to date (same data config){hint}", flush=True)
        return json.loads((target / PREPARE_INFO).read_text())["report"]
    check_replaceable(target)
    if not force and (target / PREPARE_INFO).is_file():
        print(f"[prepare] rebuilding {target}: {reason}", flush=True)
    return None


def build_target(config: Config) -> Path:
    """The directory a rebuild replaces: ``data.dataset_dir``, or the directory a symbolic link
    there points at (the dataset is rebuilt in its place, the link kept)."""
    target = Path(config.data.dataset_dir)
    return target.resolve() if target.is_symlink() else target


@contextlib.contextmanager
def stopped_by_signals(target: Path) -> Iterator[None]:
    """SIGTERM (a scheduler, ``kill``) and SIGINT stop a preparation at once: raised as
    KeyboardInterrupt in the main thread, so the worker pool is stopped and the staging
    directory removed (``Staged``); a second signal during that clean-up is ignored. Without
    it SIGTERM would end the process where it stands, leaving its temporaries behind, and
    under ``hvdtrack train`` (which keeps SIGTERM for its first step) not stop it at all."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[str] = []

    def handle(signum, frame) -> None:
        if not received:
            received.append(signal.Signals(signum).name)
            raise KeyboardInterrupt(received[0])

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except KeyboardInterrupt:
        print(
            f"[prepare] stopped by {received[0] if received else 'SIGINT'}: {target} was left "
            "as it was",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# A full disk or a target that cannot be written: said in one line (``disk_errors``).
_DISK_ERRORS = {
    errno.ENOSPC: "the file system is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted (an immutable file?)",
}


@contextlib.contextmanager
def disk_errors(target: Path) -> Iterator[None]:
    """Turns a full disk or an unwritable target met while building ``target`` into one
    DataError naming the path and what to do (the staging directory is removed on the way
    out, so the old dataset stays as it was)."""
    try:
        yield
    except OSError as err:
        what = _DISK_ERRORS.get(err.errno)
        if what is None:
            raise
        where = err.filename or target
        raise DataError(
            f"{where}: {what} while preparing "
            + ("the dataset" if where == target else str(target))
            + "; nothing was changed there - free space (or make it writable, or point "
            "data.dataset_dir elsewhere), then run prepare again"
        ) from None
