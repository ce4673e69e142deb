"""Segment classifier: encode-process-decode interaction network giving one logit per edge.

The architecture of the 2019-2020 graph_nets tracking studies:

1. Encoders (``node_encoder``, ``edge_encoder``): an MLP on the input node features [N, F_n] and
   edge features [E, F_e], giving the encoded latents [N, L_n] and [E, L_e].
2. Core, applied ``num_message_passing_steps`` times with the same weights, each time to the
   concatenation [encoded latent, current latent] (the current latent starts as the encoded one):
   - ``edge_update``: MLP of [edge, receiver node, sender node] -> new edge latent [E, L_e];
   - ``node_update``: MLP of [sum of received edges, sum of sent edges, node] -> [N, L_n].
   ``graph_nets.modules.InteractionNetwork`` only aggregates received edges; a hit in the middle
   of a track needs both its inner and outer segments, so the core is built from
   ``blocks.EdgeBlock`` and ``blocks.NodeBlock(use_received_edges=True, use_sent_edges=True)``
   with sum reducers (``segment_sum``: the kernel library's ``HvdtrackSegmentSum`` on CPU, else
   ``tf.math.unsorted_segment_sum``; a gather as gradient).
3. Output head (``edge_output``): MLP ``output_head`` sizes then one linear unit -> logit [E],
   applied after every core step (``output_every_step``) or after the last one.

Globals are not used (inputs carry zeros [num_graphs, 1]). Variables are created on the first
call, Sonnet style, with stable names ``<name>/{node_encoder,edge_encoder,edge_update,
node_update,edge_output}/...``.

``SegmentClassifier.encode`` and ``.core_step`` are the forward pass's parts (the
stages of ``hvdtrack.distributed.stages`` call them).

Public symbols: ``SegmentClassifier``, ``FactorizedEdgeUpdate``, ``segment_sum``, ``gather_rows``,
``make_mlp``, ``MODULE_NAMES``.
"""

from __future__ import annotations

import functools
from typing import Callable

import sonnet as snt
import tensorflow as tf
from graph_nets import blocks
from graph_nets.graphs import GraphsTuple

from hvdtrack.model.config import ACTIVATION_NAMES, ModelConfig
from hvdtrack.model.kernels import fused_kernels
from hvdtrack.model.norm import LayerNorm

ACTIVATIONS: dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    "relu": tf.nn.relu,
    "tanh": tf.nn.tanh,
    "elu": tf.nn.elu,
}
assert tuple(ACTIVATIONS) == ACTIVATION_NAMES

# The sub-modules holding variables, in data-flow order; variable names start with these.
MODULE_NAMES = ("node_encoder", "edge_encoder", "edge_update", "node_update", "edge_output")


def segment_sum(values: tf.Tensor, segment_ids: tf.Tensor, num_segments) -> tf.Tensor:
    """The sum of the rows of ``values`` per segment id, whose gradient is a plain gather.

    On CPU, for float32 [E, width] values and int32 ids, the kernel library's
    ``HvdtrackSegmentSum`` (``segment_sum.cc``): it scales with the intra-op threads and gives
    the same sums at any thread count, equal bit for bit to TensorFlow's one-thread kernel.
    Elsewhere (``kernels.fused_kernels()`` is None, other dtypes) it is
    ``tf.math.unsorted_segment_sum``. TensorFlow's own gradient also handles negative (dropped)
    ids with an extra zeros_like and select over [E, width]; edge endpoints are always valid
    node indices, so those are wasted (about 5% of a training step; see
    ``hvdtrack.bench.model --breakdown``).

    Args:
      values: float [E, width].
      segment_ids: int32 [E], each in [0, num_segments).
      num_segments: scalar int, N.

    Returns:
      [N, width] in ``values``' dtype, row n the sum of the rows of ``values`` whose id is n.

    Raises:
      tf.errors.InvalidArgumentError: an id outside [0, num_segments) (named with its edge).
    """
    values, segment_ids = tf.convert_to_tensor(values), tf.convert_to_tensor(segment_ids)
    fused = values.dtype == tf.float32 and values.shape.rank == 2
    kernels = fused_kernels() if fused and segment_ids.dtype == tf.int32 else None

    @tf.custom_gradient
    def _sum(values):
        def grad(upstream):
            return tf.gather(upstream, segment_ids)

        if kernels:
            count = tf.cast(num_segments, tf.int32)
            return kernels.hvdtrack_segment_sum(values, segment_ids, count), grad
        return tf.math.unsorted_segment_sum(values, segment_ids, num_segments), grad

    return _sum(values)


def gather_rows(params: tf.Tensor, indices: tf.Tensor) -> tf.Tensor:
    """``tf.gather(params, indices)`` whose gradient is ``segment_sum`` of the upstream rows.

    TensorFlow's gradient of a gather is an IndexedSlices made dense by its own
    ``UnsortedSegmentSum`` (16 per training step of the default model, not scaling with
    threads); this one runs the same sum on ``segment_sum``'s kernel, with the same bits.

    Args:
      params: [N, width].
      indices: int32 [E], each in [0, N).

    Returns:
      [E, width], row e the row ``indices[e]`` of ``params``.
    """
    params, indices = tf.convert_to_tensor(params), tf.convert_to_tensor(indices)

    @tf.custom_gradient
    def _gather(params):
        def grad(upstream):
            return segment_sum(upstream, indices, tf.shape(params)[0])

        return tf.gather(params, indices), grad

    return _gather(params)


def make_mlp(
    sizes: tuple[int, ...], config: ModelConfig, with_layer_norm: bool, activate_final: bool
) -> snt.Module:
    """Returns an MLP with ``config.activation`` (named ``mlp``), then a LayerNorm if asked.

    Built inside the calling module's constructor, so its variables sit under that module's name.
    """
    mlp = snt.nets.MLP(
        list(sizes), activation=ACTIVATIONS[config.activation], activate_final=activate_final
    )
    if not with_layer_norm:
        return mlp
    return snt.Sequential([mlp, LayerNorm()])


class SegmentClassifier(snt.Module):
    """Edge classifier over graph_nets ``GraphsTuple``s (sparse gather / segment-sum messages).

    Example:
      >>> model = SegmentClassifier(ModelConfig(num_message_passing_steps=2))
      >>> logits = model(graphs)  # list of 2 tensors of shape [total edges]
    """

    def __init__(self, config: ModelConfig, name: str = "segment_classifier"):
        """Builds the (variable-free, until first call) modules.

        Args:
          config: the validated ``model:`` section.
          name: module name; the prefix of every variable name.

        Raises:
          TypeError: if ``config`` is not a ``ModelConfig``.
        """
        _check_config(config, type(self).__name__)
        super().__init__(name=name)
        self._config = config
        self._built = False

        def mlp_fn(sizes: tuple[int, ...]) -> Callable[[], snt.Module]:
            return lambda: make_mlp(
                sizes, config, with_layer_norm=config.layer_norm, activate_final=True
            )

        def head_fn() -> snt.Module:
            sizes = config.output_head + (1,)
            return make_mlp(sizes, config, with_layer_norm=False, activate_final=False)

        edges_only = dict(use_receiver_nodes=False, use_sender_nodes=False, use_globals=False)
        self._node_encoder = blocks.NodeBlock(
            mlp_fn(config.node_encoder),
            use_received_edges=False,
            use_sent_edges=False,
            use_globals=False,
            name="node_encoder",
        )
        self._edge_encoder = blocks.EdgeBlock(
            mlp_fn(config.edge_encoder), name="edge_encoder", **edges_only
        )
        if config.factorized_edge_update:
            self._edge_update = FactorizedEdgeUpdate(config, name="edge_update")
        else:
            self._edge_update = blocks.EdgeBlock(
                mlp_fn(config.edge_update),
                use_edges=True,
                use_receiver_nodes=True,
                use_sender_nodes=True,
                use_globals=False,
                name="edge_update",
            )
        self._node_update = blocks.NodeBlock(
            mlp_fn(config.node_update),
            use_received_edges=True,
            use_sent_edges=True,
            use_nodes=True,
            use_globals=False,
            received_edges_reducer=segment_sum,
            sent_edges_reducer=segment_sum,
            name="node_update",
        )
        self._edge_output = blocks.EdgeBlock(head_fn, name="edge_output", **edges_only)

    @property
    def config(self) -> ModelConfig:
        return self._config

    def __call__(self, graphs: GraphsTuple) -> list[tf.Tensor]:
        """Scores every edge of a batch of graphs.

        Args:
          graphs: a ``GraphsTuple`` with nodes float32 [N, F_n], edges float32 [E, F_e],
            senders and receivers int32 [E] (indices into the N nodes of the whole batch),
            n_node / n_edge int32 [num_graphs]; globals are ignored.

        Returns:
          Edge logits, float32 [E] each: one per message-passing step if
          ``config.output_every_step``, else a list holding the last step's only.
        """
        _check_graphs(graphs, type(self).__name__)
        config = self._config
        if not self._built:
            # Sonnet creates variables on first use, in the dtype it is given and in the
            # function it runs in: create them float32 and outside any recomputed function.
            outputs = self._forward(graphs, recompute=False)
            self._built = True
            if config.precision == "float32" and not config.recompute:
                return outputs
        if config.precision == "float32":
            return self._forward(graphs, config.recompute)
        dtype = tf.as_dtype(config.precision)
        low = graphs.replace(nodes=tf.cast(graphs.nodes, dtype), edges=tf.cast(graphs.edges, dtype))
        # Every variable a module reads inside is cast to the compute dtype; the variables,
        # their gradients and the optimizer stay float32.
        with snt.custom_variable_getter(lambda v: tf.cast(v, dtype)):
            outputs = self._forward(low, config.recompute)
        return [tf.cast(x, tf.float32) for x in outputs]

    def encode(self, graphs: GraphsTuple) -> tuple[GraphsTuple, tuple]:
        """The encoders: the encoded graphs (nodes [N, L_n], edges [E, L_e]) and the terms of
        the edge update that every step shares (``FactorizedEdgeUpdate.encoded_terms`` with
        ``factorized_edge_update``, else ``()``).

        ``__call__`` is ``encode`` then ``core_step`` ``num_message_passing_steps`` times, the
        latent starting as the encoded graphs; ``hvdtrack.distributed.stages`` runs the same calls
        split over devices. No precision cast and no variable creation happen here.
        """
        encoded = self._edge_encoder(self._node_encoder(graphs))
        factorized = self._config.factorized_edge_update
        return encoded, tuple(self._edge_update.encoded_terms(encoded)) if factorized else ()

    def core_step(
        self, latent: GraphsTuple, encoded: GraphsTuple, invariant: tuple = (), output: bool = True
    ) -> tuple[GraphsTuple, tf.Tensor | None]:
        """One message-passing step (the shared core) and, if ``output``, its edge logits.

        Args:
          latent: the current latents (nodes [N, L_n], edges [E, L_e]) with the batch's
            senders, receivers and counts.
          encoded: the first element of ``encode``'s result for the same batch.
          invariant: the second element of ``encode``'s result.
          output: apply the output head.

        Returns:
          The updated latents, and the step's edge logits [E] (None without ``output``).
        """
        core_nodes = tf.concat([encoded.nodes, latent.nodes], axis=-1)
        if self._config.factorized_edge_update:
            edges = self._edge_update(latent, invariant)
        else:
            both = tf.concat([encoded.edges, latent.edges], axis=-1)
            edges = self._edge_update(latent.replace(nodes=core_nodes, edges=both)).edges
        updated = self._node_update(latent.replace(nodes=core_nodes, edges=edges))
        if not output:
            return updated, None
        return updated, tf.squeeze(self._edge_output(updated).edges, axis=-1)

    def _forward(self, graphs: GraphsTuple, recompute: bool) -> list[tf.Tensor]:
        encoded, invariant = self.encode(graphs)

        def core(nodes, edges, encoded_nodes, encoded_edges, *invariant, output=True):
            """``core_step`` on tensors (what ``tf.recompute_grad`` takes): (node, edge)
            latents -> new (node, edge) latents and the step's edge logits [E] (if ``output``,
            else a placeholder [0])."""
            latent = graphs.replace(nodes=nodes, edges=edges)
            enc = graphs.replace(nodes=encoded_nodes, edges=encoded_edges)
            updated, logits = self.core_step(latent, enc, invariant, output)
            if logits is None:
                logits = tf.zeros([0], updated.edges.dtype)
            return updated.nodes, updated.edges, logits

        steps = {True: core, False: functools.partial(core, output=False)}
        if recompute:
            # Keeps only each step's inputs for the backward pass and runs the step (with its
            # output head) again there: activation memory of one step instead of all.
            steps = {key: tf.recompute_grad(fn) for key, fn in steps.items()}
        nodes, edges = encoded.nodes, encoded.edges
        outputs = []
        for step in range(self._config.num_message_passing_steps):
            last = step == self._config.num_message_passing_steps - 1
            output = self._config.output_every_step or last
            nodes, edges, logits = steps[output](
                nodes, edges, encoded.nodes, encoded.edges, *invariant
            )
            if output:
                outputs.append(logits)
        return outputs


class _LinearStack(snt.Module):
    """The Linear layers of an MLP, named like ``snt.nets.MLP``'s (``mlp/linear_<i>``)."""

    def __init__(self, sizes: tuple[int, ...], name: str = "mlp"):
        super().__init__(name=name)
        self.layers = [snt.Linear(size, name=f"linear_{i}") for i, size in enumerate(sizes)]


class FactorizedEdgeUpdate(snt.Module):
    """The core edge update with its first layer applied part by part (same weights and result).

    The first layer of the edge MLP multiplies the concatenation [e_enc, e, r_enc, r, s_enc, s]
    ([E, 2 L_e + 4 L_n]: encoded and current edge, receiver node and sender node latents, in
    ``blocks.EdgeBlock``'s order) by W. Split W by rows into W_e_enc, W_e, W_r_enc, ... Then

        h = (e_enc @ W_e_enc + b) + e @ W_e
            + (x_enc @ W_r_enc + x @ W_r)[receivers] + (x_enc @ W_s_enc + x @ W_s)[senders]

    where the node products run on the N nodes (not the E edges), and the bracketed encoded
    terms are the same at every step, so ``encoded_terms`` computes them once per forward pass.
    Variable names and shapes are those of the ``blocks.EdgeBlock`` version
    (``edge_update/mlp/linear_<i>/{w,b}``, ``edge_update/layer_norm/...``).
    """

    def __init__(self, config: ModelConfig, name: str = "edge_update"):
        super().__init__(name=name)
        self._config = config
        self._activation = ACTIVATIONS[config.activation]
        self._mlp = _LinearStack(config.edge_update, name="mlp")
        self._norm = LayerNorm() if config.layer_norm else None

    def _first_layer_blocks(self) -> dict[str, tf.Tensor]:
        first = self._mlp.layers[0]
        le, ln = self._config.edge_latent_size, self._config.node_latent_size
        if not hasattr(first, "w"):  # Sonnet-style lazy creation, with the full input width
            first(tf.zeros([0, 2 * le + 4 * ln]))
        w = first.w
        rows = dict(e_enc=le, e=le, r_enc=ln, r=ln, s_enc=ln, s=ln)
        parts = tf.split(w, list(rows.values()), axis=0)
        return dict(zip(rows, parts), b=first.b)

    def encoded_terms(self, encoded: GraphsTuple) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The step-independent terms of the first layer.

        Args:
          encoded: the encoders' output: nodes [N, L_n], edges [E, L_e].

        Returns:
          edge_term: float32 [E, H], ``e_enc @ W_e_enc + b``.
          receiver_term, sender_term: float32 [N, H], ``x_enc @ W_r_enc`` and ``x_enc @ W_s_enc``.
        """
        p = self._first_layer_blocks()
        return (
            encoded.edges @ p["e_enc"] + p["b"],
            encoded.nodes @ p["r_enc"],
            encoded.nodes @ p["s_enc"],
        )

    def __call__(
        self, latent: GraphsTuple, encoded_terms: tuple[tf.Tensor, tf.Tensor, tf.Tensor]
    ) -> tf.Tensor:
        """New edge latents, float32 [E, L_e], from the current latents and ``encoded_terms``."""
        p = self._first_layer_blocks()
        edge_term, receiver_term, sender_term = encoded_terms
        # One pass adding the four [E, H] terms (three adds would write three of them).
        h = tf.add_n(
            [
                edge_term,
                latent.edges @ p["e"],
                gather_rows(latent.nodes @ p["r"] + receiver_term, latent.receivers),
                gather_rows(latent.nodes @ p["s"] + sender_term, latent.senders),
            ]
        )
        h = self._activation(h)
        for layer in self._mlp.layers[1:]:
            h = self._activation(layer(h))
        return h if self._norm is None else self._norm(h)


def _check_config(config: object, who: str) -> None:
    if not isinstance(config, ModelConfig):
        raise TypeError(
            f"{who}: config must be a hvdtrack.model.ModelConfig, got {type(config).__name__}; "
            "build one with ModelConfig(...) or configtools.from_mapping(ModelConfig, mapping)"
        )


def _check_graphs(graphs: object, who: str) -> None:
    if not isinstance(graphs, GraphsTuple):
        raise TypeError(f"{who}: expected a graph_nets GraphsTuple, got {type(graphs).__name__}")
    for field in ("nodes", "edges", "senders", "receivers", "n_node", "n_edge"):
        if getattr(graphs, field) is None:
            raise ValueError(
                f"{who}: the input GraphsTuple has no '{field}'; all of nodes, "
                "edges, senders, receivers, n_node and n_edge are needed"
            )
    for field in ("nodes", "edges"):
        rank = getattr(graphs, field).shape.rank
        if rank is not None and rank != 2:
            raise ValueError(
                f"{who}: graphs.{field} must have rank 2 [count, features], " f"got rank {rank}"
            )
