"""``model.keep_edge_term: auto`` settled before training and in the bench: for the dataset's
largest training batch (training) or the bench's sizes, in the memory a process has."""

from __future__ import annotations

import argparse
import json

import pytest

from hvdtrack.bench.workload import run_config
from hvdtrack.config import load_config, resolve_config_path
from hvdtrack.distributed.launch import one_keep_edge_term, resolve_model
from hvdtrack.model.cost import speed_first_bytes

RECOMPUTED = ["model.recompute=true"]  # the default config's model is factorized


def config_with_report(tmp_path, overrides=(), report=None):
    dataset = tmp_path / "data"
    dataset.mkdir(parents=True)
    if report is not None:
        (dataset / "report.json").write_text(json.dumps(report))
    extra = [f"data.dataset_dir={dataset}", *RECOMPUTED, *overrides]
    return load_config(resolve_config_path("default"), extra)


REPORT = {"all": {"nodes_max": 9, "edges_max": 99},
          "splits": {"train": {"nodes_max": 1000, "edges_max": 8000}}}  # fmt: skip


def need(config, graphs: int) -> int:
    """What auto compares with the memory, for ``graphs`` of the report's largest training graph."""
    return speed_first_bytes(config.model, 1000 * graphs, 8000 * graphs)


def test_auto_keeps_the_edge_term_when_the_largest_training_batch_fits(tmp_path, capsys):
    config = config_with_report(tmp_path, ["train.batch_graphs=2"], REPORT)
    assert config.model.keep_edge_term == "auto"
    fits = need(config, 2)
    resolved = resolve_model(config, environ={}, memory_bytes=fits)
    assert resolved.model.keep_edge_term is True and not resolved.model.memory_first
    said = capsys.readouterr().out
    assert "model.keep_edge_term auto: true (speed first)" in said
    assert (
        "largest batch (2,000 nodes, 16,000 edges) keeping it needs about 1.09 GiB, this one has 1.09 GiB"
        in said
    )
    assert resolve_model(config, environ={}, memory_bytes=fits - 1).model.keep_edge_term is False
    # two ranks on this host share its memory
    two = {"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
    assert resolve_model(config, environ=two, memory_bytes=2 * fits).model.keep_edge_term is True
    assert (
        resolve_model(config, environ=two, memory_bytes=2 * fits - 2).model.keep_edge_term is False
    )
    assert capsys.readouterr().out.count("model.keep_edge_term auto") == 1  # rank 1 says nothing


def test_mirrored_replicas_share_one_process(tmp_path):
    config = config_with_report(tmp_path, ["distributed.strategy=mirrored"], REPORT)
    two_graphs = need(config, 2)  # num_cpu_devices 2, batch_graphs 1
    assert resolve_model(config, environ={}, memory_bytes=two_graphs).model.keep_edge_term is True
    assert (
        resolve_model(config, environ={}, memory_bytes=two_graphs - 1).model.keep_edge_term is False
    )


def test_without_graph_sizes_auto_is_memory_first_and_says_why(tmp_path, capsys):
    config = config_with_report(tmp_path)
    resolved = resolve_model(config, environ={}, memory_bytes=2**40)
    assert resolved.model.keep_edge_term is False and resolved.model.memory_first
    assert "auto: false (memory first): the dataset's report.json gives no graph sizes" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize("value", [True, False])
def test_a_value_given_is_not_changed(tmp_path, value, capsys):
    config = config_with_report(tmp_path, [f"model.keep_edge_term={str(value).lower()}"], REPORT)
    assert resolve_model(config, environ={}, memory_bytes=1) is config
    assert capsys.readouterr().out == ""


def test_the_bench_resolves_for_its_largest_size_in_its_budget():
    def keep(nodes, edges, budget):
        args = argparse.Namespace(
            config=None, overrides=RECOMPUTED, threads=1, nodes=nodes, edges=edges,
            memory_budget=budget,
        )  # fmt: skip
        return run_config(args).model.keep_edge_term

    assert keep([20_000], [160_000], 4 * 2**30) is True
    assert keep([1_000, 125_000], [8_000, 1_000_000], 4 * 2**30) is False
    assert keep([125_000], [1_000_000], 24 * 2**30) is True


def test_srun_tasks_on_this_node_share_its_memory(tmp_path):
    config = config_with_report(tmp_path, [], REPORT)
    fits = need(config, 1)
    # nodes 0 and 1 run 2 tasks each, node 2 one: this is node 1 (rank 3 says nothing)
    srun = {"SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_NODEID": "1", "SLURM_PROCID": "3"}
    assert resolve_model(config, environ=srun, memory_bytes=2 * fits).model.keep_edge_term is True
    assert (
        resolve_model(config, environ=srun, memory_bytes=2 * fits - 2).model.keep_edge_term is False
    )
    alone = {**srun, "SLURM_NODEID": "2"}
    assert resolve_model(config, environ=alone, memory_bytes=fits).model.keep_edge_term is True


def test_a_resumed_run_keeps_what_it_was_trained_with(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"config": {"model": {"keep_edge_term": False}}}))
    config = config_with_report(tmp_path, [f"train.run_dir={run_dir}"], REPORT)
    assert config.train.resume
    assert resolve_model(config, environ={}, memory_bytes=2**40).model.keep_edge_term is False
    assert "auto: false, as the resumed run had it" in capsys.readouterr().out
    # not resuming: chosen afresh
    fresh = config_with_report(
        tmp_path / "b", [f"train.run_dir={run_dir}", "train.resume=false"], REPORT
    )
    assert resolve_model(fresh, environ={}, memory_bytes=2**40).model.keep_edge_term is True


def test_runs_compared_with_each_other_take_one_value(tmp_path):
    config = config_with_report(tmp_path, [], REPORT)
    one_graph = need(config, 1)
    # (ranks on the host, graphs each): 1 x 2 graphs and 2 x 1 graph need the same per rank
    # share only when the memory holds two ranks of one graph and one rank of two
    both = max(2 * one_graph, need(config, 2))
    assert one_keep_edge_term(config, [(1, 2), (2, 1)], both) == "model.keep_edge_term=true"
    assert one_keep_edge_term(config, [(1, 2), (2, 1)], both - 2) == "model.keep_edge_term=false"
    assert one_keep_edge_term(config, [(1, 1)], one_graph) == "model.keep_edge_term=true"
    given = config_with_report(tmp_path / "b", ["model.keep_edge_term=false"], REPORT)
    assert one_keep_edge_term(given, [(1, 1)], 2**40) is None
