"""Dense incidence-matrix version of the segment classifier (HEP.TrkX 2018 style), a baseline.

Same architecture, sizes and variable names as ``SegmentClassifier``, but messages move through
dense incidence matrices instead of gathers and segment sums: Ri[n, e] = 1 if edge e ends at
(is received by) node n, Ro[n, e] = 1 if it starts there (float32 [N, E] each). Then
  receiver / sender node of each edge:  Ri^T @ x,  Ro^T @ x      ([E, N] @ [N, width])
  sum of received / sent edges:         Ri @ e,    Ro @ e        ([N, E] @ [E, width])
Memory and time grow as N * E (10k nodes x 80k edges: 3.2 GB per matrix), which is why the
sparse model exists; this one is used only by ``hvdtrack.bench.model`` to measure the gap.

Public symbols: ``DenseSegmentClassifier``, ``incidence_matrices_t``.
"""

from __future__ import annotations

import sonnet as snt
import tensorflow as tf
from graph_nets.graphs import GraphsTuple

from hvdtrack.model.classifier import ModelConfig, _check_config, _check_graphs, make_mlp


def incidence_matrices_t(graphs: GraphsTuple) -> tuple[tf.Tensor, tf.Tensor]:
    """Builds Ri^T and Ro^T, float32 [E, N] one-hot rows (row e has a 1 at receiver / sender of e).

    Kept transposed ([E, N]) so that both products use one buffer each: Ri^T @ x directly and
    Ri @ e as ``tf.matmul(ri_t, e, transpose_a=True)``.
    """
    num_nodes = tf.shape(graphs.nodes)[0]
    ri_t = tf.one_hot(graphs.receivers, num_nodes, dtype=tf.float32)
    ro_t = tf.one_hot(graphs.senders, num_nodes, dtype=tf.float32)
    return ri_t, ro_t


class _Transform(snt.Module):
    """An MLP under its own name (``edge_update/mlp/...``), matching the sparse model's blocks."""

    def __init__(self, sizes, config, with_layer_norm, activate_final, name):
        super().__init__(name=name)
        self._net = make_mlp(sizes, config, with_layer_norm, activate_final)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return self._net(x)


class DenseSegmentClassifier(snt.Module):
    """Edge classifier with dense incidence matrices; same inputs and outputs as SegmentClassifier.

    Variables have the same names below the module name as ``SegmentClassifier``'s, so weights
    can be copied across by name.
    """

    def __init__(self, config: ModelConfig, name: str = "dense_segment_classifier"):
        """Builds the (variable-free, until first call) modules.

        Raises:
          TypeError: if ``config`` is not a ``ModelConfig``.
        """
        _check_config(config, type(self).__name__)
        super().__init__(name=name)
        self._config = config
        norm = config.layer_norm
        self._node_encoder = _Transform(config.node_encoder, config, norm, True, "node_encoder")
        self._edge_encoder = _Transform(config.edge_encoder, config, norm, True, "edge_encoder")
        self._edge_update = _Transform(config.edge_update, config, norm, True, "edge_update")
        self._node_update = _Transform(config.node_update, config, norm, True, "node_update")
        self._edge_output = _Transform(
            config.output_head + (1,), config, False, False, "edge_output"
        )

    @property
    def config(self) -> ModelConfig:
        return self._config

    def __call__(self, graphs: GraphsTuple) -> list[tf.Tensor]:
        """Scores every edge; see ``SegmentClassifier.__call__`` (same arguments and result)."""
        _check_graphs(graphs, type(self).__name__)
        ri_t, ro_t = incidence_matrices_t(graphs)
        encoded_nodes = self._node_encoder(graphs.nodes)
        encoded_edges = self._edge_encoder(graphs.edges)
        nodes, edges = encoded_nodes, encoded_edges
        outputs = []
        steps = self._config.num_message_passing_steps
        for step in range(steps):
            x = tf.concat([encoded_nodes, nodes], axis=-1)
            e = tf.concat([encoded_edges, edges], axis=-1)
            edges = self._edge_update(tf.concat([e, ri_t @ x, ro_t @ x], axis=-1))
            received = tf.matmul(ri_t, edges, transpose_a=True)
            sent = tf.matmul(ro_t, edges, transpose_a=True)
            nodes = self._node_update(tf.concat([received, sent, x], axis=-1))
            if self._config.output_every_step or step == steps - 1:
                outputs.append(tf.squeeze(self._edge_output(edges), axis=-1))
        return outputs
