// ReLU outputs and masks of the model's layers in compact forms (CPU), one bit per element for
// the mask (kernels.h's MaskRow / ExpandMask):
//
//   HvdtrackReluMask(x) -> bits uint8 [rows, ceil(width / 8)], bit c of a row set where x > 0
//   HvdtrackMaskedColumn(bits, column; width) -> float [rows, width]: column[r] where bit c of
//       row r is set, else 0 (the gradient through a ReLU of an upstream that is one number per
//       row: the output head's, hvdtrack/model/head.py)
//   HvdtrackSparsePositive(x) -> bits, values, starts: a ReLU's output x [rows, width] kept as
//       its mask (as HvdtrackReluMask) and its positive elements in row order, values [count];
//       block b of kBlockRows rows starts at values[starts[b]] (starts int64 [blocks + 1]).
//   HvdtrackDensePositive(bits, values, starts; width) -> x [rows, width]: the positive values
//       put back where their bits are set, 0 elsewhere.
//
// A trained model's ReLU outputs are mostly zeros (two thirds in the default model's first edge
// layer), so the sparse form keeps 1/32 of the floats' bytes for the mask plus the positive
// elements: exact (a NaN is not positive and comes back as 0, as the ReLU's gradient treats it).
// On CPUs with AVX-512 a row is packed and unpacked 16 floats at a time (vcompressps /
// vexpandps between registers, masked loads and stores); elsewhere, or with HVDTRACK_NO_AVX512
// set, element by element.
//
// Built with the other kernels into the one library by hvdtrack/model/kernels.py.

#include <immintrin.h>

#include <cstdlib>

#include "kernels.h"

namespace hvdtrack {

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
    .Attr("width: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle bits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &bits));
      int64 width;
      TF_RETURN_IF_ERROR(c->GetAttr("width", &width));
      c->set_output(0, c->Matrix(c->Dim(bits, 0), width));
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
    Tensor* out;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows, width}), &out));
    const uint8_t* bp = bits.flat<uint8_t>().data();
    const float* cp = column.flat<float>().data();
    float* op = out->flat<float>().data();
    ForEachBlock(context, rows, width, [&](int64, int64 first, int64 end) {
      std::vector<uint32_t> keep(width);
      for (int64 r = first; r < end; ++r) {
        ExpandMask(bp + r * bytes, width, keep.data());
        uint32_t value;
        std::memcpy(&value, cp + r, sizeof value);
        uint32_t* row = reinterpret_cast<uint32_t*>(op + r * width);
        for (int64 c = 0; c < width; ++c) row[c] = value & keep[c];
      }
    });
  }

 private:
  int64 width_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackReluMask").Device(::tensorflow::DEVICE_CPU), ReluMaskOp);
REGISTER_KERNEL_BUILDER(Name("HvdtrackMaskedColumn").Device(::tensorflow::DEVICE_CPU),
                        MaskedColumnOp);

REGISTER_OP("HvdtrackSparsePositive")
    .Input("x: float")
    .Output("bits: uint8")
    .Output("values: float")
    .Output("starts: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      DimensionHandle width = c->Dim(x, 1);
      c->set_output(0, c->Matrix(c->Dim(x, 0), c->ValueKnown(width)
                                                   ? c->MakeDim((c->Value(width) + 7) / 8)
                                                   : c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Vector(c->UnknownDim()));
      return Status();
    });

REGISTER_OP("HvdtrackDensePositive")
    .Input("bits: uint8")
    .Input("values: float")
    .Input("starts: int64")
    .Output("x: float")
    .Attr("width: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle bits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &bits));
      int64 width;
      TF_RETURN_IF_ERROR(c->GetAttr("width", &width));
      c->set_output(0, c->Matrix(c->Dim(bits, 0), width));
      return Status();
    });

namespace {

// HVDTRACK_NO_AVX512 (set, any value) takes the element-by-element path (tests compare them).
const bool kAvx512 = __builtin_cpu_supports("avx512f") && std::getenv("HVDTRACK_NO_AVX512") == nullptr;

// Packs the positive elements of a row into out; returns how many. Sets the row's mask bits.
__attribute__((target("avx512f"))) int64 PackRowAvx512(const float* row, int64 width,
                                                        uint8_t* bits, float* out) {
  const __m512 zero = _mm512_setzero_ps();
  int64 n = 0, c = 0;
  for (; c + 16 <= width; c += 16) {
    const __m512 v = _mm512_loadu_ps(row + c);
    const __mmask16 m = _mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ);
    const int k = __builtin_popcount(m);
    _mm512_mask_storeu_ps(out + n, static_cast<__mmask16>((1u << k) - 1),
                          _mm512_maskz_compress_ps(m, v));
    bits[c / 8] = static_cast<uint8_t>(m & 0xff);
    bits[c / 8 + 1] = static_cast<uint8_t>(m >> 8);
    n += k;
  }
  if (c < width) {
    MaskRow(row + c, width - c, bits + c / 8);  // c is a multiple of 16: whole bytes
    for (; c < width; ++c) {
      if (row[c] > 0.f) out[n++] = row[c];
    }
  }
  return n;
}

int64 PackRow(const float* row, int64 width, uint8_t* bits, float* out) {
  if (kAvx512) return PackRowAvx512(row, width, bits, out);
  MaskRow(row, width, bits);
  int64 n = 0;
  for (int64 c = 0; c < width; ++c) {
    if (row[c] > 0.f) out[n++] = row[c];
  }
  return n;
}

// Puts a row's packed values back; returns how many it read.
__attribute__((target("avx512f"))) int64 UnpackRowAvx512(const uint8_t* bits,
                                                          const float* in, int64 width,
                                                          float* row) {
  int64 n = 0, c = 0;
  for (; c + 16 <= width; c += 16) {
    const __mmask16 m = static_cast<__mmask16>(bits[c / 8] | bits[c / 8 + 1] << 8);
    const int k = __builtin_popcount(m);
    const __m512 v = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << k) - 1), in + n);
    _mm512_storeu_ps(row + c, _mm512_maskz_expand_ps(m, v));
    n += k;
  }
  for (; c < width; ++c) {
    row[c] = ((bits[c >> 3] >> (c & 7)) & 1) ? in[n++] : 0.f;
  }
  return n;
}

int64 UnpackRow(const uint8_t* bits, const float* in, int64 width, float* row) {
  if (kAvx512) return UnpackRowAvx512(bits, in, width, row);
  int64 n = 0;
  for (int64 c = 0; c < width; ++c) {
    row[c] = ((bits[c >> 3] >> (c & 7)) & 1) ? in[n++] : 0.f;
  }
  return n;
}

int64 CountBits(const uint8_t* bits, int64 bytes) {
  int64 n = 0;
  for (int64 j = 0; j < bytes; ++j) n += __builtin_popcount(bits[j]);
  return n;
}

}  // namespace

class SparsePositiveOp : public OpKernel {
 public:
  explicit SparsePositiveOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    OP_REQUIRES(context, x.dims() == 2,
                ::tensorflow::errors::InvalidArgument("x must be [rows, width], got shape ",
                                                      x.shape().DebugString()));
    const int64 rows = x.dim_size(0), width = x.dim_size(1), bytes = MaskBytes(width);
    const int64 blocks = (rows + kBlockRows - 1) / kBlockRows;
    Tensor *bits, *starts, *values;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows, bytes}), &bits));
    OP_REQUIRES_OK(context, context->allocate_output(2, TensorShape({blocks + 1}), &starts));
    const float* xp = x.flat<float>().data();
    uint8_t* bp = bits->flat<uint8_t>().data();
    auto sp = starts->flat<int64>();
    // First the masks and each block's count, then the values at the blocks' starts.
    std::vector<int64> counts(blocks, 0);
    ForEachBlock(context, rows, width, [&](int64 block, int64 first, int64 end) {
      for (int64 r = first; r < end; ++r) MaskRow(xp + r * width, width, bp + r * bytes);
      counts[block] = CountBits(bp + first * bytes, (end - first) * bytes);
    });
    sp(0) = 0;
    for (int64 b = 0; b < blocks; ++b) sp(b + 1) = sp(b) + counts[b];
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({sp(blocks)}), &values));
    float* vp = values->flat<float>().data();
    ForEachBlock(context, rows, width, [&](int64 block, int64 first, int64 end) {
      std::vector<uint8_t> scratch(bytes);  // the mask again; already written above
      float* out = vp + sp(block);
      for (int64 r = first; r < end; ++r) out += PackRow(xp + r * width, width, scratch.data(), out);
    });
  }
};

class DensePositiveOp : public OpKernel {
 public:
  explicit DensePositiveOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("width", &width_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& bits = context->input(0);
    const Tensor& values = context->input(1);
    const Tensor& starts = context->input(2);
    const int64 width = width_, bytes = MaskBytes(width_);
    OP_REQUIRES(context, bits.dims() == 2 && bits.dim_size(1) == bytes,
                ::tensorflow::errors::InvalidArgument("bits must be [rows, ", bytes,
                                                      "] for width ", width, ", got shape ",
                                                      bits.shape().DebugString()));
    const int64 rows = bits.dim_size(0);
    const int64 blocks = (rows + kBlockRows - 1) / kBlockRows;
    OP_REQUIRES(context, starts.dims() == 1 && starts.dim_size(0) == blocks + 1,
                ::tensorflow::errors::InvalidArgument("starts must be [", blocks + 1,
                                                      "], got shape ",
                                                      starts.shape().DebugString()));
    auto sp = starts.flat<int64>();
    OP_REQUIRES(context, values.dims() == 1 && sp(blocks) == values.dim_size(0),
                ::tensorflow::errors::InvalidArgument("values must be [", sp(blocks),
                                                      "] by starts, got shape ",
                                                      values.shape().DebugString()));
    const uint8_t* bp = bits.flat<uint8_t>().data();
    // Each block's bits must count its values: a mismatch would read outside them.
    std::vector<int64> counts(blocks, 0);
    ForEachBlock(context, rows, width, [&](int64 block, int64 first, int64 end) {
      counts[block] = CountBits(bp + first * bytes, (end - first) * bytes);
    });
    for (int64 b = 0; b < blocks; ++b) {
      OP_REQUIRES(context, sp(b + 1) - sp(b) == counts[b],
                  ::tensorflow::errors::InvalidArgument(
                      "block ", b, " of the bits has ", counts[b], " set, its values ",
                      sp(b + 1) - sp(b)));
    }
    Tensor* x;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows, width}), &x));
    const float* vp = values.flat<float>().data();
    float* xp = x->flat<float>().data();
    ForEachBlock(context, rows, width, [&](int64 block, int64 first, int64 end) {
      const float* in = vp + sp(block);
      for (int64 r = first; r < end; ++r) in += UnpackRow(bp + r * bytes, in, width, xp + r * width);
    });
  }

 private:
  int64 width_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackSparsePositive").Device(::tensorflow::DEVICE_CPU),
                        SparsePositiveOp);
REGISTER_KERNEL_BUILDER(Name("HvdtrackDensePositive").Device(::tensorflow::DEVICE_CPU),
                        DensePositiveOp);

}  // namespace hvdtrack
