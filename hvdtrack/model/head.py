"""The output head's backward pass from its input and one bit per hidden unit.

The default head is ``logit = relu(e @ w1 + b1) @ w2 + b2`` on every step's new edge latents e
[E, L], hidden width H (``model.output_head: [64]``). Its gradients, with D = dlogit * mask
[E, H] (mask: where ``e @ w1 + b1 > 0``) and M = e^T D [L, H]:

    dw1 = M * w2^T            dw2 = sum_rows(w1 * M)^T + (b1 * sum_rows(D))^T
    db1 = sum_rows(D) * w2^T  db2 = sum(dlogit)       de = (D * w2^T) @ w1^T

(dw2 = hidden^T dlogit, with hidden = mask * (e @ w1 + b1) written out). So the backward pass
needs e, which the next step keeps anyway, and the mask, not the hidden layer: ``lean_head``
keeps the mask packed into bits, 8 bytes per edge instead of 256 in float32 (1.9 KB per edge
over the default model's 8 heads). The products are the ones the gradient of a plain head
takes (M, by ``mlp.weight_gradient``, is its dw1 before the scaling by w2; de = D @ (w1 *
w2^T)^T), so the time is the same. On CPU the kernel library takes the forward pass in one
pass over the edges (``HvdtrackHead``, ``head.cc``: hidden [E, H] is never written; without
vector code for the CPU a ``_FusedMatMul``, ``HvdtrackReluMask`` and a product) and makes D
(``HvdtrackMaskedColumn`` in ``layer_norm.cc``); elsewhere TensorFlow's ops, with
``pack_bits`` / ``unpack_bits``.

TensorFlow runs a head's backward pass as soon as its logit's gradient exists, at the start of
the backward pass, and would hold each head's de [E, L] until the backward pass reaches its step.
So the latents pass through the head (``lean_head`` returns them with the logit) and its
backward pass waits for their gradient from the later steps: until then only the bits and
dlogit [E] are held.

Public symbols: ``lean_head``, ``is_lean``, ``in_one_kernel``, ``pack_bits``, ``unpack_bits``.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from hvdtrack.model.config import ModelConfig
from hvdtrack.model.kernels import fused_kernels, vector_code
from hvdtrack.model.mlp import weight_gradient
from hvdtrack.model.segments import gather_sum, segment_sum

# Not a tensor at import: that would start TensorFlow's runtime before the threads are set.
_POWERS = (1, 2, 4, 8, 16, 32, 64, 128)


def is_lean(config: ModelConfig, dtype: tf.DType) -> bool:
    """Whether the model's head runs as ``lean_head`` on latents of ``dtype``: one hidden ReLU
    layer, in float32 (``SegmentClassifier.core_step``)."""
    return config.activation == "relu" and len(config.output_head) == 1 and dtype == tf.float32


def in_one_kernel(dtype: tf.DType) -> bool:
    """Whether ``lean_head``'s forward pass on latents of ``dtype`` is one ``HvdtrackHead``:
    float32, the kernel library loaded, with vector code for this CPU."""
    return dtype == tf.float32 and vector_code()


def pack_bits(mask: tf.Tensor) -> tf.Tensor:
    """bool [rows, width] -> uint8 [rows, ceil(width / 8)], column c in bit c % 8 of byte c // 8."""
    rows, width = tf.shape(mask)[0], mask.shape[-1]
    padded = tf.pad(mask, [[0, 0], [0, -width % 8]])
    grouped = tf.reshape(tf.cast(padded, tf.uint8), [rows, -1, 8]) * tf.constant(_POWERS, tf.uint8)
    return tf.reduce_sum(grouped, axis=-1)  # distinct powers of two: no carry


def unpack_bits(bits: tf.Tensor, width: int) -> tf.Tensor:
    """``pack_bits``'s inverse: bool [rows, width]."""
    rows = tf.shape(bits)[0]
    set_ = tf.bitwise.bitwise_and(bits[:, :, None], tf.constant(_POWERS, tf.uint8)) > 0
    return tf.reshape(set_, [rows, -1])[:, :width]


def lean_head(
    edges: tf.Tensor, w1: tf.Tensor, b1: tf.Tensor, w2: tf.Tensor, b2: tf.Tensor, wait: bool,
    sums: Optional[tuple[tf.Tensor, tf.Tensor, tf.Tensor]] = None,
    onto: Optional[tuple[tf.Tensor, tf.Tensor]] = None,
) -> tuple[tf.Tensor, ...]:  # fmt: skip
    """The head's logits float32 [E, 1] and the edges passed through (module docstring).

    Args:
      edges: float32 [E, L], the step's new edge latents.
      w1, b1, w2, b2: the head's weights [L, H], [H], [H, 1], [1], read as tensors.
      wait: a later step reads the latents passed through: the backward pass waits for their
        gradient (else the latents returned are ``edges`` itself, and nothing waits).
      sums: (receivers, senders, N), with ``wait``: also return the node update's sums of the
        latents per receiver and per sender ([N, L] each, ``segments.segment_sum``). The
        latents' gradient is then the later steps', the head's and the sums' (two gathers)
        added in one pass (``segments.gather_sum``) instead of two gathers and two additions,
        each writing an [E, L] tensor.
      onto: with ``sums``, the sums per receiver and per sender of the edges before these
        (an earlier run of ``segments.split_edges``): the sums returned are these with this
        run's rows added, each row's edges in order (``segments.segment_sum``'s ``onto``:
        with the kernel library, the bits of one sum over all the runs).

    Returns:
      (edges, logits), or with ``sums`` (edges, logits, received, sent): the latents to hand
      to the later steps, the logits, and the sums.
    """

    if onto is not None and sums is None:
        raise ValueError("lean_head: onto needs sums (the ids the sums are taken by)")
    if not wait:
        if sums is not None:
            raise ValueError("lean_head: sums need wait=True (a later step reads the latents)")
        return edges, _head_only(edges, w1, b1, w2, b2)
    if sums is None:
        return _head_passing_edges(edges, w1, b1, w2, b2)
    receivers, senders, count = sums

    @tf.custom_gradient
    def head_and_sums(edges, w1, b1, w2, b2, *before):
        logits, backward = _forward(edges, w1, b1, w2, b2)
        received, sent = (
            segment_sum(edges, ids, count, onto=b)
            for ids, b in zip((receivers, senders), before or (None, None))
        )

        def grad(d_later, d_logits, d_received, d_sent):
            with tf.control_dependencies([d_later]):  # the wait (as _head_passing_edges)
                d_logits = tf.identity(d_logits)
            d_edges, *weights = backward(d_logits)
            terms = (d_edges, d_later), (d_received, d_sent)
            d_before = (d_received, d_sent) if before else ()
            return (gather_sum(*terms, receivers, senders, relu=False), *weights, *d_before)

        return (tf.identity(edges), logits, received, sent), grad

    return head_and_sums(edges, w1, b1, w2, b2, *(onto or ()))


def _forward(edges, w1, b1, w2, b2):
    """The logits [E, 1], and the backward pass from dlogit: (de, dw1, db1, dw2, db2)."""
    width = w1.shape[-1]
    kernels = fused_kernels()
    if in_one_kernel(edges.dtype):  # the whole forward pass in one kernel: hidden never written
        logits, bits = kernels.hvdtrack_head(edges, w1, b1, w2, b2)
    else:
        hidden = tf.nn.relu(tf.nn.bias_add(edges @ w1, b1))  # one _FusedMatMul
        bits = kernels.hvdtrack_relu_mask(hidden) if kernels else pack_bits(hidden > 0)
        # The bits before the logits: else one inter-op thread may leave the mask for later
        # and hold hidden [E, H] until then (a whole step's worth at 640k edges).
        with tf.control_dependencies([bits]):
            logits = tf.nn.bias_add(hidden @ w2, b2)

    def backward(d_logits):
        if kernels:  # and D's column sums, while each row is in cache
            d, d_sum = kernels.hvdtrack_masked_column(bits, d_logits, width=width)
        else:
            d = tf.cast(unpack_bits(bits, width), tf.float32) * d_logits
            d_sum = tf.reduce_sum(d, axis=0)
        m = weight_gradient(edges, d)
        w2_row = tf.reshape(w2, [1, width])
        d_w2 = tf.reshape(tf.reduce_sum(w1 * m, axis=0) + b1 * d_sum, [width, 1])
        d_edges = tf.matmul(d, w1 * w2_row, transpose_b=True)  # (D * w2^T) @ w1^T
        return d_edges, m * w2_row, d_sum * w2_row[0], d_w2, tf.reduce_sum(d_logits, axis=0)

    return logits, backward


@tf.custom_gradient
def _head_only(edges, w1, b1, w2, b2):
    return _forward(edges, w1, b1, w2, b2)


@tf.custom_gradient
def _head_passing_edges(edges, w1, b1, w2, b2):
    logits, backward = _forward(edges, w1, b1, w2, b2)

    def grad(d_later, d_logits):
        # The wait: nothing of this runs before the later steps' gradient of the latents.
        with tf.control_dependencies([d_later]):
            d_logits = tf.identity(d_logits)
        d_edges, *weights = backward(d_logits)
        return (d_edges + d_later, *weights)

    return (tf.identity(edges), logits), grad
