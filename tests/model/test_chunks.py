"""Chunk loops (``model.chunks``): chunks written into one buffer, by the kernel library's
``HvdtrackWriteRows`` on CPU and by TensorFlow's InplaceUpdate / InplaceAdd without it."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.model import chunks as chunks_module
from hvdtrack.model.chunks import chunk_count, chunk_loop, empty_rows, map_chunks, write_rows


@pytest.fixture(params=["kernels", "ops"])
def library(request, monkeypatch):
    if request.param == "ops":
        monkeypatch.setattr(chunks_module, "fused_kernels", lambda: None)
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_chunks_are_written_over_and_added_to_their_rows(library, dtype):
    # 7 rows in chunks of 3: rows 3-5 (chunk 1) and the last, partial chunk (row 6)
    buffer = tf.constant(np.arange(14).reshape(7, 2).astype(dtype))
    written = write_rows(buffer, 1, 3, tf.constant([[20, 21], [22, 23], [24, 25]], dtype), [])
    written = write_rows(written, 2, 3, tf.constant([[30, 31]], dtype), [])
    expected = [[0, 1], [2, 3], [4, 5], [20, 21], [22, 23], [24, 25], [30, 31]]
    np.testing.assert_array_equal(written.numpy(), expected)
    if dtype == np.float32:
        added = write_rows(written, 0, 3, tf.constant([[0.5, 1], [1, 1], [1, 2]]), [], add=True)
        expected[:3] = [[0.5, 2], [3, 4], [5, 7]]
        np.testing.assert_array_equal(added.numpy(), expected)


@pytest.mark.parametrize("shape", [[5], [5, 3, 2]])
def test_rows_of_any_rank_are_written(library, shape):
    rows = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    buffer = tf.zeros([12, *shape[1:]])
    out = write_rows(buffer, 1, 5, tf.constant(rows), []).numpy()
    np.testing.assert_array_equal(out[5:10], rows)
    assert not out[:5].any() and not out[10:].any()


@pytest.mark.parametrize(
    "rows, start, message",
    [
        (np.ones([3, 2]), 5, "rows 5 to 7 are outside the buffer's 7 rows"),
        (np.ones([3, 4]), 0, r"rows \[3,4\] do not have the buffer's row shape \[7,2\]"),
        (np.ones([3]), 0, "buffer and rows must have the same rank"),
    ],
)
def test_the_kernel_refuses_rows_outside_the_buffer(kernels, rows, start, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        kernels.hvdtrack_write_rows(tf.zeros([7, 2]), tf.constant(rows, tf.float32), start)


def test_map_chunks_equals_the_function_on_all_rows(library):
    # 7 rows in chunks of 3 (3 + 3 + 1), two outputs of different widths and dtypes
    x = tf.constant(np.arange(14, dtype=np.float32).reshape(7, 2))

    def fn(rows):
        return rows * 2.0, tf.cast(rows[:, 0] > 5, tf.uint8)

    doubled, flags = map_chunks(fn, [x], 3)
    np.testing.assert_array_equal(doubled.numpy(), x.numpy() * 2)
    np.testing.assert_array_equal(flags.numpy(), [0, 0, 0, 1, 1, 1, 1])


def test_a_chunk_loop_adds_the_chunks_in_order_with_two_at_a_time(library):
    # float32 sums depend on their order: the loop's, two chunks (rows) at a time (two inter-op
    # threads), equals numpy's in row order bit for bit, as does a buffer written by chunks.
    rng = np.random.default_rng(5)
    rows = (rng.normal(size=(64, 8)) * 10.0 ** rng.integers(-6, 6, size=(64, 1))).astype(np.float32)
    x = tf.constant(rows)

    @tf.function
    def run():
        def body(i, state):
            total, buffer = state
            chunk = x[i : i + 1] * 3.0
            return total + chunk[0], write_rows(buffer, i, 1, chunk, [chunk])

        state = (tf.zeros([8]), empty_rows(tf.shape(x)[0], x))
        return chunk_loop(chunk_count(tf.shape(x)[0], 1), body, state)

    assert tf.config.threading.get_inter_op_parallelism_threads() != 1  # 0: one per core
    total, buffer = run()
    expected = np.zeros(8, np.float32)
    for row in rows * np.float32(3.0):
        expected = expected + row
    np.testing.assert_array_equal(buffer.numpy(), rows * np.float32(3.0))
    np.testing.assert_array_equal(total.numpy(), expected)
    assert not np.array_equal(expected, (rows * np.float32(3.0))[::-1].sum(axis=0))  # order shows
