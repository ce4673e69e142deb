"""SegmentClassifier and ModelConfig: output shapes, variable names, argument checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from graph_nets import utils_tf

from hvdtrack import configtools
from hvdtrack.errors import ConfigError
from hvdtrack.model.classifier import MODULE_NAMES, SegmentClassifier
from hvdtrack.model.config import ModelConfig
from hvdtrack.model.kernels import vector_code
from hvdtrack.model.segments import segment_sum, split_edges
from tests.model.conftest import TINY


def copy_weights(source, target):
    """Assigns ``source``'s variables to ``target``'s, matched by name below the module name."""
    by_name = {v.name.split("/", 1)[1]: v for v in source.trainable_variables}
    names = {v.name.split("/", 1)[1] for v in target.trainable_variables}
    assert names == set(by_name)
    for v in target.trainable_variables:
        v.assign(by_name[v.name.split("/", 1)[1]])


@pytest.mark.parametrize("every_step, expected_outputs", [(True, 3), (False, 1)])
def test_one_edge_logit_vector_per_output_step(graphs, every_step, expected_outputs):
    model = SegmentClassifier(dataclasses.replace(TINY, output_every_step=every_step))
    logits = model(graphs)
    assert len(logits) == expected_outputs
    for x in logits:
        assert x.shape == (7,) and x.dtype == tf.float32


def test_variables_are_created_on_first_call_with_stable_names(graphs):
    model = SegmentClassifier(TINY)
    with pytest.raises(ValueError):  # Sonnet: no variables before the first call
        model.trainable_variables  # noqa: B018
    model(graphs)
    assert sorted(v.name for v in model.trainable_variables) == [
        "segment_classifier/edge_encoder/mlp/linear_0/b:0",
        "segment_classifier/edge_encoder/mlp/linear_0/w:0",
        "segment_classifier/edge_output/mlp/linear_0/b:0",
        "segment_classifier/edge_output/mlp/linear_0/w:0",
        "segment_classifier/edge_output/mlp/linear_1/b:0",
        "segment_classifier/edge_output/mlp/linear_1/w:0",
        "segment_classifier/edge_update/mlp/linear_0/b:0",
        "segment_classifier/edge_update/mlp/linear_0/w:0",
        "segment_classifier/node_encoder/mlp/linear_0/b:0",
        "segment_classifier/node_encoder/mlp/linear_0/w:0",
        "segment_classifier/node_update/mlp/linear_0/b:0",
        "segment_classifier/node_update/mlp/linear_0/w:0",
    ]
    # Core weights are shared across steps: calling again creates nothing new.
    model(graphs)
    assert len(model.trainable_variables) == 12


def test_layer_norm_adds_scale_and_offset_under_each_encoder_and_core_module(graphs):
    model = SegmentClassifier(dataclasses.replace(TINY, layer_norm=True, edge_update=(5, 3)))
    model(graphs)
    names = {v.name for v in model.trainable_variables}
    for module in ("node_encoder", "edge_encoder", "edge_update", "node_update"):
        assert f"segment_classifier/{module}/layer_norm/scale:0" in names
        assert f"segment_classifier/{module}/layer_norm/offset:0" in names
    assert {n.split("/")[1] for n in names} == set(MODULE_NAMES)
    assert not any("edge_output/layer_norm" in n for n in names)


def test_default_config_variable_shapes(graphs):
    model = SegmentClassifier(ModelConfig(num_message_passing_steps=1))
    model(graphs)
    shapes = {v.name.split("/", 1)[1]: tuple(v.shape) for v in model.trainable_variables}
    assert shapes["node_encoder/mlp/linear_0/w:0"] == (3, 128)
    assert shapes["edge_encoder/mlp/linear_0/w:0"] == (2, 128)
    # [edge enc + latent (2 x 64), receiver node (2 x 64), sender node (2 x 64)]
    assert shapes["edge_update/mlp/linear_0/w:0"] == (384, 128)
    # [received sum (64), sent sum (64), node enc + latent (2 x 64)]
    assert shapes["node_update/mlp/linear_0/w:0"] == (256, 128)
    assert shapes["edge_output/mlp/linear_1/w:0"] == (64, 1)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_factorized_edge_update_is_the_same_function_with_the_same_variables(graphs, layer_norm):
    plain_config = dataclasses.replace(TINY, layer_norm=layer_norm, edge_update=(5, 3))
    plain = SegmentClassifier(plain_config)
    factorized_config = dataclasses.replace(plain_config, factorized_edge_update=True)
    factorized = SegmentClassifier(factorized_config)
    plain(graphs)
    factorized(graphs)
    assert [(v.name, v.shape) for v in plain.trainable_variables] == [
        (v.name, v.shape) for v in factorized.trainable_variables
    ]
    copy_weights(plain, factorized)
    for a, b in zip(plain(graphs), factorized(graphs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
    # the last layer and its norm in one kernel where the library has vector code
    one_kernel = layer_norm and vector_code()
    traced = tf.function(lambda: factorized(graphs)).get_concrete_function()
    types = {op.type for op in traced.graph.get_operations()}
    assert ("HvdtrackLinearNorm" in types) == one_kernel, types


def test_the_first_edge_layer_is_split_once_per_forward_pass(graphs):
    # Each split of the factorized first layer's W has all of W as gradient (zeros for the
    # parts it does not use): the steps and the edge runs share one split, and the gradients
    # stay those of the unfactorized update.
    plain_config = dataclasses.replace(TINY, edge_update=(5, 3), edge_runs=2)
    plain = SegmentClassifier(plain_config)
    factorized = SegmentClassifier(dataclasses.replace(plain_config, factorized_edge_update=True))
    plain(graphs)
    factorized(graphs)
    copy_weights(plain, factorized)

    def gradients(model):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(x) for x in model(graphs)])
        return tape.gradient(loss, model.trainable_variables)

    for a, b in zip(gradients(plain), gradients(factorized)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
    traced = tf.function(lambda: gradients(factorized)).get_concrete_function()
    splits = [op for op in traced.graph.get_operations() if op.type == "SplitV"]
    of_w = [op for op in splits if op.inputs[0].shape == (2 * 3 + 4 * 4, 5)]  # [e_enc e r.. s]
    assert len(of_w) == 1, [op.name for op in splits]


def test_split_edges_cuts_consecutive_runs_in_order(graphs):
    split = split_edges(graphs, 3)  # 7 edges: 7 * i // 3 for i = 0..3 -> 0, 2, 4, 7
    assert [r.numpy().tolist() for r in split.senders] == [[0, 0], [1, 2], [1, 4, 5]]
    assert [r.numpy().tolist() for r in split.receivers] == [[1, 2], [2, 0], [1, 5, 6]]
    np.testing.assert_array_equal(tf.concat(split.edges, 0).numpy(), graphs.edges.numpy())
    assert split.nodes is graphs.nodes and split.n_edge is graphs.n_edge
    # more runs than edges: empty runs, none lost
    assert [len(r) for r in split_edges(graphs, 9).senders] == [0, 1, 1, 1, 0, 1, 1, 1, 1]


def hub_graph():
    """One graph of 6 nodes and 12 edges, 9 of them into node 0 (a sum of 9 rows, which
    another order of addition would change), edges of features from 1e-2 to 1e2."""
    rng = np.random.default_rng(11)
    scale = np.exp(rng.uniform(-4.6, 4.6, (12, 1)))
    graph = dict(
        nodes=rng.standard_normal((6, 3)).astype(np.float32),
        edges=(rng.standard_normal((12, 2)) * scale).astype(np.float32),
        senders=np.array([1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 1], np.int32),
        receivers=np.array([0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 3], np.int32),
        globals=np.zeros(1, np.float32),
    )
    return utils_tf.data_dicts_to_graphs_tuple([graph])


@pytest.mark.parametrize(
    "changes",
    [dict(factorized_edge_update=True, layer_norm=True), dict(factorized_edge_update=False),
     dict(factorized_edge_update=True, output_every_step=False),
     dict(factorized_edge_update=True, output_head=(3, 2), activation="tanh")],
)  # fmt: skip
@pytest.mark.parametrize("hub", [False, True])
def test_the_edges_in_runs_give_the_function_of_one_run(graphs, changes, hub):
    """model.edge_runs: 2 and 3 runs give the logits of 1 bit for bit (each run's node sums
    added onto the runs' before it), and the gradients up to the order of the weight gradients'
    sums. 9 runs (of one or two edges, two of them empty with 7 edges) give the logits up to
    rounding: TensorFlow's product of one row by a matrix takes another path than that of
    several. The graph with a hub runs compiled."""
    graphs = hub_graph() if hub else graphs
    labels = tf.cast(tf.range(tf.reduce_sum(graphs.n_edge)) % 3 == 0, tf.float32)
    models = [
        SegmentClassifier(dataclasses.replace(TINY, edge_runs=runs, **changes))
        for runs in (1, 2, 3, 9)
    ]
    results = []
    for model in models:
        model(graphs)
        copy_weights(models[0], model)

        def run(model=model):
            with tf.GradientTape() as tape:
                logits = model(graphs)
                losses = [tf.nn.sigmoid_cross_entropy_with_logits(labels, x) for x in logits]
                loss = tf.reduce_sum(tf.add_n(losses))
            return logits, tape.gradient(loss, model.trainable_variables)

        results.append(tf.function(run)() if hub else run())
    (logits_1, grads_1), *others = results
    for model, (logits, grads) in zip(models[1:], others):
        assert len(logits) == len(logits_1) and len(grads) == len(grads_1)
        for a, b in zip(logits_1, logits) if model.config.edge_runs < 9 else ():
            assert a.numpy().tobytes() == b.numpy().tobytes()
        for a, b in zip([*logits_1, *grads_1], [*logits, *grads]):
            assert a.shape == b.shape
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_messages_reach_both_endpoints(graphs):
    """The node update reads sent edges too: a change on edge 0 (0 -> 1) moves node 0's logits."""
    tf.random.set_seed(1)
    # tanh: no dead ReLU units that could block the path by chance.
    config = dataclasses.replace(TINY, num_message_passing_steps=2, activation="tanh")
    model = SegmentClassifier(config)
    before = model(graphs)[-1].numpy()
    edges = graphs.edges.numpy()
    edges[0] += 5.0
    after = model(graphs.replace(edges=tf.constant(edges)))[-1].numpy()
    # Edge 3 (2 -> 0) touches node 0 only as its receiver: it sees node 0's state, which after
    # one step depends on edge 0 only through node 0's *sent* edges.
    assert abs(after[3] - before[3]) > 1e-6
    # Graph b (edges 5 and 6) is not connected to graph a: unchanged.
    np.testing.assert_array_equal(after[5:], before[5:])


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_message_passing_steps=0), "'num_message_passing_steps' must be an integer >= 1"),
        (dict(node_encoder=(128, 0)), r"'node_encoder' sizes must be integers > 0, got \[128, 0\]"),
        (dict(edge_encoder=()), "'edge_encoder' must list at least one layer size"),
        (dict(output_head=(-1,)), "'output_head' sizes must be integers > 0"),
        (dict(edge_update=(128, 32)), r"'edge_update' last size \(32\) must equal the edge latent"),
        (dict(node_update=(16,)), r"'node_update' last size \(16\) must equal the node latent"),
        (dict(activation="gelu"), "'activation' must be one of 'relu', 'tanh', 'elu', got 'gelu'"),
        (dict(layer_norm=1), "'layer_norm' must be true or false"),
        (dict(edge_runs=0), "'edge_runs' must be an integer from 1 to 64, got 0"),
        (dict(edge_runs=True), "'edge_runs' must be an integer from 1 to 64, got True"),
    ],
)
def test_bad_config_values_are_rejected_naming_the_key(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**changes)


def test_config_from_yaml_mapping_names_the_section_key():
    config = configtools.from_mapping(
        ModelConfig, {"node_encoder": [32, 16], "node_update": [16]}, where="model"
    )
    assert config.node_encoder == (32, 16) and config.node_update == (16,)
    with pytest.raises(ConfigError, match="'model.num_message_passing_steps' must be an integer"):
        configtools.from_mapping(
            ModelConfig, {"num_message_passing_steps": 0}, where="model", source="run.yaml"
        )
    with pytest.raises(ConfigError, match="'model.activation' must be one of"):
        configtools.from_mapping(ModelConfig, {"activation": "swish"}, where="model")


def test_constructor_rejects_a_mapping_instead_of_a_config():
    with pytest.raises(TypeError, match="config must be a hvdtrack.model.ModelConfig, got dict"):
        SegmentClassifier({"num_message_passing_steps": 2})


def test_call_rejects_graphs_without_edge_features(graphs):
    model = SegmentClassifier(TINY)
    with pytest.raises(ValueError, match="the input GraphsTuple has no 'edges'"):
        model(graphs.replace(edges=None))
    with pytest.raises(TypeError, match="expected a graph_nets GraphsTuple, got dict"):
        model({"nodes": graphs.nodes})


def test_segment_sum_matches_tensorflow_values_and_gradient():
    values = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    ids = tf.constant([2, 0, 2])
    upstream = tf.constant([[1.0, -1.0], [2.0, 0.5], [3.0, 3.0]])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(values)
        ours = segment_sum(values, ids, 3)
        theirs = tf.math.unsorted_segment_sum(values, ids, 3)
        ours_loss = tf.reduce_sum(ours * upstream)
        theirs_loss = tf.reduce_sum(theirs * upstream)
    np.testing.assert_array_equal(ours.numpy(), [[3.0, 4.0], [0.0, 0.0], [6.0, 8.0]])
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    # d(sum_n upstream[n] . out[n]) / d values[e] = upstream[ids[e]]
    ours_grad = tape.gradient(ours_loss, values)
    np.testing.assert_array_equal(ours_grad.numpy(), [[3.0, 3.0], [1.0, -1.0], [3.0, 3.0]])
    np.testing.assert_array_equal(ours_grad.numpy(), tape.gradient(theirs_loss, values).numpy())
