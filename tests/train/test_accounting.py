"""Epoch accounting with hand-made records: waits at the exchange, the rest and its flag."""

import pytest

from hvdtrack.runs import timing
from hvdtrack.runs.timing import EPOCH_PARTS, EpochTiming, PartClock, Run, StepTiming


def step(epoch, number, rank, exchange_s):
    return StepTiming(epoch, number, rank, 0.01, 0.5, exchange_s, 0.6, 1, 100, False)


def epoch_record(rank, wall_s, **parts):
    values = dict.fromkeys(EPOCH_PARTS, 0.0) | parts
    return EpochTiming(0, rank, 1.0, wall_s, 2, 2, 200, 0.5, None, **values)


def test_wait_is_the_exchange_beyond_the_last_rank_to_arrive():
    # Step 0: rank 1 arrived last (exchange 0.02 s = the transfer); rank 0 waited 0.30 s.
    # Step 1: rank 0 arrived last; rank 1 waited 0.10 s.
    steps = [step(0, 0, 0, 0.32), step(0, 0, 1, 0.02), step(0, 1, 0, 0.03), step(0, 1, 1, 0.13)]
    waits = timing.collective_waits(steps)
    assert waits == pytest.approx({(0, 0): 0.30, (0, 1): 0.10})


def test_one_rank_never_waits():
    assert timing.collective_waits([step(2, 0, 0, 0.5), step(2, 1, 0, 0.7)]) == {(2, 0): 0.0}


def test_rest_is_what_no_part_claims_and_is_flagged_over_three_percent():
    run = Run(
        path=None,
        info={},
        steps=[step(0, 0, 0, 0.32), step(0, 0, 1, 0.02)],
        epochs=[
            epoch_record(0, 10.0, compute_s=9.0, exchange_s=0.32, validation_s=0.5),  # 0.18 s
            epoch_record(1, 10.0, compute_s=9.0, exchange_s=0.02, validation_s=0.5),  # 0.48 s
        ],
    )
    rows = timing.epoch_accounts(run)
    assert [(r["epoch"], r["rank"]) for r in rows] == [(0, 0), (0, 1)]
    assert rows[0]["rest_s"] == pytest.approx(0.18) and not rows[0]["flagged"]
    assert rows[1]["rest_s"] == pytest.approx(0.48) and rows[1]["flagged"]
    assert rows[1]["rest_fraction"] == pytest.approx(0.048)
    assert rows[0]["wait_s"] == pytest.approx(0.30) and rows[1]["wait_s"] == 0.0


def test_part_clock_books_blocks_and_added_seconds():
    clock = PartClock()
    with clock.part("validation_s"):
        pass
    clock.add("data_s", 0.25)
    clock.add("data_s", 0.5)
    assert clock.parts["data_s"] == 0.75
    assert 0 <= clock.parts["validation_s"] < clock.wall()
    with pytest.raises(KeyError):
        clock.add("lunch_s", 1.0)
