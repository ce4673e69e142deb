"""Tiny hand-made graph batches for the model tests."""

from __future__ import annotations

import numpy as np
import pytest
from graph_nets import utils_tf

from hvdtrack.model.config import ModelConfig
from hvdtrack.model.kernels import fused_kernels

# A small literal config: node latent 4, edge latent 3, one hidden layer of 2 in the head.
TINY = ModelConfig(
    node_encoder=(4,),
    edge_encoder=(3,),
    edge_update=(3,),
    node_update=(4,),
    output_head=(2,),
    num_message_passing_steps=3,
)


def two_graphs():
    """Two graphs batched: 4 + 3 nodes, 5 + 2 edges (node 3 of graph 0 has no edges)."""
    rng = np.random.default_rng(7)
    graph_a = dict(
        nodes=rng.standard_normal((4, 3)).astype(np.float32),
        edges=rng.standard_normal((5, 2)).astype(np.float32),
        senders=np.array([0, 0, 1, 2, 1], np.int32),
        receivers=np.array([1, 2, 2, 0, 1], np.int32),  # includes a self-loop (1 -> 1)
        globals=np.zeros(1, np.float32),
    )
    graph_b = dict(
        nodes=rng.standard_normal((3, 3)).astype(np.float32),
        edges=rng.standard_normal((2, 2)).astype(np.float32),
        senders=np.array([0, 1], np.int32),
        receivers=np.array([1, 2], np.int32),
        globals=np.zeros(1, np.float32),
    )
    return utils_tf.data_dicts_to_graphs_tuple([graph_a, graph_b])


@pytest.fixture
def graphs():
    return two_graphs()


@pytest.fixture(scope="module")
def kernels():
    """The loaded kernel library (install.sh installs g++; test_kernels.py covers a machine
    without one)."""
    library = fused_kernels()
    assert library is not None
    return library
