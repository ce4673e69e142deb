"""Weighted BCE: literal values by hand, masking, and the sum / normaliser split."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.model.loss import weighted_bce, weighted_bce_per_edge, weighted_bce_terms

# Two edges, labels [true, fake], weights 2 : 1, logits after two steps:
#   step 1: [0, 2]   BCE = [log 2, log(1 + e^2)]
#   step 2: [1, -1]  BCE = [log(1 + e^-1), log(1 + e^-1)]
LABELS = tf.constant([1.0, 0.0])
LOGITS = [tf.constant([0.0, 2.0]), tf.constant([1.0, -1.0])]
LOG2 = math.log(2.0)
SP2 = math.log(1.0 + math.e**2)  # 2.126928
SPM1 = math.log(1.0 + math.e**-1)  # 0.313262


def test_terms_on_a_literal_two_edge_example():
    loss_sum, weight_sum = weighted_bce_terms(LOGITS, LABELS, true_weight=2.0, fake_weight=1.0)
    step1 = 2 * LOG2 + 1 * SP2  # 3.513222
    step2 = 2 * SPM1 + 1 * SPM1  # 0.939785
    assert loss_sum.numpy() == pytest.approx((step1 + step2) / 2, rel=1e-6)  # 2.226504
    assert weight_sum.numpy() == pytest.approx(3.0)
    assert weighted_bce(LOGITS, LABELS).numpy() == pytest.approx(0.742168, rel=1e-5)


def test_per_edge_terms_average_the_steps_edge_by_edge():
    per_edge, weights = weighted_bce_per_edge(LOGITS, LABELS, mask=tf.constant([1.0, 0.0]))
    np.testing.assert_allclose(per_edge.numpy(), [2 * (LOG2 + SPM1) / 2, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(weights.numpy(), [2.0, 0.0])


def test_mask_removes_an_edge_from_both_terms():
    loss_sum, weight_sum = weighted_bce_terms(LOGITS, LABELS, mask=tf.constant([1.0, 0.0]))
    assert loss_sum.numpy() == pytest.approx((2 * LOG2 + 2 * SPM1) / 2, rel=1e-6)  # 1.006409
    assert weight_sum.numpy() == pytest.approx(2.0)
    assert weighted_bce(LOGITS, LABELS, mask=tf.constant([1.0, 0.0])).numpy() == pytest.approx(
        0.503204, rel=1e-5
    )


def test_single_output_and_equal_weights_give_the_plain_mean_bce():
    loss = weighted_bce(LOGITS[1:], LABELS, true_weight=1.0, fake_weight=1.0)
    assert loss.numpy() == pytest.approx(SPM1, rel=1e-6)


def test_summing_terms_over_any_split_gives_the_global_mean():
    rng = np.random.default_rng(3)
    logits = [tf.constant(rng.standard_normal(10).astype(np.float32)) for _ in range(3)]
    labels = tf.constant((rng.random(10) < 0.3).astype(np.float32))
    whole = weighted_bce(logits, labels).numpy()
    # Two "workers" with 7 and 3 edges: all-reduce (sum) both terms, then divide.
    parts = [
        weighted_bce_terms([x[a:b] for x in logits], labels[a:b]) for a, b in [(0, 7), (7, 10)]
    ]
    total_sum = sum(p[0] for p in parts)
    total_weight = sum(p[1] for p in parts)
    assert (total_sum / total_weight).numpy() == pytest.approx(whole, rel=1e-6)
    # Averaging the two per-worker means instead would be wrong here.
    per_worker = [(p[0] / p[1]).numpy() for p in parts]
    assert np.mean(per_worker) != pytest.approx(whole, rel=1e-3)


def test_all_weights_zero_gives_zero_not_nan():
    loss = weighted_bce(LOGITS, LABELS, mask=tf.zeros(2))
    assert loss.numpy() == 0.0


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="logits_per_step is empty"):
        weighted_bce_terms([], LABELS)
    with pytest.raises(ValueError, match="class weights must be >= 0, got true_weight=-1"):
        weighted_bce_terms(LOGITS, LABELS, true_weight=-1.0)


def test_gradient_is_the_closed_form_and_agrees_with_tensorflows():
    # d/dx of the step-averaged weighted sum: w * (sigmoid(x) - z) / steps, also far out on
    # both tails (where TensorFlow's own gradient of its formula is exact too)
    logits = [tf.constant([-30.0, -2.0, 0.0, 0.5, 40.0]), tf.constant([1.0, 1.0, -1.0, 3.0, 0.0])]
    labels = tf.constant([0.0, 1.0, 1.0, 0.0, 1.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours, weights = weighted_bce_per_edge(logits, labels, true_weight=3.0)
        theirs = tf.add_n(
            [tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=x) for x in logits]
        )
        theirs = weights * theirs / 2.0
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())  # the same values
    for x, g, t in zip(logits, tape.gradient(ours, logits), tape.gradient(theirs, logits)):
        expected = (
            weights.numpy() * (1 / (1 + np.exp(-x.numpy().astype(np.float64))) - labels.numpy()) / 2
        )
        np.testing.assert_allclose(g.numpy(), expected, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-6, atol=1e-12)
