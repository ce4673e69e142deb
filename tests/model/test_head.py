"""The output head's backward pass from its input and the ReLU's bits (``hvdtrack.model.head``)
gives TensorFlow's own gradients, with the kernel library and with TensorFlow ops."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.model import head as head_module
from hvdtrack.model.head import lean_head, pack_bits, unpack_bits
from hvdtrack.model.kernels import fused_kernels, vector_code
from tests.model.conftest import digests_on_every_isa

needs_kernels = pytest.mark.skipif(fused_kernels() is None, reason="no kernel library here")


# "kernels": HvdtrackHead where this CPU has vector code; "no vector code": the library's
# other kernels after TensorFlow's forward product (a CPU without AVX2); "ops": none of them
@pytest.fixture(params=["kernels", "no vector code", "ops"])
def implementation(request, monkeypatch):
    if request.param == "ops":
        monkeypatch.setattr(head_module, "fused_kernels", lambda: None)
    if request.param != "kernels":
        monkeypatch.setattr(head_module, "in_one_kernel", lambda dtype: False)
    return request.param


def test_bits_by_hand():
    mask = tf.constant([[False, True, False, True, False, True, True, True, True]])
    # columns 1, 3, 5, 6, 7 in the first byte (2 + 8 + 32 + 64 + 128), column 8 in the second
    np.testing.assert_array_equal(pack_bits(mask).numpy(), [[234, 1]])
    np.testing.assert_array_equal(unpack_bits(pack_bits(mask), 9).numpy(), mask.numpy())
    x = tf.where(mask, 1.5, -0.5)
    np.testing.assert_array_equal(fused_kernels().hvdtrack_relu_mask(x).numpy(), [[234, 1]])


def test_the_kernels_pack_and_spread_the_bits_as_the_ops_do():
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((3000, 20)), tf.float32)
    kernels = fused_kernels()
    bits = kernels.hvdtrack_relu_mask(x)
    np.testing.assert_array_equal(bits.numpy(), pack_bits(x > 0).numpy())
    column = tf.constant(rng.standard_normal((3000, 1)), tf.float32)
    out, sums = kernels.hvdtrack_masked_column(bits, column, width=20)
    expected = np.where(x.numpy() > 0, column.numpy(), 0)
    np.testing.assert_array_equal(out.numpy(), expected)
    # the column sums in float64 against blocks of rows added in float32: a few ulps of the rows
    np.testing.assert_allclose(sums.numpy(), expected.sum(axis=0, dtype=np.float64), atol=2e-4)


def _weights(rng, width_in=16, hidden=12):
    return [
        tf.constant(rng.standard_normal(shape) * 0.3, tf.float32)
        for shape in ((width_in, hidden), (hidden,), (hidden, 1), (1,))
    ]


@pytest.mark.parametrize("wait", [False, True])
def test_gradients_equal_tensorflows_own(implementation, wait):
    rng = np.random.default_rng(2)
    edges = tf.constant(rng.standard_normal((500, 16)), tf.float32)
    weights = _weights(rng)
    upstream = tf.constant(rng.standard_normal((500, 1)), tf.float32)
    later = tf.constant(rng.standard_normal((500, 16)), tf.float32)  # a later step's use

    def loss(head):
        with tf.GradientTape() as tape:
            tape.watch([edges, *weights])
            passed, logits = head(edges, *weights)
            total = tf.reduce_sum(logits * upstream) + tf.reduce_sum(passed * later)
        return [logits, *tape.gradient(total, [edges, *weights])]

    def tensorflows(edges, w1, b1, w2, b2):
        return edges, tf.nn.relu(edges @ w1 + b1) @ w2 + b2

    ours = loss(lambda *args: lean_head(*args, wait=wait))
    theirs = loss(tensorflows)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


def test_the_backward_pass_waits_for_the_later_steps_gradient():
    # In a compiled function the head's products run only after the pass-through's gradient
    # exists: that gradient's op is among the control inputs of the head's backward pass.
    rng = np.random.default_rng(3)
    edges = tf.constant(rng.standard_normal((50, 16)), tf.float32)
    weights = _weights(rng)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(edges)
            passed, logits = lean_head(edges, *weights, wait=True)
            total = tf.reduce_sum(logits) + tf.reduce_sum(tf.identity(passed, name="later") ** 2)
        return tape.gradient(total, edges)

    graph = step.get_concrete_function().graph
    waiting = [op for op in graph.get_operations() if op.control_inputs]
    assert any(
        any("later" in inp.name or "pow" in inp.name.lower() for inp in op.control_inputs)
        for op in waiting
    ), [(op.name, [i.name for i in op.control_inputs]) for op in waiting]


def test_the_node_sums_join_the_heads_gradient(implementation, monkeypatch):
    if implementation == "ops":
        from hvdtrack.model import segments

        monkeypatch.setattr(segments, "fused_kernels", lambda: None)
    rng = np.random.default_rng(4)
    edges = tf.constant(rng.standard_normal((400, 16)), tf.float32)
    weights = _weights(rng)
    receivers = tf.constant(rng.integers(0, 60, 400), tf.int32)
    senders = tf.constant(rng.integers(0, 60, 400), tf.int32)
    upstream = [
        tf.constant(rng.standard_normal(shape), tf.float32)
        for shape in ((400, 16), (400, 1), (60, 16), (60, 16))
    ]

    def loss(head):
        with tf.GradientTape() as tape:
            tape.watch([edges, *weights])
            outputs = head(edges, *weights)
            total = sum(tf.reduce_sum(x * u) for x, u in zip(outputs, upstream))
        return [*outputs, *tape.gradient(total, [edges, *weights])]

    def tensorflows(edges, w1, b1, w2, b2):
        logits = tf.nn.relu(edges @ w1 + b1) @ w2 + b2
        sums = [tf.math.unsorted_segment_sum(edges, ids, 60) for ids in (receivers, senders)]
        return edges, logits, *sums

    ours = loss(lambda *args: lean_head(*args, wait=True, sums=(receivers, senders, 60)))
    theirs = loss(tensorflows)
    assert len(ours) == len(theirs) == 9
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="sums need wait=True"):
        lean_head(edges, *weights, wait=False, sums=(receivers, senders, 60))
    with pytest.raises(ValueError, match="onto needs sums"):
        lean_head(edges, *weights, wait=True, onto=ours[2:4])


@needs_kernels
def test_the_head_kernel_by_hand():
    edges = tf.constant([[1.0, 2.0], [-1.0, 0.0], [0.0, 0.0]])
    w1 = tf.constant([[1.0, -1.0, 0.5], [0.25, 1.0, -2.0]])
    b1, w2, b2 = tf.constant([0.0, 0.5, 1.0]), tf.constant([[2.0], [-1.0], [4.0]]), [0.25]
    # pre-activations [1.5, 1.5, -2.5], [-1, 1.5, 0.5] and b1 itself (0 is not > 0)
    logits, bits = fused_kernels().hvdtrack_head(edges, w1, b1, w2, b2)
    np.testing.assert_array_equal(logits.numpy(), [[1.75], [0.75], [3.75]])
    np.testing.assert_array_equal(bits.numpy(), [[0b011], [0b110], [0b110]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"b1, w2 and b2 must be \[3\]"):
        fused_kernels().hvdtrack_head(edges, w1, b1, tf.constant([[2.0], [-1.0]]), b2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="edges and w1 must be"):
        fused_kernels().hvdtrack_head(edges, tf.transpose(w1), b1, w2, b2)


# widths: the model's (64 -> 64), whole and partial vectors and tiles, a partial byte, one unit
@pytest.mark.parametrize("rows, width_in, hidden", [(1003, 64, 64), (37, 7, 70), (9, 16, 5),
                                                    (6, 3, 1), (0, 4, 8)])  # fmt: skip
@needs_kernels
def test_the_head_kernel_is_tensorflows_head(rows, width_in, hidden):
    rng = np.random.default_rng(5)
    edges = tf.constant(rng.standard_normal((rows, width_in)), tf.float32)
    w1, b1, w2, b2 = _weights(rng, width_in, hidden)
    logits, bits = fused_kernels().hvdtrack_head(edges, w1, b1, w2, b2)
    pre = (edges @ w1 + b1).numpy()
    expected = tf.nn.relu(pre).numpy() @ w2.numpy() + b2.numpy()
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert bits.shape == (rows, (hidden + 7) // 8)
    # the bits of units whose pre-activation is not within rounding of 0
    clear = np.abs(pre) > 1e-4
    np.testing.assert_array_equal(unpack_bits(bits, hidden).numpy()[clear], (pre > 0)[clear])


HEAD_PROGRAM = """
import hashlib, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from hvdtrack.model.kernels import fused_kernels
kernels, digest = fused_kernels(), hashlib.sha256()
rng = np.random.default_rng(6)
# every tile and tail of both ISAs' code (4, 3, 2 and 1 rows; whole and partial vectors and
# tiles); values over 6 orders of magnitude; an inf and a NaN
for rows, l, h in ((1002, 64, 64), (37, 7, 70), (101, 64, 100), (7, 16, 5), (5, 0, 8), (5, 4, 0)):
    shapes = ((rows, l), (l, h), (h,), (h, 1), (1,))
    parts = [rng.standard_normal(s) * np.exp(rng.uniform(-7, 7, s)) for s in shapes]
    if rows == 1002:
        parts[0][0, 0], parts[0][1, 1] = np.inf, np.nan
    logits, bits = kernels.hvdtrack_head(*[tf.constant(p, tf.float32) for p in parts])
    logits = logits.numpy()
    logits[np.isnan(logits)] = np.nan  # one NaN: which NaN's payload survives is no result
    digest.update(logits.tobytes() + bits.numpy().tobytes())
print(kernels.hvdtrack_kernel_isa().numpy().decode(), digest.hexdigest())
"""


@needs_kernels
def test_the_head_kernel_gives_the_same_bits_on_every_isa_and_thread_count():
    runs = digests_on_every_isa(HEAD_PROGRAM)
    assert len({digest for _, digest in runs}) == 1, runs


@pytest.mark.skipif(not vector_code(), reason="lean_head takes TensorFlow's ops here")
def test_the_step_takes_the_head_in_one_kernel():
    rng = np.random.default_rng(7)
    weights = _weights(rng)
    spec = tf.TensorSpec([None, 16], tf.float32)
    graph = tf.function(lambda e: lean_head(e, *weights, wait=False)).get_concrete_function(spec)
    types = {op.type for op in graph.graph.get_operations()}
    assert "HvdtrackHead" in types and "HvdtrackReluMask" not in types, types
