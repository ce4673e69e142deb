"""The learning-rate schedule and Adam, against values worked out by hand."""

import math

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.train.optimizer import Adam, Schedule, scaled_learning_rate


def test_scaling_rules():
    assert scaled_learning_rate(1e-3, 4, "linear") == pytest.approx(4e-3)
    assert scaled_learning_rate(1e-3, 4, "sqrt") == pytest.approx(2e-3)
    assert scaled_learning_rate(1e-3, 4, "none") == pytest.approx(1e-3)


def test_warmup_then_cosine():
    s = Schedule(
        peak=1.0,
        warmup_steps=4,
        total_steps=14,
        decay="cosine",
        min_fraction=0.0,
        warmup_start_divisor=4.0,
    )
    lrs = [float(s(tf.constant(t))) for t in range(15)]
    # Warm-up from 0.25 towards 1.0 in 4 steps: 0.25 + 0.75 * (t+1)/4.
    assert lrs[:4] == pytest.approx([0.4375, 0.625, 0.8125, 1.0])
    assert lrs[4] == pytest.approx(1.0)
    assert lrs[9] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[14] == pytest.approx(0.0, abs=1e-7)


def test_exponential_decay_floor():
    s = Schedule(
        peak=2.0,
        warmup_steps=0,
        total_steps=10,
        decay="exponential",
        decay_rate=0.1,
        min_fraction=0.2,
    )
    assert float(s(tf.constant(0))) == pytest.approx(2.0)
    assert float(s(tf.constant(5))) == pytest.approx(max(2.0 * 0.1**0.5, 0.4))
    assert float(s(tf.constant(10))) == pytest.approx(0.4)


def test_adam_two_steps_by_hand():
    var = tf.Variable([1.0, -2.0])
    opt = Adam(Schedule(peak=0.1, warmup_steps=0, total_steps=10, decay="none"), epsilon=0.0)
    opt.build([var])
    g1, g2 = np.array([0.5, -1.0]), np.array([0.25, 2.0])
    opt.apply([tf.constant(g1, tf.float32)], [var])
    # Step 1: m = 0.1 g, v = 0.001 g^2, bias-corrected update = lr * sign(g).
    np.testing.assert_allclose(var.numpy(), [0.9, -1.9], rtol=1e-6)
    opt.apply([tf.constant(g2, tf.float32)], [var])
    m = 0.9 * 0.1 * g1 + 0.1 * g2
    v = 0.999 * 0.001 * g1**2 + 0.001 * g2**2
    lr_t = 0.1 * math.sqrt(1 - 0.999**2) / (1 - 0.9**2)
    np.testing.assert_allclose(
        var.numpy(), np.array([0.9, -1.9]) - lr_t * m / np.sqrt(v), rtol=1e-5
    )
    assert int(opt.step.numpy()) == 2


def test_adam_clips_by_global_norm():
    var = tf.Variable([0.0, 0.0])
    opt = Adam(Schedule(peak=0.1, warmup_steps=0, total_steps=10, decay="none"), clip_norm=1.0)
    opt.build([var])
    norm = opt.apply([tf.constant([3.0, 4.0])], [var])
    assert float(norm) == pytest.approx(5.0)
    np.testing.assert_allclose(opt.m[0].numpy(), [0.1 * 0.6, 0.1 * 0.8], rtol=1e-6)
