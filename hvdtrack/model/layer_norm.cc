// Fused layer normalisation over the last axis of a float32 [rows, width] tensor (CPU).
//
// TensorFlow's own ops take about ten passes over [rows, width] for the forward and backward
// of a layer norm (mean, centre, square, mean, scale, ...; each a separate kernel with its own
// output). These two kernels take one pass each way: a row (64 floats for the model's latents)
// is read once into cache, its statistics computed there, its output written once.
//
//   HvdtrackLayerNorm(x, scale, offset) -> y, mean, rstd
//       y = (x - mean) * rstd * scale + offset, per row: mean, rstd = 1 / sqrt(var + eps)
//   HvdtrackLayerNormGrad(dy, x, scale, mean, rstd) -> dx, dscale, doffset
//       n = (x - mean) * rstd, g = dy * scale
//       dx = rstd * (g - mean_row(g) - n * mean_row(g * n))
//       dscale = sum_rows(dy * n), doffset = sum_rows(dy)
//
// Rows are split into fixed blocks of kBlockRows run on TensorFlow's intra-op threads; the
// column sums of the gradient add the blocks' partial sums in block order, so every result
// is the same whatever the number of threads (exact resumes depend on it).
//
// Built with the other kernels into the one library by hvdtrack/model/kernels.py.

#include "kernels.h"

namespace hvdtrack {

constexpr int64 kBlockRows = 1024;

REGISTER_OP("HvdtrackLayerNorm")
    .Input("x: float")
    .Input("scale: float")
    .Input("offset: float")
    .Output("y: float")
    .Output("mean: float")
    .Output("rstd: float")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      c->set_output(0, x);
      c->set_output(1, c->Vector(c->Dim(x, 0)));
      c->set_output(2, c->Vector(c->Dim(x, 0)));
      return Status();
    });

REGISTER_OP("HvdtrackLayerNormGrad")
    .Input("dy: float")
    .Input("x: float")
    .Input("scale: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Output("dx: float")
    .Output("dscale: float")
    .Output("doffset: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &x));
      c->set_output(0, x);
      c->set_output(1, c->Vector(c->Dim(x, 1)));
      c->set_output(2, c->Vector(c->Dim(x, 1)));
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

}  // namespace

class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& scale = context->input(1);
    const Tensor& offset = context->input(2);
    OP_REQUIRES_OK(context, CheckInputs(x, scale));
    OP_REQUIRES(context, offset.shape() == scale.shape(),
                ::tensorflow::errors::InvalidArgument("offset must have scale's shape"));
    const int64 rows = x.dim_size(0), width = x.dim_size(1);
    Tensor *y, *mean, *rstd;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({rows}), &mean));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({rows}), &rstd));
    if (rows == 0) return;
    const float* xp = x.flat<float>().data();
    const float* sp = scale.flat<float>().data();
    const float* op = offset.flat<float>().data();
    float* yp = y->flat<float>().data();
    float* mp = mean->flat<float>().data();
    float* rp = rstd->flat<float>().data();
    const float eps = epsilon_;
    const float inv_width = 1.0f / static_cast<float>(width);
    ForEachBlock(context, rows, width, [&](int64, int64 first, int64 end) {
      for (int64 r = first; r < end; ++r) {
        const float* row = xp + r * width;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64 c = 0; c < width; ++c) sum += row[c];
        const float m = sum * inv_width;
        float squares = 0.f;
#pragma omp simd reduction(+ : squares)
        for (int64 c = 0; c < width; ++c) {
          const float d = row[c] - m;
          squares += d * d;
        }
        const float s = 1.0f / std::sqrt(squares * inv_width + eps);
        float* out = yp + r * width;
        for (int64 c = 0; c < width; ++c) out[c] = (row[c] - m) * s * sp[c] + op[c];
        mp[r] = m;
        rp[r] = s;
      }
    });
  }

 private:
  float epsilon_;
};

class LayerNormGradOp : public OpKernel {
 public:
  explicit LayerNormGradOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& dy = context->input(0);
    const Tensor& x = context->input(1);
    const Tensor& scale = context->input(2);
    const Tensor& mean = context->input(3);
    const Tensor& rstd = context->input(4);
    OP_REQUIRES_OK(context, CheckInputs(x, scale));
    const int64 rows = x.dim_size(0), width = x.dim_size(1);
    OP_REQUIRES(context, dy.shape() == x.shape(),
                ::tensorflow::errors::InvalidArgument("dy must have x's shape"));
    OP_REQUIRES(context,
                mean.dims() == 1 && mean.dim_size(0) == rows && rstd.shape() == mean.shape(),
                ::tensorflow::errors::InvalidArgument("mean and rstd must be [rows]"));
    Tensor *dx, *dscale, *doffset;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(1, scale.shape(), &dscale));
    OP_REQUIRES_OK(context, context->allocate_output(2, scale.shape(), &doffset));
    const int64 blocks = (rows + kBlockRows - 1) / kBlockRows;
    // Per block: width partial sums of dy * n, then width of dy.
    std::vector<float> partial(blocks * 2 * width, 0.f);
    const float* dyp = dy.flat<float>().data();
    const float* xp = x.flat<float>().data();
    const float* sp = scale.flat<float>().data();
    const float* mp = mean.flat<float>().data();
    const float* rp = rstd.flat<float>().data();
    float* dxp = dx->flat<float>().data();
    const float inv_width = 1.0f / static_cast<float>(width);
    ForEachBlock(context, rows, width, [&](int64 block, int64 first, int64 end) {
      float* dscale_part = partial.data() + block * 2 * width;
      float* doffset_part = dscale_part + width;
      for (int64 r = first; r < end; ++r) {
        const float* row = xp + r * width;
        const float* up = dyp + r * width;
        const float m = mp[r], s = rp[r];
        float sum_g = 0.f, sum_gn = 0.f;
#pragma omp simd reduction(+ : sum_g, sum_gn)
        for (int64 c = 0; c < width; ++c) {
          const float n = (row[c] - m) * s;
          const float g = up[c] * sp[c];
          sum_g += g;
          sum_gn += g * n;
          dscale_part[c] += up[c] * n;
          doffset_part[c] += up[c];
        }
        const float mean_g = sum_g * inv_width, mean_gn = sum_gn * inv_width;
        float* out = dxp + r * width;
        for (int64 c = 0; c < width; ++c) {
          const float n = (row[c] - m) * s;
          out[c] = s * (up[c] * sp[c] - mean_g - n * mean_gn);
        }
      }
    });
    float* dsp = dscale->flat<float>().data();
    float* dop = doffset->flat<float>().data();
    std::fill(dsp, dsp + width, 0.f);
    std::fill(dop, dop + width, 0.f);
    for (int64 b = 0; b < blocks; ++b) {  // in block order: the same sums at any thread count
      const float* part = partial.data() + b * 2 * width;
      for (int64 c = 0; c < width; ++c) {
        dsp[c] += part[c];
        dop[c] += part[width + c];
      }
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackLayerNorm").Device(::tensorflow::DEVICE_CPU), LayerNormOp);
REGISTER_KERNEL_BUILDER(Name("HvdtrackLayerNormGrad").Device(::tensorflow::DEVICE_CPU),
                        LayerNormGradOp);

}  // namespace hvdtrack
