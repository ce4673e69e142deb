// What the kernel library's sources share: TensorFlow's headers and names, a prefetch of rows
// gathered out of memory order, ReLU masks of one bit per element (made from a row, and
// applied to a row of gradients), the choice of vector code and a product's tile in it.
// Included by layer_norm.cc, segment_sum.cc, gather_sum.cc, rows.cc, weight_gradient.cc and
// head.cc; hvdtrack/model/kernels.py builds them into one library (and hashes this file with
// them into the cached library's name).

#ifndef HVDTRACK_MODEL_KERNELS_H_
#define HVDTRACK_MODEL_KERNELS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
// HvdtrackWeightGradient, HvdtrackHead and HvdtrackLinearNorm choose their code by it when
// they are built.
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

// Rows of a product's tile: 4 x 64 outputs in 16 of AVX-512's 32 registers (4 x 24 in AVX2's).
constexpr int64 kProductTileRows = 4;

// A tile of a product on the CPU's vector units (HvdtrackHead's hidden layer and
// HvdtrackLinearNorm's product): 1 to kProductTileRows rows of x (each of k floats) times
// w [k, h], plus b [h], into out (rows of stride floats, whole vectors); with kRelu, max(0, z)
// into out and each element's bit of z > 0 into bits (rows of bytes), else z itself (bits
// unused). Each element is summed from +0 by one fused multiply-add per column of x, in column
// order, then + b: so the bits are the same at any number of threads (rows are independent)
// and on AVX-512, AVX2 and this scalar code alike (it is their reference). They are not
// TensorFlow's product's, which adds in another order. Without AVX2 the scalar code runs
// (std::fma, a library call in this library's baseline x86-64 build: slow, so the Python side
// takes TensorFlow's ops there instead).
template <bool kRelu>
void ProductTileScalar(const float* x, int64 k, const float* w, const float* b, int64 h,
                       int64 rows, float* out, int64 stride, uint8_t* bits, int64 bytes) {
  for (int64 ii = 0; ii < rows; ++ii) {
    if (kRelu && bytes > 0) std::memset(bits + ii * bytes, 0, bytes);  // (none with no units)
    for (int64 c = 0; c < h; ++c) {
      float acc = 0.f;
      for (int64 kk = 0; kk < k; ++kk) acc = std::fma(x[ii * k + kk], w[kk * h + c], acc);
      const float v = acc + b[c];
      if (kRelu) {
        bits[ii * bytes + c / 8] |= static_cast<uint8_t>(v > 0.f) << (c % 8);
        out[ii * stride + c] = v < 0.f ? 0.f : v;  // MAXPS(0, v): a NaN stays NaN, as in Relu
      } else {
        out[ii * stride + c] = v;
      }
    }
  }
}

using ProductTileFn = void (*)(const float* x, int64 k, const float* w, const float* b, int64 h,
                               int64 rows, float* out, int64 stride, uint8_t* bits, int64 bytes);

#ifdef HVDTRACK_X86
// The vector tiles for one ISA: VEC vectors of LANES floats, NJ of them per row in the widest
// tile; MASK(n) the lanes below n, with which LOADM reads the last columns (the other lanes
// zeros, whose sums, 0 or a NaN from an inf input, go into out's padding, never read, and give
// no bit); BITS(v) the lanes of v > 0.
#define HVDTRACK_PRODUCT_TILES(TARGET, NAME, VEC, LANES, ZERO, LOAD, SET1, FMA, ADD, MAX, STORE, \
                               MASKT, MASK, LOADM, BITS, NJ)                                      \
  template <bool RELU, int TI, int TJ, bool TAIL>                                                \
  __attribute__((target(TARGET))) void NAME##Fixed(const float* x, int64 k, const float* w,      \
                                                   const float* b, int64 h, int64 j, MASKT m,    \
                                                   float* out, int64 stride, uint8_t* bits,      \
                                                   int64 bytes) {                                \
    VEC acc[TI][TJ];                                                                             \
    for (int ii = 0; ii < TI; ++ii)                                                              \
      for (int jj = 0; jj < TJ; ++jj) acc[ii][jj] = ZERO();                                      \
    for (int64 kk = 0; kk < k; ++kk) {                                                           \
      const float* wk = w + kk * h + j;                                                          \
      VEC wv[TJ];                                                                                \
      for (int jj = 0; jj < TJ; ++jj)                                                            \
        wv[jj] = TAIL ? LOADM(wk + LANES * jj, m) : LOAD(wk + LANES * jj);                       \
      for (int ii = 0; ii < TI; ++ii) {                                                          \
        const VEC xv = SET1(x[ii * k + kk]);                                                     \
        for (int jj = 0; jj < TJ; ++jj) acc[ii][jj] = FMA(xv, wv[jj], acc[ii][jj]);              \
      }                                                                                          \
    }                                                                                            \
    for (int jj = 0; jj < TJ; ++jj) {                                                            \
      const int64 c = j + LANES * jj;                                                            \
      const VEC bias = TAIL ? LOADM(b + c, m) : LOAD(b + c);                                     \
      for (int ii = 0; ii < TI; ++ii) {                                                          \
        const VEC v = ADD(acc[ii][jj], bias);                                                    \
        if (RELU) {                                                                              \
          const uint32_t set = BITS(v);                                                          \
          const int64 n = std::min<int64>(LANES / 8, bytes - c / 8); /* the tail: its bytes */   \
          std::memcpy(bits + ii * bytes + c / 8, &set, n);                                       \
          STORE(out + ii * stride + c, MAX(ZERO(), v)); /* MAX(0, NaN) is NaN */                 \
        } else {                                                                                 \
          STORE(out + ii * stride + c, v);                                                       \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
  }                                                                                              \
  template <bool RELU, int TI>                                                                   \
  __attribute__((target(TARGET))) void NAME##Rows(const float* x, int64 k, const float* w,       \
                                                  const float* b, int64 h, float* out,           \
                                                  int64 stride, uint8_t* bits, int64 bytes) {    \
    int64 j = 0;                                                                                 \
    const MASKT all = MASK(LANES);                                                               \
    for (; j + NJ * LANES <= h; j += NJ * LANES)                                                 \
      NAME##Fixed<RELU, TI, NJ, false>(x, k, w, b, h, j, all, out, stride, bits, bytes);         \
    for (; j + LANES <= h; j += LANES)                                                           \
      NAME##Fixed<RELU, TI, 1, false>(x, k, w, b, h, j, all, out, stride, bits, bytes);          \
    if (j < h)                                                                                   \
      NAME##Fixed<RELU, TI, 1, true>(x, k, w, b, h, j, MASK(h - j), out, stride, bits, bytes);   \
  }                                                                                              \
  template <bool RELU>                                                                           \
  __attribute__((target(TARGET))) void NAME(const float* x, int64 k, const float* w,             \
                                            const float* b, int64 h, int64 rows, float* out,     \
                                            int64 stride, uint8_t* bits, int64 bytes) {          \
    switch (rows) {                                                                              \
      case 4: return NAME##Rows<RELU, 4>(x, k, w, b, h, out, stride, bits, bytes);               \
      case 3: return NAME##Rows<RELU, 3>(x, k, w, b, h, out, stride, bits, bytes);               \
      case 2: return NAME##Rows<RELU, 2>(x, k, w, b, h, out, stride, bits, bytes);               \
      default: /* 1: callers pass 1 to kProductTileRows (4) rows */                              \
        return NAME##Rows<RELU, 1>(x, k, w, b, h, out, stride, bits, bytes);                     \
    }                                                                                            \
  }

__attribute__((target("avx512f"))) inline uint32_t PositiveBits512(__m512 v) {
  return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
}
__attribute__((target("avx2"))) inline uint32_t PositiveBits256(__m256 v) {
  return _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ));
}

// 4 x 4 vectors of 16 floats: 16 of the 32 zmm registers (4 rows x 64 columns a tile).
HVDTRACK_PRODUCT_TILES("avx512f", ProductTileAvx512, __m512, 16, _mm512_setzero_ps,
                       _mm512_loadu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps,
                       _mm512_max_ps, _mm512_storeu_ps, __mmask16, Mask512, LoadMasked512,
                       PositiveBits512, 4)
// 4 x 3 vectors of 8 floats: 12 of the 16 ymm registers (4 rows x 24 columns a tile).
HVDTRACK_PRODUCT_TILES("avx2,fma", ProductTileAvx2, __m256, 8, _mm256_setzero_ps,
                       _mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps,
                       _mm256_max_ps, _mm256_storeu_ps, __m256i, Mask256, LoadMasked256,
                       PositiveBits256, 3)
#undef HVDTRACK_PRODUCT_TILES
#endif

// The tile code for an ISA of ChooseIsa's, with or without the ReLU and its bits.
template <bool kRelu>
ProductTileFn ProductTileFor(const std::string& isa) {
#ifdef HVDTRACK_X86
  if (isa == "avx512") return ProductTileAvx512<kRelu>;
  if (isa == "avx2") return ProductTileAvx2<kRelu>;
#endif
  return ProductTileScalar<kRelu>;
}

// Floats a row of a tile's buffer holds: h rounded up to whole vectors of 16 (or 8) floats.
inline int64 TileStride(int64 h) { return (h + 15) / 16 * 16; }

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
