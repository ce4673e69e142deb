// Fused layer normalisation over the last axis of a float32 [rows, width] tensor (CPU), and
// HvdtrackLinearNorm: a dense layer and the layer norm after it in one kernel (further down).
//
// TensorFlow's own ops take about ten passes over [rows, width] for the forward and backward
// of a layer norm (mean, centre, square, mean, scale, ...; each a separate kernel with its own
// output). The two layer norm kernels take one pass each way: a row (64 floats for the model's
// latents) is read once into cache, its statistics computed there, its output written once.
//
//   HvdtrackLayerNorm(x, scale, offset; relu) -> y, mean, rstd, kept, mask
//       a = max(x, 0) with relu, else x
//       y = (a - mean) * rstd * scale + offset, per row: mean, rstd = 1 / sqrt(var + eps)
//       kept: x itself (the same buffer, no copy) when y cannot give the normalised input back
//       to float32 rounding (below), else an empty [0, width] tensor
//       mask: with relu, uint8 [rows, ceil(width / 8)], bit c of a row set where x > 0; else
//       [rows, 0]
//   HvdtrackLayerNormGrad(dy, x, y, mask, scale, offset, mean, rstd; relu)
//       -> dx, dscale, doffset, dsum
//       n = (a - mean) * rstd if x has the rows, else (y - offset) / scale
//       g = dy * scale, da = rstd * (g - mean_row(g) - n * mean_row(g * n))
//       dx = da where the mask's bit is set (relu), else da
//       dscale = sum_rows(dy * n), doffset = sum_rows(dy)
//       dsum = sum_rows(dx): the gradient of a bias added to x (the layer before's), summed
//       while each row of dx is in cache instead of in one more pass over [rows, width]
//
// What the backward pass keeps: y, which the next layer keeps for its own gradient anyway,
// two numbers per row and, with relu, one bit per element; not x nor the ReLU's output, which
// TensorFlow's ReluGrad would keep (one [rows, width] float tensor less per layer norm: 2 KB
// per edge over the default model's 8 edge updates). Reading n back from y is exact to float32
// rounding when every column has |offset| <= kMaxOffsetRatio * |scale| and a scale far from
// zero: n then comes back with an absolute error of about 2^-24 * (2 |n| + |offset / scale|),
// against 2^-24 |n| from x. Where a column does not (a scale trained to near zero, an offset
// far above its scale), kept is x and the backward pass reads x, as before; the check is one
// pass over [width].
//
// Rows are split into fixed blocks of kBlockRows run on TensorFlow's intra-op threads; the
// column sums of the gradient add the blocks' partial sums in block order, so every result
// is the same whatever the number of threads (exact resumes depend on it).
//
// Built with the other kernels into the one library by hvdtrack/model/kernels.py.

#include <cstdint>
#include <cstring>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "kernels.h"

namespace hvdtrack {

constexpr int64 kBlockRows = 1024;
constexpr float kMaxOffsetRatio = 16.0f;
constexpr float kMinScale = 1e-20f;

REGISTER_OP("HvdtrackLayerNorm")
    .Input("x: float")
    .Input("scale: float")
    .Input("offset: float")
    .Output("y: float")
    .Output("mean: float")
    .Output("rstd: float")
    .Output("kept: float")
    .Output("mask: uint8")
    .Attr("epsilon: float")
    .Attr("relu: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      c->set_output(0, x);
      c->set_output(1, c->Vector(c->Dim(x, 0)));
      c->set_output(2, c->Vector(c->Dim(x, 0)));
      c->set_output(3, c->Matrix(c->UnknownDim(), c->Dim(x, 1)));
      c->set_output(4, c->Matrix(c->Dim(x, 0), c->UnknownDim()));
      return Status();
    });

REGISTER_OP("HvdtrackLayerNormGrad")
    .Input("dy: float")
    .Input("x: float")
    .Input("y: float")
    .Input("mask: uint8")
    .Input("scale: float")
    .Input("offset: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Output("dx: float")
    .Output("dscale: float")
    .Output("doffset: float")
    .Output("dsum: float")
    .Attr("relu: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle dy;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &dy));
      c->set_output(0, dy);
      c->set_output(1, c->Vector(c->Dim(dy, 1)));
      c->set_output(2, c->Vector(c->Dim(dy, 1)));
      c->set_output(3, c->Vector(c->Dim(dy, 1)));
      return Status();
    });

namespace {

// Runs fn(block, first_row, end_row) for every block of kBlockRows rows on the intra-op pool.
template <typename Fn>
void ForEachBlock(OpKernelContext* context, int64 rows, int64 width, const Fn& fn) {
  const int64 blocks = (rows + kBlockRows - 1) / kBlockRows;
  auto* workers = context->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(workers->num_threads, workers->workers, blocks, kBlockRows * width * 8,
                      [&](int64 begin, int64 end) {
                        for (int64 b = begin; b < end; ++b) {
                          fn(b, b * kBlockRows, std::min(rows, (b + 1) * kBlockRows));
                        }
                      });
}

Status CheckInputs(const Tensor& x, const Tensor& scale) {
  if (x.dims() != 2) {
    return ::tensorflow::errors::InvalidArgument("x must be [rows, width], got shape ",
                                                 x.shape().DebugString());
  }
  if (scale.dims() != 1 || scale.dim_size(0) != x.dim_size(1)) {
    return ::tensorflow::errors::InvalidArgument("scale and offset must be [width] = [",
                                                 x.dim_size(1), "], got shape ",
                                                 scale.shape().DebugString());
  }
  return Status();
}

// Whether y = n * scale + offset gives n back to float32 rounding in every column (see the top).
bool InvertibleFromOutput(const float* scale, const float* offset, int64 width) {
  for (int64 c = 0; c < width; ++c) {
    const float s = std::abs(scale[c]);
    // Written so that a NaN fails it.
    if (!(s >= kMinScale && std::abs(offset[c]) <= kMaxOffsetRatio * s)) return false;
  }
  return true;
}

// a = max(x, 0) (a NaN stays NaN, as TensorFlow's Relu keeps it).
inline float Relu(float x) { return x < 0.f ? 0.f : x; }

// One row of the forward pass (see the top), on a = max(x, 0) with kRelu, else on x.
template <bool kRelu>
inline void NormRow(const float* row, const float* sp, const float* op, int64 width,
                    float inv_width, float eps, float* out, float* mean, float* rstd) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64 c = 0; c < width; ++c) sum += kRelu ? Relu(row[c]) : row[c];
  const float m = sum * inv_width;
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64 c = 0; c < width; ++c) {
    const float d = (kRelu ? Relu(row[c]) : row[c]) - m;
    squares += d * d;
  }
  const float s = 1.0f / std::sqrt(squares * inv_width + eps);
  for (int64 c = 0; c < width; ++c) {
    out[c] = ((kRelu ? Relu(row[c]) : row[c]) - m) * s * sp[c] + op[c];
  }
  *mean = m;
  *rstd = s;
}

// One row of either forward op: with ``relu`` its mask bits (one byte per 8 columns) then the
// norm of max(row, 0), else the norm of the row.
inline void ForwardRow(bool relu, const float* row, const float* sp, const float* op,
                       int64 width, float inv_width, float eps, uint8_t* bits, float* out,
                       float* mean, float* rstd) {
  if (relu) {
    MaskRow(row, width, bits);
    NormRow<true>(row, sp, op, width, inv_width, eps, out, mean, rstd);
  } else {
    NormRow<false>(row, sp, op, width, inv_width, eps, out, mean, rstd);
  }
}

// One row of the gradient (see the top). kFromX: n = (a - m) * s from the (activated) input
// a; else n = (y - offset) * inverse_scale. bits: the row's ReLU mask (ApplyMask), or null
// without ReLU.
template <bool kFromX>
inline void GradRow(const float* src, const float* up, const float* sp, const float* offset,
                    const float* inverse_scale, float m, float s, int64 width, float inv_width,
                    const uint8_t* bits, float* dscale_part, float* doffset_part, float* out) {
  float sum_g = 0.f, sum_gn = 0.f;
#pragma omp simd reduction(+ : sum_g, sum_gn)
  for (int64 c = 0; c < width; ++c) {
    const float n = kFromX ? (src[c] - m) * s : (src[c] - offset[c]) * inverse_scale[c];
    const float g = up[c] * sp[c];
    sum_g += g;
    sum_gn += g * n;
    dscale_part[c] += up[c] * n;
    doffset_part[c] += up[c];
  }
  const float mean_g = sum_g * inv_width, mean_gn = sum_gn * inv_width;
  for (int64 c = 0; c < width; ++c) {
    const float n = kFromX ? (src[c] - m) * s : (src[c] - offset[c]) * inverse_scale[c];
    out[c] = s * (up[c] * sp[c] - mean_g - n * mean_gn);
  }
  if (bits != nullptr) ApplyMask(bits, width, out);
}

}  // namespace

class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(context, context->GetAttr("relu", &relu_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& scale = context->input(1);
    const Tensor& offset = context->input(2);
    OP_REQUIRES_OK(context, CheckInputs(x, scale));
    OP_REQUIRES(context, offset.shape() == scale.shape(),
                ::tensorflow::errors::InvalidArgument("offset must have scale's shape"));
    const int64 rows = x.dim_size(0), width = x.dim_size(1);
    const int64 mask_bytes = relu_ ? MaskBytes(width) : 0;
    Tensor *y, *mean, *rstd, *mask;
    const float* sp = scale.flat<float>().data();
    const float* op = offset.flat<float>().data();
    if (InvertibleFromOutput(sp, op, width)) {
      // y in x's buffer when nothing else reads x (each row is read before it is written)
      OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, x.shape(), &y));
      Tensor* none;
      OP_REQUIRES_OK(context, context->allocate_output(3, TensorShape({0, width}), &none));
    } else {
      OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
      context->set_output(3, x);  // the same buffer: the backward pass reads x
    }
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({rows}), &mean));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({rows}), &rstd));
    OP_REQUIRES_OK(context,
                   context->allocate_output(4, TensorShape({rows, mask_bytes}), &mask));
    const float* xp = x.flat<float>().data();
    if (rows == 0) return;
    float* yp = y->flat<float>().data();
    float* mp = mean->flat<float>().data();
    float* rp = rstd->flat<float>().data();
    uint8_t* bits = mask->flat<uint8_t>().data();
    const float eps = epsilon_;
    const float inv_width = 1.0f / static_cast<float>(width);
    const bool relu = relu_;
    ForEachBlock(context, rows, width, [&](int64, int64 first, int64 end) {
      for (int64 r = first; r < end; ++r) {
        ForwardRow(relu, xp + r * width, sp, op, width, inv_width, eps, bits + r * mask_bytes,
                   yp + r * width, mp + r, rp + r);
      }
    });
  }

 private:
  float epsilon_;
  bool relu_;
};

class LayerNormGradOp : public OpKernel {
 public:
  explicit LayerNormGradOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("relu", &relu_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    const Tensor& x = context->input(1);
    const Tensor& y = context->input(2);
    const Tensor& mask = context->input(3);
    const Tensor& scale = context->input(4);
    const Tensor& offset = context->input(5);
    const Tensor& mean = context->input(6);
    const Tensor& rstd = context->input(7);
    OP_REQUIRES_OK(context, CheckInputs(dy, scale));
    const int64 rows = dy.dim_size(0), width = dy.dim_size(1);
    const bool from_x = x.shape() == dy.shape();
    OP_REQUIRES(context, from_x || y.shape() == dy.shape(),
                ::tensorflow::errors::InvalidArgument(
                    "x or y must have dy's shape ", dy.shape().DebugString(), ", got x ",
                    x.shape().DebugString(), " and y ", y.shape().DebugString()));
    const int64 mask_bytes = relu_ ? MaskBytes(width) : 0;
    OP_REQUIRES(context, mask.shape() == TensorShape({rows, mask_bytes}),
                ::tensorflow::errors::InvalidArgument("mask must be [", rows, ", ", mask_bytes,
                                                      "], got ", mask.shape().DebugString()));
    OP_REQUIRES(context, offset.shape() == scale.shape(),
                ::tensorflow::errors::InvalidArgument("offset must have scale's shape"));
    OP_REQUIRES(context,
                mean.dims() == 1 && mean.dim_size(0) == rows && rstd.shape() == mean.shape(),
                ::tensorflow::errors::InvalidArgument("mean and rstd must be [rows]"));
    Tensor *dx, *dscale, *doffset, *dsum;
    // dx in dy's buffer when nothing else reads dy (GradRow reads each element first)
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, dy.shape(), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(1, scale.shape(), &dscale));
    OP_REQUIRES_OK(context, context->allocate_output(2, scale.shape(), &doffset));
    OP_REQUIRES_OK(context, context->allocate_output(3, scale.shape(), &dsum));
    const int64 blocks = (rows + kBlockRows - 1) / kBlockRows;
    // Per block: width partial sums of dy * n, then width of dy, then width of dx.
    std::vector<float> partial(blocks * 3 * width, 0.f);
    const float* dyp = dy.flat<float>().data();
    const float* sp = scale.flat<float>().data();
    const float* mp = mean.flat<float>().data();
    const float* rp = rstd.flat<float>().data();
    const uint8_t* bits = mask.flat<uint8_t>().data();
    float* dxp = dx->flat<float>().data();
    const float inv_width = 1.0f / static_cast<float>(width);
    const float* op = offset.flat<float>().data();
    std::vector<float> inverse_scale(width);
    for (int64 c = 0; c < width; ++c) inverse_scale[c] = 1.0f / sp[c];
    const float* isp = inverse_scale.data();
    const float* srcp = from_x ? x.flat<float>().data() : y.flat<float>().data();
    const bool relu = relu_;
    ForEachBlock(context, rows, width, [&](int64 block, int64 first, int64 end) {
      float* dscale_part = partial.data() + block * 3 * width;
      float* doffset_part = dscale_part + width;
      float* dsum_part = doffset_part + width;
      std::vector<float> activated(relu && from_x ? width : 0);
      for (int64 r = first; r < end; ++r) {
        const float* row = srcp + r * width;
        const uint8_t* row_bits = relu ? bits + r * mask_bytes : nullptr;
        if (relu && from_x) {  // x is the input before the ReLU
          for (int64 c = 0; c < width; ++c) activated[c] = Relu(row[c]);
          row = activated.data();
        }
        float* out = dxp + r * width;
        if (from_x) {
          GradRow<true>(row, dyp + r * width, sp, op, isp, mp[r], rp[r], width, inv_width,
                        row_bits, dscale_part, doffset_part, out);
        } else {
          GradRow<false>(row, dyp + r * width, sp, op, isp, 0.f, rp[r], width, inv_width,
                         row_bits, dscale_part, doffset_part, out);
        }
#pragma omp simd
        for (int64 c = 0; c < width; ++c) dsum_part[c] += out[c];
      }
    });
    float* dsp = dscale->flat<float>().data();
    float* dop = doffset->flat<float>().data();
    float* dxs = dsum->flat<float>().data();
    std::fill(dsp, dsp + width, 0.f);
    std::fill(dop, dop + width, 0.f);
    std::fill(dxs, dxs + width, 0.f);
    for (int64 b = 0; b < blocks; ++b) {  // in block order: the same sums at any thread count
      const float* part = partial.data() + b * 3 * width;
      for (int64 c = 0; c < width; ++c) {
        dsp[c] += part[c];
        dop[c] += part[width + c];
        dxs[c] += part[2 * width + c];
      }
    }
  }

 private:
  bool relu_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackLayerNorm").Device(::tensorflow::DEVICE_CPU), LayerNormOp);
REGISTER_KERNEL_BUILDER(Name("HvdtrackLayerNormGrad").Device(::tensorflow::DEVICE_CPU),
                        LayerNormGradOp);

// A dense layer and the layer norm after it in one pass over the rows, on the CPU's vector
// units (mlp.linear_norm: the edge update's last layer):
//
//   HvdtrackLinearNorm(x [rows, K], w [K, width], b [width], scale, offset; epsilon, relu)
//       -> y, mean, rstd, kept, mask: HvdtrackLayerNorm's outputs on z = x @ w + b (kept: z
//       where y cannot give the normalised z back, InvertibleFromOutput, else [0, width])
//
// TensorFlow's product writes z [rows, width] and HvdtrackLayerNorm reads it back. Here a tile
// of 4 rows of z (kernels.h's product tile: 4 x 64 in 16 zmm registers) goes into a buffer in
// L1, and each of its rows is normalised from there by the layer norm's own row code, so y,
// mean, rstd and mask are bit for bit HvdtrackLayerNorm's on those z. z itself is the product
// tile's (summed in column order by fused multiply-adds: the same bits at any thread count and
// on AVX-512, AVX2 and the scalar code), not TensorFlow's product's: the two agree to float
// rounding. z is written only as kept, for HvdtrackLayerNormGrad (norm.LayerNorm.linear_pass;
// a kept output's backward pass runs the kernel again for it, linear_product). Without vector
// code the scalar code runs (slow; mlp.linear_norm takes TensorFlow's product and
// HvdtrackLayerNorm there instead).
REGISTER_OP("HvdtrackLinearNorm")
    .Input("x: float")
    .Input("w: float")
    .Input("b: float")
    .Input("scale: float")
    .Input("offset: float")
    .Output("y: float")
    .Output("mean: float")
    .Output("rstd: float")
    .Output("kept: float")
    .Output("mask: uint8")
    .Attr("epsilon: float")
    .Attr("relu: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, w, vector;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &w));
      DimensionHandle inputs, width;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, 1), c->Dim(w, 0), &inputs));
      width = c->Dim(w, 1);
      for (int i = 2; i < 5; ++i) {  // b, scale, offset
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &vector));
        TF_RETURN_IF_ERROR(c->Merge(width, c->Dim(vector, 0), &width));
      }
      const DimensionHandle rows = c->Dim(x, 0);
      c->set_output(0, c->Matrix(rows, width));
      c->set_output(1, c->Vector(rows));
      c->set_output(2, c->Vector(rows));
      bool relu;
      TF_RETURN_IF_ERROR(c->GetAttr("relu", &relu));
      const DimensionHandle bytes = !relu                  ? c->MakeDim(0)
                                    : c->ValueKnown(width) ? c->MakeDim(MaskBytes(c->Value(width)))
                                                           : c->UnknownDim();
      c->set_output(3, c->Matrix(c->UnknownDim(), width));
      c->set_output(4, c->Matrix(rows, bytes));
      return Status();
    });

class LinearNormOp : public OpKernel {
 public:
  explicit LinearNormOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(context, context->GetAttr("relu", &relu_));
    std::string isa;
    OP_REQUIRES_OK(context, ChooseIsa(&isa));
    tile_ = ProductTileFor<false>(isa);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& w = context->input(1);
    const Tensor& b = context->input(2);
    const Tensor& scale = context->input(3);
    const Tensor& offset = context->input(4);
    OP_REQUIRES(context, x.dims() == 2 && w.dims() == 2 && w.dim_size(0) == x.dim_size(1),
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackLinearNorm: x and w must be [rows, K] and [K, width], got ",
                    x.shape().DebugString(), " and ", w.shape().DebugString()));
    const int64 rows = x.dim_size(0), k = x.dim_size(1), width = w.dim_size(1);
    OP_REQUIRES(context,
                b.dims() == 1 && b.dim_size(0) == width && scale.shape() == b.shape() &&
                    offset.shape() == b.shape(),
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackLinearNorm: b, scale and offset must be [width] = [", width,
                    "], got ", b.shape().DebugString(), ", ", scale.shape().DebugString(),
                    " and ", offset.shape().DebugString()));
    const int64 mask_bytes = relu_ ? MaskBytes(width) : 0;
    const float* sp = scale.flat<float>().data();
    const float* op = offset.flat<float>().data();
    const bool keep = !InvertibleFromOutput(sp, op, width);  // z for the backward pass
    Tensor *y, *mean, *rstd, *kept, *mask;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows, width}), &y));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({rows}), &mean));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({rows}), &rstd));
    OP_REQUIRES_OK(context,
                   context->allocate_output(3, TensorShape({keep ? rows : 0, width}), &kept));
    OP_REQUIRES_OK(context,
                   context->allocate_output(4, TensorShape({rows, mask_bytes}), &mask));
    if (rows == 0) return;
    const float* xp = x.flat<float>().data();
    const float* wp = w.flat<float>().data();
    const float* bp = b.flat<float>().data();
    float* zp = keep ? kept->flat<float>().data() : nullptr;
    float* yp = y->flat<float>().data();
    float* mp = mean->flat<float>().data();
    float* rp = rstd->flat<float>().data();
    uint8_t* bits = mask->flat<uint8_t>().data();
    const float eps = epsilon_;
    const float inv_width = 1.0f / static_cast<float>(width);
    const bool relu = relu_;
    const ProductTileFn tile = tile_;
    const int64 stride = TileStride(width);
    ForEachBlock(context, rows, k + width, [&](int64, int64 first, int64 end) {
      std::vector<float> z(kProductTileRows * std::max<int64>(stride, 1));
      for (int64 r0 = first; r0 < end; r0 += kProductTileRows) {
        const int64 n = std::min(kProductTileRows, end - r0);
        tile(xp + r0 * k, k, wp, bp, width, n, z.data(), stride, nullptr, 0);
        for (int64 ii = 0; ii < n; ++ii) {
          const int64 r = r0 + ii;
          const float* row = z.data() + ii * stride;
          if (zp != nullptr) std::memcpy(zp + r * width, row, width * sizeof(float));
          ForwardRow(relu, row, sp, op, width, inv_width, eps, bits + r * mask_bytes,
                     yp + r * width, mp + r, rp + r);
        }
      }
    });
  }

 private:
  float epsilon_;
  bool relu_;
  ProductTileFn tile_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackLinearNorm").Device(::tensorflow::DEVICE_CPU),
                        LinearNormOp);

// The ReLU masks of other layers, packed as the layer norm's (one bit per element):
//   HvdtrackReluMask(x) -> bits uint8 [rows, ceil(width / 8)], bit c of a row set where x > 0
//   HvdtrackMaskedColumn(bits, column; width) -> out float [rows, width], sums float [width]:
//       out = column[r] where bit c of row r is set, else 0 (the gradient through a ReLU of an
//       upstream that is one number per row: the output head's, hvdtrack/model/head.py), and
//       sums = sum_rows(out) (the hidden layer's bias gradient), from blocks' partial sums
//       added in block order, the same at any thread count
REGISTER_OP("HvdtrackReluMask")
    .Input("x: float")
    .Output("bits: uint8")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      DimensionHandle width = c->Dim(x, 1);
      c->set_output(0, c->Matrix(c->Dim(x, 0), c->ValueKnown(width)
                                                   ? c->MakeDim((c->Value(width) + 7) / 8)
                                                   : c->UnknownDim()));
      return Status();
    });

REGISTER_OP("HvdtrackMaskedColumn")
    .Input("bits: uint8")
    .Input("column: float")
    .Output("out: float")
    .Output("sums: float")
    .Attr("width: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle bits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &bits));
      int64 width;
      TF_RETURN_IF_ERROR(c->GetAttr("width", &width));
      c->set_output(0, c->Matrix(c->Dim(bits, 0), width));
      c->set_output(1, c->Vector(width));
      return Status();
    });

class ReluMaskOp : public OpKernel {
 public:
  explicit ReluMaskOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    OP_REQUIRES(context, x.dims() == 2,
                ::tensorflow::errors::InvalidArgument("x must be [rows, width], got shape ",
                                                      x.shape().DebugString()));
    const int64 rows = x.dim_size(0), width = x.dim_size(1), bytes = MaskBytes(width);
    Tensor* bits;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows, bytes}), &bits));
    const float* xp = x.flat<float>().data();
    uint8_t* bp = bits->flat<uint8_t>().data();
    ForEachBlock(context, rows, width, [&](int64, int64 first, int64 end) {
      for (int64 r = first; r < end; ++r) MaskRow(xp + r * width, width, bp + r * bytes);
    });
  }
};

class MaskedColumnOp : public OpKernel {
 public:
  explicit MaskedColumnOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("width", &width_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& bits = context->input(0);
    const Tensor& column = context->input(1);
    const int64 width = width_, bytes = MaskBytes(width_);
    OP_REQUIRES(context, bits.dims() == 2 && bits.dim_size(1) == bytes,
                ::tensorflow::errors::InvalidArgument("bits must be [rows, ", bytes,
                                                      "] for width ", width, ", got shape ",
                                                      bits.shape().DebugString()));
    const int64 rows = bits.dim_size(0);
    OP_REQUIRES(context, column.NumElements() == rows,
                ::tensorflow::errors::InvalidArgument("column must have one value per row (",
                                                      rows, "), got shape ",
                                                      column.shape().DebugString()));
    Tensor *out, *sums;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows, width}), &out));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({width}), &sums));
    const uint8_t* bp = bits.flat<uint8_t>().data();
    const float* cp = column.flat<float>().data();
    float* op = out->flat<float>().data();
    const int64 blocks = (rows + kBlockRows - 1) / kBlockRows;
    std::vector<float> partial(blocks * width, 0.f);
    ForEachBlock(context, rows, width, [&](int64 block, int64 first, int64 end) {
      float* part = partial.data() + block * width;
      for (int64 r = first; r < end; ++r) {
        float* row = op + r * width;
        std::fill(row, row + width, cp[r]);
        ApplyMask(bp + r * bytes, width, row);
#pragma omp simd
        for (int64 c = 0; c < width; ++c) part[c] += row[c];
      }
    });
    float* sp = sums->flat<float>().data();
    std::fill(sp, sp + width, 0.f);
    for (int64 b = 0; b < blocks; ++b) {  // in block order, as the layer norm's sums
      for (int64 c = 0; c < width; ++c) sp[c] += partial[b * width + c];
    }
  }

 private:
  int64 width_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackReluMask").Device(::tensorflow::DEVICE_CPU), ReluMaskOp);
REGISTER_KERNEL_BUILDER(Name("HvdtrackMaskedColumn").Device(::tensorflow::DEVICE_CPU),
                        MaskedColumnOp);

}  // namespace hvdtrack
