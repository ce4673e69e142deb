"""Sums of edge rows per node and gathers of node rows per edge, each the other's gradient.

The message passing's two data movements: ``segment_sum`` (edges to nodes) and ``gather_sum``
(nodes to edges: the factorized edge update's first layer, two gathers, a sum and a ReLU, in one
pass over the edges). On CPU both run on the kernel library (``segment_sum.cc``,
``gather_sum.cc``) on TensorFlow's intra-op threads and give the same bits at any thread count.

``segment_add`` adds a chunk of edges' sums into an existing [N, width] accumulator (in place
on CPU), for the backward pass of ``model.recompute`` and for ``segment_sum``'s ``onto``.

``split_edges`` cuts a batch's edges into runs of consecutive edges, each its own chain of ops
in ``SegmentClassifier.core_step`` (``model.edge_runs``).

Public symbols: ``segment_sum``, ``segment_add``, ``gather_sum``, ``NodeGradients``,
``split_edges``.
"""

from __future__ import annotations

import tensorflow as tf
from graph_nets.graphs import GraphsTuple

from hvdtrack.model.kernels import fused_kernels


def segment_sum(values: tf.Tensor, segment_ids: tf.Tensor, num_segments, onto=None) -> tf.Tensor:
    """The sum of the rows of ``values`` per segment id, whose gradient is a plain gather.

    On CPU, for float32 [E, width] values and int32 ids, the kernel library's
    ``HvdtrackSegmentSum`` (``segment_sum.cc``): it runs on the intra-op threads (one range of
    rows each) and gives the same sums at any thread count, equal bit for bit to TensorFlow's
    one-thread kernel. On the 2-core Xeon of docs/performance.md two threads take 0.54-0.62 of
    TensorFlow's kernel's time at 400,000 edges but no less than one thread at 40,000.
    Elsewhere (``kernels.fused_kernels()`` is None, other dtypes) it is
    ``tf.math.unsorted_segment_sum``. TensorFlow's own gradient also handles negative (dropped)
    ids with an extra zeros_like and select over [E, width]; edge endpoints are always valid
    node indices, so those are wasted (about 5% of a training step; see
    ``hvdtrack.bench.model --breakdown``).

    With ``onto`` (the sums of the edges before these, [N, width]: an earlier run of
    ``split_edges``) the rows are added onto it (``segment_add``), each row's edges after the
    earlier ones in ascending order. With the kernel library (float32) the runs' sums then
    have the bits of one sum of all the edges, wherever a batch is cut; elsewhere they are the
    same sums up to the order of addition. Its gradient is the upstream gradient itself.

    Args:
      values: float [E, width].
      segment_ids: int32 [E], each in [0, num_segments).
      num_segments: scalar int, N (with ``onto``: unused, N is ``onto``'s rows).
      onto: None, or float [N, width].

    Returns:
      [N, width] in ``values``' dtype, row n the sum of the rows of ``values`` whose id is n
      (plus ``onto``'s row n).

    Raises:
      tf.errors.InvalidArgumentError: an id outside [0, num_segments) (named with its edge).
    """
    values, segment_ids = tf.convert_to_tensor(values), tf.convert_to_tensor(segment_ids)
    if onto is not None:

        @tf.custom_gradient
        def _add(onto, values):
            def grad(upstream):
                return upstream, tf.gather(upstream, segment_ids)

            return segment_add(onto, values, segment_ids), grad

        return _add(onto, values)
    fused = values.dtype == tf.float32 and values.shape.rank == 2
    kernels = fused_kernels() if fused and segment_ids.dtype == tf.int32 else None

    @tf.custom_gradient
    def _sum(values):
        def grad(upstream):
            return tf.gather(upstream, segment_ids)

        if kernels:
            count = tf.cast(num_segments, tf.int32)
            return kernels.hvdtrack_segment_sum(values, segment_ids, count), grad
        return tf.math.unsorted_segment_sum(values, segment_ids, num_segments), grad

    return _sum(values)


def segment_add(sums: tf.Tensor, values: tf.Tensor, segment_ids: tf.Tensor) -> tf.Tensor:
    """``sums + segment_sum(values, segment_ids, N)`` for an accumulator ``sums`` [N, width],
    without recording a gradient (it runs inside hand-written gradients: recompute's backward
    pass, ``segment_sum``'s ``onto``).

    On CPU, for float32, the kernel library's ``HvdtrackSegmentAdd``: it adds the rows into
    ``sums``' own buffer when TensorFlow can hand it over (nothing else reads it), so a loop
    over chunks of edges holds one [N, width] tensor, not the accumulator, the chunk's sums and
    their addition; each row gets its edges in ascending order, at any thread count. Elsewhere
    the addition in TensorFlow ops (the same sums up to the order of addition).

    Args:
      sums: float [N, width]; read only through the result afterwards.
      values: float [E, width].
      segment_ids: int32 [E], each in [0, N).

    Raises:
      tf.errors.InvalidArgument: an id outside [0, N) (named with its edge).
    """
    sums, values = tf.convert_to_tensor(sums), tf.convert_to_tensor(values)
    segment_ids = tf.convert_to_tensor(segment_ids)
    fused = values.dtype == tf.float32 and sums.dtype == tf.float32
    kernels = fused_kernels() if fused and segment_ids.dtype == tf.int32 else None
    if kernels:
        return kernels.hvdtrack_segment_add(sums, values, segment_ids)
    return sums + tf.math.unsorted_segment_sum(values, segment_ids, tf.shape(sums)[0])


class NodeGradients:
    """What ``gather_sum``'s backward pass adds its node terms' gradients onto, instead of
    returning them: ``receiver`` and ``sender`` sums [N, width] (in place on CPU). After the
    tape's gradient call they are the sums with this call's gradients added; read them from
    here only (the tensors given are consumed)."""

    def __init__(self, receiver: tf.Tensor, sender: tf.Tensor):
        self.receiver, self.sender = receiver, sender


def gather_sum(
    edge_terms: tuple[tf.Tensor, tf.Tensor],
    node_terms: tuple[tf.Tensor, tf.Tensor],
    receivers: tf.Tensor,
    senders: tf.Tensor,
    relu: bool,
    node_gradients: bool | NodeGradients = True,
) -> tf.Tensor:
    """``relu((a + b) + r[receivers] + s[senders])`` (without ``relu``: the sum), whose
    gradients are the upstream (through the ReLU) for a and b and its ``segment_sum`` per
    receiver and per sender for r and s (on CPU one kernel, ``HvdtrackGatherSumGrad``, makes
    all three; with one thread in one pass over the edges).

    On CPU, for float32, the kernel library's ``HvdtrackGatherSum`` (``gather_sum.cc``): one
    pass over the edges instead of two gathers, an ``AddN`` and a ``Relu`` (eleven passes over
    [E, width]), with the same bits. Elsewhere those ops.

    Args:
      edge_terms: (a, b), float [E, width] each.
      node_terms: (r, s), float [N, width] each (one N: the same nodes' terms).
      receivers, senders: int32 [E], each in [0, N).
      relu: apply the ReLU.
      node_gradients: give r and s their gradients. False: None, the forward pass of a
        caller that takes no gradient. A ``NodeGradients``: None, and the gradients are added
        onto its sums instead, in the same kernel (``model.recompute``'s chunks, which sum
        them over chunks of edges: two fresh [N, width] sums per chunk would cost more than
        the chunk).

    Returns:
      [E, width] in the terms' dtype.

    Raises:
      tf.errors.InvalidArgumentError: an index outside [0, N) (named with its edge).
    """
    (a, b), (r, s) = map(tf.convert_to_tensor, edge_terms), map(tf.convert_to_tensor, node_terms)
    receivers, senders = tf.convert_to_tensor(receivers), tf.convert_to_tensor(senders)
    fused = a.dtype == tf.float32 and receivers.dtype == senders.dtype == tf.int32
    kernels = fused_kernels() if fused else None

    @tf.custom_gradient
    def _sum(a, b, r, s):
        if kernels:  # and the ReLU's mask, one bit per element, for the gradient
            out, mask = kernels.hvdtrack_gather_sum(a, b, r, s, receivers, senders, relu=relu)
        else:
            out = tf.add_n([a, b, tf.gather(r, receivers), tf.gather(s, senders)])
            out = tf.nn.relu(out) if relu else out

        def grad(upstream):
            onto = node_gradients if isinstance(node_gradients, NodeGradients) else None
            if kernels and node_gradients is not False:
                # the ReLU's gradient and both sums in one kernel, from the mask
                empty = tf.zeros([0, r.shape[-1]], r.dtype)
                sums = (onto.receiver, onto.sender) if onto else (empty, empty)
                g, d_r, d_s = kernels.hvdtrack_gather_sum_grad(
                    upstream, mask, receivers, senders, tf.shape(r)[0], *sums, relu=relu
                )
            else:
                g = tf.raw_ops.ReluGrad(gradients=upstream, features=out) if relu else upstream
                if node_gradients is False:
                    return g, g, None, None
                if onto:
                    d_r = segment_add(onto.receiver, g, receivers)
                    d_s = segment_add(onto.sender, g, senders)
                else:
                    count = tf.shape(r)[0]
                    d_r, d_s = segment_sum(g, receivers, count), segment_sum(g, senders, count)
            if onto:
                onto.receiver, onto.sender = d_r, d_s
                return g, g, None, None
            return g, g, d_r, d_s

        return out, grad

    return _sum(a, b, r, s)


def split_edges(graphs: GraphsTuple, runs: int) -> GraphsTuple:
    """``graphs`` with its edges, senders and receivers as tuples of ``runs`` runs of
    consecutive edges (slices of the first axis), of E * (i + 1) // runs - E * i // runs edges
    each (some empty when E < runs); the runs' results put end to end are in the edges' order.
    A kernel that refuses an endpoint names the edge by its index within its run."""
    total = tf.shape(graphs.senders, out_type=tf.int64)[0]
    cuts = [total * i // runs for i in range(runs + 1)]

    def cut(x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        return tuple(x[a:b] for a, b in zip(cuts, cuts[1:]))

    return graphs.replace(
        edges=cut(graphs.edges), senders=cut(graphs.senders), receivers=cut(graphs.receivers)
    )
