"""Epoch accounting under real ``horovodrun -np 2``: a slow reader shows up as data wait, a slow
rank as compute on that rank and as collective wait on the other, and nothing goes unaccounted."""

import numpy as np
import pytest

from hvdtrack.runs import timing
from tests.launch import REPO, check, horovodrun

pytestmark = [pytest.mark.distributed]
PROGRAM = "tests/distributed/accounting_program.py"
CONFIG = str(REPO / "configs/tiny.yaml")
DELAY = 0.5


def _accounts(tmp_path, tiny_dataset, slow):
    run_dir = tmp_path / "run"
    check(horovodrun(2, [PROGRAM, CONFIG, str(tiny_dataset), str(run_dir), slow, str(DELAY)]))
    run = timing.read_run(run_dir)
    rows = {(r["epoch"], r["rank"]): r for r in timing.epoch_accounts(run)}
    assert sorted(rows) == [(e, r) for e in range(3) for r in range(2)]
    return run, rows


def _every_second_accounted(rows):
    # The parts are timed around blocks that cover the loop; what escapes them is Python
    # between blocks: 0.0-0.3% of the time here, under 1% on a machine 3x slower (only the
    # slept delay does not grow with it), within the code's own limit (REST_LIMIT, 3%).
    for row in rows.values():
        assert not row["flagged"], row
        assert 0 < row["time_s"] <= row["wall_s"]
        steps = row["data_s"] + row["compute_s"] + row["exchange_s"] + row["pipeline_s"]
        assert row["time_s"] == pytest.approx(steps, rel=timing.REST_LIMIT), row
        assert row["exchange_s"] >= row["wait_s"]


def _per_step(run, rank, key):
    """``key`` of every step of ``rank``; ``wait_s``: its exchange beyond the step's fastest."""
    steps = {(s.epoch, s.step, s.rank): s for s in run.steps}
    if key != "wait_s":
        return [getattr(s, key) for (_, _, r), s in sorted(steps.items()) if r == rank]
    return [
        s.exchange_s - min(steps[(e, n, r)].exchange_s for r in range(2))
        for (e, n, r), s in sorted(steps.items())
        if r == rank
    ]


# Extended, to keep the default run under CI's 45 minutes: the rank that waits is accounted the
# same way for a slow part of either kind, but only this variant checks, end to end, that a
# slow input pipeline lands in data_s (its own timer, around the next batch).
@pytest.mark.parametrize("slow", [pytest.param("data", marks=pytest.mark.extended), "compute"])
def test_slow_rank_is_accounted_where_it_waits(slow, tiny_dataset, tmp_path):
    run, rows = _accounts(tmp_path, tiny_dataset, slow)
    _every_second_accounted(rows)
    part = f"{slow}_s"
    # The delay is slept inside rank 1's part of every step: there on any machine.
    assert all(seconds >= DELAY for seconds in _per_step(run, 1, part)), run.steps
    for epoch in range(3):
        assert rows[(epoch, 1)][part] >= DELAY * run.info["steps_per_epoch"]
    # Rank 0 has no delay in that part, and waits for rank 1 at the exchange instead: in
    # the typical (median) step, its own part stays under half the delay and its wait over
    # half (its per-step work, summaries included, is some 0.05 s here: half the delay, 0.25
    # s, leaves room for a machine 3x slower; a scheduling hiccup moves one step, not the
    # median). Rank 1, the last to arrive, waits for no one.
    assert np.median(_per_step(run, 0, part)) < DELAY / 2, run.steps
    assert np.median(_per_step(run, 0, "wait_s")) > DELAY / 2, run.steps
    assert np.median(_per_step(run, 1, "wait_s")) < DELAY / 2, run.steps
