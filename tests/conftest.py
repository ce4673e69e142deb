"""Test-wide settings and fixtures: quiet TensorFlow; a prepared tiny dataset and configs on it."""

import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# What `python -m hvdtrack.train` applies when it starts (hvdtrack.entry.TRAINING), for tests
# that train in this process; importing hvdtrack sets nothing.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


from pathlib import Path

import pytest

from hvdtrack.config import load_config
from hvdtrack.graphs.construction import HitGraph
from hvdtrack.prepare.local import prepare_dataset

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny") / "data"
    prepare_dataset(
        load_config(REPO / "configs/tiny.yaml", [f"data.dataset_dir={directory}"]), progress=False
    )
    return directory


@pytest.fixture
def tiny_config(tiny_dataset, tmp_path):
    def make(*overrides: str, run: str = "run"):
        return load_config(
            REPO / "configs/tiny.yaml",
            [
                f"data.dataset_dir={tiny_dataset}",
                f"train.run_dir={tmp_path / run}",
                "train.progress_bar=false",
                *overrides,
            ],
        )

    return make


@pytest.fixture(scope="session")
def tiny_run(tiny_dataset, tmp_path_factory) -> Path:
    """A run directory of the tiny config trained one epoch (4 steps) on ``tiny_dataset``: a
    model that has learnt a little, for the commands that use a trained run."""
    from hvdtrack.train.loop import train

    run_dir = tmp_path_factory.mktemp("tiny-run") / "run"
    overrides = [f"data.dataset_dir={tiny_dataset}", f"train.run_dir={run_dir}"]
    overrides += ["train.epochs=1", "train.progress_bar=false"]
    train(load_config(REPO / "configs/tiny.yaml", overrides))
    return run_dir


# ------------------------------------------------------------- random HitGraphs (records, inputs)


def random_graph(
    rng: np.random.Generator, num_nodes: int, num_edges: int, event_id: int = 1000, section: int = 0
) -> HitGraph:
    """A HitGraph with random features, valid indices and about 30% true edges."""
    return HitGraph(
        nodes=rng.normal(size=(num_nodes, 3)).astype(np.float32),
        edges=rng.normal(size=(num_edges, 4)).astype(np.float32),
        senders=rng.integers(0, num_nodes, num_edges).astype(np.int32),
        receivers=rng.integers(0, num_nodes, num_edges).astype(np.int32),
        labels=(rng.random(num_edges) < 0.3).astype(np.float32),
        hit_id=(event_id * 100_000 + np.arange(num_nodes)).astype(np.int64),
        event_id=event_id,
        section=section,
        num_true_segments=int(num_edges // 3),
    )


@pytest.fixture(scope="session")
def make_graph():
    """``make_graph(rng, num_nodes, num_edges, event_id, section) -> HitGraph``."""
    return random_graph


def assert_graphs_equal(actual: HitGraph, expected: HitGraph) -> None:
    for name in ("nodes", "edges", "senders", "receivers", "labels", "hit_id"):
        a, e = getattr(actual, name), getattr(expected, name)
        assert a.dtype == e.dtype, name
        np.testing.assert_array_equal(a, e, err_msg=name)
    for name in ("event_id", "section", "num_true_segments"):
        assert getattr(actual, name) == getattr(expected, name), name


@pytest.fixture(scope="session")
def graphs_equal():
    """``graphs_equal(actual, expected)`` asserts every HitGraph field is identical."""
    return assert_graphs_equal
