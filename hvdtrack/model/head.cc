// The output head's forward pass in one pass over the edges, on the CPU's vector units:
//
//   HvdtrackHead(edges [E, L], w1 [L, H], b1 [H], w2 [H, 1], b2 [1])
//       -> logits [E, 1], bits uint8 [E, ceil(H / 8)]
//   with hidden = relu(edges @ w1 + b1): logits = hidden @ w2 + b2, and bit c of row r set
//   where edges[r] @ w1[:, c] + b1[c] > 0 (HvdtrackReluMask's bits of the pre-activation)
//
// TensorFlow takes it as a _FusedMatMul writing hidden [E, H], a pass reading it for the bits
// and a product reading it again for the logits. Here a tile of 4 rows x 64 hidden units (16
// vector registers; kernels.h's product tile) is summed over L, biased, its bits taken and
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

// Rows per unit of work a thread takes.
constexpr int64 kShardRows = 256;

// The logit's sum before + b2: x . w over n units in eight partial sums (see the top), the
// last group's missing units as 0 * 0 (as the vector code's masked lanes).
float DotScalar(const float* x, const float* w, int64 n) {
  float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64 c = 0; c < n; ++c) s[c % 8] = std::fma(x[c], w[c], s[c % 8]);
  for (int64 c = n; c % 8 != 0; ++c) s[c % 8] = std::fma(0.f, 0.f, s[c % 8]);
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

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

#endif

}  // namespace

class HeadOp : public OpKernel {
 public:
  explicit HeadOp(OpKernelConstruction* context) : OpKernel(context) {
    std::string isa;
    OP_REQUIRES_OK(context, ChooseIsa(&isa));
    tile_ = ProductTileFor<true>(isa);
    dot_ = DotScalar;
#ifdef HVDTRACK_X86
    if (isa != "none") dot_ = DotAvx2;
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
    const int64 stride = TileStride(h);
    const ProductTileFn tile = tile_;
    const DotFn dot = dot_;
    auto run = [&](int64 begin, int64 end) {  // shards of kShardRows rows
      std::vector<float> relu(kProductTileRows * std::max<int64>(stride, 1));
      const int64 last = std::min(rows, end * kShardRows);
      for (int64 r0 = begin * kShardRows; r0 < last; r0 += kProductTileRows) {
        const int64 n = std::min(kProductTileRows, last - r0);
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
  ProductTileFn tile_;
  DotFn dot_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackHead").Device(::tensorflow::DEVICE_CPU), HeadOp);

}  // namespace hvdtrack
