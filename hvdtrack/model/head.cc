// The output head's forward pass in one pass over the edges, on the CPU's vector units:
//
//   HvdtrackHead(edges [E, L], w1 [L, H], b1 [H], w2 [H, 1], b2 [1])
//       -> logits [E, 1], bits uint8 [E, ceil(H / 8)]
//   with hidden = relu(edges @ w1 + b1): logits = hidden @ w2 + b2, and bit c of row r set
//   where edges[r] @ w1[:, c] + b1[c] > 0 (HvdtrackReluMask's bits of the pre-activation)
//
// TensorFlow takes it as a _FusedMatMul writing hidden [E, H], a pass reading it for the bits
// and a product reading it again for the logits. Here a tile of 4 rows x 64 hidden units (16
// vector registers, as HvdtrackWeightGradient's) is summed over L, biased, its bits taken and
// its ReLU kept in a buffer of 4 rows that stays in L1; each row's logit is then its dot product
// with w2 from that buffer. Of [E, ...] tensors only edges is read, and only the bits and the
// logits written (hvdtrack/model/head.py keeps the bits, not hidden, for the backward pass).
//
// The sums: each hidden unit from +0 by one fused multiply-add per input column, in column
// order, then + b1; each logit from eight partial sums (unit c into sum c % 8, by fused
// multiply-adds in unit order) added as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), then
// + b2. So the bits are the same at any number of threads (rows are independent) and on AVX-512,
// AVX2 and the scalar code alike. They are not TensorFlow's product's, which adds in another
// order: the two agree to float rounding (tests/model/test_head.py). The vector code is chosen
// when the op is built (ChooseIsa, kernels.h); without AVX2 the scalar code runs (std::fma, a
// library call where the library is built for baseline x86-64: slow, so head.lean_head takes
// TensorFlow's ops there instead).
//
// Built with the other kernels into the one library by hvdtrack/model/kernels.py.

#include <cstring>

#include "kernels.h"

namespace hvdtrack {

REGISTER_OP("HvdtrackHead")
    .Input("edges: float")
    .Input("w1: float")
    .Input("b1: float")
    .Input("w2: float")
    .Input("b2: float")
    .Output("logits: float")
    .Output("bits: uint8")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle edges, w1, b1, w2, b2;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &edges));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &w1));
      DimensionHandle inputs, width, unit;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(edges, 1), c->Dim(w1, 0), &inputs));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &b1));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(w1, 1), c->Dim(b1, 0), &width));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &w2));
      TF_RETURN_IF_ERROR(c->Merge(width, c->Dim(w2, 0), &width));
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(w2, 1), 1, &unit));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &b2));
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(b2, 0), 1, &unit));
      c->set_output(0, c->Matrix(c->Dim(edges, 0), 1));
      c->set_output(1, c->Matrix(c->Dim(edges, 0), c->ValueKnown(width)
                                                       ? c->MakeDim(MaskBytes(c->Value(width)))
                                                       : c->UnknownDim()));
      return Status();
    });

namespace {

// Rows per tile, and per unit of work a thread takes.
constexpr int64 kTileRows = 4;
constexpr int64 kShardRows = 256;

// The logit's sum before + b2: x . w over n units in eight partial sums (see the top), the
// last group's missing units as 0 * 0 (as the vector code's masked lanes).
float DotScalar(const float* x, const float* w, int64 n) {
  float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64 c = 0; c < n; ++c) s[c % 8] = std::fma(x[c], w[c], s[c % 8]);
  for (int64 c = n; c % 8 != 0; ++c) s[c % 8] = std::fma(0.f, 0.f, s[c % 8]);
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// rows (<= kTileRows) rows of edges from e: hidden units into relu (rows of stride floats),
// their bits into bits (rows of bytes); the scalar code, the reference of the vector code's.
void TileScalar(const float* e, int64 l, const float* w1, const float* b1, int64 h, int64 rows,
                float* relu, int64 stride, uint8_t* bits, int64 bytes) {
  for (int64 ii = 0; ii < rows; ++ii) {
    if (bytes > 0) std::memset(bits + ii * bytes, 0, bytes);  // (no pointer with no units)
    for (int64 c = 0; c < h; ++c) {
      float acc = 0.f;
      for (int64 k = 0; k < l; ++k) acc = std::fma(e[ii * l + k], w1[k * h + c], acc);
      const float v = acc + b1[c];
      bits[ii * bytes + c / 8] |= static_cast<uint8_t>(v > 0.f) << (c % 8);
      relu[ii * stride + c] = v < 0.f ? 0.f : v;  // MAXPS(0, v): a NaN stays NaN, as in Relu
    }
  }
}

using TileFn = void (*)(const float* e, int64 l, const float* w1, const float* b1, int64 h,
                        int64 rows, float* relu, int64 stride, uint8_t* bits, int64 bytes);
using DotFn = float (*)(const float* x, const float* w, int64 n);

#ifdef HVDTRACK_X86
__attribute__((target("avx2,fma"))) float DotAvx2(const float* x, const float* w, int64 n) {
  __m256 s = _mm256_setzero_ps();
  int64 c = 0;
  for (; c + 8 <= n; c += 8) {
    s = _mm256_fmadd_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(w + c), s);
  }
  if (c < n) {  // the other lanes: 0 * 0 added (as DotScalar does)
    const __m256i m = Mask256(n - c);
    s = _mm256_fmadd_ps(LoadMasked256(x + c, m), LoadMasked256(w + c, m), s);
  }
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  // (s0+s4)+(s2+s6), (s1+s5)+(s3+s7)
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// The vector tiles for one ISA: VEC vectors of LANES floats, NJ of them per row in the widest
// tile; MASK(n) the lanes below n, with which LOADM reads the last columns (the other lanes
// zeros, whose sums, 0 or a NaN from an inf input, go into the buffer's padding, never read,
// and give no bit); BITS(v) the lanes of v > 0. The buffer's rows (stride) hold whole vectors.
#define HVDTRACK_HEAD_TILES(TARGET, NAME, VEC, LANES, ZERO, LOAD, SET1, FMA, ADD, MAX, STORE,    \
                            MASKT, MASK, LOADM, BITS, NJ)                                         \
  template <int TI, int TJ, bool TAIL>                                                          \
  __attribute__((target(TARGET))) void NAME##Fixed(const float* e, int64 l, const float* w1,    \
                                                   const float* b1, int64 h, int64 j, MASKT m,  \
                                                   float* relu, int64 stride, uint8_t* bits,    \
                                                   int64 bytes) {                               \
    VEC acc[TI][TJ];                                                                            \
    for (int ii = 0; ii < TI; ++ii)                                                             \
      for (int jj = 0; jj < TJ; ++jj) acc[ii][jj] = ZERO();                                     \
    for (int64 k = 0; k < l; ++k) {                                                             \
      const float* wk = w1 + k * h + j;                                                         \
      VEC wv[TJ];                                                                               \
      for (int jj = 0; jj < TJ; ++jj)                                                           \
        wv[jj] = TAIL ? LOADM(wk + LANES * jj, m) : LOAD(wk + LANES * jj);                      \
      for (int ii = 0; ii < TI; ++ii) {                                                         \
        const VEC ev = SET1(e[ii * l + k]);                                                     \
        for (int jj = 0; jj < TJ; ++jj) acc[ii][jj] = FMA(ev, wv[jj], acc[ii][jj]);             \
      }                                                                                         \
    }                                                                                           \
    for (int jj = 0; jj < TJ; ++jj) {                                                           \
      const int64 c = j + LANES * jj;                                                           \
      const VEC bias = TAIL ? LOADM(b1 + c, m) : LOAD(b1 + c);                                  \
      for (int ii = 0; ii < TI; ++ii) {                                                         \
        const VEC v = ADD(acc[ii][jj], bias);                                                   \
        const uint32_t set = BITS(v);                                                           \
        const int64 n = std::min<int64>(LANES / 8, bytes - c / 8); /* the tail: its bytes */    \
        std::memcpy(bits + ii * bytes + c / 8, &set, n);                                        \
        STORE(relu + ii * stride + c, MAX(ZERO(), v)); /* MAX(0, NaN) is NaN */                 \
      }                                                                                         \
    }                                                                                           \
  }                                                                                             \
  template <int TI>                                                                             \
  __attribute__((target(TARGET))) void NAME##Rows(const float* e, int64 l, const float* w1,     \
                                                  const float* b1, int64 h, float* relu,        \
                                                  int64 stride, uint8_t* bits, int64 bytes) {   \
    int64 j = 0;                                                                                \
    const MASKT all = MASK(LANES);                                                              \
    for (; j + NJ * LANES <= h; j += NJ * LANES)                                                \
      NAME##Fixed<TI, NJ, false>(e, l, w1, b1, h, j, all, relu, stride, bits, bytes);           \
    for (; j + LANES <= h; j += LANES)                                                          \
      NAME##Fixed<TI, 1, false>(e, l, w1, b1, h, j, all, relu, stride, bits, bytes);            \
    if (j < h)                                                                                  \
      NAME##Fixed<TI, 1, true>(e, l, w1, b1, h, j, MASK(h - j), relu, stride, bits, bytes);     \
  }                                                                                             \
  __attribute__((target(TARGET))) void NAME(const float* e, int64 l, const float* w1,           \
                                            const float* b1, int64 h, int64 rows, float* relu,  \
                                            int64 stride, uint8_t* bits, int64 bytes) {         \
    switch (rows) {                                                                             \
      case 4: return NAME##Rows<4>(e, l, w1, b1, h, relu, stride, bits, bytes);                 \
      case 3: return NAME##Rows<3>(e, l, w1, b1, h, relu, stride, bits, bytes);                 \
      case 2: return NAME##Rows<2>(e, l, w1, b1, h, relu, stride, bits, bytes);                 \
      default: return NAME##Rows<1>(e, l, w1, b1, h, relu, stride, bits, bytes);                \
    }                                                                                           \
  }

__attribute__((target("avx512f"))) inline uint32_t HeadBits512(__m512 v) {
  return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
}
__attribute__((target("avx2"))) inline uint32_t HeadBits256(__m256 v) {
  return _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ));
}

// 4 x 4 vectors of 16 floats: 16 of the 32 zmm registers (4 rows x 64 hidden units a tile).
HVDTRACK_HEAD_TILES("avx512f", HeadAvx512, __m512, 16, _mm512_setzero_ps, _mm512_loadu_ps,
                    _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_max_ps,
                    _mm512_storeu_ps, __mmask16, Mask512, LoadMasked512, HeadBits512, 4)
// 4 x 3 vectors of 8 floats: 12 of the 16 ymm registers (4 rows x 24 hidden units a tile).
HVDTRACK_HEAD_TILES("avx2,fma", HeadAvx2, __m256, 8, _mm256_setzero_ps, _mm256_loadu_ps,
                    _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_max_ps,
                    _mm256_storeu_ps, __m256i, Mask256, LoadMasked256, HeadBits256, 3)
#undef HVDTRACK_HEAD_TILES
#endif

}  // namespace

class HeadOp : public OpKernel {
 public:
  explicit HeadOp(OpKernelConstruction* context) : OpKernel(context) {
    std::string isa;
    OP_REQUIRES_OK(context, ChooseIsa(&isa));
    tile_ = TileScalar;
    dot_ = DotScalar;
#ifdef HVDTRACK_X86
    if (isa != "none") dot_ = DotAvx2;
    if (isa == "avx512") tile_ = HeadAvx512;
    if (isa == "avx2") tile_ = HeadAvx2;
#endif
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& edges = context->input(0);
    const Tensor& w1 = context->input(1);
    const Tensor& b1 = context->input(2);
    const Tensor& w2 = context->input(3);
    const Tensor& b2 = context->input(4);
    OP_REQUIRES(context,
                edges.dims() == 2 && w1.dims() == 2 && w1.dim_size(0) == edges.dim_size(1),
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackHead: edges and w1 must be [rows, L] and [L, H], got ",
                    edges.shape().DebugString(), " and ", w1.shape().DebugString()));
    const int64 rows = edges.dim_size(0), l = edges.dim_size(1), h = w1.dim_size(1);
    OP_REQUIRES(context,
                b1.dims() == 1 && b1.dim_size(0) == h && w2.dims() == 2 && w2.dim_size(0) == h &&
                    w2.dim_size(1) == 1 && b2.dims() == 1 && b2.dim_size(0) == 1,
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackHead: b1, w2 and b2 must be [", h, "], [", h, ", 1] and [1], got ",
                    b1.shape().DebugString(), ", ", w2.shape().DebugString(), " and ",
                    b2.shape().DebugString()));
    const int64 bytes = MaskBytes(h);
    Tensor *logits, *bits;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows, 1}), &logits));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({rows, bytes}), &bits));
    if (rows == 0) return;
    const float* ep = edges.flat<float>().data();
    const float* w1p = w1.flat<float>().data();
    const float* b1p = b1.flat<float>().data();
    const float* w2p = w2.flat<float>().data();
    const float bias = b2.flat<float>()(0);
    float* lp = logits->flat<float>().data();
    uint8_t* bp = bits->flat<uint8_t>().data();
    const int64 stride = (h + 15) / 16 * 16;  // whole vectors of 16 or 8 floats a row
    const TileFn tile = tile_;
    const DotFn dot = dot_;
    auto run = [&](int64 begin, int64 end) {  // shards of kShardRows rows
      std::vector<float> relu(kTileRows * std::max<int64>(stride, 1));
      const int64 last = std::min(rows, end * kShardRows);
      for (int64 r0 = begin * kShardRows; r0 < last; r0 += kTileRows) {
        const int64 n = std::min(kTileRows, last - r0);
        tile(ep + r0 * l, l, w1p, b1p, h, n, relu.data(), stride, bp + r0 * bytes, bytes);
        for (int64 ii = 0; ii < n; ++ii) {
          lp[r0 + ii] = dot(relu.data() + ii * stride, w2p, h) + bias;
        }
      }
    };
    auto* workers = context->device()->tensorflow_cpu_worker_threads();
    // Shard's cost unit is about a cycle: a shard's multiply-adds, about 32 a cycle.
    ::tensorflow::Shard(workers->num_threads, workers->workers,
                        (rows + kShardRows - 1) / kShardRows, kShardRows * (l + 1) * h / 32 + 1,
                        run);
  }

 private:
  TileFn tile_;
  DotFn dot_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackHead").Device(::tensorflow::DEVICE_CPU), HeadOp);

}  // namespace hvdtrack
