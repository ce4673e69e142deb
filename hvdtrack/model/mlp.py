"""The model's MLPs: ``snt.nets.MLP`` and ``snt.Linear`` (same variables, names and values) with
the bias added by ``tf.nn.bias_add``, so that grappler fuses matmul, bias and ReLU into one
kernel, and a final ReLU before a layer norm taken into the layer norm (``norm.LayerNorm``).

Public symbols: ``ACTIVATIONS``, ``make_mlp``, ``FusedLinear``, ``FusedMLP``, ``LinearStack``.
"""

from __future__ import annotations

from typing import Callable

import sonnet as snt
import tensorflow as tf

from hvdtrack.model.config import ACTIVATION_NAMES, ModelConfig
from hvdtrack.model.norm import LayerNorm

ACTIVATIONS: dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    "relu": tf.nn.relu,
    "tanh": tf.nn.tanh,
    "elu": tf.nn.elu,
}
assert tuple(ACTIVATIONS) == ACTIVATION_NAMES


def make_mlp(
    sizes: tuple[int, ...], config: ModelConfig, with_layer_norm: bool, activate_final: bool
) -> snt.Module:
    """Returns an MLP with ``config.activation`` (named ``mlp``), then a LayerNorm if asked.

    Built inside the calling module's constructor, so its variables sit under that module's name.
    A final ReLU before the LayerNorm is the LayerNorm's own (``LayerNorm(relu=True)``: the same
    values, and its backward pass keeps a bit per element instead of the ReLU's output).
    """
    relu_in_norm = with_layer_norm and activate_final and config.activation == "relu"
    mlp = FusedMLP(
        list(sizes),
        activation=ACTIVATIONS[config.activation],
        activate_final=activate_final and not relu_in_norm,
    )
    if not with_layer_norm:
        return mlp
    return snt.Sequential([mlp, LayerNorm(relu=relu_in_norm)])


class FusedLinear(snt.Linear):
    """``snt.Linear`` (same variables, same values) adding its bias with ``tf.nn.bias_add``.

    ``snt.Linear`` adds the bias with ``tf.add``; grappler's remapper fuses only a ``BiasAdd``
    (and the activation after it) into the matmul: one ``_FusedMatMul`` kernel applies bias
    and ReLU to each output block while it is in cache, instead of two more passes over
    [rows, width], and the bias gradient becomes ``BiasAddGrad`` instead of a general ``Sum``.
    The step on 5k nodes / 40k edges: 25 ms less op time of 536 (docs/performance.md).
    """

    def __call__(self, inputs: tf.Tensor) -> tf.Tensor:
        self._initialize(inputs)
        return tf.nn.bias_add(tf.matmul(inputs, self.w), self.b)

    def weights(self, inputs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """w and b read as tensors, created first (Sonnet style) for inputs of this width."""
        self._initialize(inputs)
        return tf.convert_to_tensor(self.w), tf.convert_to_tensor(self.b)


class FusedMLP(snt.nets.MLP):
    """``snt.nets.MLP`` of ``FusedLinear`` layers: the same variable names (``mlp/linear_<i>``)
    and checkpoint keys (``_layers/<i>``)."""

    def __init__(
        self,
        output_sizes: list[int],
        activation: Callable[[tf.Tensor], tf.Tensor],
        activate_final: bool,
        name: str = "mlp",
    ):
        super().__init__(
            output_sizes, activation=activation, activate_final=activate_final, name=name
        )
        self._layers = [
            FusedLinear(size, name=f"linear_{i}") for i, size in enumerate(output_sizes)
        ]

    @property
    def layers(self) -> list[FusedLinear]:
        return self._layers


class LinearStack(snt.Module):
    """The Linear layers of an MLP, named like ``snt.nets.MLP``'s (``mlp/linear_<i>``)."""

    def __init__(self, sizes: tuple[int, ...], name: str = "mlp"):
        super().__init__(name=name)
        self.layers = [FusedLinear(size, name=f"linear_{i}") for i, size in enumerate(sizes)]
