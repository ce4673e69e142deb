"""Recomputation down to the step boundaries, edges in chunks (``model.recompute``).

A training step of the segment classifier keeps, for its backward pass, only what cannot be
recomputed cheaply:

- the step boundaries: each message-passing step's input node and edge latents [N, L_n] and
  [E, L_e] (the previous step's outputs), the encoded latents and the step-invariant node
  terms, which every step reads;
- the graph's inputs and gather indices (senders, receivers), shared by every step.

Everything else (the edge MLP's [E, 128] layers, the gathered sender and receiver rows, the
layer-norm statistics, the output head, the node MLP and its sums) is computed again in the
backward pass. Both passes run the per-edge work in chunks of ``chunk_edges`` edges (a
``tf.while_loop`` of one chunk at a time), so the working memory beyond the boundaries is one
chunk's, whatever the graph's size. The maths are the plain step's: the chunks are rows of the
same products, and gradients that sum over edges (weights, node rows) add the chunks' parts.

``offload`` keeps the boundaries in host memory between the passes (``/CPU:0`` copies made in
the forward pass, copied back in the backward pass): on a GPU that frees its memory of every
step but the one running; on a CPU the copies are the tensors themselves.

``recomputed_step`` and ``recomputed_rows`` take the model's parts as callables (``StepParts``),
so this module knows nothing of Sonnet or graph_nets.

Public symbols: ``StepParts``, ``map_chunks``, ``recomputed_rows``, ``recomputed_step``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import tensorflow as tf

from hvdtrack.model.segments import segment_sum

ZERO = tf.UnconnectedGradients.ZERO


@dataclasses.dataclass(frozen=True)
class StepParts:
    """One message-passing step as row-wise and node-wise parts (see ``SegmentClassifier``).

    Attributes:
      node_terms: (x, xe, invariant) -> (R, S), [N, H] each: what the edge rows gather from the
        receiver and the sender (node-wise).
      edge_rows: (e, ee, R rows, S rows) -> new edge latents, for any rows of the edges.
      head_rows: new edge latents -> logits [rows], for any rows.
      node_rows: (received sums, sent sums, x, xe) -> new node latents [N, L_n].
    """

    node_terms: Callable
    edge_rows: Callable
    head_rows: Callable
    node_rows: Callable


def _chunks(rows: tf.Tensor, chunk: int) -> tf.Tensor:
    """The number of chunks of ``chunk`` rows covering ``rows`` rows (one for none)."""
    return tf.maximum((rows + chunk - 1) // chunk, 1)


def _loop(count: tf.Tensor, body: Callable, state):
    """``state = body(i, state)`` for i in 0 .. count - 1, one chunk at a time (parallel
    iterations would hold several chunks' working memory at once)."""
    _, state = tf.while_loop(
        lambda i, _: i < count,
        lambda i, s: (i + 1, body(i, s)),
        (tf.constant(0), state),
        parallel_iterations=1,
    )
    return state


def _array(count: tf.Tensor, like: tf.Tensor, dtype=None) -> tf.TensorArray:
    return tf.TensorArray(
        dtype or like.dtype, size=count, infer_shape=False, element_shape=[None, *like.shape[1:]]
    )


def map_chunks(fn: Callable, rows: Sequence[tf.Tensor], chunk: int) -> tuple[tf.Tensor, ...]:
    """``fn`` applied to chunks of ``chunk`` rows of ``rows`` (all [E, ...]), its outputs
    ([rows, ...] each, given by ``fn`` as a tuple) concatenated. No gradient is recorded."""
    count = _chunks(tf.shape(rows[0])[0], chunk)
    probe = fn(*(r[:0] for r in rows))  # the outputs' dtypes and widths

    def body(i, arrays):
        outputs = fn(*(r[i * chunk : (i + 1) * chunk] for r in rows))
        return [a.write(i, y) for a, y in zip(arrays, outputs)]

    arrays = _loop(count, body, [_array(count, p) for p in probe])
    return tuple(a.concat() for a in arrays)


def recomputed_rows(fn: Callable[[tf.Tensor], tf.Tensor], rows: tf.Tensor, chunk: int):
    """``fn(rows)`` for a row-wise ``fn`` ([E, F] -> [E, W]), whose backward pass computes it
    again, chunk by chunk, keeping only ``rows``."""

    @tf.custom_gradient
    def apply(rows):
        (out,) = map_chunks(lambda r: (fn(r),), [rows], chunk)

        def grad(upstream, variables=None):
            with tf.control_dependencies([upstream]):
                return backward(upstream, list(variables or ()))

        def backward(upstream, variables):
            def body(i, state):
                grads, weights = state
                part = rows[i * chunk : (i + 1) * chunk]
                with tf.GradientTape() as tape:
                    tape.watch(part)
                    y = fn(part)
                g = tape.gradient(
                    y, [part, *variables], upstream[i * chunk : (i + 1) * chunk], ZERO
                )
                return grads.write(i, g[0]), [w + d for w, d in zip(weights, g[1:])]

            count = _chunks(tf.shape(rows)[0], chunk)
            state = (_array(count, rows), [tf.zeros_like(v) for v in variables])
            grads, weights = _loop(count, body, state)
            return (grads.concat(), weights) if variables else grads.concat()

        return out, grad

    return apply(rows)


def recomputed_step(
    parts: StepParts,
    senders: tf.Tensor,
    receivers: tf.Tensor,
    chunk: int,
    output: bool,
    last: bool = False,
    offload: bool = False,
):
    """One message-passing step that keeps only its boundaries for the backward pass.

    Args:
      parts: the model's step (``StepParts``).
      senders, receivers: int32 [E], the edges' endpoints.
      chunk: edges per chunk.
      output: the step computes its logits.
      last: no step follows: the new node latents are not computed (nothing reads them) and
        the new edge latents are not kept (its backward pass computes them again per chunk).
      offload: keep the boundaries in host memory between the passes.

    Returns:
      step(x, e, xe, ee, *invariant) -> (x', e', logits, xe, ee, *invariant): the new node
      latents (``last``: x itself), the new edge latents, the step's logits [E] (``output``;
      else [0]) and the shared inputs passed on. The next step takes those: their gradients
      then arrive summed over the later steps, one tensor each instead of one per step.
    """

    def rows_of(i, *tensors):
        return [t[i * chunk : (i + 1) * chunk] for t in tensors]

    @tf.custom_gradient
    def step(x, e, xe, ee, *invariant):
        num_nodes = tf.shape(x)[0]
        r, s = parts.node_terms(x, xe, invariant)

        def edge_chunk(e_c, ee_c, recv_c, send_c):
            new = parts.edge_rows(e_c, ee_c, tf.gather(r, recv_c), tf.gather(s, send_c))
            return (new, parts.head_rows(new)) if output else (new,)

        new_edges, *logits = map_chunks(edge_chunk, [e, ee, receivers, senders], chunk)
        if last:
            new_nodes = tf.identity(x)
        else:
            received = segment_sum(new_edges, receivers, num_nodes)
            sent = segment_sum(new_edges, senders, num_nodes)
            new_nodes = parts.node_rows(received, sent, x, xe)
        logits = logits[0] if output else tf.zeros([0], new_edges.dtype)
        device = x.device
        kept = [_to_host(t) if offload else t for t in (x, e, *(() if last else (new_edges,)))]

        def grad(*upstream, variables=None):
            # Nothing is recomputed before the gradients of the step's outputs arrive: ops that
            # need only the kept boundaries would otherwise run as soon as they could, for
            # every step at once at the start of the backward pass.
            with tf.control_dependencies([g for g in upstream if g is not None]):
                return backward(*upstream, variables=list(variables or ()))

        def backward(g_nodes, g_edges, g_logits, g_xe_later, g_ee, *g_invariant, variables):
            x, e, *new_edges = [_to_device(t, device) if offload else t for t in kept]
            # Tensors of their own (the first step's x is xe): a tape's gradient with respect to
            # one tensor listed twice would give each entry both uses.
            x, own_xe = tf.identity(x), tf.identity(xe)
            if g_logits is None:
                g_logits = tf.zeros_like(logits)
            g_x, g_xe = tf.zeros_like(x), _or_zeros(g_xe_later, own_xe)
            g_vars = [tf.zeros_like(v) for v in variables]
            g_received = g_sent = None
            if not last and g_nodes is not None:
                # The node part, node-wise: the gradients of its sums and inputs.
                (new_edges,) = new_edges
                received = segment_sum(new_edges, receivers, num_nodes)
                sent = segment_sum(new_edges, senders, num_nodes)
                with tf.GradientTape() as tape:
                    tape.watch([received, sent, x, own_xe])
                    new_nodes = parts.node_rows(received, sent, x, own_xe)
                sources = [received, sent, x, own_xe, *variables]
                g_received, g_sent, g_x, g_xe_own, *g_vars = tape.gradient(
                    new_nodes, sources, g_nodes, ZERO
                )
                g_xe += g_xe_own
            # The node terms the edge rows gather: their gradients are summed over the chunks.
            with tf.GradientTape() as terms_tape:
                terms_tape.watch([x, own_xe, *invariant])
                r, s = parts.node_terms(x, own_xe, invariant)

            def body(i, state):
                g_r, g_s, g_vars, g_e_parts, g_ee_parts = state
                e_c, ee_c, recv_c, send_c = rows_of(i, e, ee, receivers, senders)
                # The last step's outputs have no gradient from later steps (None): zeros of a
                # chunk, not of every edge.
                g_new = tf.zeros_like(e_c) if g_edges is None else rows_of(i, g_edges)[0]
                g_ee_c = tf.zeros_like(ee_c) if g_ee is None else rows_of(i, g_ee)[0]
                if g_received is not None:
                    g_new += tf.gather(g_received, recv_c) + tf.gather(g_sent, send_c)
                with tf.GradientTape() as tape:
                    r_c, s_c = tf.gather(r, recv_c), tf.gather(s, send_c)
                    tape.watch([e_c, ee_c, r_c, s_c])
                    new = parts.edge_rows(e_c, ee_c, r_c, s_c)
                    targets, upstream = [new], [g_new]
                    if output:
                        targets.append(parts.head_rows(new))
                        upstream.append(rows_of(i, g_logits)[0])
                g_e_c, g_ee_own, g_r_c, g_s_c, *g_w = tape.gradient(
                    targets, [e_c, ee_c, r_c, s_c, *variables], upstream, ZERO
                )
                return (
                    g_r + segment_sum(g_r_c, recv_c, num_nodes),
                    g_s + segment_sum(g_s_c, send_c, num_nodes),
                    [a + b for a, b in zip(g_vars, g_w)],
                    g_e_parts.write(i, g_e_c),
                    g_ee_parts.write(i, g_ee_c + g_ee_own),
                )

            count = _chunks(tf.shape(e)[0], chunk)
            state = (
                tf.zeros_like(r),
                tf.zeros_like(s),
                g_vars,
                _array(count, e),
                _array(count, ee),
            )
            g_r, g_s, g_vars, g_e_parts, g_ee_parts = _loop(count, body, state)
            terms = terms_tape.gradient(
                [r, s], [x, own_xe, *invariant, *variables], [g_r, g_s], ZERO
            )
            g_inputs = [
                g_x + terms[0],
                g_e_parts.concat(),
                g_xe + terms[1],
                g_ee_parts.concat(),
                *(_or_zeros(g, t) + d for g, t, d in zip(g_invariant, invariant, terms[2:])),
            ]
            g_vars = [a + b for a, b in zip(g_vars, terms[2 + len(invariant) :])]
            return (g_inputs, g_vars) if variables else g_inputs

        shared = [tf.identity(t) for t in (xe, ee, *invariant)]
        return (new_nodes, new_edges, logits, *shared), grad

    return step


def _or_zeros(gradient: Optional[tf.Tensor], like: tf.Tensor) -> tf.Tensor:
    return tf.zeros_like(like) if gradient is None else gradient


def _to_host(t: tf.Tensor) -> tf.Tensor:
    with tf.device("/CPU:0"):
        return tf.identity(t)


def _to_device(t: tf.Tensor, device: Optional[str]) -> tf.Tensor:
    with tf.device(device or None):
        return tf.identity(t)
