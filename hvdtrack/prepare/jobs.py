"""The shared steps of preparation: event jobs, the worker pool, the replace and up-to-date checks.

``prepare_dataset`` (``hvdtrack.prepare.local``, one process) and ``prepare_dataset_mpi``
(``hvdtrack.prepare.mpi``, the ranks of an MPI job) are built from these steps, so both list the
same events, build the same graphs and refuse the same directories.

A worker process that dies (the out-of-memory killer, ``kill -9``) or an event that outlasts
``data.prepare_timeout_s`` ends ``process_events`` with an error naming the unfinished events,
never a hang.

Public symbols: ``PREPARE_INFO``, ``CSV_DIR``, ``FIRST_EVENT_ID``, ``EventJob``, ``process_event``,
``event_jobs``, ``SplitJobs``, ``split_jobs``, ``process_events``, ``usable_cpus``,
``keep_or_remove_events``, ``fingerprint``, ``prepared_data``, ``up_to_date``, ``stale_reason``,
``check_replaceable``, ``kept_report``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import multiprocessing
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Iterator

from hvdtrack.config import Config, DataConfig
from hvdtrack.configtools import from_mapping, to_mapping
from hvdtrack.errors import DataError
from hvdtrack.events import modules, synthetic, trackml
from hvdtrack.graphs.construction import build_hit_graphs_counting_lost
from hvdtrack.records.manifest import MANIFEST_NAME, Manifest, check_shard_files
from hvdtrack.records.shards import EncodedGraph, encode_graph, split_events

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


def split_jobs(data: DataConfig, out: Path) -> SplitJobs:
    """The event jobs of a dataset built in ``out``, split as ``data.records`` says."""
    jobs = event_jobs(data, out / CSV_DIR)
    splits = split_events([j.event_id for j in jobs], data.records)
    split_of = {int(e): name for name, ids in splits.items() for e in ids}
    return SplitJobs([j for j in jobs if j.event_id in split_of], splits, split_of)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a batch job's share, not the node's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def process_events(
    jobs: list[EventJob], workers: int, deadline_s: float, target: Path
) -> Iterator[EventResult]:
    """Yields ``process_event`` of every job, in job order, from ``workers`` processes.

    At most two events per worker are in flight, so finished graphs never pile up in memory.
    A worker that dies makes the pool broken (``multiprocessing.Pool`` would wait forever for
    its result) and a result not ready within ``deadline_s`` means a stuck worker: both raise
    a DataError naming the unfinished events, after the workers are stopped.
    """
    if workers <= 1:
        yield from map(process_event, jobs)
        return
    # Workers only run numpy/pandas: forking is safe (no TensorFlow op has run in this process).
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context)
    waiting = iter(jobs)
    in_flight = collections.deque()
    try:
        for job in itertools.islice(waiting, 2 * workers):
            in_flight.append((job.event_id, pool.submit(process_event, job)))
        while in_flight:
            try:
                result = in_flight[0][1].result(timeout=deadline_s)
            except (BrokenProcessPool, TimeoutError) as err:
                raise _worker_error(err, [e for e, _ in in_flight], deadline_s, target) from None
            in_flight.popleft()
            for job in itertools.islice(waiting, 1):
                in_flight.append((job.event_id, pool.submit(process_event, job)))
            yield result
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()


def _worker_error(err: Exception, events: list[int], deadline_s: float, target: Path) -> DataError:
    unfinished = ", ".join(str(e) for e in events)
    if isinstance(err, BrokenProcessPool):
        what = (
            "a preparation worker process died (killed by a signal: the out-of-memory killer, "
            "kill -9, ...)"
        )
        advice = "give it more memory or use fewer data.workers"
    else:
        what = f"no preparation worker finished an event within {deadline_s:g} s"
        advice = "look for a stuck worker, or raise data.prepare_timeout_s"
    return DataError(
        f"{what} while events {unfinished} were unfinished; nothing was written to "
        f"{target} - {advice}, then run prepare again"
    )


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stops the pool at once: queued events are dropped, running (or stuck) workers killed."""
    # The executor has no public way to kill its workers (shutdown waits for running events).
    processes = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.kill()


def fingerprint(config: Config) -> dict:
    """The data config a dataset is built from, as ``PREPARE_INFO`` stores it: the settings that
    change the dataset (not how many processes built it, nor how long ranks wait for it)."""
    data = to_mapping(config.data)
    data.pop("workers", None)
    data.pop("prepare_timeout_s", None)
    return data


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

    Besides ``prepare.json``, every shard the manifest names must be there with its recorded
    size (no hashing: cheap), so a deleted or truncated shard means preparing again rather than
    failing in the middle of training.
    """
    target = Path(config.data.dataset_dir)
    try:
        built_from = json.loads((target / PREPARE_INFO).read_text()).get("data")
    except (OSError, json.JSONDecodeError, AttributeError):
        return f"it has no readable {PREPARE_INFO}"
    if built_from != fingerprint(config):
        return "it was built from another data config"
    try:
        check_shard_files(Manifest.load(target), target)
    except DataError as err:
        return str(err)
    return None


# What prepare writes into a dataset directory besides the manifest's shards.
_OWN_FILES = {MANIFEST_NAME, PREPARE_INFO, "report.md", "report.json", CSV_DIR}


def check_replaceable(target: Path) -> None:
    """Refuses to replace anything prepare did not write: ``target`` must be absent, empty, or
    a dataset of hvdtrack's holding nothing but its own files (checked before any work).

    Raises:
      DataError: naming what ``target`` holds; nothing was changed.
    """
    if not target.exists():
        return
    what = "another program's files"
    if target.is_dir():
        names = {p.name for p in target.iterdir()}
        if not names:
            return
        try:
            manifest = Manifest.load(target)
        except DataError:
            manifest = None
        if manifest is not None:
            stray = sorted(names - _OWN_FILES - {s.file for s in manifest.shards})
            if not stray:
                return
            what = f"files hvdtrack did not write ({', '.join(stray[:3])})"
        else:
            what = f"no hvdtrack dataset (no valid {MANIFEST_NAME}) but {len(names)} other entries"
    else:
        what = "a file, not a directory"
    raise DataError(
        f"data.dataset_dir {target} holds {what}: prepare replaces only datasets it wrote, so "
        "nothing was changed. Point data.dataset_dir at a new or empty directory, or move the "
        "files away yourself"
    )


def kept_report(config: Config, force: bool, hint: str = "") -> dict | None:
    """The stored construction report when ``data.dataset_dir`` is up to date and not ``force``d
    (said so, with ``hint``); otherwise None, once ``check_replaceable`` has passed (and the
    reason for rebuilding a dataset of this hvdtrack's was said).

    Raises:
      DataError: the target holds what prepare did not write.
    """
    target = Path(config.data.dataset_dir)
    reason = stale_reason(config)
    if not force and reason is None:
        print(f"[prepare] {target} is up to date (same data config){hint}", flush=True)
        return json.loads((target / PREPARE_INFO).read_text())["report"]
    check_replaceable(target)
    if not force and (target / PREPARE_INFO).is_file():
        print(f"[prepare] rebuilding {target}: {reason}", flush=True)
    return None
