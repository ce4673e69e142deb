// What the kernel library's sources share: TensorFlow's headers and names, a prefetch of rows
// gathered out of memory order, blocks of rows on the intra-op threads and ReLU masks in bits.
// Included by layer_norm.cc, relu.cc, segment_sum.cc and gather_sum.cc; hvdtrack/model/kernels.py builds them into one library (and hashes this file
// with them into the cached library's name).

#ifndef HVDTRACK_MODEL_KERNELS_H_
#define HVDTRACK_MODEL_KERNELS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace hvdtrack {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::int64;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Requests every cache line of a row of width floats, for rows read out of memory order.
inline void Prefetch(const float* row, int64 width) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64 b = 0; b < width * static_cast<int64>(sizeof(float)); b += 64) {
    __builtin_prefetch(bytes + b);
  }
}

// Rows are processed in fixed blocks of kBlockRows, so that per-block partial results (and
// where each block's output starts) do not depend on the number of threads.
constexpr int64 kBlockRows = 1024;

// Runs fn(block, first_row, end_row) for every block of kBlockRows rows on the intra-op pool.
template <typename Fn>
inline void ForEachBlock(OpKernelContext* context, int64 rows, int64 width, const Fn& fn) {
  const int64 blocks = (rows + kBlockRows - 1) / kBlockRows;
  auto* workers = context->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(workers->num_threads, workers->workers, blocks, kBlockRows * width * 8,
                      [&](int64 begin, int64 end) {
                        for (int64 b = begin; b < end; ++b) {
                          fn(b, b * kBlockRows, std::min(rows, (b + 1) * kBlockRows));
                        }
                      });
}

// ReLU masks: one bit per element, bit c % 8 of byte c / 8 of a row set where the input is
// positive (where a ReLU passes the gradient). Used by layer_norm.cc and relu.cc.

// Bytes of a row's ReLU mask: one bit per column.
inline int64 MaskBytes(int64 width) { return (width + 7) / 8; }

// Bit c of the row's mask set where row[c] > 0 (where the ReLU passes the gradient).
inline void MaskRow(const float* row, int64 width, uint8_t* bits) {
  const int64 whole = width / 8;
#ifdef __SSE2__  // every x86-64 CPU: four compares and their sign bits at once
  const __m128 zero = _mm_setzero_ps();
  for (int64 j = 0; j < whole; ++j) {
    const float* p = row + 8 * j;
    const int low = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(p), zero));
    const int high = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(p + 4), zero));
    bits[j] = static_cast<uint8_t>(low | high << 4);
  }
#else
  for (int64 j = 0; j < whole; ++j) {
    const float* p = row + 8 * j;
    bits[j] = static_cast<uint8_t>((p[0] > 0.f) | (p[1] > 0.f) << 1 | (p[2] > 0.f) << 2 |
                                   (p[3] > 0.f) << 3 | (p[4] > 0.f) << 4 | (p[5] > 0.f) << 5 |
                                   (p[6] > 0.f) << 6 | (p[7] > 0.f) << 7);
  }
#endif
  if (whole < MaskBytes(width)) {
    uint8_t b = 0;
    for (int64 c = whole * 8; c < width; ++c) b |= static_cast<uint8_t>(row[c] > 0.f) << (c & 7);
    bits[whole] = b;
  }
}

// For each byte of a mask, its eight bits as all-ones or zero words: a float ANDed with them
// is itself or +0 (what ReluGrad gives where the input was not positive, NaN or not).
struct BitWords {
  uint32_t words[256][8];
  BitWords() {
    for (int b = 0; b < 256; ++b) {
      for (int k = 0; k < 8; ++k) words[b][k] = ((b >> k) & 1) ? 0xffffffffu : 0u;
    }
  }
};

// keep[c] = all ones where bit c of the row's mask is set, else 0.
inline void ExpandMask(const uint8_t* bits, int64 width, uint32_t* keep) {
  static const BitWords table;
  for (int64 j = 0; j * 8 < width; ++j) {
    std::memcpy(keep + 8 * j, table.words[bits[j]], sizeof(uint32_t) * std::min<int64>(8, width - 8 * j));
  }
}

}  // namespace hvdtrack

#endif  // HVDTRACK_MODEL_KERNELS_H_
