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
scale, offset = (tf.constant(rng.standard_normal(64), tf.float32) for _ in range(2))
y, mean, rstd = kernels.hvdtrack_layer_norm(x, scale, offset, epsilon=1e-5)
out = [y, *kernels.hvdtrack_layer_norm_grad(dy, x, scale, mean, rstd)]
print(hashlib.sha256(b"".join(t.numpy().tobytes() for t in out)).hexdigest())
"""


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
