"""model.recompute in the Trainer's compiled step: the same loss and gradients as without it."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrack.train.trainer import Trainer


@pytest.mark.slow  # two Trainers on the tiny dataset
def test_the_trainers_recomputed_gradients_equal_plain_ones(tiny_config):
    results = []
    for recompute in ("false", "true"):
        trainer = Trainer(tiny_config(f"model.recompute={recompute}", "model.layer_norm=true"))
        batch = next(trainer.data.batches(0, 0, trainer.size.steps_per_epoch))
        results.append(trainer.step.gradients(batch))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a == loss_b or abs(loss_a - loss_b) < 1e-6 * abs(loss_a)
    assert len(grads_a) == len(grads_b)
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
