"""The ring-allreduce model and its predictions, on literal numbers (the other terms of the
step model: test_prediction_model.py)."""

from __future__ import annotations

import pytest

from hvdtrack.configtools import from_mapping
from hvdtrack.errors import ConfigError, DataError
from hvdtrack.runs.timing import read_run
from hvdtrack.scaling import maths
from hvdtrack.scaling.config import ScalingConfig
from hvdtrack.scaling.network import PRESETS, NetworkModel, network_from_config, ring_allreduce_time

# 80 Gb/s = 10 GB/s; no latency unless a test adds it.
TEN_GB_S = NetworkModel("test", 80.0, 0.0)


def compute_only(step_s: float, gradient_bytes: float) -> maths.StepModel:
    """A step of ``step_s`` that all shrinks with the batch: no fixed cost, no spread, no cycle."""
    return maths.StepModel(0.0, step_s / 1000, (1000.0,), (0.0,), int(gradient_bytes), 0.0)


def test_ring_allreduce_time_literal():
    # 1 GB over 4 workers at 10 GB/s, 10 us: 2*3/4 * 0.1 s + 2*3 * 10 us = 0.15006 s.
    net = NetworkModel("test", 80.0, 10.0)
    assert ring_allreduce_time(1e9, 4, net) == pytest.approx(0.15006)
    # 2 workers: 2*1/2 * 0.1 s + 2 * 10 us.
    assert ring_allreduce_time(1e9, 2, net) == pytest.approx(0.10002)
    assert ring_allreduce_time(1e9, 1, net) == 0.0


def test_strong_and_weak_predictions_literal():
    # t_c = 1 s, 1 GB of gradients, N = 2: allreduce 0.1 s.
    (strong,) = maths.predict_scaling(compute_only(1.0, 1e9), TEN_GB_S, "strong", ns=(2,))
    assert strong.compute_s == 0.5 and strong.allreduce_s == pytest.approx(0.1)
    assert strong.efficiency == pytest.approx(1.0 / (2 * 0.6))  # 0.833
    (weak,) = maths.predict_scaling(compute_only(1.0, 1e9), TEN_GB_S, "weak", ns=(2,))
    assert weak.step_s == pytest.approx(1.1) and weak.efficiency == pytest.approx(1 / 1.1)


def test_default_worker_counts_and_falling_efficiency():
    preds = maths.predict_scaling(compute_only(0.2, 4e6), PRESETS["infiniband-hdr"], "weak")
    assert [p.n for p in preds] == [8, 16, 32, 64, 128, 256, 512, 1024]
    effs = [p.efficiency for p in preds]
    assert effs == sorted(effs, reverse=True) and 0 < effs[-1] < effs[0] < 1


def test_network_from_config_presets_and_overrides():
    assert network_from_config(ScalingConfig(interconnect="nvlink")) == PRESETS["nvlink"]
    faster = network_from_config(ScalingConfig(interconnect="ethernet-25g", bandwidth_gbps=100.0))
    assert (faster.bandwidth_gbps, faster.latency_us) == (100.0, 25.0)
    custom = network_from_config(
        ScalingConfig(interconnect="custom", bandwidth_gbps=10.0, latency_us=3.0)
    )
    assert (custom.name, custom.bandwidth_gbps, custom.latency_us) == ("custom", 10.0, 3.0)


def test_custom_network_needs_its_numbers():
    with pytest.raises(
        ConfigError, match=r"'scaling.interconnect' is 'custom': set scaling.bandwidth_gbps"
    ):
        from_mapping(ScalingConfig, {"interconnect": "custom"}, "scaling", "c.yaml")


def test_validation_against_measured_run_states_error(tmp_path, synthetic_run, base_config):
    # N=1: 1.0 s steps of constant edges (all compute shrinks), 1 GB of gradients, a 20 ms
    # cycle; N=2: 0.625 s steps (slowest rank 0.626 s). Model: compute 0.5 s, cycle 8 fused
    # rounds (1 GB / 128 MiB) x 10 ms and the other loop's lag, 5 ms; allreduce 0.1 s: 0.685 s;
    # at N=1 1.0 s and its measured exchange (none). Measured strong efficiency 1.0 / (2 *
    # 0.626) = 0.7987; model 1.0 / (2 * 0.685) = 0.7299.
    config = {**base_config, "distributed": {"strategy": "horovod", "horovod_cycle_time_ms": 20}}
    one = synthetic_run(
        tmp_path / "a",
        1,
        epoch_s=[[10.0]],
        step_s=[3.0, 3.0, 1.0, 1.0],
        batch_graphs=8,
        gradient_bytes=1_000_000_000,
        config=config,
    )
    two = synthetic_run(
        tmp_path / "b",
        2,
        epoch_s=[[6.0, 6.0]],
        step_s=[3.0, 3.0, 0.625, 0.625],
        batch_graphs=4,
        exchange_s=0.09,
        gradient_bytes=1_000_000_000,
        config=config,
    )
    (v,) = maths.validate_against([read_run(one), read_run(two)], "strong", TEN_GB_S)
    assert v.n == 2
    assert v.predicted_efficiency == pytest.approx(1.0 / 1.37)
    assert v.measured_efficiency == pytest.approx(1.0 / 1.252)
    assert v.relative_error == pytest.approx(1.252 / 1.37 - 1, rel=1e-5)  # -8.6%
    assert v.measured_exchange_s == pytest.approx(0.09)
    assert v.measured_straggler_s == pytest.approx(0.0005)  # rank 1 is 1 ms slower
    assert v.describe() == (
        "N=2 (test): predicted efficiency 0.730, measured 0.799, error -8.6% "
        "(step 685.00 ms predicted = compute 500.00 + fixed 0.00 + straggler 0.00 + cycle 85.00 "
        "+ allreduce 100.00 ms; 626.00 ms measured, of which exchange 90.00 ms (on the rank "
        "last to finish its work 90.00), straggler 0.50 ms; the N=1 run's step-to-step spread "
        "0.00 ms)"
    )


def test_baseline_falls_back_to_num_params(tmp_path, synthetic_run):
    run_dir = synthetic_run(
        tmp_path / "a", 1, epoch_s=[[10.0]], step_s=[1.0] * 4, batch_graphs=8, gradient_bytes=None
    )
    run = read_run(run_dir)
    with pytest.raises(DataError, match="neither 'gradient_bytes' nor 'num_params'"):
        maths.baseline_inputs(run)
    run.info["num_params"] = 1000
    model = maths.baseline_inputs(run)
    assert (model.step_s, model.gradient_bytes) == (pytest.approx(1.0), 4000)
    assert "gradient bytes taken as 4 x num_params (float32)" in model.notes
