"""``mpirun -np N python -m hvdtrack.prepare``: the ranks of an MPI job share dataset preparation.

``hvdtrack.prepare.__main__.main`` calls ``prepare_dataset_mpi`` when ``mpi_world`` finds an MPI
launcher among other ranks; the result is the dataset one process writes
(``hvdtrack.prepare.local.prepare_dataset``), byte for byte.

Rank 0 decides and lists the events; every rank builds the graphs of its share (with its own
pool of its CPUs) into a scratch file of the staging directory; rank 0 plans the shards exactly
as one process would (``plan_shards`` over the graphs in job order) and hands whole shards to
ranks, which copy their records out of the scratch files; rank 0 writes the manifest and swaps
the directory in. The staging directory must be on a file system every rank sees (as the
dataset must be for training anyway).

Public symbols: ``mpi_world``, ``prepare_dataset_mpi``, ``Late``, ``LAUNCHER_VARIABLES``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
import traceback
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping

from hvdtrack.config import Config
from hvdtrack.errors import ConfigError, DataError, HvdtrackError
from hvdtrack.prepare.jobs import (
    EventJob,
    SplitJobs,
    build_target,
    disk_errors,
    kept_report,
    split_jobs,
    stopped_by_signals,
)
from hvdtrack.prepare.pool import process_events, usable_cpus
from hvdtrack.prepare.report import Counts, add_row, empty_counts, report_row, write_report
from hvdtrack.records.manifest import GraphInfo, Manifest, ShardInfo
from hvdtrack.records.shards import plan_shards, write_shard_file
from hvdtrack.utils.console import counter
from hvdtrack.utils.io import Staged

# Variables by which MPI launchers announce a rank: Open MPI's mpirun, Hydra (MPICH, Intel
# MPI) and srun --mpi=pmi2, PMIx (srun --mpi=pmix).
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def mpi_world(environ: Mapping[str, str] = os.environ):
    """mpi4py's COMM_WORLD when an MPI launcher started this process among others; else None.

    The launcher's variables are its announcement (no config can say how the process was
    started): without them mpi4py is not imported and MPI never initialised, so a plain
    ``python -m hvdtrack.prepare`` works without MPI or mpi4py.

    Raises:
      ConfigError: launched by MPI but mpi4py cannot be imported.
    """
    launcher = [name for name in LAUNCHER_VARIABLES if name in environ]
    if not launcher:
        return None
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise ConfigError(
            f"started by an MPI launcher ({launcher[0]} is set) but mpi4py cannot be imported "
            f"({err}): install mpi4py, or run python -m hvdtrack.prepare without mpirun"
        ) from None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


class _Ranks:
    """One step at a time: every rank reports its outcome to rank 0, which answers each rank.

    Point-to-point messages polled against a clock, not collectives (which wait forever): a
    rank that is stopped, or stuck outside an event, is named when the deadline passes. A rank
    whose work raised is reported too: rank 0 then tells every rank to stop, naming it, and
    every rank raises (so all exit non-zero).
    """

    def __init__(self, comm, target: Path) -> None:
        self.comm, self.target = comm, target
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def step(self, tag: int, work: Callable[[], Any], answer: Callable, deadline_s: float):
        """Runs ``work()`` on this rank; rank 0 calls ``answer(results by rank)`` -> one reply
        per rank. Returns this rank's reply.

        Raises:
          DataError: some rank's work (or rank 0's answer) failed; the message names it.
          Late: a rank sent nothing within ``deadline_s`` (rank 0 answers within twice it).
        """
        outcome = _outcome(work, self.target)
        if self.rank != 0:
            sent = self.comm.isend(outcome, dest=0, tag=tag)
            ok, reply = self._receive(0, tag, 2 * deadline_s)
            sent.wait()  # rank 0 answered, so it has received ours
            if not ok:
                raise DataError(self._stop_message(reply))
            return reply
        outcomes = [outcome] + [self._receive(r, tag, deadline_s) for r in range(1, self.size)]
        failed = [(r, message) for r, (ok, message) in enumerate(outcomes) if not ok]
        replies = [None] * self.size
        if not failed:
            ok, replies = _outcome(lambda: answer([result for _, result in outcomes]), self.target)
            if not ok:
                failed = [(0, replies)]
        for r in range(1, self.size):
            self._send((False, failed) if failed else (True, replies[r]), r, tag, deadline_s)
        if failed:
            raise DataError(self._stop_message(failed))
        return replies[0]

    def _receive(self, source: int, tag: int, deadline_s: float):
        end = time.monotonic() + deadline_s
        while not self.comm.Iprobe(source=source, tag=tag):
            if time.monotonic() > end:
                raise Late(
                    f"rank {source} of {self.size} sent nothing within {deadline_s:g} s "
                    f"(rank {self.rank} waited for it): stopped, or stuck outside an event "
                    f"- look at that rank's host; data.prepare_timeout_s sets the deadlines"
                )
            time.sleep(0.02)
        return self.comm.recv(source=source, tag=tag)

    def _send(self, message: Any, dest: int, tag: int, deadline_s: float) -> None:
        request = self.comm.isend(message, dest=dest, tag=tag)
        end = time.monotonic() + deadline_s
        while not request.Test():
            if time.monotonic() > end:
                raise Late(f"rank {dest} of {self.size} took no answer within {deadline_s:g} s")
            time.sleep(0.02)

    def _stop_message(self, failed: list[tuple[int, str]]) -> str:
        mine = [message for r, message in failed if r == self.rank]
        if self.rank == 0:
            reasons = "; ".join(f"rank {r} failed: {message}" for r, message in failed)
            return (
                f"prepare on {self.size} MPI ranks stopped, {self.target} is unchanged. {reasons}"
            )
        if mine:
            return f"rank {self.rank} of {self.size}: {mine[0]}"
        names = ", ".join(str(r) for r, _ in failed)
        return f"rank {self.rank} of {self.size} stops: rank {names} failed (rank 0 says why)"


class Late(Exception):
    """A rank did not report within its deadline: the job is aborted (MPI_Abort)."""


def _outcome(work: Callable[[], Any], target: Path) -> tuple[bool, Any]:
    """``(True, work())``, or ``(False, message)`` when it raised (picklable either way; a full
    disk said in one line, ``disk_errors``)."""
    try:
        with disk_errors(target):
            return True, work()
    except HvdtrackError as err:
        return False, str(err)
    except Late:
        raise
    except Exception as err:  # a bug: its traceback here, its message to rank 0
        traceback.print_exc()
        return False, f"{type(err).__name__}: {err}"


@dataclasses.dataclass(frozen=True)
class _Stored:
    """Where a rank's graph waits: its place in one-process order and its scratch bytes."""

    job: int  # index in the event list
    position: int  # graph index within the event
    split: str
    info: GraphInfo
    row: tuple[int, ...]  # report_row
    rank: int
    offset: int
    length: int


# A shard for one rank to write: its file name and its records as (rank, offset, length).
_Task = tuple[str, list[tuple[int, int, int]]]


def prepare_dataset_mpi(config: Config, comm, force: bool = False, progress: bool = True) -> dict:
    """``prepare_dataset`` shared by the ranks of ``comm``: the same dataset, byte for byte.

    Same events, splits, shard files (names, records and their order, hence checksums),
    manifest.json and construction report as one process; only the timings and worker counts
    in report.json/prepare.json differ. Every wait has a deadline of ``data.prepare_timeout_s``
    per event (or shard) of the busiest rank.

    Raises:
      DataError / ConfigError: on every rank, naming the rank that failed; nothing changed.
      Late: a rank missed a deadline (``main`` then aborts the job).
    """
    ranks = _Ranks(comm, Path(config.data.dataset_dir))
    timeout = config.data.prepare_timeout_s
    with stopped_by_signals(ranks.target), Staged() as staged:
        steps = _Steps(config, ranks.rank, ranks.size, staged, force, progress)
        # 1. Rank 0 keeps an up-to-date dataset, refuses a directory it did not write, or makes
        #    the staging directory and deals out the events (round robin in job order).
        reply = ranks.step(1, steps.start, steps.deal_events, timeout)
        if reply[0] == "report":
            return reply[1]
        _, out, my_jobs, split_of, share = reply
        # 2. Every rank builds its events' graphs into its scratch file; rank 0 puts them in
        #    one-process order and plans the shards as one process would.
        build = functools.partial(steps.build, out, my_jobs, split_of)
        my_tasks, most = ranks.step(2, build, steps.deal_shards, (share + 1) * timeout)
        # 3. Every rank writes whole shards from the scratch files; rank 0 writes the manifest
        #    and the report, then swaps the dataset in.
        write = functools.partial(steps.write, out, my_tasks)
        return ranks.step(3, write, steps.finish, (most + 1) * timeout)


@dataclasses.dataclass
class _Plan:
    """Rank 0's view of the build, kept between the steps."""

    out: Path  # the staging directory
    events: SplitJobs
    started: float  # time.perf_counter() at the start
    workers: int = 0  # over all ranks
    counts: Counts = dataclasses.field(default_factory=dict)
    # shard file name -> (split, index in the split, its graphs)
    shards: dict[str, tuple[str, int, tuple[GraphInfo, ...]]] = dataclasses.field(
        default_factory=dict
    )


class _Steps:
    """The work of each step on this rank, and rank 0's answers (``_Ranks.step``)."""

    def __init__(
        self, config: Config, rank: int, size: int, staged: Staged, force: bool, progress: bool
    ) -> None:
        self.config, self.data = config, config.data
        self.target = Path(config.data.dataset_dir)
        self.rank, self.size = rank, size
        self.staged, self.force, self.progress = staged, force, progress
        self.planned: _Plan | None = None  # rank 0's, once it builds

    def start(self) -> dict | None:
        """Step 1, rank 0: the stored report if up to date; else makes the staging directory
        and lists the events (None)."""
        if self.rank != 0:
            return None
        report = kept_report(self.config, self.force)
        if report is not None:
            return report
        target = build_target(self.config)
        out = self.staged.path(target, directory=True)
        events = split_jobs(self.data, out)
        self.planned = _Plan(out, events, time.perf_counter())
        print(f"[prepare] {len(events.jobs)} events on {self.size} MPI ranks", flush=True)
        return None

    def deal_events(self, results: list) -> list[tuple]:
        """Step 1, rank 0's answer: the stored report for every rank, or each rank's events."""
        if self.planned is None:  # up to date: every rank returns the stored report
            return [("report", results[0])] * self.size
        plan = self.planned
        jobs = list(enumerate(plan.events.jobs))
        share = -(-len(jobs) // self.size)
        split_of = plan.events.split_of
        return [
            ("build", plan.out, jobs[r :: self.size], split_of, share) for r in range(self.size)
        ]

    def build(
        self, out: Path, my_jobs: list[tuple[int, EventJob]], split_of: dict[int, str]
    ) -> tuple[list[_Stored], int]:
        """Step 2, every rank: its events' graphs into its scratch file; where each one is."""
        if not out.is_dir():
            raise DataError(
                f"the staging directory {out} that rank 0 made is not visible here: the "
                "dataset directory must be on a file system every rank shares"
            )
        workers = max(1, min(self.data.workers or usable_cpus(), len(my_jobs)))
        stored: list[_Stored] = []
        bar = counter(self.progress and self.rank == 0, len(my_jobs), label="prepare", unit="event")
        jobs = [job for _, job in my_jobs]
        results = process_events(jobs, workers, self.data.prepare_timeout_s, self.target)
        with open(out / _scratch_name(self.rank), "wb") as f, contextlib.closing(results):
            for (job, _), (event_id, encoded, segments) in zip(my_jobs, results):
                for position, (graph, segment_counts) in enumerate(zip(encoded, segments)):
                    stored.append(
                        _Stored(
                            job=job,
                            position=position,
                            split=split_of[event_id],
                            info=graph.info,
                            row=report_row(graph.info, segment_counts),
                            rank=self.rank,
                            offset=f.tell(),
                            length=len(graph.example),
                        )
                    )
                    f.write(graph.example)
                bar.update(1)
            bar.close()
        return stored, workers

    def deal_shards(
        self, results: list[tuple[list[_Stored], int]]
    ) -> list[tuple[list[_Task], int]]:
        """Step 2, rank 0's answer: the shards of one-process order, dealt out to the ranks
        (with the most any rank has, for the deadline)."""
        plan = self.planned
        stored = sorted(
            (s for entries, _ in results for s in entries), key=lambda s: (s.job, s.position)
        )
        plan.workers = sum(workers for _, workers in results)
        plan.counts = empty_counts(plan.events.splits)
        tasks: list[list[_Task]] = [[] for _ in range(self.size)]
        records = self.data.records
        for split in records.split_names:
            graphs = [s for s in stored if s.split == split]
            for s in graphs:
                add_row(plan.counts[split], s.row)
            for index, (name, members) in enumerate(plan_shards(len(graphs), split, records)):
                chosen = [graphs[int(g)] for g in members]
                plan.shards[name] = (split, index, tuple(s.info for s in chosen))
                tasks[len(plan.shards) % self.size].append(
                    (name, [(s.rank, s.offset, s.length) for s in chosen])
                )
        most = max(len(t) for t in tasks)
        return [(t, most) for t in tasks]

    def write(self, out: Path, my_tasks: list[_Task]) -> list[tuple[str, str, int]]:
        """Step 3, every rank: its shards from the scratch files; (name, sha256, bytes) each."""
        written = []
        with _ScratchFiles(out) as scratch:
            for name, members in my_tasks:
                sha256, num_bytes = write_shard_file(
                    out / name, scratch.examples(members), self.data.records.compression
                )
                written.append((name, sha256, num_bytes))
        return written

    def finish(self, results: list[list[tuple[str, str, int]]]) -> list[dict]:
        """Step 3, rank 0's answer: the manifest and the report written, the dataset swapped
        in; the report for every rank."""
        plan = self.planned
        infos = []
        for name, sha256, num_bytes in (w for written in results for w in written):
            split, index, graphs = plan.shards[name]
            infos.append(ShardInfo(name, split, index, len(graphs), sha256, num_bytes, graphs))
        records = self.data.records
        manifest = Manifest.from_shards(
            infos,
            records.compression,
            graphs_per_shard=records.graphs_per_shard,
            seed=records.seed,
            splits=records.split_names,
        )
        for r in range(self.size):
            (plan.out / _scratch_name(r)).unlink(missing_ok=True)
        manifest.write(plan.out)
        elapsed = time.perf_counter() - plan.started
        report = write_report(
            self.config,
            plan.out,
            plan.events,
            plan.counts,
            elapsed,
            plan.workers,
            self.size,
            manifest,
        )
        self.staged.commit()
        return [report] * self.size


class _ScratchFiles:
    """The ranks' scratch files in ``out``, each opened when first read, closed on exit."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._files: dict[int, IO[bytes]] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _ScratchFiles:
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def examples(self, members: list[tuple[int, int, int]]) -> Iterator[bytes]:
        """The records at (rank, offset, length), in order."""
        for source, offset, length in members:
            if source not in self._files:
                path = self.out / _scratch_name(source)
                self._files[source] = self._stack.enter_context(open(path, "rb"))
            self._files[source].seek(offset)
            yield self._files[source].read(length)


def _scratch_name(rank: int) -> str:
    return f".graphs-rank{rank:05d}"
