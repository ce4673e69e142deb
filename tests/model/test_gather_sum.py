"""The factorized edge update's first layer in one pass: the kernel library's
``HvdtrackGatherSum`` gives the TensorFlow ops (two gathers, ``AddN``, ``Relu``) bit for bit, at
any thread count; ``segments.gather_sum`` uses it on CPU, the ops elsewhere, and both have the
same gradients."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.model import segments as segments_module
from hvdtrack.model.head import pack_bits
from hvdtrack.model.segments import gather_sum

# Ends a hung subprocess; not a speed goal.
HANG_S = 300


def _ops(a, b, r, s, receivers, senders, relu=True):
    out = tf.add_n([a, b, tf.gather(r, receivers), tf.gather(s, senders)])
    return tf.nn.relu(out) if relu else out


def _random_case(rng, edges: int, nodes: int, width: int):
    """Terms of magnitudes 1e-3 to 1e3 (sums that depend on the order of addition)."""

    def terms(rows):
        scale = np.exp(rng.uniform(-7, 7, (rows, 1)))
        return tf.constant((rng.standard_normal((rows, width)) * scale).astype(np.float32))

    indices = [tf.constant(rng.integers(0, nodes, edges).astype(np.int32)) for _ in range(2)]
    return terms(edges), terms(edges), terms(nodes), terms(nodes), *indices


def test_a_hand_made_case(kernels):
    # E=3, N=2, W=2: edge 2 is 2 -> 0; its first column sums to -1 and the ReLU makes it 0
    a = tf.constant([[1.0, 2.0], [0.5, 0.0], [-4.0, 1.0]])
    b = tf.constant([[0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    r = tf.constant([[10.0, 20.0], [1.0, -5.0]])
    s = tf.constant([[100.0, 200.0], [1.0, 1.0], [1.0, 0.0]])
    receivers, senders = tf.constant([0, 1, 0]), tf.constant([1, 0, 2])
    out, mask = kernels.hvdtrack_gather_sum(a, b, r, s, receivers, senders, relu=True)
    np.testing.assert_array_equal(out.numpy(), [[12.0, 24.0], [102.5, 196.0], [8.0, 22.0]])
    np.testing.assert_array_equal(mask.numpy(), [[3], [3], [3]])  # bits 0 and 1: both > 0
    r = tf.constant([[-10.0, 20.0], [1.0, -5.0]])
    out, mask = kernels.hvdtrack_gather_sum(a, b, r, s, receivers, senders, relu=True)
    np.testing.assert_array_equal(out.numpy()[2], [0.0, 22.0])
    np.testing.assert_array_equal(mask.numpy()[2], [2])  # only column 1 passes
    out, mask = kernels.hvdtrack_gather_sum(a, b, r, s, receivers, senders, relu=False)
    np.testing.assert_array_equal(out.numpy()[2], [-12.0, 22.0])
    assert mask.shape == (3, 0)


@pytest.mark.parametrize("relu", [True, False])
def test_equal_to_the_tensorflow_ops_bit_for_bit(kernels, relu):
    case = _random_case(np.random.default_rng(1), 20000, 2500, 37)
    ours, mask = kernels.hvdtrack_gather_sum(*case, relu=relu)
    assert ours.numpy().tobytes() == _ops(*case, relu=relu).numpy().tobytes()
    if relu:  # the mask: pack_bits of out > 0
        np.testing.assert_array_equal(mask.numpy(), pack_bits(ours > 0).numpy())
    # what makes the test able to fail: another order of addition gives other bits
    a, b, r, s, receivers, senders = case
    other = tf.add_n([tf.gather(s, senders), tf.gather(r, receivers), b, a]).numpy()
    assert _ops(*case, relu=False).numpy().tobytes() != other.tobytes()


def test_no_edges(kernels):
    none = tf.zeros([0], tf.int32)
    nodes = tf.ones([3, 2])
    out, mask = kernels.hvdtrack_gather_sum(tf.zeros([0, 2]), tf.zeros([0, 2]), nodes, nodes, none, none, relu=True)  # fmt: skip
    assert out.shape == (0, 2) and mask.shape == (0, 1)


@pytest.mark.parametrize("which, position", [("receivers", 4), ("senders", 5)])
def test_an_index_out_of_range_is_refused_naming_the_edge(kernels, which, position):
    args = [tf.ones([3, 2]), tf.ones([3, 2]), tf.ones([2, 2]), tf.ones([2, 2])]
    indices = [tf.constant([0, 1, 1]), tf.constant([1, 0, 0])]
    indices[position - 4] = tf.constant([0, 2, 1])
    message = rf"{which}\[1\] = 2 is out of range \[0, 2\): edge 1 names no node"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        kernels.hvdtrack_gather_sum(*args, *indices, relu=True)


def test_other_widths_are_refused(kernels):
    indices = [tf.constant([0, 1])] * 2
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be \\[edges, width\\]"):
        kernels.hvdtrack_gather_sum(
            tf.ones([2, 2]), tf.ones([2, 2]), tf.ones([2, 3]), tf.ones([2, 2]), *indices, relu=True
        )


def _value_and_gradients(case, upstream):
    a, b, r, s, receivers, senders = case
    with tf.GradientTape() as tape:
        tape.watch([a, b, r, s])
        out = gather_sum((a, b), (r, s), receivers, senders, relu=True)
        loss = tf.reduce_sum(out * upstream)
    return [out, *tape.gradient(loss, [a, b, r, s])]


def test_gather_sum_with_the_kernel_equals_the_ops_version_and_their_autodiff(monkeypatch):
    rng = np.random.default_rng(2)
    case = _random_case(rng, 600, 50, 6)
    upstream = tf.constant(rng.standard_normal((600, 6)), tf.float32)
    fused = _value_and_gradients(case, upstream)
    monkeypatch.setattr(segments_module, "fused_kernels", lambda: None)
    ops = _value_and_gradients(case, upstream)
    for x, y in zip(fused, ops):
        assert x.numpy().tobytes() == y.numpy().tobytes()
    # TensorFlow's own gradients of the ops (gather: sums in another order, to rounding)
    a, b, r, s, receivers, senders = case
    with tf.GradientTape() as tape:
        tape.watch([a, b, r, s])
        loss = tf.reduce_sum(_ops(a, b, r, s, receivers, senders) * upstream)
    for x, y in zip(fused[1:], tape.gradient(loss, [a, b, r, s])):
        np.testing.assert_allclose(x.numpy(), tf.convert_to_tensor(y).numpy(), rtol=1e-5, atol=1e-3)
    assert np.count_nonzero(fused[1].numpy() == 0) > 100  # the ReLU masked some gradients


def test_the_node_terms_gradient_sums_the_upstream_per_row():
    r = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    s = tf.zeros([3, 2])
    indices = tf.constant([2, 0, 2], tf.int32)
    zeros = tf.zeros([3, 2])
    with tf.GradientTape() as tape:
        tape.watch(r)
        rows = gather_sum((zeros, zeros), (r, s), indices, indices, relu=False)
        loss = tf.reduce_sum(rows * tf.constant([[1.0, 10.0], [100.0, 1000.0], [2.0, 20.0]]))
    np.testing.assert_array_equal(rows.numpy(), [[5.0, 6.0], [1.0, 2.0], [5.0, 6.0]])
    np.testing.assert_array_equal(
        tape.gradient(loss, r).numpy(), [[100.0, 1000.0], [0.0, 0.0], [3.0, 30.0]]
    )


def test_the_node_terms_gradient_has_the_bits_of_tensorflows_gather_gradient(kernels):
    rng = np.random.default_rng(3)
    upstream = tf.constant(rng.standard_normal((20000, 64)) * np.exp(rng.uniform(-7, 7, (20000, 1))), tf.float32)  # fmt: skip
    ids = tf.constant(rng.integers(0, 3000, 20000), tf.int32)
    r = tf.random.stateless_normal([3000, 64], seed=[1, 2])
    zeros = tf.zeros([20000, 64])
    grads = []
    ours = lambda r: gather_sum((zeros, zeros), (r, r), ids, ids, relu=False)  # noqa: E731
    for rows in (ours, lambda r: tf.gather(r, ids)):
        with tf.GradientTape() as tape:
            tape.watch(r)
            loss = tf.reduce_sum(rows(r) * upstream)
        grads.append(tf.convert_to_tensor(tape.gradient(loss, r)).numpy())
    np.testing.assert_array_equal(grads[0], 2 * grads[1])  # r is gathered twice


THREADS_PROGRAM = """
import hashlib, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from hvdtrack.model.kernels import fused_kernels
rng = np.random.default_rng(0)
a, b = (tf.constant(rng.standard_normal((100000, 64)), tf.float32) for _ in range(2))
r, s = (tf.constant(rng.standard_normal((12000, 64)), tf.float32) for _ in range(2))
recv, send = (tf.constant(rng.integers(0, 12000, 100000), tf.int32) for _ in range(2))
out, mask = fused_kernels().hvdtrack_gather_sum(a, b, r, s, recv, send, relu=True)
print(hashlib.sha256(out.numpy().tobytes() + mask.numpy().tobytes()).hexdigest())
"""


def _digests_at_1_2_and_3_threads(program: str) -> list[list[str]]:
    """The digests ``program`` prints, run in a fresh process at 1, 2 and 3 intra-op threads
    (3: the gradient kernel's sums by ranges of rows, an odd number of them)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return [
        subprocess.run(
            [sys.executable, "-c", program, str(threads)],
            capture_output=True, text=True, check=True, env=env, timeout=HANG_S,
        ).stdout.split()[-2:]
        for threads in (1, 2, 3)
    ]  # fmt: skip


def test_the_kernel_gives_the_same_bits_at_one_two_and_three_threads():
    one, two, three = _digests_at_1_2_and_3_threads(THREADS_PROGRAM)
    assert one[-1] == two[-1] == three[-1]


GRAD_PROGRAM = """
import hashlib, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from hvdtrack.model.kernels import fused_kernels
rng = np.random.default_rng(0)
scale = np.exp(rng.uniform(-7, 7, (100000, 1)))
upstream = tf.constant(rng.standard_normal((100000, 64)) * scale, tf.float32)
out = tf.constant(np.maximum(rng.standard_normal((100000, 64)), 0), tf.float32)
recv, send = (tf.constant(rng.integers(0, 12000, 100000), tf.int32) for _ in range(2))
kernels = fused_kernels()
empty = tf.zeros([0, 64])
start_r, start_s = (tf.constant(rng.standard_normal((12000, 64)), tf.float32) for _ in range(2))
for relu in (True, False):
    mask = kernels.hvdtrack_relu_mask(out) if relu else tf.zeros([100000, 0], tf.uint8)
    grads = kernels.hvdtrack_gather_sum_grad(
        upstream, mask, recv, send, 12000, empty, empty, relu=relu
    )
    theirs = [tf.raw_ops.ReluGrad(gradients=upstream, features=out) if relu else upstream]
    theirs += [tf.math.unsorted_segment_sum(theirs[0], ids, 12000) for ids in (recv, send)]
    # onto sums given: HvdtrackSegmentAdd's bits (each row's edges in order onto its value)
    onto = kernels.hvdtrack_gather_sum_grad(
        upstream, mask, recv, send, 12000, start_r, start_s, relu=relu
    )
    theirs += [theirs[0]]
    theirs += [kernels.hvdtrack_segment_add(a, theirs[0], i) for a, i in ((start_r, recv), (start_s, send))]
    grads = [*grads, *onto]
    for ours, want in zip(grads, theirs):
        np.testing.assert_array_equal(ours.numpy(), want.numpy())
    print(hashlib.sha256(b"".join(g.numpy().tobytes() for g in grads)).hexdigest())
"""


def test_the_gradient_kernel_is_relugrad_and_two_segment_sums_bit_for_bit_at_1_2_3_threads():
    # TensorFlow's one-thread sums are the reference (its own kernel's order of addition): run
    # each thread count in a fresh process, each compared with the ops, and with each other.
    one, two, three = _digests_at_1_2_and_3_threads(GRAD_PROGRAM)
    assert one == two == three and len(one) == 2  # relu and not


def test_the_gradient_kernel_by_hand_and_its_errors(kernels):
    upstream = tf.constant([[1.0, -2.0], [3.0, float("nan")], [-5.0, 6.0]])
    mask = kernels.hvdtrack_relu_mask(tf.constant([[0.5, 0.0], [1.0, 2.0], [0.0, 0.0]]))
    recv, send = tf.constant([1, 0, 1]), tf.constant([0, 0, 2])
    empty = tf.zeros([0, 2])
    grad, d_r, d_s = kernels.hvdtrack_gather_sum_grad(
        upstream, mask, recv, send, 3, empty, empty, relu=True
    )
    expected = np.array([[1.0, -0.0], [3.0, np.nan], [-0.0, 0.0]], np.float32)
    np.testing.assert_array_equal(grad.numpy(), expected)
    assert np.signbit(grad.numpy()[0, 1]) and np.signbit(grad.numpy()[2, 0])  # -2 * 0, -5 * 0
    np.testing.assert_array_equal(d_r.numpy(), [[3.0, np.nan], [1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(d_s.numpy(), [[4.0, np.nan], [0.0, 0.0], [0.0, 0.0]])
    # onto sums given: the same rows added to them
    start = tf.constant([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]])
    _, d_r, d_s = kernels.hvdtrack_gather_sum_grad(
        upstream, mask, recv, send, 3, start, start, relu=True
    )
    np.testing.assert_array_equal(d_r.numpy(), [[13.0, np.nan], [31.0, 40.0], [50.0, 60.0]])
    np.testing.assert_array_equal(d_s.numpy(), [[14.0, np.nan], [30.0, 40.0], [50.0, 60.0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"senders: segment_ids\[2\] = 2 "):
        kernels.hvdtrack_gather_sum_grad(upstream, mask, recv, send, 2, empty, empty, relu=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"mask \[edges, 1\], got"):
        kernels.hvdtrack_gather_sum_grad(upstream, mask[:2], recv, send, 3, empty, empty, relu=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sender_sums_in must be \[num_"):
        kernels.hvdtrack_gather_sum_grad(upstream, mask, recv, send, 3, start, start[:2], relu=True)


@pytest.mark.parametrize("with_kernels", [True, False])
@pytest.mark.parametrize("onto_sums", [False, True])
def test_without_node_gradients_the_node_terms_get_none_and_the_edges_theirs(
    monkeypatch, with_kernels, onto_sums
):
    # False: a pass that takes no gradient of the node terms; a NodeGradients: recompute's
    # chunks, whose node terms' gradients go onto the loop's sums instead
    rng = np.random.default_rng(8)
    a, b, r, s, receivers, senders = _random_case(rng, 300, 40, 8)
    start_r, start_s = (tf.constant(rng.standard_normal((40, 8)), tf.float32) for _ in range(2))
    if not with_kernels:
        monkeypatch.setattr(segments_module, "fused_kernels", lambda: None)
    onto = segments_module.NodeGradients(start_r, start_s) if onto_sums else False
    grads = []
    for node_gradients in (True, onto):
        with tf.GradientTape() as tape:
            tape.watch([a, b, r, s])
            out = gather_sum((a, b), (r, s), receivers, senders, True, node_gradients)
            loss = tf.reduce_sum(out * out)
        grads.append(tape.gradient(loss, [a, b, r, s]))
    assert grads[1][2] is None and grads[1][3] is None
    for with_nodes, without in zip(grads[0][:2], grads[1][:2]):
        np.testing.assert_array_equal(with_nodes.numpy(), without.numpy())
    if onto_sums:
        for sums, start, whole in (
            (onto.receiver, start_r, grads[0][2]),
            (onto.sender, start_s, grads[0][3]),
        ):
            np.testing.assert_allclose(
                sums.numpy(), start.numpy() + whole.numpy(), rtol=1e-5, atol=1e-3
            )
