"""The model's LayerNorm is Sonnet's LayerNorm: same variables, values and gradients, whether the
fused CPU kernel (``layer_norm.cc``) or the TensorFlow-ops version runs. The kernel library's
build and loading: test_kernels.py."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

from hvdtrack.model import norm as norm_module
from hvdtrack.model.norm import LayerNorm
from tests.model.conftest import digests_on_every_isa


@pytest.fixture(params=["fused", "ops"])
def implementation(request, monkeypatch):
    if request.param == "ops":
        monkeypatch.setattr(norm_module, "fused_kernels", lambda: None)
    return request.param


def _values_and_gradients(norm, x, upstream):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(norm(x) * upstream)
    return [norm(x), *tape.gradient(loss, [x, norm.scale, norm.offset])]


def test_values_and_gradients_equal_sonnets(implementation):
    rng = np.random.default_rng(3)
    x = tf.constant(rng.standard_normal((50, 6)) * 3 + 1, tf.float32)
    upstream = tf.constant(rng.standard_normal((50, 6)), tf.float32)
    ours, theirs = LayerNorm(), snt.LayerNorm(axis=-1, create_scale=True, create_offset=True)
    ours(x), theirs(x)
    for a, b in zip((ours.scale, ours.offset), (theirs.scale, theirs.offset)):
        a.assign(rng.standard_normal(6)), b.assign(a)
    for a, b in zip(*(_values_and_gradients(n, x, upstream) for n in (ours, theirs))):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
    assert [v.name for v in ours.trainable_variables] == [
        v.name for v in theirs.trainable_variables
    ]


def test_a_constant_row_becomes_the_offset(implementation):
    norm = LayerNorm()
    y = norm(tf.fill([2, 4], 7.0))
    np.testing.assert_array_equal(y.numpy(), np.zeros((2, 4), np.float32))


def test_one_hand_made_row(implementation):
    # mean 2.5, variance 1.25: y = (x - 2.5) / sqrt(1.25 + 1e-5); d loss / d x for loss = y[0]
    norm = LayerNorm()
    x = tf.constant([[1.0, 2.0, 3.0, 4.0]])
    y, dx, d_scale, d_offset = _values_and_gradients(norm, x, tf.constant([[1.0, 0, 0, 0]]))
    np.testing.assert_allclose(y.numpy(), [[-1.341635, -0.447212, 0.447212, 1.341635]], rtol=1e-5)
    # dx_j = rstd (delta_0j - 1/4 - y_0 y_j / 4) = rstd [0.3, -0.4, -0.1, 0.2]
    np.testing.assert_allclose(dx.numpy(), [[0.268328, -0.357769, -0.089442, 0.178885]], atol=1e-5)
    np.testing.assert_allclose(d_scale.numpy(), [-1.341635, 0, 0, 0], rtol=1e-5)
    np.testing.assert_array_equal(d_offset.numpy(), [1, 0, 0, 0])


def test_fused_equals_ops_over_several_blocks_of_rows(monkeypatch):
    # 2,500 rows: two whole blocks of 1,024 and a ragged one; wide rows, random scale and offset
    rng = np.random.default_rng(5)
    x = tf.constant(rng.standard_normal((2500, 64)) * 4 - 2, tf.float32)
    upstream = tf.constant(rng.standard_normal((2500, 64)), tf.float32)
    norm = LayerNorm()
    norm(x)
    norm.scale.assign(rng.standard_normal(64)), norm.offset.assign(rng.standard_normal(64))
    fused = _values_and_gradients(norm, x, upstream)
    monkeypatch.setattr(norm_module, "fused_kernels", lambda: None)
    ops = _values_and_gradients(norm, x, upstream)
    for a, b in zip(fused, ops):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=2e-5)


# Ends a hung subprocess; not a speed goal. One takes 12-15 s on a loaded 2-core machine, up
# to ~40 s when it must first compile the kernel (a fresh cache): 300 s leaves room for one 3x
# slower.
HANG_S = 300

THREADS_PROGRAM = """
import hashlib, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from hvdtrack.model.kernels import fused_kernels
kernels = fused_kernels()
rng = np.random.default_rng(0)
x, dy = (tf.constant(rng.standard_normal((50000, 64)), tf.float32) for _ in range(2))
scale = tf.constant(1 + 0.2 * rng.standard_normal(64), tf.float32)
offset = tf.constant(0.5 * rng.standard_normal(64), tf.float32)
none = tf.zeros([0, 64])
out = []
for relu in (False, True):
    y, mean, rstd, kept, mask = kernels.hvdtrack_layer_norm(
        x, scale, offset, epsilon=1e-5, relu=relu
    )
    assert kept.shape[0] == 0
    out += [y, tf.cast(mask, tf.float32)]
    for source, output in ((x, none), (none, y)):  # the backward pass from x and from y
        out += kernels.hvdtrack_layer_norm_grad(
            dy, source, output, mask, scale, offset, mean, rstd, relu=relu
        )
print(hashlib.sha256(b"".join(t.numpy().tobytes() for t in out)).hexdigest())
"""


def _fused_op_gradients(x, upstream, scale, offset, relu=False):
    """The kernels' outputs and the three gradients, through the op pair as the model runs it."""
    kernels = norm_module.fused_kernels()
    y, mean, rstd, kept, mask = kernels.hvdtrack_layer_norm(
        x, scale, offset, epsilon=1e-5, relu=relu
    )
    grads = kernels.hvdtrack_layer_norm_grad(
        upstream, kept, y, mask, scale, offset, mean, rstd, relu=relu
    )
    return y, kept, grads


def _ops_values_and_gradients(x, upstream, scale_values, offset_values, relu):
    """Sonnet's LayerNorm (of ``tf.nn.relu(x)`` with relu): values and gradients."""
    norm = snt.LayerNorm(axis=-1, create_scale=True, create_offset=True)
    activate = tf.nn.relu if relu else tf.identity
    norm(x)
    norm.scale.assign(scale_values), norm.offset.assign(offset_values)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = norm(activate(x))
        loss = tf.reduce_sum(y * upstream)
    return [y, *tape.gradient(loss, [x, norm.scale, norm.offset])]


@pytest.mark.parametrize("relu", [False, True])
def test_backward_pass_from_the_output_keeps_no_copy_and_gives_the_gradients_from_x(relu):
    # Scale near 1, offsets up to a few times it: y gives the normalised input back.
    rng = np.random.default_rng(7)
    x = tf.constant(rng.standard_normal((3000, 64)) * 4 - 1, tf.float32)
    upstream = tf.constant(rng.standard_normal((3000, 64)), tf.float32)
    scale = tf.constant(1 + 0.3 * rng.standard_normal(64), tf.float32)
    offset = tf.constant(rng.standard_normal(64), tf.float32)
    y, kept, from_y = _fused_op_gradients(x, upstream, scale, offset, relu)
    assert kept.shape == (0, 64)
    kernels = norm_module.fused_kernels()
    _, mean, rstd, _, mask = kernels.hvdtrack_layer_norm(x, scale, offset, epsilon=1e-5, relu=relu)
    from_x = kernels.hvdtrack_layer_norm_grad(
        upstream, x, tf.zeros([0, 64]), mask, scale, offset, mean, rstd, relu=relu
    )
    for a, b in zip(from_y, from_x):  # float32 rounding of n: a few ulps of the largest value
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=2e-6 * np.abs(b).max())
    # the fourth output: dx summed per column (a bias's gradient), in blocks of rows
    dx, dsum = from_y[0].numpy(), from_y[3].numpy()
    np.testing.assert_allclose(dsum, dx.sum(axis=0, dtype=np.float64), rtol=0, atol=1e-4)
    expected = _ops_values_and_gradients(x, upstream, scale.numpy(), offset.numpy(), relu)
    for a, b in zip([y, *from_y], expected):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize(
    "column_scale, column_offset", [(0.0, 0.0), (1e-3, 0.5), (-0.01, 0.2), (float("nan"), 0.0)]
)
def test_a_column_y_cannot_give_back_makes_the_backward_pass_read_x(
    column_scale, column_offset, relu
):
    rng = np.random.default_rng(8)
    x = tf.constant(rng.standard_normal((300, 8)) * 2 + 0.5, tf.float32)
    upstream = tf.constant(rng.standard_normal((300, 8)), tf.float32)
    scale_values, offset_values = 1 + 0.3 * rng.standard_normal(8), rng.standard_normal(8) * 0.1
    scale_values[3], offset_values[3] = column_scale, column_offset
    scale, offset = (tf.constant(v, tf.float32) for v in (scale_values, offset_values))
    y, kept, grads = _fused_op_gradients(x, upstream, scale, offset, relu)
    np.testing.assert_array_equal(kept.numpy(), x.numpy())  # x handed over, not recovered
    if np.isnan(column_scale):
        return
    expected = _ops_values_and_gradients(x, upstream, scale_values, offset_values, relu)
    for a, b in zip([y, *grads], expected):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "column_scale, column_offset",
    [(1.0, 16.0), (1.0, 16.000002), (-1.0, -16.0), (1e-20, 0.0), (9.9e-21, 0.0),
     (0.0, 0.0), (float("nan"), 0.0), (1.0, float("inf"))],
)  # fmt: skip
def test_the_backward_pass_from_a_kept_output_reads_y_where_the_kernel_does(
    column_scale, column_offset
):
    # norm.LayerNorm.backward_from decides in TensorFlow ops what the forward kernel decides
    # for its backward pass (layer_norm.cc): both at the rule's edges (|offset| = 16 |scale|,
    # |scale| = 1e-20), a NaN, an infinity.
    scale = tf.constant([1.0, column_scale, 1.0])
    offset = tf.constant([0.0, column_offset, 0.0])
    kept = norm_module.fused_kernels().hvdtrack_layer_norm(
        tf.ones([2, 3]), scale, offset, epsilon=1e-5
    )[3]
    assert bool(norm_module._invertible(scale, offset)) == (kept.shape[0] == 0)


def test_the_relu_mask_is_one_bit_per_element_where_x_is_positive():
    kernels = norm_module.fused_kernels()
    x = tf.constant([[-1.0, 2, 0, 3, -0.5, 1, 1, 1, 4], [1, 1, 1, 1, 1, 1, 1, 1, -2]])
    outputs = kernels.hvdtrack_layer_norm(x, tf.ones([9]), tf.zeros([9]), epsilon=1e-5, relu=True)
    # row 0: columns 1, 3, 5, 6, 7 in the first byte (0b11101010), column 8 in the second
    np.testing.assert_array_equal(outputs[4].numpy(), [[234, 1], [255, 0]])
    plain = kernels.hvdtrack_layer_norm(x, tf.ones([9]), tf.zeros([9]), epsilon=1e-5)
    assert plain[4].shape == (2, 0)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_layer_norm_of_the_relu_equals_the_relu_then_the_layer_norm(implementation, dtype):
    rng = np.random.default_rng(9)
    x = tf.constant(rng.standard_normal((700, 16)) * 2, dtype)
    upstream = tf.constant(rng.standard_normal((700, 16)), dtype)
    fused, separate = LayerNorm(relu=True), LayerNorm()
    fused(x), separate(x)
    for module in (fused, separate):
        module.scale.assign(1 + 0.1 * np.arange(16)), module.offset.assign(0.1 * np.arange(16))

    def run(norm, activate):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = norm(activate(x))
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(upstream, tf.float32))
        return [y, *tape.gradient(loss, [x, norm.scale, norm.offset])]

    for a, b in zip(run(fused, tf.identity), run(separate, tf.nn.relu)):
        a, b = (tf.cast(t, tf.float32).numpy() for t in (a, b))
        if dtype == tf.float32:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        else:  # the same maths on the same bfloat16 inputs
            np.testing.assert_array_equal(a, b)


def test_fused_results_do_not_depend_on_the_number_of_threads():
    """Exact resumes need it: the column sums of the gradient add fixed blocks in order."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    digests = {
        subprocess.run(
            [sys.executable, "-c", THREADS_PROGRAM, str(threads)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            timeout=HANG_S,
        ).stdout.split()[-1]
        for threads in (1, 2)
    }
    assert len(digests) == 1


def test_the_linear_norm_kernel_by_hand():
    kernels = norm_module.fused_kernels()
    x, w = tf.constant([[1.0, 2.0], [0.0, -1.0]]), tf.constant([[1.0, 0.0, 2.0], [1.0, 1.0, -1.0]])
    b, ones, zeros = tf.constant([0.0, 0.0, 1.0]), tf.ones([3]), tf.zeros([3])
    # x @ w + b = [3, 2, 1] and [-1, -1, 2]; with the ReLU the second row is [0, 0, 2]
    y, mean, rstd, kept, mask = kernels.hvdtrack_linear_norm(x, w, b, ones, zeros, epsilon=0.0)
    assert kept.shape == (0, 3)  # y gives the normalised product back: no copy of it
    np.testing.assert_allclose(mean.numpy(), [2.0, 0.0])
    np.testing.assert_allclose(rstd.numpy(), [1.5**0.5, 0.5**0.5], rtol=1e-6)
    expected = [[1.5**0.5, 0.0, -(1.5**0.5)], [-(0.5**0.5), -(0.5**0.5), 2 * 0.5**0.5]]
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6, atol=1e-7)
    assert mask.shape == (2, 0)
    _, mean, _, _, mask = kernels.hvdtrack_linear_norm(x, w, b, ones, zeros, epsilon=0.0, relu=True)
    np.testing.assert_allclose(mean.numpy(), [2.0, 2.0 / 3.0], rtol=1e-6)
    np.testing.assert_array_equal(mask.numpy(), [[0b111], [0b100]])
    # a scale of 0 in a column: y cannot give the product back, which the kernel then keeps
    kept = kernels.hvdtrack_linear_norm(x, w, b, [1.0, 0.0, 1.0], zeros, epsilon=0.0)[3]
    np.testing.assert_array_equal(kept.numpy(), [[3.0, 2.0, 1.0], [-1.0, -1.0, 2.0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"b, scale and offset must be \[wi"):
        kernels.hvdtrack_linear_norm(x, w, b, tf.ones([2]), zeros, epsilon=0.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="x and w must be"):
        kernels.hvdtrack_linear_norm(x, tf.transpose(w), b, ones, zeros, epsilon=0.0)


# the model's edge layer (128 -> 64), whole and partial vectors and tiles, a partial byte, one
# column, no rows
@pytest.mark.parametrize("rows, inputs, width", [(1003, 128, 64), (37, 7, 70), (9, 16, 5),
                                                 (6, 3, 1), (0, 4, 8)])  # fmt: skip
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("given_back", [True, False])
def test_the_linear_norm_kernel_is_the_layer_norm_of_the_product(
    rows, inputs, width, relu, given_back
):
    # small integers: x @ w + b is exact in any order of addition, so the norm's bits must be
    # the layer norm kernel's on TensorFlow's product
    rng = np.random.default_rng(9)
    x, w, b = (
        tf.constant(rng.integers(-4, 5, shape), tf.float32)
        for shape in ((rows, inputs), (inputs, width), (width,))
    )
    scale, offset = 0.5 + rng.random(width), rng.standard_normal(width)
    scale[0] = scale[0] if given_back else 0.0  # else the kernels hand the product over
    scale, offset = tf.constant(scale, tf.float32), tf.constant(offset, tf.float32)
    kernels = norm_module.fused_kernels()
    assert bool(norm_module._invertible(scale, offset)) == given_back
    ours = kernels.hvdtrack_linear_norm(x, w, b, scale, offset, epsilon=1e-5, relu=relu)
    theirs = kernels.hvdtrack_layer_norm(x @ w + b, scale, offset, epsilon=1e-5, relu=relu)
    assert len(ours) == len(theirs) == 5  # y, mean, rstd, kept (the product, or none), mask
    for a, c in zip(ours, theirs):
        np.testing.assert_array_equal(a.numpy(), c.numpy())


LINEAR_NORM_PROGRAM = """
import hashlib, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from hvdtrack.model.kernels import fused_kernels
kernels, digest = fused_kernels(), hashlib.sha256()
rng = np.random.default_rng(10)
# every tile and tail (4, 3, 2 and 1 rows; whole and partial vectors and tiles) over more than
# one block of rows; values over 6 orders of magnitude; an inf and a NaN
for rows, k, width in ((2050, 128, 64), (37, 7, 70), (101, 64, 100), (7, 16, 5), (5, 0, 8)):
    shapes = ((rows, k), (k, width), (width,), (width,), (width,))
    parts = [rng.standard_normal(s) * np.exp(rng.uniform(-7, 7, s)) for s in shapes]
    if rows == 2050:
        parts[0][0, 0], parts[0][1, 1] = np.inf, np.nan
    for relu in (False, True):
        outs = kernels.hvdtrack_linear_norm(
            *[tf.constant(p, tf.float32) for p in parts], epsilon=1e-5, relu=relu)
        for out in outs:
            out = out.numpy()
            if out.dtype == np.float32:
                out[np.isnan(out)] = np.nan  # one NaN: which NaN's payload survives is no result
            digest.update(out.tobytes())
print(kernels.hvdtrack_kernel_isa().numpy().decode(), digest.hexdigest())
"""


def test_the_linear_norm_kernel_gives_the_same_bits_on_every_isa_and_thread_count():
    runs = digests_on_every_isa(LINEAR_NORM_PROGRAM)
    assert len({digest for _, digest in runs}) == 1, runs


def test_the_product_computed_again_is_the_forward_passs_own():
    # where y cannot give the product back, a kept output's backward pass reads the kernel's
    # own product again (LayerNorm.linear_product), not TensorFlow's (other sums, other bits)
    rng = np.random.default_rng(11)
    x, w, b = (
        tf.constant(rng.standard_normal(shape), tf.float32)
        for shape in ((300, 128), (128, 64), (64,))
    )
    scale, offset = tf.constant([0.0] + [1.0] * 63), tf.zeros([64])
    norm = LayerNorm(relu=True)
    kept = norm_module.fused_kernels().hvdtrack_linear_norm(
        x, w, b, scale, offset, epsilon=norm.eps, relu=True
    )[3]
    assert kept.shape == (300, 64)
    again = norm.linear_product(x, w, b, scale, offset)
    np.testing.assert_array_equal(again.numpy(), kept.numpy())
    np.testing.assert_allclose(kept.numpy(), (x @ w + b).numpy(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("first_scale", [0.0, 1.0])
def test_a_kept_linear_output_gives_the_backward_pass_of_the_forward_one(first_scale):
    # The recomputed step keeps linear_output and reads its product again where y cannot give
    # it back (a zero scale); elsewhere from y. Both give linear_pass's gradient, bit for bit.
    rng = np.random.default_rng(12)
    x, w, b, upstream = (
        tf.constant(rng.standard_normal(shape), tf.float32)
        for shape in ((300, 128), (128, 64), (64,), (300, 64))
    )
    scale, offset = tf.constant([first_scale] + [1.5] * 63), tf.constant([0.25] * 64)
    norm = LayerNorm(relu=True)
    y, backward = norm.linear_pass(x, w, b, scale, offset)
    kept = norm.linear_output(x, w, b, scale, offset)
    np.testing.assert_array_equal(kept.y.numpy(), y.numpy())
    again = norm.backward_from(
        kept, scale, offset, lambda: norm.linear_product(x, w, b, scale, offset)
    )
    for got, expected in zip(again(upstream), backward(upstream)):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
