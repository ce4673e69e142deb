"""Row-wise work in chunks of rows: the loops of ``model.recompute``.

A ``tf.while_loop`` runs one chunk of rows per iteration (``chunk_loop``), writing each chunk's
rows into [rows, ...] buffers allocated once (``empty_rows``, ``write_rows``), so the working
memory is two chunks' at most whatever the number of rows; ``map_chunks`` applies a row-wise function
so. ``auto_chunk_edges`` chooses the chunk by the intra-op threads.

Public symbols: ``auto_chunk_edges``, ``chunk_count``, ``chunk_loop``, ``empty_rows``,
``write_rows``, ``map_chunks``.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import tensorflow as tf

from hvdtrack.model.kernels import fused_kernels


def auto_chunk_edges(threads: int | None = None) -> int:
    """Rows per chunk for ``model.chunk_edges: 0``: 2048 on one thread, 16384 on more, for
    ``threads`` intra-op threads (default: this process's; TensorFlow's 0, every core it may
    run on).

    A chunk's [rows, 128] tensors pass from one op to the next: on one thread, chunks of 2048
    rows keep them in cache, and a recomputed step on 20k nodes / 160k edges takes 3.25 s
    against 3.70 s with 16384 (2.17 s without recomputation; 512: 3.44, 1024: 3.36, 4096:
    3.44-3.56, 8192: 3.56 s; AMD EPYC). On two threads each op's rows are split between them,
    and small chunks lose to the split: on the EPYC 2048 rows 2.78 s, 4096 2.37 s, 8192-32768
    2.25-2.28 s; on an Intel Xeon the recomputed step (speed first) took 1.40x the plain one
    with 8192 rows (twice), 1.31x with 16384 and 1.30x with 32768 (docs/performance.md,
    "Keeping the edge term when it fits"). More threads: 16384, untried.
    """
    if threads is None:
        threads = tf.config.threading.get_intra_op_parallelism_threads()
        threads = threads or len(os.sched_getaffinity(0))
    return 2048 if threads <= 1 else 16384


def chunk_count(rows: tf.Tensor, chunk: int) -> tf.Tensor:
    """The number of chunks of ``chunk`` rows covering ``rows`` rows (one for none)."""
    return tf.maximum((rows + chunk - 1) // chunk, 1)


def chunk_loop(count: tf.Tensor, body: Callable, state):
    """``state = body(i, state)`` for i in 0 .. count - 1, at most two chunks at a time: what
    a chunk computes from its own rows may start while the one before finishes (with two
    inter-op threads; one thread runs one op at a time). Everything a chunk adds to or writes
    into passes through ``state``, so sums and buffers take the chunks in order and the
    results do not change. Two chunks' working memory at most; on two threads the recomputed
    step (speed first, 160k edges) took 1.20-1.21x the plain step against 1.29-1.30x one chunk
    at a time (docs/performance.md, "Keeping the edge term when it fits")."""
    _, state = tf.while_loop(
        lambda i, _: i < count,
        lambda i, s: (i + 1, body(i, s)),
        (tf.constant(0), state),
        parallel_iterations=2,
    )
    return state


def empty_rows(rows: tf.Tensor, like: tf.Tensor, after: Sequence[tf.Tensor] = ()) -> tf.Tensor:
    """An uninitialised [rows, *like's width] tensor for ``write_rows`` to fill, every row of it,
    allocated once every tensor of ``after`` exists. ``Empty`` is stateful: grappler neither
    folds it into a constant nor shares it. Its shape is known early (grappler infers it from
    the graph's inputs), so without ``after`` the executor would allocate every step's buffers
    at the start of the pass."""
    shape = tf.concat([[rows], tf.shape(like)[1:]], axis=0)
    with tf.control_dependencies(after):
        return tf.raw_ops.Empty(shape=shape, dtype=like.dtype, init=False)


def write_rows(buffer: tf.Tensor, i, chunk: int, rows: tf.Tensor, after: Sequence, add=False):
    """Chunk ``i``'s ``rows`` written into (``add``: added to) ``buffer`` in place, once every
    tensor of ``after`` exists: what reads the chunk's old rows (an aliasing slice, maybe) has
    run. The result is ``buffer`` itself; read it only through the returned tensor.

    On CPU, for float32 and uint8, the kernel library's ``HvdtrackWriteRows`` (``rows.cc``):
    one copy of the chunk; elsewhere TensorFlow's ``InplaceUpdate`` / ``InplaceAdd``, which
    copy row by row. Collecting chunks in a TensorArray and concatenating them would hold the
    array and the result at once (two [E, width] tensors instead of one)."""
    start = i * chunk
    kernels = fused_kernels() if rows.dtype in (tf.float32, tf.uint8) else None
    with tf.control_dependencies([t for t in after if t is not None]):
        if kernels:
            return kernels.hvdtrack_write_rows(buffer, rows, start, add=add)
        op = tf.raw_ops.InplaceAdd if add else tf.raw_ops.InplaceUpdate
        return op(x=buffer, i=tf.range(start, start + tf.shape(rows)[0]), v=rows)


def map_chunks(fn: Callable, rows: Sequence[tf.Tensor], chunk: int) -> tuple[tf.Tensor, ...]:
    """``fn`` applied to chunks of ``chunk`` rows of ``rows`` (all [E, ...]), its outputs
    ([rows, ...] each, given by ``fn`` as a tuple) written into one [E, ...] tensor each. No
    gradient is recorded."""
    total = tf.shape(rows[0])[0]
    count = chunk_count(total, chunk)
    probe = fn(*(r[:0] for r in rows))  # the outputs' dtypes and widths

    def body(i, buffers):
        outputs = fn(*(r[i * chunk : (i + 1) * chunk] for r in rows))
        return [write_rows(b, i, chunk, y, outputs) for b, y in zip(buffers, outputs)]

    return tuple(chunk_loop(count, body, [empty_rows(total, p, rows) for p in probe]))
