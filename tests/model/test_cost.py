"""Analytic parameter and FLOP counts, checked by hand and against built models."""

from __future__ import annotations

import dataclasses

import pytest

from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.config import ModelConfig
from hvdtrack.model.cost import (
    forward_flops,
    gradient_bytes,
    node_cost,
    num_parameters,
    num_trainable_parameters,
    train_step_flops,
)
from tests.model.conftest import TINY

# TINY with 3 node features and 2 edge features (w + b per layer):
#   node_encoder 3 -> 4: 16;  edge_encoder 2 -> 3: 9
#   edge_update [2*3 + 4*4 = 22] -> 3: 69;  node_update [2*3 + 2*4 = 14] -> 4: 60
#   edge_output 3 -> 2 -> 1: 8 + 3 = 11                                   total 165
TINY_PARAMETERS = 165


def test_parameter_count_by_hand(graphs):
    assert num_parameters(TINY, 3, 2) == TINY_PARAMETERS
    model = SegmentClassifier(TINY)
    with pytest.raises(ValueError, match="SegmentClassifier has no variables yet"):
        num_trainable_parameters(model)
    model(graphs)
    assert num_trainable_parameters(model) == TINY_PARAMETERS
    assert gradient_bytes(model) == 4 * TINY_PARAMETERS


def test_layer_norm_adds_two_scalars_per_latent_unit(graphs):
    config = dataclasses.replace(TINY, layer_norm=True)
    # + 2 * (4 + 3 + 3 + 4)
    assert num_parameters(config, 3, 2) == TINY_PARAMETERS + 28
    model = SegmentClassifier(config)
    model(graphs)
    assert num_trainable_parameters(model) == TINY_PARAMETERS + 28


def test_default_config_count_matches_the_built_model(graphs):
    config = ModelConfig(num_message_passing_steps=1)
    model = SegmentClassifier(config)
    model(graphs)
    assert num_trainable_parameters(model) == num_parameters(config, 3, 2)


def test_flop_counts_by_hand():
    # N = 5 nodes, E = 6 edges, 3 steps, head after every step. Forward, 2*m*k*n per product:
    #   node_encoder 2*5*3*4 = 120; edge_encoder 2*6*2*3 = 72 (x2 for the step: no input grad)
    #   edge_update 2*6*22*3 * 3 steps = 2376; node_update 2*5*14*4 * 3 = 1680
    #   edge_output 2*6*3*2 * 3 = 216 and 2*6*2*1 * 3 = 72                  (all x3 for the step)
    assert forward_flops(TINY, 5, 6, 3, 2) == 120 + 72 + 2376 + 1680 + 216 + 72
    assert train_step_flops(TINY, 5, 6, 3, 2) == 2 * (120 + 72) + 3 * (2376 + 1680 + 216 + 72)


def test_a_nodes_cost_in_edges_by_hand():
    # From the products above: per node 2 * 120 / 5 + 3 * 1680 / 5 = 1056, per edge
    # 2 * 72 / 6 + 3 * (2376 + 216 + 72) / 6 = 1356.
    assert node_cost(TINY, 3, 2) == pytest.approx(1056 / 1356)


def test_factorized_flops_by_hand():
    # The edge update's first layer (2376 forward) becomes: encoded edges 2*6*3*3 = 108 and
    # encoded nodes 2 * 2*5*4*3 = 240 once, current edges 108 and current nodes 240 per step.
    config = dataclasses.replace(TINY, factorized_edge_update=True)
    first_layer = 108 + 240 + 3 * (108 + 240)
    assert train_step_flops(config, 5, 6, 3, 2) == 2 * (120 + 72) + 3 * (
        first_layer + 1680 + 216 + 72
    )
    assert num_parameters(config, 3, 2) == TINY_PARAMETERS
