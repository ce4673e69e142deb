"""Horovod ranks and MultiWorker workers on CPU bind themselves to disjoint cores
(``distributed.pin_cores``)."""

import json
import os
import subprocess
import sys

import pytest

from tests.launch import check, free_ports, horovodrun

PROGRAM = """
import json, os, sys
from hvdtrack.distributed.config import DistributedConfig
from hvdtrack.distributed.workers import HorovodWorkers
pin = sys.argv[1] == "true"
workers = HorovodWorkers(DistributedConfig(strategy="horovod", pin_cores=pin, deadline_s=None))
threads = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
print("RESULT", json.dumps({"rank": workers.rank, "threads": workers.threads,
                            "affinity": sorted(set(map(tuple, threads.values())))}), flush=True)
workers.shutdown()
"""

# A hang guard, not a speed goal: starting 2 ranks (TensorFlow + Horovod imports) took up to
# 40 s on a loaded 2-core machine; 300 s leaves room for one 3x slower.
HANG_S = 300

needs_two_cores = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to give each rank its own"
)


def _results(pin: str) -> dict:
    out = check(horovodrun(2, ["-c", PROGRAM, pin], timeout=HANG_S))
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


MULTIWORKER = """
import json, os
from hvdtrack.distributed.config import DistributedConfig
from hvdtrack.distributed.workers import StrategyWorkers
workers = StrategyWorkers(DistributedConfig(strategy="multiworker", deadline_s=None))
threads = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
print("RESULT", json.dumps({"rank": workers.rank, "threads": workers.threads,
                            "affinity": sorted(set(map(tuple, threads.values())))}), flush=True)
"""


@needs_two_cores
def test_two_multiworker_workers_run_on_disjoint_cores(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    workers = [f"localhost:{port}" for port in free_ports(2)]
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TF_CPP_MIN_LOG_LEVEL="3")
        out = open(tmp_path / f"worker{index}.log", "w+")
        procs.append(
            (subprocess.Popen([sys.executable, "-c", MULTIWORKER], stdout=out, env=env), out)
        )
    rows = {}
    try:
        for proc, out in procs:
            assert proc.wait(timeout=HANG_S) == 0
            out.seek(0)
            line = next(line for line in out if line.startswith("RESULT "))
            row = json.loads(line.split(" ", 1)[1])
            rows[row["rank"]] = row
    finally:
        for proc, out in procs:
            proc.kill()
            out.close()
    assert rows[0]["affinity"] == [cpus[:half]] and rows[1]["affinity"] == [cpus[half : 2 * half]]
    assert rows[0]["threads"] == rows[1]["threads"] == half
