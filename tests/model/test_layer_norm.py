"""The model's LayerNorm is Sonnet's LayerNorm: same variables, values and gradients."""

from __future__ import annotations

import numpy as np
import sonnet as snt
import tensorflow as tf

from hvdtrack.model.norm import LayerNorm


def test_values_and_gradients_equal_sonnets():
    rng = np.random.default_rng(3)
    x = tf.constant(rng.standard_normal((50, 6)) * 3 + 1, tf.float32)
    upstream = tf.constant(rng.standard_normal((50, 6)), tf.float32)
    ours, theirs = LayerNorm(), snt.LayerNorm(axis=-1, create_scale=True, create_offset=True)
    ours(x), theirs(x)
    for a, b in zip((ours.scale, ours.offset), (theirs.scale, theirs.offset)):
        a.assign(rng.standard_normal(6)), b.assign(a)
    results = []
    for norm in (ours, theirs):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = norm(x)
            loss = tf.reduce_sum(y * upstream)
        results.append([y, *tape.gradient(loss, [x, norm.scale, norm.offset])])
    for a, b in zip(*results):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
    assert [v.name for v in ours.trainable_variables] == [
        v.name for v in theirs.trainable_variables
    ]


def test_a_constant_row_becomes_the_offset():
    norm = LayerNorm()
    y = norm(tf.fill([2, 4], 7.0))
    np.testing.assert_array_equal(y.numpy(), np.zeros((2, 4), np.float32))
