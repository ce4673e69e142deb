"""run_scripts/exchange_floor.py: one rank's exchange through Horovod's loop and without it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.launch import REPO, check, worker_env

SCRIPT = REPO / "run_scripts/exchange_floor.py"


def run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(command, env=worker_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flat, tensors", [(False, 28), (True, 1)])
def test_it_times_the_default_models_gradients_through_the_loop_and_without(flat, tensors):
    out = check(run("--cycle-ms", "4", "--calls", "8", *(["--flat"] if flat else [])))
    lines = out.strip().splitlines()[-3:]
    for line, name in zip(lines, ["through Horovod's loop", "without the collective"]):
        assert re.fullmatch(
            rf"{tensors} tensor\(s\), cycle 4 ms, {name}: mean [0-9.]+ ms, median [0-9.]+ ms "
            r"\(3 calls\)",
            line,
        ), line
    assert lines[-1] == "half a cycle: 2.00 ms"


@pytest.mark.parametrize("args", [["--cycle-ms", "0"], ["--cycle-ms", "5", "--calls", "5"]])
def test_a_cycle_or_call_count_it_cannot_time_is_refused(args):
    result = run(*args)
    assert result.returncode == 2
    assert "--cycle-ms must be > 0 and --calls > 5" in result.stderr
