"""Horovod ranks on CPU bind themselves to disjoint cores (``distributed.pin_cores``)."""

import json
import os

import pytest

from tests.launch import check, horovodrun

PROGRAM = """
import json, os, sys
from hvdtrack.train.config import DistributedConfig
from hvdtrack.train.distribute import HorovodWorkers
pin = sys.argv[1] == "true"
workers = HorovodWorkers(DistributedConfig(strategy="horovod", pin_cores=pin, deadline_s=None))
threads = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
print("RESULT", json.dumps({"rank": workers.rank, "threads": workers.threads,
                            "affinity": sorted(set(map(tuple, threads.values())))}), flush=True)
workers.shutdown()
"""

needs_two_cores = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to give each rank its own"
)


def _results(pin: str) -> dict:
    out = check(horovodrun(2, ["-c", PROGRAM, pin], timeout=120))
    rows = [
        json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line
    ]
    return {row["rank"]: row for row in rows}


@needs_two_cores
def test_two_ranks_run_on_disjoint_cores():
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    rows = _results("true")
    assert rows[0]["affinity"] == [cpus[:half]] and rows[1]["affinity"] == [cpus[half : 2 * half]]
    assert rows[0]["threads"] == rows[1]["threads"] == half


@needs_two_cores
def test_pinning_can_be_turned_off():
    cpus = sorted(os.sched_getaffinity(0))
    rows = _results("false")
    assert rows[0]["affinity"] == rows[1]["affinity"] == [cpus]
