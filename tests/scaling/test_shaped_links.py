"""run_scripts/shaped_links.py's ranks under a real ``horovodrun -np 2`` on this host. The
script's hosts, link shaping and timings need root and minutes; they are run by hand
(docs/scaling/README.md, with the commands)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import tensorflow as tf

from tests.launch import REPO, horovodrun

SCRIPT = REPO / "run_scripts/shaped_links.py"


def _script():
    spec = importlib.util.spec_from_file_location("shaped_links", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_step_tensors_are_the_default_models_gradient_and_the_steps_scalars():
    parts = _script().step_tensors(tf)
    assert len(parts) == 28 + 3
    # 121,089 parameters (bench model prints them), 4 bytes each, and 3 float32 scalars
    assert sum(p.shape.num_elements() for p in parts) * 4 == 484_356 + 12


@pytest.mark.distributed
def test_the_ranks_time_the_steps_exchange_at_random_phases(tmp_path):
    # 1 warm-up and 3 timed grouped allreduces, each after a pause of up to 2 ms (a 2 ms cycle)
    args = [str(SCRIPT), "--worker", str(tmp_path), "4096", "1", "3", "0.002", "model"]
    done = horovodrun(2, args, HOROVOD_CYCLE_TIME="2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        timings = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert timings["rank"] == rank
        assert len(timings["seconds"]) == 3 and all(s > 0 for s in timings["seconds"])
