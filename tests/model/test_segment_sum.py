"""The segment sum of the node update: the kernel library's ``HvdtrackSegmentSum`` gives
TensorFlow's ``unsorted_segment_sum`` bit for bit, at any thread count; ``segments.segment_sum``
uses it on CPU and TensorFlow ops elsewhere (``plain_ops``, ``HVDTRACK_FUSED_OPS=0``)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.model import segments as segments_module
from hvdtrack.model.kernels import plain_ops
from hvdtrack.model.segments import segment_add, segment_sum

# Ends a hung subprocess; not a speed goal (one takes 10-20 s on a loaded 2-core machine, more
# when it must first compile the library into a fresh cache).
HANG_S = 300


def _random_case(rng, edges: int, segments: int, width: int):
    """Values of magnitudes from 1e-3 to 1e3 (sums that depend on the order of addition) and
    ids that leave some segments empty."""
    scale = np.exp(rng.uniform(-7, 7, (edges, 1)))
    values = (rng.standard_normal((edges, width)) * scale).astype(np.float32)
    ids = rng.integers(0, segments - segments // 10, edges).astype(np.int32)
    return tf.constant(values), tf.constant(ids)


def test_a_hand_made_case(kernels):
    # E=5, N=3, W=2: node 1 receives nothing; node 2 receives edges 0, 2 and 4
    values = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [0.5, -0.25]])
    ids = tf.constant([2, 0, 2, 0, 2])
    sums = kernels.hvdtrack_segment_sum(values, ids, 3)
    np.testing.assert_array_equal(sums.numpy(), [[10.0, 12.0], [0.0, 0.0], [6.5, 7.75]])


def test_no_edges_and_no_segments(kernels):
    none = tf.zeros([0], tf.int32)
    np.testing.assert_array_equal(kernels.hvdtrack_segment_sum(tf.zeros([0, 2]), none, 3), 0)
    assert kernels.hvdtrack_segment_sum(tf.zeros([0, 2]), none, 3).shape == (3, 2)
    assert kernels.hvdtrack_segment_sum(tf.zeros([0, 2]), none, 0).shape == (0, 2)


def test_equal_to_tensorflow_bit_for_bit_over_many_blocks(kernels):
    # 3,000 segments: 11 blocks of 256 and a ragged one; a width that is no multiple of 8
    values, ids = _random_case(np.random.default_rng(1), 30000, 3000, 37)
    ours = kernels.hvdtrack_segment_sum(values, ids, 3000).numpy()
    theirs = tf.math.unsorted_segment_sum(values, ids, 3000).numpy()
    assert ours.tobytes() == theirs.tobytes()
    reference = tf.math.unsorted_segment_sum(tf.cast(values, tf.float64), ids, 3000).numpy()
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-3)


def test_the_data_would_show_another_order_of_addition(kernels):
    """What makes the bit-for-bit tests able to fail: the same edges added last to first give
    other sums."""
    values, ids = _random_case(np.random.default_rng(1), 30000, 3000, 37)
    forward = kernels.hvdtrack_segment_sum(values, ids, 3000).numpy()
    backward = kernels.hvdtrack_segment_sum(values[::-1], ids[::-1], 3000).numpy()
    assert forward.tobytes() != backward.tobytes()


def test_a_negative_zero_sums_to_zero_as_in_tensorflow(kernels):
    # TensorFlow adds to zeros: 0.0 + -0.0 is +0.0
    values, ids = tf.constant([[-0.0, 1.0]]), tf.constant([1])
    ours = kernels.hvdtrack_segment_sum(values, ids, 2).numpy()
    assert ours.tobytes() == tf.math.unsorted_segment_sum(values, ids, 2).numpy().tobytes()
    assert not np.signbit(ours[1, 0])


@pytest.mark.parametrize("bad_id", [3, -1])
def test_an_id_out_of_range_is_refused_naming_the_edge(kernels, bad_id):
    values, ids = tf.ones([4, 2]), tf.constant([0, 2, bad_id, 1])
    message = rf"segment_ids\[2\] = {bad_id} is out of range \[0, 3\): edge 2 names no segment"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        kernels.hvdtrack_segment_sum(values, ids, 3)


def test_the_shape_function_checks_ranks_and_edge_counts(kernels):
    def output_shape(values, ids, count=None):
        count = tf.TensorSpec([], tf.int32) if count is None else count
        summed = tf.function(kernels.hvdtrack_segment_sum)
        return summed.get_concrete_function(values, ids, count).output_shapes.as_list()

    ids = tf.TensorSpec([None], tf.int32)
    assert output_shape(tf.TensorSpec([None, 5]), ids) == [None, 5]
    assert output_shape(tf.TensorSpec([None, 5]), ids, 4) == [4, 5]
    with pytest.raises(ValueError, match="Dimensions must be equal, but are 3 and 2"):
        output_shape(tf.TensorSpec([3, 5]), tf.TensorSpec([2], tf.int32))
    with pytest.raises(ValueError, match="must be rank 2 but is rank 1"):
        output_shape(tf.TensorSpec([3]), tf.TensorSpec([3], tf.int32))
    with pytest.raises(ValueError, match="must be rank 0 but is rank 1"):
        output_shape(tf.TensorSpec([3, 5]), tf.TensorSpec([3], tf.int32), [4])


THREADS_PROGRAM = """
import hashlib, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from hvdtrack.model.kernels import fused_kernels
rng = np.random.default_rng(0)
values = tf.constant(rng.standard_normal((100000, 64)) * np.exp(rng.uniform(-7, 7, (100000, 1))),
                     tf.float32)
ids = tf.constant(rng.integers(0, 11000, 100000), tf.int32)  # 12,000 nodes, 1,000 unreached
start = tf.constant(rng.standard_normal((12000, 64)), tf.float32)
added = fused_kernels().hvdtrack_segment_add(start, values, ids)
# two thirds of the edges in row 5, most others in 40 rows, a few in the last: the threads'
# ranges of very different lengths, one empty at 3 threads
skewed = tf.constant(np.select([rng.random(100000) < 2 / 3, rng.random(100000) < 0.999],
                               [5, rng.integers(0, 40, 100000)], 11999), tf.int32)

def summed(ids):  # likely into the block just freed, of nonzeros: rows left unwritten show
    junk = tf.fill([12000, 64], 7.0)
    del junk
    return fused_kernels().hvdtrack_segment_sum(values, ids, 12000)

for sums in (summed(ids), tf.math.unsorted_segment_sum(values, ids, 12000), added,
             summed(skewed), tf.math.unsorted_segment_sum(values, skewed, 12000)):
    print(hashlib.sha256(sums.numpy().tobytes()).hexdigest())
"""


def test_the_kernel_at_one_two_and_three_threads_equals_tensorflows_one_thread_kernel():
    """Exact resumes need the same sums at any thread count; TensorFlow's kernel adds each
    segment's rows in edge order on one thread, as ours does on any."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    digests = {}
    for threads in (1, 2, 3):  # the kernel's parts: one, two, and an odd number of ranges
        done = subprocess.run(
            [sys.executable, "-c", THREADS_PROGRAM, str(threads)],
            capture_output=True, text=True, check=True, env=env, timeout=HANG_S,
        )  # fmt: skip
        # ours, TensorFlow's, ours added; ours and TensorFlow's on the skewed ids
        digests[threads] = done.stdout.split()[-5:]
    assert digests[1][0] == digests[1][1] and digests[1][3] == digests[1][4]
    for threads in (2, 3):
        assert digests[threads][0] == digests[1][0]
        assert digests[threads][2] == digests[1][2]  # HvdtrackSegmentAdd too
        assert digests[threads][3] == digests[1][3]


def test_segment_add_adds_each_rows_edges_in_order_onto_the_old_value(kernels):
    # N=3, W=2: row 1 receives nothing and keeps its value; row 2 gets edges 0, 2 and 4
    start = tf.constant([[1.0, -1.0], [2.0, 3.0], [1e8, 0.0]])
    values = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [-1e8, -0.25]])
    ids = tf.constant([2, 0, 2, 0, 2])
    added = kernels.hvdtrack_segment_add(start, values, ids).numpy()
    # (1e8 + 1 + 5) - 1e8 in float32 is 8 (1e8 + 1 rounds to 1e8, + 5 to 100000008): the old
    # value first, then the edges in order; summing the edges first would give 6.
    np.testing.assert_array_equal(added, [[11.0, 11.0], [2.0, 3.0], [8.0, 7.75]])
    np.testing.assert_array_equal(start.numpy()[2], [1e8, 0.0])  # an eager input stays as it was


def test_runs_of_edges_summed_onto_the_runs_before_give_the_bits_of_one_sum(kernels):
    """segment_sum's onto: a batch's edges cut in runs (model.edge_runs) sum to the same bits
    wherever the cuts fall; the gradient reaches the values and the earlier sums."""
    rng = np.random.default_rng(3)
    values, ids = _random_case(rng, 3000, 300, 37)
    weights = rng.standard_normal((300, 37)).astype(np.float32)
    whole = segment_sum(values, ids, 300).numpy()
    for cuts in ([0, 1500, 3000], [0, 7, 2999, 3000], [0, 0, 1000, 2000, 3000]):
        with tf.GradientTape() as tape:
            tape.watch(values)
            sums = None
            for a, b in zip(cuts, cuts[1:]):
                sums = segment_sum(values[a:b], ids[a:b], 300, onto=sums)
            loss = tf.reduce_sum(sums * weights)
        assert sums.numpy().tobytes() == whole.tobytes(), cuts
        # d loss / d values[e] = weights[ids[e]]: each edge's own node's row
        np.testing.assert_array_equal(tape.gradient(loss, values).numpy(), weights[ids.numpy()])
    # summing the runs' own sums instead is another order of addition: other bits
    halves = segment_sum(values[:1500], ids[:1500], 300) + segment_sum(
        values[1500:], ids[1500:], 300
    )
    assert halves.numpy().tobytes() != whole.tobytes()


def test_segment_add_refuses_an_id_out_of_range_and_another_width(kernels):
    message = r"HvdtrackSegmentAdd: segment_ids\[1\] = 3 is out of range \[0, 3\): edge 1"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        kernels.hvdtrack_segment_add(tf.zeros([3, 2]), tf.ones([2, 2]), tf.constant([0, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="must have one width"):
        kernels.hvdtrack_segment_add(tf.zeros([3, 2]), tf.ones([2, 4]), tf.constant([0, 1]))


def test_segment_add_in_a_loop_equals_the_tensorflow_ops_version(monkeypatch):
    """Chunks of edges added into one accumulator in a compiled while loop (as the recompute
    backward pass does): the kernel and the TensorFlow-ops fallback agree with one sum."""
    rng = np.random.default_rng(3)
    values, ids = _random_case(rng, 1000, 50, 5)
    values = tf.round(values * 64) / 64  # sums exact in any order: both ways give the same bits

    @tf.function
    def chunked(values, ids):
        def body(i, acc):
            return i + 1, segment_add(
                acc, values[i * 300 : (i + 1) * 300], ids[i * 300 : (i + 1) * 300]
            )

        return tf.while_loop(lambda i, _: i < 4, body, (0, tf.zeros([50, 5])))[1]

    fused = chunked(values, ids).numpy()
    monkeypatch.setattr(segments_module, "fused_kernels", lambda: None)
    ops = tf.function(chunked.python_function)(values, ids).numpy()
    np.testing.assert_array_equal(fused, tf.math.unsorted_segment_sum(values, ids, 50).numpy())
    np.testing.assert_array_equal(ops, fused)


def _value_and_gradient(values, ids, upstream):
    with tf.GradientTape() as tape:
        tape.watch(values)
        sums = segment_sum(values, ids, 40)
        loss = tf.reduce_sum(sums * upstream)
    return sums, tape.gradient(loss, values)


def test_segment_sum_with_the_kernel_equals_the_tensorflow_ops_version(monkeypatch):
    rng = np.random.default_rng(2)
    values, ids = _random_case(rng, 500, 40, 6)
    upstream = tf.constant(rng.standard_normal((40, 6)), tf.float32)
    fused = _value_and_gradient(values, ids, upstream)
    monkeypatch.setattr(segments_module, "fused_kernels", lambda: None)
    ops = _value_and_gradient(values, ids, upstream)
    for a, b in zip(fused, ops):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    # d(sum_n upstream[n] . sums[n]) / d values[e] = upstream[ids[e]]
    np.testing.assert_array_equal(fused[1].numpy(), tf.gather(upstream, ids).numpy())


def _op_types(fn, *specs) -> set[str]:
    graph_def = fn.get_concrete_function(*specs).graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return {n.op for n in nodes}


def test_traced_under_plain_ops_it_is_tensorflows_op():
    """What lets an export load without the library (hvdtrack.export traces so)."""
    specs = (tf.TensorSpec([None, 4]), tf.TensorSpec([None], tf.int32))
    summed = tf.function(lambda values, ids: segment_sum(values, ids, 10))
    assert "HvdtrackSegmentSum" in _op_types(summed, *specs)
    with plain_ops():
        plain = _op_types(tf.function(lambda values, ids: segment_sum(values, ids, 10)), *specs)
    assert "UnsortedSegmentSum" in plain and not any(op.startswith("Hvdtrack") for op in plain)


def test_other_dtypes_use_tensorflows_op():
    values, ids = tf.constant([[1.0], [2.0]], tf.bfloat16), tf.constant([1, 1])
    ops = _op_types(tf.function(lambda: segment_sum(values, ids, 2)))
    assert "UnsortedSegmentSum" in ops and "HvdtrackSegmentSum" not in ops
    np.testing.assert_array_equal(segment_sum(values, ids, 2).numpy(), [[0.0], [3.0]])


MODEL_PROGRAM = """
import sys
import numpy as np, tensorflow as tf
from graph_nets import utils_tf
from hvdtrack.model.classifier import SegmentClassifier
from hvdtrack.model.config import ModelConfig
from hvdtrack.model.kernels import fused_kernels
rng = np.random.default_rng(11)
nodes, edges = 300, 2400
graph = utils_tf.data_dicts_to_graphs_tuple([dict(
    nodes=rng.standard_normal((nodes, 3)).astype(np.float32),
    edges=rng.standard_normal((edges, 4)).astype(np.float32),
    senders=rng.integers(0, nodes, edges).astype(np.int32),
    receivers=rng.integers(0, nodes, edges).astype(np.int32),
    globals=np.zeros(1, np.float32))])
config = ModelConfig(node_encoder=(32,), edge_encoder=(32,), edge_update=(32,),
                     node_update=(32,), output_head=(16,), num_message_passing_steps=3,
                     layer_norm=True, factorized_edge_update=True)
model = SegmentClassifier(config)
model(graph)
variables = sorted(model.trainable_variables, key=lambda v: v.name)
for v in variables:
    v.assign(rng.standard_normal(v.shape).astype(np.float32) * 0.3)
with tf.GradientTape() as tape:
    logits = model(graph)
    loss = tf.add_n([tf.reduce_sum(tf.sin(x)) for x in logits])
grads = tape.gradient(loss, variables)
arrays = {f"logits{i}": x.numpy() for i, x in enumerate(logits)}
arrays.update({f"grad{i}": g.numpy() for i, g in enumerate(grads)})
np.savez(sys.argv[1], fused=fused_kernels() is not None, **arrays)
"""


def test_the_model_agrees_with_and_without_the_kernel_library(tmp_path):
    """Forward and backward of a classifier (layer norms and segment sums) with the library and
    with HVDTRACK_FUSED_OPS=0: the same to float32 rounding (the layer norms round
    differently)."""
    results = {}
    for setting in ("1", "0"):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", HVDTRACK_FUSED_OPS=setting)
        path = tmp_path / f"fused{setting}.npz"
        subprocess.run(
            [sys.executable, "-c", MODEL_PROGRAM, str(path)],
            capture_output=True, text=True, check=True, env=env, timeout=HANG_S,
        )  # fmt: skip
        results[setting] = dict(np.load(path))
    fused, ops = results["1"], results["0"]
    assert fused.pop("fused") and not ops.pop("fused")
    assert sorted(fused) == sorted(ops) and len(fused) > 10
    for key in fused:
        np.testing.assert_allclose(fused[key], ops[key], rtol=1e-4, atol=2e-5, err_msg=key)
