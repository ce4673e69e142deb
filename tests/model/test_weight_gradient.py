"""The weight-gradient kernel (HvdtrackWeightGradient, model/weight_gradient.cc) and the layers
that take their weight gradients from it (mlp.weight_gradient, mlp.dense)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.model.kernels import fused_kernels, plain_ops, vector_code
from hvdtrack.model.mlp import dense, weight_gradient
from tests.model.conftest import widest_isa

pytestmark = pytest.mark.skipif(fused_kernels() is None, reason="no kernel library here")
HANG_S = 300
# Where mlp.weight_gradient takes the kernel in this process (vector code for this CPU, not
# capped by HVDTRACK_KERNEL_ISA=none, oneDNN not asked for).
routed = pytest.mark.skipif(
    not vector_code() or os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1",
    reason="the weight gradients take TensorFlow's product in this process",
)


def test_a_hand_made_product():
    x = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    d = tf.constant([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0], [1.0, 1.0, 0.0]])
    out = fused_kernels().hvdtrack_weight_gradient(x, d)
    # column i of x against column j of d
    assert out.numpy().tolist() == [[6.0, 8.0, -1.0], [8.0, 10.0, 0.0]]


@pytest.mark.parametrize(
    "rows, a, b",
    [
        (40000, 128, 64),  # the model's shapes: full tiles
        (40000, 64, 128),
        (5000, 64, 64),
        (257, 3, 128),  # a last block of one row; a tile of 3 rows of out
        (300, 67, 45),  # tiles of 3 rows, a masked tail of 13 columns
        (1, 5, 16),
    ],
)
def test_equal_to_the_float64_product_to_float32_rounding(rows, a, b):
    rng = np.random.default_rng(rows + a + b)
    x = rng.standard_normal((rows, a)).astype(np.float32)
    d = rng.standard_normal((rows, b)).astype(np.float32)
    ours = fused_kernels().hvdtrack_weight_gradient(x, d).numpy()
    exact = x.astype(np.float64).T @ d.astype(np.float64)
    tensorflow = tf.matmul(x, d, transpose_a=True).numpy()
    assert ours.shape == (a, b)
    # as close to the exact sums as TensorFlow's own product (blocks of 256 rows, then the
    # blocks' sums), both far inside what float32 sums of this many terms allow
    scale = np.abs(x.astype(np.float64)).T @ np.abs(d.astype(np.float64))
    assert np.max(np.abs(ours - exact) / scale) < 1e-5
    assert np.max(np.abs(ours - exact)) <= 3 * max(np.max(np.abs(tensorflow - exact)), 1e-6)


def test_no_rows_give_zeros_no_columns_nothing_and_mismatched_rows_are_refused():
    kernels = fused_kernels()
    assert kernels.hvdtrack_weight_gradient(tf.zeros([3, 0]), tf.zeros([3, 16])).shape == (0, 16)
    assert kernels.hvdtrack_weight_gradient(tf.zeros([3, 4]), tf.zeros([3, 0])).shape == (4, 0)
    assert (
        kernels.hvdtrack_weight_gradient(tf.zeros([0, 4]), tf.zeros([0, 16])).numpy().tolist()
        == [[0.0] * 16] * 4
    )
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rows|Dimensions"):
        kernels.hvdtrack_weight_gradient(tf.zeros([3, 4]), tf.zeros([2, 16]))


PROGRAM = """
import hashlib, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from hvdtrack.model.kernels import fused_kernels
rng = np.random.default_rng(0)
scale = np.exp(rng.uniform(-7, 7, (20000, 1)))
outs = []
for a, b in ((128, 64), (64, 128), (64, 64), (67, 45)):
    x = tf.constant(rng.standard_normal((20000, a)) * scale, tf.float32)
    d = tf.constant(rng.standard_normal((20000, b)), tf.float32)
    outs.append(fused_kernels().hvdtrack_weight_gradient(x, d).numpy())
print(hashlib.sha256(b"".join(o.tobytes() for o in outs)).hexdigest())
"""


def _digest(threads: int, isa: str | None = None) -> str:
    env = dict(os.environ)
    env.pop("HVDTRACK_KERNEL_ISA", None)
    if isa:
        env["HVDTRACK_KERNEL_ISA"] = isa
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(threads)],
        capture_output=True, text=True, env=env, timeout=HANG_S, check=True,
    )  # fmt: skip
    return done.stdout.split()[-1]


def test_the_same_bits_at_one_and_two_threads():
    assert _digest(1) == _digest(2)


@pytest.mark.skipif(
    widest_isa() != "avx512",
    reason="needs a CPU with AVX-512 and AVX2 to run both paths",
)
def test_the_same_bits_on_avx512_and_avx2():
    assert _digest(2, "avx512") == _digest(1, "avx2")


def test_an_unknown_isa_is_refused_by_name():
    env = dict(os.environ, HVDTRACK_KERNEL_ISA="avx-512")
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, "1"],
        capture_output=True, text=True, env=env, timeout=HANG_S,
    )  # fmt: skip
    assert done.returncode != 0
    assert "HVDTRACK_KERNEL_ISA must be avx512, avx2 or none, got 'avx-512'" in done.stderr


def _op_types(fn, *args) -> list[str]:
    graph = tf.function(fn).get_concrete_function(*args).graph
    return [op.type for op in graph.get_operations()]


@routed
def test_weight_gradient_takes_the_kernel_where_it_runs_and_tensorflow_elsewhere():
    spec = tf.TensorSpec
    kernel_shapes = (spec([None, 128]), spec([None, 64]))
    assert "HvdtrackWeightGradient" in _op_types(weight_gradient, *kernel_shapes)
    # b not a multiple of 16: TensorFlow's product, the [8, 5] result as a transposed [5, 8]
    types = _op_types(weight_gradient, spec([None, 8]), spec([None, 5]))
    assert "HvdtrackWeightGradient" not in types and "Transpose" in types
    with plain_ops():  # an export for runtimes without the library
        assert "HvdtrackWeightGradient" not in _op_types(weight_gradient, *kernel_shapes)
    half = (spec([None, 128], tf.float16), spec([None, 64], tf.float16))
    assert "HvdtrackWeightGradient" not in _op_types(weight_gradient, *half)


@routed
@pytest.mark.parametrize("bias, relu", [(False, False), (True, False), (True, True)])
def test_dense_has_tensorflows_values_and_gradients(bias, relu):
    rng = np.random.default_rng(3)
    x = tf.constant(rng.standard_normal((500, 64)), tf.float32)
    w = tf.constant(rng.standard_normal((64, 32)), tf.float32)
    b = tf.constant(rng.standard_normal(32), tf.float32)
    upstream = tf.constant(rng.standard_normal((500, 32)), tf.float32)

    def theirs(x, w, b):
        y = x @ w + b if bias else x @ w
        return tf.nn.relu(y) if relu else y

    def ours(x, w, b):
        return dense(x, w, b if bias else None, relu)

    results = []
    for fn in (ours, theirs):
        with tf.GradientTape() as tape:
            tape.watch([x, w, b])
            y = fn(x, w, b)
            total = tf.reduce_sum(y * upstream)
        results.append([y, *tape.gradient(total, [x, w, b] if bias else [x, w])])
    for a, c in zip(*results):
        np.testing.assert_allclose(a.numpy(), c.numpy(), rtol=1e-5, atol=1e-4)
    digest = hashlib.sha256(results[0][2].numpy().tobytes()).hexdigest()
    # the weight gradient came from the kernel: its bits, not TensorFlow's product's
    kernel = fused_kernels().hvdtrack_weight_gradient(
        x, tf.where(results[0][0] > 0, upstream, 0.0) if relu else upstream
    )
    assert hashlib.sha256(kernel.numpy().tobytes()).hexdigest() == digest


ISA_PROGRAM = """
import tensorflow as tf
from hvdtrack.model.kernels import fused_kernels
from hvdtrack.model.mlp import weight_gradient
spec = (tf.TensorSpec([None, 128]), tf.TensorSpec([None, 64]))
graph = tf.function(weight_gradient).get_concrete_function(*spec).graph
types = [op.type for op in graph.get_operations()]
print(fused_kernels().hvdtrack_kernel_isa().numpy().decode(), "HvdtrackWeightGradient" in types)
"""


@pytest.mark.parametrize(
    "cap, want",
    [
        (None, widest_isa()),
        ("avx2", "avx2" if widest_isa() != "none" else "none"),
        ("none", "none"),
    ],
)
def test_the_kernel_names_its_vector_code_and_without_any_tensorflow_runs(cap, want):
    env = dict(os.environ)
    env.pop("HVDTRACK_KERNEL_ISA", None)
    if cap:
        env["HVDTRACK_KERNEL_ISA"] = cap
    done = subprocess.run(
        [sys.executable, "-c", ISA_PROGRAM],
        capture_output=True, text=True, env=env, timeout=HANG_S, check=True,
    )  # fmt: skip
    # without vector code the kernel would take Eigen's product on one thread: TensorFlow's
    # threaded product instead
    assert done.stdout.split()[-2:] == [want, str(want != "none")]


EIGEN_PROGRAM = """
import numpy as np, tensorflow as tf
from hvdtrack.model.kernels import fused_kernels
rng = np.random.default_rng(1)
x, d = rng.standard_normal((1000, 67)), rng.standard_normal((1000, 48))
xt, dt = tf.constant(x, tf.float32), tf.constant(d, tf.float32)
out = fused_kernels().hvdtrack_weight_gradient(xt, dt)
print(float(np.max(np.abs(out.numpy() - x.T @ d))))
"""


def test_the_op_without_vector_code_takes_eigens_product():
    env = dict(os.environ, HVDTRACK_KERNEL_ISA="none")
    done = subprocess.run(
        [sys.executable, "-c", EIGEN_PROGRAM],
        capture_output=True, text=True, env=env, timeout=HANG_S, check=True,
    )  # fmt: skip
    assert float(done.stdout.split()[-1]) < 1e-3  # sums of 1,000 products of normals
