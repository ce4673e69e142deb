"""Layer normalisation of the model's latents: ``snt.LayerNorm``'s function and variables, with
a fused CPU kernel.

On CPU the normalisation runs as two fused kernels of the kernel library (``layer_norm.cc``:
one pass over [rows, width] forward, one backward; built and loaded by ``kernels``). With them
the training step on 10k nodes / 80k edges takes 2.0 s instead of 2.6 s (1 thread,
docs/performance.md). The same maths in TensorFlow ops (``_layer_norm_ops``) runs wherever
``kernels.fused_kernels()`` is None: on GPUs, without a C++ compiler, with
``HVDTRACK_FUSED_OPS=0``, and in functions traced under ``kernels.plain_ops()``. Both give the
same values to float32 rounding (tests/model/test_layer_norm.py).

Public symbols: ``LayerNorm``, ``NormOutput``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import sonnet as snt
import tensorflow as tf

from hvdtrack.model.kernels import fused_kernels

# ``layer_norm.cc``'s rule for reading the normalised input back from the output: every column
# with a scale of at least MIN_SCALE in size and an offset at most MAX_OFFSET_RATIO times it.
MIN_SCALE = 1e-20
MAX_OFFSET_RATIO = 16.0


class NormOutput(NamedTuple):
    """A fused layer norm's output y [rows, width] with what its backward pass reads besides
    y and the parameters: per row mean and rstd [rows], and the ReLU's mask (uint8 [rows,
    ceil(width / 8)] with ``relu``, else [rows, 0]). Rows of it are the same rows' norm."""

    y: tf.Tensor
    mean: tf.Tensor
    rstd: tf.Tensor
    mask: tf.Tensor


class LayerNorm(snt.Module):
    """Layer normalisation over the last axis: ``snt.LayerNorm``'s function and variables
    (``layer_norm/scale``, ``layer_norm/offset``, eps 1e-5), fused on CPU (module docstring).

    With ``relu=True`` it normalises ``tf.nn.relu(x)`` (the same values and gradients), and
    the fused kernels keep one bit per element for the ReLU's gradient instead of its output.
    """

    def __init__(self, eps: float = 1e-5, relu: bool = False, name: str = "layer_norm"):
        super().__init__(name=name)
        self.eps = eps
        self.relu = relu

    @snt.once
    def _create(self, width: int) -> None:
        self.scale = tf.Variable(tf.ones([width]), name="scale")
        self.offset = tf.Variable(tf.zeros([width]), name="offset")

    def parameters(self, width: int) -> tuple[tf.Tensor, tf.Tensor]:
        """scale and offset [width], created first, read as float32 tensors: statistics of a
        64-wide row in bfloat16 or float16 would lose most of their digits. Their gradients
        come from the custom gradients they are passed to."""
        self._create(width)
        return tf.cast(self.scale, tf.float32), tf.cast(self.offset, tf.float32)

    def fused_for(self, x: tf.Tensor) -> bool:
        """Whether ``kernel_pass`` runs on x (the kernel library is loaded, x is [rows, width])."""
        return fused_kernels() is not None and x.shape.rank == 2

    def kernel_pass(self, x: tf.Tensor, scale: tf.Tensor, offset: tf.Tensor):
        """The forward kernel on x (``fused_for(x)``) with ``parameters``: (y in x's dtype,
        backward), backward(dy) -> (dx, dscale, doffset, dsum), dsum the column sums of dx
        (the gradient of a bias added to x, summed in the same pass). For a caller's own
        custom gradient (``mlp.linear_norm``); ``__call__`` records the gradient itself."""
        return _kernel_pass(fused_kernels(), x, scale, offset, self.eps, self.relu)

    def kernel_output(self, x: tf.Tensor, scale: tf.Tensor, offset: tf.Tensor) -> NormOutput:
        """The forward kernel on float32 x (``fused_for(x)``), no gradient recorded: its
        output with what ``backward_from`` needs of it (a recomputed step keeps these)."""
        y, mean, rstd, _, mask = fused_kernels().hvdtrack_layer_norm(
            x, scale, offset, epsilon=self.eps, relu=self.relu
        )
        return NormOutput(y, mean, rstd, mask)

    def linear_pass(self, x, w, b, scale, offset):
        """``kernel_pass`` of x @ w + b in one kernel (``HvdtrackLinearNorm``; float32 x [rows,
        K], w [K, width], b [width]; the library with vector code for this CPU): the product's
        rows go into the norm from cache, written only where y cannot give them back (the
        kernel's kept output, which the backward pass then reads)."""
        kernels = fused_kernels()
        outputs = kernels.hvdtrack_linear_norm(
            x, w, b, scale, offset, epsilon=self.eps, relu=self.relu
        )
        return outputs[0], _backward(kernels, outputs, scale, offset, self.relu)

    def linear_output(self, x, w, b, scale, offset) -> NormOutput:
        """``kernel_output`` of x @ w + b in one kernel (``linear_pass``), no gradient recorded.
        ``backward_from`` reads it as it reads ``kernel_output``'s."""
        y, mean, rstd, _, mask = fused_kernels().hvdtrack_linear_norm(
            x, w, b, scale, offset, epsilon=self.eps, relu=self.relu
        )
        return NormOutput(y, mean, rstd, mask)

    def linear_product(self, x, w, b, scale, offset) -> tf.Tensor:
        """x @ w + b as ``linear_pass`` computes it, where y cannot give it back (the kernel's
        kept output; elsewhere that is empty): ``backward_from``'s ``x_again`` for a kept
        ``linear_output``, the same bits as the forward pass's product."""
        return fused_kernels().hvdtrack_linear_norm(
            x, w, b, scale, offset, epsilon=self.eps, relu=self.relu
        )[3]

    def backward_from(
        self, kept: NormOutput, scale, offset, x_again: Callable[[], tf.Tensor]
    ) -> Callable:
        """``kernel_pass``'s backward (float32) from a kept ``kernel_output`` of the same
        ``scale`` and ``offset``, without x: the normalised input comes back from y, or, where
        ``layer_norm.cc``'s rule says y cannot give it back, from ``x_again()`` (x computed
        again, in the backward pass)."""
        kernels = fused_kernels()

        def backward(upstream):
            with tf.name_scope("layer_norm_grad"):
                width = kept.y.shape[-1]
                source = tf.cond(
                    _invertible(scale, offset), lambda: tf.zeros([0, width]), x_again
                )  # fmt: skip
                return kernels.hvdtrack_layer_norm_grad(
                    upstream, source, kept.y, kept.mask, scale, offset, kept.mean, kept.rstd,
                    relu=self.relu,
                )  # fmt: skip

        return backward

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """float [rows, width] -> normalised per row (in float32), then scaled and offset per
        column, in the dtype of x."""
        scale, offset = self.parameters(x.shape[-1])
        kernels = fused_kernels() if x.shape.rank == 2 else None
        if kernels:  # casts inside: what the backward pass keeps is x in its own dtype
            return _layer_norm_fused(kernels, x, scale, offset, self.eps, self.relu)
        if self.relu:
            x = tf.nn.relu(x)
        if x.dtype == tf.float32:
            return _layer_norm_ops(x, scale, offset, self.eps)
        return tf.cast(_layer_norm_ops(tf.cast(x, tf.float32), scale, offset, self.eps), x.dtype)


def _invertible(scale: tf.Tensor, offset: tf.Tensor) -> tf.Tensor:
    """Whether y = n * scale + offset gives n back to float32 rounding (``layer_norm.cc``'s
    ``InvertibleFromOutput``; a NaN fails it)."""
    size = tf.abs(scale)
    return tf.reduce_all((size >= MIN_SCALE) & (tf.abs(offset) <= MAX_OFFSET_RATIO * size))


def _layer_norm_fused(kernels, x, scale, offset, eps: float, relu: bool) -> tf.Tensor:
    """The kernels on x of any float dtype, computing in float32 (``_kernel_pass``)."""

    @tf.custom_gradient
    def norm(x, scale, offset):
        y, backward = _kernel_pass(kernels, x, scale, offset, eps, relu)
        return y, lambda upstream: backward(upstream)[:3]

    return norm(x, scale, offset)


def _kernel_pass(kernels, x, scale, offset, eps: float, relu: bool):
    """The forward kernel on x: (y in x's dtype, backward), backward(upstream) -> (dx, dscale,
    doffset, dsum), dsum the column sums of dx (the gradient of a bias added to x).

    In float32 the backward pass reads the normalised input back from the output, which the
    next layer keeps anyway, and keeps no copy of x (``layer_norm.cc``: one [rows, width]
    tensor less per layer norm, 2 KB per edge over the default model's 8 edge updates); the
    kernel hands x over instead (``kept``) when the scale and offset would not give it back to
    float32 rounding. In bfloat16 the output has too few digits for that: the backward pass
    keeps x as it came and casts it again (a float32 copy would be another 4 bytes per
    element)."""
    outputs = kernels.hvdtrack_layer_norm(
        tf.cast(x, tf.float32), scale, offset, epsilon=eps, relu=relu
    )
    cast_again = None if x.dtype == tf.float32 else x
    return tf.cast(outputs[0], x.dtype), _backward(
        kernels, outputs, scale, offset, relu, cast_again
    )


def _backward(kernels, outputs, scale, offset, relu: bool, cast_again=None) -> Callable:
    """The gradient kernel's backward pass from a forward kernel's ``outputs`` (y, mean, rstd,
    kept, mask): the normalised input from y, or from kept where the kernel handed its input
    over; with ``cast_again`` (x in bfloat16), from x cast to float32 when the gradient comes,
    and dx in x's dtype."""
    y, mean, rstd, kept, mask = outputs

    def backward(upstream):
        with tf.name_scope("layer_norm_grad"):  # named for the step's op breakdown
            if cast_again is None:
                source, output = kept, y
            else:
                # Cast when the gradient comes: a cast that needs only x would run as soon
                # as x exists, and every layer's copy would wait for the backward pass.
                with tf.control_dependencies([upstream]):
                    source = tf.cast(cast_again, tf.float32)
                output = tf.zeros([0, y.shape[-1]], tf.float32)
            dx, d_scale, d_offset, d_sum = kernels.hvdtrack_layer_norm_grad(
                tf.cast(upstream, tf.float32), source, output, mask, scale, offset, mean, rstd,
                relu=relu,
            )  # fmt: skip
            dtype = tf.float32 if cast_again is None else cast_again.dtype
            return tf.cast(dx, dtype), d_scale, d_offset, d_sum

    return backward


def _layer_norm_ops(x: tf.Tensor, scale: tf.Tensor, offset: tf.Tensor, eps: float) -> tf.Tensor:
    """The same maths in TensorFlow ops, with a hand-written gradient that reuses the forward's
    normalised input instead of differentiating ``tf.nn.moments`` op by op."""

    @tf.custom_gradient
    def norm(x, scale, offset):
        centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        inverse_std = tf.math.rsqrt(
            tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True) + eps
        )
        normed = centred * inverse_std

        def grad(upstream):
            with tf.name_scope("layer_norm_grad"):  # named for the step's op breakdown
                g = upstream * scale
                mean_g = tf.reduce_mean(g, axis=-1, keepdims=True)
                mean_gx = tf.reduce_mean(g * normed, axis=-1, keepdims=True)
                dx = inverse_std * (g - mean_g - normed * mean_gx)
                d_scale = tf.reduce_sum(upstream * normed, axis=0)
                return dx, d_scale, tf.reduce_sum(upstream, axis=0)

        return normed * scale + offset, grad

    return norm(x, scale, offset)
