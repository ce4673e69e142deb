"""Mixed precision in the Trainer: bfloat16 trains like float32; float16's loss scaling; refusals."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.errors import ConfigError
from hvdtrack.model.precision import cpu_flags, unsupported_reason
from hvdtrack.train.loop import fit
from hvdtrack.train.optimizer import LossScale
from hvdtrack.train.trainer import Trainer

HAS_GPU = bool(tf.config.list_physical_devices("GPU"))
BF16_REASON = unsupported_reason("bfloat16", HAS_GPU, cpu_flags())


@pytest.mark.slow  # two tiny trainings: about 30 s, a minute on a loaded machine
def test_bfloat16_trains_the_tiny_config_to_float32s_metrics(tiny_config):
    if BF16_REASON is not None:
        # No GPU and no native bfloat16 here: what this machine can show is the refusal,
        # naming the key (not a skip: the test still proves something on every machine).
        with pytest.raises(ConfigError, match=re.escape(BF16_REASON)):
            Trainer(tiny_config("model.precision=bfloat16"))
        return
    results = {}
    for precision in ("float32", "bfloat16"):
        config = tiny_config("train.epochs=3", f"model.precision={precision}", run=precision)
        trainer = Trainer(config)
        before = trainer.evaluate("val")["loss"]
        info = fit(trainer)
        assert info["status"] == "finished"
        results[precision] = (before, info["metrics"])
    (before32, m32), (before16, m16) = results["float32"], results["bfloat16"]
    assert before16 == pytest.approx(before32, rel=0.02)  # same initial weights
    assert m16["loss"] < 0.9 * before16  # it learns
    assert m16["loss"] == pytest.approx(m32["loss"], rel=0.05)
    assert m16["auc"] == pytest.approx(m32["auc"], abs=0.02)


@pytest.mark.skipif(HAS_GPU, reason="float16 is allowed where there is a GPU")
def test_float16_is_refused_on_cpu_naming_the_key(tiny_config):
    with pytest.raises(ConfigError, match="model.precision=float16 needs a GPU"):
        Trainer(tiny_config("model.precision=float16"))


def test_loss_scale_halves_on_overflow_and_doubles_after_a_period_of_finite_steps():
    scale = LossScale(initial=8.0, period=2)
    finite, overflow = [tf.constant([1.0, 2.0])], [tf.constant([1.0, np.inf])]
    assert not bool(scale.update(overflow))
    assert float(scale.scale) == 4.0
    assert bool(scale.update(finite)) and float(scale.scale) == 4.0
    assert bool(scale.update(finite)) and float(scale.scale) == 8.0
    assert int(scale.finite_steps) == 0
    assert bool(scale.update(finite)) and float(scale.scale) == 8.0
    assert not bool(scale.update([tf.constant([np.nan])])) and float(scale.scale) == 4.0
    assert int(scale.finite_steps) == 0
