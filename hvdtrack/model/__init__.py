"""The segment classifier: a graph network scoring each hit-pair edge as a true track segment.

Public symbols: ``ModelConfig``, ``SegmentClassifier`` (classifier.py, sparse graph_nets blocks),
``weighted_bce_terms`` and ``weighted_bce`` (loss.py), ``num_parameters``, ``gradient_bytes``,
``num_trainable_parameters``, ``train_step_flops`` (cost.py).
"""

from __future__ import annotations

from hvdtrack.model.classifier import ModelConfig, SegmentClassifier
from hvdtrack.model.cost import (
    gradient_bytes,
    num_parameters,
    num_trainable_parameters,
    train_step_flops,
)
from hvdtrack.model.loss import weighted_bce, weighted_bce_terms

__all__ = [
    "ModelConfig",
    "SegmentClassifier",
    "gradient_bytes",
    "num_parameters",
    "num_trainable_parameters",
    "train_step_flops",
    "weighted_bce",
    "weighted_bce_terms",
]
