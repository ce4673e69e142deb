"""Exact edge metrics on hand-made scores."""

import numpy as np
import pytest

from hvdtrack.model.metrics import edge_metrics, roc_auc, threshold_counts


def test_auc_by_hand():
    # Positives 0.9, 0.4; negatives 0.5, 0.1: pairs (0.9>0.5, 0.9>0.1, 0.4<0.5, 0.4>0.1) -> 3/4.
    assert roc_auc(np.array([0.9, 0.4, 0.5, 0.1]), np.array([1, 1, 0, 0])) == 0.75


def test_auc_ties_count_half():
    assert roc_auc(np.array([0.5, 0.5]), np.array([1, 0])) == 0.5
    assert roc_auc(np.array([0.7, 0.5, 0.5]), np.array([1, 1, 0])) == 0.75


def test_auc_needs_both_classes():
    assert np.isnan(roc_auc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_counts_and_ratios_by_hand():
    scores = np.array([0.9, 0.6, 0.4, 0.7, 0.2])
    labels = np.array([1, 1, 1, 0, 0])
    assert threshold_counts(scores, labels, 0.5) == {"tp": 2, "fp": 1, "fn": 1, "tn": 1}
    m = edge_metrics(scores, labels, thresholds=(0.5, 0.8))
    assert m["efficiency"] == pytest.approx(2 / 3)
    assert m["purity"] == pytest.approx(2 / 3)
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["efficiency@0.8"] == pytest.approx(1 / 3)
    assert m["purity@0.8"] == 1.0
    # Pairs: 0.9 beats both negatives, 0.6 beats 0.2 only, 0.4 beats 0.2 only -> 4/6.
    assert m["auc"] == pytest.approx(4 / 6)


def test_auc_matches_pair_count_on_random_data():
    rng = np.random.default_rng(0)
    scores = rng.random(300).round(2)  # many ties
    labels = rng.random(300) < 0.3
    pos, neg = scores[labels], scores[~labels]
    expected = (
        (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    ) / (pos.size * neg.size)
    assert roc_auc(scores, labels) == pytest.approx(expected, abs=1e-12)
