"""EnergyMeter on a hand-made powercap tree (RAPL) and on the labelled estimate."""

from __future__ import annotations

import pytest

from hvdtrack.configtools import from_mapping
from hvdtrack.errors import ConfigError
from hvdtrack.runs.energy import EnergyMeter, probe_energy_sources
from hvdtrack.scaling.config import ScalingConfig


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _zone(root, name, energy_uj, max_uj=1_000_000_000, label="package-0"):
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    (zone / "name").write_text(f"{label}\n")
    return zone


def test_rapl_sums_package_zones_and_ignores_subzones(tmp_path):
    p0 = _zone(tmp_path, "intel-rapl:0", 1_000_000)
    p1 = _zone(tmp_path, "intel-rapl:1", 5_000_000, label="package-1")
    core = _zone(tmp_path, "intel-rapl:0:0", 0, label="core")
    clock = Clock()
    meter = EnergyMeter(powercap_root=str(tmp_path), clock=clock)
    meter.start()
    (p0 / "energy_uj").write_text("31000000\n")  # +30 J
    (p1 / "energy_uj").write_text("15000000\n")  # +10 J
    (core / "energy_uj").write_text("99000000\n")  # inside package-0: not counted again
    clock.now = 4.0
    reading = meter.stop()
    assert reading.source == "rapl"
    assert reading.joules == pytest.approx(40.0)
    assert reading.watts == pytest.approx(10.0)
    assert reading.detail == "RAPL package-0, package-1 (intel-rapl:0, intel-rapl:1)"


def test_rapl_counter_wrap_is_unwrapped(tmp_path):
    zone = _zone(tmp_path, "intel-rapl:0", 900_000_000, max_uj=1_000_000_000)
    meter = EnergyMeter(powercap_root=str(tmp_path), clock=Clock())
    meter.start()
    (zone / "energy_uj").write_text("50000000\n")  # wrapped: 100 J to the top + 50 J
    assert meter.sample() == pytest.approx(150.0)
    (zone / "energy_uj").write_text("10000000\n")  # wrapped again: 950 J to the top + 10 J
    assert meter.sample() == pytest.approx(1110.0)
    assert meter.stop().joules == pytest.approx(1110.0)


def test_no_powercap_falls_back_to_labelled_estimate(tmp_path):
    clock = Clock()
    meter = EnergyMeter(
        ScalingConfig(device_power_watts=5.0),
        devices=2,
        powercap_root=str(tmp_path / "none"),
        clock=clock,
    )
    meter.start()
    clock.now = 10.0
    reading = meter.stop()
    assert reading.source == "estimate"
    assert reading.joules == pytest.approx(100.0)  # 5 W x 2 devices x 10 s
    assert reading.watts == pytest.approx(10.0)
    assert "5 W x 2 cpu-core" in reading.detail and "does not exist" in reading.detail


def test_counter_lost_mid_run_keeps_measured_part_then_estimates(tmp_path):
    zone = _zone(tmp_path, "intel-rapl:0", 0)
    clock = Clock()
    meter = EnergyMeter(
        ScalingConfig(device_power_watts=3.0), powercap_root=str(tmp_path), clock=clock
    )
    meter.start()
    (zone / "energy_uj").write_text("20000000\n")
    clock.now = 2.0
    assert meter.sample() == pytest.approx(20.0)
    (zone / "energy_uj").unlink()
    clock.now = 5.0
    reading = meter.stop()  # 20 J measured + 3 W x 1 x 3 s
    assert reading.joules == pytest.approx(29.0)
    assert reading.source == "estimate" and "failed mid-run" in reading.detail


def test_forced_rapl_that_is_missing_is_a_config_error(tmp_path):
    meter = EnergyMeter(ScalingConfig(energy_source="rapl"), powercap_root=str(tmp_path / "none"))
    with pytest.raises(ConfigError, match=r"energy_source is 'rapl' but .*does not exist"):
        meter.start()


def test_bad_arguments():
    with pytest.raises(ConfigError, match="need devices >= 1 .*, got 0, 0, 1"):
        EnergyMeter(devices=0)
    with pytest.raises(ConfigError, match="0 <= local_rank < local_size, got 1, 2, 2"):
        EnergyMeter(local_rank=2, local_size=2)
    with pytest.raises(ConfigError, match="'scaling.energy_source' must be one of 'auto', 'rapl'"):
        from_mapping(ScalingConfig, {"energy_source": "wattmeter"}, "scaling", "c.yaml")


def test_config_gives_power_and_source(tmp_path):
    clock = Clock()
    config = ScalingConfig(device_power_watts=400.0, device_kind="gpu", energy_source="estimate")
    meter = EnergyMeter(config, devices=4, clock=clock)
    meter.start()
    clock.now = 0.5
    reading = meter.stop()
    assert reading.joules == pytest.approx(800.0)  # 400 W x 4 x 0.5 s
    assert reading.detail == "400 W x 4 gpu (scaling.device_power_watts)"


def test_processes_on_a_node_share_the_packages(tmp_path):
    zone = _zone(tmp_path, "intel-rapl:0", 0)
    meter = EnergyMeter(local_rank=1, local_size=4, powercap_root=str(tmp_path), clock=Clock())
    meter.start()
    (zone / "energy_uj").write_text("100000000\n")  # 100 J on the package, 4 processes
    reading = meter.stop()
    assert reading.joules == pytest.approx(25.0)
    assert reading.detail.endswith("(intel-rapl:0, 1/4 share per process)")


def test_gpus_follow_the_local_rank():
    assert EnergyMeter(devices=1, local_rank=3, local_size=4).gpu_indices == [3]
    assert EnergyMeter(devices=2, local_rank=1, local_size=2).gpu_indices == [2, 3]


def test_probe_reports_each_source(tmp_path):
    _zone(tmp_path, "intel-rapl:0", 0)
    probe = probe_energy_sources(str(tmp_path))
    assert probe["rapl"] == "available: RAPL package-0 (intel-rapl:0)"
    assert probe["nvml"].startswith(("available", "unavailable"))
