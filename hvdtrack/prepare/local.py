"""``prepare_dataset``: the dataset of a data config, built by this process and its worker pool.

Events are processed in parallel (``process_events``); one writer in this process shards the
graphs. The dataset is built in a temporary sibling directory and moved into place only when
complete, so a failure (a bad event, a full disk, SIGTERM or Ctrl-C) never leaves a half-written
dataset or loses the old one; temporaries of a prepare killed outright are removed by the next.
``hvdtrack train`` calls ``prepare_dataset`` itself when its dataset is missing or out of date.

Public symbols: ``prepare_dataset``.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from hvdtrack.config import Config
from hvdtrack.prepare.jobs import (
    build_target,
    disk_errors,
    kept_report,
    split_jobs,
    stale_reason,
    stopped_by_signals,
)
from hvdtrack.prepare.pool import process_events, usable_cpus
from hvdtrack.prepare.report import add_row, empty_counts, report_row, write_report
from hvdtrack.records.shards import DatasetWriter
from hvdtrack.utils.console import counter
from hvdtrack.utils.io import Staged
from hvdtrack.utils.lock import DirectoryLock


def prepare_dataset(config: Config, force: bool = False, progress: bool = True) -> dict:
    """Builds the dataset of ``config.data``; returns the construction report (per split and all).

    What ``python -m hvdtrack.prepare`` does once the config is loaded; an up-to-date dataset is
    kept (unless ``force``) and its stored report returned.

    Raises:
      DataError / ConfigError: bad input events or settings; nothing is left half-written.
      DirectoryBusy: another process writes the dataset (``.NAME.lock`` beside it names it).
    """
    if not force and stale_reason(config) is None:  # up to date: only read, no lock needed
        return kept_report(config, force, hint="; --force rebuilds it")
    target = build_target(config)
    # One writer: the lock lives beside the dataset, not in it (a rebuild replaces the
    # directory by a rename); taken before anything is checked again, removed or written.
    lock = DirectoryLock(target.with_name(f".{target.name}.lock"), target, "data.dataset_dir")
    with disk_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    try:
        return _prepare_locked(config, target, force, progress)
    finally:
        lock.release()


def _prepare_locked(config: Config, target: Path, force: bool, progress: bool) -> dict:
    report = kept_report(config, force, hint="; --force rebuilds it")
    if report is not None:
        return report
    # Built beside the target, swapped in only when complete.
    with stopped_by_signals(target), disk_errors(target), Staged() as staged:
        report = _build(config, staged.path(target, directory=True), progress)
        staged.commit()
    return report


def _build(config: Config, out: Path, progress: bool) -> dict:
    """Builds the dataset into ``out`` (the staging directory); returns its report."""
    data = config.data
    planned = split_jobs(data, out)
    jobs = planned.jobs
    workers = min(data.workers or usable_cpus(), len(jobs))
    started = time.perf_counter()
    counts = empty_counts(planned.splits)
    bar = counter(progress, len(jobs), label="prepare", unit="event")
    results = process_events(jobs, workers, data.prepare_timeout_s, Path(data.dataset_dir))
    with DatasetWriter(out, data.records) as writer, contextlib.closing(results):
        for event_id, encoded, segments in results:
            split = planned.split_of[event_id]
            for graph, segment_counts in zip(encoded, segments):
                writer.add(split, graph)
                add_row(counts[split], report_row(graph.info, segment_counts))
            bar.update(1)
        bar.close()
        manifest = writer.finish()
    elapsed = time.perf_counter() - started
    return write_report(config, out, planned, counts, elapsed, workers, 1, manifest)
