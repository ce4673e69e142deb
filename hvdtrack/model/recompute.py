"""Recomputation down to the step boundaries, edges in chunks (``model.recompute``).

A training step of the segment classifier keeps, for its backward pass, only what cannot be
recomputed cheaply:

- the step boundaries: each message-passing step's input node and edge latents [N, L_n] and
  [E, L_e] (the previous step's outputs), and the encoded latents, which every step reads;
- the graph's inputs and gather indices (senders, receivers), shared by every step.

Everything else (the encoders' layers, the edge MLP's [E, 128] layers, the gathered sender and
receiver rows and the node terms they come from, the layer-norm statistics, the output head,
the node MLP and its sums) is computed again in the backward pass. Both passes run the per-edge
and per-node work in chunks of ``chunk_edges`` rows (a ``tf.while_loop``, at most two chunks at a
time), so the working memory beyond the boundaries is two chunks', whatever the graph's size.
The maths are the plain step's: the chunks are rows of the same products, and gradients that
sum over rows (weights, node rows) add the chunks' parts (node rows in place:
``segments.segment_add``). All steps are one function (``recomputed_steps``), so its backward
pass can write each step's edge gradients over that step's input edge latents, which nothing
reads any more once their per-node sums are taken: no [E, L_e] buffer beyond the boundaries
but the incoming gradients and the encoded edges' gradient sum.

Speed first (``StepParts.keeps_norm``, the model's ``keep_edge_term``, with every step's
boundaries kept and no offload): the forward pass also keeps what the edge rows' last layer
norm needs for its gradient beside its output (row statistics and the ReLU's mask), and its
new edges' sums per node. A step's new edges are the next step's input edges, kept anyway, so
the backward pass computes neither the last layer and its norm nor those sums again; the next
step's backward pass then writes its gradients over the incoming ones, not over its inputs.

The backward pass differentiates the rows (``tf.GradientTape``) chunk by chunk. The
gathered node rows' gradients, in the factorized update those of the term every step shares
(``e_enc @ W_e_enc + b``), are added per node in place, never through the gathers' own
gradients: by the gather's gradient kernel as it makes that term's (``segments.NodeGradients``),
else by ``segments.segment_add``; each chunk loop carries weight-gradient sums for the variables
its rows read only.

``offload`` keeps the boundaries in host memory between the passes (``/CPU:0`` copies made in
the forward pass, copied back in the backward pass): on a GPU that frees its memory of every
step but the one running; on a CPU the copies are the tensors themselves.

``recomputed_steps`` and ``recomputed_rows`` take the model's parts as callables (``StepParts``),
so this module knows nothing of Sonnet or graph_nets.

The chunk loops themselves are ``chunks``'s.

Public symbols: ``StepParts``, ``recomputed_rows``, ``recomputed_steps``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import tensorflow as tf

from hvdtrack.model.chunks import chunk_count, chunk_loop, empty_rows, map_chunks, write_rows
from hvdtrack.model.norm import NormOutput
from hvdtrack.model.segments import NodeGradients, gather_sum, segment_add, segment_sum

NONE = tf.UnconnectedGradients.NONE


@dataclasses.dataclass(frozen=True)
class StepParts:
    """One message-passing step as row-wise and node-wise parts (see ``SegmentClassifier``).

    Attributes:
      node_terms: (x, xe) -> (R, S), [N, H] each: what the edge rows gather from the
        receiver and the sender (node-wise).
      edge_term: encoded edge rows -> T rows, the part of the edge rows' input that every step
        shares (the factorized update's ``e_enc @ W_e_enc + b``); None: T is the encoded
        edges themselves.
      edge_rows: (e, T, R, S, receivers, senders, node_gradients, kept) -> new edge latents,
        for any rows of the edges (e, T and the rows' endpoints; R and S whole, gathered
        inside); node_gradients as ``segments.gather_sum``'s (False in the forward pass; with
        ``summed``, the backward pass gives a ``NodeGradients`` to add R's and S's onto);
        kept as ``mlp.linear_norm``'s (False unless ``keeps_norm``).
      head_rows: new edge latents -> logits [rows], for any rows.
      node_rows: (received sums, sent sums, x, xe) -> new node latents [N, L_n].
      summed: ``edge_rows`` adds the gathered rows of R and S to T (the factorized update), so
        their gradients are T's: the gather's gradient kernel sums them per node onto the
        backward pass's sums as it makes T's (``node_gradients``), not through the gathers.
      keeps_norm: ``edge_rows`` ends in a layer norm whose output it can keep: with kept True
        it returns a ``norm.NormOutput`` (the new latents and the norm's row statistics),
        with kept such an output of the same rows it returns those latents, and its backward
        pass reads them instead of computing its last layer and norm again.
    """

    node_terms: Callable
    edge_term: Optional[Callable]
    edge_rows: Callable
    head_rows: Callable
    node_rows: Callable
    summed: bool = False
    keeps_norm: bool = False


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
            (grads,), weights = _vjp_in_chunks(fn, [rows], upstream, variables, chunk)
            weights = [_or_zeros(w, v) for w, v in zip(weights, variables)]
            return (grads, weights) if variables else grads

        return out, grad

    return apply(rows)


def _vjp_in_chunks(fn: Callable, rows: Sequence[tf.Tensor], upstream, variables, chunk: int):
    """The gradients of a row-wise ``fn(*rows)`` for ``upstream``, computed again one chunk of
    ``chunk`` rows at a time: ([one per tensor of ``rows``, each written into one buffer],
    [one per variable, summed over the chunks; None for a variable ``fn`` does not read])."""
    count = len(rows)
    read = _read_by(fn, variables, *(r[:0] for r in rows))

    def body(i, state):
        grads, weights = state
        parts = [r[i * chunk : (i + 1) * chunk] for r in rows]
        with tf.GradientTape() as tape:
            tape.watch(parts)
            y = fn(*parts)
        g = tape.gradient(y, [*parts, *read], upstream[i * chunk : (i + 1) * chunk], NONE)
        g = [_or_zeros(d, p) for d, p in zip(g, [*parts, *read])]
        written = [write_rows(b, i, chunk, d, g) for b, d in zip(grads, g[:count])]
        return written, [w + d for w, d in zip(weights, g[count:])]

    total = tf.shape(rows[0])[0]
    state = ([empty_rows(total, r, [upstream]) for r in rows], [tf.zeros_like(v) for v in read])
    grads, weights = chunk_loop(chunk_count(total, chunk), body, state)
    return grads, _pick(variables, read, weights)


def _read_by(fn: Callable, variables: Sequence[tf.Variable], *args) -> list[tf.Variable]:
    """Those of ``variables`` that ``fn(*args)`` reads, in their order (a run on ``args``,
    which should be rows of none). A chunk loop carries a gradient sum for each of them only,
    and adds no zeros for the others."""
    with tf.GradientTape() as tape:
        fn(*args)
    watched = {v.ref() for v in tape.watched_variables()}
    return [v for v in variables if v.ref() in watched]


def _pick(wanted: Sequence[tf.Variable], have: Sequence[tf.Variable], values) -> list:
    """One entry per variable of ``wanted``: its entry of ``values`` (one per variable of
    ``have``), or None where ``have`` has no such variable."""
    by_variable = {v.ref(): g for v, g in zip(have, values)}
    return [by_variable.get(v.ref()) for v in wanted]


@dataclasses.dataclass(frozen=True)
class _Edges:
    """What every step of one graph shares: the model's parts, the endpoints and the chunk."""

    parts: StepParts
    senders: tf.Tensor
    receivers: tf.Tensor
    chunk: int

    def rows(self, i, *tensors: tf.Tensor) -> list[tf.Tensor]:
        return [t[i * self.chunk : (i + 1) * self.chunk] for t in tensors]

    def term(self, ee: tf.Tensor) -> tf.Tensor:
        """The shared term T of rows ``ee`` of the encoded edges (``StepParts.edge_term``)."""
        return ee if self.parts.edge_term is None else self.parts.edge_term(ee)


def recomputed_steps(
    parts: StepParts,
    senders: tf.Tensor,
    receivers: tf.Tensor,
    chunk: int,
    outputs: Sequence[bool],
    every: int = 1,
    offload: bool = False,
):
    """All ``len(outputs)`` message-passing steps as one function that keeps only step
    boundaries for the backward pass: the input latents of every ``every``-th step.

    With ``every`` = 1 every step's boundaries are kept; with k the backward pass first computes
    a group's k - 1 inner boundaries again (k - 1 more edge passes per k steps), for about 1/k
    of the memory. The last step's new node latents are not computed (nothing reads them) and
    its new edge latents are not kept (its backward pass computes them again per chunk).

    The backward pass writes a step's edge gradients over its input edge latents, chunk by
    chunk, once it has read them: the latents made inside this function, which nothing else
    reads (the first step's, the function's input, get a buffer of their own). Before that, it
    sums them per node for the previous step's node part, which needs only those sums. So a step
    holds its input edges (becoming their gradients), the incoming gradients and the encoded
    edges' gradient sum: the edge boundaries still kept plus two [E, L_e] tensors.

    Args:
      parts: the model's step (``StepParts``).
      senders, receivers: int32 [E], the edges' endpoints.
      chunk: edges per chunk.
      outputs: per step, whether it computes its logits.
      every: keep the boundaries of every this many steps.
      offload: keep the boundaries in host memory between the passes.

    Returns:
      steps(x, e, xe, ee) -> [logits [E] per step (a step without output: [0])],
      from the encoded node and edge latents: x and e (the first step's input, usually xe and
      ee themselves), and xe and ee, which every step reads.
    """
    graph, count = _Edges(parts, senders, receivers, chunk), len(outputs)
    groups = [range(first, min(first + every, count)) for first in range(0, count, every)]
    # A step's norm output is the next step's kept input edges (with every = 1, all are; with
    # offload they are in host memory).
    keeps_norm = parts.keeps_norm and every == 1 and not offload

    @tf.custom_gradient
    def steps(x, e, xe, ee):
        device, kept, logits, norms = x.device, [], [], []
        for j, output in enumerate(outputs):
            if j % every == 0:
                kept.append(tuple(_to_host(t) for t in (x, e)) if offload else (x, e))
            final = j == count - 1
            x, e, step_logits, step_norm = _forward(
                graph, x, e, xe, ee, output, final, keep=keeps_norm and not final
            )
            logits.append(step_logits)
            norms.append(step_norm)

        def grad(*g_logits, variables=None):
            # Nothing is recomputed before the gradients of the logits arrive: ops that need
            # only the kept boundaries would otherwise run as soon as they could, for every
            # group at once at the start of the backward pass.
            with tf.control_dependencies([g for g in g_logits if g is not None]):
                return backward(list(g_logits), list(variables or ()))

        def backward(g_logits, variables):
            # The gradients of the step being taken: of its new nodes and edges, of the shared
            # inputs (summed over the later steps); the sums of its new edges per node.
            g_nodes = g_edges = None
            g_shared = [None, None]
            sums, g_vars = None, [tf.zeros_like(v) for v in variables]
            for group, (x, e) in reversed(list(zip(groups, kept))):
                # Each group, and each step in it, waits for the gradients of the step after
                # it: what needs only kept boundaries (the inner boundaries, the sums, the node
                # terms) would otherwise run for every step at once, early in the pass; and
                # that step's weight gradients, whose inputs ([N, 128] node-term gradients)
                # would otherwise stay until the executor got round to them.
                with _after(g_nodes, g_edges, *g_vars):
                    x, e = (_to_device(t, device) for t in (x, e)) if offload else (x, e)
                    boundaries = [(x, e)]
                    for _ in group[1:]:  # the inner boundaries, again
                        x, e, _, _ = _forward(graph, x, e, xe, ee, False, False)
                        boundaries.append((x, e))
                for j in reversed(group):
                    (x, e), step = boundaries[j - group[0]], (outputs[j], j == count - 1)
                    g_in = [g_nodes, g_edges, *g_shared]
                    norm = None
                    if norms[j] is not None:  # its norm's output: the next step's input edges
                        statistics, sums = norms[j]
                        norm = NormOutput(kept[j + 1][1], *statistics)
                    with _after(g_nodes, g_edges, *g_vars):
                        (g_nodes, g_edges, *g_shared), g_step, sums = _backward(
                            graph, x, e, sums, xe, ee, variables, step, g_in, g_logits[j],
                            own=j > 0 and not keeps_norm, norm=norm,
                        )  # fmt: skip
                    g_vars = _accumulate(g_vars, g_step)
            g_inputs = [g_nodes, g_edges, *g_shared]
            return (g_inputs, g_vars) if variables else g_inputs

        return logits, grad

    return lambda *inputs: list(steps(*inputs))


def _forward(graph: _Edges, x, e, xe, ee, output: bool, final: bool, keep: bool = False):
    """One step, edges in chunks: (new node latents (None when ``final``), new edge latents,
    logits [E] (``output``; else [0]), ``keep``: what the backward pass reads instead of
    computing it again (``StepParts.keeps_norm``), else None: ([mean, rstd, mask] of the edge
    rows' ``norm.NormOutput``, the new edges' sums per receiver and sender))."""
    parts, receivers, senders = graph.parts, graph.receivers, graph.senders
    r, s = parts.node_terms(x, xe)

    def edge_chunk(e_c, ee_c, recv_c, send_c):
        new = parts.edge_rows(e_c, graph.term(ee_c), r, s, recv_c, send_c, False, keep)
        new, *statistics = new if keep else (new,)
        return (new, *statistics, parts.head_rows(new)) if output else (new, *statistics)

    rows = [e, ee, receivers, senders]
    new_edges, *outputs = map_chunks(edge_chunk, rows, graph.chunk)
    statistics, logits = (outputs[:3], outputs[3:]) if keep else (None, outputs)
    new_nodes = sums = None
    if not final:
        num_nodes = tf.shape(x)[0]
        received = segment_sum(new_edges, receivers, num_nodes)
        sent = segment_sum(new_edges, senders, num_nodes)
        rows = (received, sent, x, xe)
        (new_nodes,) = map_chunks(lambda *r: (parts.node_rows(*r),), rows, graph.chunk)
        sums = (received, sent)
    logits = logits[0] if output else tf.zeros([0], new_edges.dtype)
    return new_nodes, new_edges, logits, (statistics, sums) if keep else None


def _backward(
    graph: _Edges, x, e, sums, xe, ee, variables, step, g_in, g_logits, own: bool,
    norm: Optional[NormOutput] = None,
):  # fmt: skip
    """The gradients of one step from its boundaries (x, e), the per-node ``sums`` (received,
    sent) of its new edges (None for the final step) and the gradients of its outputs ``g_in``
    = [new nodes, new edges, xe, ee], each None for none (the shared inputs' are
    sums over the later steps).

    ``own``: ``e`` was made by the caller's forward pass and nothing reads it after this step:
    its per-node sums are taken first (the previous step's ``sums``), then its buffer takes
    its gradients, chunk by chunk. Else the incoming gradients' buffer takes them.

    ``norm``: the edge rows' norm output, kept (``StepParts.keeps_norm``): their last layer
    and norm are not computed again.

    Returns ([x, e, xe, ee] gradients, variable gradients (None: not read), the sums of ``e``
    per node (``own``; else None)).
    """
    output, final = step
    g_nodes, g_edges, g_xe_later, g_ee = g_in
    parts, receivers, senders, chunk = graph.parts, graph.receivers, graph.senders, graph.chunk
    num_nodes = tf.shape(x)[0]
    # Tensors of their own (the first step's x is xe): a tape's gradient with respect to one
    # tensor listed twice would give each entry both uses.
    x, own_xe = tf.identity(x), tf.identity(xe)
    if g_logits is None:
        g_logits = tf.zeros([tf.shape(e)[0] if output else 0], e.dtype)
    g_x, g_xe = tf.zeros_like(x), _or_zeros(g_xe_later, own_xe)
    g_vars = [None] * len(variables)
    g_received = g_sent = None
    if not final and g_nodes is not None:
        # The node part, node-wise: the gradients of its sums and inputs.
        # Nodes in chunks too: one chunk's MLP layers and concatenation at a time.
        inputs = [*sums, x, own_xe]
        (g_received, g_sent, g_x, g_xe_own), g_vars = _vjp_in_chunks(
            parts.node_rows, inputs, g_nodes, variables, chunk
        )
        g_xe += g_xe_own
    # The node terms the edge rows gather: their gradients are summed over the chunks.
    with tf.GradientTape() as terms_tape:
        terms_tape.watch([x, own_xe])
        r, s = parts.node_terms(x, own_xe)
    input_sums = None
    if own:
        input_sums = (segment_sum(e, receivers, num_nodes), segment_sum(e, senders, num_nodes))

    def rows_and_head(e_c, ee_c, recv_c, send_c, onto=False, norm_c=False):
        t_c = graph.term(ee_c)
        new = parts.edge_rows(e_c, t_c, r, s, recv_c, send_c, onto, norm_c)
        return t_c, [new, parts.head_rows(new)] if output else [new]

    def kept_rows(i):
        return False if norm is None else NormOutput(*graph.rows(i, *norm))

    none = False if norm is None else NormOutput(*(t[:0] for t in norm))
    read = _read_by(
        rows_and_head, variables, e[:0], ee[:0], receivers[:0], senders[:0], False, none
    )
    nodes = [] if parts.summed else [r, s]

    def body(i, state):
        g_r, g_s, g_read, g_e_out, g_ee_out = state
        e_c, ee_c, recv_c, send_c = graph.rows(i, e, ee, receivers, senders)
        # Without a gradient from later steps (None): zeros of a chunk, not of every edge.
        # Else the incoming gradient's rows: from its own buffer, or (not ``own``) from the
        # buffer the outgoing one then replaces them in (``write_rows``).
        if g_edges is None:
            g_new = tf.zeros_like(e_c)
        else:
            g_new = graph.rows(i, g_edges if own else g_e_out)[0]
        if g_received is not None:  # plus the gradients of the node sums, gathered
            both = (g_new, tf.zeros_like(g_new))
            g_new = gather_sum(both, (g_received, g_sent), recv_c, send_c, relu=False)
        # The gathered rows' gradients (``summed``: T's, before T's own term) are added onto
        # the loop's sums by the gradient kernel of the gather, which makes T's.
        onto = NodeGradients(g_r, g_s) if parts.summed else False
        with tf.GradientTape() as tape:
            tape.watch([e_c, ee_c, *nodes])
            t_c, targets = rows_and_head(e_c, ee_c, recv_c, send_c, onto, kept_rows(i))
            tape.watch(t_c)
        upstream = [g_new, graph.rows(i, g_logits)[0]][: len(targets)]
        # With ``edge_term`` None, t_c is ee_c listed twice: each entry gets the whole gradient.
        sources = [e_c, ee_c, t_c, *nodes]
        grads = tape.gradient(targets, [*sources, *read], upstream, NONE)
        g_e_c, g_ee_c, g_t_c = (_or_zeros(g, like) for g, like in zip(grads[:3], sources))
        if parts.summed:
            g_r, g_s = onto.receiver, onto.sender
        else:  # the gathers' (IndexedSlices: the rows' gradients and their node ids)
            g_r, g_s = (_add_rows(a, g) for a, g in zip((g_r, g_s), grads[3:5]))
        g_w = [_or_zeros(g, v) for g, v in zip(grads[len(sources) :], read)]
        done = [g_e_c, g_ee_c, g_t_c, *g_w]
        return (
            g_r,
            g_s,
            [a + b for a, b in zip(g_read, g_w)],
            write_rows(g_e_out, i, chunk, g_e_c, done),
            write_rows(g_ee_out, i, chunk, g_ee_c, done, add=g_ee is not None),
        )

    # The outgoing edge gradients overwrite the input edges (``own``, once their sums exist) or
    # the incoming gradients, and add to the encoded edges' (g_ee) in place: a step's backward
    # pass holds one [E, L_e] tensor of each, not three.
    total = tf.shape(e)[0]
    if own:
        with tf.control_dependencies(input_sums):
            g_e_out = tf.identity(e)
    else:
        g_e_out = empty_rows(total, e) if g_edges is None else g_edges
    so_far = _pick(read, variables, g_vars)  # the node part's sums of the variables read
    state = (
        tf.zeros_like(r),
        tf.zeros_like(s),
        [_or_zeros(g, v) for g, v in zip(so_far, read)],
        g_e_out,
        empty_rows(total, ee) if g_ee is None else g_ee,
    )
    g_r, g_s, g_read, g_e_out, g_ee_out = chunk_loop(chunk_count(total, chunk), body, state)
    # The loop's sums (which started from the node part's) replace the node part's.
    g_vars = [g if r is None else r for g, r in zip(g_vars, _pick(variables, read, g_read))]
    terms = terms_tape.gradient([r, s], [x, own_xe, *variables], [g_r, g_s], NONE)
    g_inputs = [
        g_x + _or_zeros(terms[0], x),
        g_e_out,
        g_xe + _or_zeros(terms[1], own_xe),
        g_ee_out,
    ]
    return g_inputs, _accumulate(g_vars, terms[2:]), input_sums


def _after(*tensors: Optional[tf.Tensor]):
    """Ops made in the block wait for ``tensors`` (None: nothing to wait for)."""
    return tf.control_dependencies([t for t in tensors if t is not None])


def _or_zeros(gradient: Optional[tf.Tensor], like: tf.Tensor) -> tf.Tensor:
    return tf.zeros_like(like) if gradient is None else gradient


def _accumulate(sums: Sequence, parts: Sequence) -> list:
    """``sums`` plus ``parts``, entry by entry, None standing for zeros (a variable a part does
    not read): no op for it at all, unlike a zeros tensor added."""
    return [a if b is None else b if a is None else a + b for a, b in zip(sums, parts)]


def _add_rows(sums: tf.Tensor, rows) -> tf.Tensor:
    """``sums`` [N, width] plus a gather's gradient: the rows of an ``IndexedSlices``, each
    added at its index, or a dense [N, width] tensor."""
    if isinstance(rows, tf.IndexedSlices):
        return segment_add(sums, rows.values, rows.indices)
    return sums + rows


def _to_host(t: tf.Tensor) -> tf.Tensor:
    with tf.device("/CPU:0"):
        return tf.identity(t)


def _to_device(t: tf.Tensor, device: Optional[str]) -> tf.Tensor:
    with tf.device(device or None):
        return tf.identity(t)
