"""Analytic parameter and FLOP counts, checked by hand and against built models."""

from __future__ import annotations

import dataclasses

import pytest

from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.config import ModelConfig
from hvdtrack.model.cost import (
    ALLOCATOR_MARGIN,
    PROCESS_BYTES,
    forward_flops,
    gradient_bytes,
    node_cost,
    num_parameters,
    num_trainable_parameters,
    recomputed_step_bytes,
    recomputed_step_flops,
    resolve_keep_edge_term,
    speed_first_bytes,
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


def test_recomputed_flops_by_hand():
    # TINY factorized, N = 5, E = 6, 3 steps; forward products (above): encoders 120 and 72
    # (one backward product each), T 108 (shared, once in the plain step), encoded nodes 2 x 120
    # (shared), current edges 108 and nodes 2 x 120 per step, node update 560 per step, head
    # 72 + 24 per step. Recomputed: every forward product once more; a shared one in every
    # step's forward pass and in every step's backward pass with its gradients (3 + 3 x 3).
    config = dataclasses.replace(TINY, factorized_edge_update=True)
    plain = train_step_flops(config, 5, 6, 3, 2)
    assert recomputed_step_flops(config, 5, 6, 3, 2) == plain
    memory_first = dataclasses.replace(config, recompute=True)
    shared = 12 * (108 + 240)
    per_step = 4 * 3 * (108 + 240 + 560 + 72 + 24)
    assert recomputed_step_flops(memory_first, 5, 6, 3, 2) == 3 * (120 + 72) + shared + per_step
    assert recomputed_step_flops(memory_first, 5, 6, 3, 2) == 16800
    # keep_edge_term: T computed once, its gradient summed (3 products, as plain)
    kept = dataclasses.replace(memory_first, keep_edge_term=True)
    assert recomputed_step_flops(kept, 5, 6, 3, 2) == 16800 - 12 * 108 + 3 * 108
    # boundary_every = 2: steps [0, 1], [2]: step 1's forward pass again, without the head
    # (T, the encoded nodes' terms, current edges and nodes, node update)
    every = dataclasses.replace(memory_first, boundary_every=2)
    assert recomputed_step_flops(every, 5, 6, 3, 2) == 16800 + 2 * (108 + 240) + 560 == 18056


def test_speed_first_reads_the_last_edge_layer_from_its_kept_norm():
    # Edge update (5, 3) with a layer norm: products T 2*6*3*5 = 180, encoded nodes 2 x 200,
    # current edges 180 and nodes 2 x 200 per step, the last edge layer 2*6*5*3 = 180 per step.
    config = dataclasses.replace(
        TINY, edge_update=(5, 3), layer_norm=True, factorized_edge_update=True, recompute=True
    )
    rest = 3 * (120 + 72) + 12 * 400 + 12 * (180 + 400 + 560 + 72 + 24)
    assert recomputed_step_flops(config, 5, 6, 3, 2) == rest + 12 * 180 + 12 * 180 == 24528
    # kept: T as in the plain step (3 products); the last layer once more in the last step only
    kept = dataclasses.replace(config, keep_edge_term=True)
    assert recomputed_step_flops(kept, 5, 6, 3, 2) == rest + 3 * 180 + 10 * 180 == 22548
    # not with the boundaries of the first step only (nor with offload): computed again, and
    # steps 1 and 2 forward once more (encoded nodes, both edge layers, nodes, node update)
    every = dataclasses.replace(kept, boundary_every=3)
    inner = 2 * (400 + 180 + 180 + 400 + 560)
    assert recomputed_step_flops(every, 5, 6, 3, 2) == rest + 3 * 180 + 12 * 180 + inner


def test_recomputed_step_bytes_by_hand():
    # TINY factorized and recomputed, N = 5, E = 6, 3 steps with an output each, float32:
    # per edge 3 boundaries + the encoded edges [E, 3] and 3 logits: 4 * 3 * 4 + 4 * 3 = 60;
    # per node 3 boundaries + 6 [N, 4] and 5 [N, H = 3]: 4 * (4 * 9 + 5 * 3) = 204.
    memory_first = dataclasses.replace(
        TINY, factorized_edge_update=True, recompute=True, keep_edge_term=False
    )
    assert recomputed_step_bytes(memory_first, 5, 6) == 6 * 60 + 5 * 204 == 1380
    # speed first: the edge term and its gradient sum, [E, 3] each (no layer norm to read)
    kept = dataclasses.replace(memory_first, keep_edge_term=True)
    assert recomputed_step_bytes(kept, 5, 6) == 6 * (60 + 24) + 5 * 204 == 1524
    # 16-bit latents: 2 bytes each (the logits stay float32)
    half = dataclasses.replace(memory_first, precision="bfloat16")
    assert recomputed_step_bytes(half, 5, 6) == 6 * (2 * 3 * 4 + 12) + 5 * 2 * 51 == 726
    # boundary_every = 2: the boundaries of steps 0 and 2 only
    every = dataclasses.replace(memory_first, boundary_every=2)
    assert recomputed_step_bytes(every, 5, 6) == 6 * (4 * 3 * 3 + 12) + 5 * 4 * (32 + 15) == 1228
    # edge update (5, 3) with a layer norm after a ReLU: H = 5; speed first also keeps, per step
    # but the last, the rows' mean and scale, one mask byte (3 bits) and two [N, 4] node sums
    normed = dataclasses.replace(memory_first, edge_update=(5, 3), layer_norm=True)
    assert recomputed_step_bytes(normed, 5, 6) == 6 * 60 + 5 * 4 * (36 + 25) == 1580
    normed_kept = dataclasses.replace(normed, keep_edge_term=True)
    per_edge, per_node = 60 + 4 * 2 * 5 + 2 * (8 + 1), 244 + 2 * 2 * 4 * 4
    assert recomputed_step_bytes(normed_kept, 5, 6) == 6 * per_edge + 5 * per_node == 2248


def test_auto_keeps_the_edge_term_when_the_step_with_it_fits_the_memory():
    auto = dataclasses.replace(TINY, factorized_edge_update=True, recompute=True)
    assert auto.keep_edge_term == "auto"
    assert PROCESS_BYTES + ALLOCATOR_MARGIN * 1524 == PROCESS_BYTES + 1905  # speed first's, above
    assert speed_first_bytes(auto, 5, 6) == PROCESS_BYTES + 1905
    assert resolve_keep_edge_term(auto, 5, 6, PROCESS_BYTES + 1905).keep_edge_term is True
    assert resolve_keep_edge_term(auto, 5, 6, PROCESS_BYTES + 1904).keep_edge_term is False
    assert resolve_keep_edge_term(auto, 5, 6, None).keep_edge_term is False  # memory unknown
    # a model that cannot keep it: false, whatever the memory
    for cannot in (dataclasses.replace(auto, recompute=False), TINY):
        assert resolve_keep_edge_term(cannot, 5, 6, 2**40).keep_edge_term is False
    # a value given is kept as it is
    for given in (False, True):
        config = dataclasses.replace(auto, keep_edge_term=given)
        assert resolve_keep_edge_term(config, 5, 6, 2**40 if not given else 1) is config


def test_the_default_model_keeps_the_edge_term_up_to_about_half_a_million_edges_in_4_gib():
    # issue 29's budget, 8 edges a node: speed first below, memory first above
    default = ModelConfig(layer_norm=True, factorized_edge_update=True, recompute=True)
    assert resolve_keep_edge_term(default, 62_500, 500_000, 4 * 2**30).keep_edge_term is True
    assert resolve_keep_edge_term(default, 68_750, 550_000, 4 * 2**30).keep_edge_term is False
    assert resolve_keep_edge_term(default, 20_000, 160_000, 4 * 2**30).keep_edge_term is True
