"""Chunk loops (``model.chunks``): chunks written into one buffer, by the kernel library's
``HvdtrackWriteRows`` on CPU and by TensorFlow's InplaceUpdate / InplaceAdd without it."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.model import chunks as chunks_module
from hvdtrack.model.chunks import map_chunks, write_rows


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
