"""The model's MLPs: ``snt.nets.MLP`` and ``snt.Linear`` (same variables, names and values) with
the bias added by ``tf.nn.bias_add``, so that grappler fuses matmul, bias and ReLU into one
kernel, and a final ReLU before a layer norm taken into the layer norm (``norm.LayerNorm``).

Public symbols: ``ACTIVATIONS``, ``make_mlp``, ``NormedMLP``, ``FusedLinear``, ``FusedMLP``,
``LinearStack``, ``linear_freeing_input``, ``linear_norm``, ``kept_for``, ``weight_gradient``,
``dense``.
"""

from __future__ import annotations

import os
from typing import Callable

import sonnet as snt
import tensorflow as tf

from hvdtrack.model.config import ACTIVATION_NAMES, ModelConfig
from hvdtrack.model.kernels import fused_kernels, vector_code
from hvdtrack.model.norm import LayerNorm, NormOutput

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
    if relu_in_norm:
        return NormedMLP(mlp, LayerNorm(relu=True))
    return snt.Sequential([mlp, LayerNorm()])


class NormedMLP(snt.Sequential):
    """``snt.Sequential([mlp, norm])`` (the same checkpoint keys) of a ReLU MLP whose final
    ReLU is the norm's (``make_mlp``), with its last layer and the norm run as ``linear_norm``:
    the norm's gradient kernel also sums the last product's gradient per column, which is its
    bias's, so no ``BiasAddGrad`` reads [rows, width] again, and with vector code the forward
    pass is one ``HvdtrackLinearNorm``. An MLP of one layer, or of two that ``FusedMLP`` runs as
    one (``_narrow_layers``: the default encoders), runs as the sequence it is. The same values
    as the sequence, to float rounding (with the kernels the product's sums are theirs).

    Raises:
      ValueError: if the MLP is not ReLU without a final activation, or the norm has no ReLU.
    """

    def __init__(self, mlp: FusedMLP, norm: LayerNorm):
        if mlp.activation is not tf.nn.relu or mlp.activate_final or not norm.relu:
            raise ValueError(
                "NormedMLP: the MLP must be ReLU without a final activation and the norm "
                "LayerNorm(relu=True) (the final ReLU is the norm's); got activation "
                f"{getattr(mlp.activation, '__name__', mlp.activation)}, activate_final="
                f"{mlp.activate_final}, norm relu={norm.relu}"
            )
        super().__init__([mlp, norm])

    def __call__(self, inputs) -> tf.Tensor:
        mlp, norm = self._layers
        hidden = mlp.hidden(inputs)
        if hidden is None:
            return norm(mlp(inputs))
        return linear_norm(hidden, *mlp.layers[-1].weights(hidden), norm)


class FusedLinear(snt.Linear):
    """``snt.Linear`` (same variables, same values) adding its bias with ``tf.nn.bias_add``.

    ``snt.Linear`` adds the bias with ``tf.add``; grappler's remapper fuses only a ``BiasAdd``
    (and the activation after it) into the matmul: one ``_FusedMatMul`` kernel applies bias
    and ReLU to each output block while it is in cache, instead of two more passes over
    [rows, width], and the bias gradient becomes ``BiasAddGrad`` instead of a general ``Sum``.
    The step on 5k nodes / 40k edges: 25 ms less op time of 536 (docs/performance.md).
    """

    def __call__(self, inputs: tf.Tensor, relu: bool = False) -> tf.Tensor:
        """inputs @ w + b, then a ReLU if ``relu`` (in the same ``_FusedMatMul``; ``dense``)."""
        self._initialize(inputs)
        return dense(inputs, self.w, self.b, relu)

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

    def __call__(self, inputs, is_training=None) -> tf.Tensor:
        """The MLP on ``inputs``: one tensor [rows, width], or a tuple of parts [rows, width_i]
        that the first layer reads as their concatenation (in that order).

        With ReLU, two first layers keep less for the backward pass (same values, same
        gradients; tests/model/test_mlp.py):
        - parts are kept, not their concatenation: the backward pass works part by part
          (``_concat_layer``: the node update's [N, 256] input is held as its parts, of which
          the step keeps the latents anyway);
        - an input of at most ``NARROW_INPUT`` columns (the encoders' features) keeps only
          that input: the backward pass computes the first layer's output again from it, a
          product of ``NARROW_INPUT`` or fewer terms per element, instead of holding it
          ([E, 128] for the edge encoder) (``_narrow_layers``).
        """
        if is_training is not None:
            raise ValueError("FusedMLP has no dropout: is_training must be None")
        return self._run(inputs, len(self._layers))

    @property
    def activation(self) -> Callable[[tf.Tensor], tf.Tensor]:
        return self._activation

    @property
    def activate_final(self) -> bool:
        return self._activate_final

    def hidden(self, inputs) -> tf.Tensor | None:
        """The activated input of the last layer (``__call__``'s layers but the last), or None
        where there is one layer, or two that run as one (``_narrow_layers``)."""
        count = len(self._layers)
        if count < 2 or (count == 2 and self._narrow(inputs)):
            return None
        return self._run(inputs, count - 1)

    def _narrow(self, inputs) -> bool:
        """Whether the first two layers run as one (``_narrow_layers``)."""
        parts = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        width = parts[0].shape[-1] if len(parts) == 1 else None
        relu = self._activation is tf.nn.relu
        return relu and len(self._layers) > 1 and width is not None and width <= NARROW_INPUT

    def _run(self, inputs, stop: int) -> tf.Tensor:
        """The first ``stop`` layers on ``inputs`` (at least two where they run as one,
        ``_narrow``); a layer before the last is activated."""
        parts = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        relu = self._activation is tf.nn.relu
        count = len(self._layers)
        first, start = self._layers[0], 1
        x = parts[0] if len(parts) == 1 else None
        if self._narrow(inputs):
            second = self._layers[1].weights(tf.zeros([0, first.output_size], x.dtype))
            x = _narrow_layers(x, *first.weights(x), *second)
            if count > 2 or self._activate_final:
                x = self._activation(x)
            start = 2
        elif relu and x is None and (count > 1 or self._activate_final):
            x = _concat_layer(parts, *first.weights(tf.concat([p[:0] for p in parts], -1)))
        else:
            x = x if x is not None else tf.concat(parts, axis=-1)
            x = self._layer(first, x, count > 1 or self._activate_final)
        for i in range(start, stop):
            x = self._layer(self._layers[i], x, i < count - 1 or self._activate_final)
        return x

    def _layer(self, layer: FusedLinear, x: tf.Tensor, activated: bool) -> tf.Tensor:
        if activated and self._activation is tf.nn.relu:
            return layer(x, relu=True)  # the ReLU in the layer's _FusedMatMul and its gradient
        x = layer(x)
        return self._activation(x) if activated else x


# An MLP input this narrow keeps only itself for the backward pass (FusedMLP.__call__).
NARROW_INPUT = 16


def _concat_layer(parts, w, b):
    """relu(concat(parts) @ w + b), whose backward pass reads the parts instead of keeping
    their concatenation (it keeps the parts and the output)."""

    @tf.custom_gradient
    def layer(*args):
        *parts, w, b = args
        out = tf.nn.relu(tf.nn.bias_add(tf.concat(parts, axis=-1) @ w, b))

        def grad(d_out):
            g = tf.raw_ops.ReluGrad(gradients=d_out, features=out)
            # part by part, with the part's rows of w: nothing [rows, sum of widths]
            w_parts = tf.split(w, [p.shape[-1] for p in parts], axis=0)
            d_x = [tf.matmul(g, w_part, transpose_b=True) for w_part in w_parts]
            d_w = tf.concat([weight_gradient(p, g) for p in parts], axis=0)
            return (*d_x, d_w, tf.raw_ops.BiasAddGrad(out_backprop=g))

        return out, grad

    return layer(*parts, w, b)


@tf.custom_gradient
def _narrow_layers(x, w0, b0, w1, b1):
    """relu(x @ w0 + b0) @ w1 + b1, whose backward pass computes relu(x @ w0 + b0) again from
    x instead of keeping it."""

    def hidden(x):
        return tf.nn.relu(tf.nn.bias_add(x @ w0, b0))  # one _FusedMatMul

    out = tf.nn.bias_add(hidden(x) @ w1, b1)

    def grad(d_out):
        # When the gradient comes, not as soon as x exists; the wait on an identity of x, so
        # that grappler still fuses the product, its bias and ReLU.
        with tf.control_dependencies([d_out]):
            h = hidden(tf.identity(x))
        d_w1 = weight_gradient(h, d_out)
        g = tf.raw_ops.ReluGrad(gradients=tf.matmul(d_out, w1, transpose_b=True), features=h)
        d_w0 = weight_gradient(x, g)
        return (
            tf.matmul(g, w0, transpose_b=True),
            d_w0,
            tf.raw_ops.BiasAddGrad(out_backprop=g),
            d_w1,
            tf.raw_ops.BiasAddGrad(out_backprop=d_out),
        )

    return out, grad


def linear_freeing_input(x, w, b):
    """x @ w + b whose backward pass takes the weight gradient, x's last use, before x's own
    gradient: when nothing else keeps x, it is freed before its gradient is allocated (one
    tensor of x's shape less at that moment; TensorFlow's own order is free)."""

    @tf.custom_gradient
    def linear(x, w, b):
        def grad(d_out):
            return (*_weight_first(x, w, d_out), tf.raw_ops.BiasAddGrad(out_backprop=d_out))

        return tf.nn.bias_add(x @ w, b), grad

    return linear(x, w, b)


def linear_norm(x, w, b, norm: LayerNorm, kept: bool | NormOutput = False):
    """``norm(x @ w + b)`` with ``linear_freeing_input``'s order of gradients, in one backward
    pass where the layer norm's kernels run (``kept_for(x, norm)``): their gradient kernel
    also sums the product's gradient per column, which is b's, so no ``BiasAddGrad`` reads
    [rows, width] again. With vector code for this CPU (``_in_one_kernel``) the forward pass
    is one kernel, ``HvdtrackLinearNorm`` (``LayerNorm.linear_pass``): x @ w + b is written
    only where y cannot give the normalised product back (the layer norm kernel's rule), and
    computed again by the same kernel where a kept output's backward pass needs it.

    ``kept`` (where the kernels run): True, the forward pass alone, returning the
    ``NormOutput`` (no gradient); a ``NormOutput`` kept from such a pass on the same rows and
    weights: its y, whose backward pass reads it instead of computing the product and the
    norm again (a recomputed step's backward pass, ``recompute``)."""
    if not kept_for(x, norm):
        return norm(linear_freeing_input(x, w, b))
    one_kernel = _in_one_kernel(x, norm)

    def product(x, w, b, scale, offset):  # x @ w + b as the forward pass computes it
        if one_kernel:  # (the kernel's own, where y cannot give it back: backward_from)
            return norm.linear_product(x, w, b, scale, offset)
        return tf.nn.bias_add(x @ w, b)

    if kept is True:
        parameters = norm.parameters(w.shape[-1])
        if one_kernel:
            return norm.linear_output(x, w, b, *parameters)
        return norm.kernel_output(product(x, w, b, *parameters), *parameters)

    @tf.custom_gradient
    def layer(x, w, b, scale, offset):
        if kept is not False:
            again = lambda: product(x, w, b, scale, offset)  # noqa: E731
            y, backward = tf.identity(kept.y), norm.backward_from(kept, scale, offset, again)
        elif one_kernel:
            y, backward = norm.linear_pass(x, w, b, scale, offset)
        else:
            y, backward = norm.kernel_pass(product(x, w, b, scale, offset), scale, offset)

        def grad(d_y):
            d_z, d_scale, d_offset, d_b = backward(d_y)
            return (*_weight_first(x, w, d_z), d_b, d_scale, d_offset)

        return y, grad

    return layer(x, w, b, *norm.parameters(w.shape[-1]))


def _in_one_kernel(x: tf.Tensor, norm: LayerNorm) -> bool:
    """Whether ``linear_norm`` on x takes its forward pass in one ``HvdtrackLinearNorm``: its
    kernels run (``kept_for``) and the library has vector code for this CPU (its scalar code
    would be slower than TensorFlow's product). Also with oneDNN's products
    (``TF_ENABLE_ONEDNN_OPTS=1``): the kernel took 0.924 of their time with the norm here
    (``python -m hvdtrack.bench kernels``), where ``weight_gradient``'s kernel is slower."""
    return kept_for(x, norm) and vector_code()


def kept_for(x: tf.Tensor, norm: LayerNorm) -> bool:
    """Whether ``linear_norm`` on x runs the layer norm's kernels (and can keep its output):
    they are loaded, x is [rows, width] float32."""
    return norm.fused_for(x) and x.dtype == tf.float32


def _weight_first(x, w, d_out):
    """(x's gradient, w's) for x @ w, w's first (``linear_freeing_input``)."""
    d_w = weight_gradient(x, d_out)
    with tf.control_dependencies([d_w]):
        return tf.matmul(d_out, w, transpose_b=True), d_w


def weight_gradient(x: tf.Tensor, d_out: tf.Tensor) -> tf.Tensor:
    """x^T @ d_out, the gradient of w in x @ w ([rows, a] and [rows, b] -> [a, b]).

    Where the kernel library runs with vector code for this CPU (AVX-512 or AVX2), for float32
    with b a multiple of 16: its ``HvdtrackWeightGradient`` (``weight_gradient.cc``). On one
    thread of the Xeon here it ran the model's shapes at 84-107 GFLOP/s, where TensorFlow's own
    gradient of a matmul, ``matmul(x, d_out, transpose_a=True)``, ran them at 41-79; against
    the transposed product below it took 0.94-0.95 of its time (``python -m hvdtrack.bench
    kernels``, docs/performance.md); its bits do not depend on the number of threads. Elsewhere that
    matmul (also with ``TF_ENABLE_ONEDNN_OPTS=1``: oneDNN's is faster still), on the CPU taken
    the other way round (``transpose(matmul(d_out, x, transpose_a=True))``) when the result has
    more rows than columns: Eigen ran an [a, b] result with a > b at two thirds of the speed of
    its transpose here, with the same bits for the model's shapes."""
    a, b = x.shape[-1], d_out.shape[-1]
    kernels = fused_kernels()
    float32 = x.dtype == d_out.dtype == tf.float32
    if kernels and float32 and x.shape.rank == 2 and b and b % 16 == 0:
        # oneDNN's product, where the user turned it on, runs these faster still
        if vector_code() and os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "1":
            return kernels.hvdtrack_weight_gradient(x, d_out)
    if kernels and float32 and a is not None and b is not None and a > b:  # Eigen on the CPU
        return tf.transpose(tf.matmul(d_out, x, transpose_a=True))
    return tf.matmul(x, d_out, transpose_a=True)


def dense(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor | None = None, relu: bool = False):
    """x @ w, then + b (``tf.nn.bias_add``) and a ReLU if asked: one ``_FusedMatMul`` in a
    compiled step, as ``FusedLinear``; its backward pass takes w's gradient by
    ``weight_gradient`` (TensorFlow's gradient of a matmul would take the slow product)."""

    @tf.custom_gradient
    def layer(x, w, *bias):
        y = x @ w
        if bias:
            y = tf.nn.bias_add(y, bias[0])
        if relu:
            y = tf.nn.relu(y)

        def grad(d_y):
            if relu:
                d_y = tf.raw_ops.ReluGrad(gradients=d_y, features=y)
            d_bias = [tf.raw_ops.BiasAddGrad(out_backprop=d_y)] if bias else []
            return (tf.matmul(d_y, w, transpose_b=True), weight_gradient(x, d_y), *d_bias)

        return y, grad

    # Tensors, not variables: a variable read inside the function would need its own gradient
    # (tf.distribute's variables are not converted on the way in).
    weights = [w] if b is None else [w, b]
    return layer(tf.convert_to_tensor(x), *map(tf.convert_to_tensor, weights))


class LinearStack(snt.Module):
    """The Linear layers of an MLP, named like ``snt.nets.MLP``'s (``mlp/linear_<i>``)."""

    def __init__(self, sizes: tuple[int, ...], name: str = "mlp"):
        super().__init__(name=name)
        self.layers = [FusedLinear(size, name=f"linear_{i}") for i, size in enumerate(sizes)]
