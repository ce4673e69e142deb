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


def test_the_ceiling_is_the_median_over_rounds_of_alone_over_the_slowest_at_once():
    result = Ceiling(
        2, 10, 20, alone_s=[0.4, 0.5, 0.45], together_s=[[0.44, 0.5], [0.5, 0.48], [0.5, 0.45]]
    )
    assert result.ratios == pytest.approx([0.8, 1.0, 0.9])
    assert result.ceiling == pytest.approx(0.9)
    assert result.describe() == (
        "step of 10 nodes / 20 edges, 3 rounds: alone 400.0, 500.0, 450.0 ms; 2 at once "
        "(slowest) 500.0, 500.0, 500.0 ms -> t_alone/t_together 0.800, 1.000, 0.900; "
        "ceiling (median) 0.900"
    )
    assert Ceiling.from_json(json.loads(json.dumps(result.figures()))) == result


def test_a_ceiling_written_before_rounds_is_one_round():
    fields = dict(processes=2, nodes=10, edges=20, alone_s=0.4, together_s=[0.44, 0.5])
    result = Ceiling.from_json(fields)
    assert (result.alone_s, result.together_s, result.ceiling) == ([0.4], [[0.44, 0.5]], 0.8)


@pytest.mark.slow
def test_two_processes_time_the_real_step_together():
    result = measure_ceiling(TINY, 2, nodes=200, edges=800, repeats=2, warmup=1, rounds=2)
    assert (result.processes, result.nodes, result.edges) == (2, 200, 800)
    assert len(result.alone_s) == 2 and min(result.alone_s) > 0
    assert [len(t) for t in result.together_s] == [2, 2]
    assert min(min(t) for t in result.together_s) > 0


def test_a_process_that_fails_is_reported_not_waited_for():
    with pytest.raises(HvdtrackError, match=r"ceiling process 0 failed: .*model.activation"):
        measure_ceiling(TINY, 1, nodes=20, edges=40, overrides=["model.activation=nonsense"])


def test_more_processes_than_cores_are_refused():
    with pytest.raises(ConfigError, match="--processes 1000: this process may run on"):
        measure_ceiling(TINY, 1000, nodes=20, edges=40)
