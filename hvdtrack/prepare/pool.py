"""The worker pool of preparation: events processed in parallel processes, in order.

A worker process that dies (the out-of-memory killer, ``kill -9``), is stopped, or an event that
outlasts ``data.prepare_timeout_s`` ends ``process_events`` with an error naming the unfinished
events, never a hang: the workers are killed and the pool's threads released.

Public symbols: ``usable_cpus``, ``process_events``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Iterator

from hvdtrack.errors import DataError
from hvdtrack.prepare.jobs import EventJob, EventResult, process_event


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

    def submit(count: int) -> None:
        # A worker that died since the last result breaks the pool for submit too.
        for job in itertools.islice(waiting, count):
            try:
                in_flight.append((job.event_id, pool.submit(process_event, job)))
            except BrokenProcessPool as err:
                events = [e for e, _ in in_flight] + [job.event_id]
                raise _worker_error(err, events, deadline_s, target) from None

    try:
        submit(2 * workers)
        while in_flight:
            try:
                result = in_flight[0][1].result(timeout=deadline_s)
            except (BrokenProcessPool, TimeoutError) as err:
                raise _worker_error(err, [e for e, _ in in_flight], deadline_s, target) from None
            in_flight.popleft()
            submit(1)
            yield result
    except BaseException:
        _stop(pool)
        raise
    _finish(pool, deadline_s)


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
    processes, results = list((pool._processes or {}).values()), pool._result_queue
    _kill(processes, results)
    pool.shutdown(wait=False, cancel_futures=True)


def _finish(pool: ProcessPoolExecutor, deadline_s: float) -> None:
    """Ends a pool whose events are all done: idle workers exit when told to; one that has not
    within ``deadline_s`` (stopped, stuck in exit) is killed rather than waited for."""
    processes, results = list((pool._processes or {}).values()), pool._result_queue
    pool.shutdown(wait=False)
    end = time.monotonic() + deadline_s
    for process in processes:
        process.join(max(0.0, end - time.monotonic()))
    if any(p.is_alive() for p in processes):
        _kill(processes, results)


def _kill(processes: list, results) -> None:
    """Kills ``processes`` (SIGKILL ends even a stopped one) and waits for them to end.

    A worker stopped or killed in the middle of sending a result leaves half a message in the
    result pipe: the executor's manager thread then waits for the rest forever, and so does the
    interpreter's exit, which joins that thread. With every worker dead, closing this process's
    own end of that pipe turns the wait into end-of-file, which the executor takes as a broken
    pool.
    """
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.kill()
    for process in processes:
        with contextlib.suppress(ValueError, AssertionError):
            process.join()
    with contextlib.suppress(AttributeError, OSError):
        results._writer.close()
