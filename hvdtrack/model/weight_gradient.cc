// The weight gradient of a dense layer, x^T @ d, on the CPU's vector units:
//
//   HvdtrackWeightGradient(x [R, A], d [R, B]) -> out [A, B],  out[i, j] = sum_r x[r, i] d[r, j]
//
// TensorFlow takes it as MatMul(x, d, transpose_a=True), whose Eigen contraction runs these
// shapes (R in the tens of thousands, A and B 64 or 128) at 41-79 GFLOP/s on one core of an
// AVX-512 Xeon, against 97-119 GFLOP/s for the forward products of the same layers: it blocks
// for a long output, and here the output is a few kilobytes and the rows are many. This kernel
// keeps a tile of 4 x 64 outputs in 16 vector registers and streams the rows past it: per row,
// four vector loads of d, four broadcasts of x and sixteen fused multiply-adds. The rows go in
// blocks that stay in the core's L2 cache while every tile of the block passes over them.
//
// The sums: each block of kRowBlock rows (fixed by the row index, not by the threads) is
// summed from +0 by one fused multiply-add per row, in row order, and the block sums are added
// to the output in block order. So the bits are the same at any number of threads (threads
// take whole tiles) and on AVX-512 and AVX2 alike (a lane's sums do not depend on the vector
// width). They are not TensorFlow's MatMul's, which adds in another order: the two agree to
// float rounding (tests/model/test_weight_gradient.py). The library is compiled for baseline
// x86-64; the vector code is in functions for AVX-512 and for AVX2 + FMA, chosen when the op
// is built (HVDTRACK_KERNEL_ISA caps the choice: ChooseIsa, kernels.h). Without either (or on
// another architecture) Eigen's product runs, on one thread, with other bits; HvdtrackKernelIsa
// says which, and mlp.weight_gradient then takes TensorFlow's threaded product instead.
//
// Built with the other kernels into the one library by hvdtrack/model/kernels.py.

#include <cstring>
#include <string>

#include "kernels.h"

namespace hvdtrack {

// Rows per block: 256 rows of x and d of 128 floats each are 256 KiB, in L2 on every x86 core
// of the last ten years, while each tile of outputs streams them.
constexpr int64 kRowBlock = 256;

REGISTER_OP("HvdtrackWeightGradient")
    .Input("x: float")
    .Input("d: float")
    .Output("out: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, d;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &d));
      DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, 0), c->Dim(d, 0), &rows));
      c->set_output(0, c->Matrix(c->Dim(x, 1), c->Dim(d, 1)));
      return Status();
    });

// One tile: out[i0 + ii, j] for ii < rows_i and j in [j0, j0 + cols) gets the sum over the
// rows [r0, r1) of x and d added: a sum from +0 by one fused multiply-add per row, in row order,
// then added to what out holds.
using TileFn = void (*)(const float* x, int64 a, const float* d, int64 b, int64 r0, int64 r1,
                        int64 i0, int64 rows_i, int64 j0, int64 cols, float* out);

#ifdef HVDTRACK_X86
// The vector tiles for one ISA: VEC vectors of LANES floats; MASK(n) the lanes below n, with
// which LOADM and STOREM read and write the last columns (the other lanes: zeros, untouched).
#define HVDTRACK_TILES(TARGET, NAME, VEC, LANES, ZERO, LOAD, SET1, FMA, ADD, STORE, MASKT, MASK, \
                       LOADM, STOREM, MAXJ)                                                       \
  template <int TI, int TJ, bool TAIL>                                                          \
  __attribute__((target(TARGET))) void NAME##Fixed(const float* x, int64 a, const float* d,     \
                                                   int64 b, int64 r0, int64 r1, int64 i0,       \
                                                   int64 j0, MASKT m, float* out) {             \
    VEC acc[TI][TJ];                                                                            \
    for (int ii = 0; ii < TI; ++ii)                                                             \
      for (int jj = 0; jj < TJ; ++jj) acc[ii][jj] = ZERO();                                     \
    for (int64 r = r0; r < r1; ++r) {                                                           \
      const float* xr = x + r * a + i0;                                                         \
      const float* dr = d + r * b + j0;                                                         \
      VEC dv[TJ];                                                                               \
      for (int jj = 0; jj < TJ; ++jj)                                                           \
        dv[jj] = TAIL ? LOADM(dr + LANES * jj, m) : LOAD(dr + LANES * jj);                      \
      for (int ii = 0; ii < TI; ++ii) {                                                         \
        const VEC xv = SET1(xr[ii]);                                                            \
        for (int jj = 0; jj < TJ; ++jj) acc[ii][jj] = FMA(xv, dv[jj], acc[ii][jj]);             \
      }                                                                                         \
    }                                                                                           \
    for (int ii = 0; ii < TI; ++ii) {                                                           \
      for (int jj = 0; jj < TJ; ++jj) {                                                         \
        float* o = out + (i0 + ii) * b + j0 + LANES * jj;                                       \
        if (TAIL) {                                                                             \
          STOREM(o, m, ADD(LOADM(o, m), acc[ii][jj]));                                          \
        } else {                                                                                \
          STORE(o, ADD(LOAD(o), acc[ii][jj]));                                                  \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
  }                                                                                             \
  template <int TI>                                                                             \
  __attribute__((target(TARGET))) void NAME##Rows(const float* x, int64 a, const float* d,      \
                                                  int64 b, int64 r0, int64 r1, int64 i0,        \
                                                  int64 j0, int64 cols, float* out) {           \
    const int64 end = j0 + cols;                                                                \
    int64 j = j0;                                                                               \
    const MASKT all = MASK(LANES);                                                              \
    for (; j + MAXJ * LANES <= end; j += MAXJ * LANES)                                          \
      NAME##Fixed<TI, MAXJ, false>(x, a, d, b, r0, r1, i0, j, all, out);                        \
    for (; j + LANES <= end; j += LANES)                                                        \
      NAME##Fixed<TI, 1, false>(x, a, d, b, r0, r1, i0, j, all, out);                           \
    if (j < end) NAME##Fixed<TI, 1, true>(x, a, d, b, r0, r1, i0, j, MASK(end - j), out);       \
  }                                                                                             \
  __attribute__((target(TARGET))) void NAME(const float* x, int64 a, const float* d, int64 b,   \
                                            int64 r0, int64 r1, int64 i0, int64 rows_i,         \
                                            int64 j0, int64 cols, float* out) {                 \
    switch (rows_i) {                                                                           \
      case 4: return NAME##Rows<4>(x, a, d, b, r0, r1, i0, j0, cols, out);                      \
      case 3: return NAME##Rows<3>(x, a, d, b, r0, r1, i0, j0, cols, out);                      \
      case 2: return NAME##Rows<2>(x, a, d, b, r0, r1, i0, j0, cols, out);                      \
      default: return NAME##Rows<1>(x, a, d, b, r0, r1, i0, j0, cols, out);                     \
    }                                                                                           \
  }

__attribute__((target("avx2"))) inline void StoreMasked256(float* p, __m256i m, __m256 v) {
  _mm256_maskstore_ps(p, m, v);
}

// 4 x 4 vectors of 16 floats: 16 of the 32 zmm registers (4 x 64 outputs a tile).
HVDTRACK_TILES("avx512f", TileAvx512, __m512, 16, _mm512_setzero_ps, _mm512_loadu_ps,
               _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, __mmask16,
               Mask512, LoadMasked512, _mm512_mask_storeu_ps, 4)
// 4 x 3 vectors of 8 floats: 12 of the 16 ymm registers (4 x 24 outputs a tile).
HVDTRACK_TILES("avx2,fma", TileAvx2, __m256, 8, _mm256_setzero_ps, _mm256_loadu_ps,
               _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, __m256i,
               Mask256, LoadMasked256, StoreMasked256, 3)
#undef HVDTRACK_TILES
#endif

// The tile function for this CPU: the widest vectors it has, at most HVDTRACK_KERNEL_ISA's
// (ChooseIsa, kernels.h).
struct Tiling {
  TileFn fn;   // nullptr: no vector code for this CPU (Eigen's product instead)
  int64 rows;  // of out (columns of x) per tile
  int64 cols;  // of out per tile
};

Status ChooseTile(Tiling* tiling) {
  std::string isa;
  TF_RETURN_IF_ERROR(ChooseIsa(&isa));
  *tiling = {nullptr, 0, 0};
#ifdef HVDTRACK_X86
  if (isa == "avx512") {
    *tiling = {TileAvx512, 4, 64};
  } else if (isa == "avx2") {
    *tiling = {TileAvx2, 4, 24};
  }
#endif
  return Status();
}

// HvdtrackKernelIsa() -> string: the vector code HvdtrackWeightGradient, HvdtrackHead and
// HvdtrackLinearNorm run here ("avx512", "avx2"), or "none" (then mlp.weight_gradient takes
// TensorFlow's threaded product instead, head.lean_head TensorFlow's ops and mlp.linear_norm
// TensorFlow's product before HvdtrackLayerNorm).
REGISTER_OP("HvdtrackKernelIsa").Output("isa: string").SetShapeFn([](InferenceContext* c) {
  c->set_output(0, c->Scalar());
  return Status();
});

class KernelIsaOp : public OpKernel {
 public:
  explicit KernelIsaOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    std::string isa;
    OP_REQUIRES_OK(context, ChooseIsa(&isa));
    Tensor* out;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({}), &out));
    out->scalar<::tensorflow::tstring>()() = isa;
  }
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackKernelIsa").Device(::tensorflow::DEVICE_CPU), KernelIsaOp);

class WeightGradientOp : public OpKernel {
 public:
  explicit WeightGradientOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, ChooseTile(&tiling_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& d = context->input(1);
    OP_REQUIRES(context,
                x.dims() == 2 && d.dims() == 2 && x.dim_size(0) == d.dim_size(0),
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackWeightGradient: x and d must be [rows, a] and [rows, b], got ",
                    x.shape().DebugString(), " and ", d.shape().DebugString()));
    const int64 rows = x.dim_size(0), a = x.dim_size(1), b = d.dim_size(1);
    Tensor* out;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({a, b}), &out));
    float* op = out->flat<float>().data();
    if (a * b == 0) return;
    std::memset(op, 0, sizeof(float) * a * b);  // +0: every sum starts there
    if (rows == 0) return;
    const float* xp = x.flat<float>().data();
    const float* dp = d.flat<float>().data();
    if (tiling_.fn == nullptr) {  // no AVX2: Eigen's product, as TensorFlow's MatMul would take it
      using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      Eigen::Map<Matrix>(op, a, b).noalias() =
          Eigen::Map<const Matrix>(xp, rows, a).transpose() * Eigen::Map<const Matrix>(dp, rows, b);
      return;
    }
    // Tiles of out in column-major order, in one contiguous range per thread: each range
    // passes over the rows block by block (a range per tile would read every row from memory
    // once per tile). Column-major: where out has two columns of tiles, two threads read half
    // of d each and all of x; with one, half of x each and all of d.
    const Tiling tiling = tiling_;
    const int64 tiles_i = (a + tiling.rows - 1) / tiling.rows;
    const int64 tiles = tiles_i * ((b + tiling.cols - 1) / tiling.cols);
    auto run = [&](int64 begin, int64 end) {
      for (int64 r0 = 0; r0 < rows; r0 += kRowBlock) {
        const int64 r1 = std::min(rows, r0 + kRowBlock);
        for (int64 t = begin; t < end; ++t) {
          const int64 i0 = (t % tiles_i) * tiling.rows, j0 = (t / tiles_i) * tiling.cols;
          tiling.fn(xp, a, dp, b, r0, r1, i0, std::min(tiling.rows, a - i0), j0,
                    std::min(tiling.cols, b - j0), op);
        }
      }
    };
    auto* workers = context->device()->tensorflow_cpu_worker_threads();
    const int64 parts = std::min<int64>(workers->num_threads, tiles);
    // Shard's cost unit is about a cycle: a part's multiply-adds, about 32 a cycle.
    ::tensorflow::Shard(parts, workers->workers, parts, rows * a * b / 32 / parts,
                        [&](int64 begin, int64 end) {
                          for (int64 p = begin; p < end; ++p) {
                            run(tiles * p / parts, tiles * (p + 1) / parts);
                          }
                        });
  }

 private:
  Tiling tiling_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackWeightGradient").Device(::tensorflow::DEVICE_CPU),
                        WeightGradientOp);

}  // namespace hvdtrack
