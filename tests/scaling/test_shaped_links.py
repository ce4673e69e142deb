"""run_scripts/shaped_links.py's ranks under a real ``horovodrun -np 2`` on this host, with the
arguments the script gives them. The script's hosts, link shaping and timings need root and
minutes; they are run by hand (docs/scaling/README.md, with the commands)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import random

import pytest
import tensorflow as tf

from tests.launch import REPO, horovodrun

SCRIPT = REPO / "run_scripts/shaped_links.py"


def _script():
    spec = importlib.util.spec_from_file_location("shaped_links", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_step_tensors_are_the_default_models_variables_sums_and_requests():
    parts = _script().step_tensors(tf)
    # 121,089 parameters: the 484,356 gradient bytes of the default runs' run.json
    # (docs/scaling/strong/scaling.json)
    assert sum(p.shape.num_elements() for p in parts[:-3]) * 4 == 484_356
    assert [p.shape.as_list() for p in parts[-3:]] == [[], [], [2]]  # loss, weight, requests
    assert all(p.dtype == tf.float32 for p in parts)


def test_the_default_gradient_bytes_need_no_run():
    assert _script().model_gradient_bytes() == 484_356


@pytest.mark.distributed
@pytest.mark.parametrize("tensors, phase", [("model", "random"), ("one", "barrier")])
def test_the_ranks_run_as_the_script_starts_them(tmp_path, tensors, phase):
    script = _script()
    args = argparse.Namespace(
        gradient_bytes=4096, warmup=1, repeats=3, cycle_ms=2.0, phase=phase, tensors=tensors
    )
    done = horovodrun(2, [str(SCRIPT), *script.worker_args(str(tmp_path), args)],
                      HOROVOD_CYCLE_TIME="2")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # random: the same pauses on both ranks, uniform within the 2 ms cycle, drawn from the
    # timed iterations' numbers (1, 2, 3); after a barrier: none
    pauses = [random.Random(i).uniform(0, 0.002) if phase == "random" else 0.0 for i in (1, 2, 3)]
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["rank"] == rank and len(out["seconds"]) == 3
        assert out["pauses"] == pauses
        assert out["tensors"] == (28 + 3 if tensors == "model" else 1)
        assert out["sum"] == 2.0  # ones from both ranks
