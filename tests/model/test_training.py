"""A real training check: Adam on a tiny graph whose labels are learnable."""

from __future__ import annotations

import numpy as np
import sonnet as snt
import tensorflow as tf
from graph_nets import utils_tf

from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.config import ModelConfig
from hvdtrack.model.loss import weighted_bce


def test_loss_falls_over_30_adam_steps():
    rng = np.random.default_rng(0)
    num_nodes, num_edges = 30, 80
    edges = rng.standard_normal((num_edges, 2)).astype(np.float32)
    graph = dict(
        nodes=rng.standard_normal((num_nodes, 3)).astype(np.float32),
        edges=edges,
        senders=rng.integers(0, num_nodes, num_edges).astype(np.int32),
        receivers=rng.integers(0, num_nodes, num_edges).astype(np.int32),
        globals=np.zeros(1, np.float32),
    )
    graphs = utils_tf.data_dicts_to_graphs_tuple([graph])
    labels = tf.constant((edges[:, 0] > 0).astype(np.float32))  # the sign of an edge feature
    tf.random.set_seed(0)
    config = ModelConfig(
        node_encoder=(16,),
        edge_encoder=(16,),
        edge_update=(16,),
        node_update=(16,),
        output_head=(16,),
        num_message_passing_steps=2,
    )
    model = SegmentClassifier(config)
    optimizer = snt.optimizers.Adam(learning_rate=0.01)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = model(graphs)
            loss = weighted_bce(logits, labels)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss, logits[-1]

    losses = [float(step()[0]) for _ in range(30)]
    _, logits = step()
    accuracy = np.mean((logits.numpy() > 0) == (labels.numpy() > 0))
    assert losses[-1] < 0.5 * losses[0], losses
    assert accuracy >= 0.9
