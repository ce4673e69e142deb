"""The ceiling bench: a rank's share of a step, and its step timed alone and once per core at
the same time in real processes."""

from __future__ import annotations

import json

import pytest

from hvdtrack.bench.ceiling import Ceiling, measure_ceiling, rank_share
from hvdtrack.errors import ConfigError, HvdtrackError
from tests.launch import REPO

TINY = str(REPO / "configs/tiny.yaml")


def test_a_ranks_share_is_mean_graphs_of_the_training_split(tmp_path):
    report = {"splits": {"train": {"nodes_mean": 100.4, "edges_mean": 250.6}}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert rank_share(tmp_path, 1.0) == (100, 251)
    assert rank_share(tmp_path, 1.5) == (151, 376)


def test_a_dataset_without_report_is_named(tmp_path):
    with pytest.raises(
        ConfigError, match=rf"{tmp_path}/report.json: no mean graph size .* prepare"
    ):
        rank_share(tmp_path, 1.0)


def test_the_ceiling_is_the_step_alone_over_the_slowest_of_the_steps_at_once():
    result = Ceiling(2, 10, 20, alone_s=0.4, together_s=[0.44, 0.5])
    assert result.ceiling == pytest.approx(0.8)
    assert result.describe() == (
        "step of 10 nodes / 20 edges: alone 400.0 ms, 2 at once 440.0, 500.0 ms "
        "-> ceiling t_alone/t_together 0.800"
    )


@pytest.mark.slow
def test_two_processes_time_the_real_step_together():
    result = measure_ceiling(TINY, 2, nodes=200, edges=800, repeats=2, warmup=1)
    assert (result.processes, result.nodes, result.edges) == (2, 200, 800)
    assert len(result.together_s) == 2 and min(result.together_s) > 0 and result.alone_s > 0


def test_a_process_that_fails_is_reported_not_waited_for():
    with pytest.raises(HvdtrackError, match=r"ceiling process 0 failed: .*model.activation"):
        measure_ceiling(TINY, 1, nodes=20, edges=40, overrides=["model.activation=nonsense"])


def test_more_processes_than_cores_are_refused():
    with pytest.raises(ConfigError, match="--processes 1000: this process may run on"):
        measure_ceiling(TINY, 1000, nodes=20, edges=40)
