"""The step model's terms on hand-made records: fit, straggler, cycle, ceiling, validation."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pytest

from hvdtrack.errors import ConfigError, DataError
from hvdtrack.records import RecordsConfig, write_dataset
from hvdtrack.runs.runinfo import make_run_info
from hvdtrack.runs.timing import EPOCH_PARTS, EpochTiming, StepTiming, read_run, write_run
from hvdtrack.scaling import maths, report, straggler
from hvdtrack.scaling.maths import StepModel
from hvdtrack.scaling.network import NetworkModel

TEN_GB_S = NetworkModel("test", 80.0, 0.0)  # 10 GB/s, no latency
# N=1 steps (edges, seconds without exchange): 0.1 s + 1e-4 s/edge plus residuals +-0.01 s
# chosen orthogonal to [1, edges], so least squares gives a = 0.1, b = 1e-4 exactly.
EDGES = [1000, 2000, 3000, 4000]
SECONDS = [0.21, 0.29, 0.39, 0.51]
# Their straggler wait at N = 2, strong scaling (test_straggler_strong_draws_shares_of_the_batch).
STRAGGLER_2 = 9.16 / (144 * math.sqrt(2))


def write_steps(
    run_dir: Path,
    ranks_steps: Sequence[Sequence[tuple[int, float, float]]],
    *,
    distributed: Optional[dict[str, Any]] = None,
    sections: Optional[dict[str, Any]] = None,
    strategy: str = "horovod",
    gradient_bytes: int = 4_000_000,
    warmup_steps: int = 1,
    **info: Any,
) -> Path:
    """A run of len(ranks_steps) ranks, one epoch; ranks_steps[rank][k] = (edges, seconds
    without exchange, exchange seconds) of step k, warm-up steps first (edges 1, 9 s)."""
    steps, epochs = [], []
    for rank, timed in enumerate(ranks_steps):
        rows = [(1, 9.0, 0.0)] * warmup_steps + list(timed)
        for k, (edges, work, exchange) in enumerate(rows):
            times = {"data_s": 0.0, "compute_s": work, "exchange_s": exchange}
            steps.append(
                StepTiming(epoch=0, step=k, rank=rank, **times, total_s=work + exchange,
                           graphs=1, edges=edges, warmup=k < warmup_steps)
            )  # fmt: skip
        total = sum(w + x for _, w, x in rows)
        parts = {**dict.fromkeys(EPOCH_PARTS, 0.0), "compute_s": total}
        epochs.append(
            EpochTiming(epoch=0, rank=rank, time_s=total, wall_s=total, steps=len(rows),
                        graphs=len(rows), edges=sum(r[0] for r in rows), train_loss=0.5,
                        val=None, **parts)
        )  # fmt: skip
    config = {"distributed": {"strategy": strategy, **(distributed or {})}, **(sections or {})}
    n = len(ranks_steps)
    run_info = make_run_info(
        config_name="hand",
        config_hash="h",
        strategy=strategy,
        num_workers=n,
        batch_graphs=1,
        global_batch_graphs=n,
        learning_rate=0.001,
        epochs=1,
        device_kind="cpu-core",
        config=config,
        status="finished",
        gradient_bytes=gradient_bytes,
        metrics={},
        **info,
    )
    write_run(run_dir, run_info, steps, epochs)
    return run_dir


def baseline(tmp_path, exchange_s: float = 0.0, **kwargs) -> StepModel:
    rows = [(e, s, exchange_s) for e, s in zip(EDGES, SECONDS)]
    return maths.baseline_inputs(read_run(write_steps(tmp_path / "np1", [rows], **kwargs)))


def test_expected_max_is_exact_over_the_empirical_distribution():
    assert straggler.expected_max([1.0, 2.0], 1) == pytest.approx(1.5)
    # max of two draws from {1, 2}: 1 with probability 1/4, else 2.
    assert straggler.expected_max([2.0, 1.0], 2) == pytest.approx(1.75)
    # {1, 2, 3}, two draws: weights 1/9, 3/9, 5/9.
    assert straggler.expected_max([3.0, 1.0, 2.0], 2) == pytest.approx(22 / 9)
    with pytest.raises(ValueError, match="needs values and n >= 1"):
        straggler.expected_max([], 2)


def test_cycle_wait_is_half_a_cycle_per_fused_round_and_the_latest_loops_lag():
    assert maths.cycle_wait(484_356, 0.020) == pytest.approx(0.010)
    # The last of 2 ranks: 10 ms for its own loop, then the other's loop runs a quarter cycle
    # later on average (half a cycle, when the last rank's loop runs first: half the time).
    assert maths.cycle_wait(484_356, 0.020, n=2) == pytest.approx(0.015)
    assert maths.cycle_wait(484_356, 0.020, n=8) == pytest.approx(0.010 + 0.020 * 7 / 16)
    assert maths.cycle_wait(200 * 2**20, 0.001, n=4) == pytest.approx(0.001 + 0.001 * 3 / 8)
    assert maths.cycle_wait(484_356) == pytest.approx(0.0005)  # Horovod's default 1 ms
    # 200 MiB through the default 128 MiB buffer: two rounds.
    assert maths.cycle_wait(200 * 2**20, 0.001) == pytest.approx(0.001)
    assert maths.cycle_wait(200 * 2**20, 0.001, 64 * 2**20) == pytest.approx(0.002)  # four
    with pytest.raises(ValueError, match="fusion_bytes must be > 0 and n >= 1, got 0 and 1"):
        maths.cycle_wait(1, 0.001, 0)
    with pytest.raises(ValueError, match="got 134217728 and 0"):
        maths.cycle_wait(1, 0.001, n=0)


def test_fit_separates_fixed_from_per_edge_cost(tmp_path):
    model = baseline(tmp_path, 0.012, distributed={"horovod_cycle_time_ms": 20})
    assert model.fixed_s == pytest.approx(0.1)
    assert model.per_edge_s == pytest.approx(1e-4)
    assert model.residuals_s == pytest.approx((0.01, -0.01, -0.01, 0.01))
    assert model.edges == (1000, 2000, 3000, 4000)  # warm-up step left out
    assert model.step_s == pytest.approx(0.35)  # a + b * 2500
    assert model.cycle_s == pytest.approx(0.020)  # from run.json's config
    assert model.fusion_bytes == 128 * 2**20
    assert model.exchange_s == pytest.approx(0.012)  # the N=1 run's measured exchange
    assert model.notes == (
        "fusion buffer: Horovod's default 128 MiB (runs do not record HOROVOD_FUSION_THRESHOLD)",
        "straggler: the training graphs' sizes were not found (run.json records no "
        "data.dataset_dir); the ranks are taken as independent draws of the N=1 steps' edges",
    )


def test_cycle_defaults_and_other_strategies(tmp_path):
    default = baseline(tmp_path / "a")
    assert default.cycle_s == 0.001
    assert "Horovod cycle: not in run.json, Horovod's default 1 ms" in default.notes
    mirrored = baseline(tmp_path / "b", strategy="mirrored")
    assert mirrored.cycle_s == 0.0
    assert "no Horovod cycle: the runs used strategy 'mirrored'" in mirrored.notes


def test_fit_with_a_negative_fixed_cost_goes_through_the_origin(tmp_path):
    # 0.2, 0.5 s for 1000, 2000 edges: a = -0.1; through the origin b = 1.2 / 5e6 s/edge.
    run_dir = write_steps(tmp_path / "np1", [[(1000, 0.2, 0.0), (2000, 0.5, 0.0)]])
    model = maths.baseline_inputs(read_run(run_dir))
    assert (model.fixed_s, model.per_edge_s) == (0.0, pytest.approx(2.4e-4))
    assert "a negative term is noise: fitted through the origin" in model.notes[0]


def test_a_fixed_cost_the_edges_do_not_determine_is_said(tmp_path):
    # 1000-1030 edges, times 0.2 + 1e-4 e with +-0.02 s of noise: a is off by ~0.9 s, and its
    # standard error (~1 s) is far above 10% of a step.
    rows = [(1000, 0.32, 0.0), (1010, 0.28, 0.0), (1020, 0.32, 0.0), (1030, 0.28, 0.0)]
    model = maths.baseline_inputs(read_run(write_steps(tmp_path / "np1", [rows])))
    (note,) = [n for n in model.notes if "standard error" in n]
    assert "over these steps' 1,000-1,030 edges: not determined by them" in note
    assert "--fit-also" in note


def test_runs_of_two_batch_sizes_fit_the_fixed_cost_together(tmp_path):
    # Each run alone spans 30 edges with +-0.02 s of noise; together 1000-2030 edges determine
    # a = 0.2 s and b = 1e-4 s/edge (the noise averages out over the pairs).
    noise = (0.02, -0.02, 0.02, -0.02)
    small = [(e, 0.2 + 1e-4 * e + n, 0.0) for e, n in zip((1000, 1010, 1020, 1030), noise)]
    large = [(e, 0.2 + 1e-4 * e + n, 0.0) for e, n in zip((2000, 2010, 2020, 2030), noise)]
    one = read_run(write_steps(tmp_path / "a", [small]))
    two = read_run(write_steps(tmp_path / "b", [large]))
    model = maths.baseline_inputs(one, [two])
    assert model.fixed_s == pytest.approx(0.2, abs=0.01)
    assert model.per_edge_s == pytest.approx(1e-4, rel=0.02)
    assert model.edges == (1000, 1010, 1020, 1030)  # the model's own steps stay run one's
    assert model.notes[0].startswith("fixed and per-edge cost fitted on the steps of 2 single")
    assert not any("standard error" in n for n in model.notes)
    pair = read_run(write_steps(tmp_path / "np2", [small, small]))
    with pytest.raises(DataError, match=r"np2: N=2; only single-worker runs can join the fit"):
        maths.baseline_inputs(one, [pair])


def test_constant_edges_take_all_compute_as_shrinking(tmp_path):
    run_dir = write_steps(tmp_path / "np1", [[(500, 1.0, 0.0), (500, 1.2, 0.0)]])
    model = maths.baseline_inputs(read_run(run_dir))
    assert (model.fixed_s, model.per_edge_s) == (0.0, pytest.approx(1.1 / 500))
    assert model.residuals_s == pytest.approx((-0.1, 0.1))
    assert model.notes[0].startswith("the N=1 run's steps all have the same edges")


def test_straggler_strong_draws_shares_of_the_batch(tmp_path):
    model = baseline(tmp_path)
    # N=2: share e_k = 1250 + (E_k - 2500) / sqrt(2); b (e_k - 1250) = -15, -5, 5, 15 in units
    # of 0.01 / sqrt(2). Noise: the residuals' successive differences / sqrt(2) = -2, 0, 2 units,
    # times a rank's share of the step's work, 1/2: -1, 0, 1.
    # Every pair: -16, -15, -14, -6, -5, -4, 4, 5, 6, 14, 15, 16; E[max of 2] - mean, with the
    # weights (2i - 1) / 144 of the sorted twelve -> 916 units / 144.
    assert maths.straggler_wait(model, 2, "strong") == pytest.approx(STRAGGLER_2)
    assert maths.straggler_wait(model, 1, "strong") == pytest.approx(0.0)
    # Weak: the N=1 steps' own edges, b (E_k - 2500) = -0.15, -0.05, 0.05, 0.15 s, plus the noise
    # -0.02 / sqrt(2), 0, 0.02 / sqrt(2) (a rank's work is a whole step's): the sorted twelve
    # weighted as above.
    d = 0.02 / math.sqrt(2)
    weak = sorted(e + r for e in (-0.15, -0.05, 0.05, 0.15) for r in (-d, 0.0, d))
    expected = sum(x * (2 * i + 1) for i, x in enumerate(weak)) / 144
    assert maths.straggler_wait(model, 2, "weak") == pytest.approx(expected)
    assert expected == pytest.approx(0.0640713)


def test_the_planned_straggler_is_exact_without_noise():
    # two steps of 2 ranks: 1 and 3 s (the slowest 1 s over the mean), 2 and 2 s (none)
    assert straggler.planned_straggler(np.array([[1.0, 3.0], [2.0, 2.0]]), np.zeros(3)) == 0.5
    # noise +-0.5 s on equal ranks: E[max of two] = 0.25 s over the mean (a fixed-seed draw)
    equal = straggler.planned_straggler(np.full((4, 2), 2.0), np.array([-0.5, 0.5]))
    assert equal == pytest.approx(0.25, abs=0.01)


def test_the_straggler_follows_the_plans_sort_window():
    # graphs of 100 and 300 edges, 2 per N=1 step, 1 ms an edge, no noise; N=2 strong: one
    # graph per rank. Paired at random, a step of 100 and 300 edges waits 100 ms over the mean
    # in about half the steps; sorted windows pair equal graphs but at a window's middle.
    model = StepModel(0.0, 1e-3, (400.0,) * 4, (0.0,) * 4, 4_000_000,
                      graph_edges=(100.0, 300.0) * 20, graphs_per_step=2)  # fmt: skip
    as_read = maths.straggler_wait(model, 2, "strong")
    assert 0.03 < as_read < 0.07
    sorted_ = maths.straggler_wait(dataclasses.replace(model, sort_window=8), 2, "strong")
    assert sorted_ < 0.015
    # all graphs alike: nothing to wait for; and weak scaling plans 2 graphs per rank
    alike = dataclasses.replace(model, graph_edges=(200.0,) * 40)
    assert maths.straggler_wait(alike, 2, "strong") == 0.0
    assert maths.straggler_wait(alike, 4, "weak") == 0.0
    # N not dividing the global batch: no plan; the ranks drawn from the N=1 steps (all equal)
    assert maths.straggler_wait(model, 4, "strong") == pytest.approx(0.0, abs=1e-12)


def test_the_planned_ranks_get_the_window_training_gives_them():
    # 40 graphs, 2 ranks of 1 graph: 20 steps, so training sorts windows of 5 steps, not 8
    graphs = tuple(float(x) for x in range(100, 140))
    eight = straggler.planned_shares(graphs, 2, 8, 2, "strong")
    np.testing.assert_array_equal(eight, straggler.planned_shares(graphs, 2, 5, 2, "strong"))
    assert not np.array_equal(eight, straggler.planned_shares(graphs, 2, 4, 2, "strong"))
    assert straggler.planned_shares((), 2, 8, 2, "strong") is None
    assert straggler.planned_shares(graphs, 2, 8, 4, "strong") is None  # 4 ranks, 2 graphs


def test_the_training_graphs_come_from_the_runs_dataset(tmp_path, make_graph):
    rng = np.random.default_rng(0)
    graphs = {
        split: [make_graph(rng, 10, edges, event, 0) for event, edges in enumerate(sizes)]
        for split, sizes in (("train", (12, 30, 7)), ("val", (5,)))
    }
    write_dataset(graphs, tmp_path / "data", RecordsConfig(graphs_per_shard=4))
    rows = [(e, s, 0.0) for e, s in zip(EDGES, SECONDS)]
    sections = {"data": {"dataset_dir": str(tmp_path / "data")}, "train": {"sort_window": 4}}
    run = write_steps(tmp_path / "np1", [rows], sections=sections)
    model = maths.baseline_inputs(read_run(run))
    assert sorted(model.graph_edges) == [7.0, 12.0, 30.0]
    assert (model.graphs_per_step, model.sort_window) == (1, 4)
    assert "from epoch plans over the 3 training graphs" in model.notes[-1]
    # another dataset under the same name: not used
    other = write_steps(tmp_path / "c", [rows], sections=sections, dataset_digest="0" * 16)
    model = maths.baseline_inputs(read_run(other))
    assert model.graph_edges == ()
    assert "is not the dataset the run trained on" in model.notes[-1]
    # no dataset: the N=1 steps' edges, said in a note
    missing = {"data": {"dataset_dir": str(tmp_path / "gone")}}
    model = maths.baseline_inputs(read_run(write_steps(tmp_path / "b", [rows], sections=missing)))
    assert (model.graph_edges, model.sort_window) == ((), 1)
    assert "the training graphs' sizes were not found" in model.notes[-1]


def test_a_drift_all_ranks_share_makes_no_straggler():
    # Equal steps whose time drifts by 0.1 s a step: the ranks of one step drift together.
    drifting = StepModel(0.1, 1e-4, (2000,) * 4, (-0.15, -0.05, 0.05, 0.15), 4_000_000)
    assert maths.straggler_wait(drifting, 2, "weak") == pytest.approx(0.0)
    assert maths.straggler_wait(drifting, 8, "strong") == pytest.approx(0.0)
    # nor where the ranks' graphs come from epoch plans (all alike): the drift is no spread
    planned = dataclasses.replace(drifting, graph_edges=(1000.0,) * 40, graphs_per_step=2)
    assert maths.straggler_wait(planned, 2, "strong") == pytest.approx(0.0)
    # The same steps in another order: the noise from step to step is real.
    jumping = dataclasses.replace(drifting, residuals_s=(-0.15, 0.15, -0.05, 0.05))
    assert maths.straggler_wait(jumping, 2, "weak") > 0.05
    # One step: no step-to-step spread to draw from.
    one = StepModel(0.1, 1e-4, (2000,), (0.0,), 4_000_000)
    assert maths.straggler_wait(one, 2, "weak") == 0.0


def test_prediction_terms_literal(tmp_path):
    model = baseline(tmp_path, distributed={"horovod_cycle_time_ms": 20})
    one, two = maths.predict_scaling(model, TEN_GB_S, "strong", ns=(1, 2))
    # One rank: a + b mean(E) and its measured exchange (none in these records: one rank's
    # exchange is the identity); no straggler, no allreduce.
    assert (one.step_s, one.cycle_s, one.straggler_s, one.allreduce_s, one.efficiency) == (
        pytest.approx(0.35),
        pytest.approx(0.0),
        0.0,
        0.0,
        pytest.approx(1.0),
    )
    assert two.compute_s == pytest.approx(0.125)  # 1e-4 s/edge x 2500 / 2
    assert two.fixed_s == pytest.approx(0.1)
    assert two.straggler_s == pytest.approx(STRAGGLER_2)
    assert two.cycle_s == pytest.approx(0.015)  # half a 20 ms cycle and the other loop's lag
    assert two.allreduce_s == pytest.approx(4e-4)  # 4 MB at 10 GB/s
    step = 0.125 + 0.1 + STRAGGLER_2 + 0.015 + 4e-4
    assert two.step_s == pytest.approx(step)
    assert two.efficiency == pytest.approx(0.35 / (2 * step))
    # Ranks that share a host at ceiling 0.8: compute, fixed and straggler 1.25 times longer.
    (slow,) = maths.predict_scaling(model, TEN_GB_S, "strong", ns=(2,), ceiling=0.8)
    assert slow.compute_s == pytest.approx(0.125 / 0.8)
    assert slow.straggler_s == pytest.approx(STRAGGLER_2 / 0.8)
    assert (slow.cycle_s, slow.allreduce_s) == (two.cycle_s, two.allreduce_s)
    (weak,) = maths.predict_scaling(model, TEN_GB_S, "weak", ns=(2,))
    assert weak.compute_s == pytest.approx(0.25) and weak.fixed_s == pytest.approx(0.1)
    # An N=1 run that measured an exchange (one from before the one-rank shortcut went through
    # Horovod's loop): the model's N=1 step holds it, the N=2 step its cycle wait all the same.
    for measured in (0.03, 0.004):
        looped = dataclasses.replace(model, exchange_s=measured)
        one, two = maths.predict_scaling(looped, TEN_GB_S, "strong", ns=(1, 2))
        assert (one.cycle_s, two.cycle_s) == (measured, pytest.approx(0.015))
        assert one.step_s == pytest.approx(0.35 + measured)
        assert two.efficiency == pytest.approx((0.35 + measured) / (2 * step))


def test_prediction_rejects_bad_arguments(tmp_path):
    model = baseline(tmp_path)
    with pytest.raises(ValueError, match="ceiling must be > 0"):
        maths.predict_scaling(model, TEN_GB_S, "strong", ns=(2,), ceiling=0.0)
    with pytest.raises(ValueError, match="mode must be 'strong' or 'weak', got 'wide'"):
        maths.predict_scaling(model, TEN_GB_S, "wide", ns=(2,))


def test_validation_shows_each_term_and_what_was_measured(tmp_path):
    one = write_steps(
        tmp_path / "np1",
        [[(e, s, 0.0) for e, s in zip(EDGES, SECONDS)]],
        distributed={"horovod_cycle_time_ms": 20},
    )
    # N=2, two ranks on one host: rank 1 is 0.04 s slower each step, and waits less.
    rank0 = [(1250, 0.25, 0.06)] * 3
    rank1 = [(1250, 0.29, 0.02)] * 3
    two = write_steps(
        tmp_path / "np2",
        [rank0, rank1],
        distributed={"horovod_cycle_time_ms": 20},
        local_size=2,
    )
    runs = [read_run(one), read_run(two)]
    (v,) = maths.validate_against(runs, "strong", TEN_GB_S, ceilings={2: 0.8})
    assert v.measured_step_s == pytest.approx(0.31)
    assert v.measured_exchange_s == pytest.approx(0.06)
    assert v.measured_straggler_s == pytest.approx(0.02)  # 0.29 - mean(0.25, 0.29)
    assert v.measured_last_exchange_s == pytest.approx(0.02)  # rank 1's, the last to finish
    # np1's residuals 0.01, -0.01, -0.01, 0.01: changes -0.02, 0, 0.02 over sqrt(2)
    assert v.step_spread_s == pytest.approx(0.02 / math.sqrt(3))
    # t1 measured: the median N=1 step (0.29 + 0.39) / 2 = 0.34.
    assert v.measured_efficiency == pytest.approx(0.34 / 0.62)
    step = (0.125 + 0.1 + STRAGGLER_2) / 0.8 + 0.015 + 4e-4
    assert v.predicted_step_s == pytest.approx(step)
    # the model's N=1 step: 0.35 s and np1's exchange (none recorded)
    assert v.predicted_efficiency == pytest.approx(0.35 / (2 * step))
    assert v.relative_error == pytest.approx(0.35 / (2 * step) / (0.34 / 0.62) - 1)
    text = v.describe()
    assert text.startswith("N=2 (test): predicted efficiency 0.496, measured 0.548, error -9.6%")
    assert (
        "= compute 156.25 + fixed 125.00 + straggler 56.22 + cycle 15.00 + allreduce 0.40 ms"
        in (text)
    )
    assert text.endswith(
        "310.00 ms measured, of which exchange 60.00 ms (on the rank last to finish its work "
        "20.00), straggler 20.00 ms; the N=1 run's step-to-step spread 11.55 ms)"
    )
    # Without a ceiling for 2 ranks per host: as fast as alone.
    (plain,) = maths.validate_against(runs, "strong", TEN_GB_S)
    assert plain.predicted_compute_s == pytest.approx(0.125)
    assert math.isclose(plain.predicted_cycle_s, 0.015)


def test_a_run_of_another_model_cannot_join_the_fit(tmp_path):
    rows = [(e, 0.2 + 1e-4 * e, 0.0) for e in (1000, 2000, 3000)]
    runs = [write_steps(tmp_path / "np1", [rows]), write_steps(tmp_path / "np2", [rows, rows])]
    other = write_steps(tmp_path / "other", [rows])
    info = json.loads((other / "run.json").read_text())
    info["config"]["model"] = {"latent_size": 32}
    (other / "run.json").write_text(json.dumps(info))
    with pytest.raises(ConfigError, match=r"--fit-also .*other: its 'model' config differs"):
        report.build_report(runs, "weak", fit_also=[other])
    built = report.build_report(runs, "weak", fit_also=[tmp_path / "np1"])
    assert any(
        n.startswith("fixed and per-edge cost fitted on the steps of 2") for n in built.notes
    )


def test_last_rank_exchange_follows_the_rank_that_finished_last(tmp_path):
    # The rank last to finish its work changes from step to step (0, 1, 0): its exchange is
    # taken each step (0.01, 0.03, 0.04: median 0.03), not a rank's throughout (rank 0's median
    # 0.04, also the rank with the longer median work; rank 1's 0.05).
    one = write_steps(tmp_path / "np1", [[(e, s, 0.0) for e, s in zip(EDGES, SECONDS)]])
    rank0 = [(1000, 0.30, 0.01), (1000, 0.20, 0.07), (1000, 0.31, 0.04)]
    rank1 = [(1000, 0.25, 0.06), (1000, 0.24, 0.03), (1000, 0.30, 0.05)]
    two = write_steps(tmp_path / "np2", [rank0, rank1])
    (v,) = maths.validate_against([read_run(one), read_run(two)], "strong", TEN_GB_S)
    assert v.measured_last_exchange_s == pytest.approx(0.03)
    assert v.measured_exchange_s == pytest.approx(0.06)  # each step's longest: 0.06 0.07 0.05
