// What the kernel library's sources share: TensorFlow's headers and names, a prefetch of rows
// gathered out of memory order, ReLU masks of one bit per element (made from a row, and
// applied to a row of gradients) and the choice of vector code. Included by layer_norm.cc,
// segment_sum.cc, gather_sum.cc, rows.cc, weight_gradient.cc and head.cc;
// hvdtrack/model/kernels.py builds them into one library (and hashes this file with them into
// the cached library's name).

#ifndef HVDTRACK_MODEL_KERNELS_H_
#define HVDTRACK_MODEL_KERNELS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HVDTRACK_X86 1  // vector code for AVX-512 and AVX2 in target functions (ChooseIsa)
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
using ::tensorflow::TensorShapeUtils;
using ::tensorflow::int64;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// The widest vector code the CPU has, at most HVDTRACK_KERNEL_ISA's ("avx512", "avx2" or
// "none": a common choice for nodes of different CPUs, and how the tests compare the paths on
// one CPU): "avx512" (AVX-512F, AVX2 and FMA), "avx2" (AVX2 and FMA) or "none" (neither, or
// not x86).
// HvdtrackWeightGradient and HvdtrackHead choose their code by it when they are built.
inline Status ChooseIsa(std::string* isa) {
  const char* cap = std::getenv("HVDTRACK_KERNEL_ISA");
  const std::string most = cap == nullptr || *cap == '\0' ? "avx512" : cap;  // unset or empty
  if (most != "avx512" && most != "avx2" && most != "none") {
    return ::tensorflow::errors::InvalidArgument(
        "HVDTRACK_KERNEL_ISA must be avx512, avx2 or none, got '", most, "'");
  }
  *isa = "none";
#ifdef HVDTRACK_X86
  __builtin_cpu_init();
  // the AVX-512 code also calls AVX2 and FMA code (HvdtrackHead's logits)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (most == "avx512" && avx2 && __builtin_cpu_supports("avx512f")) {
    *isa = "avx512";
  } else if (most != "none" && avx2) {
    *isa = "avx2";
  }
#endif
  return Status();
}

#ifdef HVDTRACK_X86
// The lanes below n of a vector (n <= its lanes), and a load of those lanes (the others zeros):
// how the vector kernels read the last columns of a row.
__attribute__((target("avx512f"))) inline __mmask16 Mask512(int64 n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}
__attribute__((target("avx512f"))) inline __m512 LoadMasked512(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
__attribute__((target("avx2"))) inline __m256i Mask256(int64 n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
__attribute__((target("avx2"))) inline __m256 LoadMasked256(const float* p, __m256i m) {
  return _mm256_maskload_ps(p, m);
}
#endif

// Requests every cache line of a row of width floats, for rows read out of memory order.
inline void Prefetch(const float* row, int64 width) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64 b = 0; b < width * static_cast<int64>(sizeof(float)); b += 64) {
    __builtin_prefetch(bytes + b);
  }
}

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

// out[c] = +0 where bit c of the row's mask is clear, whatever out[c] held (a NaN too: unlike
// TensorFlow's ReluGrad, whose product keeps it): out's bits ANDed with all ones or zeros made
// from the mask's bits, in SSE. The layer norm's and the head's ReLU gradients.
inline void ApplyMask(const uint8_t* bits, int64 width, float* out) {
  int64 j = 0;
#ifdef __SSE2__
  const __m128i low = _mm_setr_epi32(1, 2, 4, 8), high = _mm_setr_epi32(16, 32, 64, 128);
  for (; 8 * j + 8 <= width; ++j) {
    const __m128i b = _mm_set1_epi32(bits[j]);
    const __m128 keep_low = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(b, low), low));
    const __m128 keep_high = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(b, high), high));
    float* o = out + 8 * j;
    _mm_storeu_ps(o, _mm_and_ps(_mm_loadu_ps(o), keep_low));
    _mm_storeu_ps(o + 4, _mm_and_ps(_mm_loadu_ps(o + 4), keep_high));
  }
#endif
  for (int64 c = 8 * j; c < width; ++c) {
    if (!((bits[c / 8] >> (c % 8)) & 1)) out[c] = 0.f;
  }
}

// g = u where bit c of the row's mask is set, else u * 0 (TensorFlow's ReluGrad: a product, so a
// NaN stays NaN and -x gives -0.0), the factors made from the mask's bits in SSE.
inline void MaskedProduct(const uint8_t* bits, const float* u, int64 width, float* g) {
  int64 j = 0;
#ifdef __SSE2__
  const __m128i low = _mm_setr_epi32(1, 2, 4, 8), high = _mm_setr_epi32(16, 32, 64, 128);
  const __m128 one = _mm_set1_ps(1.f);
  for (; 8 * j + 8 <= width; ++j) {
    const __m128i b = _mm_set1_epi32(bits[j]);
    const __m128i on_low = _mm_cmpeq_epi32(_mm_and_si128(b, low), low);
    const __m128i on_high = _mm_cmpeq_epi32(_mm_and_si128(b, high), high);
    const __m128 f_low = _mm_and_ps(_mm_castsi128_ps(on_low), one);
    const __m128 f_high = _mm_and_ps(_mm_castsi128_ps(on_high), one);
    _mm_storeu_ps(g + 8 * j, _mm_mul_ps(_mm_loadu_ps(u + 8 * j), f_low));
    _mm_storeu_ps(g + 8 * j + 4, _mm_mul_ps(_mm_loadu_ps(u + 8 * j + 4), f_high));
  }
#endif
  for (int64 c = 8 * j; c < width; ++c) {
    g[c] = u[c] * static_cast<float>((bits[c / 8] >> (c % 8)) & 1);
  }
}

}  // namespace hvdtrack

#endif  // HVDTRACK_MODEL_KERNELS_H_
