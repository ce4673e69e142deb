"""DenseSegmentClassifier: incidence matrices, and the same logits as the sparse model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hvdtrack.model import DenseSegmentClassifier, SegmentClassifier
from hvdtrack.model.dense import incidence_matrices_t
from tests.model.conftest import TINY
from tests.model.test_classifier import copy_weights


def test_incidence_matrices_have_one_row_per_edge(graphs):
    ri_t, ro_t = incidence_matrices_t(graphs)
    assert ri_t.shape == (7, 7) and ro_t.shape == (7, 7)
    # Graph b's edge 0 (batch edge 5) goes from batch node 4 to batch node 5.
    np.testing.assert_array_equal(ro_t[5].numpy(), [0, 0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(ri_t[5].numpy(), [0, 0, 0, 0, 0, 1, 0])
    # Node 3 has no edges; node 1 receives edges 0 and 4 (the self-loop).
    np.testing.assert_array_equal(ri_t.numpy().sum(axis=0), [1, 2, 2, 0, 0, 1, 1])


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_dense_logits_equal_sparse_logits_with_the_same_weights(graphs, layer_norm, activation):
    config = dataclasses.replace(TINY, layer_norm=layer_norm, activation=activation)
    sparse = SegmentClassifier(config)
    dense = DenseSegmentClassifier(config)
    sparse(graphs)
    dense(graphs)
    copy_weights(sparse, dense)
    sparse_logits, dense_logits = sparse(graphs), dense(graphs)
    assert len(sparse_logits) == len(dense_logits) == 3
    for a, b in zip(sparse_logits, dense_logits):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_dense_rejects_a_bad_config():
    with pytest.raises(TypeError, match="DenseSegmentClassifier: config must be"):
        DenseSegmentClassifier(None)
