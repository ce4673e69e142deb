"""The scaling maths on hand-computed numbers, the studies' own figures included."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from hvdtrack.errors import DataError
from hvdtrack.runs.timing import read_run
from hvdtrack.scaling import maths


def test_strong_scaling_of_hand_computed_table():
    # t1 = 100 s, t2 = 55 s: efficiency 100/(2*55) = 0.909.
    assert maths.efficiency("strong", 100.0, 55.0, 2) == pytest.approx(0.9090909)
    assert f"{maths.efficiency('strong', 100.0, 55.0, 2):.3f}" == "0.909"
    # t4 = 30 s: efficiency 100/120 = 0.833.
    assert maths.efficiency("strong", 100.0, 30.0, 4) == pytest.approx(0.8333333)


def test_weak_scaling_of_the_2024_study():
    # A100 DDP study: 34.36 s per epoch on 1 GPU, 47.6 s on 32 GPUs -> 0.722.
    assert maths.efficiency("weak", 34.36, 47.6, 32) == pytest.approx(0.72185, abs=1e-5)
    assert f"{maths.efficiency('weak', 34.36, 47.6, 32):.3f}" == "0.722"


def test_ideal_scaling_is_one():
    assert maths.efficiency("weak", 12.5, 12.5, 4) == 1.0
    assert maths.efficiency("strong", 64.0, 8.0, 8) == 1.0


def test_step_statistics_of_literal_list():
    stats = maths.step_statistics([1.0, 2.0, 3.0, 4.0, 10.0])
    assert stats == {
        "mean": 4.0,
        "std": pytest.approx(math.sqrt(12.5)),  # sample std: (9+4+1+0+36)/4 = 12.5
        "min": 1.0,
        "max": 10.0,
        "median": 3.0,
        "count": 5,
    }


def test_step_statistics_of_one_value_has_zero_spread():
    assert maths.step_statistics([0.25])["std"] == 0.0


def test_step_statistics_of_nothing_names_warmup():
    with pytest.raises(DataError, match="warm-up"):
        maths.step_statistics([])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: maths.efficiency("strong", 100.0, 0.0, 2), "tN must be > 0"),
        (lambda: maths.efficiency("strong", 100.0, 50.0, 0), "N must be > 0"),
        (lambda: maths.efficiency("weak", -1.0, 10.0, 1), "t1 must be > 0"),
    ],
)
def test_impossible_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_step_times_take_slowest_rank_and_drop_warmup(tmp_path, synthetic_run):
    # 2 ranks, 4 steps of 1 epoch; the first 2 steps are warm-up; rank 1 adds 1 ms.
    run = read_run(
        synthetic_run(
            tmp_path / "r", 2, epoch_s=[[9.0, 9.5]], step_s=[5.0, 3.0, 1.0, 2.0], batch_graphs=2
        )
    )
    np.testing.assert_allclose(maths.step_times(run), [1.001, 2.001])
    np.testing.assert_allclose(maths.step_times(run, "data_s"), [0.01, 0.01])
    np.testing.assert_allclose(maths.step_times(run, "exchange_s"), [0.0, 0.0])
    stats = maths.step_statistics(maths.step_times(run))
    assert stats["median"] == pytest.approx(1.501) and stats["count"] == 2


def test_a_step_warm_on_one_rank_only_is_dropped_for_all(tmp_path, synthetic_run):
    run = read_run(
        synthetic_run(
            tmp_path / "r",
            2,
            epoch_s=[[4.0, 4.0]],
            step_s=[3.0, 1.0, 2.0],
            batch_graphs=1,
            warmup_steps=1,
        )
    )
    # Rank 1 also counted step 1 as warm-up (e.g. it started later): the step is dropped.
    steps = [
        dataclasses.replace(s, warmup=True) if (s.rank, s.step) == (1, 1) else s for s in run.steps
    ]
    run = dataclasses.replace(run, steps=steps)
    np.testing.assert_allclose(maths.step_times(run), [2.001])


def test_epoch_time_is_median_of_slowest_rank_after_warmup(tmp_path, synthetic_run):
    run = read_run(
        synthetic_run(
            tmp_path / "r",
            2,
            epoch_s=[[80.0, 81.0], [54.0, 55.0], [57.0, 56.0], [50.0, 60.0]],
            step_s=[1.0] * 8,
            batch_graphs=4,
        )
    )
    np.testing.assert_allclose(maths.epoch_times(run), [81.0, 55.0, 57.0, 60.0])
    assert maths.epoch_time(run, warmup_epochs=1) == 57.0  # median of 55, 57, 60
    assert maths.epoch_time(run, warmup_epochs=0) == 58.5
    work = maths.epoch_work(run, warmup_epochs=1)
    assert work == {"graphs": 16.0, "edges": 1600.0, "steps": 2.0}  # 2 ranks x 2 steps x 4 graphs


def test_epoch_time_of_a_one_epoch_run_uses_that_epoch(tmp_path, synthetic_run):
    run = read_run(
        synthetic_run(tmp_path / "r", 1, epoch_s=[[12.0]], step_s=[1.0] * 3, batch_graphs=1)
    )
    assert maths.epoch_time(run, warmup_epochs=1) == 12.0


def test_an_epoch_resumed_mid_way_is_not_an_epoch_time():
    from hvdtrack.runs.timing import EPOCH_PARTS, EpochTiming, Run

    def record(epoch, steps, time_s):
        return EpochTiming(
            epoch, 0, time_s, time_s, steps, 1, 1, 0.5, None, **dict.fromkeys(EPOCH_PARTS, 0.0)
        )

    # Epoch 1 was stopped after 6 of 10 steps; the rerun recorded its last 4 steps only.
    epochs = [record(0, 10, 12.0), record(1, 4, 4.1), record(2, 10, 10.0), record(3, 10, 11.0)]
    run = Run(path=None, info={"steps_per_epoch": 10}, steps=[], epochs=epochs)
    np.testing.assert_allclose(maths.epoch_times(run), [12.0, 10.0, 11.0])
    assert maths.epoch_time(run) == pytest.approx(10.5)
