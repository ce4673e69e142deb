"""model.recompute gives the plain gradients; model.precision computes in another dtype."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from graph_nets import graphs as gn_graphs

from hvdtrack import configtools
from hvdtrack.errors import ConfigError
from hvdtrack.model import recompute
from hvdtrack.model.chunks import auto_chunk_edges
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.config import ModelConfig
from hvdtrack.model.loss import weighted_bce
from tests.model.conftest import TINY
from tests.model.test_classifier import copy_weights


def loss_and_gradients(model, graphs, labels, compiled):
    def run():
        with tf.GradientTape() as tape:
            loss = weighted_bce(model(graphs), labels)
        return loss, tape.gradient(loss, model.trainable_variables)

    return tf.function(run)() if compiled else run()


@pytest.mark.parametrize(
    "compiled, factorized, every_step, chunk, offload, every",
    [(False, False, True, 16384, False, 1), (False, True, True, 16384, False, 1),
     (True, False, True, 16384, False, 1), (True, True, True, 16384, False, 1),
     (False, True, False, 16384, False, 1),
     # 7 edges in chunks of 3 (3 + 3 + 1) and of 1: the chunks' parts add up to the whole.
     (False, True, True, 3, False, 1), (True, True, True, 3, False, 1),
     (True, False, True, 1, False, 1), (True, True, False, 2, False, 1),
     # Offload: boundaries kept on /CPU:0 between the passes (here where they are anyway).
     (True, True, True, 3, True, 1), (False, False, True, 2, True, 1),
     # Boundaries of every 2nd step of 3 (groups of 2 and 1) and of every 3rd (one group):
     # the inner boundaries computed again give the same gradients.
     (False, True, True, 3, False, 2), (True, True, True, 3, False, 2),
     (True, False, False, 2, False, 3), (False, True, True, 16384, True, 3)],
)  # fmt: skip
def test_recomputed_gradients_equal_plain_ones(
    graphs, compiled, factorized, every_step, chunk, offload, every
):
    config = dataclasses.replace(
        TINY, layer_norm=True, factorized_edge_update=factorized, output_every_step=every_step
    )
    changes = dict(chunk_edges=chunk, offload=offload, boundary_every=every)
    assert_recompute_gives_the_plain_gradients(graphs, config, changes, compiled)


@pytest.mark.parametrize(
    "compiled, chunk, every, every_step",
    [(False, 16384, 1, True), (True, 3, 1, True), (True, 2, 2, False), (False, 1, 3, True)],
)
def test_the_kept_edge_term_gives_the_plain_gradients(graphs, compiled, chunk, every, every_step):
    # model.keep_edge_term: the term passes through the steps as their shared edge input, its
    # gradient summed over them in one [E, H] buffer and taken through e_enc @ W_e_enc once.
    config = dataclasses.replace(
        TINY, layer_norm=True, factorized_edge_update=True, output_every_step=every_step
    )
    changes = dict(chunk_edges=chunk, boundary_every=every, keep_edge_term=True)
    assert_recompute_gives_the_plain_gradients(graphs, config, changes, compiled)


# The edge and node updates of the default model: two layers, the ReLU before the norm in the
# norm (the last layer and the norm as mlp.linear_norm).
TWO_LAYERS = dataclasses.replace(
    TINY, layer_norm=True, factorized_edge_update=True, edge_update=(5, 3), node_update=(5, 4)
)


@pytest.mark.parametrize(
    "compiled, chunk, every_step, offset",
    [(False, 16384, True, 0.0), (True, 3, True, 0.0), (True, 2, False, 0.0),
     (True, 3, True, 100.0), (False, 2, True, 100.0)],
)  # fmt: skip
def test_the_kept_norm_outputs_give_the_plain_gradients(
    graphs, compiled, chunk, every_step, offset
):
    # With the kept edge term, the backward pass reads each edge update's norm output (the
    # next step's input edges) and its row statistics instead of computing its last layer and
    # norm again. An offset of 100 against a scale of 1 in one column: the normalised input
    # cannot be read back from the output, and the backward pass computes the layer's product.
    config = dataclasses.replace(TWO_LAYERS, output_every_step=every_step)
    changes = dict(chunk_edges=chunk, keep_edge_term=True)

    def offset_column_0(model):
        (norm_offset,) = [v for v in model.variables if "edge_update/layer_norm/offset" in v.name]
        norm_offset[0].assign(offset)

    assert_recompute_gives_the_plain_gradients(graphs, config, changes, compiled, offset_column_0)


def test_the_kept_norm_outputs_are_not_computed_again(graphs):
    # Two layer norm kernels less in the backward pass per step but the last (3 steps: 4):
    # the chunk loop's, and the one that finds the variables its rows read (on no rows). The
    # edge update's norm is the layer norm kernel's, or with its product in HvdtrackLinearNorm.
    def layer_norms(keep: bool) -> int:
        config = dataclasses.replace(TWO_LAYERS, recompute=True, keep_edge_term=keep)
        model = SegmentClassifier(config)
        labels = tf.zeros([7])
        run = tf.function(lambda: loss_and_gradients(model, graphs, labels, compiled=False))
        graph = run.get_concrete_function().graph.as_graph_def()
        # (not in a cond's false branch: the product computed again where y cannot give it
        # back, which HvdtrackLinearNorm makes; that branch runs only then)
        functions = [
            f
            for f in graph.library.function
            if "layer_norm_grad_cond_false" not in f.signature.name
        ]
        nodes = [*graph.node, *(n for f in functions for n in f.node_def)]
        return sum(n.op in ("HvdtrackLayerNorm", "HvdtrackLinearNorm") for n in nodes)

    assert layer_norms(keep=False) - layer_norms(keep=True) == 4


def assert_recompute_gives_the_plain_gradients(graphs, config, changes, compiled, prepare=None):
    labels = tf.constant([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    plain = SegmentClassifier(config)
    recomputed = SegmentClassifier(dataclasses.replace(config, recompute=True, **changes))
    plain(graphs), recomputed(graphs)
    for model in (plain, recomputed) if prepare else ():
        prepare(model)
    copy_weights(plain, recomputed)
    loss_a, grads_a = loss_and_gradients(plain, graphs, labels, compiled)
    loss_b, grads_b = loss_and_gradients(recomputed, graphs, labels, compiled)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-6)
    assert len(grads_a) == len(grads_b) == len(plain.trainable_variables)
    # Same maths in another op order: float32 rounding of the sums, ~1e-7 of the largest
    # values summed, so the absolute tolerance follows the gradients' overall scale (with a
    # fixed atol=1e-7 a near-zero entry differed by 2e-7 at scale 2.7 in one run of three),
    # and is at least issue 29's 1e-6 (at scale 0.3 an entry differed by 3.1e-7 in one run of
    # six: the plain step's own sums are not in a fixed order on two threads).
    atol = 1e-6 * max(1.0, max(float(np.abs(g).max()) for g in grads_a))
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=atol)


def test_bfloat16_keeps_float32_variables_and_logits_close_to_float32(graphs):
    plain = SegmentClassifier(TINY)
    low = SegmentClassifier(dataclasses.replace(TINY, precision="bfloat16"))
    plain(graphs), low(graphs)
    # Fixed unit-scale weights (N(0, 1/fan_in), biases N(0, 0.5)): logits of order 1 that
    # differ between edges, so a tolerance relative to their scale means something.
    rng = np.random.default_rng(5)
    for v in sorted(plain.trainable_variables, key=lambda v: v.name):
        v.assign(rng.normal(0, 1 / np.sqrt(v.shape[0]) if len(v.shape) == 2 else 0.5, v.shape))
    copy_weights(plain, low)
    assert {v.dtype for v in low.trainable_variables} == {tf.float32}
    for a, b in zip(plain(graphs), low(graphs)):
        assert b.dtype == tf.float32
        a, b = a.numpy(), b.numpy()
        scale = np.abs(a).max()
        assert scale > 0.5 and a.std() > 0.05, a  # not tiny, not one value for every edge
        assert np.abs(b - a).max() > 0, "bfloat16 gave float32's exact logits: not computed in it"
        # bfloat16 keeps 8 significant bits: each rounding is off by at most 2^-8 of the value.
        # A logit comes through about 10 rounded layer outputs (the encoders, 3 steps of edge
        # and node updates, the 2 head layers); at unit-scale weights their errors add up to
        # at most about 10 x 2^-8 = 3.9% of the logits' scale (measured here: at most 0.6%).
        np.testing.assert_allclose(b, a, rtol=0, atol=10 * 2**-8 * scale)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(recompute="yes"), "'model.recompute' must be true or false"),
        (dict(precision="float8"), "'model.precision' must be one of 'float32', 'bfloat16'"),
        (dict(offload=True), "'model.offload' needs model.recompute=true"),
        (dict(recompute=True, chunk_edges=-1), "'model.chunk_edges' must be an integer from 0"),
        (dict(chunk_edges=True), "'model.chunk_edges' must be an integer"),
        (dict(boundary_every=0), "'model.boundary_every' must be an integer >= 1, got 0"),
        (
            dict(keep_edge_term=1),
            "'model.keep_edge_term' must be true or false or 'auto', got int 1",
        ),
        (dict(keep_edge_term=True), "'model.keep_edge_term' needs model.recompute=true and"),
        (
            dict(keep_edge_term=True, recompute=True),
            "'model.keep_edge_term' needs .* model.factorized_edge_update=true",
        ),
    ],
)
def test_bad_switches_are_rejected_naming_the_key(changes, message):
    with pytest.raises(ConfigError, match=message):
        configtools.from_mapping(ModelConfig, changes, where="model")


def test_recompute_in_bfloat16_reads_the_variables_in_bfloat16_in_both_passes(graphs):
    # The backward pass runs the step again outside the forward's variable getter: it must
    # cast the variables the same way (a float32 read into bfloat16 maths fails to build).
    tf.random.set_seed(0)  # the weights: how far bfloat16 lands from float32 depends on them
    config = dataclasses.replace(TINY, layer_norm=True, factorized_edge_update=True)
    labels = tf.constant([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    plain = SegmentClassifier(config)
    plain_low = SegmentClassifier(dataclasses.replace(config, precision="bfloat16"))
    low = SegmentClassifier(
        dataclasses.replace(config, precision="bfloat16", recompute=True, chunk_edges=3)
    )
    plain(graphs), plain_low(graphs), low(graphs)
    copy_weights(plain, plain_low), copy_weights(plain, low)

    def flat(model):
        _, grads = loss_and_gradients(model, graphs, labels, compiled=True)
        assert {g.dtype for g in grads} == {tf.float32}
        return np.concatenate([g.numpy().ravel() for g in grads])

    a, b, c = flat(plain), flat(low), flat(plain_low)
    assert not np.array_equal(a, b)  # computed in bfloat16, not float32

    def cosine(x, y):
        return x @ y / (np.linalg.norm(x) * np.linalg.norm(y))

    # bfloat16 rounds each value to 8 significant bits (and the chunks add in another order
    # than the plain bfloat16 step): the gradient keeps its direction.
    assert cosine(a, b) > 0.99
    assert cosine(b, c) > 0.99


def test_the_chunk_by_threads():
    # model.chunk_edges: 0 -> 2048 rows on one thread, 16384 on more
    assert [auto_chunk_edges(t) for t in (1, 2, 3, 64)] == [2048, 16384, 16384, 16384]
    assert ModelConfig().chunk_edges == 0
    assert 2048 <= auto_chunk_edges() <= 16384  # this process's threads


def test_a_chunk_loop_sums_the_gradients_of_the_variables_its_rows_read_only():
    # Rows [[1], [2], [3]] times a = [[2]], in chunks of 2: b is not read. The rows' gradient
    # for upstream ones is upstream @ a^T = 2 per row, a's is rows^T @ upstream = 6; b's is None
    # (no sum carried through the loop), not zeros.
    a, b = tf.Variable([[2.0]]), tf.Variable([[3.0]])
    rows, upstream = tf.constant([[1.0], [2.0], [3.0]]), tf.ones([3, 1])
    assert [v is a for v in recompute._read_by(lambda r: r @ a, [a, b], rows[:0])] == [True]
    (g_rows,), (g_a, g_b) = recompute._vjp_in_chunks(lambda r: r @ a, [rows], upstream, [a, b], 2)
    assert g_rows.numpy().tolist() == [[2.0], [2.0], [2.0]]
    assert g_a.numpy().tolist() == [[6.0]] and g_b is None


@pytest.mark.parametrize("keep", [True, False])
def test_chunks_run_two_at_a_time_give_the_same_gradients_every_time(keep):
    # Chunk loops let two chunks run at once (two inter-op threads): every sum and buffer a
    # chunk adds to passes through the loop's state, so the bits are the same run after run.
    # A graph of 400 edges in chunks of 7 (58 iterations per loop).
    rng = np.random.default_rng(3)
    nodes, edges = 60, 400
    graphs = gn_graphs.GraphsTuple(
        nodes=tf.constant(rng.normal(size=(nodes, 3)), tf.float32),
        edges=tf.constant(rng.normal(size=(edges, 2)), tf.float32),
        senders=tf.constant(rng.integers(0, nodes, edges), tf.int32),
        receivers=tf.constant(rng.integers(0, nodes, edges), tf.int32),
        n_node=tf.constant([nodes]), n_edge=tf.constant([edges]), globals=None,
    )  # fmt: skip
    labels = tf.constant(rng.integers(0, 2, edges), tf.float32)
    config = dataclasses.replace(TWO_LAYERS, recompute=True, keep_edge_term=keep, chunk_edges=7)
    model = SegmentClassifier(config)
    model(graphs)
    assert tf.config.threading.get_inter_op_parallelism_threads() != 1  # 0: one per core
    runs = [loss_and_gradients(model, graphs, labels, compiled=True) for _ in range(3)]
    for loss, grads in runs[1:]:
        assert float(loss) == float(runs[0][0])
        for a, b in zip(grads, runs[0][1]):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
