"""Epoch accounting under real ``horovodrun -np 2``: a slow reader shows up as data wait, a slow
rank as compute on that rank and as collective wait on the other, and nothing goes unaccounted."""

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
    steps = run.info["steps_per_epoch"]
    return rows, steps


def _every_second_accounted(rows):
    for row in rows.values():
        assert not row["flagged"], row  # the rest is under 3% of the wall time
        assert 0 < row["time_s"] <= row["wall_s"]
        steps = row["data_s"] + row["compute_s"] + row["exchange_s"] + row["pipeline_s"]
        assert row["time_s"] == pytest.approx(steps, rel=0.03), row


@pytest.mark.parametrize("slow", ["data", "compute"])
def test_slow_rank_is_accounted_where_it_waits(slow, tiny_dataset, tmp_path):
    rows, steps = _accounts(tmp_path, tiny_dataset, slow)
    _every_second_accounted(rows)
    injected = DELAY * steps

    # Over the run's 3 epochs (sums average out the host's scheduling noise):
    def total(rank, key):
        return sum(rows[(epoch, rank)][key] for epoch in range(3))

    # The delay lands in the slow rank's own part ...
    assert total(1, f"{slow}_s") - total(0, f"{slow}_s") >= 0.8 * 3 * injected, rows
    # ... and the other rank spends it waiting at the gradient exchange (at least half: rank 0
    # also writes every step's summaries (the tiny config logs each step) before its next
    # step, which shortens its wait by that much).
    assert total(0, "wait_s") - total(1, "wait_s") >= 0.5 * 3 * injected, rows
    for row in rows.values():
        assert row["exchange_s"] >= row["wait_s"]
