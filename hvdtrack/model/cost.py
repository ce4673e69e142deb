"""Analytic size and cost of the segment classifier: parameters, gradient bytes, matmul FLOPs.

One table (``linear_layers``) lists every linear layer of the model with its input and output
widths, whether it runs over nodes or edges, and how often per forward pass; the parameter count
and the FLOP count both derive from it, so they cannot drift apart.

FLOP convention (multiply and add counted separately): a [m, k] @ [k, n] matmul costs 2*m*k*n.
A training step costs 3x the forward matmuls (forward, gradient w.r.t. the input, gradient
w.r.t. the weights), except for the first layer of each encoder, which needs no input gradient
(2x). Only matmuls are counted: bias adds, activations, LayerNorm, concatenations, gathers,
segment sums and the optimizer update are left out (they are O(E * width), not
O(E * width^2)), so the count is a lower bound on the work done and "achieved FLOP/s" is the
matmul throughput that the step sustains.

Public symbols: ``Linear``, ``linear_layers``, ``step_matmuls``, ``num_parameters``, ``forward_flops``,
``train_step_flops``, ``recomputed_step_flops``, ``recomputed_step_bytes``,
``speed_first_bytes``, ``resolve_keep_edge_term``, ``node_cost``, ``num_trainable_parameters``, ``gradient_bytes``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal, Sequence

from hvdtrack.model.config import ModelConfig

if TYPE_CHECKING:  # TensorFlow only for built modules: the counts from a config stay cheap
    import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Linear:
    """``calls`` matmuls of [rows, fan_in] @ [fan_in, fan_out] per forward pass.

    ``input_grad`` is False when the backward pass needs no gradient w.r.t. the input (the
    first layer of an encoder reads the input features, which are not trained). ``shared``: a
    product computed once per forward pass that every message-passing step reads (the
    factorized edge update's encoded terms).
    """

    module: str
    index: int
    rows: Literal["nodes", "edges"]
    fan_in: int
    fan_out: int
    calls: int
    input_grad: bool = True
    shared: bool = False


def linear_layers(
    config: ModelConfig, num_node_features: int, num_edge_features: int
) -> list[Linear]:
    """Lists the linear layers of ``SegmentClassifier(config)`` in data-flow order.

    One entry per layer (weights [fan_in, fan_out] and bias [fan_out]), with the matmuls of the
    plain formulation (each MLP applied to its concatenated input).

    Args:
      config: the model configuration.
      num_node_features: F_n, width of the input node features.
      num_edge_features: F_e, width of the input edge features.
    """
    ln, le = config.node_latent_size, config.edge_latent_size
    steps = config.num_message_passing_steps
    head_calls = steps if config.output_every_step else 1
    blocks = [
        ("node_encoder", "nodes", num_node_features, config.node_encoder, 1),
        ("edge_encoder", "edges", num_edge_features, config.edge_encoder, 1),
        # [edge (encoded, latent), receiver node (encoded, latent), sender node (same)]
        ("edge_update", "edges", 2 * le + 4 * ln, config.edge_update, steps),
        # [received edge sum, sent edge sum, node (encoded, latent)]
        ("node_update", "nodes", 2 * le + 2 * ln, config.node_update, steps),
        ("edge_output", "edges", le, config.output_head + (1,), head_calls),
    ]
    layers = []
    for module, rows, fan_in, sizes, calls in blocks:
        for index, fan_out in enumerate(sizes):
            first_encoder_layer = index == 0 and module.endswith("_encoder")
            layers.append(
                Linear(module, index, rows, fan_in, fan_out, calls, not first_encoder_layer)
            )
            fan_in = fan_out
    return layers


def step_matmuls(
    config: ModelConfig, num_node_features: int, num_edge_features: int
) -> list[Linear]:
    """The matmuls that ``SegmentClassifier(config)`` actually runs per forward pass.

    As ``linear_layers``, except with ``config.factorized_edge_update``: the edge update's first
    layer ([E, 2 L_e + 4 L_n] @ [., H] per step) becomes [E, L_e] @ [L_e, H] and twice
    [N, L_n] @ [L_n, H] (receiver and sender) per step, plus the same three once for the
    encoded terms.
    """
    layers = linear_layers(config, num_node_features, num_edge_features)
    if not config.factorized_edge_update:
        return layers
    ln, le = config.node_latent_size, config.edge_latent_size
    width, steps = config.edge_update[0], config.num_message_passing_steps
    factorized = [
        Linear("edge_update", 0, "edges", le, width, 1, shared=True),  # encoded edges, once
        # encoded nodes (receiver, sender), once
        Linear("edge_update", 0, "nodes", ln, width, 2, shared=True),
        Linear("edge_update", 0, "edges", le, width, steps),  # current edges
        Linear("edge_update", 0, "nodes", ln, width, 2 * steps),  # current nodes
    ]
    result = []
    for layer in layers:
        is_first_edge_update = layer.module == "edge_update" and layer.index == 0
        result.extend(factorized if is_first_edge_update else [layer])
    return result


def num_parameters(config: ModelConfig, num_node_features: int, num_edge_features: int) -> int:
    """Number of trainable scalars of ``SegmentClassifier(config)`` for these input widths."""
    layers = linear_layers(config, num_node_features, num_edge_features)
    total = sum(x.fan_in * x.fan_out + x.fan_out for x in layers)
    if config.layer_norm:  # scale and offset after each encoder and core MLP
        sizes = (config.node_encoder, config.edge_encoder, config.edge_update, config.node_update)
        total += sum(2 * s[-1] for s in sizes)
    return total


def forward_flops(
    config: ModelConfig,
    num_nodes: int,
    num_edges: int,
    num_node_features: int,
    num_edge_features: int,
) -> int:
    """Matmul FLOPs of one forward pass over a graph batch of N nodes and E edges."""
    rows = {"nodes": num_nodes, "edges": num_edges}
    layers = step_matmuls(config, num_node_features, num_edge_features)
    return sum(2 * rows[x.rows] * x.fan_in * x.fan_out * x.calls for x in layers)


def train_step_flops(
    config: ModelConfig,
    num_nodes: int,
    num_edges: int,
    num_node_features: int,
    num_edge_features: int,
) -> int:
    """Matmul FLOPs of forward + backward (see the module docstring for the convention).

    Counts the matmuls that the configured implementation runs (``step_matmuls``): with
    ``factorized_edge_update`` the same model costs fewer FLOPs. What ``recompute`` computes
    again is not counted here: ``recomputed_step_flops``.
    """
    rows = {"nodes": num_nodes, "edges": num_edges}
    total = 0
    for x in step_matmuls(config, num_node_features, num_edge_features):
        passes = 3 if x.input_grad else 2
        total += passes * 2 * rows[x.rows] * x.fan_in * x.fan_out * x.calls
    return total


def recomputed_step_flops(
    config: ModelConfig,
    num_nodes: int,
    num_edges: int,
    num_node_features: int,
    num_edge_features: int,
) -> int:
    """Matmul FLOPs of forward + backward as ``config.recompute`` runs them
    (``hvdtrack.model.recompute``); without it, ``train_step_flops``.

    The plain step's products (``train_step_flops``), plus what the backward pass computes
    again, chunk by chunk:
    - each layer's forward product once more: the encoders', every step's edge and node MLPs
      and the head's. Not the edge update's last layer where speed first reads its layer norm's
      kept output (``keep_edge_term`` with a layer norm after a ReLU, two or more layers,
      float32, every step's boundaries kept, no offload: the CPU kernels' case), except in the
      last step;
    - the factorized update's shared terms, which the plain step computes once (its
      ``Linear.shared`` products): in every step's forward pass, its backward pass and that
      pass's gradients. Not the encoded edges' term with ``keep_edge_term`` (kept, its gradient
      summed over the steps as in the plain step);
    - with ``boundary_every`` = k, the forward pass (without the head) of each step whose
      boundaries were not kept: steps - ceil(steps / k) of them.

    The last step's node update counts as ``step_matmuls`` counts it for the plain step (its
    output is read by nothing: the recomputed step never computes it, TensorFlow drops it from
    the plain step).
    """
    if not config.recompute:
        return train_step_flops(config, num_nodes, num_edges, num_node_features, num_edge_features)
    rows = {"nodes": num_nodes, "edges": num_edges}
    steps, every = config.num_message_passing_steps, config.boundary_every
    groups = -(-steps // every)  # ceil: one kept boundary per group of ``every`` steps
    inner = steps - groups  # steps whose boundaries are computed again
    keeps_norm = _keeps_norm(config)
    last_edge_layer = len(config.edge_update) - 1
    total = 0
    for x in step_matmuls(config, num_node_features, num_edge_features):
        backward = 2 if x.input_grad else 1
        if x.shared and not (x.rows == "edges" and config.keep_edge_term is True):
            # in every step's forward pass, the inner boundaries' and every backward pass
            # (forward again, then its gradients)
            products = x.calls * (steps + inner + (1 + backward) * steps)
        elif x.shared:  # the encoded edges' term, kept: as in the plain step
            products = x.calls * (1 + backward)
        elif x.module.endswith("_encoder"):  # the forward pass once more
            products = x.calls * (2 + backward)
        else:
            per_step = 0 if x.module == "edge_output" else x.calls // steps
            again = x.calls
            if keeps_norm and x.module == "edge_update" and x.index == last_edge_layer:
                again = per_step  # the last step's only
            products = x.calls * (1 + backward) + again + per_step * inner
        total += products * 2 * rows[x.rows] * x.fan_in * x.fan_out
    return total


def _keeps_norm(config: ModelConfig) -> bool:
    """Speed first reads its edge updates' kept layer-norm outputs (``StepParts.keeps_norm``):
    the kept edge term with a layer norm after a ReLU, two or more layers, float32, every
    step's boundaries kept, no offload (the CPU kernels' case)."""
    return (
        config.keep_edge_term is True
        and config.layer_norm
        and config.activation == "relu"
        and len(config.edge_update) > 1
        and config.precision == "float32"
        and config.boundary_every == 1
        and not config.offload
    )


# What a training process holds beyond its recomputed step's tensors (TensorFlow's runtime,
# the model, the graph's inputs): peak RSS less the allocator's peak was 0.63-0.77 GiB at 160k
# edges (docs/performance.md, "Keeping the edge term when it fits").
PROCESS_BYTES = 2**30
# The allocator's peak over ``recomputed_step_bytes``: 1.07-1.14 at 160k edges (4 and 8 steps,
# both variants), with room for where the allocator's blocks fall.
ALLOCATOR_MARGIN = 1.25


def recomputed_step_bytes(config: ModelConfig, num_nodes: int, num_edges: int) -> int:
    """Bytes a recomputed step (``config.recompute``, ``keep_edge_term`` true or false) holds at
    its peak, by what ``hvdtrack.model.recompute`` keeps (estimated, not measured; 7-12% under
    the allocator's peak at 160k edges):

    - per edge: the kept edge boundaries (one per group of ``boundary_every`` steps) and the
      encoded edges, [E, L_e] each, and the logits of each step with an output ([E] float32);
    - per node: the node boundaries and six [N, L_n] more (encoded nodes, gradients, sums),
      five [N, H] (the node terms and their gradients; H the edge update's first width);
    - speed first (``keep_edge_term`` true): the edge term and its gradient sum, [E, H] each;
      where it reads its norm outputs (``_keeps_norm``), per step but the last the rows' mean
      and scale (float32), the ReLU's mask (one bit per latent) and the new edges' sums per
      node ([N, L_n] twice).

    Latents are in the compute dtype (``precision``: 2 bytes for 16-bit).
    """
    size = 4 if config.precision == "float32" else 2
    steps, every = config.num_message_passing_steps, config.boundary_every
    groups = -(-steps // every)
    outputs = steps if config.output_every_step else 1
    l_e, l_n, h = config.edge_latent_size, config.node_latent_size, config.edge_update[0]
    per_edge = size * l_e * (groups + 1) + 4 * outputs
    per_node = size * (l_n * (groups + 6) + 5 * h)
    if config.keep_edge_term is True:
        per_edge += size * 2 * h
        if _keeps_norm(config):
            per_edge += (steps - 1) * (2 * 4 + -(-l_e // 8))
            per_node += (steps - 1) * 2 * size * l_n
    return num_edges * per_edge + num_nodes * per_node


def resolve_keep_edge_term(
    config: ModelConfig, num_nodes: int, num_edges: int, memory_bytes: int | None
) -> ModelConfig:
    """``config`` with ``keep_edge_term: auto`` made true or false for graphs of up to
    ``num_nodes`` / ``num_edges`` in ``memory_bytes`` (None: unknown); any other value as it is.

    True (speed first) when the recomputed step keeping the edge term fits: its
    ``speed_first_bytes`` at most ``memory_bytes``.
    False (memory first) otherwise, when the memory is unknown, and for a model that cannot
    keep it (no ``recompute`` or no ``factorized_edge_update``)."""
    if config.keep_edge_term != "auto":
        return config
    off = dataclasses.replace(config, keep_edge_term=False)
    if not (config.recompute and config.factorized_edge_update) or memory_bytes is None:
        return off
    kept = dataclasses.replace(config, keep_edge_term=True)
    return kept if speed_first_bytes(config, num_nodes, num_edges) <= memory_bytes else off


def speed_first_bytes(config: ModelConfig, num_nodes: int, num_edges: int) -> int:
    """The memory ``resolve_keep_edge_term`` asks of a process for the recomputed step that keeps
    the edge term: ``PROCESS_BYTES`` plus ``ALLOCATOR_MARGIN`` times its estimate."""
    kept = dataclasses.replace(config, keep_edge_term=True)
    estimate = recomputed_step_bytes(kept, num_nodes, num_edges)
    return PROCESS_BYTES + int(ALLOCATOR_MARGIN * estimate)


def node_cost(config: ModelConfig, num_node_features: int, num_edge_features: int) -> float:
    """What a node costs a training step, in edges: ``train_step_flops`` per node over per
    edge (2.67 for the packaged default model). Orders graphs by cost in epoch plans."""
    per_node = train_step_flops(config, 1, 0, num_node_features, num_edge_features)
    return per_node / train_step_flops(config, 0, 1, num_node_features, num_edge_features)


def num_trainable_parameters(module: tf.Module) -> int:
    """Number of trainable scalars of a built Sonnet module.

    Raises:
      ValueError: if the module has no variables yet (Sonnet creates them on the first call).
    """
    return sum(int(v.shape.num_elements()) for v in _trainable(module))


def gradient_bytes(module: tf.Module) -> int:
    """Bytes of one full set of gradients of a built module (size x dtype size, 4 for float32).

    This is what an all-reduce moves per step (before compression).

    Raises:
      ValueError: if the module has no variables yet.
    """
    return sum(int(v.shape.num_elements()) * v.dtype.size for v in _trainable(module))


def _trainable(module: tf.Module) -> Sequence:
    import tensorflow as tf

    if not isinstance(module, tf.Module):
        raise TypeError(f"expected a Sonnet module, got {type(module).__name__}")
    try:
        variables = module.trainable_variables
    except ValueError:  # Sonnet refuses to list the variables of a module that has none
        variables = ()
    if not variables:
        raise ValueError(
            f"{type(module).__name__} has no variables yet: Sonnet creates them on the first "
            "call, so call the model once on a GraphsTuple before counting its parameters"
        )
    return variables
