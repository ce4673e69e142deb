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
stages of ``hvdtrack.distributed.stages`` call them). They take the edges in
``model.edge_runs`` runs of consecutive edges (``segments.split_edges``): each step's edge
update and head run on each run as its own chain of ops, which two inter-op threads run side
by side.

Public symbols: ``SegmentClassifier``, ``FactorizedEdgeUpdate``, ``segment_sum``,
``MODULE_NAMES``.
"""

from __future__ import annotations

from typing import Callable

import sonnet as snt
import tensorflow as tf
from graph_nets import blocks
from graph_nets.graphs import GraphsTuple

from hvdtrack.model.chunks import auto_chunk_edges
from hvdtrack.model.config import ModelConfig
from hvdtrack.model.head import is_lean, lean_head
from hvdtrack.model.mlp import (
    ACTIVATIONS,
    LinearStack,
    dense,
    kept_for,
    linear_freeing_input,
    linear_norm,
    make_mlp,
)
from hvdtrack.model.norm import LayerNorm, NormOutput
from hvdtrack.model.recompute import StepParts, recomputed_rows, recomputed_steps
from hvdtrack.model.segments import NodeGradients, gather_sum, segment_sum, split_edges

# The sub-modules holding variables, in data-flow order; variable names start with these.
MODULE_NAMES = ("node_encoder", "edge_encoder", "edge_update", "node_update", "edge_output")


class EdgeBlock(blocks.EdgeBlock):
    """``graph_nets.blocks.EdgeBlock`` that can also run its edge model on given rows."""

    def rows(self, *parts: tf.Tensor) -> tf.Tensor:
        """The edge model on the concatenation of ``parts`` (rows of edges, in the order the
        block collects them: edges, receiver nodes, sender nodes)."""
        return self._edge_model(tf.concat(parts, axis=-1) if len(parts) > 1 else parts[0])

    @property
    def model(self) -> snt.Module:
        """The edge model (the MLP)."""
        return self._edge_model


class NodeBlock(blocks.NodeBlock):
    """``graph_nets.blocks.NodeBlock`` that can also run its node model on given sums."""

    def rows(self, *parts: tf.Tensor) -> tf.Tensor:
        """The node model on the concatenation of ``parts`` (received sums, sent sums, nodes),
        handed over as parts (``mlp.FusedMLP`` keeps the parts, not their concatenation)."""
        return self._node_model(parts)


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
        nodes_only = dict(use_received_edges=False, use_sent_edges=False, use_globals=False)
        self._node_encoder = NodeBlock(
            mlp_fn(config.node_encoder), name="node_encoder", **nodes_only
        )
        self._edge_encoder = EdgeBlock(
            mlp_fn(config.edge_encoder), name="edge_encoder", **edges_only
        )
        if config.factorized_edge_update:
            self._edge_update = FactorizedEdgeUpdate(config, name="edge_update")
        else:
            self._edge_update = EdgeBlock(
                mlp_fn(config.edge_update),
                use_edges=True,
                use_receiver_nodes=True,
                use_sender_nodes=True,
                use_globals=False,
                name="edge_update",
            )
        self._node_update = NodeBlock(
            mlp_fn(config.node_update),
            use_received_edges=True,
            use_sent_edges=True,
            use_nodes=True,
            use_globals=False,
            received_edges_reducer=segment_sum,
            sent_edges_reducer=segment_sum,
            name="node_update",
        )
        self._edge_output = EdgeBlock(head_fn, name="edge_output", **edges_only)

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
        """The encoders: the encoded graphs (nodes [N, L_n]; edges, senders and receivers as
        tuples of ``config.edge_runs`` runs of consecutive edges, ``split_edges``: edges
        [E_i, L_e]) and the terms of the edge update that every step shares
        (``FactorizedEdgeUpdate.encoded_terms`` with ``factorized_edge_update``, else ``()``).

        ``__call__`` is ``encode`` then ``core_step`` ``num_message_passing_steps`` times, the
        latent starting as the encoded graphs; ``hvdtrack.distributed.stages`` runs the same calls
        split over devices. No precision cast and no variable creation happen here.
        """
        encoded = split_edges(self._node_encoder(graphs), self._config.edge_runs)
        encoded = encoded.replace(edges=tuple(self._edge_encoder.rows(e) for e in encoded.edges))
        factorized = self._config.factorized_edge_update
        return encoded, tuple(self._edge_update.encoded_terms(encoded)) if factorized else ()

    def core_step(
        self, latent: GraphsTuple, encoded: GraphsTuple, invariant: tuple = (),
        output: bool = True, last: bool = False,
    ) -> tuple[GraphsTuple, tf.Tensor | None]:  # fmt: skip
        """One message-passing step (the shared core) and, if ``output``, its edge logits.

        Args:
          latent: the current latents (nodes [N, L_n], edges: runs of [E_i, L_e]) with the
            batch's senders and receivers in the same runs, and its counts.
          encoded: the first element of ``encode``'s result for the same batch.
          invariant: the second element of ``encode``'s result.
          output: apply the output head.
          last: no later step reads the latents returned (the head's backward pass need not
            wait for their gradient: ``head.lean_head``).

        Returns:
          The updated latents (edges in the same runs), and the step's edge logits [E] (None
          without ``output``).
        """
        config, count = self._config, tf.shape(latent.nodes)[0]
        if config.factorized_edge_update:
            edge_terms, *node_invariant, blocks = invariant
            receiver_terms, sender_terms = self._edge_update.node_terms(
                latent.nodes, node_invariant, blocks
            )
        else:
            core_nodes = tf.concat([encoded.nodes, latent.nodes], axis=-1)
        # The node update reads blocks.NodeBlock's [received, sent, encoded nodes, nodes], as
        # parts. Each run's rows are added onto the sums of the runs before it, in edge order:
        # with the kernel library the sums have the bits of one pass over all the edges,
        # wherever the runs are cut. With the lean head the sums come from it (their
        # gradients join its own).
        passed, logits, sums, weights = [], [], None, None
        for i, (receivers, senders) in enumerate(zip(latent.receivers, latent.senders)):
            if config.factorized_edge_update:
                terms = (edge_terms[i], receiver_terms, sender_terms)
                edges = self._edge_update.rows(
                    latent.edges[i], *terms, receivers, senders, blocks=blocks
                )
            else:
                both = tf.concat([encoded.edges[i], latent.edges[i]], axis=-1)
                run = latent.replace(
                    nodes=core_nodes, edges=both, receivers=receivers, senders=senders
                )
                edges = self._edge_update(run).edges
            lean = output and is_lean(config, edges.dtype)
            if lean and weights is None:
                hidden, out = self._edge_output.model.layers
                w1, b1 = hidden.weights(edges)
                weights = (w1, b1, *out.weights(tf.zeros([0, w1.shape[-1]])))
            if lean and not last:
                ids = (receivers, senders, count)
                edges_out, run_logits, *sums = lean_head(edges, *weights, True, ids, onto=sums)
            else:
                edges_out, run_logits = edges, None
                if lean:  # no later step reads the latents
                    edges_out, run_logits = lean_head(edges, *weights, wait=False)
                elif output:
                    run_logits = self._edge_output.rows(edges)
                sums = [
                    segment_sum(edges, ids, count, onto=before)
                    for ids, before in zip((receivers, senders), sums or (None, None))
                ]
            passed.append(edges_out)
            logits.append(run_logits)
        nodes = self._node_update.rows(*sums, encoded.nodes, latent.nodes)
        updated = latent.replace(nodes=nodes, edges=tuple(passed))
        if not output:
            return updated, None
        return updated, tf.squeeze(tf.concat(logits, axis=0) if len(logits) > 1 else logits[0], -1)

    def _forward(self, graphs: GraphsTuple, recompute: bool) -> list[tf.Tensor]:
        if recompute:
            return self._forward_recomputed(graphs)
        encoded, invariant = self.encode(graphs)
        latent, outputs = encoded, []
        for step in range(self._config.num_message_passing_steps):
            last = step == self._config.num_message_passing_steps - 1
            output = self._config.output_every_step or last
            latent, logits = self.core_step(latent, encoded, invariant, output, last)
            if output:
                outputs.append(logits)
        return outputs

    def _forward_recomputed(self, graphs: GraphsTuple) -> list[tf.Tensor]:
        """``_forward`` keeping only the step boundaries for the backward pass
        (``hvdtrack.model.recompute``): the same function, the same gradients."""
        config = self._config
        factorized = config.factorized_edge_update
        dtype = graphs.nodes.dtype
        chunk = config.chunk_edges or auto_chunk_edges()

        def compute_dtype(fn: Callable) -> Callable:
            """``fn`` reading the variables in the compute dtype, as ``__call__`` does, also
            when the backward pass runs it again (outside ``__call__``'s variable getter)."""
            if dtype == tf.float32:
                return fn

            def cast(*args):
                with snt.custom_variable_getter(lambda v: tf.cast(v, dtype)):
                    return fn(*args)

            return cast

        # The encoders keep only their inputs; their layers are computed again, in chunks.
        encoded_nodes, encoded_edges = (
            recomputed_rows(compute_dtype(block.rows), rows, chunk)
            for block, rows in [
                (self._node_encoder, graphs.nodes),
                (self._edge_encoder, graphs.edges),
            ]
        )
        # No step-invariant node terms passed through the steps ([N, 128] twice, and their
        # gradients): each step computes them again from the encoded nodes ([N, 64]).

        def node_terms(x, xe):
            if factorized:
                return self._edge_update.node_terms(x, self._edge_update.node_invariant(xe))
            core = tf.concat([xe, x], axis=-1)
            return core, tf.identity(core)  # two tensors: each gets its own gradient

        def edge_rows(e, t, receiver_terms, sender_terms, receivers, senders, onto, kept):
            # t: rows of the edge term (factorized), else of the encoded edges (StepParts);
            # onto: where the node terms' gradients are added per node (factorized); kept:
            # the last layer norm's output, kept (StepParts.keeps_norm)
            if factorized:
                return self._edge_update.rows(
                    e, t, receiver_terms, sender_terms, receivers, senders, onto, kept
                )
            receiver_rows = tf.gather(receiver_terms, receivers)
            return self._edge_update.rows(t, e, receiver_rows, tf.gather(sender_terms, senders))

        def head_rows(e):
            return tf.squeeze(self._edge_output.rows(e), axis=-1)

        def node_rows(received, sent, x, xe):
            return self._node_update.rows(received, sent, xe, x)

        # The factorized update's edge term: computed per chunk from the encoded edges, or
        # (keep_edge_term) once, kept, and passed as the steps' shared edge input. "auto" not
        # resolved (``cost.resolve_keep_edge_term``; a forward pass to evaluate): not kept.
        keep = config.keep_edge_term is True
        edge_term = compute_dtype(self._edge_update.edge_term) if factorized else None
        shared_edges = edge_term(encoded_edges) if keep else encoded_edges
        parts = StepParts(
            compute_dtype(node_terms),
            None if keep else edge_term,
            *map(compute_dtype, (edge_rows, head_rows, node_rows)),
            summed=factorized,
            keeps_norm=keep and self._edge_update.keeps_norm(dtype),
        )
        steps = config.num_message_passing_steps
        wanted = [config.output_every_step or step == steps - 1 for step in range(steps)]
        run = recomputed_steps(
            parts, graphs.senders, graphs.receivers, chunk, wanted,
            every=config.boundary_every, offload=config.offload,
        )  # fmt: skip
        logits = run(encoded_nodes, encoded_edges, encoded_nodes, shared_edges)
        return [x for x, want in zip(logits, wanted) if want]


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
        self._mlp = LinearStack(config.edge_update, name="mlp")
        # A last ReLU before the LayerNorm is the LayerNorm's own (as in ``make_mlp``); with
        # one layer, the first layer's kernel applies it.
        self._relu_in_norm = (
            config.layer_norm and config.activation == "relu" and len(config.edge_update) > 1
        )
        self._norm = LayerNorm(relu=self._relu_in_norm) if config.layer_norm else None

    def _first_layer_blocks(self) -> dict[str, tf.Tensor]:
        """W by input part, and b. A split's gradient is all of W (zeros for the parts unused):
        split once a plain forward pass (``encoded_terms``), not per call (27 at 8 steps)."""
        first = self._mlp.layers[0]
        le, ln = self._config.edge_latent_size, self._config.node_latent_size
        if not hasattr(first, "w"):  # Sonnet-style lazy creation, with the full input width
            first(tf.zeros([0, 2 * le + 4 * ln]))
        w = first.w
        rows = dict(e_enc=le, e=le, r_enc=ln, r=ln, s_enc=ln, s=ln)
        parts = tf.split(w, list(rows.values()), axis=0)
        return dict(zip(rows, parts), b=first.b)

    def encoded_terms(self, encoded: GraphsTuple) -> tuple[tuple, tf.Tensor, tf.Tensor, dict]:
        """The step-independent terms of the first layer, and its weights by part.

        Args:
          encoded: the encoders' output: nodes [N, L_n], edges in runs [E_i, L_e]
            (``SegmentClassifier.encode``).

        Returns:
          edge_terms: float32 [E_i, H] per run, ``e_enc @ W_e_enc + b`` (``edge_term``).
          receiver_term, sender_term: float32 [N, H], ``x_enc @ W_r_enc`` and ``x_enc @ W_s_enc``
          (``node_invariant``).
          blocks: W by part and b, for the steps' ``node_terms`` and ``rows``.
        """
        blocks = self._first_layer_blocks()
        return (
            tuple(self.edge_term(e, blocks) for e in encoded.edges),
            *self.node_invariant(encoded.nodes, blocks),
            blocks,
        )

    def edge_term(self, encoded_edges: tf.Tensor, blocks: dict | None = None) -> tf.Tensor:
        """``e_enc @ W_e_enc + b`` [rows, H], for any rows of the encoded edges.

        The bias by ``tf.nn.bias_add``: grappler fuses it into the product, its gradient a
        ``BiasAddGrad`` (2.0 ms at 5k nodes / 40k edges; ``+`` took an ``AddV2`` and a ``Sum``,
        11 ms). ``blocks``: ``encoded_terms``'s, else W is split here."""
        p = blocks or self._first_layer_blocks()
        return dense(encoded_edges, p["e_enc"], p["b"])

    def node_invariant(self, encoded_nodes: tf.Tensor, blocks: dict | None = None) -> tuple:
        """``x_enc @ W_r_enc`` and ``x_enc @ W_s_enc`` [N, H]."""
        p = blocks or self._first_layer_blocks()
        return dense(encoded_nodes, p["r_enc"]), dense(encoded_nodes, p["s_enc"])

    def node_terms(
        self, nodes: tf.Tensor, invariant: tuple[tf.Tensor, tf.Tensor], blocks: dict | None = None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """What the edges gather from their receiver and sender [N, H]:
        ``x @ W_r + x_enc @ W_r_enc`` and ``x @ W_s + x_enc @ W_s_enc``."""
        p = blocks or self._first_layer_blocks()
        receiver_term, sender_term = invariant
        return dense(nodes, p["r"]) + receiver_term, dense(nodes, p["s"]) + sender_term

    def rows(
        self, edges: tf.Tensor, edge_term: tf.Tensor, receiver_terms: tf.Tensor,
        sender_terms: tf.Tensor, receivers: tf.Tensor, senders: tf.Tensor,
        node_gradients: bool | NodeGradients = True, kept: bool | NormOutput = False,
        blocks: dict | None = None,
    ) -> tf.Tensor | NormOutput:  # fmt: skip
        """New edge latents [rows, L_e] of any rows of the edges, from their latents, their
        ``edge_term``, ``node_terms`` (whole, [N, H] each) and the rows' endpoints;
        ``node_gradients`` as ``segments.gather_sum``'s; ``kept`` (``keeps_norm``) as
        ``mlp.linear_norm``'s, for the last layer and its norm."""
        terms = (edge_term, dense(edges, (blocks or self._first_layer_blocks())["e"]))
        # The gathers, the sum and a ReLU in one pass.
        relu = self._config.activation == "relu"
        h = gather_sum(
            terms, (receiver_terms, sender_terms), receivers, senders, relu, node_gradients
        )
        return self._rest(h if relu else self._activation(h), kept)

    def keeps_norm(self, dtype: tf.DType) -> bool:
        """Whether ``rows`` in ``dtype`` can keep its last layer norm's output (``kept``): the
        last layer and the norm run as ``mlp.linear_norm``'s kernels."""
        return self._relu_in_norm and kept_for(tf.zeros([0, 1], dtype), self._norm)

    def _rest(self, h: tf.Tensor, kept: bool | NormOutput = False) -> tf.Tensor | NormOutput:
        """The layers after the first, on its activated output ``h`` [rows, H]."""
        count = len(self._mlp.layers)
        for i, layer in enumerate(self._mlp.layers[1:], start=2):
            # The first layer's output is read by this product only (its gradient takes the
            # ReLU's mask from the gather-sum kernel): freed before its gradient exists.
            if i == count and self._relu_in_norm:  # the bias's gradient from the layer norm's
                return linear_norm(h, *layer.weights(h), self._norm, kept)
            h = linear_freeing_input(h, *layer.weights(h)) if i == 2 else layer(h)
            h = self._activation(h)
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
