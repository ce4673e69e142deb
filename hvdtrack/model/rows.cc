// A chunk of rows written into (or added to) a buffer of rows, in the buffer's own memory (CPU):
// how model.recompute's chunk loops fill their [rows, ...] results (chunks.write_rows).
//
//   HvdtrackWriteRows(buffer, rows, start; add) -> out
//       out is buffer, its rows start .. start + len(rows) - 1 replaced by rows (add: plus rows)
//
// TensorFlow's InplaceUpdate and InplaceAdd do the same for any list of row indices, one row at
// a time through an Eigen expression. A chunk's rows are contiguous, so this is one copy (or
// one pass of additions) of the whole chunk: a [2048, 64] float chunk into [160000, 64] takes
// 65 us against InplaceUpdate's 231 us (added: 93 against 132 us), a [2048] vector 5 against
// 31 us (one thread, in a tf.while_loop, 2026-11-29). Like InplaceUpdate, out aliases buffer:
// a caller reads the buffer only through out.

#include <cstring>

#include "kernels.h"

namespace hvdtrack {

REGISTER_OP("HvdtrackWriteRows")
    .Input("buffer: T")
    .Input("rows: T")
    .Input("start: int32")
    .Output("out: T")
    .Attr("T: {float, uint8}")
    .Attr("add: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return Status();
    });

template <typename T>
class WriteRowsOp : public OpKernel {
 public:
  explicit WriteRowsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("add", &add_));
  }

  void Compute(OpKernelContext* context) override {
    Tensor out = context->input(0);  // an alias: the rows go into the buffer's own memory
    const Tensor& rows = context->input(1);
    const Tensor& start_tensor = context->input(2);
    OP_REQUIRES(context, TensorShapeUtils::IsScalar(start_tensor.shape()),
                ::tensorflow::errors::InvalidArgument("start must be a scalar"));
    OP_REQUIRES(context, out.dims() >= 1 && rows.dims() == out.dims(),
                ::tensorflow::errors::InvalidArgument(
                    "buffer and rows must have the same rank >= 1, got ",
                    out.shape().DebugString(), " and ", rows.shape().DebugString()));
    for (int d = 1; d < out.dims(); ++d) {
      OP_REQUIRES(context, rows.dim_size(d) == out.dim_size(d),
                  ::tensorflow::errors::InvalidArgument(
                      "rows ", rows.shape().DebugString(), " do not have the buffer's row shape ",
                      out.shape().DebugString()));
    }
    const int64 start = start_tensor.scalar<int32_t>()();
    const int64 count = rows.dim_size(0);
    OP_REQUIRES(context, start >= 0 && start + count <= out.dim_size(0),
                ::tensorflow::errors::InvalidArgument(
                    "rows ", start, " to ", start + count - 1, " are outside the buffer's ",
                    out.dim_size(0), " rows"));
    const int64 elements = rows.NumElements();
    if (elements > 0) {
      T* dst = out.flat<T>().data() + start * (elements / count);
      const T* src = rows.flat<T>().data();
      if (add_) {
#pragma omp simd
        for (int64 i = 0; i < elements; ++i) dst[i] += src[i];
      } else {
        std::memcpy(dst, src, elements * sizeof(T));
      }
    }
    context->set_output(0, out);
  }

 private:
  bool add_;
};

REGISTER_KERNEL_BUILDER(
    Name("HvdtrackWriteRows").Device(::tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
    WriteRowsOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("HvdtrackWriteRows").Device(::tensorflow::DEVICE_CPU).TypeConstraint<uint8_t>("T"),
    WriteRowsOp<uint8_t>);

}  // namespace hvdtrack
