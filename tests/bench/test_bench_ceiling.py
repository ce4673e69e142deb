"""The ceiling bench: a rank's share of a step, and its step timed alone and once per core at
the same time in real processes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hvdtrack.bench import ceiling, workload
from hvdtrack.bench.ceiling import Ceiling, measure_ceiling, rank_share
from hvdtrack.errors import ConfigError, HvdtrackError
from hvdtrack.records.manifest import Manifest
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
        "step of 10 nodes / 20 edges (synthetic graphs), 3 rounds: alone 400.0, 500.0, 450.0 "
        "ms; 2 at once "
        "(slowest) 500.0, 500.0, 500.0 ms -> t_alone/t_together 0.800, 1.000, 0.900; "
        "ceiling (median) 0.900"
    )
    assert Ceiling.from_json(json.loads(json.dumps(result.figures()))) == result


def test_a_ceiling_written_before_rounds_is_one_round():
    fields = dict(processes=2, nodes=10, edges=20, alone_s=0.4, together_s=[0.44, 0.5])
    result = Ceiling.from_json(fields)
    assert (result.alone_s, result.together_s, result.ceiling) == ([0.4], [[0.44, 0.5]], 0.8)
    assert result.graphs == "synthetic"  # written before --training-graphs


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


def test_mean_size_graphs_are_those_nearest_the_training_splits_mean(tiny_dataset):
    table = Manifest.load(tiny_dataset).split_table("train", str(tiny_dataset))
    distance = np.abs(table.num_edges - table.num_edges.mean())
    for graphs, count in ((1.0, 1), (1.4, 1), (2.6, 3), (0.2, 1)):
        ids, nodes, edges = workload.mean_size_graphs(str(tiny_dataset), graphs)
        assert len(ids) == count and list(ids) == sorted(ids)
        others = np.setdiff1d(np.arange(table.num_graphs), ids)
        assert distance[ids].max() <= distance[others].min()
        assert (nodes, edges) == (table.num_nodes[ids].sum(), table.num_edges[ids].sum())


def test_the_training_graph_is_those_graphs_read_and_merged(tiny_dataset):
    ids, nodes, edges = workload.mean_size_graphs(str(tiny_dataset), 2)
    graphs, labels = workload.training_graph(str(tiny_dataset), 2)
    table = Manifest.load(tiny_dataset).split_table("train", str(tiny_dataset))
    assert list(graphs.n_node.numpy()) == list(table.num_nodes[ids])
    assert list(graphs.n_edge.numpy()) == list(table.num_edges[ids])
    assert graphs.nodes.shape[0] == nodes and labels.shape[0] == edges
    assert int(labels.numpy().sum()) == table.num_true_edges[ids].sum()
    # the second graph's endpoints are offset past the first graph's nodes
    first = int(table.num_nodes[ids[0]])
    assert graphs.senders.numpy()[table.num_edges[ids[0]] :].min() >= first


@pytest.mark.slow
def test_the_ceiling_runs_on_training_graphs_in_a_real_process(tiny_dataset):
    result = measure_ceiling(
        TINY, 1, nodes=1, edges=1, repeats=2, warmup=1, rounds=1, training=(str(tiny_dataset), 1)
    )
    _, nodes, edges = workload.mean_size_graphs(str(tiny_dataset), 1)
    assert (result.graphs, result.nodes, result.edges) == ("training", nodes, edges)
    assert min(result.alone_s) > 0 and min(result.together_s[0]) > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--training-graphs", "--nodes", "10", "--edges", "20"], "takes its graphs' sizes"),
        (["--graphs", "0"], "--graphs 0.0: a number of graphs > 0"),
        (["--graphs", "nan"], "--graphs nan: a number of graphs > 0"),
    ],
)
def test_bad_graph_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        ceiling.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_more_training_graphs_than_the_split_holds_are_refused(tiny_dataset):
    table = Manifest.load(tiny_dataset).split_table("train", str(tiny_dataset))
    with pytest.raises(ConfigError, match=rf"{table.num_graphs + 1} training graphs asked for"):
        workload.mean_size_graphs(str(tiny_dataset), table.num_graphs + 1)
