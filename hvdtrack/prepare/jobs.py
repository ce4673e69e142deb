"""``python -m hvdtrack.prepare [--config FILE|NAME]``: events -> hit graphs -> TFRecord shards + manifest.

Events come from the synthetic detector (written as TrackML CSV files first, so the reader path is
the one exercised) or from a TrackML directory. Events are processed in parallel; one writer in
this process shards the graphs. The dataset is built in a temporary sibling directory and moved
into place only when complete, so a failure never leaves a half-written dataset or loses the old one.
A worker process that dies (the out-of-memory killer, ``kill -9``) or an event that outlasts
``data.prepare_timeout_s`` is such a failure: an error naming the unfinished events, never a hang.
``hvdtrack train`` calls ``prepare_dataset`` itself when its dataset is missing or out of date.

Under ``mpirun -np N python -m hvdtrack.prepare ...`` (or ``srun --mpi=...``) the ranks share the
events, each with its own worker pool, and write the same dataset byte for byte as one process
(``hvdtrack.prepare.mpi``); a rank that fails or stops ends every rank with an error naming it.
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
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING

from hvdtrack.configtools import to_mapping
from hvdtrack.errors import DataError
from hvdtrack.events import synthetic, trackml
from hvdtrack.graphs.construction import build_hit_graphs_counting_lost
from hvdtrack.graphs.report import ConstructionReport
from hvdtrack.records.manifest import (
    MANIFEST_NAME,
    GraphInfo,
    Manifest,
    check_shard_files,
)
from hvdtrack.records.shards import (
    DatasetWriter,
    EncodedGraph,
    encode_graph,
    split_events,
)
from hvdtrack.utils.io import Staged, atomic_write, write_json

if TYPE_CHECKING:
    # hvdtrack.config imports the model, hence TensorFlow: the command imports it in main(),
    # after its settings are applied (hvdtrack.entry).
    from hvdtrack.config import Config, DataConfig

PREPARE_INFO = "prepare.json"
FIRST_EVENT_ID = 1000


@dataclasses.dataclass(frozen=True)
class _Job:
    """One event to turn into graphs (picklable, for worker processes)."""

    data: DataConfig
    event_id: int
    prefix: str | None  # a TrackML event to read; None: generate it into csv_dir first
    csv_dir: str


def _process_event(job: _Job) -> tuple[int, list[EncodedGraph], list[tuple[int, int]]]:
    """Reads (or generates, writes and reads back) one event and builds its encoded graphs."""
    prefix = job.prefix
    if prefix is None:
        event = synthetic.generate_event(job.data.synthetic, job.event_id, job.data.seed)
        prefix = trackml.write_event(event, job.csv_dir)
    event = trackml.read_event(prefix)
    graphs, lost = build_hit_graphs_counting_lost(event, job.data.graph)
    segments = [(g.num_true_segments, int(n)) for g, n in zip(graphs, lost)]
    return job.event_id, [encode_graph(g) for g in graphs], segments


def _event_jobs(data: DataConfig, csv_dir: Path) -> list[_Job]:
    if data.source == "synthetic":
        ids = range(FIRST_EVENT_ID, FIRST_EVENT_ID + data.num_events)
        return [_Job(data, i, None, str(csv_dir)) for i in ids]
    prefixes = trackml.find_events(data.trackml_dir)
    if data.num_events is not None:
        if len(prefixes) < data.num_events:
            raise DataError(
                f"{data.trackml_dir}: 'data.num_events' asks for {data.num_events} events but the "
                f"directory holds {len(prefixes)}"
            )
        prefixes = prefixes[: data.num_events]
    return [_Job(data, trackml.event_id_from_prefix(p), p, str(csv_dir)) for p in prefixes]


def _fingerprint(config: Config) -> dict:
    data = to_mapping(config.data)
    # How many processes built it, and how long other ranks wait for it, do not change the dataset.
    data.pop("workers", None)
    data.pop("prepare_timeout_s", None)
    return data


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
    if built_from != _fingerprint(config):
        return "it was built from another data config"
    try:
        check_shard_files(Manifest.load(target), target)
    except DataError as err:
        return str(err)
    return None


def prepare_dataset(config: Config, force: bool = False, progress: bool = True) -> dict:
    """Builds the dataset of ``config.data``; returns the construction report (per split and all).

    What ``python -m hvdtrack.prepare`` does once the config is loaded; an up-to-date dataset is
    kept (unless ``force``) and its stored report returned.

    Raises:
      DataError / ConfigError: bad input events or settings; nothing is left half-written.
    """
    data = config.data
    target = Path(data.dataset_dir)
    reason = stale_reason(config)
    if not force and reason is None:
        report = json.loads((target / PREPARE_INFO).read_text())["report"]
        print(
            f"[prepare] {target} is up to date (same data config); --force rebuilds it", flush=True
        )
        return report
    _check_replaceable(target)
    if not force and (target / PREPARE_INFO).is_file():
        print(f"[prepare] rebuilding {target}: {reason}", flush=True)
    with Staged() as staged:  # built beside the target, swapped in only when complete
        report = _build(config, staged.path(target, directory=True), progress)
        staged.commit()
    return report


def _build(config: Config, out: Path, progress: bool) -> dict:
    data = config.data
    csv_dir = out / "events"
    jobs = _event_jobs(data, csv_dir)
    splits = split_events([j.event_id for j in jobs], data.records)
    split_of = {int(e): name for name, ids in splits.items() for e in ids}
    jobs = [j for j in jobs if j.event_id in split_of]
    workers = min(data.workers or usable_cpus(), len(jobs))
    started = time.perf_counter()
    counts: dict[str, list[list[int]]] = {name: [[], [], [], [], []] for name in splits}
    bar = _bar(progress, len(jobs))
    results = _run(jobs, workers, data.prepare_timeout_s, Path(data.dataset_dir))
    with DatasetWriter(out, data.records) as writer, contextlib.closing(results):
        for event_id, encoded, segments in results:
            split = split_of[event_id]
            for graph, segment_counts in zip(encoded, segments):
                writer.add(split, graph)
                _count(counts[split], _report_row(graph.info, segment_counts))
            bar.update(1)
        bar.close()
        manifest = writer.finish()
    elapsed = time.perf_counter() - started
    return _write_report(
        config, out, len(jobs), splits, counts, elapsed, workers, 1, len(manifest.shards)
    )


def _write_report(
    config: Config,
    out: Path,
    num_events: int,
    splits: dict,
    counts: dict[str, list[list[int]]],
    elapsed: float,
    workers: int,
    ranks: int,
    num_shards: int,
) -> dict:
    """Writes report.md, report.json and prepare.json into ``out`` (csv removed unless kept)."""
    from hvdtrack.config import config_to_dict

    data = config.data
    if not data.keep_csv:
        shutil.rmtree(out / "events", ignore_errors=True)
    per_split = {name: ConstructionReport.from_counts(*c) for name, c in counts.items() if c[0]}
    total = ConstructionReport.merge(per_split.values())
    report = {
        "dataset_dir": str(Path(data.dataset_dir)),
        "source": data.source,
        "events": num_events,
        "events_per_split": {name: int(len(ids)) for name, ids in splits.items()},
        "seconds": round(elapsed, 3),
        "events_per_second": round(num_events / elapsed, 3) if elapsed > 0 else None,
        "workers": workers,
        "ranks": ranks,
        "all": total.to_dict(),
        "splits": {name: r.to_dict() for name, r in per_split.items()},
        "shards": num_shards,
    }
    markdown = _markdown(report, per_split, total, data)
    with atomic_write(out / "report.md") as f:
        f.write(markdown)
    write_json(out / "report.json", report)
    write_json(
        out / PREPARE_INFO,
        {"data": _fingerprint(config), "report": report, "config": config_to_dict(config)},
    )
    print(markdown, flush=True)
    return report


def _report_row(info: GraphInfo, segments: tuple[int, int]) -> tuple[int, ...]:
    """A graph's counts for the construction report: nodes, edges, true edges, true segments
    and the true segments no layer pair can form (``segments``: the last two)."""
    return info.num_nodes, info.num_edges, info.num_true_edges, *segments


def _count(columns: list[list[int]], row: tuple[int, ...]) -> None:
    """Appends a graph's ``_report_row`` to the report's columns."""
    for column, value in zip(columns, row):
        column.append(value)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a batch job's share, not the node's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _run(jobs: list[_Job], workers: int, deadline_s: float, target: Path):
    """Yields ``_process_event`` of every job, in job order, from ``workers`` processes.

    At most two events per worker are in flight, so finished graphs never pile up in memory.
    A worker that dies makes the pool broken (``multiprocessing.Pool`` would wait forever for
    its result) and a result not ready within ``deadline_s`` means a stuck worker: both raise
    a DataError naming the unfinished events, after the workers are stopped.
    """
    if workers <= 1:
        yield from map(_process_event, jobs)
        return
    # Workers only run numpy/pandas: forking is safe (no TensorFlow op has run in this process).
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context)
    waiting = iter(jobs)
    in_flight = collections.deque()
    try:
        for job in itertools.islice(waiting, 2 * workers):
            in_flight.append((job.event_id, pool.submit(_process_event, job)))
        while in_flight:
            try:
                result = in_flight[0][1].result(timeout=deadline_s)
            except (BrokenProcessPool, TimeoutError) as err:
                raise _worker_error(err, [e for e, _ in in_flight], deadline_s, target) from None
            in_flight.popleft()
            for job in itertools.islice(waiting, 1):
                in_flight.append((job.event_id, pool.submit(_process_event, job)))
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


# What prepare writes into a dataset directory besides the manifest's shards.
_OWN_FILES = {MANIFEST_NAME, PREPARE_INFO, "report.md", "report.json", "events"}


def _check_replaceable(target: Path) -> None:
    """Refuses to replace anything prepare did not write: ``target`` must be absent, empty, or
    a dataset of hvdtrack's holding nothing but its own files (checked before any work)."""
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


def _bar(enabled: bool, total: int):
    """A tqdm bar on a terminal; plain lines every 30 s (no carriage returns) in logs."""
    from hvdtrack.utils.console import counter

    return counter(enabled, total, label="prepare", unit="event")


def _markdown(report: dict, per_split: dict, total: ConstructionReport, data: DataConfig) -> str:
    g = data.graph
    lines = [
        f"# Dataset {report['dataset_dir']}",
        "",
        f"{report['events']} {data.source} events -> {total.num_graphs} graphs in "
        f"{report['seconds']:.1f} s ({report['events_per_second']} events/s, {report['workers']} workers"
        + (f" on {report['ranks']} MPI ranks)." if report.get("ranks", 1) > 1 else ")."),
        f"Cuts: pT > {g.pt_min} GeV, {'barrel only' if g.barrel_only else 'whole detector'}, "
        f"|dphi/dr| < {g.phi_slope_max}, |z0| < {g.z0_max} mm, "
        f"{g.n_phi_sections} x {g.n_eta_sections} sections.",
        "",
        "| split | graphs | nodes mean | nodes max | edges mean | edges max | efficiency | purity "
        "| lost segments | efficiency (all) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in [*per_split.items(), ("all", total)]:
        lines.append(
            f"| {name} | {r.num_graphs} | {r.nodes_mean:.0f} | {r.nodes_max} | {r.edges_mean:.0f} | "
            f"{r.edges_max} | {r.efficiency:.4f} | {r.purity:.4f} | {r.num_lost_segments} | "
            f"{r.efficiency_all_segments:.4f} |"
        )
    lines += [
        "",
        "efficiency = true segments kept by the cuts / true consecutive segments on adjacent "
        "layer pairs; lost segments = true consecutive segments on layers that are not an "
        "adjacency pair (a layer skipped), which no edge can hold; efficiency (all) counts them "
        "too; purity = true edges / edges.",
        "",
    ]
    return "\n".join(lines)
